"""Fit the whole-step constants of the cost model on vTrain's measured iterations.

Three constants cannot be fit on single kernels: the large-GEMM tensor-core
efficiency (NeuSight's kernels are fp32 without tensor cores), the time the
host takes to issue one kernel in a real step (the framework's per-operator
dispatch; isolated-kernel timings include a synchronisation floor instead) and
the fixed time of one pipeline send (the framework's exchange around it, ``pipeline_send_us``).
They are fit here on a deterministic quarter of vTrain's 1,440 runs (every 4th
row) by grid search on its MAPE (the first two, then the third with them held; ``--joint``: one grid), and
stored with provenance in ``learnedperf/cost/data/params.json``. The 10 SC21 runs (32-3,072 GPUs) are scored
at every grid point and at the fit, never in the loss: they are the project's only
published multi-node runs and every check reports them as held out. (Until 2026-11-29
the fit was joint on the quarter and SC21, summing the two MAPEs; SC21 then chose the
efficiency, 0.75 against the quarter's own 0.80, which vTrain's host-bound steps barely
constrain.)

``--model host`` (the default) fits ``host_dispatch_us``: a block of kernels issued back to back takes
``max(their time, kernels · host_dispatch_us)`` (the host runs ahead of the device), and the per-kernel
floor is 0. ``--model floor`` fits the model before it, ``kernel_floor_us``: every kernel takes at least
the floor, ``Σ max(t, floor)``, and the host dispatch is 0.

``--measured`` fits instead the two constants of devices described by measurement (those that
carry kernel curves: the project's own CPU data sets in ``datasets/measured``), whose GPU
counterparts are shares of a data sheet's peak and bandwidth: ``curve_efficiency`` (the share of
an isolated kernel's measured rate a GEMM or attention keeps in a step) and
``curve_memory_efficiency`` (the share of the measured streaming bandwidth a memory-bound op
reaches). They are fit on the **single-process** transformer steps of every data set, by grid
search on the sum of the per-data-set MAPEs (each device weighs the same); the multi-process
steps stay out of the fit and are reported, as is each data set fitted alone and scored on the
others (how well the constants carry to a CPU they were not fitted on). Usage::

    python experiments/calibrate_steps.py [--data ../shared/data] [--model host|floor] [--joint] [--dry-run]
    python experiments/calibrate_steps.py --measured [DATASET_DIR ...] [--dry-run]

It prints the fit quarter's MAPE, the other three quarters' and SC21's (held out): how each model carries
from one node to 32-3,072 GPUs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from learnedperf.cost import RooflineCost, default_params
from learnedperf.cost.params import write_params
from learnedperf.measure.public import default_shared_data, load_sc21, load_vtrain
from learnedperf.measure.steps import TRANSFORMER_ARCHS
from learnedperf.simulate import simulate
from learnedperf.simulate.calibrate import best_on, fit_measured_device_constants, steps_mape
from learnedperf.specs import RunSpec

ROOT = Path(__file__).resolve().parents[1]
#: µs one pipeline send adds to its link time (``CostParams.pipeline_send_us``), tried with the other two held at
#: their fit (``--joint``: with each pair of them)
GRID_SEND_US = (0.0, 250.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0)


def sc21_mape(params, runs: list[tuple[RunSpec, float]]) -> float:
    """Throughput MAPE (%) on SC21's ``(run, measured ms)`` with ``params``."""
    errs = []
    for spec, measured_ms in runs:
        t = simulate(spec, cost=RooflineCost(spec.hardware, params)).iteration_time_s * 1e3
        errs.append(abs(measured_ms / t - 1))
    return 100 * statistics.fmean(errs)


def measured_steps(directory: Path) -> list[tuple[RunSpec, float, int]]:
    """(run, measured ms, world size) of every transformer step of a measured data set."""
    import pandas as pd

    from learnedperf.measure.records import verify_manifest

    verify_manifest(directory)
    out = []
    for path in sorted(directory.glob("steps*.parquet")):
        for r in pd.read_parquet(path).itertuples():
            if r.arch in TRANSFORMER_ARCHS:  # the simulator skips MLP and CNN steps
                out.append((RunSpec.from_dict(json.loads(r.run)), float(r.iteration_time_ms), int(r.world_size)))
    return out


