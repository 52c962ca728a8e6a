"""Real PyTorch models that the measured training steps run.

Every model is built from a run-format ``model`` dict, so that the record of a
measured step describes exactly what ran:

* transformers (``arch`` ``gpt``, ``llama``, ``bert``, ``moe``), completed by
  :class:`learnedperf.specs.ModelSpec` (GPT: learned positions, LayerNorm, GELU
  MLP of 4h, tied embeddings, causal; Llama: RoPE, RMSNorm, SwiGLU, grouped-query
  attention, untied head; BERT: GPT but bidirectional; MoE: Llama whose MoE layers
  route each token to ``moe_top_k`` of ``num_experts`` expert MLPs,
  :class:`MoEFeedForward`). Attention is
  :func:`torch.nn.functional.scaled_dot_product_attention` (the fused kernel);
* an MLP (``arch`` ``mlp``) and a small ResNet-style CNN (``arch`` ``cnn``), whose
  dicts are completed by :func:`learnedperf.measure.steps.complete_model_dict`.

A transformer is written once for every layout: :class:`TransformerStage` is the
part of the model one rank holds — a contiguous range of layers (pipeline
parallelism; the first stage also holds the embeddings, the last the final norm,
the head and the loss) whose weight matrices are split over ``tp`` ranks the way
Megatron-LM splits them (column-parallel QKV and first MLP matrix, row-parallel
output projection and second MLP matrix, vocabulary-parallel embedding, head and
cross entropy). With ``tp = pp = 1`` it is the plain model. Under ZB-V and the interleaved schedules a rank
holds several such parts, ``v`` of the ``p·v`` virtual stages (:func:`build_chunks`): ``r`` and ``2p-1-r`` in
ZB-V's V, ``r, r+p, ...`` interleaved.

Weights are initialised from the *global* parameter name and a seed, full size,
and then sliced (:func:`init_parameters`), so that any split of the same model
holds exactly the slices of the unsharded model's weights — which is what lets
the tests check the sharding numerically against the plain model.

This module imports torch at import time; :mod:`learnedperf.measure.steps`
imports it lazily.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..specs import ModelSpec
from .steps import complete_model_dict

#: Standard deviation of the normal initialisation of weight matrices and embeddings (GPT-2's 0.02).
INIT_STD = 0.02

#: Epsilon of LayerNorm / RMSNorm (PyTorch's LayerNorm default; Llama uses 1e-5 as well).
NORM_EPS = 1e-5

#: RoPE base frequency (Su et al. 2021; Llama 1/2).
ROPE_THETA = 10000.0


# --------------------------------------------------------------------------- parallel layout
@dataclass(frozen=True)
class ParallelContext:
    """Where this rank sits in the model: its tensor-parallel slice and pipeline stage.

    Attributes:
        tp_size: ranks a layer's matrices are split over.
        tp_rank: this rank's index among them.
        tp_group: the process group of those ranks (``None`` when ``tp_size == 1``).
        stage: this rank's pipeline stage.
        num_stages: pipeline stages (``pp``).
        weight_grads: where the linear layers leave their weight-gradient GEMMs for a zero-bubble
            schedule's ``W`` pass (:class:`WeightGradStore`); ``None``: computed in the backward.
        layer_counts: layers of every (virtual) stage, in stage order (the step harness passes the
            simulator's, :func:`learnedperf.graph.execution.layers_per_vstage`, so that what is measured is what
            is simulated); ``None``: even, the earlier stages taking the remainder (:func:`partition_layers`).
    """

    tp_size: int = 1
    tp_rank: int = 0
    tp_group: Any = None
    stage: int = 0
    num_stages: int = 1
    weight_grads: Optional["WeightGradStore"] = None  # set: linear layers defer their weight gradients there
    layer_counts: Optional[tuple[int, ...]] = None

    @property
    def is_first_stage(self) -> bool:
        """True on the stage that holds the embeddings."""
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        """True on the stage that holds the final norm, head and loss."""
        return self.stage == self.num_stages - 1


def partition_layers(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges of the pipeline stages; earlier stages take the remainder."""
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def stage_layers(num_layers: int, ctx: ParallelContext) -> range:
    """The global indices of the layers that stage ``ctx.stage`` of ``ctx.num_stages`` holds: from
    ``ctx.layer_counts`` where given, else :func:`partition_layers`.

    Raises:
        ValueError: ``layer_counts`` that are not one count per stage summing to ``num_layers``.
    """
    counts = ctx.layer_counts
    if counts is None:
        return partition_layers(num_layers, ctx.num_stages)[ctx.stage]
    if len(counts) != ctx.num_stages or sum(counts) != num_layers:
        raise ValueError(f"layer_counts {list(counts)}: expected {ctx.num_stages} stages' layers summing to "
                         f"{num_layers}")
    start = sum(counts[:ctx.stage])
    return range(start, start + counts[ctx.stage])


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity in forward; all-reduce of the gradient in backward (Megatron's ``f``).

    Placed on the input of a column-parallel layer: every rank uses the whole
    input, so the input's gradient is the sum of the ranks' partial gradients.
    """

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102 - autograd protocol
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce in forward; identity in backward (Megatron's ``g``).

    Placed on the output of a row-parallel layer: each rank holds a partial sum
    of the output, and the gradient of the full sum is the same on every rank.
    """

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102 - autograd protocol
        # In place like Megatron (the partial sum is not needed afterwards); marked dirty so autograd knows.
        ctx.mark_dirty(x)
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        return grad, None


def copy_to_tp(x: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """Input of a column-parallel layer (all-reduce of its gradient when ``tp > 1``)."""
    return _CopyToTensorParallel.apply(x, ctx.tp_group) if ctx.tp_size > 1 else x


def reduce_from_tp(x: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """Sum of the ranks' partial outputs of a row-parallel layer (all-reduce when ``tp > 1``)."""
    return _ReduceFromTensorParallel.apply(x, ctx.tp_group) if ctx.tp_size > 1 else x


def shard_tensor(full: torch.Tensor, dim: int, sections: list[int], rank: int, size: int) -> torch.Tensor:
    """This rank's slice of ``full``: each section along ``dim`` is cut in ``size`` equal parts.

    Sections keep fused matrices correct: a fused QKV weight is ``[q; k; v]`` and
    rank r must get ``[q_r; k_r; v_r]``, not the r-th contiguous block.
    """
    parts = torch.split(full, sections, dim=dim)
    return torch.cat([p.chunk(size, dim=dim)[rank] for p in parts], dim=dim)


def _param(shape: tuple[int, ...], init: str, shard: Optional[tuple[int, list[int]]] = None,
           ctx: Optional[ParallelContext] = None, init_name: Optional[str] = None) -> nn.Parameter:
    """A parameter of the local (sharded) shape, tagged with how to initialise and shard it.

    ``init`` is 'normal', 'ones' or 'zeros'; ``shard`` is ``(dim, sections)`` of the
    full tensor or None for a replicated one; ``init_name`` overrides the global
    name that seeds the initialisation (a tied head uses the embedding's).
    """
    full_shape = list(shape)
    local = list(shape)
    if shard is not None and ctx is not None and ctx.tp_size > 1:
        dim, sections = shard
        full_shape[dim] = sum(sections)
        for s in sections:
            if s % ctx.tp_size:
                raise ValueError(f"section {s} of a {tuple(full_shape)} weight is not divisible by tp={ctx.tp_size}")
        local[dim] = sum(sections) // ctx.tp_size
    p = nn.Parameter(torch.empty(local))
    p.lp_init = init
    p.lp_full_shape = tuple(full_shape)
    p.lp_shard = shard if (shard is not None and ctx is not None and ctx.tp_size > 1) else None
    p.lp_init_name = init_name
    return p


class WeightGradStore:
    """Weight-gradient GEMMs a backward pass left for later: a zero-bubble schedule's ``W`` (Qi et al., ICLR
    2024, whose Megatron implementation keeps them in a store of the same name).

    The backward of a linear layer built with a store computes its input gradient (``B``) and its bias
    gradient, and appends the weight, its input and its output gradient here; :meth:`take` hands over
    what one backward left and :meth:`run` computes those weight gradients, adding them to ``.grad``.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def defer(self, weight: torch.Tensor, x: torch.Tensor, grad: torch.Tensor) -> None:
        """Keep one weight-gradient GEMM: ``grad``ᵀ ``x`` over every leading dimension."""
        self.pending.append((weight, x, grad))

    def take(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Everything deferred since the last call."""
        out, self.pending = self.pending, []
        return out

    @staticmethod
    def run(items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """Compute the weight gradients of ``items`` (from :meth:`take`), accumulating into ``.grad``."""
        for weight, x, grad in items:
            g = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
            if weight.grad is None:
                weight.grad = g
            else:
                weight.grad.add_(g)


class _LinearDeferringWeightGrad(torch.autograd.Function):
    """``F.linear`` whose backward returns the input and bias gradients and defers the weight's."""

    @staticmethod
    def forward(ctx, x, weight, bias, store):  # noqa: D102 - autograd protocol
        ctx.save_for_backward(x, weight)
        ctx.store, ctx.has_bias = store, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 - autograd protocol
        x, weight = ctx.saved_tensors
        ctx.store.defer(weight, x, grad)
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        return grad @ weight, None, grad_bias, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], ctx: Optional[ParallelContext]):
    """``F.linear``, or with ``ctx.weight_grads`` set the same product whose weight gradient waits in that
    store for a ``W`` pass."""
    if ctx is not None and ctx.weight_grads is not None and torch.is_grad_enabled():
        return _LinearDeferringWeightGrad.apply(x, weight, bias, ctx.weight_grads)
    return F.linear(x, weight, bias)


class ColumnParallelLinear(nn.Module):
    """``y = x Wᵀ + b`` with the output features (rows of W) split over the tp ranks.

    ``sections`` lists the fused outputs (e.g. q, k, v) so that each is split separately.
    """

    def __init__(self, in_features: int, sections: list[int], bias: bool, ctx: ParallelContext):
        super().__init__()
        self.ctx = ctx
        out_full = sum(sections)
        self.weight = _param((out_full, in_features), "normal", (0, sections), ctx)
        self.bias = _param((out_full,), "zeros", (0, sections), ctx) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Local slice of the output features."""
        return linear(copy_to_tp(x, self.ctx), self.weight, self.bias, self.ctx)


class RowParallelLinear(nn.Module):
    """``y = x Wᵀ + b`` with the input features (columns of W) split over the tp ranks.

    Each rank's product is a partial sum, all-reduced before the (replicated) bias.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, ctx: ParallelContext):
        super().__init__()
        self.ctx = ctx
        self.weight = _param((out_features, in_features), "normal", (1, [in_features]), ctx)
        self.bias = _param((out_features,), "zeros") if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Full output (identical on every tp rank)."""
        y = reduce_from_tp(linear(x, self.weight, None, self.ctx), self.ctx)
        return y + self.bias if self.bias is not None else y


class Norm(nn.Module):
    """LayerNorm (weight and bias) or RMSNorm (weight), replicated over tp ranks."""

    def __init__(self, kind: str, hidden: int):
        super().__init__()
        self.kind = kind
        self.hidden = hidden
        self.weight = _param((hidden,), "ones")
        self.bias = _param((hidden,), "zeros") if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``x``."""
        if self.kind == "layernorm":
            return F.layer_norm(x, (self.hidden,), self.weight, self.bias, NORM_EPS)
        return F.rms_norm(x, (self.hidden,), self.weight, NORM_EPS)


def rope_tables(seq_length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[seq, head_dim]`` of rotary position embeddings (rotate-half layout)."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[batch, heads, seq, head_dim]`` by the position tables."""
    return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)


class Attention(nn.Module):
    """Multi-head (or grouped-query) self-attention; heads split over the tp ranks."""

    def __init__(self, spec: ModelSpec, ctx: ParallelContext):
        super().__init__()
        heads, kv, hd = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        self.heads_local = heads // ctx.tp_size
        self.kv_local = kv // ctx.tp_size
        self.head_dim = hd
        self.causal = spec.causal
        self.rope = spec.position_embedding == "rope"
        bias = spec.arch in ("gpt", "bert")
        # One fused GEMM for q, k and v, as Megatron and nanoGPT do.
        self.qkv = ColumnParallelLinear(spec.hidden_size, [heads * hd, kv * hd, kv * hd], bias, ctx)
        self.proj = RowParallelLinear(heads * hd, spec.hidden_size, bias, ctx)

    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """Attention output ``[batch, seq, hidden]``."""
        b, s, _ = x.shape
        hl, kl, hd = self.heads_local, self.kv_local, self.head_dim
        q, k, v = self.qkv(x).split([hl * hd, kl * hd, kl * hd], dim=-1)
        q = q.view(b, s, hl, hd).transpose(1, 2)
        k = k.view(b, s, kl, hd).transpose(1, 2)
        v = v.view(b, s, kl, hd).transpose(1, 2)
        if self.rope and rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kwargs = {}
        if hl != kl:
            if gqa_needs_expanded_kv(q):
                # repeat every k/v head over its group of query heads, as enable_gqa does (repeat_interleave on
                # the head dim), so that a fused kernel runs: see gqa_needs_expanded_kv
                k = k.repeat_interleave(hl // kl, dim=1)
                v = v.repeat_interleave(hl // kl, dim=1)
            else:
                kwargs = {"enable_gqa": True}
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, **kwargs)
        return self.proj(o.transpose(1, 2).reshape(b, s, hl * hd))


def gqa_needs_expanded_kv(q: torch.Tensor) -> bool:
    """Whether grouped-query attention must repeat its k/v heads itself rather than pass ``enable_gqa``.

    On CUDA, ``enable_gqa`` is taken by FlashAttention only (fp16 / bf16); in fp32 SDPA then falls back to its
    math kernel, which materialises the ``[batch, heads, seq, seq]`` scores and keeps them for backward
    (TinyLlama's fp32 steps at micro-batch 4: 2 GiB per layer, 44 GiB in all: out of memory on an 80 GB GPU,
    and not the fused attention the run's ``flash_attention`` says). With the heads repeated, the
    memory-efficient fused kernel runs. CPU steps and bf16 / fp16 ones keep ``enable_gqa`` (unchanged).
    """
    return q.device.type == "cuda" and q.dtype not in (torch.float16, torch.bfloat16)


def activate(y: torch.Tensor, activation: str) -> torch.Tensor:
    """The MLP's activation of the first matrix's output: SwiGLU (``silu(gate) * up`` of its two halves),
    GPT-2's tanh GELU or ReLU."""
    if activation == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if activation == "gelu":
        return F.gelu(y, approximate="tanh")  # GPT-2's GELU as one kernel
    if activation == "gelu_new":
        # the same function as Hugging Face's NewGELUActivation writes it (eight tensor operations)
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))
    return F.relu(y)


class FeedForward(nn.Module):
    """The MLP of a layer: GELU/ReLU (2 matrices) or SwiGLU (gate and up fused, then down).

    ``width`` is its hidden width: ``ffn_hidden_size`` by default; a MoE model's dense layers pass
    ``dense_ffn_hidden_size`` and its shared experts ``moe_shared_ffn_hidden_size``.
    """

    def __init__(self, spec: ModelSpec, ctx: ParallelContext, width: Optional[int] = None):
        super().__init__()
        f, h = (spec.ffn_hidden_size if width is None else width), spec.hidden_size
        self.activation = spec.activation
        bias = spec.arch in ("gpt", "bert")
        sections = [f, f] if spec.activation == "swiglu" else [f]
        self.fc1 = ColumnParallelLinear(h, sections, bias, ctx)
        self.fc2 = RowParallelLinear(f, h, bias, ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """MLP output ``[batch, seq, hidden]``."""
        return self.fc2(activate(self.fc1(x), self.activation))


def expert_capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Rows every expert processes under a capacity factor: Megatron-Core's ``get_capacity``,
    ``ceil(tokens·top_k / num_experts · capacity_factor)`` (the balanced share of the routed token copies,
    scaled; the same order of operations, so that float rounding agrees with it)."""
    return math.ceil((tokens * top_k / num_experts) * capacity_factor)


class GroupedExperts(nn.Module):
    """The routed experts of a MoE layer: ``num_experts`` MLPs whose weights are stacked, ``fc1`` of shape
    ``[E, up, hidden]`` (``up`` = 2·width for SwiGLU, gate and up fused; width otherwise) and ``fc2`` of shape
    ``[E, hidden, width]``, no biases.

    Stacked parameters have one global name each, so :func:`init_parameters` initialises them like every
    other matrix. ``forward`` runs all experts as two batched GEMMs over ``[E, rows, hidden]`` (the padded
    path, whose input a forward hook on this module sees); :meth:`per_expert` hands out each expert's own
    matrices for the dropless path, which runs them with :meth:`mlp` over that expert's rows.
    """

    def __init__(self, num_experts: int, hidden: int, width: int, activation: str):
        super().__init__()
        self.activation = activation
        up = 2 * width if activation == "swiglu" else width
        self.fc1 = _param((num_experts, up, hidden), "normal")
        self.fc2 = _param((num_experts, hidden, width), "normal")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert's MLP over its rows: ``[E, rows, hidden]`` to ``[E, rows, hidden]`` (batched GEMMs)."""
        y = activate(torch.bmm(x, self.fc1.transpose(1, 2)), self.activation)
        return torch.bmm(y, self.fc2.transpose(1, 2))

    def per_expert(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each expert's ``(fc1, fc2)`` matrices, views of the stacked weights."""
        # one unbind per forward: its backward stacks the experts' gradients once, where indexing each expert
        # would write a full-size gradient of the stacked weight per expert
        return list(zip(self.fc1.unbind(0), self.fc2.unbind(0)))

    def mlp(self, x: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor) -> torch.Tensor:
        """One expert's MLP (its matrices from :meth:`per_expert`) over its rows ``[n, hidden]``."""
        return F.linear(activate(F.linear(x, fc1), self.activation), fc2)


class MoEFeedForward(nn.Module):
    """The MLP of a MoE layer: a router, ``num_experts`` routed expert MLPs and optional shared experts.

    Routing: a router GEMM (``hidden`` to ``num_experts``, no bias), a softmax over all experts in fp32, and
    each token's ``moe_top_k`` most probable experts; their softmax probabilities are the combine weights as
    they are (not renormalised over the top k), and no auxiliary load-balancing loss is added (the loss is the
    language model's alone). The layer's output is, per token, the weighted sum of its experts' outputs, plus
    the shared experts' dense MLP (width ``moe_shared_ffn_hidden_size``, over every token) when there are any.

    ``capacity_factor`` None: dropless, each expert processes exactly the tokens routed to it (one expert
    at a time). A number ``c``: every expert processes exactly ``expert_capacity(T, E, k, c)`` rows, ``T`` the
    micro-batch's tokens (Megatron-Core's ``moe_expert_capacity_factor`` with
    ``moe_pad_expert_input_to_capacity``): the token copies routed to an expert beyond its capacity are
    dropped, keeping the first ``capacity`` in token order (Megatron-Core's ``position`` drop policy), every
    expert's input is zero-padded to ``capacity`` rows, and the experts run as batched GEMMs over
    ``[E, capacity, hidden]``. Dropped copies and padded rows add nothing to the output.

    Expert tensor parallelism is not built: ``ctx.tp_size`` must be 1.
    """

    def __init__(self, spec: ModelSpec, ctx: ParallelContext, capacity_factor: Optional[float] = None):
        super().__init__()
        if ctx.tp_size > 1:
            raise ValueError("a MoE layer is built for tp = 1 (expert tensor parallelism is not measured)")
        self.ctx = ctx
        self.num_experts, self.top_k = spec.num_experts, spec.moe_top_k
        self.capacity_factor = capacity_factor
        self.router = _param((spec.num_experts, spec.hidden_size), "normal")
        self.experts = GroupedExperts(spec.num_experts, spec.hidden_size, spec.ffn_hidden_size, spec.activation)
        shared = spec.moe_shared_ffn_hidden_size
        self.shared = FeedForward(spec, ctx, shared) if shared else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The router's top-k of tokens ``[T, hidden]``: fp32 softmax probabilities ``[T, k]`` and the experts
        ``[T, k]`` they belong to, most probable first."""
        logits = linear(x, self.router, None, self.ctx)
        return logits.float().softmax(dim=-1).topk(self.top_k, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """MoE output ``[batch, seq, hidden]`` (before the residual)."""
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        probs, experts = self.route(flat)
        # the (token, expert) copies in token order: copy i is token i // k's (i % k)-th choice
        expert_of = experts.reshape(-1)
        token_of = torch.arange(b * s, device=x.device).repeat_interleave(self.top_k)
        weight_of = probs.reshape(-1)
        if self.capacity_factor is None:
            out = self._dropless(flat, expert_of, token_of, weight_of)
        else:
            out = self._padded(flat, expert_of, token_of, weight_of)
        out = out.view(b, s, h)
        return out if self.shared is None else out + self.shared(x)

    def _dropless(self, flat, expert_of, token_of, weight_of) -> torch.Tensor:
        out = flat.new_zeros(flat.shape)
        order = torch.argsort(expert_of, stable=True)
        # host-side counts, as Megatron-Core's dropless GroupedMLP reads tokens_per_expert
        counts = torch.bincount(expert_of, minlength=self.num_experts).tolist()
        start = 0
        for (fc1, fc2), n in zip(self.experts.per_expert(), counts):
            if n:
                copies = order[start:start + n]
                tokens = token_of[copies]
                y = self.experts.mlp(flat.index_select(0, tokens), fc1, fc2)
                out.index_add_(0, tokens, (y * weight_of[copies].unsqueeze(-1)).to(out.dtype))
            start += n
        return out

    def _padded(self, flat, expert_of, token_of, weight_of) -> torch.Tensor:
        T, h = flat.shape
        E = self.num_experts
        capacity = expert_capacity(T, E, self.top_k, self.capacity_factor)
        # each copy's place in its expert's queue, in token order: the first `capacity` are kept
        queue = F.one_hot(expert_of, E).cumsum(0)
        place = queue.gather(1, expert_of.unsqueeze(1)).squeeze(1) - 1
        kept = place < capacity
        slot = expert_of[kept] * capacity + place[kept]
        tokens = token_of[kept]
        # every slot reads its token's row, or an appended zero row (index T) when its expert has fewer copies
        source = torch.full((E * capacity,), T, dtype=torch.long, device=flat.device)
        source[slot] = tokens
        rows = torch.cat([flat, flat.new_zeros(1, h)]).index_select(0, source).view(E, capacity, h)
        y = self.experts(rows).reshape(E * capacity, h)
        out = flat.new_zeros(flat.shape)
        out.index_add_(0, tokens, (y.index_select(0, slot) * weight_of[kept].unsqueeze(-1)).to(out.dtype))
        return out


class TransformerLayer(nn.Module):
    """One pre-norm transformer layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

    ``moe``: the MLP is a :class:`MoEFeedForward` (with ``capacity_factor``); otherwise a dense
    :class:`FeedForward` of width ``dense_ffn_hidden_size`` (``ffn_hidden_size`` except in MoE models).
    """

    def __init__(self, spec: ModelSpec, ctx: ParallelContext, moe: bool = False,
                 capacity_factor: Optional[float] = None):
        super().__init__()
        self.norm1 = Norm(spec.norm, spec.hidden_size)
        self.attn = Attention(spec, ctx)
        self.norm2 = Norm(spec.norm, spec.hidden_size)
        self.mlp = (MoEFeedForward(spec, ctx, capacity_factor) if moe
                    else FeedForward(spec, ctx, spec.dense_ffn_hidden_size))

    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """The layer's output."""
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


def vocab_parallel_cross_entropy(logits_local: torch.Tensor, targets: torch.Tensor, ctx: ParallelContext,
                                 vocab_size: int) -> torch.Tensor:
    """Mean cross entropy over logits whose vocabulary is split over the tp ranks (Megatron's).

    The full ``[tokens, vocab]`` logits never exist on one rank: the ranks
    all-reduce the maximum, the sum of exponentials and the target's logit.
    With ``tp == 1`` this is :func:`torch.nn.functional.cross_entropy`.
    """
    logits = logits_local.float()
    if ctx.tp_size == 1:
        return F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))
    v_local = logits.shape[-1]
    start = ctx.tp_rank * v_local
    # The global max only shifts the exponent for stability; it needs no gradient.
    shift = logits.detach().amax(dim=-1, keepdim=True)
    dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=ctx.tp_group)
    shifted = logits - shift
    sum_exp = reduce_from_tp(shifted.exp().sum(dim=-1), ctx)
    local_t = targets - start
    outside = (local_t < 0) | (local_t >= v_local)
    picked = shifted.gather(-1, local_t.clamp(0, v_local - 1).unsqueeze(-1)).squeeze(-1)
    target_logit = reduce_from_tp(picked.masked_fill(outside, 0.0), ctx)
    return (sum_exp.log() - target_logit).mean()


