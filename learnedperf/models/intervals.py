"""Calibrated prediction intervals: split-conformal on the log ratio measured / predicted.

Relative error is what matters for iteration time (a 10 % miss is as bad at 50 ms as at
50 s), so :class:`ConformalInterval` calibrates on ``r = log(measured / predicted)``
over runs that the point model did **not** train on (a held-out calibration set, or
out-of-fold predictions). The interval of a new prediction ``p`` is
``[p·exp(q_lo), p·exp(q_hi)]`` with ``q_lo``, ``q_hi`` the conformal quantiles of ``r``
at ``(1 − coverage)/2`` and ``(1 + coverage)/2``, each with the finite-sample
correction of split conformal prediction (rank ``ceil((n+1)·level)``), so that under
exchangeability each tail holds at most ``(1 − coverage)/2`` of new runs.

Calibration may be *Mondrian*: one pair of quantiles per group (e.g. device class,
since CPU steps and GPU steps err differently), with the pooled quantiles for a group
never seen or seen fewer than ``min_group_size`` times. A run's group may be a *hierarchy*, a
tuple of labels from the most specific on (its device type on one device or several, then its device
class): it gets the pair of the first label calibrated on ``min_group_size`` runs or more, so a device
measured often enough is calibrated on its own runs (a GPU whose short, host-bound steps err more than
the A100 steps that dominate its class gets its own, wider pair), and a device measured a few times, or
never with as many devices, borrows its class's. The interval always contains
the point prediction (``q_lo <= 0 <= q_hi``): widening only adds coverage.

Out of its training domain a model errs more than on the held-out runs of its own domain:
a run on a device, of a model family, at a scale or combining parallel techniques that no
measured training run had gets an interval calibrated on in-domain errors — too narrow. So the interval also knows the
:class:`TrainingDomain` (what the measured training runs covered) and holds one pair of
*novelty* quantiles per out-of-domain class (:data:`NOVELTY_CLASSES`), calibrated on
leave-domain-out residuals: the test-side predictions of the ``unseen_*`` splits of an
evaluation report, where a model that never saw that device, family or scale predicted it
(:func:`learnedperf.models.evaluate.novelty_residuals`). A novel run's interval is the
widest of its device-class pair and the pairs of every novelty class that applies to it, so
novelty only ever widens.

State is plain numbers: :meth:`ConformalInterval.to_dict` / :meth:`from_dict` are JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import InputError

POOLED = "*"
"""Group key of the quantiles pooled over every calibration run."""

IN_DOMAIN = "in_domain"
"""Novelty class of a run like the measured training runs (same device, family, no more devices, a
combination of parallel techniques they had)."""

NOVELTY_CLASSES = ("unseen_device", "unseen_family", "unseen_scale", "unseen_strategy")
"""Out-of-domain classes, in the precedence of :meth:`TrainingDomain.novelty`: an unseen device, family or
scale first (the widest errors in the leave-out evaluation), an unseen combination of parallel techniques
last. Each is the name (or the prefix before ``:``) of the evaluation splits that reproduce it; the
``unseen_sharding`` split reproduces ``unseen_strategy`` too (:data:`SPLIT_CLASS`)."""

SPLIT_CLASS = {"unseen_sharding": "unseen_strategy"}
"""Evaluation splits named otherwise than the novelty class they reproduce: fully sharded states held out
are a combination of techniques the training runs lacked."""


def conformal_quantile(residuals: Any, level: float) -> float:
    """The split-conformal ``level`` quantile of ``residuals``: the ``ceil((n+1)·level)``-th smallest
    (upper tail) or the ``floor((n+1)·level)``-th smallest (lower tail, ``level < 0.5``).

    With too few residuals for the rank to exist the extreme residual is returned; the
    caller records ``n`` so that such thin calibration is visible.
    """
    import numpy as np

    r = np.sort(np.asarray(residuals, dtype=float))
    n = len(r)
    if n == 0:
        raise InputError("conformal quantile of an empty calibration set")
    # a rank that is a whole number in exact arithmetic must stay one: (1 - 0.9) / 2 is 0.04999... in
    # floating point, and floor(100 * 0.04999...) would take the 4th residual instead of the 5th
    eps = 1e-9
    if level >= 0.5:
        k = math.ceil((n + 1) * level - eps)
        return float(r[min(k, n) - 1])
    k = math.floor((n + 1) * level + eps)
    return float(r[max(k, 1) - 1])


def pooled_conformal_quantile(groups: Any, level: float) -> float:
    """The ``level`` quantile of residuals in several groups weighted **equally**, not by size.

    A new device (or family) is exchangeable with the devices held out in the evaluation, not
    with their runs: 1,440 runs of one held-out device are one draw of "how wrong on an unseen
    device", as are 122 runs of another. So the groups' empirical CDFs are averaged (the pooled CDF
    of Dunn, Wasserman and Ramdas, "Distribution-free prediction sets for two-layer hierarchical
    models", JASA 2022): ``F(x) = (1/K)·Σ_k #{r_ki <= x} / n_k``. The upper quantile is the smallest
    residual with ``F >= level``; the lower one is the same rule on the negated residuals. One group
    gives exactly :func:`conformal_quantile` (split conformal over exchangeable runs).

    Each group's CDF is its plain empirical one, without split conformal's ``n_k + 1``: that
    correction is for one more *run* of a group, and here the new draw is a group. With it, groups
    of 3 to 11 runs (the held-out P4, T4, P100 and V100 of NeuSight) left over 8 % of the mass
    unreachable, the 95 % level could not be met and the bound fell back to the largest residual
    of any group: novelty intervals 5.5 times wide that covered 99 % of the held-out devices' runs
    against a 90 % target. Weighted plainly, leaving each device split out in turn, they cover 88 %
    at a width of 1.66 (``python experiments/interval_coverage.py --report REPORT.json``).
    """
    import numpy as np

    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        raise InputError("conformal quantile of an empty calibration set")
    if len(arrays) == 1:
        return conformal_quantile(arrays[0], level)
    if level < 0.5:
        return -pooled_conformal_quantile([-a for a in arrays], 1.0 - level)
    values = np.concatenate(arrays)
    weights = np.concatenate([np.full(len(a), 1.0 / (len(arrays) * len(a))) for a in arrays])
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum(weights[order])
    hit = np.nonzero(cdf >= level - 1e-9)[0]  # the same rounding guard as conformal_quantile
    # the weights sum to 1, so some residual reaches any level <= 1 (rounding aside: then the largest)
    return float(values[order[hit[0]]] if len(hit) else values[order[-1]])


def novelty_of_split(split: str) -> Optional[str]:
    """The novelty class an evaluation split reproduces (``"unseen_device:Xeon"`` → ``"unseen_device"``,
    ``"unseen_sharding"`` → ``"unseen_strategy"``), or None for a split of in-domain runs (a random share)."""
    base = str(split).split(":", 1)[0]
    base = SPLIT_CLASS.get(base, base)
    return base if base in NOVELTY_CLASSES else None


def conformal_log_bounds(residuals: Any, coverage: float) -> dict:
    """``{"log_lower", "log_upper", "n"}``: the conformal ``(1 − coverage)/2`` and ``(1 + coverage)/2``
    quantiles (:func:`conformal_quantile`) of the log ratios ``residuals``, widened to hold 0 so that
    the interval holds the point prediction itself. ``residuals`` may be a mapping of groups (e.g.
    held-out devices) to log ratios: the groups then weigh equally
    (:func:`pooled_conformal_quantile`) and ``"groups"`` says how many there were."""
    lo_level, hi_level = (1 - coverage) / 2, (1 + coverage) / 2
    if isinstance(residuals, dict):
        groups = [g for g in residuals.values() if len(g)]
        return {"log_lower": min(pooled_conformal_quantile(groups, lo_level), 0.0),
                "log_upper": max(pooled_conformal_quantile(groups, hi_level), 0.0),
                "n": int(sum(len(g) for g in groups)), "groups": len(groups)}
    return {"log_lower": min(conformal_quantile(residuals, lo_level), 0.0),
            "log_upper": max(conformal_quantile(residuals, hi_level), 0.0), "n": int(len(residuals))}


def _labels(group: Any) -> tuple[str, ...]:
    """The labels of one run's group, most specific first: a tuple of them, one label, or none (None)."""
    if group is None:
        return ()
    if isinstance(group, (tuple, list)):
        return tuple(str(g) for g in group)
    return (str(group),)


