"""Measured kernel curves: a device's own timings of GEMMs, attention and optimizer steps, reduced
to a few numbers the cost model can use for ops of any size.

A kernel curve (:class:`~learnedperf.specs.hardware.KernelCurve`) is

    time = overhead + FLOPs / (rate · ∏ d / (d + d½))

over the op's dimensions *d* (a GEMM's m, n, k; an attention's s_q, s_kv, head dim). The overhead
is Hockney's start-up time (r∞, n½: Hockney & Jesshope, *Parallel Computers 2*, 1988); the product
is the share of its large-size rate a blocked kernel reaches when a dimension is small against its
blocking, which a FLOP count alone cannot say: on this project's CPU a bf16 GEMM with one dimension
of 32 runs at a fifth of the rate of a square-ish one of about the same FLOPs (``datasets/measured/
vm-xeon-2c``: 0.20 TFLOP/s at m, n, k = 2048, 2048, 32 against 0.91 at 768, 512, 384).
An optimizer rate (:class:`~learnedperf.specs.hardware.OptimizerRate`) is ``overhead + N · t``.

Both are fitted here, on operator timings, by weighted least squares in the relative error (a grid
over d½, and for each value a linear fit of the other two), so that every constant comes from a
measurement (:mod:`learnedperf.measure.curves` runs the fit on a data set's operator records).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InputError

#: d½ values searched: 0 (no ramp) and 1 ... 4096 in quarter octaves
DIM_HALF_GRID = np.concatenate([[0.0], 2.0 ** (np.arange(0, 49) / 4.0)])


def ramp(dims: Sequence[float], dim_half: float) -> float:
    """Share of its large-size rate a kernel reaches on an op of dimensions ``dims``: ∏ d / (d + d½)."""
    out = 1.0
    for d in dims:
        out *= d / (d + dim_half)
    return out


def _fit_linear(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(a, b) ≥ 0 minimising Σ ((a + b·x) / t − 1)²: least squares in the relative error."""
    w = 1.0 / t
    design = np.stack([w, x * w], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if a < 0:  # no negative start-up: refit the slope alone
        a, b = 0.0, float(np.sum(x * w * w * t) / np.sum((x * w) ** 2))
    return float(a), float(b)


def _check(n: int, *arrays: np.ndarray, what: str) -> None:
    if n < 3:
        raise InputError(f"{what}: needs at least 3 timings, got {n}")
    for arr in arrays:
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise InputError(f"{what}: timings, FLOPs and sizes must be finite and positive")


def fit_kernel_curve(dims: Sequence[Sequence[float]], flops: Sequence[float], seconds: Sequence[float]) -> dict:
    """Fit a kernel curve to timings of one kernel in one dtype.

    Args:
        dims: per timing, the op's ramp dimensions (GEMM ``(m, n, k)``, attention ``(s_q, s_kv, head_dim)``).
        flops: per timing, the op's FLOPs.
        seconds: per timing, the measured time.

    Returns:
        ``{"tflops", "overhead_us", "dim_half", "mean_abs_log_error", "timings"}``: the first three
        are a :class:`~learnedperf.specs.hardware.KernelCurve`.

    Raises:
        InputError: fewer than 3 timings, or a non-positive / non-finite value.
    """
    D = np.asarray(dims, dtype=float)
    F = np.asarray(flops, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if D.ndim != 2 or len(D) != len(F) or len(F) != len(t):
        raise InputError("fit_kernel_curve: dims, flops and seconds must have one row per timing")
    _check(len(t), D, F, t, what="fit_kernel_curve")
    best = None
    for h in DIM_HALF_GRID:  # start: the best d½ of the grid, with its linear least-squares fit
        x = F / np.prod(D / (D + h), axis=1)
        a, b = _fit_linear(x, t)
        if b <= 0:
            continue
        err = float(np.mean(np.abs(np.log((a + b * x) / t))))
        if best is None or err < best[0] - 1e-12:
            best = (err, float(h), a, b)
    if best is None:
        raise InputError("fit_kernel_curve: time does not grow with FLOPs in these timings")
    _err, h, a, b = best

    # then all three jointly, in the log error (a robust loss, so that a few noisy timings do not
    # pull the curve), over logarithms that keep them positive
    def residual(p: np.ndarray) -> np.ndarray:
        x = F / np.prod(D / (D + np.exp(p[2])), axis=1)
        return np.log(np.exp(p[0]) + np.exp(p[1]) * x) - np.log(t)

    from scipy.optimize import least_squares

    start = np.log([max(a, 1e-9), b, max(h, 0.25)])
    p = least_squares(residual, start, loss="soft_l1").x
    a, b, h = (float(v) for v in np.exp(p))
    err = float(np.mean(np.abs(residual(p))))
    return {"tflops": 1.0 / b / 1e12, "overhead_us": a * 1e6, "dim_half": h, "mean_abs_log_error": err,
            "timings": int(len(t))}


def fit_optimizer_rate(params: Sequence[float], seconds: Sequence[float]) -> dict:
    """Fit ``seconds ≈ overhead + params · t`` to timings of one optimizer's step.

    Returns:
        ``{"ns_per_param", "overhead_us", "mean_abs_log_error", "timings"}``.

    Raises:
        InputError: fewer than 3 timings, a non-positive value, or no growth with the size.
    """
    n = np.asarray(params, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if n.shape != t.shape or n.ndim != 1:
        raise InputError("fit_optimizer_rate: params and seconds must be equal-length sequences")
    _check(len(t), n, t, what="fit_optimizer_rate")
    a, b = _fit_linear(n, t)
    if b <= 0:
        raise InputError("fit_optimizer_rate: time does not grow with the parameter count in these timings")
    from scipy.optimize import least_squares

    # refined in the log error with the robust loss of fit_kernel_curve
    def residual(p: np.ndarray) -> np.ndarray:
        return np.log(np.exp(p[0]) + np.exp(p[1]) * n) - np.log(t)

    p = least_squares(residual, np.log([max(a, 1e-9), b]), loss="soft_l1").x
    a, b = (float(v) for v in np.exp(p))
    err = float(np.mean(np.abs(residual(p))))
    return {"ns_per_param": b * 1e9, "overhead_us": a * 1e6, "mean_abs_log_error": err, "timings": int(len(t))}


def curve_rate_flops(curve, dims: Sequence[float], efficiency: float = 1.0) -> float:
    """FLOP/s of an op of dimensions ``dims`` on ``curve`` (a KernelCurve), scaled by ``efficiency``
    (the share of an isolated kernel's rate an op keeps inside a training step)."""
    return curve.tflops * 1e12 * efficiency * ramp(dims, curve.dim_half)
