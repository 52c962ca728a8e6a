"""Eager element-wise chains (``strategy.fused_elementwise`` false): RoPE, SwiGLU, GPT-2's written-out GELU and
attention's scores without a fused kernel, as eager PyTorch runs them.

The traffic and kernel counts of the graph's eager ops are checked against what PyTorch itself executes for the
measure harness's own ``apply_rope`` and ``activate`` and for Hugging Face's eager attention expressions
(every non-view aten op of the forward and of the backward logged by a dispatch mode, with the bytes of its
tensor inputs and outputs), and the host's charge for them against the closed form of
:func:`learnedperf.cost.host_bound_s`.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import GPT_SMALL, KNOWN_PARAMS, LLAMA_GQA, MOE, make_run, roofline
from learnedperf.graph.execution import recompute_ops
from learnedperf.graph.transformer import (EAGER_GELU_NEW, EAGER_ROPE, EAGER_SOFTMAX, EAGER_SOFTMAX_CAUSAL,
                                           EAGER_SWIGLU, backward_of, layer_forward, shard_for)
from learnedperf.graph.ops import Group
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import layer_activation_bytes


def _ops(run):
    sh = shard_for(run, Group(1, 1), Group(1, 1), Group(1, 1))
    fwd = layer_forward(run.model, sh)
    return {op.name: op for op in fwd + backward_of(fwd)}


def _aten_traffic(fn, *inputs, grad_of=None):
    """(kernels, bytes) of the non-view aten ops ``fn(*inputs)`` runs, and of its backward (``torch.autograd.grad``
    of its output with respect to ``grad_of``, every input by default)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels = 0
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func.name() not in ("aten::detach", "aten::empty_like", "aten::zeros_like",
                                                        "aten::ones_like"):
                flat = list(args) + list((kwargs or {}).values()) + (list(out) if isinstance(out, (tuple, list))
                                                                      else [out])
                tensors = [t for t in flat if isinstance(t, torch.Tensor)]
                for a in args:
                    if isinstance(a, (tuple, list)):
                        tensors += [t for t in a if isinstance(t, torch.Tensor)]
                self.kernels += 1
                self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return out

    fwd = Log()
    with fwd:
        out = fn(*inputs)
    grad = torch.randn_like(out)
    bwd = Log()
    with bwd:
        torch.autograd.grad(out, grad_of or inputs, grad)
    return (fwd.kernels, fwd.bytes), (bwd.kernels, bwd.bytes)


def test_eager_rope_matches_the_kernels_pytorch_runs():
    pytest.importorskip("torch")
    import torch

    from learnedperf.measure.models import apply_rope, rope_tables

    b, heads, s, hd = 4, 8, 64, 32
    cos, sin = rope_tables(s, hd)
    x = torch.randn(b, heads, s, hd, requires_grad=True) * 1.0  # not a leaf: no gradient accumulation
    (kf, bf), (kb, bb) = _aten_traffic(lambda t: apply_rope(t, cos, sin), x)
    k_fwd, passes_fwd, k_bwd, passes_bwd = EAGER_ROPE
    n = x.numel() * 4
    assert (kf, kb) == (k_fwd, k_bwd)
    # the model leaves out the [s, hd] tables (here 1/32 of x, read by two products each way)
    table = 2 * s * hd * 4
    assert bf == pytest.approx(passes_fwd * n + table, rel=1e-9)
    assert bb == pytest.approx(passes_bwd * n + table, rel=1e-9)


def test_eager_swiglu_matches_the_kernels_pytorch_runs():
    pytest.importorskip("torch")
    import torch

    from learnedperf.measure.models import activate

    rows, width = 64, 48
    y = torch.randn(rows, 2 * width, requires_grad=True) * 1.0
    (kf, bf), (kb, bb) = _aten_traffic(lambda t: activate(t, "swiglu"), y)
    k_fwd, passes_fwd, k_bwd, passes_bwd = EAGER_SWIGLU
    n = rows * width * 4
    assert (kf, kb) == (k_fwd, k_bwd)
    assert (bf, bb) == (passes_fwd * n, passes_bwd * n)


