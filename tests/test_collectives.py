"""Collective volumes and latencies (α-β, ring / tree) and the collectives each strategy puts in the graph."""

from __future__ import annotations

import math

import pytest

from conftest import GPT_SMALL, LLAMA_GQA, MOE, make_run
from learnedperf.cost.collective import collective_cost
from learnedperf.graph.execution import compile_run, gradient_collectives
from learnedperf.graph.ops import Group, comm
from learnedperf.units import MiB

A_INTRA, A_INTER = 3e-6, 11e-6  # per-step latencies (s)
BW_INTRA, BW_INTER = 240e9, 20e9  # bytes/s per rank and direction
S = 256 * MiB  # a large message: bandwidth bound


def cost(kind: str, nbytes: float, size: int, per_node: int):
    op = comm("x", kind, "bwd", nbytes, Group(size, per_node), "fp32")
    return collective_cost(op, A_INTRA, A_INTER, BW_INTRA, BW_INTER)


# ----------------------------------------------------------------------------- volumes
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_inside_node(n):
    c = cost("allreduce", S, n, n)
    assert c.intra_bytes == pytest.approx(2 * (n - 1) / n * S, rel=1e-12)
    assert c.inter_bytes == 0
    assert c.latency_s == pytest.approx(2 * (n - 1) * A_INTRA, rel=1e-12)
    assert c.algorithm == "ring"


@pytest.mark.parametrize("N", [2, 4, 16])
def test_ring_allreduce_one_rank_per_node(N):
    c = cost("allreduce", S, N, 1)
    assert c.algorithm == "ring"
    assert c.intra_bytes == 0
    assert c.inter_bytes == pytest.approx(2 * (N - 1) / N * S, rel=1e-12)
    assert c.latency_s == pytest.approx(2 * (N - 1) * A_INTER, rel=1e-12)


@pytest.mark.parametrize("n,k", [(16, 8), (24, 8), (32, 4)])
def test_hierarchical_allreduce_volumes(n, k):
    N = n // k
    c = cost("allreduce", S, n, k)
    assert c.algorithm == "ring"
    assert c.intra_bytes == pytest.approx(2 * (k - 1) / k * S, rel=1e-12)
    # the node's NICs carry 2(N-1)/N·S, shared by its k ranks
    assert c.inter_bytes == pytest.approx(2 * (N - 1) / N * S / k, rel=1e-12)


@pytest.mark.parametrize("n,k", [(16, 8), (64, 8), (512, 8), (24, 4)])
def test_a_ring_pays_the_network_latency_only_where_it_crosses_a_node(n, k):
    # a ring of n ranks over N nodes has N links between nodes: a pass of n-1 steps crosses N of them and
    # n-1-N NVLink links (NCCL's tuner counts ring latency so: src/graph/tuning.cc). Before, every step paid
    # the network's latency, and ZeRO-1/2's reduce-scatter + all-gather grew k times an all-reduce's latency.
    N = n // k
    one_pass = N * A_INTER + (n - 1 - N) * A_INTRA
    assert cost("allgather", 1.0, n, k).latency_s == pytest.approx(one_pass, rel=1e-12)
    assert cost("reducescatter", 1.0, n, k).latency_s == pytest.approx(one_pass, rel=1e-12)
    ring = cost("allreduce", S, n, k)  # large: the ring's bandwidth wins over the tree
    if ring.algorithm == "ring":
        assert ring.latency_s == pytest.approx(2 * one_pass, rel=1e-12)


@pytest.mark.parametrize("kind", ["allgather", "reducescatter"])
@pytest.mark.parametrize("n,k", [(8, 8), (4, 4), (16, 1), (16, 8), (32, 4)])
def test_allgather_reducescatter_are_half_of_allreduce(kind, n, k):
    ar = cost("allreduce", S, n, k)
    assert ar.algorithm == "ring"
    c = cost(kind, S, n, k)
    assert c.intra_bytes == pytest.approx(ar.intra_bytes / 2, rel=1e-12)
    assert c.inter_bytes == pytest.approx(ar.inter_bytes / 2, rel=1e-12)
    assert c.latency_s == pytest.approx(ar.latency_s / 2, rel=1e-12)  # n-1 steps instead of 2(n-1)


