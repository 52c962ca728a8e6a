"""Training and evaluation pipelines behind ``learnedperf train`` and ``learnedperf evaluate``.

* :func:`fit_op_regressor` — the per-operator LightGBM regressor on every accelerator operator
  measurement available (this project's ``datasets/measured`` and NeuSight's), locally
  or through ``lightgbm.dask`` on a Dask cluster.
* :func:`run_evaluation` — every method on every held-out split of a data set
  (:mod:`learnedperf.models.evaluate`).
* :func:`fit_model` — one method on a whole data set (what a checkpoint ships), with a
  description of its training data for the checkpoint manifest.
* :func:`choose_method` — the method an evaluation report favours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import InputError
from .iteration import METHODS, IterationModel, needs_ops

#: Splits whose MAPE decides :func:`choose_method` (the generalisation the project is judged on). Splits
#: are grouped by criterion (the name before ``:``): each unseen device is one draw of "an unseen device",
#: however many runs it has (NeuSight's 3 P4 steps weigh as much as vTrain's 1,440 A100 runs), and the
#: criteria — unseen device, scale, family, strategy — weigh the same, so that adding devices does not
#: outvote the other kinds of generalisation (a report without a split averages the others).
CHOICE_SPLITS = ("unseen_device:A100", "unseen_device:Xeon", "unseen_device:EPYC", "unseen_device:V100",
                 "unseen_device:T4", "unseen_device:P100", "unseen_device:P4", "unseen_device:Hopper", "unseen_scale",
                 "unseen_family", "unseen_strategy")


def excluded_rows(device_names: Any, exclude: Callable[[str], bool], keep: int = 0, seed: int = 0) -> Any:
    """Boolean mask of the rows whose device name ``exclude`` matches, less ``keep`` of each such device's rows
    (drawn without replacement with ``seed``; all of them when it has fewer)."""
    import numpy as np

    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise InputError(f"device_kernels: expected an integer >= 0, got {keep!r}")
    names = np.asarray(device_names, dtype=object).astype(str)
    mask = np.array([bool(exclude(n)) for n in names], dtype=bool)
    if keep:
        rng = np.random.default_rng(seed)
        for name in sorted(set(names[mask])):  # sorted: the draw depends only on the data and the seed
            idx = np.flatnonzero(names == name)
            mask[rng.choice(idx, min(keep, len(idx)), replace=False)] = False
    return mask


def fit_op_regressor(exclude: Optional[Callable[[str], bool]] = None, client: Any = None,
                     rows_per_device: Optional[int] = 30000, seed: int = 0, device_kernels: int = 0, **params: Any):
    """An :class:`~learnedperf.models.gbdt.OpTimeRegressor` fitted on the accelerators' operator
    measurements (``load_op_training_data``) whose device name ``exclude`` does not match.

    CPU operator records are left out: a CPU's operators are costed by its own measured kernel curves and
    bandwidth (the regressor then does not cover the ``cpu`` device class), and one tree model over both
    classes lets CPU timings move GPU predictions. Measured on the held-out evaluation of 2026-11-27:
    adding the EPYC's 4,600 operator records to the Xeon's and the GPUs' moved ``simulator+ops`` on the
    held-out V100's 11 steps from 19.8 to 28.4 % (20.2 % with the GPUs' records alone), and the learned
    CPU costs were worse than the roofline on the measured bandwidth on the held-out Xeon (15.9 against
    15.0 %).

    Args:
        exclude: predicate over device names whose rows are left out (None: keep all).
        client: a ``dask.distributed.Client`` to train through ``lightgbm.dask``.
        rows_per_device: deterministic subsample per device (None: all rows).
        seed: subsample and LightGBM seed.
        device_kernels: of each excluded device, keep this many of its rows (drawn with ``seed``): a device
            with ``device_kernels`` of its operators measured, which the regressor learns its offsets from.
        **params: LightGBM parameters.
    """
    from .dataset import device_class
    from .gbdt import OpTimeRegressor, load_op_training_data

    df = load_op_training_data(rows_per_device=rows_per_device, seed=seed)
    df = df[(df["device_name"].astype(str).map(device_class) != "cpu").to_numpy()]
    if exclude is not None:
        df = df[~excluded_rows(df["device_name"], exclude, device_kernels, seed)]
    if len(df) == 0:
        raise InputError("no operator measurement left to train the operator regressor on")
    return OpTimeRegressor(random_state=seed, **params).fit_records(df, client=client)


def _loader(data_dir: str | Path, progress: bool, limit_simulated: Optional[int], node_times: bool = True):
    from .dataset import load_runs

    def runs_for(op_regressor: Any):
        return load_runs(data_dir, op_regressor=op_regressor, limit_simulated=limit_simulated, progress=progress,
                         node_times=node_times)

    return runs_for


def run_evaluation(data_dir: str | Path, methods: tuple[str, ...] = METHODS, splits: Optional[tuple[str, ...]] = None,
                   gnn_params: Optional[dict] = None, client: Any = None, limit_simulated: Optional[int] = None,
                   seed: int = 0, progress: bool = False, log: Callable[[str], None] = lambda s: None,
                   folds: int = 0, device_kernels: int = 0) -> dict:
    """Evaluate ``methods`` on the held-out splits of the data set ``data_dir`` (see :func:`evaluate`).

    ``device_kernels``: a GPU split's held-out device keeps that many of its operator records in the operator
    regressor's training (:func:`fit_op_regressor`); the report records it, and reports of different values
    do not merge."""
    from .evaluate import EVAL_SPLITS, evaluate

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise InputError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    op_for = None
    if any(needs_ops(m) for m in methods):
        def op_for(exclude: Optional[Callable[[str], bool]]):
            return fit_op_regressor(exclude, client=client, seed=seed, device_kernels=device_kernels)
    # learned node times feed only gnn_residual+ops, and cost minutes on thousands of large graphs
    loader = _loader(data_dir, progress, limit_simulated, node_times="gnn_residual+ops" in methods)
    report = evaluate(loader, methods=methods,
                      splits=tuple(splits or EVAL_SPLITS), gnn_params=gnn_params, op_regressor_for=op_for, seed=seed,
                      log=log, folds=folds)
    report["data"] = data_description(data_dir)
    report["gnn_params"] = dict(gnn_params or {})
    report["folds"] = folds
    report["device_kernels"] = device_kernels
    return report


def choose_method(report: dict, splits: tuple[str, ...] = CHOICE_SPLITS) -> tuple[str, dict, str]:
    """The method to ship by an evaluation report: ``(method, every method's mean MAPE, why)``.

    The score is the mean MAPE over the criteria of ``splits`` (NaN-free splits only). A criterion is a split
    name's part before ``:`` (``unseen_device:A100`` and ``unseen_device:Xeon`` are both ``unseen_device``); its
    MAPE is the mean over its splits, and the score the mean over criteria. The lowest score wins, unless its lead
    over another method is within the noise of the report itself: smaller than the standard error of the two
    methods' split-by-split differences (over the splits both score). Among the methods so tied with the best,
    the lowest worst split wins: the issue's bar is per split (15 % on every unseen device and unseen scale), and a
    lead the splits cannot tell from noise should not buy one split far above it.
    """
    import math
    import statistics

    means: dict[str, float] = {}
    per_split: dict[str, dict[str, float]] = {}
    for method in report.get("methods", []):
        by_criterion: dict[str, list[float]] = {}
        for s in splits:
            entry = report.get("splits", {}).get(s, {}).get("methods", {}).get(method)
            if entry is not None and entry["mape"] == entry["mape"]:
                by_criterion.setdefault(s.split(":")[0], []).append(entry["mape"])
                per_split.setdefault(method, {})[s] = entry["mape"]
        if by_criterion:
            means[method] = sum(sum(v) / len(v) for v in by_criterion.values()) / len(by_criterion)
    if not means:
        raise InputError(f"the evaluation report scores no method on the splits {list(splits)}")
    best = min(means, key=lambda m: (means[m], m))
    tied = [best]
    for m in sorted(means):
        shared = [s for s in per_split[best] if s in per_split[m]]
        if m == best or len(shared) < 2:
            continue
        diff = [per_split[m][s] - per_split[best][s] for s in shared]
        if means[m] - means[best] < statistics.stdev(diff) / math.sqrt(len(diff)):
            tied.append(m)
    rounded = {m: round(v, 3) for m, v in means.items() if not math.isnan(v)}
    if len(tied) == 1:
        return best, rounded, "lowest mean MAPE over the unseen criteria"
    worst = {m: max(per_split[m].values()) for m in tied}
    chosen = min(tied, key=lambda m: (worst[m], means[m], m))
    why = (f"lowest worst unseen split ({worst[chosen]:.2f} %) among the methods whose mean MAPE over the unseen "
           f"criteria is within one standard error of their split differences of the lowest: "
           + ", ".join(f"{m} {means[m]:.2f} (worst {worst[m]:.2f})" for m in tied))
    return chosen, rounded, why


def data_description(data_dir: str | Path) -> dict:
    """What a data set is, for a checkpoint manifest: its manifest's sha256, counts and generation config."""
    from ..data.store import MANIFEST
    from ..io import load_json_file
    from ..measure.records import sha256_file

    data_dir = Path(data_dir)
    manifest = load_json_file(data_dir / MANIFEST)
    return {"dataset_manifest_sha256": sha256_file(data_dir / MANIFEST), "counts": manifest.get("counts"),
            "config": {k: manifest.get("config", {}).get(k) for k in ("n", "seed", "keep_oom", "measured")},
            "simulator_version": manifest.get("simulator_version"),
            "simulator_fingerprint": manifest.get("simulator_fingerprint"),
            "cost_model_version": manifest.get("cost_model_version")}


def fit_model(data_dir: str | Path, method: str, gnn_params: Optional[dict] = None, client: Any = None,
              limit_simulated: Optional[int] = None, seed: int = 0, progress: bool = False,
              evaluation: Optional[dict] = None, folds: int = 0) -> tuple[IterationModel, dict]:
    """Fit ``method`` on every usable run of ``data_dir``; return the model and its training-data description.

    ``folds``: the interval's calibration (:class:`IterationModel`): 0 a held-out share of the measured runs,
    K >= 2 cross-fitted over K folds.

    With ``evaluation`` (a report of :func:`run_evaluation`), the interval's out-of-domain classes are
    calibrated on the report's leave-domain-out predictions of ``method``
    (:func:`~learnedperf.models.evaluate.novelty_residuals`); a report without predictions of
    ``method`` leaves them uncalibrated, which the description says.
    """
    op_reg = fit_op_regressor(None, client=client, seed=seed) if needs_ops(method) else None
    runs = _loader(data_dir, progress, limit_simulated)(op_reg)
    model = IterationModel(method, gnn_params=gnn_params, op_regressor=op_reg, seed=seed, folds=folds).fit(runs)
    desc = data_description(data_dir)
    rec = runs.records
    desc["used"] = {"runs": len(runs), "by_origin": {str(k): int(v) for k, v in rec["origin"].value_counts().items()},
                    "dropped": dict(runs.dropped), "calibration_runs": model.interval_.n_calibration_}
    if evaluation is not None:
        from .evaluate import novelty_residuals

        log_ratios, calibrated_on = novelty_residuals(evaluation, method)
        model.interval_.fit_novelty(log_ratios, calibrated_on)
        # which evaluation the novel-run intervals rest on (the per-class splits are in the interval itself)
        desc["used"]["novelty_calibration"] = {
            "evaluation_dataset_manifest_sha256": (evaluation.get("data") or {}).get("dataset_manifest_sha256"),
            "method": method, "residuals": {c: model.interval_.novelty_[c]["n"] for c in log_ratios}}
    if op_reg is not None:
        desc["op_regressor"] = {"trained_with": getattr(op_reg, "trained_with_", "local")}
    return model, desc


def measured_runs(data_dir: str | Path) -> list[dict]:
    """The measured runs of a data set that the methods train on (the rows
    :func:`~learnedperf.models.dataset.load_runs` keeps: :func:`~learnedperf.models.dataset.unusable_reason`),
    as run dicts."""
    import json

    from ..data.store import load_records
    from .dataset import unusable_reason

    df = load_records(Path(data_dir), sources=("measured",), check=True)
    return [json.loads(run) for run, *cols in zip(df["run"], df["graph_shard"], df["sim_iteration_time_ms"],
                                                   df["iteration_time_ms"]) if unusable_reason(*cols) is None]


__all__ = ["CHOICE_SPLITS", "choose_method", "data_description", "fit_model", "fit_op_regressor", "measured_runs",
           "run_evaluation"]
