"""Operator lists of transformer models: one layer, the embedding, the LM head, the optimizer.

Everything is expressed for one *shard*: ``b`` sequences of ``s`` local tokens,
weights split ``tp`` ways (Megatron tensor parallelism), optionally sequence
parallel. With ``tp = cp = 1`` these are the ops of the unsharded model; the
execution-graph compiler (:mod:`.execution`) calls them with the run's sharding
and inserts the collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..specs import ModelSpec, RunSpec
from ..units import dtype_bytes
from .ops import Group, Op, OpGraph, comm, elementwise, matmul


@dataclass(frozen=True)
class Shard:
    """How one rank sees a layer: micro-batch, local sequence, tensor/context split."""

    b: int
    s: int  # local query tokens per sequence (seq_length / cp)
    s_kv: int  # keys/values each query attends to (full sequence)
    tp: int = 1
    sp: bool = False
    dtype: str = "bf16"
    flash: bool = True
    tp_group: Group = Group(1, 1)
    cp_group: Group = Group(1, 1)
    ep_group: Group = Group(1, 1)
    ep: int = 1
    autocast: bool = False  # fp32 weights cast to ``dtype`` at every GEMM (torch.autocast)
    deepep: bool = False  # tokens dispatched once per rank and per node (Strategy.moe_dispatcher 'deepep')
    expert_load: float = 1.0  # the busiest expert's rows over the balanced share (Strategy.moe_capacity_factor)
    grouped_gemm: bool = True  # local experts' GEMMs in one kernel each, else one expert at a time (moe_grouped_gemm)
    fused_elementwise: bool = True  # RoPE, SwiGLU, gelu_new, scores: one kernel each, else eager chains
    forward_only: bool = False  # an inference or evaluation forward (Strategy.forward_only): dropout is the identity

    @property
    def e(self) -> int:
        """Bytes per activation element (fp8 runs keep activations in bf16)."""
        return max(2, dtype_bytes(self.dtype)) if self.dtype == "fp8" else dtype_bytes(self.dtype)

    @property
    def unquantised_dtype(self) -> str:
        """Dtype of the GEMMs an fp8 recipe leaves in bf16 (attention's products, the MoE router, the LM head:
        Transformer Engine's fp8 covers its Linear modules only), else the run's."""
        return "bf16" if self.dtype == "fp8" else self.dtype

    @property
    def e_res(self) -> int:
        """Bytes per element of the residual stream and of norm inputs and outputs: fp32 under autocast
        (norms run in fp32 and a bf16 branch added to an fp32 residual promotes to fp32), else ``e``."""
        return 4 if self.autocast else self.e

    @property
    def res_dtype(self) -> str:
        """Dtype of the residual stream and the norms (see :attr:`e_res`)."""
        return "fp32" if self.autocast else self.dtype

    @property
    def tokens(self) -> int:
        """Tokens one rank holds for a replicated tensor (b·s)."""
        return self.b * self.s


#: The strategy attributes :func:`shard_for` reads (besides the groups it is given): a cache of costs per shard
#: keys on them (``features.run.layer_cost``), so a field a shard gains is added here, once
SHARD_STRATEGY_KEYS = ("micro_batch_size", "cp", "tp", "sequence_parallel", "precision", "flash_attention", "ep",
                       "autocast", "moe_dispatcher", "expert_load", "moe_grouped_gemm",
                       "fused_elementwise", "forward_only")


def shard_for(run: RunSpec, tp_group: Group, cp_group: Group, ep_group: Group) -> Shard:
    """The :class:`Shard` of one micro-batch of ``run`` (it reads :data:`SHARD_STRATEGY_KEYS` of the strategy)."""
    s, m = run.strategy, run.model
    return Shard(b=s.micro_batch_size, s=m.seq_length // s.cp, s_kv=m.seq_length, tp=s.tp,
                 sp=s.sequence_parallel and s.tp > 1, dtype=s.precision, flash=s.flash_attention,
                 tp_group=tp_group, cp_group=cp_group, ep_group=ep_group, ep=s.ep, autocast=s.autocast,
                 deepep=s.moe_dispatcher == "deepep",
                 expert_load=s.expert_load, grouped_gemm=s.moe_grouped_gemm,
                 fused_elementwise=s.fused_elementwise, forward_only=s.forward_only)


#: Eager PyTorch's rotation of one tensor, ``x·cos + rotate_half(x)·sin`` (learnedperf measure's ``apply_rope``,
#: Hugging Face's ``apply_rotary_pos_emb``): (forward kernels, forward passes over the tensor, backward
#: kernels, backward passes), a pass being one element read or written. Forward: x·cos (1 read, 1 written),
#: the negated half (½, ½), the concatenation (1, 1), ·sin (1, 1), the sum (2, 1). Backward: grad·cos and
#: grad·sin (1, 1 each), the negation's gradient (½, ½), the halves' gradients concatenated (1, 1) and the two
#: gradients of x summed (2, 1): what PyTorch runs for that expression (its non-view aten ops, logged by
#: tests/test_eager_elementwise.py), the small [s, d] tables left out.
EAGER_ROPE = (5, 10.0, 5, 10.0)
#: Eager SwiGLU, ``silu(gate) · up`` over the ``width`` elements of each half, the same way: forward silu
#: (1, 1) and the product (2, 1); backward the product's two gradients (2, 1 each), silu's (2, 1) and the
#: halves' gradients concatenated into the up projection's output gradient (2, 2) (logged the same way).
EAGER_SWIGLU = (2, 5.0, 4, 13.0)
#: Eager GELU's tanh approximation as Hugging Face's ``NewGELUActivation`` (``gelu_new``: GPT-2, GPT-Neo, the
#: NeuSight GPT-3 configs) writes it, ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, over the ``width`` elements
#: of the up projection's output: forward pow, three scalar products, two sums, tanh and the final product
#: (eight kernels: 18 passes); backward eleven kernels, 28 passes (logged the same way). ``gelu`` (PyTorch's
#: F.gelu, exact or ``approximate="tanh"``) is one kernel either way.
EAGER_GELU_NEW = (8, 18.0, 11, 28.0)
#: Eager attention's scores between the two products, as Hugging Face's eager attention runs them when no fused
#: kernel does (``flash_attention`` and ``fused_elementwise`` false): a causal decoder's (GPT-2's) scaling and
#: ``torch.where`` with the causal mask (with the two scalars it makes with torch.full) and softmax, forward five
#: kernels and 6 passes over the s² scores, backward four and 7; an encoder's (BERT's) scaling, additive padding
#: mask and softmax, three and 6, backward two and 5 (its mask takes no gradient). NeuSight's traced GPT-2 and
#: BERT blocks hold these kernels (tests/test_hf_eager_runs.py). Megatron's fused scale-mask-softmax reads and
#: writes the scores once.
EAGER_SOFTMAX_CAUSAL = (5, 6.0, 4, 7.0)
EAGER_SOFTMAX = (3, 6.0, 2, 5.0)


def _eager_chain(name: str, sh: Shard, numel: float, cols: int, flops_per_element: float, chain: tuple,
                 copies: int = 1, kind: str = "elementwise") -> Op:
    """One element-wise op (of ``kind``) standing for eager PyTorch's ``chain`` (:data:`EAGER_ROPE`,
    :data:`EAGER_SWIGLU`, :data:`EAGER_GELU_NEW`, :data:`EAGER_SOFTMAX_CAUSAL`, :data:`EAGER_SOFTMAX`) run
    ``copies`` times over ``numel`` elements (rows of ``cols``): its kernels and passes, forward and backward.
    The first kernel costs the host a framework-level dispatch, as the fused kernel does; the rest are bare
    tensor operations (``Op.chained``)."""
    k_fwd, passes_fwd, k_bwd, passes_bwd = chain
    return Op(name, kind, "fwd", flops_per_element * numel, passes_fwd * numel * sh.e, sh.dtype,
              (int(numel // cols), cols), kernels=k_fwd * copies, chained=k_fwd * copies - 1,
              bwd=(passes_bwd * numel * sh.e, k_bwd * copies, k_bwd * copies - 1))


def rope_op(name: str, sh: Shard, numel: float, cols: int, tensors: int = 2) -> Op:
    """Rotary position embeddings over ``numel`` elements of ``tensors`` tensors (queries and keys), rows of
    ``cols``: one fused kernel reading and writing them once (Megatron-Core's apply_rope_fusion), or eager
    PyTorch's chain (:data:`EAGER_ROPE` per tensor) when ``sh.fused_elementwise`` is false."""
    if sh.fused_elementwise:
        return elementwise(name, "elementwise", "fwd", numel, 1, 1, sh.e, sh.dtype, 3.0, cols)
    return _eager_chain(name, sh, numel, cols, 3.0, EAGER_ROPE, tensors)


#: The activations eager PyTorch runs as a chain of tensor operations, and their chains.
_EAGER_ACTIVATIONS = {"swiglu": EAGER_SWIGLU, "gelu_new": EAGER_GELU_NEW}


def activation_op(name: str, sh: Shard, numel: float, cols: int, activation: str) -> Op:
    """The MLP's ``activation`` (``ModelSpec.activation``) over ``numel`` output elements (rows of ``cols``):
    one kernel, reading the up projection's output (both halves when gated, ``swiglu``) and writing its own;
    under eager PyTorch (``sh.fused_elementwise`` false) SwiGLU runs :data:`EAGER_SWIGLU`'s chain instead and
    the written-out ``gelu_new`` :data:`EAGER_GELU_NEW`'s."""
    chain = None if sh.fused_elementwise else _EAGER_ACTIVATIONS.get(activation)
    if chain is None:
        gated = activation == "swiglu"
        return elementwise(name, "elementwise", "fwd", numel, 2 if gated else 1, 1, sh.e, sh.dtype, 8.0, cols)
    return _eager_chain(name, sh, numel, cols, 8.0, chain)


def expert_alltoall(name: str, model: ModelSpec, sh: Shard, tokens: int, row_bytes: int, dtype: str) -> list[Op]:
    """The all-to-all(s) that carry a rank's ``tokens`` rows of ``row_bytes`` to their experts' ranks (or back).

    Megatron-Core's alltoall dispatcher sends each of a token's ``moe_top_k`` copies to its expert's rank: one
    all-to-all over the expert-parallel group. DeepEP (``sh.deepep``) sends a token once to each rank holding
    any of its experts; across nodes, once to each node, over the network between ranks of the same local
    index (an all-to-all of one rank per node), then over NVLink to that node's ranks (DeepSeek-AI 2024,
    arXiv 2412.19437, section 3.2.2). Its volumes are the expected numbers of distinct ranks and nodes a
    token's experts lie on (:meth:`ModelSpec.expected_parts_per_token`: uniform, group-limited routing); an
    all-to-all of ``n`` ranks moves ``(n-1)/n`` of its buffer off the rank, which is by symmetry the share of
    a token's ranks (or nodes) that are not the sender's. An expert load above balance (``sh.expert_load``)
    scales every volume: capacity-padded buffers are sent whole, and without padding the all-to-all ends when
    the busiest rank has received its share.
    """
    g = sh.ep_group
    if sh.expert_load != 1.0:
        row_bytes = row_bytes * sh.expert_load
    if not sh.deepep:
        return [comm(name, "alltoall", "fwd", tokens * model.moe_top_k * row_bytes, g, dtype)]
    ranks = model.expected_parts_per_token(g.size)
    if g.nodes == 1:
        return [comm(name, "alltoall", "fwd", tokens * ranks * row_bytes, g, dtype)]
    nodes = model.expected_parts_per_token(g.nodes)
    return [comm(f"{name}.rdma", "alltoall", "fwd", tokens * nodes * row_bytes, Group(g.nodes, 1), dtype),
            comm(f"{name}.nvlink", "alltoall", "fwd", tokens * ranks * row_bytes, Group(g.per_node, g.per_node),
                 dtype)]


def cast(name: str, phase: str, numel: float, src_bytes: int, dst_bytes: int, dtype: str) -> Op:
    """A dtype conversion of ``numel`` elements (reads ``src_bytes``, writes ``dst_bytes`` each).

    Named ``*.cast``: its backward converts the gradient back with the same traffic
    (:func:`backward_of`), not the two passes of other memory-bound ops. The forward cast is ``host_free``:
    torch.autocast converts an op's inputs inside that op's own call (the autocast dispatch key), so its
    kernel rides on a call the framework makes anyway. The backward is an autograd node of its own
    (``ToCopyBackward0``), charged like every other backward kernel.
    """
    return Op(f"{name}.cast", "elementwise", phase, float(numel), float(numel * (src_bytes + dst_bytes)), dtype,
              (int(numel), 1), host_free=True)


def _autocast_gemm(ops: list[Op], sh: Shard, name: str, weights: float, inputs: float = 0.0) -> None:
    """Under autocast, the casts before a GEMM: its fp32 weight (``weights`` elements, once per forward:
    autocast caches the copy for the rest of the forward) and, when it comes from the fp32 residual
    stream or a norm, its input (``inputs`` elements)."""
    if not sh.autocast:
        return
    ops.append(cast(f"{name}.weight", "fwd", weights, 4, sh.e, sh.dtype))
    if inputs:
        ops.append(cast(f"{name}.input", "fwd", inputs, 4, sh.e, sh.dtype))


def _fp8_cast(ops: list[Op], sh: Shard, name: str, numel: float, fused: bool) -> None:
    """In an fp8 run, the quantisation of a GEMM's ``numel``-element bf16 input before the GEMM.

    Transformer Engine's ``cast_transpose`` reads the bf16 tensor (2 bytes an element) and writes its fp8
    copy and the fp8 transpose the weight-gradient GEMM takes (1 + 1), its amax fused in. Where a norm or
    an activation produces the input (``fused``), TE's kernel writes fp8 itself and only the transpose is
    left (1 byte read, 1 written). Named ``*.fp8_cast``: its gradient passes straight through
    (:func:`backward_of` adds no op); the output gradient's own cast is the GEMM's backward's.
    """
    if sh.dtype == "fp8":
        ops.append(Op(f"{name}.fp8_cast", "elementwise", "fwd", float(numel), float(numel * (2 if fused else 4)),
                      "fp8", (int(numel), 1)))


def runs_dropout(model: ModelSpec, forward_only: bool) -> bool:
    """Whether ``model``'s layers run dropout (attention probabilities, the two residual branches): GPT- and
    BERT-style models train with it (Megatron's and Hugging Face's defaults), the others without; an inference
    or evaluation forward (``forward_only``) runs in eval mode, where dropout is the identity (no kernel, no
    mask). The graph's kernels and the memory model's saved tensors both read it."""
    return model.arch in ("gpt", "bert") and not forward_only


def layer_forward(model: ModelSpec, sh: Shard, moe: bool = False, prefix: str = "layer") -> list[Op]:
    """Forward ops of one transformer layer on one rank, TP/SP/CP/EP collectives included."""
    h, hd, t, e, dt = model.hidden_size, model.head_dim, sh.tp, sh.e, sh.dtype
    er, rdt = sh.e_res, sh.res_dtype  # residual stream and norms (fp32 under autocast)
    # an fp8 recipe runs the layers' linear layers in fp8, attention's products and the router in bf16
    # (Megatron-Core's router is a plain linear)
    hdt = sh.unquantised_dtype
    a_local = model.num_attention_heads // t
    kv_local = max(1, model.num_kv_heads // t)
    T = sh.tokens
    T_norm = T // t if sh.sp else T  # tokens a rank normalises (sequence parallel splits them)
    act_nbytes = T * h * e
    ops: list[Op] = []
    norm = model.norm
    dropout = runs_dropout(model, sh.forward_only)

    def linear(name: str, m: int, n: int, k: int, inputs: float = 0.0, fused: bool = True, batch: int = 1) -> None:
        # one linear layer: autocast's casts of its fp32 weight and (``inputs`` elements) input, an fp8 run's
        # cast of its input (``fused``: written by a norm or an activation), then the GEMM
        _autocast_gemm(ops, sh, name, batch * k * n, inputs)
        _fp8_cast(ops, sh, name, batch * m * k, fused)
        ops.append(matmul(name, "fwd", m, n, k, dt, e, batch=batch))

    def tp_in(tag: str) -> None:
        # entering a column-parallel block: identity (no SP) or all-gather of the sequence shards (SP)
        if t > 1 and sh.sp:
            ops.append(comm(f"{prefix}.{tag}.sp_allgather", "allgather", "fwd", act_nbytes, sh.tp_group, dt))

    def tp_out(tag: str) -> None:
        # leaving a row-parallel block: all-reduce of partial sums, or reduce-scatter with SP
        if t > 1:
            kind = "reducescatter" if sh.sp else "allreduce"
            ops.append(comm(f"{prefix}.{tag}.tp_{kind}", kind, "fwd", act_nbytes, sh.tp_group, dt))

    # --- attention block
    ops.append(elementwise(f"{prefix}.attn.{norm}", norm, "fwd", T_norm * h, 1, 1, er, rdt, 5.0, h))
    tp_in("attn")
    vd = model.v_head_dim  # head_dim unless latent attention sets it apart
    if model.is_mla:
        # multi-head latent attention (DeepSeek-V2 report, arXiv 2405.04434, section 2.1): the down projections
        # and their norms run whole on every tensor-parallel rank (Megatron-Core duplicates them), the up
        # projections are column-parallel over the heads
        # (keys and values are up-projected for every head: ModelSpec holds num_kv_heads = heads, so kv_local
        # is a_local); every projection reads a norm's output, the down projections the fp32 residual's
        q_lora, kv_lora, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        if q_lora:
            linear(f"{prefix}.attn.q_down", T, q_lora, h, T * h)
            ops.append(elementwise(f"{prefix}.attn.q_norm", norm, "fwd", T * q_lora, 1, 1, e, dt, 5.0, q_lora))
            linear(f"{prefix}.attn.q_up", T, a_local * hd, q_lora)
        else:
            linear(f"{prefix}.attn.q", T, a_local * hd, h, T * h)
        linear(f"{prefix}.attn.kv_down", T, kv_lora + rope, h, T * h)
        ops.append(elementwise(f"{prefix}.attn.kv_norm", norm, "fwd", T * kv_lora, 1, 1, e, dt, 5.0, kv_lora))
        linear(f"{prefix}.attn.kv_up", T, a_local * (hd - rope + vd), kv_lora)
        if rope:
            # rotary positions on each query head's rotary part and on the one rotary key a token shares
            ops.append(rope_op(f"{prefix}.attn.rope", sh, T * (a_local + 1) * rope, rope))
    else:
        qkv_out = (a_local + 2 * kv_local) * hd
        linear(f"{prefix}.attn.qkv", T, qkv_out, h, T * h)
        if model.position_embedding == "rope":
            ops.append(rope_op(f"{prefix}.attn.rope", sh, T * (a_local + kv_local) * hd, hd))
    if sh.cp_group.size > 1:
        # ring attention: each rank receives the K and V shards of the other cp-1 ranks
        kv_bytes = sh.b * sh.s * kv_local * (hd + vd) * e * (sh.cp_group.size - 1)
        ops.append(comm(f"{prefix}.attn.cp_kv", "p2p", "fwd", kv_bytes, sh.cp_group, dt))
    causal = model.causal
    if sh.flash:
        # scores over head_dim, context over v_head_dim: as a kernel of head width (head_dim + v_head_dim) / 2
        flops = 2.0 * sh.b * a_local * sh.s * sh.s_kv * (hd + vd)
        nbytes = (sh.b * sh.s * a_local * (hd + vd) + sh.b * sh.s_kv * kv_local * (hd + vd)) * e
        ops.append(Op(f"{prefix}.attn.core", "attention", "fwd", flops, float(nbytes), dt,
                      (sh.b, a_local, sh.s, sh.s_kv, (hd + vd) // 2), None, causal))
    else:
        bh = sh.b * a_local
        ops.append(matmul(f"{prefix}.attn.scores", "fwd", sh.s, sh.s_kv, hd, hdt, e, batch=bh))
        scores = bh * sh.s * sh.s_kv
        if sh.fused_elementwise:
            # Megatron's fused scale-mask-softmax reads and writes the s² scores once
            ops.append(elementwise(f"{prefix}.attn.softmax", "softmax", "fwd", scores, 1, 1, e, dt, 5.0, sh.s_kv))
        else:
            ops.append(_eager_chain(f"{prefix}.attn.softmax", sh, scores, sh.s_kv, 5.0,
                                    EAGER_SOFTMAX_CAUSAL if causal else EAGER_SOFTMAX, kind="softmax"))
        if dropout:
            ops.append(elementwise(f"{prefix}.attn.dropout", "elementwise", "fwd", scores, 1, 1, e, dt, 2.0,
                                   sh.s_kv))
        ops.append(matmul(f"{prefix}.attn.context", "fwd", sh.s, vd, sh.s_kv, hdt, e, batch=bh))
    linear(f"{prefix}.attn.proj", T, h, a_local * vd, fused=False)  # attention's bf16 output
    tp_out("attn")
    ops.append(elementwise(f"{prefix}.attn.residual", "elementwise", "fwd", T_norm * h, 2, 1, er, rdt, 2.0, h))
    # --- MLP block
    ops.append(elementwise(f"{prefix}.mlp.{norm}", norm, "fwd", T_norm * h, 1, 1, er, rdt, 5.0, h))
    tp_in("mlp")
    gated = model.activation == "swiglu"

    def dense_mlp(tag: str, width: int) -> None:
        # a column-parallel up projection (gate and up together when gated), the activation, a row-parallel down
        w_local = width // t
        w_up = w_local * (2 if gated else 1)
        linear(f"{prefix}.{tag}.fc1", T, w_up, h, T * h)
        ops.append(activation_op(f"{prefix}.{tag}.act", sh, T * w_local, w_local, model.activation))
        linear(f"{prefix}.{tag}.fc2", T, h, w_local)

    if moe:
        f_local = model.ffn_hidden_size // t
        up = f_local * (2 if gated else 1)
        E, k = model.num_experts, model.moe_top_k
        _autocast_gemm(ops, sh, f"{prefix}.moe.router", h * E, T * h)
        ops.append(matmul(f"{prefix}.moe.router", "fwd", T, E, h, hdt, e))
        ops.append(elementwise(f"{prefix}.moe.topk", "softmax", "fwd", T * E, 1, 1, 4, "fp32", 5.0, E))
        routed = T * k  # token copies this rank sends out and (balanced) receives back
        local_experts = E // sh.ep
        # the rows the permutations move: every copy, or every expert's capacity (padding rows are written too)
        moved = routed * sh.expert_load
        # token permutation (Megatron-Core's moe_utils.permute): the copies gathered into expert order, one
        # row read and one written each (index_select); with expert parallelism the received rows are
        # regrouped from source-rank to local-expert order (sort_chunks_by_idxs) when a rank holds several.
        # DeepEP (Megatron-Core's flex dispatcher) sends the unpermuted tokens and permutes the received ones
        # once into local-expert order: the same rows moved, and no regrouping
        regroup = sh.ep > 1 and local_experts > 1 and not sh.deepep
        ops.append(elementwise(f"{prefix}.moe.permute", "elementwise", "fwd", moved * h, 1, 1, e, dt, 0.0, h))
        if sh.ep > 1:
            ops.extend(expert_alltoall(f"{prefix}.moe.dispatch", model, sh, T, h * e, dt))
            if regroup:
                ops.append(elementwise(f"{prefix}.moe.sort_chunks", "elementwise", "fwd", moved * h, 1, 1, e, dt,
                                       0.0, h))
        rows = max(1, routed // local_experts)  # tokens per local expert (balanced routing)
        expert_rows = routed  # rows through this rank's experts
        if sh.expert_load != 1.0:
            # the busiest rank's experts: a capacity-padded expert's rows, or a dropless router's largest load;
            # the whole layer waits for it (Megatron-Core's get_capacity: ceil(tokens·k/E · factor))
            rows = max(1, math.ceil(routed * sh.expert_load / local_experts))
            expert_rows = rows * local_experts
        # the router already cast the tokens for autocast: only the expert weights are new; fp8 casts the
        # dispatched tokens whole
        expert_mlp = len(ops)
        linear(f"{prefix}.mlp.fc1", rows, up, h, fused=False, batch=local_experts)
        ops.append(activation_op(f"{prefix}.mlp.act", sh, expert_rows * f_local, f_local, model.activation))
        linear(f"{prefix}.mlp.fc2", rows, h, f_local, batch=local_experts)
        if not sh.grouped_gemm and local_experts > 1:
            # one expert at a time: the same work, launched once per local expert (the device time is costed
            # as the grouped ops'; the host issues every launch)
            ops[expert_mlp:] = [replace(op, kernels=op.kernels * local_experts, chained=op.chained * local_experts,
                                        bwd=None if op.bwd is None else
                                        (op.bwd[0], op.bwd[1] * local_experts, op.bwd[2] * local_experts))
                                for op in ops[expert_mlp:]]
        if sh.ep > 1:
            if regroup:
                ops.append(elementwise(f"{prefix}.moe.unsort_chunks", "elementwise", "fwd", moved * h, 1, 1, e, dt,
                                       0.0, h))
            ops.extend(expert_alltoall(f"{prefix}.moe.combine", model, sh, T, h * e, dt))
        ops.append(elementwise(f"{prefix}.moe.weighted_sum", "elementwise", "fwd", routed * h, 1, 1, e, dt, 2.0, h))
        # unpermutation (moe_utils.unpermute): the weighted copies scatter-added back into token order, into
        # a zero-filled output of the rank's T rows: each moved row read once, each output row written by the
        # fill and read and written by the additions
        ops.append(Op(f"{prefix}.moe.unpermute", "elementwise", "fwd", moved * h, float((moved + 3 * T) * h * e), dt,
                      (int(moved), h)))
        if model.moe_shared_ffn_hidden_size:
            # shared experts: a dense MLP over the rank's own tokens, tensor-parallel, never dispatched
            dense_mlp("moe.shared", model.moe_shared_ffn_hidden_size)
    else:
        dense_mlp("mlp", model.dense_ffn_hidden_size)
    tp_out("mlp")
    ops.append(elementwise(f"{prefix}.mlp.residual", "elementwise", "fwd", T_norm * h, 2, 1, er, rdt, 2.0, h))
    return ops


def backward_of(fwd: list[Op]) -> list[Op]:
    """Backward ops of a forward op list, in reverse order.

    A GEMM becomes two GEMMs of equal FLOPs (input gradient and weight gradient);
    attention backward does twice the forward FLOPs; a memory-bound op reads the
    output gradient and its saved input and writes the input gradient (twice the
    forward traffic; an op that states its backward's traffic and kernels, an eager chain, has those).
    The collective at a TP boundary has its conjugate in
    backward: an all-reduce stays an all-reduce (moved to the block's input),
    all-gather and reduce-scatter swap, and SP re-gathers its input for the
    weight gradient (Megatron ``sequence_parallel``).
    """
    out: list[Op] = []
    for op in reversed(fwd):
        name = op.name
        if name.endswith(".fp8_cast"):
            continue  # a quantisation's gradient passes straight through
        if op.kind == "matmul":
            b, m, n, k = op.shape
            e = op.bytes / max(1, b * (m * k + k * n + m * n))
            if op.dtype == "fp8":
                # the output gradient's cast_transpose to fp8 (2 bytes read, 1 + 1 written), for both GEMMs
                out.append(Op(f"{name}.grad_fp8_cast", "elementwise", "bwd", float(b * m * n), float(b * m * n * 4),
                              "fp8", (b * m * n, 1), kernels=op.kernels))
            out.append(Op(f"{name}.dgrad", "matmul", "bwd", op.flops, float(b * (m * n + n * k + m * k) * e),
                          op.dtype, (b, m, k, n), kernels=op.kernels))
            out.append(Op(f"{name}.wgrad", "matmul", "bwd", op.flops, float(b * (m * k + m * n + k * n) * e),
                          op.dtype, (b, k, n, m), kernels=op.kernels))
        elif op.kind == "attention":
            out.append(Op(f"{name}.bwd", "attention", "bwd", 2.0 * op.flops, 2.0 * op.bytes, op.dtype, op.shape,
                          None, op.causal, op.kernels))
        elif op.kind == "allgather":
            out.append(Op(f"{name}.bwd", "reducescatter", "bwd", 0.0, op.bytes, op.dtype, (), op.group))
            out.append(Op(f"{name}.regather", "allgather", "bwd", 0.0, op.bytes, op.dtype, (), op.group))
        elif op.kind == "reducescatter":
            out.append(Op(f"{name}.bwd", "allgather", "bwd", 0.0, op.bytes, op.dtype, (), op.group))
        elif op.kind in ("allreduce", "alltoall", "p2p"):
            out.append(Op(f"{name}.bwd", op.kind, "bwd", 0.0, op.bytes, op.dtype, (), op.group))
        elif name.endswith(".cast"):
            # the gradient of a cast is the reverse cast of the same number of elements
            out.append(Op(f"{name}.bwd", op.kind, "bwd", op.flops, op.bytes, op.dtype, op.shape, kernels=op.kernels))
        else:
            nbytes, kernels, chained = (op.bytes * 2.0, op.kernels, op.chained) if op.bwd is None else op.bwd
            out.append(Op(f"{name}.bwd", op.kind, "bwd", op.flops * 2.0, nbytes, op.dtype, op.shape,
                          kernels=kernels, chained=chained))
    return out


def embedding_forward(model: ModelSpec, sh: Shard) -> list[Op]:
    """Token (and position) embedding lookup on the first pipeline stage."""
    # the table is a weight: fp32 under autocast (embedding is not an autocast op), like the residual stream
    h, e, dt, T = model.hidden_size, sh.e_res, sh.res_dtype, sh.tokens
    ops = [Op("embedding.lookup", "embedding", "fwd", 0.0, float(T * h * e + T * 8), dt, (T, h))]
    if model.position_embedding == "learned":
        ops.append(elementwise("embedding.position_add", "elementwise", "fwd", T * h, 2, 1, e, dt, 1.0, h))
    if sh.tp > 1:
        # vocab-parallel embedding: each rank holds V/tp rows, partial results are summed
        kind = "reducescatter" if sh.sp else "allreduce"
        ops.append(comm(f"embedding.tp_{kind}", kind, "fwd", T * h * e, sh.tp_group, dt))
    return ops


def embedding_backward(model: ModelSpec, sh: Shard, tied_here: bool) -> list[Op]:
    """Backward of :func:`embedding_forward`, with the work sized by the (vocabulary-parallel) table.

    The lookup's backward scatters the output gradient into a dense table gradient that is first
    zero-filled (PyTorch's ``embedding_dense_backward``, which Megatron's embedding also runs), and
    when the LM head shares the table on this rank (``tied_here``) autograd adds the head's weight
    gradient to it. Both passes cover the whole local table, whatever the batch, which makes them
    visible on models with a large vocabulary and few layers.
    """
    h, e, dt = model.hidden_size, sh.e_res, sh.res_dtype  # the table's dtype (fp32 under autocast)
    numel = -(-model.vocab_size // sh.tp) * h
    ops = backward_of(embedding_forward(model, sh))
    ops.append(elementwise("embedding.grad_zero", "elementwise", "bwd", numel, 0, 1, e, dt, 0.0, h))
    if tied_here:
        ops.append(elementwise("embedding.tied_grad_add", "elementwise", "bwd", numel, 2, 1, e, dt, 1.0, h))
    return ops


def head_forward(model: ModelSpec, sh: Shard) -> list[Op]:
    """Final norm, LM head GEMM and (vocab-parallel) cross-entropy on the last stage; a classification head
    (``model.lm_head`` false) instead runs its pooler, an h×h GEMM over each sequence's first token (its
    tanh, classifier and loss over a few labels are left out: a kernel of a few thousand elements each)."""
    h, e, T, t = model.hidden_size, sh.e, sh.tokens, sh.tp
    # the output layer stays bf16 in fp8 recipes (Megatron-Core's output_layer is no Transformer Engine
    # module; torchtitan's float8 conversion skips "output")
    dt = sh.unquantised_dtype
    v_local = -(-model.vocab_size // t)
    T_norm = T // t if sh.sp else T
    ops = [elementwise(f"head.{model.norm}", model.norm, "fwd", T_norm * h, 1, 1, sh.e_res, sh.res_dtype, 5.0, h)]
    if t > 1 and sh.sp:
        ops.append(comm("head.sp_allgather", "allgather", "fwd", T * h * sh.e_res, sh.tp_group, sh.res_dtype))
    if not model.lm_head:
        _autocast_gemm(ops, sh, "head.pooler", h * h, sh.b * h)
        ops.append(matmul("head.pooler", "fwd", sh.b, h, h, dt, e))
        return ops
    _autocast_gemm(ops, sh, "head.logits", v_local * h, T * h)
    ops.append(matmul("head.logits", "fwd", T, v_local, h, dt, e))
    if sh.autocast:
        # cross_entropy is on autocast's fp32 list: the low-precision logits are cast up first
        ops.append(cast("head.logits_fp32", "fwd", T * v_local, e, 4, "fp32"))
    # cross-entropy in fp32: max, exp-sum and gather passes over the local logits
    ops.append(elementwise("head.cross_entropy", "cross_entropy", "fwd", T * v_local, 2, 1, 4, "fp32", 5.0,
                           v_local))
    if t > 1:
        ops.append(comm("head.ce_allreduce", "allreduce", "fwd", T * 4 * 3, sh.tp_group, "fp32"))
    return ops


def optimizer_ops(params: float, optimizer: str, precision: str, impl: str = "fused") -> list[Op]:
    """Optimizer step over ``params`` local parameters (memory bound).

    Fused Adam (``impl`` ``"fused"``) with fp32 master weights (mixed precision) reads weight, gradient and
    two moments and writes weight, moments and the low-precision copy; torch.optim's ``"foreach"`` and
    ``"for_loop"`` Adam run the update as seven tensor operations, each streaming its own operands. The
    gradient-norm pass for clipping reads the gradients once more. ``"none"`` (an iteration timed
    without its optimizer step) has no op.
    """
    if optimizer == "none":
        return []
    fp8 = precision == "fp8"
    if optimizer == "adam":
        # the low-precision copy: fp8 runs keep bf16 weights
        copy = 2 if fp8 else dtype_bytes(precision) if precision not in ("fp32", "tf32") else 0
        # fused: one pass reading weight, gradient and both moments (16 B) and writing weight and moments (12 B).
        # torch.optim's foreach and for-loop Adam (torch/optim/adam.py, _multi_tensor_adam and _single_tensor_adam)
        # stream each operation's tensors: lerp_ of the first moment toward the gradient (12 B), mul_ and addcmul_
        # of the second moment (8 + 12: addcmul_ reads the gradient twice, the second read from cache), its sqrt
        # into a new tensor, div_ and add_ of eps on it (8 + 8 + 8) and addcdiv_ of the weight (16): 72 B
        update = 28 if impl == "fused" else 72
        per_param = update + copy + 4
        flops = 12.0
    else:
        per_param = 4 * 3 + 4
        flops = 2.0
    if fp8:
        # each weight is cast to fp8 once a step: the first micro-batch's cast_transpose, which Transformer
        # Engine caches for the others (2 bytes read, 1 + 1 written)
        per_param += 4
    # named after the optimizer: a device with a measured step rate per optimizer is costed on it
    return [Op(f"optimizer.{optimizer}", "optimizer", "opt", flops * params, float(per_param * params), "fp32",
               (int(params), 1))]


def operator_graph(model: ModelSpec, batch: int = 1, precision: str = "bf16", flash: bool = True,
                   optimizer: str = "adam", autocast: bool = False) -> OpGraph:
    """The full operator graph of one training step of an unsharded model.

    Identical layers are one block of ops with ``repeat = num_layers`` (dense and
    MoE layers separately), so the graph stays small for any depth.
    """
    sh = Shard(b=batch, s=model.seq_length, s_kv=model.seq_length, dtype=precision, flash=flash, autocast=autocast)
    g = OpGraph()
    moe_layers = model.num_moe_layers
    dense_layers = model.num_layers - moe_layers
    fwd_blocks: list[tuple[list[Op], int]] = [(embedding_forward(model, sh), 1)]
    if dense_layers:
        fwd_blocks.append((layer_forward(model, sh, False), dense_layers))
    if moe_layers:
        fwd_blocks.append((layer_forward(model, sh, True, "moe_layer"), moe_layers))
    fwd_blocks.append((head_forward(model, sh), 1))
    prev: list[int] = []
    for ops, rep in fwd_blocks:
        for op in ops:
            prev = [g.add(op, prev, rep)]
    for i, (ops, rep) in enumerate(reversed(fwd_blocks)):
        bwd = embedding_backward(model, sh, model.tied_head) if i == len(fwd_blocks) - 1 else backward_of(ops)
        for op in bwd:
            prev = [g.add(op, prev, rep)]
    for op in optimizer_ops(model.num_params(), optimizer, "fp32" if autocast else precision):
        g.add(op, prev, 1)
    return g


def model_flops_per_iteration(run: RunSpec) -> float:
    """Model FLOPs of one iteration (forward + backward, no recompute; forward alone for a
    forward-only step), the MFU numerator.

    Counted from the operator graph (attention in full, as in the Megatron formula).
    """
    m, s = run.model, run.strategy
    g = operator_graph(m, 1, s.precision, True, s.optimizer)
    per_seq = g.total_flops("fwd") + (0.0 if s.forward_only else g.total_flops("bwd"))
    return per_seq * s.global_batch_size