@pytest.mark.parametrize("n,k", [(8, 8), (16, 8), (64, 8), (8, 1)])
def test_alltoall_volumes(n, k):
    # each rank sends S/n to each of the n-1 others: k-1 of them in its node, n-k elsewhere
    c = cost("alltoall", S, n, k)
    assert c.intra_bytes == pytest.approx((k - 1) * S / n, rel=1e-12)
    assert c.inter_bytes == pytest.approx((n - k) * S / n, rel=1e-12)
    assert c.intra_bytes + c.inter_bytes == pytest.approx((n - 1) / n * S, rel=1e-12)


def test_p2p_uses_the_shared_level():
    assert cost("p2p", S, 2, 2).intra_bytes == S and cost("p2p", S, 2, 2).inter_bytes == 0
    assert cost("p2p", S, 2, 1).inter_bytes == S and cost("p2p", S, 2, 1).intra_bytes == 0


def test_trivial_groups_cost_nothing():
    for c in (cost("allreduce", S, 1, 1), cost("allreduce", 0.0, 8, 8)):
        assert (c.latency_s, c.intra_bytes, c.inter_bytes) == (0.0, 0.0, 0.0)


# ----------------------------------------------------------------------------- ring vs tree
@pytest.mark.parametrize("N", [8, 16, 64, 256])
def test_tree_for_small_messages_on_many_nodes(N):
    c = cost("allreduce", 1024.0, N * 8, 8)
    assert c.algorithm == "tree"
    # NCCL's double binary tree: 2(k-1) chain steps in the node, 2·log2(N) across
    assert c.latency_s == pytest.approx(2 * 7 * A_INTRA + 2 * math.log2(N) * A_INTER, rel=1e-12)
    assert c.latency_s < 2 * (N * 8 - 1) * A_INTER


def test_tree_latency_grows_logarithmically():
    lat = {N: cost("allreduce", 1024.0, N, 1).latency_s for N in (16, 256, 4096)}
    assert lat[256] == pytest.approx(2 * lat[16], rel=1e-12)
    assert lat[4096] == pytest.approx(3 * lat[16], rel=1e-12)


@pytest.mark.parametrize("n,k", [(64, 8), (16, 1), (32, 4)])
def test_ring_for_large_messages(n, k):
    # ring moves 2(N-1)/N·S/k over the network, the tree 2·S/k: for a large enough buffer the ring wins
    c = cost("allreduce", 4096 * MiB, n, k)
    assert c.algorithm == "ring"


def test_single_switch_from_tree_to_ring_as_messages_grow():
    algos = [cost("allreduce", 2.0 ** e, 64, 8).algorithm for e in range(4, 36)]
    assert algos[0] == "tree" and algos[-1] == "ring"
    switch = algos.index("ring")
    assert set(algos[switch:]) == {"ring"} and set(algos[:switch]) == {"tree"}


def test_two_nodes_always_ring():
    assert cost("allreduce", 8.0, 16, 8).algorithm == "ring"


# ----------------------------------------------------------------------------- per strategy
def grad_ops(eg):
    return [op for st in eg.stages for c in st.chunks for op in gradient_collectives(eg, c)]


def test_ddp_gradient_buckets_sum_to_params():
    run = make_run(LLAMA_GQA, num_devices=8, dp=8)  # rmsnorm, untied head
    eg = compile_run(run)
    ops = grad_ops(eg)
    total = run.model.num_params() * 4  # bf16 training reduces fp32 gradients (Megatron)
    assert {op.kind for op in ops} == {"allreduce"}
    assert all(op.group == Group(8, 8) for op in ops)
    assert sum(op.bytes for op in ops) == pytest.approx(total, rel=1e-12)
    assert len(ops) == round(total / (25 * MiB))  # PyTorch DDP's default 25 MiB buckets


def test_ddp_gradient_buckets_follow_reduce_precision_and_bucket_size():
    run = make_run(LLAMA_GQA, num_devices=8, dp=8, grad_reduce_precision="bf16", grad_bucket_size_MiB=100)
    ops = grad_ops(compile_run(run))
    assert sum(op.bytes for op in ops) == pytest.approx(run.model.num_params() * 2, rel=1e-12)
    assert len(ops) == round(run.model.num_params() * 2 / (100 * MiB))