def _checked_pair(what: str, q: Any) -> dict:
    """A quantile pair read from JSON; a malformed one raises :class:`InputError` naming ``what``
    (a value that is no number raises TypeError / ValueError for the caller to report)."""
    try:
        lo, hi, n = float(q["log_lower"]), float(q["log_upper"]), int(q["n"])
    except KeyError as exc:
        raise InputError(f"interval calibration: {what} lacks key {exc}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= 0.0 <= hi and n >= 1):
        raise InputError(f"interval calibration: {what} has invalid bounds {q}")
    return {"log_lower": lo, "log_upper": hi, "n": n}


@dataclass(frozen=True)
class TrainingDomain:
    """What the measured training runs of a model covered: the yardstick of :meth:`novelty`.

    The four notions are those of the held-out evaluation splits (:mod:`learnedperf.models.evaluate`),
    read from the same record columns (:data:`learnedperf.data.records.DOMAIN_COLUMNS`): a device is its
    ``device_type`` (a synthetic device counts as its catalog base), a family is the model's ``arch``,
    and scale is ``num_devices``; a strategy is the combination of parallel techniques of
    :func:`~learnedperf.data.records.strategy_signature`. Only *measured* runs count: the interval
    calibrates measured errors, and simulated runs on a device say nothing about how the model errs on
    the real one.

    Attributes:
        devices: device types of the measured training runs (sorted).
        families: model families (``arch``) of the measured training runs (sorted).
        max_num_devices: the most devices of a measured training run.
        n_runs: how many measured training runs the domain describes.
        strategies: strategy signatures of the measured training runs (sorted), or None where they were
            not recorded (a domain of records without strategy columns, or of a checkpoint from before):
            then no run is novel by its strategy.
    """

    devices: tuple[str, ...]
    families: tuple[str, ...]
    max_num_devices: int
    n_runs: int
    strategies: Optional[tuple[str, ...]] = None

    @property
    def device_classes(self) -> tuple[str, ...]:
        """Device classes (:func:`~learnedperf.models.dataset.device_class`) of :attr:`devices`."""
        from .dataset import device_class

        return tuple(sorted({device_class(d) for d in self.devices}))

    @classmethod
    def from_records(cls, records: Any) -> "TrainingDomain":
        """The domain of ``records``: a DataFrame of the measured training runs (record columns)."""
        from ..data.records import DOMAIN_COLUMNS, STRATEGY_SIGNATURE_COLUMNS, strategy_signature

        missing = [c for c in DOMAIN_COLUMNS if c not in records.columns]
        if missing:
            raise InputError(f"training domain: the records lack column(s) {missing}")
        if len(records) == 0:
            raise InputError("training domain: no measured training run")
        strategies = None
        if all(c in records.columns for c in STRATEGY_SIGNATURE_COLUMNS):
            strategies = tuple(sorted({strategy_signature(*(row[c] for c in STRATEGY_SIGNATURE_COLUMNS))
                                       for _, row in records[list(STRATEGY_SIGNATURE_COLUMNS)].iterrows()}))
        return cls(tuple(sorted({str(d) for d in records["device_type"]})),
                   tuple(sorted({str(a) for a in records["arch"]})), int(records["num_devices"].max()), len(records),
                   strategies)

    def novelty(self, spec: Any) -> str:
        """:data:`IN_DOMAIN` or the first :data:`NOVELTY_CLASSES` entry that applies to a
        :class:`~learnedperf.specs.RunSpec` (:meth:`novelty_classes`): device, then family, then scale, then
        strategy — the order of their errors in the leave-out evaluation (an unseen device errs most)."""
        classes = self.novelty_classes(spec)
        return classes[0] if classes else IN_DOMAIN

    def novelty_classes(self, spec: Any) -> tuple[str, ...]:
        """Every :data:`NOVELTY_CLASSES` entry that applies to a :class:`~learnedperf.specs.RunSpec`, in that
        order (empty in the domain): a run on an unseen device at an unseen scale is both."""
        from ..data.records import domain_columns, spec_strategy_signature

        cols = domain_columns(spec)
        found = []
        if cols["device_type"] not in self.devices:
            found.append("unseen_device")
        if cols["arch"] not in self.families:
            found.append("unseen_family")
        if cols["num_devices"] > self.max_num_devices:
            found.append("unseen_scale")
        if self.strategies is not None and spec_strategy_signature(spec) not in self.strategies:
            found.append("unseen_strategy")
        return tuple(found)

    def to_dict(self) -> dict:
        """JSON-compatible description (``device_classes`` is informative: :meth:`from_dict` derives it)."""
        out = {"devices": list(self.devices), "device_classes": list(self.device_classes),
               "families": list(self.families), "max_num_devices": self.max_num_devices, "n_runs": self.n_runs}
        if self.strategies is not None:
            out["strategies"] = list(self.strategies)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "TrainingDomain":
        """Inverse of :meth:`to_dict`; a malformed dict raises :class:`InputError` naming the key."""
        if not isinstance(data, dict):
            raise InputError("training domain must be a JSON object")

        def names(v: Any) -> bool:
            return isinstance(v, list) and all(isinstance(x, str) for x in v)

        def count(v: Any) -> bool:
            # bool is an int in Python; a JSON true is no count
            return isinstance(v, int) and not isinstance(v, bool) and v >= 1

        rules = {"devices": (names, "a list of strings"), "families": (names, "a list of strings"),
                 "max_num_devices": (count, "a whole number >= 1"), "n_runs": (count, "a whole number >= 1")}
        for key, (ok, what) in rules.items():
            if key not in data:
                raise InputError(f"training domain lacks key {key!r}")
            if not ok(data[key]):
                raise InputError(f"training domain: {key!r} must be {what}, got {data[key]!r}")
        # optional: a checkpoint from before strategies were recorded has none (no run is novel by strategy)
        strategies = data.get("strategies")
        if strategies is not None and not names(strategies):
            raise InputError(f"training domain: 'strategies' must be a list of strings, got {strategies!r}")
        return cls(tuple(sorted(set(data["devices"]))), tuple(sorted(set(data["families"]))),
                   data["max_num_devices"], data["n_runs"],
                   None if strategies is None else tuple(sorted(set(strategies))))


class ConformalInterval:
    """Split-conformal interval on ``log(measured / predicted)`` (scikit-learn style: ``fit`` returns self).

    Learned state: ``quantiles_`` (in-domain pairs per device-class group, :meth:`fit`), ``domain_``
    (the :class:`TrainingDomain`, or None), ``novelty_`` (pairs per out-of-domain class,
    :meth:`fit_novelty`; empty until then) and ``n_calibration_``.

    Args:
        coverage: target share of measured times inside the interval (0.9 = 90 %).
        min_group_size: calibration runs a group needs for its own quantiles; smaller or
            unseen groups use the pooled ones.
    """

    def __init__(self, coverage: float = 0.9, min_group_size: int = 30):
        if not 0.0 < coverage < 1.0:
            raise InputError(f"coverage must be in (0, 1), got {coverage}")
        if min_group_size < 1:
            raise InputError(f"min_group_size must be >= 1, got {min_group_size}")
        self.coverage = coverage
        self.min_group_size = min_group_size

    def get_params(self, deep: bool = True) -> dict:
        """Constructor arguments (scikit-learn convention)."""
        return {"coverage": self.coverage, "min_group_size": self.min_group_size}

    def fit(self, pred_ms: Any, true_ms: Any, group: Optional[Any] = None,
            domain: Optional[TrainingDomain] = None) -> "ConformalInterval":
        """Calibrate on held-out predictions ``pred_ms`` of measured times ``true_ms``.

        Args:
            pred_ms, true_ms: positive times of the same runs.
            group: optional label per run (Mondrian calibration), or a tuple of labels from the most
                specific on (a hierarchy: every level of it with ``min_group_size`` runs gets its pair).
            domain: the point model's :class:`TrainingDomain`; with it :meth:`interval_for_specs`
                tells novel runs from in-domain ones. Refitting forgets earlier novelty quantiles.
        """
        import numpy as np

        from .metrics import _pair

        p, t = _pair(pred_ms, true_ms)
        r = np.log(t / p)
        levels = [()] * len(r) if group is None else [_labels(x) for x in group]
        if len(levels) != len(r):
            raise InputError(f"group ({len(levels)}) and predictions ({len(r)}) differ in length")
        self.quantiles_: dict[str, dict] = {POOLED: conformal_log_bounds(r, self.coverage)}
        members: dict[str, list[int]] = {}
        for i, labels in enumerate(levels):
            for label in labels:
                members.setdefault(label, []).append(i)
        for label in sorted(set(members) - {POOLED}):
            if len(members[label]) >= self.min_group_size:
                self.quantiles_[label] = conformal_log_bounds(r[members[label]], self.coverage)
        self.n_calibration_ = int(len(r))
        self.domain_ = domain
        self.novelty_: dict[str, dict] = {}
        return self

    def fit_novelty(self, log_ratios: dict, calibrated_on: Optional[dict] = None) -> "ConformalInterval":
        """Calibrate the out-of-domain classes on leave-domain-out residuals.

        Args:
            log_ratios: novelty class (:data:`NOVELTY_CLASSES`) → ``log(measured / predicted)`` of runs
                predicted by models that never saw that kind of run (see
                :func:`learnedperf.models.evaluate.novelty_residuals`): an array, or a mapping of
                held-out groups (evaluation splits) to arrays, which then weigh equally
                (:func:`pooled_conformal_quantile`). Classes left out keep the in-domain quantiles.
            calibrated_on: novelty class → JSON-compatible provenance (splits, counts) kept in
                :meth:`to_dict`.
        """
        import numpy as np

        self._check_fitted()
        novelty = {}
        for cls, r in log_ratios.items():
            if cls not in NOVELTY_CLASSES:
                raise InputError(f"unknown novelty class {cls!r}; known: {', '.join(NOVELTY_CLASSES)}")
            if isinstance(r, dict):
                r = {str(k): np.asarray(v, dtype=float) for k, v in r.items()}
                finite = all(np.isfinite(v).all() for v in r.values())
            else:
                r = np.asarray(r, dtype=float)
                finite = bool(np.isfinite(r).all())
            if not finite:
                raise InputError(f"novelty class {cls!r}: log ratios must be finite")
            novelty[cls] = {**conformal_log_bounds(r, self.coverage),
                            "calibrated_on": (calibrated_on or {}).get(cls, {})}
        self.novelty_ = novelty
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "quantiles_"):
            raise InputError("ConformalInterval is not fitted: call fit() or from_dict() first")

    def bounds(self, group: Any = None, novelty: Any = IN_DOMAIN) -> tuple[float, float]:
        """``(log_lower, log_upper)`` of ``group`` (a label, or a tuple of labels from the most specific on:
        the first that has a pair; the pooled pair if none has); for an
        out-of-domain ``novelty`` class — or several, a tuple of classes — widened to each class's pair
        where it has one (never narrowed): a run new in two respects gets the wider side of both."""
        self._check_fitted()
        q = next((self.quantiles_[g] for g in _labels(group) if g in self.quantiles_), self.quantiles_[POOLED])
        lo, hi = q["log_lower"], q["log_upper"]
        for cls in (novelty,) if isinstance(novelty, str) else tuple(novelty):
            if cls != IN_DOMAIN and cls not in NOVELTY_CLASSES:
                raise InputError(f"unknown novelty class {cls!r}; known: {IN_DOMAIN}, {', '.join(NOVELTY_CLASSES)}")
            nov = self.novelty_.get(cls)
            if nov is not None:
                lo, hi = min(lo, nov["log_lower"]), max(hi, nov["log_upper"])
        return lo, hi

    def interval(self, pred_ms: Any, group: Optional[Any] = None, novelty: Optional[Any] = None):
        """``(lower_ms, upper_ms)`` arrays for predictions ``pred_ms`` (optionally with a group and a
        novelty class, or a tuple of classes, per prediction; see :meth:`bounds`)."""
        import numpy as np

        p = np.asarray(pred_ms, dtype=float)
        if group is None and novelty is None:  # one pair for all (a scalar prediction too)
            lo, hi = self.bounds(None)
            return p * math.exp(lo), p * math.exp(hi)
        # lists, not arrays: equal-length tuples of labels or classes would become a 2-D array
        g = [None] * len(p) if group is None else list(group)
        v = [IN_DOMAIN] * len(p) if novelty is None else list(novelty)
        for name, arr in (("group", g), ("novelty", v)):
            if len(arr) != len(p):
                raise InputError(f"{name} ({len(arr)}) and predictions ({len(p)}) differ in length")
        b = np.asarray([self.bounds(x, n) for x, n in zip(g, v)], dtype=float).reshape(-1, 2)
        return p * np.exp(b[:, 0]), p * np.exp(b[:, 1])

    def novelties(self, specs: Any) -> list:
        """Novelty class of each :class:`~learnedperf.specs.RunSpec`, the first that applies
        (all :data:`IN_DOMAIN` without a domain)."""
        self._check_fitted()
        if self.domain_ is None:
            return [IN_DOMAIN] * len(specs)
        return [self.domain_.novelty(s) for s in specs]

    def novelty_classes(self, specs: Any) -> list:
        """Every novelty class that applies to each :class:`~learnedperf.specs.RunSpec` (a tuple per run,
        empty in the domain or without one): what widens its interval."""
        self._check_fitted()
        if self.domain_ is None:
            return [()] * len(specs)
        return [self.domain_.novelty_classes(s) for s in specs]

    def interval_for_specs(self, pred_ms: Any, specs: Any, classes: Optional[list] = None,
                           shape_hits: Optional[Any] = None):
        """``(lower_ms, upper_ms)`` arrays for predictions ``pred_ms`` of the runs ``specs`` (RunSpecs):
        the device group (its type and device count, then its class) and, with a fitted domain, the novelty
        classes of each run come from the run (``classes``: :meth:`novelty_classes` of ``specs``, if the caller has
        them). ``shape_hits`` (a ``+shapes`` method's): whether a shape memory corrected each run, which then takes
        the corrected runs' groups (:func:`~learnedperf.models.dataset.shape_group`)."""
        from ..data.records import domain_columns
        from .dataset import device_group, shape_group

        specs = list(specs)
        # the device type, as the records' interval_group reads it (a synthetic device: its base)
        groups = [device_group(d["device_type"], d["num_devices"]) for d in map(domain_columns, specs)]
        if shape_hits is not None:
            groups = [shape_group(g, bool(h)) for g, h in zip(groups, shape_hits)]
        # every class that applies widens: a run new in device and strategy gets the wider side of each
        return self.interval(pred_ms, groups, self.novelty_classes(specs) if classes is None else classes)

    def to_dict(self) -> dict:
        """JSON-compatible state (for a checkpoint manifest)."""
        self._check_fitted()
        return {"method": "split-conformal on log(measured/predicted)", **self.get_params(),
                "n_calibration": self.n_calibration_, "quantiles": self.quantiles_,
                "domain": None if self.domain_ is None else self.domain_.to_dict(), "novelty": self.novelty_}

    @classmethod
    def from_dict(cls, data: Any) -> "ConformalInterval":
        """Inverse of :meth:`to_dict`; a malformed dict raises :class:`InputError` naming the key.

        Dicts written before the training domain existed (no ``domain``, no ``novelty``) load as an
        interval without novelty classes.
        """
        if not isinstance(data, dict):
            raise InputError("interval calibration must be a JSON object")
        try:
            obj = cls(float(data["coverage"]), int(data["min_group_size"]))
            quantiles = data["quantiles"]
            if not isinstance(quantiles, dict) or POOLED not in quantiles:
                raise InputError(f"interval calibration: 'quantiles' lacks the pooled entry {POOLED!r}")
            obj.quantiles_ = {str(label): _checked_pair(f"group {label!r}", q) for label, q in quantiles.items()}
            obj.n_calibration_ = int(data["n_calibration"])
            obj.domain_ = None
            if data.get("domain") is not None:
                try:
                    obj.domain_ = TrainingDomain.from_dict(data["domain"])
                except InputError as exc:
                    raise InputError(f"interval calibration: {exc}") from None
            novelty = data.get("novelty") or {}
            if not isinstance(novelty, dict):
                raise InputError("interval calibration: 'novelty' must be a JSON object")
            obj.novelty_ = {}
            for label, q in novelty.items():
                if label not in NOVELTY_CLASSES:
                    raise InputError(f"interval calibration: 'novelty' has an unknown class {label!r}")
                obj.novelty_[label] = {**_checked_pair(f"novelty class {label!r}", q),
                                       "calibrated_on": q.get("calibrated_on", {})}
        except InputError:
            raise  # already names the key (an InputError is a ValueError: keep it from the clause below)
        except KeyError as exc:
            raise InputError(f"interval calibration lacks key {exc}") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"interval calibration: bad value ({exc})") from None
        return obj


__all__ = ["ConformalInterval", "IN_DOMAIN", "NOVELTY_CLASSES", "POOLED", "SPLIT_CLASS", "TrainingDomain",
           "conformal_log_bounds", "conformal_quantile", "novelty_of_split", "pooled_conformal_quantile"]
