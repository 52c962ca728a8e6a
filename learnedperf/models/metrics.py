"""Measures of quality of DESIGN.md: error, order and calibration of iteration-time predictions.

* :func:`mape` — mean absolute percentage error.
* :func:`kendall_tau` — Kendall τ-b between predicted and measured times over the
  strategies of each group (one (model, cluster)), averaged over groups with at least
  two distinct measured times; a group whose predictions are all tied (a formula
  that cannot tell strategies apart) scores τ = 0 — it orders nothing.
* :func:`top1_regret` — measured time of the predicted best strategy / measured best − 1,
  averaged over groups.
* :func:`coverage` — share of measured times inside their interval.

All functions take plain arrays (numpy or pandas) and return floats; they never drop
a row silently: NaN or non-positive inputs raise :class:`~learnedperf.errors.InputError`.
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import InputError


def _positive(name: str, values: Any):
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise InputError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        raise InputError(f"{name}: {int(bad.sum())} value(s) are NaN, infinite or not positive "
                         f"(first at position {int(np.flatnonzero(bad)[0])})")
    return arr


def _pair(pred: Any, true: Any):
    p, t = _positive("predicted", pred), _positive("measured", true)
    if len(p) != len(t):
        raise InputError(f"predicted ({len(p)}) and measured ({len(t)}) differ in length")
    if len(p) == 0:
        raise InputError("no rows to score")
    return p, t


def ape(pred: Any, true: Any):
    """Absolute percentage error of every row (percent)."""
    p, t = _pair(pred, true)
    return abs(p - t) / t * 100.0


def mape(pred: Any, true: Any) -> float:
    """Mean absolute percentage error (percent)."""
    return float(ape(pred, true).mean())


def _groups(group: Any, n: int):
    import numpy as np

    if group is None:
        return np.zeros(n, dtype=int)
    g = np.asarray(group)
    if len(g) != n:
        raise InputError(f"group ({len(g)}) and predictions ({n}) differ in length")
    return g


def kendall_tau(pred: Any, true: Any, group: Any = None, min_size: int = 2) -> dict:
    """Kendall τ-b of predicted vs measured times within each group, averaged over groups.

    Args:
        pred, true: times of every row (any unit, same for both).
        group: label of each row's (model, cluster); ``None`` = one group.
        min_size: smallest group scored.

    Returns:
        ``{"tau": mean τ over scored groups (NaN if none), "groups": number scored,
        "pairs": ordered pairs compared}``.
    """
    import numpy as np
    from scipy.stats import kendalltau

    p, t = _pair(pred, true)
    g = _groups(group, len(p))
    taus, pairs = [], 0
    for label in np.unique(g):
        idx = np.flatnonzero(g == label)
        if len(idx) < min_size or np.unique(t[idx]).size < 2:
            continue
        if np.unique(p[idx]).size < 2:
            tau = 0.0  # every strategy predicted equal: no order information at all
        else:
            tau = float(kendalltau(p[idx], t[idx]).statistic)
        taus.append(tau)
        pairs += len(idx) * (len(idx) - 1) // 2
    return {"tau": float(np.mean(taus)) if taus else float("nan"), "groups": len(taus), "pairs": pairs}


def top1_regret(pred: Any, true: Any, group: Any = None, min_size: int = 2) -> dict:
    """Top-1 regret per group: measured time of the predicted best / measured best − 1.

    Ties in the prediction are broken against the predictor (the worst measured time
    among the predicted-best rows), so a formula that predicts every strategy equal
    does not score by luck.

    Returns:
        ``{"mean": mean regret (fraction), "median", "max", "groups": groups scored,
        "zero": share of groups where the predicted best is the measured best}``.
    """
    import numpy as np

    p, t = _pair(pred, true)
    g = _groups(group, len(p))
    regrets = []
    for label in np.unique(g):
        idx = np.flatnonzero(g == label)
        if len(idx) < min_size:
            continue
        pi, ti = p[idx], t[idx]
        chosen = ti[pi <= pi.min() * (1 + 1e-12)].max()
        regrets.append(chosen / ti.min() - 1.0)
    if not regrets:
        return {"mean": float("nan"), "median": float("nan"), "max": float("nan"), "groups": 0, "zero": float("nan")}
    r = np.asarray(regrets)
    return {"mean": float(r.mean()), "median": float(np.median(r)), "max": float(r.max()), "groups": len(r),
            "zero": float((r <= 1e-12).mean())}


def coverage(lower: Any, upper: Any, true: Any) -> float:
    """Share of ``true`` inside ``[lower, upper]`` (both inclusive)."""
    import numpy as np

    lo, hi, t = (np.asarray(a, dtype=float) for a in (lower, upper, true))
    if not (len(lo) == len(hi) == len(t)) or len(t) == 0:
        raise InputError(f"coverage: lower ({len(lo)}), upper ({len(hi)}) and measured ({len(t)}) must have the "
                         "same, non-zero length")
    if (~np.isfinite(lo) | ~np.isfinite(hi)).any() or (lo > hi).any():
        raise InputError("coverage: intervals must be finite with lower <= upper")
    return float(((t >= lo) & (t <= hi)).mean())


def score(pred: Any, true: Any, group: Any = None, lower: Optional[Any] = None, upper: Optional[Any] = None) -> dict:
    """Every measure at once: ``{"n", "mape", "median_ape", "p90_ape", "kendall_tau", "tau_groups",
    "top1_regret", "regret_groups", "coverage"}`` (coverage NaN without intervals)."""
    import numpy as np

    errors = ape(pred, true)
    tau = kendall_tau(pred, true, group)
    reg = top1_regret(pred, true, group)
    cov = coverage(lower, upper, true) if lower is not None and upper is not None else float("nan")
    return {"n": int(len(errors)), "mape": float(errors.mean()), "median_ape": float(np.median(errors)),
            "p90_ape": float(np.percentile(errors, 90)), "kendall_tau": tau["tau"], "tau_groups": tau["groups"],
            "top1_regret": reg["mean"], "regret_groups": reg["groups"], "coverage": cov}


__all__ = ["ape", "coverage", "kendall_tau", "mape", "score", "top1_regret"]
