"""Whole-step fit of the constants of devices described by measurement.

A device that ``learnedperf measure`` described carries its own kernel curves and measured
bandwidth; the cost model then uses two constants of its own instead of the data-sheet
efficiencies (:class:`~learnedperf.cost.params.CostParams`): ``curve_efficiency``, the share of
an isolated kernel's measured rate a GEMM or attention keeps inside a training step, and
``curve_memory_efficiency``, the share of the measured streaming bandwidth a memory-bound op
reaches. Neither can be fitted on operators timed one by one; both are fitted here on measured
**single-process** steps, by grid search on the sum of the per-data-set MAPEs, so that every
device weighs the same whatever its number of steps.

``experiments/calibrate_steps.py --measured`` fits the shipped values on every data set of
``datasets/measured``; :func:`learnedperf.models.evaluate.evaluate` refits them without the CPU a
split holds out, so that nothing of that CPU's steps reaches its test.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

from ..errors import InputError

#: grids searched: curve_efficiency 0.5 ... 1.2, curve_memory_efficiency 0.1 ... 1.2
CURVE_EFFICIENCY_GRID = tuple(round(0.5 + 0.025 * i, 3) for i in range(29))
CURVE_MEMORY_GRID = tuple(round(0.1 + 0.05 * i, 3) for i in range(23))


def steps_mape(steps: Sequence[tuple[Any, float]], params: Any) -> float:
    """MAPE (%) of the simulator on ``(run, measured ms)`` pairs with cost constants ``params``."""
    from ..cost import RooflineCost
    from .simulator import simulate

    errs = [abs(simulate(spec, cost=RooflineCost(spec.hardware, params)).iteration_time_s * 1e3 / ms - 1)
            for spec, ms in steps]
    return 100.0 * sum(errs) / len(errs)


def mape_table(sets: Mapping[str, Sequence[tuple[Any, float, int]]], grid: Sequence[tuple[float, float]],
               base: Any) -> dict:
    """MAPE (%) of the simulator on each data set's single- and multi-process steps, per grid point.

    Args:
        sets: per data set name, its ``(run, measured ms, world size)`` steps.
        grid: ``(curve_efficiency, curve_memory_efficiency)`` pairs.
        base: the other constants (:class:`~learnedperf.cost.params.CostParams`).

    Returns:
        ``{(eta, mem): {(name, single_process): MAPE}}`` (a kind a data set lacks is absent).
    """
    table = {}
    for eta, mem in grid:
        p = replace(base, curve_efficiency=float(eta), curve_memory_efficiency=float(mem))
        row = {}
        for name, steps in sets.items():
            for single in (True, False):
                sub = [(s, m) for s, m, w in steps if (w == 1) == single]
                if sub:
                    row[(name, single)] = steps_mape(sub, p)
        table[(eta, mem)] = row
    return table


def best_on(table: Mapping, names: Sequence[str]) -> tuple[float, float]:
    """The grid point of ``table`` with the least sum of single-process MAPEs over data sets ``names``."""
    return min(table, key=lambda k: sum(table[k][(n, True)] for n in names))


def fit_measured_device_constants(sets: Mapping[str, Sequence[tuple[Any, float, int]]], base: Optional[Any] = None,
                                  grid: Optional[Sequence[tuple[float, float]]] = None) -> tuple[Any, dict]:
    """Fit ``curve_efficiency`` and ``curve_memory_efficiency`` on the single-process steps of ``sets``.

    Args:
        sets: per data set (one device each), its ``(run, measured ms, world size)`` steps; only the
            single-process ones fit, the others are scored.
        base: the other constants (default: the shipped ones).
        grid: ``(curve_efficiency, curve_memory_efficiency)`` pairs (default: the product of
            :data:`CURVE_EFFICIENCY_GRID` and :data:`CURVE_MEMORY_GRID`).

    Returns:
        ``(params, table)``: ``base`` with the fitted pair, and the :func:`mape_table` of the search.

    Raises:
        InputError: no data set has a single-process step, or a step's run has no kernel curves
            (the constants act on nothing else).
    """
    from ..cost import default_params

    fit = {name: steps for name, steps in sets.items() if any(w == 1 for *_, w in steps)}
    if not fit:
        raise InputError("fit_measured_device_constants: no single-process step to fit on")
    for name, steps in sets.items():
        for spec, *_ in steps:
            if spec.hardware.device.kernel_curves is None:
                raise InputError(f"fit_measured_device_constants: a step of {name} is on device "
                                 f"{spec.hardware.device.name}, which has no kernel curves")
    base = base or default_params()
    table = mape_table(sets, grid or list(itertools.product(CURVE_EFFICIENCY_GRID, CURVE_MEMORY_GRID)), base)
    eta, mem = best_on(table, sorted(fit))
    return replace(base, curve_efficiency=float(eta), curve_memory_efficiency=float(mem)), table


__all__ = ["CURVE_EFFICIENCY_GRID", "CURVE_MEMORY_GRID", "best_on", "fit_measured_device_constants", "mape_table",
           "steps_mape"]
