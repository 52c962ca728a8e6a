"""The simulator's behavioural fingerprint (``learnedperf.simulate.fingerprint``): it follows what the
simulator answers, so that checkpoints and data sets made by another simulator are recognised."""

from __future__ import annotations

from dataclasses import replace

from learnedperf.cost import default_params
from learnedperf.simulate import simulate
from learnedperf.simulate.fingerprint import REFERENCE_RUNS, fingerprint_values, simulator_fingerprint


def test_fingerprint_values_are_the_reference_runs_simulated():
    values = fingerprint_values()
    assert list(values) == [r["id"] for r in REFERENCE_RUNS]
    for run in REFERENCE_RUNS:
        res = simulate(run)
        time_s, memory_bytes = (float(v) for v in values[run["id"]][:2])
        assert abs(time_s / res.iteration_time_s - 1) < 1e-5
        assert abs(memory_bytes / res.memory.total - 1) < 1e-5


def test_fingerprint_changes_with_a_cost_constant(monkeypatch):
    """A change of behaviour the version number does not see (here one fitted constant, the host's
    dispatch time) changes the fingerprint; the same code gives the same one."""
    before = fingerprint_values()
    assert fingerprint_values() == before
    slower = replace(default_params(), host_dispatch_us=default_params().host_dispatch_us * 2)
    monkeypatch.setattr("learnedperf.cost.roofline.default_params", lambda: slower)
    after = fingerprint_values()
    changed = [k for k in before if before[k] != after[k]]
    # every reference run issues kernels from a host; twice the dispatch time moves at least the small ones
    assert changed, "doubling the host's dispatch time left every reference run unchanged"


def test_fingerprint_is_sixteen_hex_digits_and_cached():
    fp = simulator_fingerprint()
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert simulator_fingerprint() is fp
