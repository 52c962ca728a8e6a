"""The iteration-time model: a simulator base, an optional GNN over the execution graph, a conformal interval.

:class:`IterationModel` is one of the *methods* that learnedperf compares (and ships the
best of):

================== ===========================================================================
``formula``         model FLOPs (×4/3 with full recompute) / (devices · peak) divided by an MFU
                    fitted on the measured training runs — the throughput-times-peak baseline
``simulator``       the discrete-event simulator on the fitted roofline cost model
``simulator+ops``   the simulator on learned per-operator costs (LightGBM, :class:`LearnedOpCost`)
``gnn_direct``      a GNN predicting log time from the graph alone (node costs from the roofline;
                    it never sees the simulator's answer), pre-trained on simulated runs,
                    fine-tuned on measured ones
``gnn_residual``    the simulator × exp(GNN correction); simulated runs anchor the correction at
                    zero, measured runs pull it
``gnn_residual+ops`` the same over the simulator on learned operator costs, with the regressor's
                    node times as node features
================== ===========================================================================

Each has a ``+shapes`` variant (``gnn_residual+shapes``): the same point model times its *shape memory*
(:class:`~learnedperf.models.shapes.ShapeMemory`), the median of what it missed, out of sample, on the
measured runs with the run's per-device layer shapes, where there are such runs. A ``gnn_residual*+shapes``
memory is over the simulator instead, where that holds out better on the calibration runs (``shape_choice_``).

Every method gets a conformal 90 % interval calibrated on measured runs it did not train on.
By default it is split-conformal: ``calibration_fraction`` of the measured training runs (whole
strategy groups, chosen by hash) are held back from the GNN and used only for calibration. With
``folds=K`` it is cross-fitted instead: the measured runs' strategy groups are dealt into K folds
by the same hash, the GNN is an ensemble of K networks, network k trained on every run but fold k's,
and every measured run is calibrated on the prediction of the network that did not see it (its
out-of-fold prediction; the formula's MFU likewise per fold). Every measured run then trains the
model (in K-1 of its networks) and calibrates the interval, and the point prediction is the mean
over K networks. The interval also
records the :class:`~learnedperf.models.intervals.TrainingDomain` of the measured runs the
model learned from, so that a novel run can get a wider interval
(:meth:`~learnedperf.models.intervals.ConformalInterval.fit_novelty`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import InputError
from .dataset import Runs, interval_group, strategy_group
from .intervals import ConformalInterval, TrainingDomain
from .shapes import SHAPES_SUFFIX, ShapeMemory, shape_key

BASE_METHODS = ("formula", "simulator", "simulator+ops", "gnn_direct", "gnn_residual", "gnn_residual+ops")
"""The point models, in the order the evaluation reports them."""

METHODS = BASE_METHODS + tuple(m + SHAPES_SUFFIX for m in BASE_METHODS)
"""Methods: each point model, and the same with its shape memory (:mod:`learnedperf.models.shapes`)."""

GNN_METHODS = {m + s: mode for m, mode in (("gnn_direct", "direct"), ("gnn_residual", "residual"),
                                           ("gnn_residual+ops", "residual")) for s in ("", SHAPES_SUFFIX)}
"""GNN methods → the GNN's mode."""


def base_method(method: str) -> str:
    """The point model of ``method`` (``gnn_residual+shapes`` → ``gnn_residual``)."""
    return method[:-len(SHAPES_SUFFIX)] if method.endswith(SHAPES_SUFFIX) else method


