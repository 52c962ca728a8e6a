"""Peak memory per device: weights, gradients, optimizer state, activations.

Model states follow Rajbhandari et al., "ZeRO" (SC20) §3.1 with Megatron's
mixed-precision layout: low-precision weights, gradients in the reduction
precision (fp32 in Megatron's bf16 recipe), fp32 master weights and two Adam
moments; ZeRO-1 shards the optimizer states over dp, ZeRO-2 also the gradients,
ZeRO-3 / FSDP also the weights.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models" (2022) §4, generalised from the saved tensors of
each op: per layer and micro-batch, the inputs of every GEMM, the attention
scores (unless a fused kernel recomputes them), activation-function inputs,
norm inputs and dropout masks; tensor and sequence parallelism divide what
they shard; full recomputation keeps only each layer's input. A pipeline rank
holds the activations of as many micro-batches as its schedule has in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.execution import ExecutionGraph
from ..units import GiB


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device of each kind of state on the most loaded pipeline rank."""

    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    temporary: float
    stage: int

    @property
    def total(self) -> float:
        """Sum of every component (bytes)."""
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.temporary

    def to_GiB(self) -> dict[str, float]:
        """Components in GiB."""
        return {"weights": self.weights / GiB, "gradients": self.gradients / GiB,
                "optimizer_states": self.optimizer_states / GiB, "activations": self.activations / GiB,
                "temporary": self.temporary / GiB}


def layer_activation_bytes(eg: ExecutionGraph) -> float:
    """Bytes one transformer layer saves for backward, per micro-batch, on one rank."""
    run = eg.run
    m, s = run.model, run.strategy
    b, seq = s.micro_batch_size, m.seq_length // s.cp
    h, t = m.hidden_size, s.tp
    e = 2 if s.precision in ("bf16", "fp16", "fp8") else 4
    sp = s.sequence_parallel and t > 1
    T = b * seq
    kv_hd = m.num_kv_heads * m.head_dim
    a = m.num_attention_heads
    dropout = m.arch in ("gpt", "bert")
    f = m.ffn_hidden_size * (m.moe_top_k if m.is_moe else 1)
    if s.recompute == "full":
        return T * h * e / (t if sp else 1)
    # tensors replicated across TP ranks unless sequence parallel: norm inputs, QKV and FC1 inputs, masks
    replicated = T * h * e * 2 + T * h * e * 2 + (2 * T * h if dropout else 0)
    sharded = (T * (h + kv_hd) * e  # Q and K for the scores
               + T * kv_hd * e  # V
               + T * h * e  # projection input (attention output)
               + T * f * e * (2 if m.activation == "swiglu" else 1)  # activation-function input
               + T * f * e)  # FC2 input
    scores = 0.0
    if not s.flash_attention and s.recompute != "selective":
        # softmax output (e), dropout mask (1 byte) and dropout output (e) per score (Korthikanti eq. 2)
        scores = (2 * e + (1 if dropout else 0)) * a * b * seq * seq * s.cp
    elif s.flash_attention:
        scores = 4.0 * a * b * seq  # fp32 log-sum-exp per query row
    return replicated / (t if sp else 1) + (sharded + scores) / t


def memory_microbatches(run) -> int:
    """Fewest micro-batches whose compiled schedules already reach ``run``'s peak memory.

    Peak memory depends on the micro-batch count only through the activations in flight on a
    stage, which stop growing after the warm-up: ``p - 1`` forwards for 1F1B, at most
    ``(p-1)·2 + (v-1)·p < 2·p·v`` chunk forwards for the interleaved schedule (reached with ``2·p``
    micro-batches, a multiple of ``p`` as interleaving needs), one without a pipeline; GPipe keeps
    every micro-batch in flight and needs them all. Compiling this many instead of thousands keeps
    memory checks cheap.
    """
    s = run.strategy
    m = run.num_microbatches
    if s.pp == 1:
        return min(m, 2)
    if s.pipeline_schedule == "gpipe":
        return m
    return min(m, 2 * s.pp if s.pipeline_schedule == "interleaved" else s.pp)


def in_flight_microbatches(schedule: list[tuple[str, int, int]]) -> int:
    """Largest number of forward units whose backward has not yet run, along a stage's schedule."""
    live = peak = 0
    for kind, _c, _mb in schedule:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def peak_memory(eg: ExecutionGraph) -> MemoryBreakdown:
    """Peak per-device memory over the pipeline ranks (bytes)."""
    run = eg.run
    m, s = run.model, run.strategy
    dp = s.dp * s.cp  # ZeRO shards over the whole data-parallel group (dp·cp in Megatron)
    zero = s.effective_zero_stage
    pbytes = eg.param_bytes_per_param
    gbytes = eg.grad_bytes_per_param
    adam = s.optimizer == "adam"
    # fp32 master weights exist only when the compute copy is low precision
    master = 4 if pbytes < 4 else 0
    opt_per_param = master + (8 if adam else 0)
    per_layer = layer_activation_bytes(eg)
    best: MemoryBreakdown | None = None
    for st in eg.stages:
        params = sum(c.params for c in st.chunks)
        weights = params * pbytes / (dp if zero >= 3 else 1)
        grads = params * gbytes / (dp if zero >= 2 else 1)
        opt = params * opt_per_param / (dp if zero >= 1 else 1)
        layers = sum(c.num_layers for c in st.chunks) / max(1, len(st.chunks))
        in_flight = in_flight_microbatches(st.schedule)
        acts = per_layer * layers * in_flight
        temp = 0.0
        T = s.micro_batch_size * m.seq_length // s.cp
        if any(c.vstage == len(eg.stages) * len(st.chunks) - 1 for c in st.chunks):
            # fp32 logits and their gradient of one micro-batch on the last stage
            temp += 2 * 4.0 * T * m.vocab_size / s.tp
        if zero >= 3:
            # gathered full weights of the layers being computed and prefetched (two layers)
            temp += 2 * st.chunks[0].layer_params * pbytes
        mb = MemoryBreakdown(weights, grads, opt, acts, temp, st.index)
        if best is None or mb.total > best.total:
            best = mb
    assert best is not None
    return best