class TransformerStage(nn.Module):
    """The part of a GPT / Llama / BERT / MoE model that one rank holds.

    ``forward(x, targets)`` takes token ids ``[batch, seq]`` on the first stage
    (hidden states ``[batch, seq, hidden]`` otherwise) and returns the mean
    cross-entropy loss on the last stage (hidden states otherwise).

    Args:
        model: run-format model dict (completed with ModelSpec's defaults).
        ctx: tensor-parallel slice and pipeline stage of this rank.
        recompute: 'none' or 'full' (every layer's activations recomputed in backward,
            :func:`torch.utils.checkpoint.checkpoint` per layer).
        moe_capacity_factor: of a MoE model's layers (:class:`MoEFeedForward`); None: dropless.
    """

    def __init__(self, model: dict, ctx: ParallelContext = ParallelContext(), recompute: str = "none",
                 moe_capacity_factor: Optional[float] = None):
        super().__init__()
        spec = ModelSpec.parse(model, "model")
        if moe_capacity_factor is not None and not spec.is_moe:
            raise ValueError(f"moe_capacity_factor={moe_capacity_factor} needs a MoE model, not arch {spec.arch!r}")
        self.spec = spec
        self.ctx = ctx
        self.recompute = recompute
        layers = stage_layers(spec.num_layers, ctx)
        self.layer_offset = layers.start
        h, v = spec.hidden_size, spec.vocab_size
        vocab_shard = (0, [v])
        if ctx.is_first_stage:
            self.embed = _param((v, h), "normal", vocab_shard, ctx)
            self.pos = _param((spec.seq_length, h), "normal") if spec.position_embedding == "learned" else None
        # which layers route to experts is a property of the global layer index (ModelSpec's layout), so a
        # pipeline stage holds the same layers it would hold of the unsplit model
        self.layers = nn.ModuleList(TransformerLayer(spec, ctx, spec.moe_layers_in(i, 1) == 1, moe_capacity_factor)
                                    for i in layers)
        if ctx.is_last_stage:
            self.norm = Norm(spec.norm, h)
            if not spec.tie_embeddings:
                self.head = _param((v, h), "normal", vocab_shard, ctx, init_name="head")
            elif not ctx.is_first_stage:
                # A tied head on another stage is a copy of the embedding (same init), kept equal by an
                # all-reduce of the two gradients between the first and last stage (as Megatron does).
                self.head = _param((v, h), "normal", vocab_shard, ctx, init_name="embed")
            else:
                self.head = None
        if spec.position_embedding == "rope":
            cos, sin = rope_tables(spec.seq_length, spec.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    # ------------------------------------------------------------------ forward
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        if ctx.tp_size == 1:
            x = F.embedding(ids, self.embed)
        else:
            v_local = self.embed.shape[0]
            local = ids - ctx.tp_rank * v_local
            outside = (local < 0) | (local >= v_local)
            x = F.embedding(local.clamp(0, v_local - 1), self.embed).masked_fill(outside.unsqueeze(-1), 0.0)
            x = reduce_from_tp(x, ctx)
        if self.pos is not None:
            x = x + self.pos[: ids.shape[1]]
        return x

    def head_weight(self) -> torch.Tensor:
        """The (local slice of the) output projection: the embedding when tied on a one-stage model."""
        return self.head if self.head is not None else self.embed

    def forward(self, x: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Loss on the last stage, hidden states on the others."""
        if self.ctx.is_first_stage:
            x = self._embed(x)
        rope = (self.rope_cos[: x.shape[1]], self.rope_sin[: x.shape[1]]) if hasattr(self, "rope_cos") else None
        for layer in self.layers:
            if self.recompute == "full" and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(layer, x, rope, use_reentrant=False)
            else:
                x = layer(x, rope)
        if not self.ctx.is_last_stage:
            return x
        if targets is None:
            raise ValueError("the last pipeline stage needs targets to compute the loss")
        x = self.norm(x)
        logits = linear(copy_to_tp(x, self.ctx), self.head_weight(), None, self.ctx)
        return vocab_parallel_cross_entropy(logits, targets, self.ctx, self.spec.vocab_size)

    # ------------------------------------------------------------------ helpers
    def global_name(self, name: str) -> str:
        """Name of a local parameter in the unsharded, one-stage model (layer indices made global)."""
        m = re.match(r"layers\.(\d+)\.(.*)", name)
        if m:
            return f"layers.{int(m.group(1)) + self.layer_offset}.{m.group(2)}"
        return name

    def shard_units(self) -> list[nn.Module]:
        """Sub-modules FSDP wraps one by one (the layers)."""
        return list(self.layers)

    def tied_parameter(self) -> Optional[nn.Parameter]:
        """The embedding copy whose gradient is all-reduced between first and last stage, if any."""
        if not self.spec.tie_embeddings or self.ctx.num_stages == 1:
            return None
        return self.embed if self.ctx.is_first_stage else (self.head if self.ctx.is_last_stage else None)


# --------------------------------------------------------------------------- non-transformers
class MLPModel(nn.Module):
    """A plain MLP classifier: ``num_layers`` hidden Linear+ReLU layers, then a Linear to the classes."""

    def __init__(self, model: dict):
        super().__init__()
        m = complete_model_dict(model)
        self.config = m
        dims = [m["input_size"]] + [m["hidden_size"]] * m["num_layers"]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.out = nn.Linear(dims[-1], m["num_classes"])
        for lin in [*self.hidden, self.out]:
            _tag_linear(lin)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy loss of the batch."""
        for lin in self.hidden:
            x = F.relu(lin(x))
        return F.cross_entropy(self.out(x).float(), targets)

    def global_name(self, name: str) -> str:
        """Parameter names are already global (no sharding)."""
        return name

    def shard_units(self) -> list[nn.Module]:
        """Sub-modules FSDP wraps one by one."""
        return [*self.hidden, self.out]


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv + BatchNorm, identity or 1x1 projection shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Block output."""
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class CNNModel(nn.Module):
    """A small ResNet: 3x3 stem, ``num_stages`` stages of ``blocks_per_stage`` basic blocks
    (channels doubling, stride 2 from the second stage), global average pool, Linear head."""

    def __init__(self, model: dict):
        super().__init__()
        m = complete_model_dict(model)
        self.config = m
        c = m["base_channels"]
        self.stem = nn.Sequential(nn.Conv2d(m["in_channels"], c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        blocks = []
        c_in = c
        for s in range(m["num_stages"]):
            c_out = c * 2 ** s
            for b in range(m["blocks_per_stage"]):
                blocks.append(BasicBlock(c_in, c_out, 2 if (s > 0 and b == 0) else 1))
                c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(c_in, m["num_classes"])
        for mod in self.modules():
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                _tag_linear(mod)
            elif isinstance(mod, nn.BatchNorm2d):
                mod.weight.lp_init, mod.bias.lp_init = "ones", "zeros"

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy loss of the batch."""
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.fc(x.mean(dim=(2, 3))).float(), targets)

    def global_name(self, name: str) -> str:
        """Parameter names are already global (no sharding)."""
        return name

    def shard_units(self) -> list[nn.Module]:
        """Sub-modules FSDP wraps one by one."""
        return list(self.blocks)


def _tag_linear(mod: nn.Module) -> None:
    # He-style scale keeps ReLU networks' activations O(1); the std only matters for loss values, not timing.
    fan_in = mod.weight[0].numel()
    mod.weight.lp_init = f"normal:{math.sqrt(2.0 / fan_in)}"
    if getattr(mod, "bias", None) is not None:
        mod.bias.lp_init = "zeros"


# --------------------------------------------------------------------------- building
def init_parameters(module: nn.Module, seed: int = 0) -> None:
    """Initialise every parameter from ``seed`` and its global name, full size, then take this rank's slice.

    The same (seed, name) gives the same full tensor on every rank and in every
    layout, so a tp- or pp-split model holds exactly the unsharded model's weights.
    """
    name_of = getattr(module, "global_name", lambda n: n)
    with torch.no_grad():
        for name, p in module.named_parameters():
            key = getattr(p, "lp_init_name", None) or name_of(name)
            init = getattr(p, "lp_init", "normal")
            full_shape = getattr(p, "lp_full_shape", tuple(p.shape))
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{key}".encode()))
            if init == "ones":
                full = torch.ones(full_shape)
            elif init == "zeros":
                full = torch.zeros(full_shape)
            else:
                std = float(init.split(":", 1)[1]) if ":" in init else INIT_STD
                full = torch.empty(full_shape).normal_(0.0, std, generator=gen)
            shard = getattr(p, "lp_shard", None)
            ctx = getattr(module, "ctx", None)
            if shard is not None and ctx is not None:
                full = shard_tensor(full, shard[0], shard[1], ctx.tp_rank, ctx.tp_size)
            p.copy_(full)


def build_model(model: dict, ctx: ParallelContext = ParallelContext(), recompute: str = "none",
                seed: int = 0, moe_capacity_factor: Optional[float] = None) -> nn.Module:
    """Build and initialise the model (or this rank's part of it) described by a run-format model dict.

    Args:
        model: run-format model dict (``arch`` gpt / llama / bert / moe / mlp / cnn).
        ctx: tensor-parallel slice and pipeline stage (transformers only).
        recompute: 'none' or 'full' activation recomputation (transformers only).
        seed: seed of the weights (same seed → same weights in every layout).
        moe_capacity_factor: expert capacity of a MoE model's layers (None: dropless; MoE only).
    """
    m = complete_model_dict(model)
    if m["arch"] in ("mlp", "cnn") and moe_capacity_factor is not None:
        raise ValueError(f"moe_capacity_factor={moe_capacity_factor} needs a MoE model, not arch {m['arch']!r}")
    if m["arch"] == "mlp":
        net: nn.Module = MLPModel(m)
    elif m["arch"] == "cnn":
        net = CNNModel(m)
    else:
        net = TransformerStage(m, ctx, recompute, moe_capacity_factor)
    init_parameters(net, seed)
    return net


def build_chunks(model: dict, ctx: ParallelContext, vstages: list[int], recompute: str = "none", seed: int = 0,
                 moe_capacity_factor: Optional[float] = None) -> nn.ModuleList:
    """This pipeline rank's model chunks when it holds several virtual stages (ZB-V, interleaving), chunk order.

    The model is cut into ``p·v`` virtual stages (``p = ctx.num_stages`` ranks of ``v = len(vstages)`` chunks each)
    as a ``p·v``-stage pipeline would cut it (:func:`stage_layers`); chunk ``c`` is virtual stage
    ``vstages[c]``, as :func:`learnedperf.graph.execution.rank_vstages` places them (Megatron's interleaving:
    ``r, r+p, ...`` on rank ``r``; ZB-V's V: ``r`` and ``2p-1-r``). Each chunk is a :class:`TransformerStage` of
    its virtual stage, initialised from the global parameter names as :func:`build_model` does, so the chunks hold
    exactly the one-process model's weights of their layers. Every chunk uses ``ctx``'s tensor-parallel slice and
    its one :class:`WeightGradStore`.

    A tied head on the rank that holds the embedding (ZB-V's rank 0) *is* the embedding: one table, its gradient
    the sum of the head's and the embedding's. On another rank (interleaving: the embedding in chunk 0 of rank 0,
    the head in chunk ``v-1`` of rank ``p-1``) the head is a copy, kept equal as a 1F1B pipeline's last stage
    keeps it (:meth:`TransformerStage.tied_parameter`). The returned list's ``parameters()`` holds each parameter
    once.
    """
    num_vstages = ctx.num_stages * len(vstages)
    chunks = nn.ModuleList()
    for vstage in vstages:
        chunk = TransformerStage(model, replace(ctx, stage=vstage, num_stages=num_vstages), recompute,
                                 moe_capacity_factor)
        init_parameters(chunk, seed)
        chunks.append(chunk)
    first = next((c for c in chunks if c.ctx.is_first_stage), None)
    last = next((c for c in chunks if c.ctx.is_last_stage), None)
    if first is not None and last is not None and first is not last and first.spec.tie_embeddings:
        # the head copy was initialised like the embedding; sharing the Parameter keeps them one table
        last.head = first.embed
    return chunks


def make_batch(model: dict, micro_batch_size: int, seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and targets of one micro-batch, a function of (seed, index) only.

    Transformers: token ids ``[b, seq]`` and target ids; MLP: features ``[b, input_size]``;
    CNN: images ``[b, C, H, W]``; targets are class ids.
    """
    m = complete_model_dict(model)
    gen = torch.Generator().manual_seed(zlib.crc32(f"batch:{seed}:{index}".encode()))
    b = micro_batch_size
    if m["arch"] == "mlp":
        x = torch.randn(b, m["input_size"], generator=gen)
        return x, torch.randint(0, m["num_classes"], (b,), generator=gen)
    if m["arch"] == "cnn":
        s = m["image_size"]
        x = torch.randn(b, m["in_channels"], s, s, generator=gen)
        return x, torch.randint(0, m["num_classes"], (b,), generator=gen)
    v, s = m["vocab_size"], m["seq_length"]
    return (torch.randint(0, v, (b, s), generator=gen), torch.randint(0, v, (b, s), generator=gen))


def count_parameters(module: nn.Module) -> int:
    """Number of (local) parameter elements of a module."""
    return sum(p.numel() for p in module.parameters())