def parse_gnn_params(items: Any) -> dict:
    """``KEY=VALUE`` strings (``--gnn`` flags) as GNN hyperparameters, each value read as JSON where it parses
    (numbers, booleans) and kept as text otherwise; check them with :func:`check_gnn_params`.

    Raises:
        InputError: an item without ``=`` or without a key (the message: ``expects KEY=VALUE, got 'item'``).
    """
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise InputError(f"expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def check_gnn_params(gnn_params: dict) -> None:
    """Refuse, with one :class:`InputError` naming the parameter, GNN hyperparameters a GNN method cannot
    take: an unknown name, a value :class:`~learnedperf.models.gnn.GNNRegressor` refuses, or ``mode``
    (the method sets it: ``gnn_direct`` direct, ``gnn_residual*`` residual)."""
    if "mode" in gnn_params:
        raise InputError("GNN parameter 'mode' is set by the method (gnn_direct: direct, gnn_residual and "
                         "gnn_residual+ops: residual); leave it out")
    from .gnn import GNNRegressor

    known = GNNRegressor().get_params()
    unknown = sorted(set(gnn_params) - set(known))
    if unknown:
        raise InputError(f"unknown GNN parameter(s) {unknown}; known: {', '.join(k for k in known if k != 'mode')}")
    try:
        GNNRegressor(**gnn_params)
    except (TypeError, ValueError) as exc:  # int("abc"), float(None), ...: name what was given
        raise InputError(f"GNN parameters {gnn_params}: {exc}") from None


def corrects_simulator(method: str) -> bool:
    """Whether ``method``'s point model is the simulator times a learned correction (``gnn_residual*``): its shape
    memory may be kept over the simulator instead (:meth:`IterationModel.fit`)."""
    return GNN_METHODS.get(method) == "residual"


def needs_ops(method: str) -> bool:
    """Whether ``method`` runs on learned operator costs."""
    return base_method(method).endswith("+ops")


def ideal_time_ms(specs: list):
    """Model FLOPs of the iteration (4/3 of them with full recompute: one more forward) over the
    devices' peak FLOP/s, in ms: the throughput-times-peak time at 100 % utilisation."""
    import numpy as np

    from ..graph.transformer import model_flops_per_iteration

    out = np.empty(len(specs))
    for i, spec in enumerate(specs):
        s = spec.strategy
        factor = 4.0 / 3.0 if s.recompute == "full" else 1.0
        dev = spec.hardware.device
        peak = dev.peak_tflops.get(s.precision) or dev.peak_tflops.fp32
        out[i] = factor * model_flops_per_iteration(spec) / (spec.hardware.num_devices * peak * 1e12) * 1e3
    return out


def _group_hashes(records: Any, seed: int):
    """A seeded 32-bit hash of each row's strategy group."""
    import hashlib

    import numpy as np

    return np.asarray([int(hashlib.sha256(f"{seed}:{g}".encode()).hexdigest()[:8], 16)
                       for g in strategy_group(records)], dtype=np.int64)


def calibration_mask(records: Any, fraction: float, seed: int = 0):
    """Measured rows held back for calibration: whole strategy groups, by a seeded hash of the group."""
    measured = (records["source"] == "measured").to_numpy()
    return measured & (_group_hashes(records, seed) % 1000 < fraction * 1000)


def fold_index(records: Any, folds: int, seed: int = 0):
    """The cross-fitting fold of each measured row (whole strategy groups, by the seeded hash of
    :func:`calibration_mask`), -1 for simulated rows."""
    import numpy as np

    measured = (records["source"] == "measured").to_numpy()
    return np.where(measured, _group_hashes(records, seed) % folds, -1)


class IterationModel:
    """Iteration-time model of one method (scikit-learn style: ``fit`` returns self, state ends in ``_``).

    Args:
        method: one of :data:`METHODS`.
        gnn_params: keyword arguments of :class:`~learnedperf.models.gnn.GNNRegressor` (GNN methods).
        op_regressor: a fitted :class:`~learnedperf.models.gbdt.OpTimeRegressor` (``+ops`` methods); the
            runs given to ``fit``/``predict`` must have been loaded with it (``Runs.sim_ops``).
        calibration_fraction: share of the measured training runs held back for the interval
            (``folds=0``).
        coverage: interval coverage target.
        seed: seed of the calibration hold-out (or the folds) and of the GNN.
        folds: 0 (default): split-conformal hold-out; K >= 2: cross-fitted over K folds (the GNN
            methods' ``ensemble`` is K; a different ``ensemble`` in ``gnn_params`` is refused).
    """

    def __init__(self, method: str, gnn_params: Optional[dict] = None, op_regressor: Any = None,
                 calibration_fraction: float = 0.2, coverage: float = 0.9, seed: int = 0, folds: int = 0):
        if method not in METHODS:
            raise InputError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        if needs_ops(method) and op_regressor is None:
            raise InputError(f"method {method!r} needs a fitted operator regressor")
        if isinstance(folds, bool) or not isinstance(folds, int) or folds < 0 or folds == 1:
            raise InputError(f"folds: expected 0 (a held-out calibration share) or an integer >= 2, got {folds!r}")
        self.method = method
        self.gnn_params = dict(gnn_params or {})
        if method in GNN_METHODS:
            check_gnn_params(self.gnn_params)
            if folds and self.gnn_params.get("ensemble", folds) != folds:
                raise InputError(f"folds={folds} trains one network per fold; GNN parameter ensemble="
                                 f"{self.gnn_params['ensemble']} differs (leave it out)")
        self.folds = folds
        self.op_regressor = op_regressor
        self.calibration_fraction = calibration_fraction
        self.coverage = coverage
        self.seed = seed

    # ------------------------------------------------------------------ inputs
    def _base_ms(self, runs: Runs):
        if needs_ops(self.method):
            if runs.sim_ops is None:
                raise InputError(f"method {self.method!r}: the runs were loaded without an operator regressor")
            return runs.sim_ops[0]
        return runs.sim_ms

    def samples(self, runs: Runs, anchor_simulated: bool = False) -> list:
        """GNN inputs of ``runs``. With ``anchor_simulated``, a simulated row's base is its own target
        (the residual it teaches is zero: the simulator is exact on its own runs)."""
        from .gnn import make_sample

        base = self._base_ms(runs)
        out = []
        for i in range(len(runs)):
            if needs_ops(self.method):
                bd, nodes = runs.sim_ops[1][i], runs.sim_ops[2][i]
            else:
                bd, nodes = runs.breakdown_ms[i], None
            b = float(base[i])
            if anchor_simulated and runs.records["source"].iat[i] == "simulated":
                b = float(runs.records["iteration_time_ms"].iat[i])
            out.append(make_sample(runs.graphs[i], runs.specs[i], b, bd, learned_time_s=nodes))
        return out

    # ------------------------------------------------------------------ fit / predict
    def fit(self, runs: Runs) -> "IterationModel":
        """Fit on ``runs`` (simulated and measured): the point model, then the interval on measured runs
        it did not train on (held back, or out of fold)."""
        import numpy as np

        y = runs.records["iteration_time_ms"].to_numpy(dtype=float)
        measured = runs.measured
        base = base_method(self.method)
        trains_nothing = base in ("simulator", "simulator+ops")
        crossfit = self.folds >= 2 and not trains_nothing
        if crossfit:
            fold = fold_index(runs.records, self.folds, self.seed)
            if len(set(fold[measured].tolist())) < 2:
                raise InputError(f"folds={self.folds}: the measured runs fall in fewer than two folds (they form "
                                 f"{len(set(strategy_group(runs.records[measured])))} strategy group(s)); "
                                 "cross-fitting needs two or more (use folds=0, a held-out share)")
        if trains_nothing or crossfit:
            # every measured run can calibrate the interval: the simulator methods train on nothing, and a
            # cross-fitted run is calibrated on the network (or MFU) of the fold that left it out
            calib = measured.copy()
            train = np.ones(len(runs), dtype=bool)
        else:
            calib = calibration_mask(runs.records, self.calibration_fraction, self.seed)
            train = ~calib
        oof = None  # out-of-fold predictions of the measured rows (cross-fitting)
        if base == "formula":
            ideal = ideal_time_ms(runs.specs)

            def mfu(rows):
                if not rows.any():
                    raise InputError("method 'formula' needs measured training runs to fit its MFU")
                return float(math.exp(np.mean(np.log(ideal[rows] / y[rows]))))  # geometric mean: a fit of log time

            if crossfit:
                mfus = [mfu(measured & (fold != k)) for k in range(self.folds)]
                oof = ideal[measured] / np.asarray(mfus)[fold[measured]]
                self.mfu_ = float(math.exp(np.mean(np.log(mfus))))  # the point model: the mean of the folds' logs
            else:
                self.mfu_ = mfu(measured & train)
        elif self.method in GNN_METHODS:
            from .gnn import GNNRegressor

            params = {"seed": self.seed, **self.gnn_params, "mode": GNN_METHODS[self.method]}
            sub = runs.subset(train)
            samples = self.samples(sub, anchor_simulated=True)
            masks = None
            if crossfit:
                params["ensemble"] = self.folds
                masks = np.stack([fold != k for k in range(self.folds)])  # simulated rows (-1) in every member
            self.gnn_ = GNNRegressor(**params).fit(samples, sub.records["iteration_time_ms"].to_numpy(dtype=float),
                                                   source=sub.records["source"].to_numpy(), member_masks=masks)
            if crossfit:
                rows = np.flatnonzero(measured)
                members = self.gnn_.predict_log_members([samples[i] for i in rows])
                oof = np.exp(members[fold[rows], np.arange(len(rows))])
        self.n_train_ = int(train.sum())
        self.n_train_measured_ = int((train & measured).sum())
        if not calib.any():
            raise InputError("no measured training runs to calibrate the interval on")
        # the domain is that of the measured runs the point model learned from (for the simulator
        # methods: every measured run); a device only among the held-back runs counts as unseen
        trained = train & measured
        domain = TrainingDomain.from_records(runs.records[trained]) if trained.any() else None
        sub = runs.subset(calib)
        pred = oof if oof is not None else self._point(sub)
        # what the interval is calibrated on, for the shape memory and a study of its groups
        # (experiments/interval_groups.py); in memory only: a checkpoint keeps the quantiles and the memory
        self.domain_ = domain
        self.calibration_records_ = sub.records
        self.calibration_specs_ = sub.specs
        self.base_calibration_pred_ms_ = np.asarray(pred, dtype=float)
        if corrects_simulator(self.method):
            self.calibration_simulator_ms_ = np.asarray(self._base_ms(sub), dtype=float)
        return self._fit_interval()

    def _fit_interval(self) -> "IterationModel":
        """The shape memory (``+shapes``) and the interval, from the base model's out-of-sample predictions of the
        calibration runs."""
        import numpy as np

        rec = self.calibration_records_
        y = rec["iteration_time_ms"].to_numpy(dtype=float)
        pred = self.base_calibration_pred_ms_
        hits = None
        if self.method.endswith(SHAPES_SUFFIX):
            from .metrics import mape

            keys = [shape_key(s) for s in self.calibration_specs_]
            groups = strategy_group(rec)
            # each calibration run corrected as a run of a strategy nobody measured would be: by its key's runs of
            # other strategy groups only, so that the interval covers the memory's own error; the corrected runs
            # and the others are calibrated apart (dataset.shape_group): they err differently.
            # A correcting model's memory may instead be over the simulator under it: the correction moves with
            # the free fields (pipeline depth, data parallelism) that a key's runs differ in, and a median of its
            # residuals carries the correction of other strategies to this one; the simulator's miss on a shape
            # moves less with them. Which one holds out better on these runs decides (a tie: the model's own).
            bases = {"model": pred}
            if corrects_simulator(self.method):
                bases["simulator"] = self.calibration_simulator_ms_
            self.shape_choice_ = {}
            best = None
            for over, base_pred in bases.items():
                res = np.log(y / base_pred)
                factor, n = ShapeMemory(over=over).leave_group_out(keys, res, groups)
                hit = np.asarray(n) > 0
                corrected = np.where(hit, base_pred * np.exp(np.asarray(factor)), pred)
                err = mape(corrected[hit], y[hit]) if hit.any() else math.inf
                self.shape_choice_[over] = err
                if best is None or err < best[0]:
                    best = (err, over, res, corrected, hit)
            _err, over, res, pred, hits = best
            self.shapes_ = ShapeMemory(over=over).fit(keys, res)
        self.interval_ = ConformalInterval(self.coverage)
        self.interval_.fit(pred, y, interval_group(rec, hits), domain=self.domain_)
        self.calibration_pred_ms_ = np.asarray(pred, dtype=float)
        return self

    def with_shapes(self) -> "IterationModel":
        """This fitted model's ``+shapes`` variant: the same point model (shared, not refitted) with a shape memory
        and an interval of its own, from the same out-of-sample predictions (what ``fit`` of the ``+shapes`` method
        would make, without training the point model again)."""
        import copy

        self._check("interval_")
        if self.method.endswith(SHAPES_SUFFIX):
            raise InputError(f"IterationModel({self.method!r}) has its shape memory already")
        new = copy.copy(self)
        new.method = self.method + SHAPES_SUFFIX
        return new._fit_interval()

    def predict_point(self, runs: Runs):
        """Point predictions (ms) of ``runs`` (with the shape memory's factor, for a ``+shapes`` method)."""
        return self._predict_point(runs)[0]

    def _predict_point(self, runs: Runs):
        """``(point ms, shape runs)``: shape runs is None but for a ``+shapes`` method, where it counts the measured
        runs of each run's key (0: not corrected)."""
        import numpy as np

        p = self._point(runs)
        if not self.method.endswith(SHAPES_SUFFIX):
            return p, None
        self._check("shapes_")
        factors, counts = self.shapes_.lookup(runs.specs)
        factors, counts = np.asarray(factors, dtype=float), np.asarray(counts, dtype=int)
        if self.shapes_.over == "simulator":
            return np.where(counts > 0, np.asarray(self._base_ms(runs), dtype=float) * np.exp(factors), p), counts
        return p * np.exp(factors), counts

    def _point(self, runs: Runs):
        """The base model's point predictions (ms) of ``runs``."""
        import numpy as np

        if base_method(self.method) == "formula":
            self._check("mfu_")
            return ideal_time_ms(runs.specs) / self.mfu_
        if self.method in GNN_METHODS:
            self._check("gnn_")
            return np.asarray(self.gnn_.predict(self.samples(runs)), dtype=float)
        return np.asarray(self._base_ms(runs), dtype=float)

    def predict(self, runs: Runs, shape_runs: bool = False):
        """``(point_ms, lower_ms, upper_ms)`` numpy arrays for ``runs`` (the interval of a novel run is
        widened where :meth:`~learnedperf.models.intervals.ConformalInterval.fit_novelty` was called); with
        ``shape_runs``, a fourth item: the measured runs of each run's shape key (None but for a ``+shapes``
        method)."""
        self._check("interval_")
        p, counts = self._predict_point(runs)
        # the same device groups as interval_group(runs.records), read from the specs as a Predictor does
        lo, hi = self.interval_.interval_for_specs(p, runs.specs, shape_hits=None if counts is None else counts > 0)
        return (p, lo, hi, counts) if shape_runs else (p, lo, hi)

    def _check(self, attr: str) -> None:
        if not hasattr(self, attr):
            raise InputError(f"IterationModel({self.method!r}) is not fitted")


__all__ = ["BASE_METHODS", "GNN_METHODS", "IterationModel", "METHODS", "base_method", "calibration_mask",
           "check_gnn_params", "corrects_simulator", "fold_index", "ideal_time_ms", "needs_ops", "parse_gnn_params"]
