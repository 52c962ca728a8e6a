"""Held-out evaluation of the iteration-time methods on measured runs.

Each split of :data:`EVAL_SPLITS` is one rule over a record's columns. The rule marks the
*test* side for **both** sources: the measured test runs are scored, and neither they nor
the simulated runs the rule marks are trained on (so an "unseen scale" model has seen no
run, simulated or measured, at the tested scale). The splits are the measured-data
counterparts of :data:`learnedperf.data.splits.SPLITS`: the measured runs available
(vTrain's 1,440 A100 runs of 2-8 GPUs, NeuSight's 34 single-GPU fp32 runs on five GPUs — 3 training
steps, 31 forward-only — this project's steps of 1-4 processes on two CPUs, :data:`CPU_HOLDOUTS`) have
no H200 and nothing beyond 8 devices, so the thresholds differ.

Operator regressors of ``+ops`` methods are trained without the held-out GPU's operator
measurements in the GPUs' ``unseen_device:*`` splits (:data:`OP_DEVICE_HOLDOUT`; CPU records train none).
When the cost model's measured-device constants (``curve_efficiency``, ``curve_memory_efficiency``) are
set, as ``experiments/calibrate_steps.py --measured`` fits them on every CPU's steps, a CPU's split fits them
again on its training side's steps (:mod:`learnedperf.simulate.calibrate`) and simulates every CPU run with
them (:func:`~learnedperf.models.dataset.with_cost_params`), so that the held-out CPU's steps reach nothing.

Metrics per split and method (:func:`learnedperf.models.metrics.score`): MAPE, median and
p90 APE, Kendall τ and top-1 regret over the strategies of each (model, cluster, batch),
and the coverage of the 90 % interval.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable, Optional

from ..data.splits import split_mask
from ..errors import InputError
from .dataset import Runs, device_class, strategy_group, with_cost_params
from .iteration import METHODS, IterationModel, base_method, needs_ops
from .metrics import score

MEASURED_SCALE_THRESHOLD = 4
"""Devices above which a run is in the unseen-scale test side (the measured runs go up to 8)."""


def _device_name_is(name: str, device: str) -> bool:
    # a device and its variants (A100-PCIE-40GB, A100-SXM4-80GB, ...), not a longer name (P4 vs P40)
    return re.fullmatch(rf"{device}(-.*)?", name, flags=re.IGNORECASE) is not None


#: The catalog's parts of NVIDIA's GH100 chip: a lent GPU (the device tool's H100 or H200) is one of them.
HOPPER_PARTS = ("H100", "H200", "H800", "GH200")


def _is_hopper(name: str) -> bool:
    return any(_device_name_is(str(name), part) for part in HOPPER_PARTS)


def _device_is(df: Any, name: str):
    # the same rule over the records' device types (catalog names)
    return df["device_type"].map(lambda t: _device_name_is(t, name))


#: The CPUs this project measured (``datasets/measured/``), each held out on its own as each GPU is: split
#: suffix → the prefix of its measured device names (``cpu-<model>-<threads>t[-x<processes>]``, as
#: :func:`learnedperf.measure.bench.describe_device` names them). A CPU in no entry is in no device split.
CPU_HOLDOUTS = {"Xeon": "cpu-intel-xeon", "EPYC": "cpu-amd-epyc"}


def _cpu_name_is(name: str, prefix: str) -> bool:
    # the interval's device-class rule first, so that a held-out CPU is in the "cpu" calibration group
    return device_class(name) == "cpu" and str(name).lower().startswith(prefix)


#: name → (rule in words, test mask over records)
EVAL_SPLITS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "unseen_family": ("test = model family llama (GQA, SwiGLU, RMSNorm, RoPE)",
                      lambda df: split_mask(df, "unseen_family")),
    "unseen_device:A100": ("test = A100 runs (any A100 variant, and synthetic devices derived from them); A100 "
                           "operator measurements left out of the operator regressor",
                           lambda df: _device_is(df, "A100")),
    **{f"unseen_device:{cpu}": (f"test = steps on the {cpu} CPU (device {prefix}-*); the other CPU's steps "
                                "trained on (no CPU operator record trains the operator regressor; measured-device "
                                "cost constants, when set, refitted on their single-process steps)",
                                lambda df, p=prefix: df["device_type"].map(lambda t: _cpu_name_is(t, p)))
       for cpu, prefix in CPU_HOLDOUTS.items()},
    "unseen_device:V100": ("test = V100 runs (any V100 variant, and synthetic devices derived from them); V100 "
                           "operator measurements left out of the operator regressor",
                           lambda df: _device_is(df, "V100")),
    **{f"unseen_device:{d}": (f"test = {d} runs (NeuSight's forward-only fp32 steps, and synthetic devices derived "
                              f"from the {d}); {d} operator measurements left out of the operator regressor",
                              lambda df, d=d: _device_is(df, d)) for d in ("T4", "P100", "P4")},
    "unseen_device:Hopper": ("test = runs on a GH100 chip (H100, H200, H800, GH200: one chip, so held out together), "
                             "and synthetic devices derived from them; their operator measurements left out of the "
                             "operator regressor (skipped while no such run is measured)",
                             lambda df: df["device_type"].map(_is_hopper)),
    "unseen_strategy": ("test = tensor x pipeline parallel mixes (tp > 1 and pp > 1) and interleaved schedules "
                        "(with or without zero bubble)",
                        lambda df: ((df["tp"] > 1) & (df["pp"] > 1)) | split_mask(df, "unseen_strategy")),
    "unseen_sharding": ("test = fully sharded states (ZeRO-3 or FSDP)",
                        lambda df: split_mask(df, "unseen_sharding")),
    "unseen_scale": (f"test = more than {MEASURED_SCALE_THRESHOLD} devices: every test run has more devices than "
                     "any training run, simulated or measured", lambda df: df["num_devices"] > MEASURED_SCALE_THRESHOLD),
    "random": ("test = 10 % of configurations by hash of config_id", lambda df: split_mask(df, "random")),
}

#: split → predicate over an operator record's device name: those operator rows are left out. The CPU
#: splits have none: no CPU operator record trains the regressor (pipeline.fit_op_regressor), so they share
#: the regressor, and the runs labelled with it, of the splits that hold no device out
OP_DEVICE_HOLDOUT: dict[str, Callable[[str], bool]] = {
    **{f"unseen_device:{d}": lambda name, d=d: _device_name_is(name, d) for d in ("A100", "V100", "T4", "P100", "P4")},
    "unseen_device:Hopper": _is_hopper}


#: the splits that refit the measured-device cost constants on their training side (the CPU splits)
MEASURED_CONSTANTS_HOLDOUT = tuple(f"unseen_device:{cpu}" for cpu in CPU_HOLDOUTS)


def measured_constants_set() -> bool:
    """Whether the shipped cost constants hold a measured-device constant *fitted* on measured steps (its
    provenance says "fit by ..."), so that a CPU split must fit it again without the CPU it holds out; a value
    set without a fit holds nothing of any CPU."""
    from ..cost.params import provenance

    prov = provenance()
    return any(str((prov.get(name) or {}).get("provenance", "")).startswith("fit by")
               for name in ("curve_efficiency", "curve_memory_efficiency"))


def refit_measured_constants(runs: Runs, test: Any, log: Callable[[str], None] = lambda s: None) -> tuple[Runs, dict]:
    """``runs`` simulated again with measured-device constants fitted on the measured single-process steps of
    devices with kernel curves outside ``test`` (one data set per ``origin``), and what was fitted.

    Raises:
        InputError: no such step on the training side.
    """
    from ..simulate.calibrate import fit_measured_device_constants

    sets: dict[str, list] = {}
    measured = runs.measured
    for i in range(len(runs)):
        spec = runs.specs[i]
        # single-process steps: the ones the constants are fitted on (the others would only be scored)
        if (measured[i] and not test[i] and spec.hardware.device.kernel_curves is not None
                and spec.hardware.num_devices == 1):
            sets.setdefault(str(runs.records["origin"].iat[i]), []).append(
                (spec, float(runs.records["iteration_time_ms"].iat[i]), spec.hardware.num_devices))
    if not sets:
        raise InputError("no measured single-process step of a device with kernel curves on the training side to "
                         "fit the measured-device constants on")
    params, _table = fit_measured_device_constants(sets)
    fitted = {"curve_efficiency": params.curve_efficiency, "curve_memory_efficiency": params.curve_memory_efficiency,
              "fit_on": {k: len(v) for k, v in sorted(sets.items())}}
    log(f"measured-device constants refitted without the test side: curve_efficiency {params.curve_efficiency:g}, "
        f"curve_memory_efficiency {params.curve_memory_efficiency:g} (single-process steps: {fitted['fit_on']})")
    node_times = runs.sim_ops is not None and any(x is not None for x in runs.sim_ops[2])
    return with_cost_params(runs, params, node_times=node_times), fitted


def test_mask(records: Any, split: str):
    """Boolean numpy mask of the test side of ``split`` over ``records``."""
    if split not in EVAL_SPLITS:
        raise InputError(f"unknown evaluation split {split!r}; known: {', '.join(EVAL_SPLITS)}")
    return EVAL_SPLITS[split][1](records).to_numpy(dtype=bool)


def evaluate(runs_for: Callable[[Optional[Any]], Runs], methods: tuple[str, ...] = METHODS,
             splits: tuple[str, ...] = tuple(EVAL_SPLITS), gnn_params: Optional[dict] = None,
             op_regressor_for: Optional[Callable[[Optional[Callable[[str], bool]]], Any]] = None,
             seed: int = 0, log: Callable[[str], None] = lambda s: None, folds: int = 0) -> dict:
    """Train every method on every split's training side and score it on the measured test runs.

    Args:
        runs_for: ``runs_for(op_regressor)`` returns the data set's :class:`Runs`, loaded with that
            operator regressor (``None``: without learned operator costs). Called once per distinct
            regressor.
        methods: methods to compare (``+ops`` methods need ``op_regressor_for``).
        splits: split names of :data:`EVAL_SPLITS`.
        gnn_params: keyword arguments of the GNN.
        op_regressor_for: ``op_regressor_for(exclude)`` fits an operator regressor on the operator
            measurements whose device name ``exclude`` does not match (``exclude=None``: all).
        seed: seed of the calibration hold-out and the GNNs.
        log: progress messages.
        folds: calibration of every model (:class:`IterationModel`): 0 a held-out share, K >= 2
            cross-fitted over K folds of the split's measured training runs.

    Returns:
        ``{"splits": {split: {"rule", "train": {"simulated", "measured"}, "test_measured",
        "methods": {method: metrics + {"fit_s"}}}}, "predictions": [per-row dicts]}``.
    """
    if any(needs_ops(m) for m in methods) and op_regressor_for is None:
        raise InputError("methods with learned operator costs need op_regressor_for")
    cache: dict[Any, Runs] = {}

    def runs_with(exclude_key: Optional[str]) -> Runs:
        if exclude_key not in cache:
            reg = op_regressor_for(OP_DEVICE_HOLDOUT.get(exclude_key)) if op_regressor_for is not None else None
            cache[exclude_key] = runs_for(reg)
        return cache[exclude_key]

    report: dict[str, Any] = {"splits": {}, "predictions": []}
    for split in splits:
        key = split if split in OP_DEVICE_HOLDOUT else None
        # every labelling has the same records: one already made says whether this split has a measured test
        # run, before a regressor is fitted without its device (unseen_device:Hopper until a GPU is measured)
        probe = next(iter(cache.values()), None)
        if probe is not None and not (test_mask(probe.records, split) & probe.measured).any():
            runs = probe  # skipped just below, as any split without a measured test run
        else:
            runs = runs_with(key if op_regressor_for is not None else None)
        test = test_mask(runs.records, split)
        measured = runs.measured
        test_rows = test & measured
        if not test_rows.any():
            log(f"{split}: no measured test run; skipped")
            report["splits"][split] = {"rule": EVAL_SPLITS[split][0], "skipped": "no measured test run"}
            continue
        if not (measured & ~test).any():
            log(f"{split}: no measured training run; skipped")
            report["splits"][split] = {"rule": EVAL_SPLITS[split][0], "skipped": "no measured training run"}
            continue
        refitted = None
        if split in MEASURED_CONSTANTS_HOLDOUT and measured_constants_set():
            runs, refitted = refit_measured_constants(runs, test, log)
        train_runs, test_runs = runs.subset(~test), runs.subset(test_rows)
        y = test_runs.records["iteration_time_ms"].to_numpy(dtype=float)
        groups = strategy_group(test_runs.records)
        entry: dict[str, Any] = {"rule": EVAL_SPLITS[split][0],
                                 "train": {"simulated": int((~test & ~measured).sum()),
                                           "measured": int((~test & measured).sum())},
                                 "test_measured": int(test_rows.sum()), "methods": {}}
        if refitted is not None:
            entry["measured_device_constants"] = refitted
        fitted: dict[str, IterationModel] = {}  # this split's point models, shared by a method and its +shapes
        for method in methods:
            t0 = time.perf_counter()
            base = base_method(method)
            if base not in fitted:
                fitted[base] = IterationModel(base, gnn_params=gnn_params, op_regressor=runs.op_regressor,
                                              folds=folds, seed=seed).fit(train_runs)
            model = fitted[base] if method == base else fitted[base].with_shapes()
            # shape_runs: the measured training runs of each test run's shape key (what its shape memory rests on)
            p, lo, hi, shape_runs = model.predict(test_runs, shape_runs=True)
            metrics = score(p, y, groups, lo, hi)
            metrics["fit_s"] = round(time.perf_counter() - t0, 2)
            if hasattr(model, "shapes_"):
                # what the memory is over, and the held-out MAPE on the training side that chose it
                metrics["shapes_over"] = model.shapes_.over
                metrics["shapes_choice_mape"] = {k: round(v, 3) if math.isfinite(v) else None
                                                 for k, v in model.shape_choice_.items()}
            entry["methods"][method] = metrics
            log(f"{split:20s} {method:18s} MAPE {metrics['mape']:6.1f} %  tau {metrics['kendall_tau']:5.2f}  "
                f"regret {metrics['top1_regret']:.3f}  coverage {metrics['coverage']:.2f}  ({metrics['fit_s']} s)")
            for i in range(len(y)):
                row = {"split": split, "method": method, "run_id": test_runs.records["run_id"].iat[i],
                       "origin": test_runs.records["origin"].iat[i], "measured_ms": float(y[i]),
                       "predicted_ms": float(p[i]), "lower_ms": float(lo[i]), "upper_ms": float(hi[i])}
                if shape_runs is not None:
                    row["shape_runs"] = int(shape_runs[i])
                report["predictions"].append(row)
        report["splits"][split] = entry
    report["methods"] = list(methods)
    report["seed"] = seed
    return report


def require_unseen_devices(report: Any) -> None:
    """Raise :class:`InputError` when ``report`` was made with ``device_kernels`` (``learnedperf evaluate
    --device-kernels``): its device splits kept some of the held-out devices' kernels, so they would calibrate
    the interval of a device nobody measured on devices that were partly measured, too narrow."""
    kernels = report.get("device_kernels") if isinstance(report, dict) else None
    if kernels:
        raise InputError(f"the report was made with --device-kernels {kernels}: its devices are not unseen; "
                         "give a report made without it")


def novelty_residuals(report: dict, method: str, leave_out: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Leave-domain-out residuals ``log(measured / predicted)`` of ``method`` per novelty class, from the
    test-side predictions of an evaluation report (:func:`evaluate`).

    The test side of an ``unseen_*`` split was predicted by a model that saw no run of that device,
    family or scale: the situation of a novel run. A class pools the splits that reproduce it
    (:func:`~learnedperf.models.intervals.novelty_of_split`: ``unseen_device:*`` → ``unseen_device``,
    ...). A class none of whose splits is in the report (or left in after ``leave_out``) pools every
    remaining ``unseen_*`` split instead — some leave-something-out error beats the in-domain one.

    Args:
        report: an evaluation report with ``predictions``.
        method: the method whose predictions to use.
        leave_out: split names to ignore (a leave-one-split-out measurement of the interval).

    Returns:
        ``(log_ratios, calibrated_on)``: class → ``{split: numpy array}`` (what
        :meth:`~learnedperf.models.intervals.ConformalInterval.fit_novelty` weighs split by split),
        and class → ``{"splits": {split: n},
        "fallback": bool}`` (``fallback``: pooled from other kinds of split). Classes without any
        residual are absent.
    """
    import numpy as np

    from .intervals import NOVELTY_CLASSES, novelty_of_split
    from .metrics import _pair

    require_unseen_devices(report)

    rows: dict[str, tuple[list, list]] = {}
    for i, row in enumerate(report.get("predictions", [])):
        try:
            split = row["split"]
            if row["method"] != method or split in leave_out or not str(split).startswith("unseen_"):
                continue
            pred, meas = rows.setdefault(split, ([], []))
            pred.append(row["predicted_ms"])
            meas.append(row["measured_ms"])
        except (KeyError, TypeError) as exc:
            raise InputError(f"evaluation report: prediction {i} lacks key {exc}") from None
    by_split = {}
    for split, (pred, meas) in sorted(rows.items()):
        try:
            p, t = _pair(pred, meas)
        except (InputError, TypeError, ValueError) as exc:
            raise InputError(f"evaluation report: split {split!r}, method {method!r}: {exc}") from None
        by_split[split] = np.log(t / p)
    log_ratios, calibrated_on = {}, {}
    for cls in NOVELTY_CLASSES:
        own = [s for s in by_split if novelty_of_split(s) == cls]
        use = own or list(by_split)
        if use:
            # per split: each held-out device (family, scale) weighs as one draw of the class's error
            log_ratios[cls] = {s: by_split[s] for s in use}
            calibrated_on[cls] = {"splits": {s: int(len(by_split[s])) for s in use}, "fallback": not own}
    return log_ratios, calibrated_on


