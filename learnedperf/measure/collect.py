"""``learnedperf measure``: measure this machine end to end and store a data set.

One collection, in order:

1. **device**: :func:`~learnedperf.measure.bench.describe_device` for each process count the
   steps use (1, 2, 4 processes running at once: what one rank gets when they share the machine);
2. **collectives**: :func:`~learnedperf.measure.bench.bench_collectives` for 2 and 4 processes
   (each call after a barrier), and the run's link figures per process count: an α-β fit of
   what one all-reduce adds to a stream of computation
   (:func:`~learnedperf.measure.bench.bench_in_stream`), with each other collective's bus
   bandwidth relative to the all-reduce's after a barrier (``collective_busbw_ratio``), and the
   share of an all-reduce that concurrent computation hides (``comm_overlap``,
   :func:`~learnedperf.measure.bench.bench_overlap`); the manifest keeps both link fits and the
   overlap benchmark (``link_fits``);
3. **ops**: the operator grid of :func:`~learnedperf.measure.ops.op_grid`;
4. **steps**: the training-step grid of :func:`~learnedperf.measure.steps.step_grid`, each step's
   run carrying the device descriptor and fitted link of its process count; on a CPU the descriptor
   also carries the kernel curves fitted on the operator records (this collection's, or the
   directory's earlier ones: :mod:`learnedperf.measure.curves`).

On a GPU every record describes the device by its data sheet (:func:`gpu_datasheet`), and the
measured descriptors stay in the manifest; ``time_budget_s`` bounds a collection that a lent
machine's time limit would otherwise kill with nothing written.

Records go to ``<out>/ops_<tag>.parquet``, ``ops_<tag>_collectives.parquet`` and
``steps_<tag>.parquet`` (``tag`` = ``cpu`` or ``cuda``, plus ``_quick`` for ``--quick``), and
``manifest.json`` lists every file with its sha256, the host, the software, the exact command
and every case that could not run here with the reason. A part that is not asked for leaves
its existing file alone, so GPU and CPU collections share one directory.

When the step grid grows, :func:`add_missing_steps` (``python -m learnedperf.measure.collect
DATASET_DIR``) measures only the grid's configurations that a CPU data set lacks, on the hardware
its records of the same process count already carry, appends them and lists them in the
manifest's ``amendments``; the records already there stay as they are.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..errors import InputError, LearnedPerfError, SpecError
from .quiet import QUIET_SHARE, Window, logical_cpus, wait_until_quiet
from .records import (DATASHEET_SOURCE, OP_COLUMNS, STEP_COLUMNS, host_name, now_utc, software_versions,
                      write_manifest, write_parquet)

PARTS = ("collectives", "ops", "steps")
"""What a collection can measure (the device descriptors are always measured)."""

#: message sizes of the collective benchmark: 4 KiB to 64 MiB, one per factor 4 (quick: 3 sizes, the
#: largest 16 MiB: gloo's small-message latency is heavy-tailed, and a CI run's 4 MiB all-reduce once
#: came out no slower than its 256 KiB one, which leaves no bandwidth to fit)
_SIZES = tuple(4096 * 4 ** i for i in range(8))
_QUICK_SIZES = (4096, 262144, 16777216)
#: shortest window of the quiet-machine check over operator cases (100 ticks of /proc/stat per CPU)
_OP_WINDOW_S = 1.0


def default_out(quick: bool, host: Optional[str] = None) -> Path:
    """``datasets/measured/<host>`` (``datasets/measured-quick/<host>`` for ``--quick``), relative to the cwd."""
    return Path("datasets") / ("measured-quick" if quick else "measured") / (host or host_name())


def _bar(iterable: Iterable, total: int, desc: str, show: bool, unit: str = "record"):
    """A tqdm progress bar on stderr (rate and ETA), or the bare iterable when ``show`` is false."""
    if not show:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def collect(out: str | Path, *, quick: bool = False, parts: Iterable[str] = PARTS, device: str = "cpu",
            threads: int = 1, command: str = "", progress: bool = True, device_spec: Any = None,
            time_budget_s: Optional[float] = None,
            log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)) -> dict:
    """Measure this machine and write the data set into ``out``; return the manifest.

    On a GPU every record (operator, collective, step) describes the device by its **data sheet**
    (:func:`gpu_datasheet`), not by what was measured: the operator regressor learns a GPU's
    kernels against its data sheet (NeuSight's GPUs, and every prediction asked for a catalog
    device), and learns a measured device's offsets by its name, so records described by measured
    peaks would teach it another scale under a name no prediction uses. The measured descriptors
    stay in the manifest (``devices``), with the achieved share of the data sheet (``datasheet``).

    Args:
        out: the data set directory (created if needed).
        quick: the small grids (a smoke test: under a minute on a 2-core CPU).
        parts: any of :data:`PARTS`.
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads per process.
        command: the command line, stored in the manifest.
        progress: show progress bars on stderr.
        device_spec: on a GPU, the data sheet its records are described by: a catalog device name or a
            DeviceSpec dict (default: the catalog entry of the name the driver reports; see
            :func:`gpu_datasheet`). Refused on a CPU, whose records carry its measured descriptor.
        time_budget_s: stop starting operator cases and steps this many seconds after the collection
            started; those not run are listed in the manifest (``skipped``, reason ``time budget``), and
            what was measured is written. ``None``: no limit.
        log: where one-line status messages go.

    Raises:
        InputError: an unknown part or device, a ``device_spec`` on a CPU, a GPU whose data sheet is
            not known (not in the catalog and no ``device_spec``) or does not describe it, a bad budget.
    """
    from .bench import (bench_collectives, bench_in_stream, bench_overlap, describe_device, fit_busbw_ratios,
                        fit_link, fit_link_in_stream, host_descriptor)
    from .ops import op_grid, profile_grid
    from .steps import step_grid

    parts = tuple(parts)
    for p in parts:
        if p not in PARTS:
            raise InputError(f"parts: unknown part {p!r} (known: {', '.join(PARTS)})")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    if device_spec is not None and device != "cuda":
        raise InputError("device_spec: a GPU's data sheet; a CPU's records carry its measured descriptor")
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float))
                                      or not time_budget_s > 0):
        raise InputError(f"time_budget_s: expected a positive number of seconds, got {time_budget_s!r}")
    deadline = None if time_budget_s is None else time.monotonic() + float(time_budget_s)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tag = device + ("_quick" if quick else "")
    skipped: list[dict] = []
    started = now_utc()
    steps = step_grid(quick, device) if "steps" in parts else []
    comm_worlds = ({2} if quick else {2, 4}) if "collectives" in parts else set()
    if device == "cuda":
        comm_worlds = _gpu_worlds(comm_worlds, _cuda_device_count(), skipped, log)
    worlds = sorted({1} | {c.world_size for c in steps} | comm_worlds)
    # a step's device is what one of its ranks gets: measured with its thread count and process count
    setups = sorted({(w, threads) for w in worlds} | {(c.world_size, c.threads) for c in steps})

    previous = _previous(out)
    # links measured by an earlier collection of this device (used when collectives are not re-measured)
    links: dict[int, dict] = {}
    for c in previous.get("collections", []):
        if c.get("device") == device and c.get("threads") == threads and c.get("quick") == quick:
            links.update({int(w): v for w, v in c.get("links", {}).items()})
    missing = sorted({c.world_size for c in steps if c.world_size > 1} - set(links) - comm_worlds)
    if missing:
        raise InputError(f"steps on {missing} processes need the link figures of as many processes: "
                         "measure the collectives too (--parts collectives,steps)")

    # the quiet-machine check of every operator case and step (measure.quiet), kept in the manifest
    quiet: dict = {"threshold_share": QUIET_SHARE, "ops": {}, "steps": [], "remeasured": [], "contended": []}
    # The device descriptors run in helper processes whose CPU time this process cannot see, so
    # they are not checked window by window: the collection starts on a machine found quiet.
    quiet["before"] = wait_until_quiet()
    if quiet["before"] is not None and quiet["before"]["contended"]:
        log(f"measure: other processes still use {quiet['before']['foreign_share']:.0%} of the CPUs after "
            "30 s; measuring anyway (the manifest records it under quiet.before)")
    datasheet = None
    if device == "cuda":
        # before anything is timed: a GPU whose data sheet is not known stops here, not after the grids
        datasheet, datasheet_report = gpu_datasheet(*_cuda_identity(), device_spec)
        log(f"measure: records describe this GPU by the data sheet of {datasheet['name']} "
            f"({datasheet_report['how']})")
    descriptors: dict[tuple[int, int], dict] = {}
    for w, t in setups:
        log(f"measure: device descriptor for {w} concurrent process(es) of {t} thread(s) ...")
        descriptors[(w, t)] = describe_device(device, threads=t, concurrent=w, quick=quick)
    devices = {w: descriptors[(w, threads)] for w in worlds}
    if datasheet is not None:
        datasheet_report["achieved_share"] = achieved_share(descriptors[(1, threads)], datasheet)
        log(f"measure: achieved share of the data sheet: {datasheet_report['achieved_share']}")
        # what every record says the device is (the measured descriptors stay in the manifest)
        devices = {w: datasheet for w in worlds}
    files: list[str] = []
    link_fits: dict[int, dict] = {}
    if "collectives" in parts:
        comm_records: list[dict] = []
        for w in (w for w in worlds if w > 1):
            log(f"measure: collectives over {w} processes ...")
            recs = bench_collectives(w, _QUICK_SIZES if quick else _SIZES, threads=threads,
                                     descriptor=devices[w], repeats=5 if quick else 10, skipped=skipped)
            comm_records += recs
            barrier_fit = fit_link(recs, w)
            # The run's link is what a step's collectives cost: the all-reduce's added time in a stream
            # of computation (its mean, skew and latency tail included), not the barrier median.
            log(f"measure: all-reduce in a stream of computation over {w} processes ...")
            stream = bench_in_stream(w, _QUICK_SIZES if quick else _SIZES, threads=threads,
                                     loops=3 if quick else 5, target_loop_s=0.1 if quick else 0.2)
            stream_fit = fit_link_in_stream(stream, w)
            links[w] = {k: stream_fit[k] for k in ("intra_node_bandwidth_GBps", "intra_node_latency_us")}
            # each collective against the all-reduce, both timed after a barrier: like with like
            ratios = fit_busbw_ratios(recs, barrier_fit, w)
            if ratios:
                links[w]["collective_busbw_ratio"] = ratios
            # how much of a collective concurrent computation hides (gloo on CPU cores: little)
            log(f"measure: overlap of an all-reduce with computation over {w} processes ...")
            overlap = bench_overlap(w, nbytes=(4 if quick else 16) << 20, loops=3 if quick else 7, threads=threads)
            links[w]["comm_overlap"] = round(overlap["overlap"], 4)
            link_fits[w] = {"barrier_median": barrier_fit, "in_stream": stream_fit, "in_stream_points": stream,
                            "overlap": overlap}
            log(f"measure: {w} processes: link {links[w]} (in-stream fit; after a barrier: "
                f"{barrier_fit['intra_node_latency_us']:.0f} us, {barrier_fit['intra_node_bandwidth_GBps']:.3g} GB/s)")
        files.append(write_parquet(comm_records, out / f"ops_{tag}_collectives.parquet", OP_COLUMNS,
                                   "collective").name)
    if "ops" in parts:
        cases = op_grid(quick=quick, device=device)
        records: list[dict] = []
        op_skips: list[dict] = []

        def skip(case, reason: str) -> None:
            if not any(s["op"] == case.label() for s in op_skips):  # a re-measured window skips it again
                op_skips.append({"op": case.label(), "reason": reason})

        def profile_case(case) -> list[dict]:
            return list(profile_grid([case], device, threads=threads, descriptor=devices[1], on_skip=skip,
                                     repeats=10 if quick else 20))

        def profile_cases(chunk: list) -> tuple[list[dict], dict]:
            window = Window()
            return [r for case in chunk for r in profile_case(case)], window.close()

        # The ops run in this process, so its own CPU time is the measurement's. One operator takes
        # milliseconds, too short for /proc/stat's ticks: consecutive cases share a window of at
        # least _OP_WINDOW_S, and a contended window's cases are measured again.
        op_checks: list[dict] = []
        chunk: list = []
        chunk_records: list[dict] = []
        window = Window()
        for n, case in enumerate(_bar(cases, len(cases), "operator cases", progress, unit="case"), start=1):
            chunk.append(case)
            chunk_records += profile_case(case)
            stop = n < len(cases) and _spent(deadline)
            if time.perf_counter() - window.t0 < _OP_WINDOW_S and n < len(cases) and not stop:
                continue
            label = f"operator cases {chunk[0].label()} .. {chunk[-1].label()}"
            recs, check = _quietly((chunk_records, window.close()), lambda c=chunk: profile_cases(c), label,
                                   quiet, log)
            records += recs
            op_checks.append(check)
            chunk, chunk_records, window = [], [], Window()
            if stop:  # after the window's records are kept: what was measured is written
                left = cases[n:]
                skipped.append({"op": f"{len(left)} operator case(s) from {left[0].label()} on",
                                "reason": f"time budget of {time_budget_s:g} s spent"})
                log(f"measure: time budget spent: {len(left)} operator case(s) not run (listed in the manifest)")
                break
        quiet["ops"] = _share_summary(op_checks)
        files.append(write_parquet(records, out / f"ops_{tag}.parquet", OP_COLUMNS, "operator").name)
        skipped += op_skips
        log(f"measure: {len(records)} operator records; {len(op_skips)} cases cannot run here (listed in the "
            "manifest)")
    curves_report = None
    if "steps" in parts:
        step_devices, curves_report = _step_devices(descriptors, records if "ops" in parts else None,
                                                    out / f"ops_{tag}.parquet", log)
        if datasheet is not None:
            # A prediction for this GPU is asked with its data sheet: its steps are runs on it. The kernel
            # curves fitted on its operators stay in the manifest (kernel_curves); the regressor has them.
            step_devices = {k: datasheet for k in step_devices}
        records = []
        failed: list[dict] = []
        for i, config in enumerate(_bar(steps, len(steps), "steps", progress, unit="step")):
            if _spent(deadline):
                skipped.append({"op": f"{len(steps) - i} step(s) from {config.label()} on",
                                "reason": f"time budget of {time_budget_s:g} s spent"})
                log(f"measure: time budget spent: {len(steps) - i} step(s) not run (listed in the manifest)")
                break
            w = config.world_size
            hw = {"device": step_devices[(w, config.threads)], "devices_per_node": w, **links.get(w, {})}
            try:
                rec, check = _quietly(_step_checked(config, hw), lambda c=config, h=hw: _step_checked(c, h),
                                      config.label(), quiet, log)
                records.append(rec)
                quiet["steps"].append({"step": config.label(), "run_id": rec["run_id"], **check})
            except LearnedPerfError as exc:
                # one broken configuration must not lose the others: it is listed in the manifest
                failed.append({"step": config.label(), "reason": str(exc)})
                log(f"measure: step {config.label()} failed: {exc}")
        files.append(write_parquet(records, out / f"steps_{tag}.parquet", STEP_COLUMNS, "step").name)
        skipped += failed
        log(f"measure: {len(records)} step records ({sum(r['world_size'] > 1 for r in records)} multi-process)"
            + (f"; {len(failed)} failed (listed in the manifest)" if failed else ""))

    collection = {"started": started, "finished": now_utc(), "command": command, "device": device,
                  "threads": threads, "quick": quick, "parts": list(parts), "files": files,
                  "devices": {f"{w}x{t}": d for (w, t), d in descriptors.items()},
                  "links": {str(w): v for w, v in links.items()},
                  "link_fits": {str(w): v for w, v in link_fits.items()}, "skipped": skipped, "quiet": quiet,
                  "kernel_curves": curves_report,
                  **({"datasheet": datasheet_report} if datasheet is not None else {}),
                  **({"time_budget_s": time_budget_s} if time_budget_s is not None else {})}
    if quiet["contended"]:
        log(f"measure: {len(quiet['contended'])} case(s) stayed contended after a re-measurement (listed in the "
            "manifest under quiet.contended): other processes used the CPUs while they ran")
    # collections of other devices (e.g. a GPU lent another day) stay listed beside this one
    history = [c for c in previous.get("collections", []) if not set(c.get("files", [])) <= set(files)]
    manifest_path = write_manifest(out, command=command, host=host_descriptor(),
                                   extra={"collections": history + [collection]})
    return json.loads(manifest_path.read_text(encoding="utf-8"))


#: Least share of its data sheet's memory a GPU may report (torch's total_memory is a few per cent
#: below the data sheet's: ECC and driver reservations; a T4 reports 14.75 of 16 GiB).
_MEMORY_SHARE_MIN = 0.85


def gpu_datasheet(reported: str, num_sms: int, memory_GiB: float, device_spec: Any = None) -> tuple[dict, dict]:
    """The data-sheet descriptor that a GPU's records carry, and how it was chosen (for the manifest).

    Args:
        reported: the name the driver gives the GPU (``torch.cuda.get_device_properties(0).name``).
        num_sms: its SM (compute unit) count as the driver reports it.
        memory_GiB: its memory as the driver reports it.
        device_spec: a catalog device name or a DeviceSpec dict; ``None``: the catalog entry of
            ``reported`` (:func:`~learnedperf.catalog.device_by_reported_name`).

    Returns:
        ``(descriptor, report)``: the DeviceSpec dict, its ``sources`` saying so under
        :data:`DATASHEET_SOURCE`; and ``{"device", "reported_name", "how"}``.

    Raises:
        InputError: ``reported`` is not in the catalog and no ``device_spec`` is given; the data sheet is
            invalid; or it does not describe this GPU: another SM count (a MIG slice, another part) or
            more memory than the GPU has (or under :data:`_MEMORY_SHARE_MIN` of it).
    """
    from ..catalog import device_by_reported_name, get_device, names
    from ..specs import DeviceSpec

    if device_spec is None:
        key = device_by_reported_name(reported)
        if key is None:
            import difflib

            close = difflib.get_close_matches(reported.lower(), [n.lower() for n in names("devices")], n=3,
                                              cutoff=0.3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise InputError(f"GPU {reported!r} is not in the catalog: its records are described by a data sheet, "
                             "the one a prediction for it is asked with; give --device-spec with a catalog device"
                             f"{hint} or a DeviceSpec JSON file of its data sheet")
        spec, how = get_device(key, field="device_spec"), f"the catalog's entry of the driver's name {reported!r}"
    elif isinstance(device_spec, str):
        spec, how = get_device(device_spec, field="device_spec"), f"the catalog's {device_spec!r}, as given"
    elif isinstance(device_spec, dict):
        spec, how = device_spec, "a data sheet given as a DeviceSpec"
    else:
        raise InputError(f"device_spec: expected a catalog device name or a DeviceSpec dict, got "
                         f"{type(device_spec).__name__}")
    try:
        sheet = DeviceSpec.parse(spec, "device_spec").to_dict()
    except SpecError as exc:
        raise InputError(str(exc)) from None
    if sheet.get("num_sms") and num_sms and sheet["num_sms"] != num_sms:
        raise InputError(f"device_spec: {sheet['name']} has {sheet['num_sms']} SMs, this GPU ({reported!r}) "
                         f"{num_sms}: a MIG slice or another part; give the data sheet that describes it")
    mem = sheet.get("memory_GiB")
    if mem and memory_GiB and not _MEMORY_SHARE_MIN * mem <= memory_GiB <= mem * 1.001:
        raise InputError(f"device_spec: {sheet['name']} has {mem:g} GiB, this GPU ({reported!r}) reports "
                         f"{memory_GiB:.2f} GiB: not the same part; give the data sheet that describes it")
    sheet["sources"] = {**sheet.get("sources", {}), DATASHEET_SOURCE: (
        f"data sheet of the measured GPU {reported!r} ({how}): learnedperf measure describes a GPU's records "
        "as a prediction for it is asked; what it measured is in the manifest's 'devices'")}
    return sheet, {"device": sheet["name"], "reported_name": reported, "how": how}


def achieved_share(measured: dict, sheet: dict) -> dict:
    """Measured peak per dtype and memory bandwidth as a share of the data sheet's (rounded; a share over
    1 says the data sheet understates the part, or the benchmark measured something else)."""
    out = {}
    for dtype, v in measured.get("peak_tflops", {}).items():
        ref = sheet.get("peak_tflops", {}).get(dtype)
        if v and ref:
            out[dtype] = round(v / ref, 3)
    if measured.get("memory_bandwidth_GBps") and sheet.get("memory_bandwidth_GBps"):
        out["memory_bandwidth"] = round(measured["memory_bandwidth_GBps"] / sheet["memory_bandwidth_GBps"], 3)
    return out


def _spent(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _cuda_identity() -> tuple[str, int, float]:
    """The name, SM count and memory (GiB) the driver reports for ``cuda:0``."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return (str(props.name), int(getattr(props, "multi_processor_count", 0) or 0),
            float(props.total_memory) / 2**30)


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _gpu_worlds(worlds: set[int], gpus: int, skipped: list, log: Callable[[str], None]) -> set[int]:
    """The collective group sizes this machine's GPUs can run (NCCL: one GPU per rank); each one it cannot
    is listed in ``skipped`` with the reason, so a single-GPU machine measures its operators and steps."""
    kept = {w for w in worlds if w <= gpus}
    for w in sorted(worlds - kept):
        reason = f"NCCL needs one GPU per rank: {w} processes on this machine's {gpus} GPU(s)"
        skipped.append({"op": f"collectives over {w} processes", "reason": reason})
        log(f"measure: collectives over {w} processes skipped ({reason})")
    return kept


