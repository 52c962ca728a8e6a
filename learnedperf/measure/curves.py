"""A device's kernel curves, fitted on its own operator records, and carried by its descriptor.

:func:`fit_device_curves` reduces a data set's single-process operator records to the optional
``kernel_curves`` and ``optimizer_step`` of a device descriptor (:mod:`learnedperf.cost.curves`):

* ``matmul`` per dtype, from the forward GEMMs (linear and bmm);
* ``attention_fwd`` / ``attention_bwd`` per dtype, from the fused attention records, with the key
  block a causal kernel skips whole (fitted on the causal and non-causal records). An isolated
  backward also pays the autograd engine's start-up, which a training step pays once for its whole
  graph: the backward curve keeps the forward's overhead (its rate and d½ are its own fit);
* ``adam`` / ``sgd`` from the optimizer-step records over fp32 parameters.

:func:`with_curves` puts them into a descriptor; a descriptor of several processes sharing the
machine (``-x2``...) gets rates scaled by its own measured peak (GEMMs, attention) or bandwidth
(optimizer) against those of the descriptor the operators were timed on, the shape of each curve
(overhead, d½) staying the single-process one. ``learnedperf measure`` does both for the steps it
measures; :func:`attach_curves` amends a data set collected before it did.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError

#: minimum timings per fitted curve (a curve from fewer is left out, and the report says so)
MIN_TIMINGS = 6


def _shape(value) -> tuple:
    return tuple(int(x) for x in (json.loads(value) if isinstance(value, str) else value))


def _params(value) -> dict:
    return (json.loads(value) if isinstance(value, str) else value) or {}


def single_process_compute(records: list[dict]) -> list[dict]:
    """The operator records :func:`fit_device_curves` takes: one process, no collective."""
    return [r for r in records if int(r["world_size"]) == 1 and r["direction"] != "comm"]


def fit_device_curves(records: list[dict]) -> tuple[dict, dict]:
    """Fit kernel curves and optimizer rates on one device's operator records.

    Args:
        records: operator records (``OP_COLUMNS`` dicts) of one device descriptor, single-process.

    Returns:
        ``(curves, report)``: ``curves`` has ``kernel_curves`` and ``optimizer_step`` (each left out
        when no curve could be fitted) and ``device`` (the descriptor the records were timed on);
        ``report`` lists each fit's mean |log error| and timings, and what was left out and why.

    Raises:
        InputError: records of several devices or of several processes.
    """
    from ..cost.curves import fit_kernel_curve, fit_optimizer_rate
    from ..graph.ops import Op

    rows = [r for r in records if r["kind"] in ("matmul", "attention", "optimizer")]
    devices = {r["device"] for r in rows}
    if len(devices) > 1:
        raise InputError(f"fit_device_curves: records of {len(devices)} devices; fit one device at a time")
    if any(int(r["world_size"]) != 1 for r in rows):
        raise InputError("fit_device_curves: operator records of one process expected")
    groups: dict[tuple[str, str], list] = {}
    for r in rows:
        shape, dtype = _shape(r["shape"]), r["dtype"]
        t = float(r["time_ms"]) * 1e-3
        if r["kind"] == "matmul" and r["direction"] == "fwd":
            groups.setdefault(("matmul", dtype), []).append((shape[1:4], float(r["flops"]), t))
        elif r["kind"] == "attention" and r["direction"] in ("fwd", "bwd"):
            op = Op("sdpa", "attention", r["direction"], float(r["flops"]), float(r["bytes"]), dtype, shape,
                    causal=bool(_params(r["params"]).get("causal", False)))
            groups.setdefault((f"attention_{r['direction']}", dtype), []).append((shape[2:5], op, t))
        elif r["kind"] == "optimizer" and _params(r["params"]).get("precision", "fp32") == "fp32":
            name = {"adamw": "adam", "adam": "adam", "sgd": "sgd"}.get(r["op"])
            if name:
                groups.setdefault(("optimizer", name), []).append((shape[0], t))
    kernel_curves: dict[str, dict] = {}
    optimizer_step: dict[str, dict] = {}
    report: dict = {"fits": {}, "left_out": {}}
    for (kernel, key), points in sorted(groups.items()):
        label = f"{kernel}.{key}"
        if len(points) < MIN_TIMINGS:
            report["left_out"][label] = f"{len(points)} timings (at least {MIN_TIMINGS} needed)"
            continue
        if kernel == "optimizer":
            fit = fit_optimizer_rate([p[0] for p in points], [p[1] for p in points])
            optimizer_step[key] = {"ns_per_param": fit["ns_per_param"], "overhead_us": fit["overhead_us"]}
        elif kernel == "matmul":
            fit = fit_kernel_curve([p[0] for p in points], [p[1] for p in points], [p[2] for p in points])
            kernel_curves.setdefault(kernel, {})[key] = {k: fit[k] for k in ("tflops", "overhead_us", "dim_half")}
        else:
            fit = _fit_attention(points)
            kernel_curves.setdefault(kernel, {})[key] = {k: fit[k] for k in ("tflops", "overhead_us", "dim_half",
                                                                              "causal_block")}
        report["fits"][label] = {"mean_abs_log_error": fit["mean_abs_log_error"], "timings": fit["timings"],
                                 "curve": dict(optimizer_step[key] if kernel == "optimizer"
                                               else kernel_curves[kernel][key])}
    kept = {}
    for dtype, curve in kernel_curves.pop("attention_bwd", {}).items():
        fwd = kernel_curves.get("attention_fwd", {}).get(dtype)
        if fwd is None:  # no forward to take the overhead from: the backward alone would overstate it
            report["left_out"][f"attention_bwd.{dtype}"] = "no forward curve of the same dtype"
            continue
        kept[dtype] = {**curve, "overhead_us": fwd["overhead_us"]}
        report["fits"][f"attention_bwd.{dtype}"].update(curve=dict(kept[dtype]), overhead_from=f"attention_fwd.{dtype}")
    if kept:
        kernel_curves["attention_bwd"] = kept
    curves = {"kernel_curves": kernel_curves, "optimizer_step": optimizer_step,
              "device": json.loads(devices.pop()) if devices else None}
    return curves, report


#: Candidate key blocks of a causal attention kernel (:func:`_fit_attention`): FlashAttention's tiles on
#: GPUs, PyTorch's CPU kernel's key split (512 keys from 512-key sequences on).
CAUSAL_BLOCKS = (64, 128, 256, 512, 1024, 2048, 4096)


def _fit_attention(points: list) -> dict:
    """The kernel curve of (dims, op, seconds) attention timings, with the causal key block that fits best.

    A causal kernel skips the key blocks above the diagonal (:func:`~learnedperf.cost.roofline.attention_flops`);
    how many depends on the kernel's block, which the causal and non-causal timings of the same shapes
    tell apart. Each candidate of :data:`CAUSAL_BLOCKS` is fitted; the lowest mean |log error| wins, and
    among equal ones the smallest block (blocks beyond the longest timed sequence cannot be told apart).
    """
    from ..cost.curves import fit_kernel_curve
    from ..cost.roofline import attention_flops

    best, tried = None, set()
    for block in CAUSAL_BLOCKS:
        flops = tuple(attention_flops(p[1], block) for p in points)
        if flops in tried:  # a block past every timed sequence: the same data as a smaller one, no refit
            continue
        tried.add(flops)
        fit = fit_kernel_curve([p[0] for p in points], flops, [p[2] for p in points])
        if best is None or fit["mean_abs_log_error"] < best["mean_abs_log_error"] - 1e-12:
            best = {**fit, "causal_block": block}
    return best


def with_curves(descriptor: dict, curves: dict, source: str) -> dict:
    """``descriptor`` with the fitted ``curves`` (of :func:`fit_device_curves`), rates scaled to it.

    Args:
        descriptor: a device descriptor (DeviceSpec dict).
        curves: the fit, with the ``device`` its operators were timed on.
        source: where the curves came from, stored in ``sources``.
    """
    base = curves.get("device") or descriptor
    out = dict(descriptor)
    kernel_curves = {}
    for kernel, per_dtype in curves.get("kernel_curves", {}).items():
        for dtype, c in per_dtype.items():
            mine, theirs = descriptor["peak_tflops"].get(dtype), base["peak_tflops"].get(dtype)
            if not mine or not theirs:
                continue  # this descriptor has no such math measured: no curve either
            kernel_curves.setdefault(kernel, {})[dtype] = {"tflops": round(c["tflops"] * mine / theirs, 6),
                                                           "overhead_us": round(c["overhead_us"], 3),
                                                           "dim_half": round(c["dim_half"], 3),
                                                           **({"causal_block": int(c["causal_block"])}
                                                              if c.get("causal_block") else {})}
    scale_bw = base["memory_bandwidth_GBps"] / descriptor["memory_bandwidth_GBps"]
    optimizer_step = {k: {"ns_per_param": round(v["ns_per_param"] * scale_bw, 6),
                          "overhead_us": round(v["overhead_us"], 3)}
                      for k, v in curves.get("optimizer_step", {}).items()}
    if kernel_curves:
        out["kernel_curves"] = kernel_curves
    if optimizer_step:
        out["optimizer_step"] = optimizer_step
    if kernel_curves or optimizer_step:
        same = base.get("name") == descriptor.get("name")
        out["sources"] = {**descriptor.get("sources", {}), "kernel_curves": source + (
            "" if same else f"; rates scaled by this descriptor's peak (optimizer: bandwidth) against "
                            f"{base.get('name')}'s")}
    return out


def attach_curves(directory: str | Path, command: str = "") -> dict:
    """Amend a data set: fit curves on its single-process operator records and put them into the
    device descriptor of every step record (``run`` and ``device``; ``run_id`` follows the run).

    The manifest's file checksums are updated and the amendment is listed under ``amendments``
    (with the fit report); the manifest's quiet-check entries follow the new run ids.

    Returns:
        The fit report.

    Raises:
        InputError: no manifest or a changed file, no operator or step records, or no curve fitted.
    """
    import pandas as pd

    from .records import amend_steps, is_datasheet, verify_manifest

    directory = Path(directory)
    manifest = verify_manifest(directory)
    op_files = sorted(f for f in directory.glob("ops*.parquet") if not f.stem.endswith("_collectives"))
    if not op_files or not any(directory.glob("steps*.parquet")):
        raise InputError(f"{directory}: needs operator (ops*.parquet) and step (steps*.parquet) records")
    for f in sorted(directory.glob("steps*.parquet")):
        described = [json.loads(r)["hardware"]["device"] for r in pd.read_parquet(f, columns=["run"])["run"]]
        if any(isinstance(d, dict) and is_datasheet(d) for d in described):
            # a prediction for a GPU is asked with its data sheet, not with curves (collect.gpu_datasheet)
            raise InputError(f"{f}: its steps describe a GPU by its data sheet, as a prediction for it is asked; "
                             "kernel curves are added to measured descriptors (CPU data sets) only")
    ops = pd.concat([pd.read_parquet(f) for f in op_files], ignore_index=True)
    curves, report = fit_device_curves(single_process_compute(ops.to_dict("records")))
    if not curves["kernel_curves"] and not curves["optimizer_step"]:
        raise InputError(f"{directory}: no curve could be fitted ({report['left_out']})")
    # no date here: amending twice gives the same runs (and run ids); the manifest dates the amendment
    source = (f"fitted by learnedperf.measure.curves.attach_curves on the operator records "
              f"{', '.join(f.name for f in op_files)} of this data set (manifest.json: amendments)")

    def transform(run: dict) -> dict:
        run["hardware"]["device"] = with_curves(run["hardware"]["device"], curves, source)
        return run

    amend_steps(directory, transform, manifest=manifest, command=command,
                what="kernel curves and optimizer rates added to the step records' device descriptors "
                     "(learnedperf.measure.curves.attach_curves); run ids follow the runs",
                details={"curves": {k: curves[k] for k in ("kernel_curves", "optimizer_step")}, "report": report})
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m learnedperf.measure.curves DATASET_DIR ...``: amend data sets (:func:`attach_curves`)."""
    import argparse
    import sys

    from ..errors import LearnedPerfError

    ap = argparse.ArgumentParser(description="Fit kernel curves on a data set's operator records and add them "
                                             "to its step records' device descriptors.")
    ap.add_argument("directories", nargs="+", type=Path)
    args = ap.parse_args(argv)
    command = "python -m learnedperf.measure.curves " + " ".join(str(d) for d in args.directories)
    for d in args.directories:
        try:
            report = attach_curves(d, command=command)
        except LearnedPerfError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{d}: curves added to every step record's device descriptor"
              + (f"; left out: {report['left_out']}" if report["left_out"] else ""))
        for label, fit in report["fits"].items():
            c = fit["curve"]
            what = (f"{c['ns_per_param']:.3g} ns/param" if "ns_per_param" in c else
                    f"{c['tflops']:.3g} TFLOP/s, d½ {c['dim_half']:.3g}"
                    + (f", causal block {c['causal_block']}" if c.get("causal_block") else ""))
            print(f"  {label:<20} {what}, overhead {c['overhead_us']:.3g} us "
                  f"(mean |log error| {fit['mean_abs_log_error']:.3f} over {fit['timings']} timings)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