def test_eager_gelu_new_matches_the_kernels_pytorch_runs():
    pytest.importorskip("torch")
    import torch

    from learnedperf.measure.models import activate

    rows, width = 64, 48
    y = torch.randn(rows, width, requires_grad=True) * 1.0
    (kf, bf), (kb, bb) = _aten_traffic(lambda t: activate(t, "gelu_new"), y)
    k_fwd, passes_fwd, k_bwd, passes_bwd = EAGER_GELU_NEW
    n = rows * width * 4
    assert (kf, kb) == (k_fwd, k_bwd)
    assert (bf, bb) == (passes_fwd * n, passes_bwd * n)
    # the same function as PyTorch's one-kernel tanh GELU
    assert torch.allclose(activate(y, "gelu_new"), activate(y, "gelu"), atol=1e-6)


def _hf_scores(causal: bool, b: int, s: int):
    """The scores between attention's two products as Hugging Face's eager attention computes them (transformers'
    GPT2Attention._attn: divide by a scalar tensor it creates, ``torch.where`` with the causal mask and a fill
    value it creates, softmax; BertSelfAttention: divide, add the extended padding mask, softmax). The masks exist
    before (GPT-2's is a buffer, BERT's is extended once per forward)."""
    import torch

    causal_mask = torch.tril(torch.ones(s, s, dtype=torch.bool))[None, None]
    padding = torch.zeros(b, 1, 1, s)

    def run(w):
        if causal:
            w = w / torch.full([], 8.0)
            w = torch.where(causal_mask, w, torch.full([], torch.finfo(w.dtype).min))
        else:
            w = w / 8.0 + padding
        return torch.softmax(w, dim=-1)
    return run


@pytest.mark.parametrize("causal", [True, False])
def test_eager_softmax_matches_the_kernels_pytorch_runs(causal):
    pytest.importorskip("torch")
    import torch

    b, heads, s = 2, 4, 64
    w = torch.randn(b, heads, s, s, requires_grad=True) * 1.0
    (kf, bf), (kb, bb) = _aten_traffic(_hf_scores(causal, b, s), w, grad_of=[w])
    k_fwd, passes_fwd, k_bwd, passes_bwd = EAGER_SOFTMAX_CAUSAL if causal else EAGER_SOFTMAX
    n = w.numel() * 4
    assert (kf, kb) == (k_fwd, k_bwd)
    # the model leaves out the masks (causal: a [s, s] bool read each way; padding: a [b, 1, 1, s] table) and
    # the causal path's 4-byte scalars (the scale and the fill value, at most 16 bytes)
    mask = s * s if causal else b * s * 4
    assert bf == pytest.approx(passes_fwd * n + mask, abs=16 if causal else 0)
    assert bb == pytest.approx(passes_bwd * n + (mask if causal else 0), abs=16 if causal else 0)


def test_graph_ops_of_an_eager_layer():
    fused = _ops(make_run(LLAMA_GQA, precision="bf16"))
    eager = _ops(make_run(LLAMA_GQA, precision="bf16", fused_elementwise=False))
    T, heads, kv, hd, f = 4096, 32, 8, 128, 14336
    n_rope, n_act = T * (heads + kv) * hd, T * f
    rope, act = eager["layer.attn.rope"], eager["layer.mlp.act"]
    assert (rope.bytes, rope.kernels, rope.chained) == (10 * n_rope * 2, 10, 9)
    assert (act.bytes, act.kernels, act.chained) == (5 * n_act * 2, 2, 1)
    rope_b, act_b = eager["layer.attn.rope.bwd"], eager["layer.mlp.act.bwd"]
    assert (rope_b.bytes, rope_b.kernels, rope_b.chained) == (10 * n_rope * 2, 10, 9)
    assert (act_b.bytes, act_b.kernels, act_b.chained) == (13 * n_act * 2, 4, 3)
    # fused: one kernel each, read and written once (SwiGLU reads both halves); backward twice that
    assert (fused["layer.attn.rope"].bytes, fused["layer.attn.rope"].kernels) == (2 * n_rope * 2, 1)
    assert (fused["layer.mlp.act"].bytes, fused["layer.mlp.act.bwd"].bytes) == (3 * n_act * 2, 6 * n_act * 2)
    # every other op is the same either way
    assert {k: v for k, v in fused.items() if ".rope" not in k and ".act" not in k} == \
        {k: v for k, v in eager.items() if ".rope" not in k and ".act" not in k}
    # a recomputed chain is the forward's again, its host charge included
    again = recompute_ops([rope], "full")[0]
    assert (again.bytes, again.kernels, again.chained) == (rope.bytes, rope.kernels, rope.chained)