def _step_devices(descriptors: dict, op_records: Optional[list], op_file: Path,
                  log: Callable[[str], None]) -> tuple[dict, Optional[dict]]:
    """The steps' device descriptors, with the kernel curves fitted on the operator records of this
    collection (``op_records``) or, when it timed none, of the directory's earlier ``op_file``.
    Returns the descriptors and the fit report (None when there were no operator records)."""
    from .curves import fit_device_curves, single_process_compute, with_curves

    if op_records is None and op_file.exists():
        import pandas as pd

        op_records = pd.read_parquet(op_file).to_dict("records")
        where = f"the operator records of {op_file.name} (an earlier collection)"
    else:
        where = "the operator records of this collection"
    single = single_process_compute(op_records or [])
    if not single:
        log("measure: no operator records: the steps' device descriptors carry no kernel curves")
        return dict(descriptors), None
    curves, report = fit_device_curves(single)
    source = f"fitted by learnedperf.measure.curves on {now_utc()} from {where}"
    if report["left_out"]:
        log(f"measure: kernel curves left out: {report['left_out']}")
    return {k: with_curves(d, curves, source) for k, d in descriptors.items()}, {"source": source, **report}


def _step_checked(config, hw: dict) -> tuple[dict, dict]:
    """A measured step record and the quiet-machine check of its timed iterations."""
    from .steps import measure_step

    check: dict = {}
    record = measure_step(config, hw, quiet=check)
    return record, check


