"""Does the fast tier keep a device with more of everything ahead? The surrogate with and without its constraints.

The fast tier's surrogate learns ``log(full / analytic)`` with LightGBM. The analytic time falls with a device's
peak FLOP/s and bandwidth, but the trees may still put a run slower on a device that has more of everything
(the H200 against the H100): nothing in plain trees stops a split on memory size or L2 from raising the time.
The surrogate holds its correction monotone in the capacities (``TIME_MONOTONE`` in
``learnedperf/models/surrogate.py``). This script measures what that costs and buys, on one set of labels:

1. ``--n`` sampled runs and ``--near`` runs near the data set's measured runs are labelled by the checkpoint's
   full tier (as ``learnedperf train`` distils its surrogate); a fifth is held out;
2. two surrogates are fitted on the rest, constrained and not, and their held-out MAPE against the full tier
   is printed;
3. ``--probe`` other sampled runs (seed 7) are moved onto both devices of every ordered pair of catalog devices
   where the first dominates the second (``experiments/device_dominance.py``) and has at least its intra-node
   link; for each tier, the comparisons where the dominating device comes out behind (by anything, by more than
   1 %, the largest excess) are counted, those where the analytic time itself is behind apart.

Nothing here is measured on hardware; it is a consistency check of the fast tier against the data sheets.

    python experiments/surrogate_monotone.py --data gen3k [--checkpoint DIR] [--n 8000] [--near 2000] [--probe 40]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import numpy as np

from _checkpoint import add_checkpoint_argument, load_predictor
from device_dominance import dominates


def label(predictor, runs) -> tuple:
    """(features, analytic s, full ms) of the runs the full tier answers, as ``learnedperf train`` labels them."""
    from learnedperf.predict import surrogate_labels

    rows, _refused = surrogate_labels(predictor, runs)
    return tuple(np.asarray([r[k] for r in rows], dtype=float) for k in range(3))


def probe_pairs(predictor, n: int) -> tuple:
    """Features, analytic times and full-tier times of ``n`` sampled runs on both devices of each dominating pair."""
    from learnedperf.catalog import get_device, names
    from learnedperf.data.sampler import sample_runs
    from learnedperf.errors import LearnedPerfError
    from learnedperf.specs import RunSpec

    devices = {d: get_device(d) for d in names("devices")}
    intra = {d: devices[d].get("intra_node_bandwidth_GBps") or 0.0 for d in devices}
    pairs = [(a, b) for a, b in itertools.permutations(sorted(devices), 2)
             if dominates(devices[a], devices[b]) and intra[a] >= intra[b]]
    memo: dict = {}

    def one(i: int, raw: dict, device: str):
        if (i, device) not in memo:
            run = json.loads(json.dumps(raw))
            run["hardware"]["device"] = device
            try:
                spec = RunSpec.from_dict(run)
                _ctx, _mem, x, at = predictor._features(spec)
                memo[(i, device)] = (x, at.total_s, predictor.predict(spec, tier="full")["iteration_time_ms"])
            except LearnedPerfError:
                memo[(i, device)] = None  # no such precision on the device, or the run does not fit: not compared
        return memo[(i, device)]

    rows = []
    for i, raw in sample_runs(n, seed=7):
        for a, b in pairs:
            fa, fb = one(i, raw, a), one(i, raw, b)
            if fa is not None and fb is not None:
                rows.append((fa, fb))
    XA, XB = (np.asarray([r[k][0] for r in rows], float) for k in (0, 1))
    AA, AB = (np.asarray([r[k][1] for r in rows], float) for k in (0, 1))
    FA, FB = (np.asarray([r[k][2] for r in rows], float) for k in (0, 1))
    return len(pairs), XA, AA, FA, XB, AB, FB


def report(name: str, ta, tb, analytic_ok) -> None:
    excess = ta / tb - 1.0
    behind = excess > 0
    print(f"  {name:28s} {int(behind.sum()):5d} of {len(excess)} behind ({int((behind & ~analytic_ok).sum())} where the "
          f"analytic time is too); by > 1 %: {int(((excess > 0.01) & analytic_ok).sum())}; largest "
          f"{excess[analytic_ok].max():+.1%}")


def main(argv=None) -> int:
    """Label, fit both surrogates, probe the dominating pairs, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_checkpoint_argument(ap)
    ap.add_argument("--data", required=True, help="the data set whose measured runs anchor the near runs")
    ap.add_argument("--n", type=int, default=8000, help="sampled runs labelled (default 8000)")
    ap.add_argument("--near", type=int, default=2000, help="runs near the measured ones labelled (default 2000)")
    ap.add_argument("--probe", type=int, default=40, help="sampled runs moved onto every dominating pair (default 40)")
    args = ap.parse_args(argv)
    from learnedperf.data.sampler import anchor_groups, draw_near, sample_runs
    from learnedperf.models.metrics import mape
    from learnedperf.models.pipeline import measured_runs
    from learnedperf.models.surrogate import TIME_MONOTONE, SurrogateRegressor

    t0 = time.perf_counter()
    predictor = load_predictor(args.checkpoint, "surrogate_monotone")
    groups = anchor_groups(measured_runs(args.data))
    # the seeds learnedperf train distils with (sampler seed 1)
    Xs, as_, ys = label(predictor, (r for _i, r in sample_runs(args.n, seed=1)))
    Xn, an, yn = label(predictor, (draw_near(1, i, groups).run for i in range(args.near)))
    X, a, y = np.vstack([Xs, Xn]), np.concatenate([as_, an]), np.concatenate([ys, yn])
    near = np.arange(len(y)) >= len(ys)
    test = np.random.default_rng(0).random(len(y)) < 0.2
    n_pairs, XA, AA, FA, XB, AB, FB = probe_pairs(predictor, args.probe)
    analytic_ok = AA <= AB
    print(f"checkpoint {predictor.source}: {len(ys)} sampled and {len(yn)} near runs labelled, a fifth held out; "
          f"{len(FA)} comparisons of {args.probe} sampled runs on {n_pairs} dominating pairs "
          f"({int((~analytic_ok).sum())} where the analytic time puts the dominating device behind)")
    print(f"constraints: {TIME_MONOTONE}")
    print("\nheld-out MAPE against the full tier (sampled / near):")
    fits = {}
    for monotone in (False, True):
        s = SurrogateRegressor(monotone=monotone).fit(X[~test], y[~test], a[~test])
        f = s.predict(X[test], a[test])
        t_s, t_n = ~near[test], near[test]
        print(f"  {'constrained' if monotone else 'unconstrained':14s} {mape(f[t_s], y[test][t_s]):.2f} / "
              f"{mape(f[t_n], y[test][t_n]):.2f} %")
        fits[monotone] = s
    print("\ndominating device behind (sampled runs on dominating pairs):")
    report("full tier", FA, FB, analytic_ok)
    for monotone in (False, True):
        s = fits[monotone]
        report(f"fast, {'constrained' if monotone else 'unconstrained'}", s.predict(XA, AA), s.predict(XB, AB),
               analytic_ok)
    print(f"\n# {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