def test_models_without_rope_or_gates_run_the_same_either_way():
    # with the fused attention kernel (flash_attention, the default), GELU and learned positions
    fused, eager = make_run(GPT_SMALL), make_run(GPT_SMALL, fused_elementwise=False)
    assert _ops(fused) == _ops(eager)
    assert simulate(eager, cost=roofline(eager)).iteration_time_s == \
        simulate(fused, cost=roofline(fused)).iteration_time_s


@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_attention_without_a_fused_kernel_runs_its_scores_apart_in_eager_pytorch(arch):
    model = {**GPT_SMALL, "arch": arch}
    kw = dict(precision="fp32", flash_attention=False)
    fused, eager = _ops(make_run(model, **kw)), _ops(make_run(model, fused_elementwise=False, **kw))
    b, heads, s = 1, GPT_SMALL["num_attention_heads"], GPT_SMALL["seq_length"]
    n = b * heads * s * s
    chain = EAGER_SOFTMAX_CAUSAL if arch == "gpt" else EAGER_SOFTMAX
    sm, sm_b = eager["layer.attn.softmax"], eager["layer.attn.softmax.bwd"]
    assert (sm.kind, sm.bytes, sm.kernels, sm.chained) == ("softmax", chain[1] * n * 4, chain[0], chain[0] - 1)
    assert (sm_b.bytes, sm_b.kernels, sm_b.chained) == (chain[3] * n * 4, chain[2], chain[2] - 1)
    # Megatron's fused scale-mask-softmax: one kernel reading and writing the scores
    assert (fused["layer.attn.softmax"].bytes, fused["layer.attn.softmax"].kernels) == (2 * n * 4, 1)
    assert {k: v for k, v in fused.items() if ".softmax" not in k} == \
        {k: v for k, v in eager.items() if ".softmax" not in k}


def test_gelu_new_is_a_chain_in_eager_pytorch_and_one_kernel_fused():
    model = {**GPT_SMALL, "activation": "gelu_new"}
    T, f = GPT_SMALL["seq_length"], 4 * GPT_SMALL["hidden_size"]
    eager = _ops(make_run(model, fused_elementwise=False))
    act, act_b = eager["layer.mlp.act"], eager["layer.mlp.act.bwd"]
    assert (act.bytes, act.kernels, act.chained) == (EAGER_GELU_NEW[1] * T * f * 2, 8, 7)
    assert (act_b.bytes, act_b.kernels, act_b.chained) == (EAGER_GELU_NEW[3] * T * f * 2, 11, 10)
    # fused, GPT-2's GELU is any GELU: one kernel
    assert _ops(make_run(model)) == _ops(make_run(GPT_SMALL))
    # eager, it saves tanh's output, 0.5·x and 1 + tanh besides its input (saved_tensors_hooks, below)
    eager_run = make_run(model, fused_elementwise=False)
    assert layer_activation_bytes(eager_run) - layer_activation_bytes(make_run(model)) == 3 * T * f * 2


def test_gelu_new_saves_four_tensors_of_its_input():
    pytest.importorskip("torch")
    import torch

    from learnedperf.measure.models import activate

    y = torch.randn(64, 48, requires_grad=True) * 1.0
    saved = {}

    def pack(t):
        saved[t.data_ptr()] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        activate(y, "gelu_new")
    assert sum(saved.values()) == 4 * y.numel() and y.data_ptr() in saved


