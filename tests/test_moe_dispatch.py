"""Expert dispatch: DeepEP's per-rank and per-node dispatch against Megatron-Core's alltoall dispatcher, and
expert all-to-alls overlapped with another micro-batch's computation, checked against closed forms."""

from __future__ import annotations

import pytest

from conftest import A100_LIKE, KNOWN_PARAMS, MOE, make_run, roofline
from learnedperf.errors import SpecError
from learnedperf.features.run import RUN_FEATURE_SCHEMA, RunContext, analytic_time, run_features
from learnedperf.graph.execution import compile_run
from learnedperf.graph.ops import Group
from learnedperf.simulate import simulate
from learnedperf.simulate.simulator import MOE_COMM_SMS, _Builder
from learnedperf.specs import ModelSpec, RunSpec

# 16 experts of MOE's shape, top-4: expert parallelism over two nodes of 8
MOE16 = dict(MOE, num_experts=16, moe_top_k=4)


@pytest.mark.parametrize("key, value", [("moe_dispatcher", "deepep"), ("overlap_moe_comm", True)])
def test_dispatch_keys_need_expert_parallelism(key, value):
    with pytest.raises(SpecError) as err:
        make_run(MOE16, num_devices=2, **{key: value})
    assert err.value.field == f"strategy.{key}"
    with pytest.raises(SpecError) as err:
        make_run(MOE16, num_devices=2, **{"moe_dispatcher": "nccl"})
    assert err.value.field == "strategy.moe_dispatcher"


def test_dispatch_keys_serialise_only_when_set():
    plain = make_run(MOE16, num_devices=16, ep=16)
    assert "moe_dispatcher" not in plain.to_dict()["strategy"]
    assert "overlap_moe_comm" not in plain.to_dict()["strategy"]
    run = make_run(MOE16, num_devices=16, ep=16, moe_dispatcher="deepep", overlap_moe_comm=True)
    assert RunSpec.from_dict(run.to_dict()) == run


def _dispatch_ops(run: RunSpec) -> list:
    eg = compile_run(run, 1)
    return [op for blk, _ in eg.stages[0].chunks[0].forward for op in blk if ".moe.dispatch" in op.name]


def test_alltoall_dispatcher_sends_every_copy():
    run = make_run(MOE16, num_devices=16, ep=16, micro_batch_size=2, global_batch_size=32)
    T, h = 2 * MOE16["seq_length"], MOE16["hidden_size"]
    (op,) = {op.name: op for op in _dispatch_ops(run)}.values()
    assert op.kind == "alltoall" and op.group == Group(16, 8) and op.bytes == T * 4 * h * 2
    # half of the copies leave the node
    assert roofline(run).comm_cost(op).inter_bytes == pytest.approx(T * 4 * h * 2 / 2)


def test_deepep_crosses_the_network_once_per_node():
    # node-limited routing: 2 groups of 8 experts = the 2 nodes, a token's top-4 in one of them
    model = dict(MOE16, moe_router_num_groups=2, moe_router_group_topk=1)
    run = make_run(model, num_devices=16, ep=16, micro_batch_size=2, global_batch_size=32, moe_dispatcher="deepep")
    T, h, e = 2 * MOE16["seq_length"], MOE16["hidden_size"], 2
    ops = {op.name.rsplit(".", 1)[1]: op for op in _dispatch_ops(run)}
    assert set(ops) == {"rdma", "nvlink"}
    cost = roofline(run)
    # each token goes to exactly one node, the other one half of the time: T/2 rows over the network
    assert ops["rdma"].group == Group(2, 1)
    assert cost.comm_cost(ops["rdma"]).inter_bytes == pytest.approx(T * h * e / 2)
    # inside the node, once to each rank holding one of its experts: 4 distinct of that node's 8 ranks
    # (one expert a rank), 7/8 of them another GPU than the one the rows arrived on
    ranks = ModelSpec.parse(model).expected_parts_per_token(16)
    assert ranks == pytest.approx(4.0)
    assert ops["nvlink"].group == Group(8, 8)
    assert cost.comm_cost(ops["nvlink"]).intra_bytes == pytest.approx(T * h * e * 4 * 7 / 8)
    assert cost.comm_cost(ops["nvlink"]).inter_bytes == 0.0
    # inside one node DeepEP is one all-to-all of a token's distinct ranks
    one_node = make_run(MOE16, num_devices=8, ep=8, micro_batch_size=2, global_batch_size=16,
                        moe_dispatcher="deepep")
    (op,) = _dispatch_ops(one_node)
    assert op.bytes == pytest.approx(T * h * e * ModelSpec.parse(MOE16).expected_parts_per_token(8))


def _builder(num_sms: int):
    run = make_run(MOE16, num_devices=16, ep=16, overlap_moe_comm=True, device=dict(A100_LIKE, num_sms=num_sms))
    b = _Builder(compile_run(run, 1), roofline(run))
    b.compute_streams = [b.e.add_stream("compute")]
    b.ep_streams = [b.e.add_stream("ep")]
    return b, b.cost.link_bandwidth_Bps("inter")


@pytest.mark.parametrize("kernels_s, alltoall_s, num_sms, expected_s", [
    (1.0, 2.0, 108, 2.0),  # the all-to-alls outlast the kernels
    (1.0, 0.5, 108, 1.0 + 0.5 * MOE_COMM_SMS / (108 - MOE_COMM_SMS)),  # kernels slowed while both run
    (1.0, 0.5, MOE_COMM_SMS, 1.5)])  # no SMs to spare: one after the other