def _quietly(first: tuple, again: Callable[[], tuple], label: str, quiet: dict,
             log: Callable[[str], None]) -> tuple:
    """``first`` (a ``(result, check)`` pair) when the machine was quiet; otherwise wait for a
    quiet machine and return ``again()``.

    The second result replaces the first (it was taken after waiting for a quiet machine); a case
    contended both times is listed in ``quiet["contended"]``, never dropped: its record is kept
    and the manifest says which it is.
    """
    result, check = first
    if not check.get("contended"):
        return result, check
    log(f"measure: {label}: other processes used {check['foreign_share']:.0%} of the CPUs while it ran; "
        "waiting for a quiet machine and measuring again")
    wait_until_quiet()
    result, again_check = again()
    quiet["remeasured"].append({"case": label, "first_foreign_share": check["foreign_share"],
                                "foreign_share": again_check["foreign_share"]})
    if again_check.get("contended"):
        quiet["contended"].append(label)
    return result, again_check


def _share_summary(checks: list[dict]) -> dict:
    """The quiet-machine checks of many windows pooled: total wall time, foreign CPU seconds, their
    share of the capacity, and how many windows were contended (None: the platform cannot tell).

    Pooled rather than the largest window's share: a window of a few milliseconds (the last one)
    reads one /proc/stat tick as a large share."""
    known = [c for c in checks if c["foreign_share"] is not None]
    if not known:
        return {"windows": len(checks), "wall_s": None, "foreign_cpu_s": None, "pooled_share": None,
                "contended_windows": None}
    wall = sum(c["wall_s"] for c in known)
    foreign = sum(c["foreign_cpu_s"] for c in known)
    return {"windows": len(checks), "wall_s": round(wall, 3), "foreign_cpu_s": round(foreign, 3),
            "pooled_share": round(foreign / (max(wall, 1e-9) * logical_cpus()), 4),
            "contended_windows": sum(bool(c["contended"]) for c in known)}


