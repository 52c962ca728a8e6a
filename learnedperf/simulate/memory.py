"""Peak memory per device: weights, gradients, optimizer state, activations.

Model states follow Rajbhandari et al., "ZeRO" (SC20) §3.1 with Megatron's
mixed-precision layout: low-precision weights, gradients in the reduction
precision (fp32 in Megatron's bf16 recipe), fp32 master weights and two Adam
moments; ZeRO-1 shards the optimizer states over dp, ZeRO-2 also the gradients,
ZeRO-3 / FSDP also the weights; hybrid sharding (``dp_replicate`` > 1) shards them over one copy's
dp·cp/dp_replicate ranks instead. Under torch.autocast (``mixed_precision: "autocast"``) the weights
and gradients are fp32 and there is no separate master copy; each layer's low-precision weight
copies are saved for its backward, like activations.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models" (2022) §4, generalised from the saved tensors of
each op: per layer and micro-batch, the inputs of every GEMM, the attention
scores (unless a fused kernel recomputes them), activation-function inputs,
norm inputs and dropout masks, and in a MoE layer the routed token copies its
experts read, the expert outputs the combine weights multiply and the router's
probabilities; tensor and sequence parallelism divide what they shard; full
recomputation keeps only each layer's input. A pipeline rank holds the
activations of as many micro-batches as its schedule has in flight.
A forward-only step (``forward_only``) keeps no gradients, no optimizer states and
no activations for a backward: its working set is one layer's tensors of one
micro-batch, bounded here by what that layer would save for a backward, and one
fp32 copy of the logits.

The peak is the larger of the forward/backward's and the optimizer step's. Gradients freed after
each step (``persistent_grads`` false, torch's ``zero_grad(set_to_none=True)``) are not yet alive at a
single micro-batch's forward/backward peak; torch.optim's foreach Adam (``optimizer_impl``) holds an
fp32 copy of the parameters besides every state during its step, which is then the peak of a step
whose activations are smaller than that.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.execution import (ExecutionGraph, StageLoad, chunk_layout, sharded_params, stage_loads,
                               state_bytes_per_param, state_sharding)
from ..graph.transformer import runs_dropout
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
    #: when the peak falls: ``"forward_backward"`` or ``"optimizer_step"`` (its activations freed)
    phase: str = "forward_backward"

    @property
    def total(self) -> float:
        """Sum of every component (bytes)."""
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.temporary

    def to_GiB(self) -> dict[str, float]:
        """Components in GiB."""
        return {"weights": self.weights / GiB, "gradients": self.gradients / GiB,
                "optimizer_states": self.optimizer_states / GiB, "activations": self.activations / GiB,
                "temporary": self.temporary / GiB}


#: PyTorch's cuBLAS workspace per handle by default (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize):
#: CUBLAS_WORKSPACE_CONFIG ':4096:8', 32 MiB, on compute capability 9.0 (Hopper), ':4096:2:16:8', 8 MiB and 128 KiB, on
#: every other GPU (the rule names 9.0 alone: Blackwell's 10.0 gets the general size, not measured here). cuBLASLt
#: reuses it (TORCH_CUBLASLT_UNIFIED_WORKSPACE, the default of CUDA builds: torch.backends.cuda.blas_workspace_size).
#: A GPU the catalog gives no capability (AMD's: hipBLASLt's own sizes) is given the general size, not measured here.
HOPPER_CUBLAS_WORKSPACE_BYTES = 4096 * 8 * 1024
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8


def gpu_library_workspace_bytes(device, forward_only: bool = False) -> float:
    """Bytes a process's GPU math libraries take from the caching allocator: one cuBLAS workspace per handle, and
    PyTorch keeps a handle per thread, so a training step has two, its forward's (the main thread) and its backward's
    (autograd's device thread); a forward-only step one; a CPU none. The lent H100's and H200's steps whose peak is
    the optimizer step's exceed the model without them by 64.0-82.1 MiB, 2 x 32 MiB at the least
    (``python experiments/memory_accuracy.py``)."""
    if device.is_cpu:
        return 0.0
    per_handle = HOPPER_CUBLAS_WORKSPACE_BYTES if device.compute_capability == "9.0" else CUBLAS_WORKSPACE_BYTES
    return float(per_handle * (1 if forward_only else 2))


def activation_element_bytes(strategy) -> int:
    """Bytes of one activation element of a run's layers: 2 in bf16, fp16 and fp8 (whose activations stay bf16), 4 in
    fp32 and tf32."""
    return 2 if strategy.precision in ("bf16", "fp16", "fp8") else 4


def eager_attention_extra_bytes(run, tokens: int) -> float:
    """Bytes an eager PyTorch attention block (``fused_elementwise`` false) saves beside Q, K, V and its output,
    on all tensor-parallel ranks together (the caller divides by tp), for ``tokens`` tokens.

    * Grouped-query attention in fp32 on a GPU: PyTorch's fused kernels take ``enable_gqa`` in FlashAttention
      only, which needs fp16 / bf16, so k and v are repeated to every query head first (Hugging Face's
      ``repeat_kv``, the step harness's ``gqa_needs_expanded_kv``) and the memory-efficient kernel saves the
      repeated copies: ``(heads - kv_heads)`` more heads of each. The QKV GEMM's output is then no longer alive.
    * Otherwise, rotary embeddings applied by tensor operations (the rotate-half form) make new Q and K while
      V, a view of the QKV GEMM's output, is saved by the attention kernel and keeps that whole output alive:
      its Q and K part once more (``torch.autograd.graph.saved_tensors_hooks`` on the harness's layer,
      ``experiments/activation_memory.py``). A fused RoPE kernel does the same in Megatron-Core, but its count
      there is not measured here, so fused runs keep the count they had.

    Latent attention (``kv_lora_rank`` > 0) has no fused QKV GEMM and no measured eager layer here: nothing added.
    """
    m, s = run.model, run.strategy
    if s.fused_elementwise or not s.flash_attention or m.kv_lora_rank:
        return 0.0
    e = activation_element_bytes(s)
    k_hd, v_hd = m.num_kv_heads * m.head_dim, m.num_kv_heads * m.v_head_dim
    a = m.num_attention_heads
    if m.num_kv_heads < a and e == 4 and not run.hardware.device.is_cpu:
        return float(tokens * ((a * m.head_dim - k_hd) + (a * m.v_head_dim - v_hd)) * e)
    if m.position_embedding == "rope":
        return float(tokens * (m.attention_width + k_hd) * e)
    return 0.0


def layer_activation_bytes(run, recompute: str | None = None) -> float:
    """Bytes one transformer layer of ``run`` (a RunSpec) saves for backward, per micro-batch, on one rank
    (``recompute``: in place of the run's, as ``"none"`` asks what a recomputed layer holds again)."""
    m, s = run.model, run.strategy
    recompute = s.recompute if recompute is None else recompute
    b, seq = s.micro_batch_size, m.seq_length // s.cp
    h, t = m.hidden_size, s.tp
    e = activation_element_bytes(s)
    er = 4 if s.autocast else e  # norm inputs and the layer input: the fp32 residual stream under autocast
    # the inputs of fp8 GEMMs are saved as Transformer Engine casts them, 1 byte an element (Linear keeps its
    # fp8 input, LayerNormLinear/LayerNormMLP their fp8 norm output and FC2 input for the weight gradients);
    # attention's Q, K, V and the activation function's input stay bf16
    eg = 1 if s.precision == "fp8" else e
    sp = s.sequence_parallel and t > 1
    T = b * seq
    q_hd = m.attention_width  # hidden_size unless head_dim is set apart
    # keys, values and the projection input (latent attention has num_kv_heads = heads and values of v_head_dim)
    k_hd, v_hd, o_hd = m.num_kv_heads * m.head_dim, m.num_kv_heads * m.v_head_dim, m.value_width
    a = m.num_attention_heads
    dropout = runs_dropout(m, s.forward_only)
    # FFN width a token passes through, averaged over the model's layers (the stages' mix of MoE and dense
    # layers is not told apart)
    f = m.ffn_width_sum / m.num_layers
    load = s.expert_load
    if load != 1.0:
        # the busiest rank's experts hold their capacity (or largest dropless load) of token rows, not k per token
        f += (load - 1.0) * m.num_moe_layers * m.ffn_hidden_size * m.moe_top_k / m.num_layers
    if recompute == "full":
        return T * h * er / (t if sp else 1)
    # tensors replicated across TP ranks unless sequence parallel: norm inputs, QKV and FC1 inputs, masks
    replicated = T * h * er * 2 + T * h * eg * 2 + (2 * T * h if dropout else 0)
    # MLA's latents, every rank whole: the query and key-value latents before their norms, and after them as
    # the up projections' inputs
    replicated += T * (m.q_lora_rank + m.kv_lora_rank) * (e + eg) + T * m.qk_rope_head_dim * e
    sharded = (T * (q_hd + k_hd) * e  # Q and K for the scores
               + T * v_hd * e  # V
               + T * o_hd * eg  # projection input (attention output)
               + T * f * e * (2 if m.activation == "swiglu" else 1)  # activation-function input
               + T * f * eg  # FC2 input
               # eager SwiGLU keeps silu(gate) too, for the product's gradient of up (fused, it is recomputed)
               + (T * f * e if m.activation == "swiglu" and not s.fused_elementwise else 0)
               # eager gelu_new (EAGER_GELU_NEW) keeps three more: tanh's output, 0.5·x and 1 + tanh (logged with
               # torch.autograd.graph.saved_tensors_hooks: four tensors of the input's size, the input included)
               + (3 * T * f * e if m.activation == "gelu_new" and not s.fused_elementwise else 0)
               + eager_attention_extra_bytes(run, T))
    # a MoE layer keeps more than a dense one's FC1 input: the routed copies in expert order that its experts'
    # FC1 reads (every TP rank holds all of its experts' rows, so they are not split over tp; capacity pads
    # them), the experts' outputs the combine weights multiply (saved for the weights' gradient) and the
    # router's fp32 softmax over every expert; averaged over the layers like ``f``
    routing = 0.0
    if m.num_moe_layers:
        k = m.moe_top_k
        routing = m.num_moe_layers / m.num_layers * (T * k * load * h * eg + T * k * h * e + T * m.num_experts * 4)
    scores = 0.0
    if not s.flash_attention and recompute != "selective":
        # softmax output (e), dropout mask (1 byte) and dropout output (e) per score (Korthikanti eq. 2); without
        # dropout the PV product reads the softmax output itself, saved once
        scores = (e + (e + 1 if dropout else 0)) * a * b * seq * seq * s.cp
    elif s.flash_attention:
        scores = 4.0 * a * b * seq  # fp32 log-sum-exp per query row
    return replicated / (t if sp else 1) + (sharded + scores) / t + routing


def memory_microbatches(run) -> int:
    """Fewest micro-batches whose compiled schedules already reach ``run``'s peak memory.

    Peak memory depends on the micro-batch count only through the activations in flight on a
    stage, which stop growing after the warm-up (and, with gradients freed each step, through whether there is
    more than one, which the run's own count says): ``p - 1`` forwards for 1F1B, at most
    ``(p-1)·2 + (v-1)·p < 2·p·v`` chunk forwards for the interleaved schedule and ``v·p - 1`` for interleaved
    zero bubble (reached with ``2·p`` micro-batches, a multiple of ``p`` as interleaving needs), ``2p`` chunk
    forwards of ``p`` micro-batches for ZB-V (whose order is laid out on at least ``2p-1``), one without a pipeline;
    GPipe keeps every micro-batch in flight and needs them all. Compiling this many instead of
    thousands keeps memory checks cheap.
    """
    s = run.strategy
    m = run.num_microbatches
    if s.pp == 1:
        return min(m, 2)
    if s.pipeline_schedule == "gpipe":
        return m
    return min(m, 2 * s.pp if s.interleaved or s.v_shape else s.pp)


def in_flight_microbatches(schedule: list[tuple[str, int, int]]) -> int:
    """Largest number of forward units whose backward has not yet run, along a stage's schedule.

    A zero-bubble schedule's ``B`` ends a unit's flight: its weight-gradient pass ``W`` keeps only the
    GEMMs' saved inputs, which are not counted (stage ``i`` of ZB-H1 defers ``i`` of them, and the
    paper's peak, ``p`` micro-batches' activations on the first stage, is 1F1B's).
    """
    live = peak = 0
    for kind, _c, _mb in schedule:
        if kind == "F":
            live += 1
        elif kind == "B":
            live -= 1
        peak = max(peak, live)
    return peak


def peak_in_flight(run, stage: int) -> int:
    """Largest number of forward units in flight on pipeline ``stage`` of ``run`` (closed form).

    The same number as :func:`in_flight_microbatches` over the compiled schedule: 1F1B stage
    ``i`` (and ZB-H1's) warms up with ``min(p-i-1, m)`` forwards and runs one more before its first
    backward; interleaving warms up with ``(p-i-1)·2 + (v-1)·p`` chunk forwards (Megatron); ZB-V's
    rank ``i`` runs ``2p-i-1`` chunk-0 forwards and ``i+1`` chunk-1 forwards before its first ``B``
    (each count cut at the ``m`` micro-batches there are) and never has more in flight after; interleaved zero
    bubble warms up with ``(v-1)·p + p-i-1`` (PyTorch's order, one more forward before the first ``B``); GPipe
    holds every micro-batch; without a pipeline one micro-batch is in flight.
    """
    s = run.strategy
    m, p, v = run.num_microbatches, s.pp, s.virtual_pipeline_stages
    if p == 1:
        return min(m, 1)
    if s.pipeline_schedule == "gpipe":
        return m
    if s.pipeline_schedule == "interleaved":
        return min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
    if s.pipeline_schedule == "zb-v":
        return min(2 * p - stage - 1, m) + min(stage + 1, m)
    if s.pipeline_schedule == "interleaved-zb":
        return min(v * p - stage, m * v)
    return min(p - stage, m)


def peak_memory(eg: ExecutionGraph) -> MemoryBreakdown:
    """Peak per-device memory over the pipeline ranks of a compiled run (bytes)."""
    chunks = sorted((c for st in eg.stages for c in st.chunks), key=lambda c: c.vstage)
    return _peak(eg.run, stage_loads(chunks, len(eg.stages), v_shape=eg.run.strategy.v_shape),
                 [in_flight_microbatches(st.schedule) for st in eg.stages])


def peak_memory_of(run, loads: list[StageLoad] | None = None) -> MemoryBreakdown:
    """Peak per-device memory of ``run`` (a RunSpec) without compiling it: the same bytes as
    :func:`peak_memory` of the compiled run, from :func:`~learnedperf.graph.execution.stage_loads`
    (``loads``, if the caller has them) and :func:`peak_in_flight`. Fast enough to check thousands
    of strategies a second."""
    pp = run.strategy.pp
    if loads is None:
        loads = stage_loads(chunk_layout(run), pp, v_shape=run.strategy.v_shape)
    return _peak(run, loads, [peak_in_flight(run, st) for st in range(pp)])


def _peak(run, loads: list[StageLoad], in_flight: list[int]) -> MemoryBreakdown:
    """The most loaded stage, given each stage's load and forward units in flight.

    A stage's peak is the larger of two moments: its forward and backward (states, the activations of the
    micro-batches in flight, the loss's and ZeRO-3's temporaries; without ``persistent_grads`` the gradients only
    once a backward has made them) and its optimizer step (states, every gradient and the optimizer's own
    temporaries, the activations freed).
    """
    m, s = run.model, run.strategy
    zero = s.effective_zero_stage
    pbytes = state_bytes_per_param(s)[0]
    per_layer = layer_activation_bytes(run)
    # autocast: each GEMM saves its low-precision weight copy for backward (not kept under full recompute)
    cast_copy = 2.0 if s.autocast and s.recompute != "full" else 0.0
    T = s.micro_batch_size * m.seq_length // s.cp
    if s.forward_only:
        # nothing is saved for a backward: one layer of one micro-batch is alive at a time (and no gradients:
        # state_bytes_per_param gives them no bytes)
        in_flight = [1] * len(loads)

    shard_states = state_sharding(s)
    seen: dict[tuple[float, float], tuple[float, float, float]] = {}  # the middle stages hold the same layers

    def states(ld: StageLoad) -> tuple[float, float, float]:
        # weights, gradients and optimizer states after ZeRO sharding (experts over their own group)
        key = (ld.dense_params, ld.expert_params)
        hit = seen.get(key)
        if hit is None:
            hit = seen[key] = shard_states(*key)
        return hit

    # fp32 logits of one micro-batch and the loss's backward, last stage: Megatron's vocab-parallel cross entropy
    # keeps the fp32 softmax and writes its gradient over it (taken as 2 logits' worth: not measured here); torch's
    # F.cross_entropy (eager,
    # ``fused_elementwise`` false) saves log_softmax's output, and its backward holds it, the gradient of the
    # log-probabilities and the gradient of the logits at once (3); a forward-only step has no gradient (1)
    copies = 1 if s.forward_only else 2 if s.fused_elementwise else 3
    logits = copies * 4.0 * T * m.vocab_size / s.tp if m.lm_head else 0.0
    # gradients alive at the forward/backward peak: kept in buffers, or made by an earlier micro-batch's backward
    # before this one's forward (accumulation); with a pipeline they are counted (an upper bound: a 1F1B stage's
    # peak recurs after its first backward unless it runs its micro-batches' forwards all before it); and under
    # data parallelism without per-layer sharding the reduction's buckets are a gradient-sized buffer kept across
    # iterations (torch DDP's; its gradient_as_bucket_view saves "the total gradients size", its documentation says)
    grads_in_backward = (s.persistent_grads or s.pp > 1 or run.num_microbatches > 1
                         or (s.dp * s.cp > 1 and not s.per_layer_sharding))

    def live_layers(ld: StageLoad) -> float:
        # layers whose activations a micro-batch in flight holds: every layer of the chunk for a backward
        return 1.0 if s.forward_only else ld.layers

    # what every phase holds besides the states: the GPU math libraries' workspaces
    workspace = gpu_library_workspace_bytes(run.hardware.device, s.forward_only)
    # full recomputation runs a layer's forward again inside its backward: that layer's activations are alive
    recomputed = (layer_activation_bytes(run, "none") if s.recompute == "full" and not s.forward_only else 0.0)

    def temporary(ld: StageLoad) -> float:
        # the workspaces, a recomputed layer, the loss's tensors on the last stage and, under ZeRO-3, the gathered
        # full weights of the layers being computed and prefetched (two layers)
        return (workspace + recomputed + (logits if ld.last else 0.0)
                + (2 * ld.layer_params * pbytes if zero >= 3 else 0.0))

    def optimizer_temporary(ld: StageLoad) -> float:
        # torch.optim's Adam makes sqrt of the second moment as new fp32 tensors (torch/optim/adam.py): foreach for
        # every local parameter at once, the for-loop one parameter at a time (its sqrt and the quotient by the bias
        # correction alive together; the largest tensor: the embedding or LM head where the stage holds one, else an
        # FFN matrix); fused kernels and SGD update in place
        if s.optimizer != "adam" or s.optimizer_impl == "fused":
            return workspace
        if s.optimizer_impl == "foreach":
            return workspace + 4.0 * sharded_params(s, ld.dense_params, ld.expert_params, 1)
        largest = max(m.vocab_size * m.hidden_size if ld.root_params else 0.0,
                      m.hidden_size * max(m.ffn_hidden_size, m.dense_ffn_hidden_size))
        return workspace + 2 * 4.0 * largest / s.tp

    # the optimizer step can only peak over the backward where it holds gradients the backward does not, or
    # temporaries of its own (every other term of it the backward holds too): planners check thousands of runs
    step_can_peak = not grads_in_backward or (s.optimizer == "adam" and s.optimizer_impl != "fused")
    best: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    best_total, best_index, best_phase = -1.0, 0, "forward_backward"
    for index, ld in enumerate(loads):
        weights, grads, optim = states(ld)
        act = (per_layer + cast_copy * ld.layer_params) * live_layers(ld) * in_flight[index]
        candidates = [("forward_backward", (weights, grads if grads_in_backward else 0.0, optim, act, temporary(ld)))]
        if step_can_peak:
            candidates.append(("optimizer_step", (weights, grads, optim, 0.0, optimizer_temporary(ld))))
        for phase, parts in candidates:
            total = sum(parts)
            if total > best_total:
                best, best_total, best_index, best_phase = parts, total, index, phase
    return MemoryBreakdown(*best, best_index, best_phase)
