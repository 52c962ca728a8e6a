"""Compile a run into an execution graph.

The execution graph is what one representative rank of each pipeline stage
does in one iteration: the ops of each of its model chunks (tensor-, context-
and expert-parallel collectives included) for forward, backward and
recomputation; the pipeline schedule (the order of forward/backward units on
each stage); pipeline send/recv sizes; gradient reduction in buckets (DDP), or
ZeRO / FSDP gathers and reduce-scatters; and the optimizer step.

Data-, tensor- and context-parallel replicas of a stage do the same work at
the same time, so one rank per stage represents all of them: a 3072-GPU run
with pp=64 compiles to 64 stage programs, not 3072.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ..specs import RunSpec
from ..units import MiB, dtype_bytes
from .ops import Group, Op, comm, elementwise
from .transformer import (Shard, backward_of, embedding_backward, embedding_forward, head_forward, layer_forward,
                          optimizer_ops, shard_for)

Block = tuple[list[Op], int]  # ops and how many times they repeat (identical layers)

#: Most units the model's layers are laid out in, over all its chunks, when parameters are gathered layer by
#: layer: deeper models group consecutive layers of a chunk into one unit (its gather and reduce-scatter carry
#: every grouped layer's bytes and per-collective latency), which bounds the events of a 100-layer FSDP model
#: without changing the traffic. The simulator splits each unit's collectives into the layer its computation
#: waits for and the rest, so the exposed first gather and last reduce-scatter stay one layer's.
MAX_SHARDED_UNITS = 4


@dataclass
class Chunk:
    """One model chunk (virtual pipeline stage) held by a pipeline rank."""

    vstage: int
    num_layers: int
    forward: list[Block]
    backward: list[Block]  # recomputation (phase "recompute") included, in execution order
    params: float  # parameters held (after tensor/expert sharding, before ZeRO)
    dense_params: float  # of which reduced over dp·cp
    expert_params: float  # of which reduced over the expert-data-parallel group
    layer_params: float  # parameters of one dense layer (the gathered buffers of ZeRO-3 memory)
    root_params: float = 0.0  # of ``params``, those outside the layers (embedding, final norm, LM head)

    @property
    def params_per_layer(self) -> float:
        """The chunk's parameters outside its root, per layer (dense and MoE layers averaged): what
        ZeRO-3/FSDP gather and reduce-scatter for one layer."""
        return (self.params - self.root_params) / max(1, self.num_layers)


@dataclass
class Stage:
    """One pipeline rank: its chunks and its schedule of forward/backward units."""

    index: int
    chunks: list[Chunk]
    schedule: list[tuple[str, int, int]]  # ("F"|"B"|"W", chunk index, micro-batch); "W" only in zero-bubble schedules
    optimizer: list[Op] = field(default_factory=list)


@dataclass
class ExecutionGraph:
    """The compiled program of one iteration (see module docstring)."""

    run: RunSpec
    stages: list[Stage]
    num_microbatches: int
    p2p_bytes: float
    p2p_group: Group
    dp_group: Group  # gradient reduction group of dense parameters (dp·cp ranks)
    expert_dp_group: Group
    tp_group: Group
    bucket_bytes: float
    grad_bytes_per_param: int
    param_bytes_per_param: int
    tied_embedding_bytes: float  # grads exchanged between first and last stage (tied embeddings, pp>1)
    # ZeRO/FSDP collectives run in one copy of the sharded states (dp·cp/dp_replicate ranks; the dp group
    # without hybrid sharding); hybrid sharding all-reduces each shard's gradients over the replicas
    shard_group: Group = Group(1, 1)
    expert_shard_group: Group = Group(1, 1)
    replicate_group: Group = Group(1, 1)

    def num_ops(self) -> int:
        """Distinct op entries across all stage programs (a size measure)."""
        return sum(len(ops) for st in self.stages for c in st.chunks for ops, _ in c.forward + c.backward)


def group_placement(size: int, stride: int, devices_per_node: int) -> Group:
    """Placement of a group of ``size`` ranks spaced ``stride`` apart (Megatron order tp, cp, dp, pp)."""
    if size <= 1:
        return Group(1, 1)
    if stride >= devices_per_node:
        return Group(size, 1)
    per_node = max(1, min(size, devices_per_node // stride))
    while size % per_node:  # a partial node: fall back to what divides evenly
        per_node -= 1
    return Group(size, per_node)


def schedule_1f1b(p: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """Non-interleaved 1F1B (PipeDream-Flush): warm-up forwards, steady 1F1B, cool-down backwards."""
    warm = min(p - stage - 1, m)
    order: list[tuple[str, int, int]] = [("F", 0, i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        order.append(("F", 0, f))
        f += 1
        order.append(("B", 0, b))
        b += 1
    order.extend(("B", 0, i) for i in range(b, m))
    return order


def schedule_gpipe(m: int) -> list[tuple[str, int, int]]:
    """GPipe: all forwards, then all backwards."""
    return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]


def _interleaved_unit(p: int, v: int, k: int, forward: bool) -> tuple[int, int]:
    """(chunk, micro-batch) of a rank's ``k``-th forward (or backward) unit under interleaving: groups of
    ``p`` micro-batches go through the chunks in turn (backwards through them in reverse)."""
    chunk = (k % (p * v)) // p
    if not forward:
        chunk = v - 1 - chunk
    return chunk, (k // (p * v)) * p + (k % p)


def schedule_forward_only(p: int, v: int, m: int) -> list[tuple[str, int, int]]:
    """Forward units only (an inference or evaluation step): every micro-batch through every chunk in
    the order the training schedule runs forwards (Megatron's ``forward_only`` schedules); each stage
    passes a micro-batch on as soon as it is done, so nothing waits for a backward."""
    if v == 1:
        return [("F", 0, i) for i in range(m)]
    return [("F", *_interleaved_unit(p, v, k, True)) for k in range(m * v)]


def schedule_interleaved(p: int, v: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B with ``v`` model chunks per rank (Narayanan et al., SC21, §2.2)."""
    total = m * v

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order: list[tuple[str, int, int]] = []
    for k in range(warm):
        order.append(("F", *_interleaved_unit(p, v, k, True)))
    fk, bk = warm, 0
    while fk < total:
        order.append(("F", *_interleaved_unit(p, v, fk, True)))
        fk += 1
        order.append(("B", *_interleaved_unit(p, v, bk, False)))
        bk += 1
    while bk < total:
        order.append(("B", *_interleaved_unit(p, v, bk, False)))
        bk += 1
    return order


def schedule_zb_h1(p: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """Zero bubble H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 3.1): 1F1B with the
    backward split into the input gradient ``B``, on the critical path, and the weight gradient ``W``.

    Stage ``i`` warms up and alternates forwards and ``B`` as 1F1B does; it runs each ``W`` after a ``B``,
    but only from its ``i``-th backward on, and the ``i`` it deferred at the end, where 1F1B's later stages
    sit idle. Every stage then holds ``p`` micro-batches between their forward and their ``W``, and at most
    1F1B's ``p - i`` between their forward and their ``B``. With equal times for every stage the
    iteration takes ``m(F+B+W) + (p-1)(F+B-W)`` when ``m >= p`` and ``W`` is no longer than ``F`` and ``B``,
    against 1F1B's ``(m+p-1)(F+B+W)`` (the paper's Table 1).
    """
    warm = min(p - stage - 1, m)
    order: list[tuple[str, int, int]] = [("F", 0, i) for i in range(warm)]
    f, b, w = warm, 0, 0
    while b < m:
        if f < m:
            order.append(("F", 0, f))
            f += 1
        order.append(("B", 0, b))
        b += 1
        if b > stage:  # this stage's first ``stage`` weight passes wait for the end
            order.append(("W", 0, w))
            w += 1
    order.extend(("W", 0, k) for k in range(w, m))
    return order


def schedule_zb_v(p: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """ZB-V (Qi et al., ICLR 2024, section 6): rank ``stage`` holds chunk 0 (virtual stage ``stage``) and chunk
    1 (virtual stage ``2p-1-stage``), so the first and the last virtual stage share rank 0; the backward is
    split into ``B`` and ``W``.

    The order is PyTorch's ``ScheduleZBVZeroBubble`` (``torch.distributed.pipelining``, the schedule torchtitan
    runs as ``ZBVZeroBubble``): rank ``r = stage`` runs ``2(p-r)-1`` chunk-0 forwards, ``r`` pairs of chunk-1
    and chunk-0 forwards, ``p-r`` triples F, B, W of chunk 1, a steady state of F, B, W on chunk 0 then chunk 1,
    then a cool-down of the remaining ``B`` and the deferred ``W``. Like PyTorch it lays out at least ``2p-1``
    micro-batches and drops the units of those the step does not have. Every rank holds up to ``2p`` chunk
    forwards between their forward and their ``B``: ``p`` micro-batches of a whole stage, 1F1B's first stage.
    """
    n = max(2 * p - 1, m)
    c0, c1 = 0, 1
    order: list[tuple[str, int, int]] = []
    count = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}

    def unit(kind: str, chunk: int) -> None:
        order.append((kind, chunk, count[(kind, chunk)]))
        count[(kind, chunk)] += 1

    def triple(chunk: int) -> None:
        # a B and its W at once
        unit("B", chunk)
        order.append(("W", chunk, order[-1][2]))

    for _ in range(2 * (p - stage) - 1):
        unit("F", c0)
    for _ in range(stage):
        unit("F", c1)
        unit("F", c0)
    for _ in range(p - stage):
        unit("F", c1)
        triple(c1)
    while count[("F", 1)] < count[("F", 0)] or count[("F", 0)] < n:
        if count[("F", 0)] < n:
            unit("F", c0)
        triple(c0)
        unit("F", c1)
        triple(c1)
    w0, w1 = count[("B", 0)], count[("B", 1)]
    for _ in range(stage):
        unit("B", c0)
        unit("B", c1)
    for _ in range(p - stage):
        unit("B", c0)
        order.append(("W", c0, w0))
        w0 += 1
    order += [("W", c1, k) for k in range(w1, count[("B", 1)])]
    order += [("W", c0, k) for k in range(w0, count[("B", 0)])]
    return [u for u in order if u[2] < m]


def schedule_interleaved_zb(p: int, v: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """Interleaved zero bubble: Megatron's placement of ``v`` chunks per rank (rank ``r`` holds virtual stages
    ``r, r+p, ...``), the backward split into ``B`` and ``W``.

    The order is PyTorch's ``ScheduleInterleavedZeroBubble`` (``torch.distributed.pipelining``, torchtitan's
    ``InterleavedZeroBubble``; the ZB-1P schedule of Qi et al., ICLR 2024, interleaved), for ``m`` a multiple of
    ``p``, where PyTorch's rounds hold ``p`` micro-batches each: rank ``r`` warms up with ``(v-1)p + p-1-r``
    chunk forwards (one more per hop towards rank 0, where interleaved 1F1B adds two: the ``W`` fill the gaps),
    then alternates a forward with a ``B``, each chunk's micro-batches in groups of ``p`` as interleaving runs them
    (backwards through the chunks in reverse), and runs a ``W`` after every ``B`` from its ``r+1``-th on; it ends
    with the ``r`` it deferred. The units PyTorch pads with to align ranks are waits, which the simulator finds itself.
    """
    total = m * v
    warm = min((v - 1) * p + p - 1 - stage, total)
    order: list[tuple[str, int, int]] = [("F", *_interleaved_unit(p, v, k, True)) for k in range(warm)]
    backwards: list[tuple[int, int]] = []  # (chunk, micro-batch) of every B so far: the W follow in that order
    for k in range(warm, total + warm):
        if k < total:
            order.append(("F", *_interleaved_unit(p, v, k, True)))
        backwards.append(_interleaved_unit(p, v, k - warm, False))
        order.append(("B", *backwards[-1]))
        if k - warm >= stage:  # this rank's first ``stage`` weight passes wait for the end
            order.append(("W", *backwards[k - warm - stage]))
    order += [("W", *unit) for unit in backwards[max(0, total - stage):]]
    return order


def pipeline_order(schedule: str, p: int, v: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """The units of pipeline rank ``stage`` of ``p`` (``p >= 2``, ``v`` chunks each) in a training step of ``m``
    micro-batches under ``schedule``, as ``(kind, chunk, micro-batch)``: what the compiler gives every stage, and
    what the step harness runs (:mod:`learnedperf.measure.steps`), so that what is measured is what is simulated.

    Raises:
        ValueError: a schedule this module has no order for.
    """
    if schedule == "gpipe":
        return schedule_gpipe(m)
    if schedule == "1f1b":
        return schedule_1f1b(p, m, stage)
    if schedule == "interleaved":
        return schedule_interleaved(p, v, m, stage)
    if schedule == "zb-h1":
        return schedule_zb_h1(p, m, stage)
    if schedule == "zb-v":
        return schedule_zb_v(p, m, stage)
    if schedule == "interleaved-zb":
        return schedule_interleaved_zb(p, v, m, stage)
    raise ValueError(f"pipeline schedule {schedule!r} has no order")


def stage_of(vstage: int, pp: int, v_shape: bool) -> int:
    """The pipeline rank that holds virtual stage ``vstage``: ``vstage mod pp`` (Megatron's interleaving, rank ``r``
    holding ``r, r+p, ...``), or in a V (ZB-V) ``vstage`` for the first ``pp`` and ``2pp-1-vstage`` after."""
    if v_shape and vstage >= pp:
        return 2 * pp - 1 - vstage
    return vstage % pp


def rank_vstages(stage: int, pp: int, v: int, v_shape: bool) -> list[int]:
    """The virtual stages of rank ``stage``'s chunks, in chunk order (the inverse of :func:`stage_of`)."""
    if v_shape:
        return [stage, 2 * pp - 1 - stage]
    return [c * pp + stage for c in range(v)]


def is_weight_gradient(op: Op) -> bool:
    """True for a GEMM's weight-gradient pass (:func:`~learnedperf.graph.transformer.backward_of`'s
    ``.wgrad``), which a zero-bubble schedule runs apart from the rest of the backward."""
    return op.kind == "matmul" and op.name.endswith(".wgrad")


def split_weight_gradients(blocks: list[Block]) -> tuple[list[Block], list[Block]]:
    """A chunk's backward blocks as (input-gradient blocks, weight-gradient blocks), each block keeping its
    repeat count: the ``B`` and ``W`` passes of a zero-bubble schedule."""
    b_blocks, w_blocks = [], []
    for ops, rep in blocks:
        b_blocks.append(([op for op in ops if not is_weight_gradient(op)], rep))
        w_blocks.append(([op for op in ops if is_weight_gradient(op)], rep))
    return b_blocks, w_blocks


def _spread(total: int, slots: list[int], centre: float) -> dict[int, int]:
    """``total`` layers over ``slots`` (rank or virtual-stage indices): evenly, the spare ones to the
    slots closest to ``centre`` (ties to the earlier slot)."""
    base, extra = divmod(total, len(slots))
    counts = dict.fromkeys(slots, base)
    for i in sorted(slots, key=lambda i: (abs(i - centre), i))[:extra]:
        counts[i] += 1
    return counts


def layers_per_vstage(num_layers: int, pp: int, v: int = 1, v_shape: bool = False) -> list[int]:
    """Layers of each of the ``pp·v`` virtual stages, in virtual-stage order.

    Layers that do not divide go to the middle: first over the pipeline *ranks* (the first holds the
    embedding, the last the LM head), then, within a rank, to its chunks nearest the model's middle.
    Llama 3 405B's 126 layers on 16 ranks × 2 chunks give ranks of 7, 8, …, 8, 7 layers, the first and
    last chunk 3 (Llama Team 2024, arXiv 2407.21783, section 3.3.2: one layer fewer on the first and
    the last stage). In a V (``v_shape``) rank 0 holds both the embedding and the LM head, so the
    spare layers go to the ranks farthest from it, and a rank's two chunks are its V pair.
    """
    n = pp * v
    per_rank = _spread(num_layers, list(range(pp)), pp - 1 if v_shape else (pp - 1) / 2)
    counts = [0] * n
    for rank in range(pp):
        for vs, c in _spread(per_rank[rank], rank_vstages(rank, pp, v, v_shape), (n - 1) / 2).items():
            counts[vs] = c
    return counts


#: Host work a recomputation costs beyond one more forward of its ops, in forwards of them, by
#: ``Strategy.checkpoint_impl``: the medians ``python experiments/checkpoint_overhead.py`` prints (tiny GPT, BERT
#: and Llama layers on one CPU thread, fp32 and bf16 autocast, torch 2.13; non-reentrant 1.39-2.38, reentrant
#: 0.02-0.55). The non-reentrant checkpoint's saved-tensor hooks cost the host in the forward too (1.5-1.7 times the
#: plain forward there); all of it is charged to the recomputed ops, which a step without a pipeline times alike.
CHECKPOINT_HOST_EXCESS = {"reentrant": 0.35, "non_reentrant": 1.90}


def recompute_ops(fwd: list[Op], policy: str, impl: str = "reentrant") -> list[Op]:
    """Ops re-run before a backward under ``policy`` (full: the whole forward; selective: core attention),
    each charging the host 1 + :data:`CHECKPOINT_HOST_EXCESS` ``[impl]`` of its dispatches."""
    weight = 1.0 + CHECKPOINT_HOST_EXCESS[impl]
    if policy == "full":
        keep = fwd
    elif policy == "selective":
        keep = [op for op in fwd if op.name.split(".")[-1] in ("scores", "softmax", "dropout", "context")
                and ".attn." in op.name]
    else:
        return []
    return [Op(op.name + ".recompute", op.kind, "recompute", op.flops, op.bytes, op.dtype, op.shape, op.group,
               op.causal, op.kernels, op.host_free, op.chained, host_weight=op.host_weight * weight) for op in keep]


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """Layers and parameters of one virtual pipeline stage (what memory needs, without the ops)."""

    vstage: int
    num_layers: int
    num_dense: int
    num_moe: int
    dense_params: float  # after tensor sharding, before ZeRO; reduced over dp·cp
    expert_params: float  # reduced over the expert-data-parallel group
    layer_params: float  # parameters of one dense layer on this rank (FSDP gathers)
    root_params: float = 0.0  # of dense_params, those outside the layers (embedding, final norm, LM head)


def state_bytes_per_param(s) -> tuple[int, int]:
    """Bytes per parameter of the compute weights and of the gradients for strategy ``s`` (no gradients in a
    forward-only step)."""
    # fp8 runs keep bf16 weights; autocast keeps fp32 weights and casts them at each GEMM
    pbytes = dtype_bytes(s.weight_precision) if s.precision not in ("fp8",) else 2
    return pbytes, 0 if s.forward_only else dtype_bytes(s.reduce_precision)


def optimizer_bytes_per_param(s) -> int:
    """Bytes per parameter the optimizer keeps for strategy ``s``: fp32 master weights when the compute
    copy is low precision, plus Adam's two fp32 moments; none without an optimizer step."""
    if s.optimizer == "none":
        return 0
    master = 4 if state_bytes_per_param(s)[0] < 4 else 0
    return master + (8 if s.optimizer == "adam" else 0)


def sharded_params(s, dense_params: float, expert_params: float, stage: int) -> float:
    """Parameters of ``dense_params`` + ``expert_params`` whose state one rank holds, for a state that ZeRO
    shards from ``stage`` on (optimizer states: 1, gradients: 2, weights: 3; FSDP counts as 3). Dense
    parameters are sharded over ``s.shard_size`` ranks (dp·cp, or one hybrid copy's), expert parameters over
    their expert-data-parallel group, ``s.expert_shard_size`` (each expert lives on one of ep ranks), as
    Megatron-Core's distributed optimizer shards them."""
    shard, eshard = _shard_sizes(s, stage)
    return dense_params / shard + expert_params / eshard


def _shard_sizes(s, stage: int) -> tuple[int, int]:
    """Ranks one copy of the dense and of the expert parameters' state is split over, for a state ZeRO shards
    from ``stage`` on (1 and 1 below it: dividing by 1 is exact, so unsharded bytes are the sums)."""
    if s.effective_zero_stage < stage:
        return 1, 1
    return s.shard_size, s.expert_shard_size


def sharded_state_bytes(s, dense_params: float, expert_params: float) -> tuple[float, float, float]:
    """Bytes of the weights, gradients and optimizer states of ``dense_params`` + ``expert_params`` on one
    rank after ZeRO sharding (:func:`sharded_params`)."""
    return state_sharding(s)(dense_params, expert_params)


def state_sharding(s) -> Callable[[float, float], tuple[float, float, float]]:
    """:func:`sharded_state_bytes` of strategy ``s`` as a function of (dense, expert) parameters, with the
    strategy's bytes per parameter and shard sizes looked up once: a memory check asks it once per pipeline
    stage, and the fast tier checks thousands of strategies a second. :func:`sharded_params`' rule times the
    bytes."""
    pbytes, gbytes = state_bytes_per_param(s)
    parts = tuple((nbytes, *_shard_sizes(s, stage)) for nbytes, stage in ((pbytes, 3), (gbytes, 2),
                                                                          (optimizer_bytes_per_param(s), 1)))

    def state_bytes(dense_params: float, expert_params: float) -> tuple[float, float, float]:
        return tuple((dense_params / shard + expert_params / eshard) * nbytes for nbytes, shard, eshard in parts)

    return state_bytes


def layer_param_split(model, ep: int) -> tuple[int, int, int]:
    """Parameters of one layer on one expert-parallel rank, before tensor parallelism: a dense layer's,
    an MoE layer's dense part (attention, norms, the router, h × experts, and the shared experts, all
    replicated over ep) and the routed experts of an MoE layer that rank keeps (experts / ep of them)."""
    mlp, dense = model.mlp_params, model.layer_params(False)
    # an MoE layer's count without its routed experts keeps the router and shared experts that
    # ModelSpec.layer_params counts
    moe_dense = model.layer_params(True) - model.num_experts * mlp if model.is_moe else dense - mlp
    return dense, moe_dense, (model.num_experts // ep) * mlp


def chunk_layout(run: RunSpec) -> list[ChunkLayout]:
    """Every virtual stage's layers and parameters, in virtual-stage order (``pp·v`` entries).

    The compiler builds each chunk's ops on this layout; memory checks use it alone, which
    is what lets a planner check memory of thousands of strategies without compiling them.
    """
    model, s = run.model, run.strategy
    tp, n_v = s.tp, s.pp * s.virtual_pipeline_stages
    counts = layers_per_vstage(model.num_layers, s.pp, s.virtual_pipeline_stages, s.v_shape)
    h, V = model.hidden_size, model.vocab_size
    # MLA's down projections are whole on every tensor-parallel rank; the rest of a layer is split tp ways
    kept = model.tp_replicated_layer_params
    dense, moe_attn, experts = layer_param_split(model, s.ep)
    dense_layer_params, moe_attn_params = (dense - kept) / tp + kept, (moe_attn - kept) / tp + kept
    expert_layer_params = experts / tp
    out: list[ChunkLayout] = []
    first = 0
    for vs in range(n_v):
        n_layers = counts[vs]
        n_moe = model.moe_layers_in(first, n_layers)
        first += n_layers
        n_dense = n_layers - n_moe
        root = 0.0
        if vs == 0:
            root += model.embedding_params() / tp
        if vs == n_v - 1:
            if model.lm_head and (not model.tie_embeddings or (n_v > 1 and not s.v_shape)):
                # untied head, or the last stage's own copy of a tied embedding (in a V it is rank 0's table)
                root += V * h / tp
            root += (2 if model.norm == "layernorm" else 1) * h  # final norm (weight, bias)
        dense_p = n_dense * dense_layer_params + n_moe * moe_attn_params + root
        out.append(ChunkLayout(vs, n_layers, n_dense, n_moe, dense_p, n_moe * expert_layer_params,
                               dense_layer_params, root))
    return out


@dataclass(frozen=True, slots=True)
class StageLoad:
    """What one pipeline rank holds, summed over its chunks (what memory and gradient traffic need)."""

    dense_params: float
    expert_params: float
    layers: float  # mean layers per chunk (activations are saved per chunk forward in flight)
    last: bool  # holds the last virtual stage (LM head, logits)
    layer_params: float  # parameters of one layer of its first chunk (ZeRO-3 gathers)
    root_params: float = 0.0  # of dense_params, those outside the layers (embedding, final norm, LM head)


def stage_loads(layout: list, pp: int, *, v_shape: bool) -> list[StageLoad]:
    r"""Per pipeline rank (``pp`` of them), the sums over its chunks (:func:`rank_vstages`: ``layout[rank::pp]``,
    or ranks ``r`` and ``2pp-1-r`` in a V).

    ``layout`` lists every virtual stage's chunk in order: :class:`ChunkLayout`\ s, or a compiled
    graph's :class:`Chunk`\ s (both carry ``vstage``, ``num_layers``, the parameter counts and
    ``layer_params``).

    Depends on the model and on tp, pp, virtual stages, the V placement and ep only, so a planner's
    strategies that share those share it.
    """
    last = len(layout) - 1
    v = len(layout) // pp
    out = []
    for st in range(pp):
        chunks = [layout[vs] for vs in rank_vstages(st, pp, v, v_shape)]
        out.append(StageLoad(sum(c.dense_params for c in chunks), sum(c.expert_params for c in chunks),
                             sum(c.num_layers for c in chunks) / max(1, len(chunks)),
                             any(c.vstage == last for c in chunks), chunks[0].layer_params,
                             sum(c.root_params for c in chunks)))
    return out


def compile_run(run: RunSpec, num_microbatches: int | None = None) -> ExecutionGraph:
    """Compile ``run`` into its :class:`ExecutionGraph`.

    ``num_microbatches`` overrides the run's count (the simulator uses it to
    extrapolate long steady states exactly); by default the run's own.
    """
    model, hw, s = run.model, run.hardware, run.strategy
    dpn = hw.node_size
    tp, cp, dp, pp, v = s.tp, s.cp, s.dp, s.pp, s.virtual_pipeline_stages
    m = run.num_microbatches if num_microbatches is None else num_microbatches
    tp_group = group_placement(tp, 1, dpn)
    cp_group = group_placement(cp, tp, dpn)
    ep_group = group_placement(s.ep, tp, dpn)
    dp_group = group_placement(dp * cp, tp, dpn)
    expert_dp_group = group_placement(dp * cp // s.ep, tp * s.ep, dpn) if s.ep > 1 else dp_group
    shard_group, expert_shard_group, replicate_group = sharding_groups(run)
    pp_group = group_placement(pp, tp * cp * dp, dpn)
    sh: Shard = shard_for(run, tp_group, cp_group, ep_group)

    pbytes, gbytes = state_bytes_per_param(s)
    dense_layer_fwd = layer_forward(model, sh, False)
    moe_layer_fwd = layer_forward(model, sh, True, "moe_layer") if model.is_moe else []
    n_v = pp * v
    layout = chunk_layout(run)
    one_table = n_v == 1 or s.v_shape  # the embedding and the LM head on one rank share a tied table

    stages: list[Stage] = []
    bwd_memo: dict[int, list[Op]] = {}
    for st in range(pp):
        chunks: list[Chunk] = []
        for vs in rank_vstages(st, pp, v, s.v_shape):
            cl = layout[vs]
            fwd: list[Block] = []
            emb = embedding_forward(model, sh) if vs == 0 else None
            if emb is not None:
                fwd.append((emb, 1))
            if cl.num_dense:
                fwd.append((dense_layer_fwd, cl.num_dense))
            if cl.num_moe:
                fwd.append((moe_layer_fwd, cl.num_moe))
            if vs == n_v - 1:
                fwd.append((head_forward(model, sh), 1))
            bwd: list[Block] = []
            for ops, rep in ([] if s.forward_only else reversed(fwd)):
                key = id(ops)
                if key not in bwd_memo:  # identical layers share one backward list (and its cost cache)
                    if ops is emb:
                        bwd_memo[key] = embedding_backward(model, sh, model.tied_head and one_table)
                    else:
                        # Megatron recomputes transformer layers only, never the embedding or the LM head
                        layer = ops is dense_layer_fwd or ops is moe_layer_fwd
                        bwd_memo[key] = ((recompute_ops(ops, s.recompute, s.checkpoint_impl) if layer else [])
                                        + backward_of(ops))
                bwd.append((bwd_memo[key], rep))
            chunks.append(Chunk(vs, cl.num_layers, fwd, bwd, cl.dense_params + cl.expert_params, cl.dense_params,
                                cl.expert_params, cl.layer_params, cl.root_params))
        if s.forward_only:
            sched = schedule_forward_only(pp, v, m)
        elif pp == 1:
            # no pipeline: gradient accumulation runs each micro-batch forward then backward
            sched = [u for i in range(m) for u in (("F", 0, i), ("B", 0, i))]
        else:
            sched = pipeline_order(s.pipeline_schedule, pp, v, m, st)
        # ZeRO shards the optimizer step as it shards the optimizer states
        local = sharded_params(s, sum(c.dense_params for c in chunks), sum(c.expert_params for c in chunks), 1)
        stages.append(Stage(st, chunks, sched, optimizer_ops(local, s.optimizer, s.weight_precision,
                                                                s.optimizer_impl)))

    h, V = model.hidden_size, model.vocab_size
    # with sequence parallelism Megatron sends only this rank's 1/tp of the activations between stages
    p2p_bytes = sh.tokens * h * sh.e_res / (tp if sh.sp else 1)  # the residual stream crosses stages
    # a tied table on two ranks sums its gradients between them; in a V both ends share rank 0 and one table
    tied = V * h / tp * gbytes if (model.tied_head and not one_table and not s.forward_only) else 0.0
    return ExecutionGraph(run, stages, m, p2p_bytes, pp_group, dp_group, expert_dp_group, tp_group,
                          s.grad_bucket_size_MiB * MiB, gbytes, pbytes, tied, shard_group, expert_shard_group,
                          replicate_group)


def sharding_groups(run: RunSpec) -> tuple[Group, Group, Group]:
    """Placement of the groups ZeRO/FSDP collectives run in: ``(shard, expert shard, replicate)``.

    One copy of the sharded states lies on ``dp·cp/dp_replicate`` ranks spaced ``tp`` apart (the dense
    shard group; the whole dp group without hybrid sharding), or ``dp·cp/(ep·dp_replicate)`` spaced
    ``tp·ep`` apart (experts). The ``dp_replicate`` copies sit ``tp·dp·cp/dp_replicate`` ranks apart, so a
    shard group inside a node all-reduces its shards across nodes (FSDP HYBRID_SHARD's layout).
    """
    s, dpn = run.strategy, run.hardware.node_size
    shard = group_placement(s.shard_size, s.tp, dpn)
    expert = group_placement(s.expert_shard_size, s.tp * s.ep, dpn) if s.ep > 1 else shard
    return shard, expert, group_placement(s.dp_replicate, s.tp * s.shard_size, dpn)


def gradient_buckets(eg: ExecutionGraph, chunk: Chunk) -> list[tuple[Op, int]]:
    """Gradient-reduction collectives of one chunk as (one bucket's op, number of such buckets).

    Buckets are equal slices of the chunk's gradients (``bucket_bytes`` each, rounded to a whole
    number), dense parameters first, then expert parameters (reduced in their own group), in
    the order backward produces them. DDP (ZeRO 0) all-reduces; ZeRO 1/2 reduce-scatter (each rank
    keeps its shard) in the shard group; ZeRO 3 / FSDP reduce-scatter per micro-batch (handled by the
    simulator). Under hybrid sharding each bucket's reduce-scatter is followed by the all-reduce of its
    shard over the replicas (:func:`replica_allreduce`). A forward-only step has none.
    """
    s = eg.run.strategy
    if s.forward_only:
        return []  # no gradients
    zero = s.effective_zero_stage
    kind = "allreduce" if zero == 0 else "reducescatter"
    out: list[tuple[Op, int]] = []
    for params, group, tag in ((chunk.dense_params, eg.dp_group if zero == 0 else eg.shard_group, "dense"),
                               (chunk.expert_params, eg.expert_dp_group if zero == 0 else eg.expert_shard_group,
                                "expert")):
        op_kind = kind
        if group.size <= 1 and zero >= 1:
            # experts sharded one rank per copy (dp·cp = ep·dp_replicate): only the replicas reduce them
            group, op_kind = eg.replicate_group, "allreduce"
        if params <= 0 or group.size <= 1:
            continue
        total = params * eg.grad_bytes_per_param
        n = max(1, round(total / eg.bucket_bytes))
        out.append((comm(f"chunk{chunk.vstage}.{tag}.grad_{op_kind}", op_kind, "bwd", total / n, group,
                         s.reduce_precision), n))
    return out


def replica_allreduce(eg: ExecutionGraph, op: Op) -> Op | None:
    """The all-reduce over the ``dp_replicate`` replicas that follows the reduce-scatter ``op`` under hybrid
    sharding: each rank's shard of ``op``'s gradients (``op.bytes`` / group size); None without hybrid
    sharding (or for an all-reduce, which already spans every replica)."""
    if eg.replicate_group.size <= 1 or op.kind != "reducescatter":
        return None
    return comm(f"{op.name}.replica_allreduce", "allreduce", op.phase, op.bytes / max(1, op.group.size),
                eg.replicate_group, op.dtype)


def gradient_collectives(eg: ExecutionGraph, chunk: Chunk) -> list[Op]:
    """Gradient-reduction collectives of one chunk, one per bucket (see :func:`gradient_buckets`), each
    followed by its :func:`replica_allreduce` under hybrid sharding."""
    out = []
    for op, n in gradient_buckets(eg, chunk):
        follow = replica_allreduce(eg, op)
        per_bucket = (op,) if follow is None else (op, follow)
        out += [replace(o, name=f"{o.name}{i}") for i in range(n) for o in per_bucket]
    return out


def fsdp_copy_ops(kind: str, params: float, dp: int, s) -> list[Op]:
    """PyTorch FSDP's buffer copies around one layer's ``kind`` collective of ``params`` parameters.

    FSDP2 copies each rank's shards into one flat buffer before an all-gather and splits the gathered
    buffer back into the parameters after it (copy-in, copy-out); before a reduce-scatter it copies
    the gradients into one buffer, and it divides the output shard after
    (``torch.distributed.fsdp._fully_shard._fsdp_collectives``). Each is a memory-bound pass: one
    read, one write.
    """
    pbytes, gbytes = state_bytes_per_param(s)
    if kind == "allgather":
        parts, e, dt, phase = (("copy_in", params / dp), ("copy_out", params)), pbytes, s.weight_precision, "fwd"
    else:
        parts, e, dt, phase = (("copy_in", params), ("divide", params / dp)), gbytes, s.reduce_precision, "bwd"
    return [elementwise(f"fsdp.{kind}.{part}", "elementwise", phase, numel, 1, 1, e, dt, 0.0)
            for part, numel in parts]


def sharded_units_per_chunk(num_chunks: int) -> int:
    """Most units one of ``num_chunks`` model chunks is laid out in (see :data:`MAX_SHARDED_UNITS`)."""
    return max(1, MAX_SHARDED_UNITS // num_chunks)
