"""The fixed time of one pipeline send (``CostParams.pipeline_send_us``): each send on the critical path of a
pipeline adds it once, in the simulator and in the fast tier's closed form."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import GPT_SMALL, KNOWN_PARAMS, make_run, roofline
from learnedperf.features.run import RunContext, analytic_time
from learnedperf.simulate import simulate

SEND_US = 700.0


def _run(pp: int, global_batch: int, **extra):
    return make_run(GPT_SMALL, num_devices=pp, pp=pp, micro_batch_size=1, global_batch_size=global_batch,
                    precision="bf16", **extra)


@pytest.mark.parametrize("forward_only", [False, True])
def test_each_send_of_a_one_micro_batch_pipeline_adds_the_constant(forward_only):
    """One micro-batch through two stages: its activations cross once, their gradients once back, and nothing
    overlaps either send (the other stage waits for it): the iteration is exactly that many sends longer."""
    extra = {"forward_only": True, "optimizer": "none"} if forward_only else {}
    run = _run(2, 1, **extra)
    base = simulate(run, cost=roofline(run, KNOWN_PARAMS)).iteration_time_s
    slow = simulate(run, cost=roofline(run, replace(KNOWN_PARAMS, pipeline_send_us=SEND_US))).iteration_time_s
    sends = 1 if forward_only else 2
    assert slow - base == pytest.approx(sends * SEND_US * 1e-6, rel=1e-9)


def test_a_run_without_a_pipeline_pays_nothing():
    run = make_run(GPT_SMALL, num_devices=2, dp=2, micro_batch_size=1, global_batch_size=4, precision="bf16")
    base = simulate(run, cost=roofline(run, KNOWN_PARAMS)).iteration_time_s
    assert simulate(run, cost=roofline(run, replace(KNOWN_PARAMS, pipeline_send_us=SEND_US))).iteration_time_s \
        == base


def test_the_fast_tiers_pipeline_time_counts_two_sends_per_micro_batch():
    """The closed form's pipeline transfers on the critical rank: activations and gradients of each of the
    ``m`` micro-batches, each with the constant."""
    run = _run(4, 8)
    ctx = RunContext(run.model, run.hardware)
    ctx.cost = roofline(run, KNOWN_PARAMS)
    base = analytic_time(run, ctx).pp_comm_s
    ctx = RunContext(run.model, run.hardware)
    ctx.cost = roofline(run, replace(KNOWN_PARAMS, pipeline_send_us=SEND_US))
    assert analytic_time(run, ctx).pp_comm_s - base == pytest.approx(2 * 8 * SEND_US * 1e-6, rel=1e-9)
