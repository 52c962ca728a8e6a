"""Saved activations of one transformer layer: what autograd keeps, measured, against the memory model.

The memory model (``learnedperf.simulate.memory.layer_activation_bytes``) counts the tensors Megatron-Core
keeps for the backward of one layer and one micro-batch. This script builds the step harness's layers
(``learnedperf.measure.models``: eager PyTorch, fp32, one rank), runs one forward under
``torch.autograd.graph.saved_tensors_hooks`` and adds up the distinct storages autograd saved, parameters
excluded (a view counts its whole storage once: what stays alive), and prints it next to the model.

The harness is not Megatron-Core: its eager SwiGLU keeps ``silu(gate)`` (Megatron's fused kernel recomputes
it), its MoE layer keeps the expert outputs times their weights besides the expert outputs, its attention keeps
the fused QKV output besides the rotated queries and keys, and its RMSNorm keeps its normalised input. So the
layer totals differ by those tensors, which the script computes from the shapes and prints as "harness
extra"; what it checks is that the model's count plus them is what autograd saved, for dense and MoE
layers, dropless and padded to a capacity, with top-2 and top-4 routing (exit status 1 if any layer is more
than 1 % off). GPT-style layers are not run: the model counts dropout masks the harness does not apply.
Usage::

    python experiments/activation_memory.py [--seq 256] [--batch 2] [--hidden 512]
"""

from __future__ import annotations

import argparse
import sys

from learnedperf.measure.models import (ParallelContext, TransformerLayer, expert_capacity, init_parameters,
                                        rope_tables)
from learnedperf.simulate.memory import layer_activation_bytes
from learnedperf.specs import RunSpec

MiB = 2 ** 20


def saved_bytes(fn, params) -> int:
    """Bytes of the distinct non-parameter storages autograd saves while ``fn()`` runs."""
    import torch

    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def harness_extra(run: RunSpec) -> float:
    """Bytes the harness's eager layer saves that Megatron-Core's fused kernels do not (fp32, tp 1).

    Attention: the QKV GEMM's output stays alive beside the rotated Q and K (RoPE builds new tensors), so its
    query and key part counts twice, and the rotations keep their cosine and sine tables (``s × head_dim``
    each). Each RMSNorm keeps its normalised input and its reciprocal root mean square beside its input.
    SwiGLU keeps ``silu(gate)`` over the rows it runs on. A MoE layer keeps
    its expert outputs times their weights (the scatter-add's input) beside the expert outputs.
    """
    m, s = run.model, run.strategy
    T, h, e = s.micro_batch_size * m.seq_length, m.hidden_size, 4
    extra = 0.0
    if m.position_embedding == "rope":
        extra += T * (m.attention_width + m.num_kv_heads * m.head_dim) * e + 2 * m.seq_length * m.head_dim * e
    if m.norm == "rmsnorm":
        extra += 2 * (T * h * e + T * 4)
    if m.is_moe:
        copies = T * m.moe_top_k  # dropped copies (capacity 1.0) are counted too: within 0.2 %
        rows = copies  # the rows the experts' activation runs on: every copy, or every expert's padded capacity
        if s.moe_capacity_factor is not None:
            rows = m.num_experts * expert_capacity(T, m.num_experts, m.moe_top_k, s.moe_capacity_factor)
        if m.activation == "swiglu":
            extra += rows * m.ffn_hidden_size * e
        extra += copies * h * e
        if m.moe_shared_ffn_hidden_size and m.activation == "swiglu":
            extra += T * m.moe_shared_ffn_hidden_size * e
    elif m.activation == "swiglu":
        extra += T * m.dense_ffn_hidden_size * e
    return extra


def measure(model: dict, batch: int, capacity: float | None) -> tuple[RunSpec, int]:
    """(run, saved bytes of one layer's forward) for the harness's layer of ``model``."""
    import torch

    strategy = {"precision": "fp32", "micro_batch_size": batch, "global_batch_size": batch}
    if capacity is not None:
        strategy["moe_capacity_factor"] = capacity
    run = RunSpec.from_dict({"model": model, "hardware": {"device": "A100-SXM4-80GB", "num_devices": 1},
                             "strategy": strategy})
    m = run.model
    layer = TransformerLayer(m, ParallelContext(), moe=m.is_moe, capacity_factor=capacity)
    init_parameters(layer)
    params = list(layer.parameters())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, m.seq_length, m.hidden_size, generator=gen, requires_grad=True)
    rope = rope_tables(m.seq_length, m.head_dim) if m.position_embedding == "rope" else None
    return run, saved_bytes(lambda: layer(x, rope), params)


def main(argv: list[str] | None = None) -> int:
    """Print measured and modelled saved activations per layer; exit 1 if any differs by more than 1 %."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    h = args.hidden
    base = dict(num_layers=2, hidden_size=h, num_attention_heads=h // 64, num_kv_heads=h // 64,
                ffn_hidden_size=(h * 11) // 4, vocab_size=1000, seq_length=args.seq)
    moe = dict(base, name="moe-8x2", arch="moe", num_experts=8, moe_top_k=2)
    cases = [("llama (dense)", dict(base, name="llama", arch="llama"), None),
             ("llama GQA 4 kv heads", dict(base, name="llama-gqa", arch="llama", num_kv_heads=4), None),
             ("MoE 8 experts top-2, dropless", moe, None),
             ("MoE 8 experts top-2, capacity 1.0", moe, 1.0),
             ("MoE 8 experts top-2, capacity 2.0", moe, 2.0),
             ("MoE 16 experts top-4, dropless", dict(moe, name="moe-16x4", num_experts=16, moe_top_k=4), None),
             ("MoE 8 top-2 + shared expert", dict(moe, name="moe-shared", moe_shared_ffn_hidden_size=h), None)]
    print(f"saved activations of one layer, fp32, micro-batch {args.batch} x {args.seq} tokens, hidden {h} (MiB)")
    print(f"{'layer':36s} {'measured':>9s} {'model':>8s} {'harness extra':>14s} {'model+extra':>12s} "
          f"{'ratio':>6s}")
    worst = 0.0
    for label, model, cap in cases:
        run, whole = measure(model, args.batch, cap)
        modelled, extra = layer_activation_bytes(run), harness_extra(run)
        ratio = whole / (modelled + extra)
        worst = max(worst, abs(ratio - 1))
        print(f"{label:36s} {whole / MiB:9.2f} {modelled / MiB:8.2f} {extra / MiB:14.2f} "
              f"{(modelled + extra) / MiB:12.2f} {ratio:6.3f}")
    print(f"largest |measured / (model + harness extra) - 1|: {100 * worst:.2f} %")
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
