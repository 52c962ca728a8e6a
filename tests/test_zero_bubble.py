"""Zero bubble H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the schedule, the simulator's
split backward, memory and the fast tier's closed form against the paper's Table 1.

Table 1 of the paper: with equal stages, forward ``F``, input-gradient backward ``B`` and weight-gradient
backward ``W`` seconds a micro-batch and free communication, 1F1B takes ``(m+p-1)(F+B+W)`` and ZB-H1
``m(F+B+W) + (p-1)(F+B-W)`` (for ``m >= p`` and ``W`` no longer than ``F`` and ``B``).
"""

from __future__ import annotations

import pytest

from conftest import GPT_SMALL, make_run
from learnedperf.cost import CommCost, CostModel
from learnedperf.errors import SpecError
from learnedperf.features.run import RunContext, analytic_time
from learnedperf.graph.execution import compile_run, schedule_1f1b, schedule_zb_h1, split_weight_gradients
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import in_flight_microbatches, peak_memory, peak_memory_of


class UnitCost(CostModel):
    """Every layer costs ``F`` forward, ``B`` for its input gradients and ``W`` for its weight gradients (all on
    its QKV GEMM); everything else, communication included, is free."""

    name = "unit"

    def __init__(self, f: float, b: float, w: float):
        self.times = {"layer.attn.qkv": f, "layer.attn.qkv.dgrad": b, "layer.attn.qkv.wgrad": w}

    def compute_time_s(self, op) -> float:
        return self.times.get(op.name, 0.0)

    def comm_cost(self, op) -> CommCost:
        return CommCost(0.0, 0.0, 0.0)

    def link_bandwidth_Bps(self, level: str) -> float:
        return 1e18


def one_layer_per_stage(p: int, m: int, schedule: str, **strategy):
    model = dict(GPT_SMALL, num_layers=p)
    return make_run(model, num_devices=p, pp=p, micro_batch_size=1, global_batch_size=m, pipeline_schedule=schedule,
                    **strategy)


@pytest.mark.parametrize("p,m,f,b,w", [(4, 4, 1.0, 1.0, 1.0), (4, 12, 1.0, 1.0, 1.0), (8, 16, 1.0, 1.0, 0.5),
                                       (4, 16, 1.0, 2.0, 1.0), (2, 6, 1.0, 1.2, 0.9), (8, 40, 1.0, 1.0, 1.0)])
@pytest.mark.parametrize("exact", [True, False])
def test_iteration_time_is_the_papers_closed_form(p, m, f, b, w, exact):
    cost = UnitCost(f, b, w)
    zb = simulate(one_layer_per_stage(p, m, "zb-h1"), cost=cost, exact=exact)
    ref = simulate(one_layer_per_stage(p, m, "1f1b"), cost=cost, exact=exact)
    assert ref.iteration_time_s == pytest.approx((m + p - 1) * (f + b + w), rel=1e-9)
    assert zb.iteration_time_s == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w), rel=1e-9)
    # the weight-gradient passes are backward time, not bubble: the parts add up to the iteration
    bd = zb.breakdown_s
    assert bd["forward"] == pytest.approx(m * f)
    assert bd["backward"] == pytest.approx(m * (b + w))
    assert bd["forward"] + bd["backward"] + bd["pipeline_bubble"] == pytest.approx(zb.iteration_time_s)


def test_fast_tier_bubble_is_the_papers_closed_form():
    p, m, f, b, w = 4, 16, 1.0, 1.0, 0.5
    totals = {}
    for schedule in ("1f1b", "zb-h1"):
        run = one_layer_per_stage(p, m, schedule, optimizer="sgd")
        ctx = RunContext(run.model, run.hardware)
        ctx.cost = UnitCost(f, b, w)
        at = analytic_time(run, ctx)
        totals[schedule] = (at.compute_s + at.layer_comm_s + at.pp_comm_s) * (1.0 + at.bubble_fraction)
    assert totals["1f1b"] == pytest.approx((m + p - 1) * (f + b + w), rel=1e-9)
    assert totals["zb-h1"] == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w), rel=1e-9)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (4, 4), (4, 9), (8, 8), (8, 32), (3, 7)])
def test_schedule_runs_every_pass_once_in_order(p, m):
    for stage in range(p):
        order = schedule_zb_h1(p, m, stage)
        pos = {u: i for i, u in enumerate(order)}
        assert len(pos) == len(order) == 3 * m
        for mb in range(m):
            assert pos[("F", 0, mb)] < pos[("B", 0, mb)] < pos[("W", 0, mb)]
        # forwards and input gradients in 1F1B's order, so as many activations are held as 1F1B holds
        assert [u for u in order if u[0] != "W"] == schedule_1f1b(p, m, stage)
        assert in_flight_microbatches(order) == min(p - stage, m)
        # stage i defers its first i weight passes to the end: p micro-batches between F and W on every stage
        live = peak = 0
        for k, _c, _mb in order:
            live += {"F": 1, "B": 0, "W": -1}[k]
            peak = max(peak, live)
        assert peak == min(p, m)


def test_split_backward_keeps_every_op_once():
    run = one_layer_per_stage(4, 8, "zb-h1")
    eg = compile_run(run)
    for st in eg.stages:
        for c in st.chunks:
            b_blocks, w_blocks = split_weight_gradients(c.backward)
            for (ops, rep), (b_ops, b_rep), (w_ops, w_rep) in zip(c.backward, b_blocks, w_blocks):
                assert rep == b_rep == w_rep
                assert sorted(o.name for o in ops) == sorted(o.name for o in b_ops + w_ops)
                # a weight gradient has its forward GEMM's FLOPs: W is as much GEMM work as the forward's
                fwd = {o.name: o.flops for blk, _r in c.forward for o in blk if o.kind == "matmul"}
                for o in w_ops:
                    assert o.flops == fwd[o.name[:-len(".wgrad")]]


def test_memory_is_1f1bs():
    for strategy in ({}, {"recompute": "full"}, {"zero_stage": 1}):
        zb = one_layer_per_stage(4, 16, "zb-h1", **strategy)
        ref = one_layer_per_stage(4, 16, "1f1b", **strategy)
        assert peak_memory(compile_run(zb)).total == peak_memory(compile_run(ref)).total
        assert peak_memory_of(zb).total == peak_memory(compile_run(zb)).total


@pytest.mark.parametrize("strategy,field", [({"pp": 1}, "strategy.pipeline_schedule"),
                                            ({"pp": 2, "zero_stage": 3}, "pipeline_schedule"),
                                            ({"pp": 2, "fsdp": True}, "pipeline_schedule"),
                                            ({"pp": 2, "forward_only": True, "optimizer": "none"},
                                             "pipeline_schedule")])
def test_refused_where_not_modelled(strategy, field):
    with pytest.raises(SpecError) as exc:
        make_run(GPT_SMALL, num_devices=4, pipeline_schedule="zb-h1", **strategy)
    assert field in str(exc.value)
