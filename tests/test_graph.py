"""Operator graph and execution graph: FLOPs against closed forms, sharding, recompute, schedules, placement."""

from __future__ import annotations

import pytest

from conftest import GPT_SMALL, LLAMA_GQA, make_run
from learnedperf.graph.execution import (Group, chunk_layout, compile_run, group_placement, layers_per_vstage,
                                         schedule_1f1b, schedule_gpipe, schedule_interleaved)
from learnedperf.graph.transformer import operator_graph
from learnedperf.simulate.memory import in_flight_microbatches
from learnedperf.specs import ModelSpec

GEMM_KINDS = ("matmul", "attention")


def gpt(l: int, h: int, a: int, s: int, V: int) -> ModelSpec:
    return ModelSpec.parse({"arch": "gpt", "num_layers": l, "hidden_size": h, "num_attention_heads": a,
                            "vocab_size": V, "seq_length": s})


def gemm_flops(g, phases=("fwd", "bwd")) -> float:
    return sum(op.flops * r for op, r in zip(g.ops, g.repeat) if op.kind in GEMM_KINDS and op.phase in phases)


def narayanan_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """Narayanan et al. (SC21) eq. (3) without recomputation: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))."""
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


GPT_DIMS = [  # (layers, hidden, heads, seq, vocab)
    (96, 12288, 96, 2048, 51200),  # GPT-3 175B (Brown et al. 2020, Table 2.1; Megatron's padded vocab)
    (96, 12288, 96, 2048, 50257),
    (24, 2048, 16, 2048, 50257),  # GPT-3 XL
    (2, 256, 4, 128, 1000),
    (40, 5120, 40, 4096, 32000),
]


# ----------------------------------------------------------------------------- operator graph FLOPs
@pytest.mark.parametrize("l,h,a,s,V", GPT_DIMS)
@pytest.mark.parametrize("flash", [True, False])
def test_gpt_flops_match_narayanan_formula(l, h, a, s, V, flash):
    g = operator_graph(gpt(l, h, a, s, V), batch=1, flash=flash)
    expected = narayanan_flops(1, s, l, h, V)
    assert gemm_flops(g) == pytest.approx(expected, rel=1e-9)


def test_flops_scale_with_batch():
    m = gpt(4, 512, 8, 256, 1000)
    assert gemm_flops(operator_graph(m, batch=3)) == pytest.approx(narayanan_flops(3, 256, 4, 512, 1000), rel=1e-9)


@pytest.mark.parametrize("l,h,a,s,V", GPT_DIMS[:3])
def test_backward_matmul_flops_twice_forward(l, h, a, s, V):
    g = operator_graph(gpt(l, h, a, s, V))
    fwd = sum(op.flops * r for op, r in zip(g.ops, g.repeat) if op.kind == "matmul" and op.phase == "fwd")
    bwd = sum(op.flops * r for op, r in zip(g.ops, g.repeat) if op.kind == "matmul" and op.phase == "bwd")
    assert fwd > 0
    assert bwd == pytest.approx(2 * fwd, rel=1e-12)
    # attention backward is twice its forward too (dQ, dK, dV and the recomputed scores in FlashAttention-2's count)
    fa = sum(op.flops * r for op, r in zip(g.ops, g.repeat) if op.kind == "attention" and op.phase == "fwd")
    ba = sum(op.flops * r for op, r in zip(g.ops, g.repeat) if op.kind == "attention" and op.phase == "bwd")
    assert ba == pytest.approx(2 * fa, rel=1e-12)


def test_llama_gqa_qkv_gemm_shape():
    m = ModelSpec.parse(LLAMA_GQA)
    g = operator_graph(m)
    qkv = [op for op in g.ops if op.name.endswith("attn.qkv")]
    assert len(qkv) == 1
    _b, rows, n, k = qkv[0].shape
    hd = 4096 // 32
    assert n == (32 + 2 * 8) * hd == 6144
    assert k == 4096 and rows == 4096
    assert qkv[0].flops == 2.0 * 4096 * 6144 * 4096


