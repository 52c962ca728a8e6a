"""Hybrid sharding (HSDP: ``dp_replicate`` copies of the ZeRO/FSDP states): the spec's rules, the memory of
one copy, the serial time of a step against its closed form, the analytic features against the compiled
collectives, and the sampler and the search that draw it."""

from __future__ import annotations

import math

import pytest

from conftest import GPT_SMALL, KNOWN_PARAMS, MOE, make_run, roofline
from learnedperf.errors import SpecError
from learnedperf.features.run import RunContext, analytic_time
from learnedperf.graph.execution import compile_run, fsdp_copy_ops, gradient_collectives
from learnedperf.graph.ops import Group, comm
from learnedperf.simulate import simulate


def test_spec_rules_name_the_field():
    base = dict(num_devices=16, devices_per_node=8)
    s = make_run(GPT_SMALL, fsdp=True, dp_replicate=2, **base).strategy
    assert (s.dp, s.dp_replicate, s.shard_size) == (16, 2, 8)
    for strategy, words in (({"dp_replicate": 2}, "needs zero_stage >= 1 or fsdp"),
                            ({"zero_stage": 1, "dp_replicate": 3}, "does not divide dp=16"),
                            ({"fsdp": True, "dp_replicate": 16}, "plain data parallelism")):
        with pytest.raises(SpecError, match=r"strategy\.dp_replicate: .*" + words):
            make_run(GPT_SMALL, **strategy, **base)
    # experts: the copies must hold whole expert data-parallel groups (dp·cp/ep = 4 here, 8 copies cannot)
    with pytest.raises(SpecError, match=r"strategy\.dp_replicate: .*expert data-parallel size dp·cp/ep = 4"):
        make_run(MOE, zero_stage=1, ep=4, dp_replicate=8, **base)
    assert make_run(MOE, zero_stage=1, ep=4, dp_replicate=4, **base).strategy.expert_shard_size == 1


@pytest.mark.parametrize("strategy, sharded", [({"fsdp": True}, ("w", "g", "o")),
                                               ({"zero_stage": 2}, ("g", "o")), ({"zero_stage": 1}, ("o",))])
def test_states_are_sharded_over_one_copy(strategy, sharded):
    # bf16 weights 2, fp32 gradients 4, fp32 master + two Adam moments 12 bytes per parameter (ZeRO §3.1);
    # 4 copies over 32 ranks: each state ZeRO shards is divided by the 8 ranks of one copy, not by 32
    run = make_run(GPT_SMALL, num_devices=32, precision="bf16", dp_replicate=4, **strategy)
    params = compile_run(run).stages[0].chunks[0].params
    mem = simulate(run).memory
    want = {"w": 2.0, "g": 4.0, "o": 12.0}
    for part, got in (("w", mem.weights), ("g", mem.gradients), ("o", mem.optimizer_states)):
        assert got == pytest.approx(params * want[part] / (8 if part in sharded else 1), rel=1e-12), part


@pytest.mark.parametrize("num_layers", [1, 3])
def test_shard_grad_op_hsdp_without_overlap_is_its_serial_sum(num_layers):
    # 16 ranks on two nodes of 8, two copies: each node shards one copy (a group of 8 inside the node) and the
    # two nodes all-reduce each rank's shard of the gradients (a group of 2 across nodes) once, after the
    # reduce-scatter. With gathers blocking compute and collectives hiding nothing (comm_overlap 0), every
    # gather, reduce-scatter, all-reduce and FSDP copy is paid once; the optimizer steps 1/8 of the parameters.
    model = {**GPT_SMALL, "num_layers": num_layers}
    run = make_run(model, num_devices=16, dp=16, micro_batch_size=1, global_batch_size=16, fsdp=True,
                   zero_stage=2, dp_replicate=2, overlap_param_gather=False, hw_extra={"comm_overlap": 0.0})
    cost = roofline(run, KNOWN_PARAMS)
    eg = compile_run(run)
    c = eg.stages[0].chunks[0]
    s = run.strategy
    pb, gb = eg.param_bytes_per_param, eg.grad_bytes_per_param
    node, across = Group(8, 8), Group(2, 1)
    root = c.params - c.num_layers * c.layer_params
    sizes = [c.layer_params + root] + [c.layer_params] * (c.num_layers - 1)
    compute = sum(cost.compute_time_s(op) * rep for ops, rep in c.forward + c.backward for op in ops)
    gather = sum(cost.comm_time_s(comm("g", "allgather", "fwd", p * pb, node, s.precision)) for p in sizes)
    rs = sum(cost.comm_time_s(comm("r", "reducescatter", "bwd", p * gb, node, s.reduce_precision)) for p in sizes)
    ar = sum(cost.comm_time_s(comm("a", "allreduce", "bwd", p * gb / 8, across, s.reduce_precision)) for p in sizes)
    copies = sum(cost.compute_time_s(op) for p in sizes
                 for op in fsdp_copy_ops("allgather", p, 8, s) + fsdp_copy_ops("reducescatter", p, 8, s))
    opt_ops = eg.stages[0].optimizer
    assert sum(op.flops for op in opt_ops) == pytest.approx(
        sum(op.flops for op in compile_run(make_run(model, num_devices=8, dp=8, micro_batch_size=1,
                                                    global_batch_size=8, fsdp=True, zero_stage=2)).stages[0].optimizer))
    opt = sum(cost.compute_time_s(op) for op in opt_ops)
    r = simulate(run, cost=cost)
    assert r.iteration_time_s == pytest.approx(compute + gather + rs + ar + copies + opt, rel=1e-9)
    assert r.breakdown_s["exposed_communication"] == pytest.approx(gather + rs + ar, rel=1e-9)