def _previous(out: Path) -> dict:
    path = out / "manifest.json"
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read the existing manifest ({exc}); move it away first") from None


def step_hardware(steps: Any, where: Any) -> dict[tuple[int, int], dict]:
    """The hardware block (device descriptor with its kernel curves, links) of each (process count, threads per
    process) among a data set's step records (``steps_cpu.parquet`` as a DataFrame): one per count, as a
    collection writes it, so that a step measured or predicted later takes the same hardware as the others.

    Raises:
        InputError: naming ``where``, for a count whose records carry several blocks (nothing says which one a
            new step should take).
    """
    from .records import canonical_json

    blocks: dict[tuple[int, int], set] = {}
    for run, world, threads in zip(steps["run"], steps["world_size"], steps["threads"]):
        blocks.setdefault((int(world), int(threads)), set()).add(canonical_json(json.loads(run)["hardware"]))
    for (world, threads), found in sorted(blocks.items()):
        if len(found) > 1:
            raise InputError(f"{where}: {len(found)} hardware blocks among the records of {world} process(es) of "
                             f"{threads} thread(s); a step needs exactly one")
    return {key: json.loads(next(iter(found))) for key, found in blocks.items()}


def add_missing_steps(out: str | Path, *, command: str = "", dry_run: bool = False, progress: bool = True,
                      log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)) -> list[dict]:
    """Measure the configurations of :func:`~learnedperf.measure.steps.step_grid` (``quick=False``) that the
    CPU data set ``out`` has no record of, and append their records to its ``steps_cpu.parquet``.

    A configuration is missing when its run on the hardware of the data set's records of the same process
    and thread count (device descriptor with its kernel curves, links, bus bandwidth ratios, overlap: one
    such block per count, as a collection writes it) has a run id that no record has. The new records carry
    that same hardware, so they sit beside the old ones as if the collection had measured them; each goes
    through the same quiet-machine check as in :func:`collect`. The records already there are rewritten
    unchanged (same rows, same order); the manifest's checksums follow and the addition is listed under
    ``amendments`` (date, command, rows added, each step's quiet check, the failures).

    Args:
        out: a data set directory written by ``learnedperf measure --device cpu`` (not ``--quick``).
        command: the command line, stored in the amendment.
        dry_run: only return the missing configurations' labels (as ``{"step": label}``), measure nothing.
        progress: show a progress bar on stderr.
        log: where one-line status messages go.

    Returns:
        The new step records (``{"step": label}`` entries with ``dry_run``).

    Raises:
        InputError: no manifest or a changed file, a data set of another machine (when something is
            to be measured), or a grid configuration whose process and thread count has not exactly one
            hardware block among the records (nothing to take its hardware from).
    """
    import pandas as pd

    from .bench import other_machine
    from .records import run_id, sha256_file, verify_manifest
    from .steps import run_dict, step_grid

    out = Path(out)
    manifest = verify_manifest(out)
    path = out / "steps_cpu.parquet"
    if not path.is_file():
        raise InputError(f"{path}: no CPU step records to add to")
    steps = pd.read_parquet(path)
    hardware = step_hardware(steps, path)
    known = set(steps["run_id"])
    missing: list[tuple] = []
    for config in step_grid(quick=False):
        hw = hardware.get((config.world_size, config.threads))
        if hw is None:
            raise InputError(f"{path}: no hardware block among the records of {config.world_size} process(es) of "
                             f"{config.threads} thread(s); {config.label()} needs exactly one")
        if run_id(run_dict(config, hw)) not in known:
            missing.append((config, hw))
    if dry_run or not missing:
        return [{"step": c.label()} for c, _ in missing]
    # listing is possible anywhere; measuring only on the machine whose device and links the records carry
    other = other_machine(manifest)
    if other:
        raise InputError(f"{out}: measured on another machine ({other}); new steps must be measured where the "
                         "others were")

    quiet: dict = {"threshold_share": QUIET_SHARE, "steps": [], "remeasured": [], "contended": []}
    quiet["before"] = wait_until_quiet()
    records: list[dict] = []
    failed: list[dict] = []
    for config, hw in _bar(missing, len(missing), "steps", progress, unit="step"):
        try:
            rec, check = _quietly(_step_checked(config, hw), lambda c=config, h=hw: _step_checked(c, h),
                                  config.label(), quiet, log)
        except LearnedPerfError as exc:
            # as in collect: one broken configuration must not lose the others
            failed.append({"step": config.label(), "reason": str(exc)})
            log(f"measure: step {config.label()} failed: {exc}")
            continue
        records.append(rec)
        quiet["steps"].append({"step": config.label(), "run_id": rec["run_id"], **check})
        log(f"measure: {config.label()}: {rec['iteration_time_ms']:.1f} ms "
            f"[{rec['iteration_p10_ms']:.1f}, {rec['iteration_p90_ms']:.1f}]")
    if records:
        write_parquet(steps.to_dict("records") + records, path, STEP_COLUMNS, "step")
        manifest["files"][path.name] = {"sha256": sha256_file(path), "rows": len(steps) + len(records)}
    manifest.setdefault("amendments", []).append({
        "date": now_utc(), "command": command, "rows_added": len(records),
        "what": f"{len(records)} step record(s) of step_grid configurations missing from {path.name}, measured "
                "by learnedperf.measure.collect.add_missing_steps on the hardware block (device, links) of the "
                "file's records of the same process count; existing records unchanged",
        "software": software_versions(), "quiet": quiet, "skipped": failed})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    verify_manifest(out)
    return records


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m learnedperf.measure.collect DATASET_DIR [--dry-run]``: add the step grid's missing
    configurations to a CPU data set (:func:`add_missing_steps`)."""
    import argparse

    ap = argparse.ArgumentParser(description="Measure the step-grid configurations a CPU data set lacks and "
                                             "append their records (existing records unchanged).")
    ap.add_argument("directory", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="list the missing configurations, measure nothing")
    args = ap.parse_args(argv)
    command = f"python -m learnedperf.measure.collect {args.directory.as_posix()}"
    try:
        added = add_missing_steps(args.directory, command=command, dry_run=args.dry_run)
    except LearnedPerfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for rec in added:
        print(rec["step"] if args.dry_run else
              f"{rec['run_id']} {rec['model_name']} {json.loads(rec['run'])['strategy']}: "
              f"{rec['iteration_time_ms']:.1f} ms [{rec['iteration_p10_ms']:.1f}, {rec['iteration_p90_ms']:.1f}]")
    print(f"{args.directory}: {len(added)} step configuration(s) " + ("missing" if args.dry_run else "added"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