def test_overlapped_unit_takes_the_longer_of_kernels_and_alltoalls(kernels_s, alltoall_s, num_sms, expected_s):
    b, bw = _builder(num_sms)
    t, _ = b.unit_task(0, (kernels_s, 0.0, 0.0, 0.0, 0.0, 0.0, alltoall_s * bw), (), None, True, "forward", "F0.0")
    assert b.e.run() == pytest.approx(expected_s)
    assert b.e.t_cat[t] == "forward"


def test_overlap_lies_between_free_and_blocking_alltoalls():
    kw = dict(num_devices=16, ep=16, micro_batch_size=1, global_batch_size=64)
    blocking = simulate(make_run(MOE16, **kw), cost=roofline(make_run(MOE16, **kw)))
    run = make_run(MOE16, overlap_moe_comm=True, **kw)
    overlapped = simulate(run, cost=roofline(run))
    assert overlapped.iteration_time_s < blocking.iteration_time_s
    assert overlapped.breakdown_s["exposed_communication"] < blocking.breakdown_s["exposed_communication"]
    # all-to-alls on links a million times faster: the kernels (and the gradient all-reduce) alone
    fast = dict(A100_LIKE, inter_node_bandwidth_GBps=25e6, intra_node_bandwidth_GBps=300e6)
    free = make_run(MOE16, device=fast, overlap_moe_comm=True, **kw)
    assert simulate(free, cost=roofline(free)).iteration_time_s < overlapped.iteration_time_s


def test_fast_tier_features_see_the_dispatch():
    kw = dict(num_devices=16, ep=16, micro_batch_size=1, global_batch_size=64)
    names = RUN_FEATURE_SCHEMA.names
    runs = [make_run(MOE16, **kw), make_run(MOE16, moe_dispatcher="deepep", **kw),
            make_run(MOE16, overlap_moe_comm=True, **kw)]
    ctx = RunContext(runs[0].model, runs[0].hardware)
    ctx.cost = roofline(runs[0], KNOWN_PARAMS)
    x = [run_features(r, ctx, 1.0)[0] for r in runs]
    assert [v[names.index("deepep")] for v in x] == [0.0, 1.0, 0.0]
    assert [v[names.index("overlap_moe_comm")] for v in x] == [0.0, 0.0, 1.0]
    plain, deepep, overlap = (analytic_time(r, ctx) for r in runs)
    # DeepEP sends a token over the network once per other node its experts are on, not once per expert
    assert deepep.layer_comm_s < plain.layer_comm_s
    assert overlap.layer_comm_s < plain.layer_comm_s and overlap.compute_s > plain.compute_s


def test_search_gives_the_dispatch_keys_to_expert_parallel_candidates_only():
    from learnedperf.predict import enumerate_strategies

    run = make_run(MOE16, num_devices=16)
    fixed = {"moe_dispatcher": "deepep", "overlap_moe_comm": True}
    _c, cands = enumerate_strategies(run.model, run.hardware, {"global_batch_size": 16, "tp": [1], "pp": [1],
                                                               "micro_batch_size": [1], "recompute": ["none"],
                                                               "zero_stages": [0], "fixed": fixed})
    assert sorted({c["ep"] for c in cands}) == [1, 2, 4, 8, 16]
    for c in cands:
        assert ({k: c[k] for k in fixed} == fixed) if c["ep"] > 1 else not set(fixed) & set(c)
        # every candidate is a valid run: ep 1 keeps no dispatch key it could not have
        RunSpec.from_dict({"model": MOE16, "hardware": run.hardware.to_dict(), "strategy": c})


def test_search_tries_the_dispatch_choices_it_is_given():
    from learnedperf.errors import InputError
    from learnedperf.predict import enumerate_strategies

    run = make_run(MOE16, num_devices=16)
    base = {"global_batch_size": 16, "tp": [1], "pp": [1], "micro_batch_size": [1], "recompute": ["none"],
            "zero_stages": [0], "ep": [1, 16], "cp": [1]}
    _c, plain = enumerate_strategies(run.model, run.hardware, base)
    assert len(plain) == 2 and not any("moe_dispatcher" in c or "overlap_moe_comm" in c for c in plain)
    _c, cands = enumerate_strategies(run.model, run.hardware, {**base, "moe_dispatchers": ["alltoall", "deepep"],
                                                               "overlap_moe_comm": [False, True]})
    # ep 1: one candidate; ep 16: the four combinations, the defaults left out
    got = sorted((c["ep"], c.get("moe_dispatcher", "alltoall"), c.get("overlap_moe_comm", False)) for c in cands)
    assert got == [(1, "alltoall", False), (16, "alltoall", False), (16, "alltoall", True), (16, "deepep", False),
                   (16, "deepep", True)]
    # a searched key cannot also be fixed; a bad choice is named
    with pytest.raises(InputError, match="constraints.fixed"):
        enumerate_strategies(run.model, run.hardware, {**base, "moe_dispatchers": ["deepep"],
                                                       "fixed": {"moe_dispatcher": "deepep"}})
    with pytest.raises(InputError, match="constraints.moe_dispatchers"):
        enumerate_strategies(run.model, run.hardware, {**base, "moe_dispatchers": ["nccl"]})


@pytest.mark.parametrize("constraints, field", [
    ({"fixed": {"moe_dispatcher": "deepep"}}, "constraints.fixed.moe_dispatcher"),
    ({"overlap_moe_comm": [True]}, "constraints.overlap_moe_comm")])
def test_search_of_a_dense_model_refuses_expert_dispatch(constraints, field):
    from learnedperf.errors import InputError
    from learnedperf.predict import enumerate_strategies

    run = make_run(dict(MOE16, arch="llama", num_experts=1, moe_top_k=1), num_devices=8)
    with pytest.raises(InputError) as err:
        enumerate_strategies(run.model, run.hardware, {"global_batch_size": 8, **constraints})
    assert str(err.value).startswith(field + ":")
