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
never seen or seen fewer than ``min_group_size`` times. The interval always contains
the point prediction (``q_lo <= 0 <= q_hi``): widening only adds coverage.

State is plain numbers: :meth:`ConformalInterval.to_dict` / :meth:`from_dict` are JSON.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import InputError

POOLED = "*"
"""Group key of the quantiles pooled over every calibration run."""


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
    if level >= 0.5:
        k = math.ceil((n + 1) * level)
        return float(r[min(k, n) - 1])
    k = math.floor((n + 1) * level)
    return float(r[max(k, 1) - 1])


class ConformalInterval:
    """Split-conformal interval on ``log(measured / predicted)`` (scikit-learn style: ``fit`` returns self).

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

    def fit(self, pred_ms: Any, true_ms: Any, group: Optional[Any] = None) -> "ConformalInterval":
        """Calibrate on held-out predictions ``pred_ms`` of measured times ``true_ms``.

        Args:
            pred_ms, true_ms: positive times of the same runs.
            group: optional label per run (Mondrian calibration).
        """
        import numpy as np

        from .metrics import _pair

        p, t = _pair(pred_ms, true_ms)
        r = np.log(t / p)
        g = np.full(len(r), POOLED, dtype=object) if group is None else np.asarray(group, dtype=object)
        if len(g) != len(r):
            raise InputError(f"group ({len(g)}) and predictions ({len(r)}) differ in length")
        lo_level, hi_level = (1 - self.coverage) / 2, (1 + self.coverage) / 2
        self.quantiles_: dict[str, dict] = {}
        labels = [POOLED] + sorted({str(x) for x in g} - {POOLED})
        for label in labels:
            sel = r if label == POOLED else r[np.asarray([str(x) == label for x in g])]
            if label != POOLED and len(sel) < self.min_group_size:
                continue
            self.quantiles_[label] = {"log_lower": min(conformal_quantile(sel, lo_level), 0.0),
                                      "log_upper": max(conformal_quantile(sel, hi_level), 0.0), "n": int(len(sel))}
        self.n_calibration_ = int(len(r))
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "quantiles_"):
            raise InputError("ConformalInterval is not fitted: call fit() or from_dict() first")

    def bounds(self, group: Optional[str] = None) -> tuple[float, float]:
        """``(log_lower, log_upper)`` of ``group`` (the pooled pair if the group has none)."""
        self._check_fitted()
        q = self.quantiles_.get(str(group)) if group is not None else None
        q = q or self.quantiles_[POOLED]
        return q["log_lower"], q["log_upper"]

    def interval(self, pred_ms: Any, group: Optional[Any] = None):
        """``(lower_ms, upper_ms)`` arrays for predictions ``pred_ms`` (optionally with groups)."""
        import numpy as np

        p = np.asarray(pred_ms, dtype=float)
        if group is None:
            lo, hi = self.bounds(None)
            return p * math.exp(lo), p * math.exp(hi)
        g = np.asarray(group, dtype=object)
        if len(g) != len(p):
            raise InputError(f"group ({len(g)}) and predictions ({len(p)}) differ in length")
        b = np.asarray([self.bounds(x) for x in g], dtype=float).reshape(-1, 2)
        return p * np.exp(b[:, 0]), p * np.exp(b[:, 1])

    def to_dict(self) -> dict:
        """JSON-compatible state (for a checkpoint manifest)."""
        self._check_fitted()
        return {"method": "split-conformal on log(measured/predicted)", **self.get_params(),
                "n_calibration": self.n_calibration_, "quantiles": self.quantiles_}

    @classmethod
    def from_dict(cls, data: Any) -> "ConformalInterval":
        """Inverse of :meth:`to_dict`; a malformed dict raises :class:`InputError` naming the key."""
        if not isinstance(data, dict):
            raise InputError("interval calibration must be a JSON object")
        try:
            obj = cls(float(data["coverage"]), int(data["min_group_size"]))
            quantiles = data["quantiles"]
            if not isinstance(quantiles, dict) or POOLED not in quantiles:
                raise InputError(f"interval calibration: 'quantiles' lacks the pooled entry {POOLED!r}")
            obj.quantiles_ = {}
            for label, q in quantiles.items():
                lo, hi, n = float(q["log_lower"]), float(q["log_upper"]), int(q["n"])
                if not (math.isfinite(lo) and math.isfinite(hi) and lo <= 0.0 <= hi and n >= 1):
                    raise InputError(f"interval calibration: group {label!r} has invalid bounds {q}")
                obj.quantiles_[str(label)] = {"log_lower": lo, "log_upper": hi, "n": n}
            obj.n_calibration_ = int(data["n_calibration"])
        except KeyError as exc:
            raise InputError(f"interval calibration lacks key {exc}") from None
        except (TypeError, ValueError) as exc:
            raise InputError(f"interval calibration: bad value ({exc})") from None
        return obj


__all__ = ["ConformalInterval", "POOLED", "conformal_quantile"]