def test_llama_swiglu_mlp_flops():
    # SwiGLU MLP: gate+up GEMM (2f outputs) and down GEMM, i.e. 3 GEMMs of 2·T·h·f each
    m = ModelSpec.parse(LLAMA_GQA)
    g = operator_graph(m)
    mlp = sum(op.flops for op in g.ops if op.phase == "fwd" and op.name.startswith("layer.mlp.fc"))
    assert mlp == pytest.approx(3 * 2.0 * 4096 * 4096 * 14336, rel=1e-12)


# ----------------------------------------------------------------------------- execution graph
def stage_fwd_gemm_flops(eg, stage: int = 0) -> float:
    return sum(op.flops * rep for c in eg.stages[stage].chunks for ops, rep in c.forward for op in ops
               if op.kind in GEMM_KINDS)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_shards_gemm_flops(tp):
    model = dict(GPT_SMALL, vocab_size=50304)  # divisible by 8: the vocab-parallel head shards evenly
    run = make_run(model, num_devices=tp, tp=tp, micro_batch_size=2)
    eg = compile_run(run)
    unsharded = gemm_flops(operator_graph(run.model, batch=2), phases=("fwd",))
    assert stage_fwd_gemm_flops(eg) * tp == pytest.approx(unsharded, rel=1e-12)
    # and each layer's GEMMs individually
    dense = next(ops for ops, rep in eg.stages[0].chunks[0].forward if rep == model["num_layers"])
    ref_layer = {op.name: op.flops for op in operator_graph(run.model, batch=2).ops
                 if op.name.startswith("layer.") and op.phase == "fwd"}
    for op in dense:
        if op.kind in GEMM_KINDS:
            assert op.flops * tp == pytest.approx(ref_layer[op.name], rel=1e-12), op.name


def test_full_recompute_adds_one_forward_of_layer_compute():
    run0 = make_run(GPT_SMALL, num_devices=1, micro_batch_size=1)
    run1 = make_run(GPT_SMALL, num_devices=1, micro_batch_size=1, recompute="full")
    c0 = compile_run(run0).stages[0].chunks[0]
    c1 = compile_run(run1).stages[0].chunks[0]
    L = GPT_SMALL["num_layers"]
    layer_fwd = next(ops for ops, rep in c1.forward if rep == L)
    layer_bwd0 = next(ops for ops, rep in c0.backward if rep == L)
    layer_bwd1 = next(ops for ops, rep in c1.backward if rep == L)
    recompute = [op for op in layer_bwd1 if op.phase == "recompute"]
    # exactly one forward's compute ops re-run, in forward order, before the backward ops
    assert [op.name for op in recompute] == [op.name + ".recompute" for op in layer_fwd]
    assert [op.flops for op in recompute] == [op.flops for op in layer_fwd]
    assert layer_bwd1[:len(recompute)] == recompute
    assert layer_bwd1[len(recompute):] == layer_bwd0

    def gemm(ops):
        return sum(op.flops for op in ops if op.kind in GEMM_KINDS)

    # Megatron's 96 vs 72 factor, per transformer layer: (F + F + 2F) / (F + 2F) = 4/3
    assert (gemm(layer_fwd) + gemm(layer_bwd1)) / (gemm(layer_fwd) + gemm(layer_bwd0)) == pytest.approx(4 / 3,
                                                                                                        rel=1e-12)


def test_selective_recompute_reruns_only_core_attention():
    run = make_run(GPT_SMALL, num_devices=1, recompute="selective", flash_attention=False)
    c = compile_run(run).stages[0].chunks[0]
    rec = [op for ops, _ in c.backward for op in ops if op.phase == "recompute"]
    assert {op.name.split(".")[-2] for op in rec} == {"scores", "softmax", "dropout", "context"}
    # Korthikanti et al. 2022: selective recompute costs the attention-core FLOPs 4·b·s²·h per layer
    s, h, L = GPT_SMALL["seq_length"], GPT_SMALL["hidden_size"], GPT_SMALL["num_layers"]
    rec_gemm = sum(op.flops * rep for ops, rep in c.backward for op in ops
                   if op.phase == "recompute" and op.kind == "matmul")
    assert rec_gemm == pytest.approx(4.0 * s * s * h * L, rel=1e-12)