def test_one_copy_is_the_fully_sharded_run():
    # dp_replicate 1 is the default: the same step, to the bit
    kw = dict(num_devices=16, micro_batch_size=1, global_batch_size=32, fsdp=True)
    assert simulate(make_run(GPT_SMALL, dp_replicate=1, **kw)).iteration_time_s == \
        simulate(make_run(GPT_SMALL, **kw)).iteration_time_s


@pytest.mark.parametrize("strategy", [{"zero_stage": 1}, {"zero_stage": 2}])
def test_bucketed_hsdp_collectives_and_their_analytic_time(strategy):
    # ZeRO-1/2 with 4 copies over 32 ranks (4 nodes): each bucket is reduce-scattered over the 8 ranks of a node
    # and its 1/8 shard all-reduced over the 4 nodes; the gradients all-reduced across nodes are 1/8 of them.
    run = make_run(GPT_SMALL, num_devices=32, micro_batch_size=1, global_batch_size=32, dp_replicate=4,
                   grad_bucket_size_MiB=8.0, **strategy)
    eg = compile_run(run)
    chunk = eg.stages[0].chunks[0]
    ops = gradient_collectives(eg, chunk)
    rs = [op for op in ops if op.kind == "reducescatter"]
    ar = [op for op in ops if op.kind == "allreduce"]
    total = chunk.params * eg.grad_bytes_per_param
    assert len(rs) == len(ar) == round(total / (8 * 2**20)) > 1
    assert sum(op.bytes for op in rs) == pytest.approx(total)
    assert sum(op.bytes for op in ar) == pytest.approx(total / 8)
    assert {(op.group.size, op.group.per_node) for op in rs} == {(8, 8)}
    assert {(op.group.size, op.group.per_node) for op in ar} == {(4, 1)}
    # the surrogate's analytic gradient traffic is the same collectives timed alone, plus the gather of
    # the updated parameters inside the copy
    ctx = RunContext(run.model, run.hardware)
    gather = ctx.cost.comm_time_s(comm("g", "allgather", "fwd", chunk.params * eg.param_bytes_per_param,
                                       Group(8, 8), run.strategy.precision))
    want = sum(ctx.cost.comm_time_s(op) for op in ops) + gather
    assert analytic_time(run, ctx).dp_comm_s == pytest.approx(want, rel=1e-9)


def test_hybrid_fsdp_keeps_per_micro_batch_traffic_inside_the_node():
    # FSDP over 64 ranks of 8 nodes (25 GB/s cards), 8 micro-batches: fully sharded, every micro-batch's two
    # gathers and reduce-scatter span the nodes; with one copy per node they stay on NVLink, and only the
    # once-an-iteration all-reduce of each shard crosses nodes: as many network bytes as one micro-batch's
    # reduce-scatter and gathers (hierarchical ring, cost.collective), against eight micro-batches' worth.
    kw = dict(num_devices=64, micro_batch_size=1, global_batch_size=512, fsdp=True, overlap_param_gather=False)
    full = simulate(make_run(GPT_SMALL, **kw))
    hybrid = simulate(make_run(GPT_SMALL, dp_replicate=8, **kw))
    assert hybrid.iteration_time_s < full.iteration_time_s
    assert hybrid.breakdown_s["exposed_communication"] < 0.5 * full.breakdown_s["exposed_communication"]


def test_the_sampler_draws_valid_hybrid_runs():
    from learnedperf.data.sampler import sample_runs
    from learnedperf.specs import RunSpec

    hybrid = [r for _i, r in sample_runs(200, seed=3) if r["strategy"].get("dp_replicate", 1) > 1]
    assert hybrid
    for r in hybrid:
        s = RunSpec.from_dict(r).strategy
        assert s.effective_zero_stage >= 1 and 2 <= s.shard_size < s.dp * s.cp


def test_search_offers_one_copy_per_node():
    from learnedperf.predict import enumerate_strategies
    from learnedperf.specs import RunSpec

    run = make_run(GPT_SMALL, num_devices=32)
    _, cands = enumerate_strategies(run.model, run.hardware, {"global_batch_size": 64, "tp": [1, 2], "pp": [1],
                                                              "recompute": ["none"], "micro_batch_size": [1]})
    hybrid = {(c["tp"], c["zero_stage"], c["dp_replicate"]) for c in cands if c["dp_replicate"] > 1}
    # a node of 8 holds 8 data-parallel ranks at tp 1 (4 copies of 32) and 4 at tp 2 (4 copies of 16)
    assert hybrid == {(1, z, 4) for z in (1, 2, 3)} | {(2, z, 4) for z in (1, 2, 3)}
    assert all(c["dp_replicate"] == 1 for c in cands if c["zero_stage"] == 0)
    _, only = enumerate_strategies(run.model, run.hardware, {"global_batch_size": 64, "tp": [1], "pp": [1],
                                                             "recompute": ["none"], "micro_batch_size": [1],
                                                             "hybrid_sharding": [True], "zero_stages": [3]})
    assert [c["dp_replicate"] for c in only] == [4]
    for c in only:
        RunSpec.from_dict({"model": GPT_SMALL, "hardware": {"device": run.hardware.device.to_dict(),
                                                            "num_devices": 32, "devices_per_node": 8},
                           "strategy": c})


def test_features_say_how_many_copies():
    from learnedperf.features.run import RUN_FEATURE_SCHEMA, run_features

    i = RUN_FEATURE_SCHEMA.names.index("log_dp_replicate")
    for r in (1, 4):
        run = make_run(GPT_SMALL, num_devices=32, fsdp=True, dp_replicate=r)
        x, _ = run_features(run, RunContext(run.model, run.hardware), 1.0)
        assert x[i] == pytest.approx(math.log(r))