def fit_measured(dirs: list[Path], dry_run: bool) -> int:
    """Fit ``curve_efficiency`` and ``curve_memory_efficiency`` on the single-process steps of ``dirs``
    (:func:`learnedperf.simulate.calibrate.fit_measured_device_constants`) and print how they carry."""
    sets = {d.name: measured_steps(d) for d in dirs}
    # only single-process steps fit; a data set without any is left out, and said so
    for name in [k for k, v in sets.items() if not any(w == 1 for *_, w in v)]:
        print(f"{name}: no single-process transformer step; left out of the fit", file=sys.stderr)
        del sets[name]
    if not sets:
        print("no data set with single-process transformer steps", file=sys.stderr)
        return 2
    params, table = fit_measured_device_constants(sets)

    def all_steps(key, name) -> float:
        n1 = sum(1 for *_, w in sets[name] if w == 1)
        n2 = len(sets[name]) - n1
        return (table[key][(name, True)] * n1 + table[key].get((name, False), 0.0) * n2) / (n1 + n2)

    names = sorted(sets)
    eta, mem = params.curve_efficiency, params.curve_memory_efficiency
    print(f"curve_efficiency={eta:g} curve_memory_efficiency={mem:g}, fit on the single-process steps of "
          f"{', '.join(names)}")
    for n in names:
        singles = sum(1 for *_, w in sets[n] if w == 1)
        print(f"  {n}: single-process (fit) {table[(eta, mem)][(n, True)]:5.1f}% over {singles} steps; "
              f"multi-process (held out) {table[(eta, mem)].get((n, False), float('nan')):5.1f}% over "
              f"{len(sets[n]) - singles}")
    if len(names) > 1:
        print("each data set fitted alone, scored on every step of the others:")
        for n in names:
            k = best_on(table, [n])
            others = "; ".join(f"{o} {all_steps(k, o):5.1f}% (its own fit {all_steps(best_on(table, [o]), o):5.1f}%)"
                               for o in names if o != n)
            print(f"  fit on {n}: {k[0]:g}, {k[1]:g} -> {others}")
    if not dry_run:
        singles = sum(1 for v in sets.values() for *_, w in v if w == 1)
        how = (f"fit by experiments/calibrate_steps.py --measured on the {singles} single-process transformer "
               f"steps of datasets/measured/{{{','.join(names)}}} (grid search on the sum of per-data-set MAPEs: "
               + " + ".join(f"{table[(eta, mem)][(n, True)]:.2f}%" for n in names) + ")")
        write_params({"curve_efficiency": (float(eta), how), "curve_memory_efficiency": (float(mem), how)})
        print("stored in learnedperf/cost/data/params.json")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_shared_data())
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--model", choices=("host", "floor"), default="host",
                    help="fit the host's dispatch time per kernel (default) or a per-kernel floor")
    ap.add_argument("--joint", action="store_true",
                    help="search the three constants on one grid (default: the efficiency and host dispatch first, "
                         "then the pipeline send time with them held)")
    ap.add_argument("--measured", nargs="*", type=Path, default=None, metavar="DATASET_DIR",
                    help="fit the measured-device constants on these data sets (default: all of datasets/measured)")
    args = ap.parse_args(argv)
    if args.measured is not None:
        dirs = args.measured or sorted(p for p in (ROOT / "datasets" / "measured").iterdir() if p.is_dir())
        missing = [str(d) for d in dirs if not (d / "manifest.json").is_file()]
        if missing:
            print(f"not a measured data set (no manifest.json): {', '.join(missing)}", file=sys.stderr)
            return 2
        return fit_measured(dirs, args.dry_run)
    vtrain = [(RunSpec.from_dict(r.run), r.iteration_time_ms) for r in load_vtrain(args.data)]
    runs = vtrain[::4]  # the fit quarter; the other three are scored at the fit
    sc21 = [(RunSpec.from_dict(r.run), r.iteration_time_ms) for r in load_sc21(args.data)]
    base = default_params()
    grid_eff = [0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    name, other = ("host_dispatch_us", "kernel_floor_us") if args.model == "host" else \
        ("kernel_floor_us", "host_dispatch_us")
    grid = [40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0]
    if args.model == "host":
        grid = [float(x) for x in range(40, 115, 5)]

    def at(eff: float, value: float, send_us: float):
        return replace(base, gemm_efficiency_tensor=eff, kernel_launch_us=0.0, pipeline_send_us=send_us,
                       **{name: value, other: 0.0})

    def search(points) -> tuple:
        best = None
        for eff, value, send_us in points:
            p = at(eff, value, send_us)
            vt = steps_mape(runs, p)
            sc = sc21_mape(p, sc21)  # scored, not fitted on: SC21 stays held out
            print(f"  eff={eff:.2f} {name}={value:4.0f} pipeline_send_us={send_us:5.0f}: vTrain subset {vt:5.2f}%  "
                  f"SC21 (held out) {sc:5.2f}%", flush=True)
            if best is None or vt < best[0]:
                best = (vt, eff, value, send_us, sc)
        return best

    if args.joint:
        best = search(itertools.product(grid_eff, grid, GRID_SEND_US))
    else:
        # the efficiency and the host's dispatch on every run, then the send time on them held: with the send
        # time free, vTrain's steps no longer tell the efficiency apart (--joint: 7.38 % at 0.80, 7.41 % at
        # 0.75), and the joint minimum costs SC21 2.8 → 5.1 %
        _vt, eff, value, _send, _sc = search((e, v, 0.0) for e, v in itertools.product(grid_eff, grid))
        best = search((eff, value, send_us) for send_us in GRID_SEND_US)
    vt, eff, value, send_us, sc = best
    rest_mape = steps_mape([r for i, r in enumerate(vtrain) if i % 4], at(eff, value, send_us))
    print(f"gemm_efficiency_tensor={eff} {name}={value} pipeline_send_us={send_us}: vTrain fit-subset MAPE "
          f"{vt:.2f}%, other three quarters {rest_mape:.2f}%, SC21 (held out) MAPE {sc:.2f}%")
    if not args.dry_run:
        how = (f"fit by experiments/calibrate_steps.py --model {args.model}{' --joint' if args.joint else ''} "
               f"on every 4th vTrain run "
               f"({len(runs)} of 1,440; grid search on its MAPE: {vt:.2f}%; the other three quarters "
               f"{rest_mape:.2f}%, SC21 held out {sc:.2f}%)")
        write_params({"gemm_efficiency_tensor": (eff, how), "kernel_launch_us": (0.0, how), name: (value, how),
                      "pipeline_send_us": (send_us, how),
                      other: (0.0, f"0: not part of the model fitted by experiments/calibrate_steps.py "
                                    f"--model {args.model}")})
        print("stored in learnedperf/cost/data/params.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