@pytest.mark.parametrize("l,h,a,s,V", [(24, 2048, 16, 2048, 50304), (96, 12288, 96, 2048, 51200)])
def test_full_recompute_total_flops_match_narayanan_96_formula(l, h, a, s, V):
    model = {"arch": "gpt", "num_layers": l, "hidden_size": h, "num_attention_heads": a, "vocab_size": V,
             "seq_length": s}
    eg = compile_run(make_run(model, num_devices=1, recompute="full"))
    c = eg.stages[0].chunks[0]
    total = sum(op.flops * rep for ops, rep in c.forward + c.backward for op in ops if op.kind in GEMM_KINDS)
    # Narayanan et al. SC21 eq. (3): with activation recomputation the LM head is not recomputed
    expected = 96.0 * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert total == pytest.approx(expected, rel=1e-9)


# ----------------------------------------------------------------------------- pipeline schedules
def check_units(order, chunks: int, m: int):
    for kind in "FB":
        units = [(c, mb) for k, c, mb in order if k == kind]
        assert len(units) == chunks * m
        assert set(units) == {(c, mb) for c in range(chunks) for mb in range(m)}
    pos = {(k, c, mb): i for i, (k, c, mb) in enumerate(order)}
    for c in range(chunks):
        for mb in range(m):
            assert pos[("F", c, mb)] < pos[("B", c, mb)]


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (4, 8), (4, 2), (8, 8), (8, 32), (3, 7)])
def test_1f1b_schedule(p, m):
    for stage in range(p):
        order = schedule_1f1b(p, m, stage)
        check_units(order, 1, m)
        assert in_flight_microbatches(order) == min(p - stage, m)
        # micro-batches enter and leave in order
        assert [mb for k, _c, mb in order if k == "F"] == list(range(m))
        assert [mb for k, _c, mb in order if k == "B"] == list(range(m))


@pytest.mark.parametrize("m", [1, 4, 16])
def test_gpipe_schedule_keeps_all_microbatches(m):
    order = schedule_gpipe(m)
    check_units(order, 1, m)
    assert in_flight_microbatches(order) == m


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 4), (4, 2, 16), (8, 4, 8)])
def test_interleaved_schedule(p, v, m):
    for stage in range(p):
        order = schedule_interleaved(p, v, m, stage)
        check_units(order, v, m)
        # forwards of a micro-batch visit chunks in model order, backwards in reverse
        for mb in range(m):
            fs = [c for k, c, b in order if k == "F" and b == mb]
            bs = [c for k, c, b in order if k == "B" and b == mb]
            assert fs == list(range(v)) and bs == list(reversed(range(v)))


def test_compiled_schedule_matches_strategy():
    run = make_run(GPT_SMALL, num_devices=4, pp=4, global_batch_size=8)
    eg = compile_run(run)
    assert eg.num_microbatches == 8
    for st in eg.stages:
        assert st.schedule == schedule_1f1b(4, 8, st.index)
    run = make_run(GPT_SMALL, num_devices=4, pp=2, global_batch_size=8, pipeline_schedule="interleaved",
                   virtual_pipeline_stages=2)
    eg = compile_run(run)
    assert eg.num_microbatches == 4
    assert sum(c.num_layers for st in eg.stages for c in st.chunks) == GPT_SMALL["num_layers"]
    for st in eg.stages:
        assert [c.vstage for c in st.chunks] == [st.index, st.index + 2]


