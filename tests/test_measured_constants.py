"""The whole-step constants of devices described by measurement (``curve_efficiency``,
``curve_memory_efficiency``) and their fit (:mod:`learnedperf.simulate.calibrate`, run on the data sets
by ``experiments/calibrate_steps.py --measured``)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from learnedperf.cost import RooflineCost, default_params
from learnedperf.measure.steps import TRANSFORMER_ARCHS
from learnedperf.errors import InputError
from learnedperf.simulate import simulate
from learnedperf.simulate.calibrate import fit_measured_device_constants

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "datasets" / "measured"


@pytest.fixture(scope="module")
def calibrate_steps():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import calibrate_steps
    finally:
        sys.path.pop(0)
    return calibrate_steps


def test_measured_steps_reads_the_transformer_steps_with_their_world_size(calibrate_steps):
    import pandas as pd

    steps = calibrate_steps.measured_steps(MEASURED / "vm-epyc-2c")
    raw = pd.read_parquet(MEASURED / "vm-epyc-2c" / "steps_cpu.parquet")
    transformer = raw[raw.arch.isin(TRANSFORMER_ARCHS)]
    # every transformer step, none of the MLP / CNN ones, each with its own world size and time
    assert len(steps) == len(transformer) < len(raw)
    assert sorted(w for *_, w in steps) == sorted(transformer.world_size.astype(int))
    assert sorted(m for _, m, _ in steps) == pytest.approx(sorted(transformer.iteration_time_ms))
    # the runs carry the measured device's kernel curves: the constants fitted here act on them
    assert all(run.hardware.device.kernel_curves is not None for run, *_ in steps)


def test_the_fit_recovers_constants_that_produced_the_times(calibrate_steps):
    """Steps "measured" by the simulator itself at known constants: the grid point with zero error
    is those constants, and the fit finds it."""
    truth = replace(default_params(), curve_efficiency=0.7, curve_memory_efficiency=0.45)
    sets = {}
    for name in ("vm-epyc-2c", "vm-xeon-2c"):
        steps = calibrate_steps.measured_steps(MEASURED / name)
        pick = [s for s in steps if s[2] == 1][:3] + [s for s in steps if s[2] > 1][:1]
        sets[name] = [(run, simulate(run, cost=RooflineCost(run.hardware, truth)).iteration_time_s * 1e3, w)
                      for run, _ms, w in pick]
    grid = [(eta, mem) for eta in (0.6, 0.7, 0.8) for mem in (0.35, 0.45, 0.55)]
    params, table = fit_measured_device_constants(sets, grid=grid)
    assert (params.curve_efficiency, params.curve_memory_efficiency) == (0.7, 0.45)
    # the other constants are the shipped ones
    assert params.kernel_floor_us == default_params().kernel_floor_us
    assert table[(0.7, 0.45)][("vm-epyc-2c", True)] == pytest.approx(0.0, abs=1e-9)
    assert table[(0.7, 0.45)][("vm-xeon-2c", False)] == pytest.approx(0.0, abs=1e-9)
    # each constant moves the times: a wrong one leaves an error on both devices
    for wrong in ((0.6, 0.45), (0.7, 0.55)):
        assert all(table[wrong][(n, True)] > 1.0 for n in sets)


def test_the_fit_refuses_what_it_cannot_fit_on(calibrate_steps):
    steps = calibrate_steps.measured_steps(MEASURED / "vm-epyc-2c")
    multi = [s for s in steps if s[2] > 1][:2]
    with pytest.raises(InputError, match="no single-process step"):
        fit_measured_device_constants({"epyc": multi}, grid=[(0.8, 0.35)])
    # a GPU run has no kernel curves: the constants would act on nothing, and the error says which device
    from learnedperf.specs import RunSpec

    gpu = RunSpec.from_dict({"model": "gpt3-1.3b", "hardware": {"device": "A100-SXM4-80GB", "num_devices": 1},
                             "strategy": {"global_batch_size": 1}})
    with pytest.raises(InputError, match="A100-SXM4-80GB, which has no kernel curves"):
        fit_measured_device_constants({"gpu": [(gpu, 100.0, 1)]}, grid=[(0.8, 0.35)])


def test_evaluate_refits_only_fitted_measured_device_constants(monkeypatch):
    """A CPU split refits the measured-device constants when the shipped ones were fitted on measured steps
    (their provenance says "fit by"), not when they are unset or set without a fit."""
    import learnedperf.cost.params as params
    from learnedperf.models.evaluate import measured_constants_set

    for prov, want in (({}, False),
                       ({"curve_efficiency": {"value": 1.0, "provenance": "not fitted: face value"}}, False),
                       ({"curve_memory_efficiency": {"value": 0.35, "provenance": "fit by experiments/..."}}, True)):
        monkeypatch.setattr(params, "provenance", lambda prov=prov: prov)
        assert measured_constants_set() is want