def test_the_host_issues_chained_kernels_at_their_own_rate():
    # a host that takes 1 s a framework operator binds every block; the chained kernels of the eager chains,
    # per layer and micro-batch 9 + 1 forward (RoPE, SwiGLU) and 9 + 3 backward, cost eager_dispatch_us each
    kw = dict(global_batch_size=2, precision="bf16")
    fused, eager = make_run(LLAMA_GQA, **kw), make_run(LLAMA_GQA, fused_elementwise=False, **kw)

    def t(run, eager_us):
        p = replace(KNOWN_PARAMS, host_dispatch_us=1e6, eager_dispatch_us=eager_us)
        return simulate(run, cost=roofline(run, p), exact=True).iteration_time_s

    assert t(eager, 0.0) == pytest.approx(t(fused, 0.0), rel=1e-12)  # one framework dispatch per chain
    chained = 2 * LLAMA_GQA["num_layers"] * (9 + 1 + 9 + 3)  # micro-batches x layers x chained kernels
    assert t(eager, 1e6) - t(fused, 1e6) == pytest.approx(chained, rel=1e-9)
    # with experts one at a time, every expert runs its own chain
    moe = dict(num_devices=2, dp=2, ep=2, global_batch_size=4, overlap_grad_reduce=False, precision="bf16")
    grouped = make_run(MOE, fused_elementwise=False, **moe)
    loop = make_run(MOE, fused_elementwise=False, moe_grouped_gemm=False, **moe)
    local = MOE["num_experts"] // 2
    sh = shard_for(loop, Group(1, 1), Group(1, 1), Group(2, 2))
    act = next(op for op in layer_forward(loop.model, sh, True, "moe_layer") if op.name == "moe_layer.mlp.act")
    assert (act.kernels, act.chained, act.bwd[1], act.bwd[2]) == (2 * local, local, 4 * local, 3 * local)
    assert grouped.strategy.moe_grouped_gemm and not loop.strategy.moe_grouped_gemm


def test_eager_swiglu_saves_its_silu_output():
    kw = dict(precision="bf16", micro_batch_size=2)
    fused, eager = make_run(LLAMA_GQA, **kw), make_run(LLAMA_GQA, fused_elementwise=False, **kw)
    tokens = 2 * LLAMA_GQA["seq_length"]
    # silu(gate), and the QKV output's Q and K part that eager RoPE keeps alive (tests/test_optimizer_memory.py)
    m = LLAMA_GQA
    qk = m["hidden_size"] + m["num_kv_heads"] * m["hidden_size"] // m["num_attention_heads"]
    assert layer_activation_bytes(eager) - layer_activation_bytes(fused) == tokens * (m["ffn_hidden_size"] + qk) * 2
    gpt = make_run(GPT_SMALL, fused_elementwise=False)
    assert layer_activation_bytes(gpt) == layer_activation_bytes(make_run(GPT_SMALL))


def test_the_key_is_left_out_at_its_default_and_round_trips():
    from learnedperf.specs import RunSpec

    assert "fused_elementwise" not in make_run(LLAMA_GQA).to_dict()["strategy"]
    eager = make_run(LLAMA_GQA, fused_elementwise=False)
    assert eager.to_dict()["strategy"]["fused_elementwise"] is False
    assert RunSpec.from_dict(json.loads(json.dumps(eager.to_dict()))) == eager
    # the id of a measured record follows its run's JSON: a run written before the key keeps its id
    from learnedperf.measure.records import run_id

    plain = make_run(LLAMA_GQA).to_dict()
    before = json.loads(json.dumps(plain))
    before["strategy"].pop("fused_elementwise", None)
    assert run_id(plain) == run_id(before) != run_id(eager.to_dict())


def test_measure_writes_eager_steps_and_the_cli_flag():
    from learnedperf.cli import build_parser
    from learnedperf.measure.steps import StepConfig, run_dict

    from test_measure_steps import HARDWARE, LLAMA

    assert run_dict(StepConfig(LLAMA, 1, {}), HARDWARE)["strategy"]["fused_elementwise"] is False
    args = build_parser().parse_args(["simulate", "--model", "llama-3-8b", "--device", "H100-SXM5-80GB", "--eager"])
    assert args.fused_elementwise is False