def test_uneven_layers_spare_the_first_and_last_stage():
    # Llama Team 2024 (arXiv 2407.21783) §3.3.2: Llama 3 405B's 126 layers on 16 pipeline ranks, one layer
    # fewer on the first and the last stage than on the 14 others (8 each)
    llama405 = dict(LLAMA_GQA, num_layers=126)
    for v in (1, 2):
        run = make_run(llama405, num_devices=16, pp=16, global_batch_size=32,
                       pipeline_schedule="interleaved" if v > 1 else "1f1b", virtual_pipeline_stages=v)
        layout = chunk_layout(run)
        per_rank = [sum(c.num_layers for c in layout[r::16]) for r in range(16)]
        assert per_rank == [7] + [8] * 14 + [7]
        # within a rank the spare layer goes to the chunk away from the embedding / LM head
        assert [layout[0].num_layers, layout[-1].num_layers] == ([7, 7] if v == 1 else [3, 3])
        eg = compile_run(run)
        assert [sum(c.num_layers for c in st.chunks) for st in eg.stages] == per_rank
    # layers that divide stay even; without interleaving the rule is the middle stages' (as before)
    assert layers_per_vstage(16, 4, 2) == [2] * 8
    assert layers_per_vstage(30, 4) == [7, 8, 8, 7]
    assert layers_per_vstage(18, 4, 2) == [2, 2, 3, 2, 2, 3, 2, 2]


# ----------------------------------------------------------------------------- group placement
@pytest.mark.parametrize("size,stride,dpn,expected", [
    (8, 1, 8, Group(8, 8)),  # tp=8 on 8-GPU nodes: one node
    (4, 1, 8, Group(4, 4)),
    (16, 8, 8, Group(16, 1)),  # dp across nodes after tp=8: one rank per node
    (8, 2, 8, Group(8, 4)),  # dp after tp=2: 4 ranks per node
    (64, 2, 8, Group(64, 4)),
    (2, 4, 8, Group(2, 2)),
    (1, 1, 8, Group(1, 1)),
])
def test_group_placement(size, stride, dpn, expected):
    g = group_placement(size, stride, dpn)
    assert g == expected
    assert g.nodes == size // g.per_node


def test_compiled_groups():
    run = make_run(GPT_SMALL, num_devices=32, tp=8, pp=1, dp=4)
    eg = compile_run(run)
    assert eg.tp_group == Group(8, 8)
    assert eg.dp_group == Group(4, 1) and eg.dp_group.nodes == 4
    run = make_run(GPT_SMALL, num_devices=16, tp=2, dp=8)
    eg = compile_run(run)
    assert eg.tp_group == Group(2, 2)
    assert eg.dp_group == Group(8, 4) and eg.dp_group.nodes == 2


# ----------------------------------------------------------------------------- embedding backward
def _table_ops(run) -> dict[str, float]:
    """Bytes of the table-sized backward ops of each stage's first chunk, by name."""
    out = {}
    for st in compile_run(run).stages:
        for ops, _rep in st.chunks[0].backward:
            out.update({f"{st.index}:{op.name}": op.bytes for op in ops if op.name.startswith("embedding.")
                        and not op.name.endswith(".bwd")})
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_embedding_backward_fills_the_local_table_and_adds_the_tied_head(tp):
    # the dense table gradient is zero-filled (one write of the local V/tp × h table) and, when the tied LM
    # head sits on the same rank, the head's weight gradient is added to it (two reads and one write)
    V, h = GPT_SMALL["vocab_size"], GPT_SMALL["hidden_size"]
    table = V / tp * h * 2  # bf16 weights
    one_stage = _table_ops(make_run(GPT_SMALL, num_devices=tp, tp=tp))
    assert one_stage == {"0:embedding.grad_zero": table, "0:embedding.tied_grad_add": 3 * table}
    # a pipeline puts the head on the last stage: its gradient is all-reduced with the first stage's, not added
    two_stages = _table_ops(make_run(GPT_SMALL, num_devices=2 * tp, tp=tp, pp=2, global_batch_size=4))
    assert two_stages == {"0:embedding.grad_zero": table}
    # an untied model (Llama) only fills; under autocast the table and its gradient are fp32
    V, h = LLAMA_GQA["vocab_size"], LLAMA_GQA["hidden_size"]
    assert _table_ops(make_run(LLAMA_GQA, num_devices=tp, tp=tp, mixed_precision="autocast")) == {
        "0:embedding.grad_zero": V / tp * h * 4}