def merge_reports(reports: list[dict]) -> dict:
    """One report from several over the same data: different methods, or the same methods on different
    splits (``--splits``), e.g. evaluated in parallel processes. Raises :class:`InputError` if a method
    is scored twice on one split, or the
    reports differ in their data set, seed, GNN parameters, calibration folds, kernels of the held-out devices
    (``device_kernels``), or a split's test or training sets (a report written before folds or device kernels
    were recorded counts as 0)."""
    if not reports:
        raise InputError("no report to merge")
    # the methods of a merged report must be comparable: trained on the same runs, the same way
    settings = {"data set": lambda r: (r.get("data") or {}).get("dataset_manifest_sha256"),
                "seed": lambda r: r.get("seed"), "GNN parameters": lambda r: r.get("gnn_params") or {},
                "folds": lambda r: r.get("folds", 0),
                "kernels of the held-out devices": lambda r: r.get("device_kernels", 0)}
    for what, get in settings.items():
        values = [get(r) for r in reports]
        if any(v != values[0] for v in values):
            raise InputError(f"the reports differ in their {what}: {', '.join(map(repr, values))}")
    out = {k: v for k, v in reports[0].items() if k not in ("splits", "predictions", "methods")}
    out["methods"], out["splits"], out["predictions"] = [], {}, []
    for rep in reports:
        out["methods"] += [m for m in rep["methods"] if m not in out["methods"]]
        out["predictions"] += rep.get("predictions", [])
        for split, entry in rep["splits"].items():
            mine = out["splits"].setdefault(split, {k: v for k, v in entry.items() if k != "methods"})
            if "methods" in entry:
                dup = set(entry["methods"]) & set(mine.get("methods", {}))
                if dup:
                    raise InputError(f"split {split!r}: method(s) {sorted(dup)} appear in more than one report")
                if mine.get("test_measured") != entry.get("test_measured"):
                    raise InputError(f"split {split!r}: the reports have different test sets")
                if mine.get("train") != entry.get("train"):  # e.g. another --limit-simulated
                    raise InputError(f"split {split!r}: the reports have different training sets "
                                     f"({mine.get('train')} and {entry.get('train')})")
                mine.setdefault("methods", {}).update(entry["methods"])
    order = [m for m in METHODS if m in out["methods"]]
    out["methods"] = order
    return out


def format_table(report: dict, metric: str = "mape") -> str:
    """A Markdown table: one row per split, one column per method, cells = ``metric``."""
    methods = report["methods"]
    fmt = {"mape": "{:.1f}", "kendall_tau": "{:.2f}", "top1_regret": "{:.3f}", "coverage": "{:.2f}"}.get(metric,
                                                                                                        "{:.3g}")
    lines = ["| split | measured test runs | " + " | ".join(methods) + " |",
             "|---|---:|" + "---:|" * len(methods)]
    for split, entry in report["splits"].items():
        if "skipped" in entry:
            lines.append(f"| {split} | 0 | " + " | ".join("—" for _ in methods) + " |")
            continue
        cells = []
        for m in methods:
            v = entry["methods"].get(m, {}).get(metric)
            cells.append("—" if v is None or v != v else fmt.format(v))
        lines.append(f"| {split} | {entry['test_measured']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["CPU_HOLDOUTS", "EVAL_SPLITS", "MEASURED_CONSTANTS_HOLDOUT", "MEASURED_SCALE_THRESHOLD", "OP_DEVICE_HOLDOUT",
           "evaluate", "format_table", "measured_constants_set", "merge_reports", "refit_measured_constants",
           "novelty_residuals", "test_mask"]