def test_ddp_gradient_buckets_sum_to_params_layernorm_model():
    run = make_run(GPT_SMALL, num_devices=8, dp=8)
    ops = grad_ops(compile_run(run))
    assert sum(op.bytes for op in ops) == pytest.approx(run.model.num_params() * 4, rel=1e-12)


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_reduce_scatters_the_same_total(zero):
    run = make_run(LLAMA_GQA, num_devices=8, dp=8, zero_stage=zero)
    ops = grad_ops(compile_run(run))
    assert {op.kind for op in ops} == {"reducescatter"}
    assert sum(op.bytes for op in ops) == pytest.approx(run.model.num_params() * 4, rel=1e-12)


def test_pipeline_stages_split_gradient_volume():
    # pp=2 with an untied head: the stages' buckets together hold every parameter once
    run = make_run(LLAMA_GQA, num_devices=8, pp=2, dp=4)
    ops = grad_ops(compile_run(run))
    assert sum(op.bytes for op in ops) == pytest.approx(run.model.num_params() * 4, rel=1e-12)
    assert all(op.group == Group(4, 4) for op in ops)


def layer_comms(eg, prefix="layer."):
    fwd = [op for c in eg.stages[0].chunks for ops, _ in c.forward for op in ops
           if op.is_comm and op.name.startswith(prefix)]
    bwd = [op for c in eg.stages[0].chunks for ops, _ in c.backward for op in ops
           if op.is_comm and op.name.startswith(prefix)]
    return fwd, bwd


@pytest.mark.parametrize("tp,b", [(2, 1), (4, 2), (8, 1)])
def test_tensor_parallel_allreduces(tp, b):
    run = make_run(GPT_SMALL, num_devices=tp, tp=tp, micro_batch_size=b)
    fwd, bwd = layer_comms(compile_run(run))
    s, h = GPT_SMALL["seq_length"], GPT_SMALL["hidden_size"]
    # Megatron: one all-reduce after attention and one after the MLP (the g operators), b·s·h·2 bytes each
    assert [op.kind for op in fwd] == ["allreduce", "allreduce"]
    assert all(op.bytes == b * s * h * 2 for op in fwd)
    assert all(op.group == Group(tp, tp) for op in fwd)
    # and their conjugates (f operators) in backward
    assert [op.kind for op in bwd] == ["allreduce", "allreduce"]
    assert all(op.bytes == b * s * h * 2 for op in bwd)


def test_tensor_parallel_off_has_no_layer_collectives():
    fwd, bwd = layer_comms(compile_run(make_run(GPT_SMALL, num_devices=1)))
    assert fwd == [] and bwd == []


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_gathers_and_scatters(tp):
    run = make_run(GPT_SMALL, num_devices=tp, tp=tp, sequence_parallel=True, micro_batch_size=2)
    fwd, bwd = layer_comms(compile_run(run))
    s, h = GPT_SMALL["seq_length"], GPT_SMALL["hidden_size"]
    kinds = sorted(op.kind for op in fwd)
    # Korthikanti et al. 2022 §4.2.2: each all-reduce becomes a reduce-scatter plus an all-gather
    assert kinds == ["allgather", "allgather", "reducescatter", "reducescatter"]
    assert all(op.bytes == 2 * s * h * 2 for op in fwd)
    assert not any(op.kind == "allreduce" for op in fwd + bwd)
    # backward: conjugates (reduce-scatter <-> all-gather) plus the re-gather of the input for the weight grads
    assert sorted(op.kind for op in bwd) == ["allgather", "allgather", "allgather", "allgather",
                                             "reducescatter", "reducescatter"]


@pytest.mark.parametrize("ep,b", [(2, 1), (4, 2), (8, 1)])
def test_expert_parallel_alltoall(ep, b):
    run = make_run(MOE, num_devices=8, dp=8, ep=ep, micro_batch_size=b, global_batch_size=8 * b)
    fwd, bwd = layer_comms(compile_run(run), prefix="moe_layer.")
    s, h, k = MOE["seq_length"], MOE["hidden_size"], MOE["moe_top_k"]
    a2a = [op for op in fwd if op.kind == "alltoall"]
    assert [op.name.split(".")[-1] for op in a2a] == ["dispatch", "combine"]
    assert all(op.bytes == b * s * k * h * 2 for op in a2a)
    assert all(op.group.size == ep for op in a2a)
    assert sum(op.kind == "alltoall" for op in bwd) == 2


def test_no_alltoall_without_expert_parallelism():
    fwd, bwd = layer_comms(compile_run(make_run(MOE, num_devices=8, dp=8)), prefix="moe_layer.")
    assert not any(op.kind == "alltoall" for op in fwd + bwd)
