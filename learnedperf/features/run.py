"""Run features without a graph: closed-form quantities of one run for the fast surrogate.

The surrogate (:mod:`learnedperf.models.surrogate`) must answer thousands of runs a
second, so it never compiles or simulates: it sees a run through
:data:`RUN_FEATURE_SCHEMA`, a vector computed in closed form from the specs —

* the model's shape, the device's data-sheet figures and the strategy's knobs;
* an **analytic time** of the iteration (:class:`AnalyticTime`): one transformer layer's
  forward, backward and recomputation ops on the run's shard, timed by the roofline cost
  model (:class:`~learnedperf.cost.RooflineCost`, its blocking tensor/context/expert-parallel
  collectives included), times the layers of a stage and the micro-batches, stretched by
  the pipeline bubble ``(p-1)/(v·m)`` (Narayanan et al., SC21, §2.2; zero bubble H1 scales it by
  ``(F+B-W)/(F+B+W)``, Qi et al., ICLR 2024); plus pipeline
  transfers, the part of the gradient reduction and ZeRO traffic (the simulator's
  collectives, timed on the same cost model) that the last backward does not hide, and
  the optimizer step. It is the
  simulator's critical path without the event simulation: the surrogate learns
  ``log(time / analytic)``, a bounded correction, and the analytic scaling carries it to
  sizes the training runs never reached.

:class:`RunContext` holds what depends only on the model and hardware (FLOPs per sequence,
parameter counts, the cost model) and caches each distinct shard's layer cost, so that a
planner's thousands of strategies for one (model, cluster) pay for few layer costings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ..cost import host_bound_s
from ..graph.execution import (chunk_layout, fsdp_copy_ops, group_placement, is_weight_gradient, recompute_ops,
                               sharded_params, sharding_groups, stage_loads, state_bytes_per_param)
from ..graph.ops import comm
from ..graph.transformer import (SHARD_STRATEGY_KEYS, backward_of, embedding_backward, embedding_forward, head_forward,
                                 layer_forward, operator_graph, optimizer_ops, shard_for)
from ..simulate.simulator import kernels_beside_alltoalls_s
from .ops import FeatureSchema

RUN_FEATURE_SCHEMA_VERSION = 10
"""Version of :data:`RUN_FEATURE_SCHEMA`; bumped on any change of names, order or meaning."""

_ARCHS = ("gpt", "llama", "bert", "moe")
_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "interleaved-zb")
_RECOMPUTE = ("none", "selective", "full")
_PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
#: Floor of a time in seconds inside a log (1 ns): a transfer that does not happen is log(1e-9).
_MIN_S = 1e-9


def _features() -> tuple[tuple[str, str], ...]:
    f: list[tuple[str, str]] = []
    f += [("log_params", "log of the model's parameter count"),
          ("num_layers", "transformer layers"),
          ("log_hidden", "log hidden size"),
          ("num_heads", "attention heads"),
          ("kv_share", "key/value heads over attention heads (1 without GQA)"),
          ("ffn_ratio", "ffn hidden size over hidden size"),
          ("log_seq", "log sequence length"),
          ("log_vocab", "log vocabulary size"),
          ("num_experts", "experts per MoE layer (1: dense)"),
          ("moe_top_k", "experts each token visits"),
          ("gated_mlp", "1 with a gated (SwiGLU) MLP")]
    f += [(f"arch={a}", f"1 if the architecture family is {a!r}") for a in _ARCHS]
    f += [("log_peak_flops", "log peak FLOP/s of the device in the run's precision"),
          ("log_mem_bw", "log memory bandwidth (bytes/s)"),
          ("memory_GiB", "device memory"),
          ("num_sms", "SMs / compute units (0 unknown)"),
          ("l2_MiB", "L2 cache"),
          ("clock_MHz", "clock"),
          ("is_cpu", "1 for a CPU device (name cpu-...)"),
          ("log_intra_bw", "log intra-node link bytes/s (NaN unknown, or unused: one device per node)"),
          ("log_inter_bw", "log inter-node link bytes/s per device (NaN unknown, or unused: one node)"),
          ("devices_per_node", "node size used"),
          ("log_num_devices", "log number of devices"),
          ("log_num_nodes", "log number of nodes")]
    f += [("tp", "tensor-parallel size"), ("pp", "pipeline-parallel size"), ("log_dp", "log data-parallel size"),
          ("cp", "context-parallel size"), ("ep", "expert-parallel size"),
          ("vstages", "virtual pipeline stages per rank"), ("micro_batch_size", "sequences per micro-batch"),
          ("log_microbatches", "log micro-batches per iteration"), ("log_global_batch", "log global batch"),
          ("zero_stage", "effective ZeRO stage (FSDP: 3, or 2 for SHARD_GRAD_OP)"),
          ("fsdp", "1 with PyTorch FSDP (per-layer gathers through copy-in/copy-out buffers)"),
          ("log_dp_replicate", "log copies of the sharded states (hybrid sharding; 0 = one copy)"),
          ("sequence_parallel", "1 with sequence parallelism"),
          ("flash_attention", "1 with a fused attention kernel"),
          ("overlap_grad_reduce", "1 if gradient reduction overlaps backward"),
          ("overlap_param_gather", "1 if ZeRO-3 gathers are prefetched"),
          ("overlap_p2p", "1 if pipeline transfers overlap compute"),
          ("reduce_bytes", "bytes per gradient element in the reduction"),
          ("adam", "1 for Adam, 0 for SGD or no optimizer step"),
          ("forward_only", "1 for a forward-only step (no backward, gradients or optimizer)"),
          ("deepep", "1 if expert tokens go once per rank and node (moe_dispatcher 'deepep')"),
          ("overlap_moe_comm", "1 if expert all-to-alls run beside another micro-batch's computation")]
    f += [(f"schedule={s}", f"1 if the pipeline schedule is {s!r}") for s in _SCHEDULES]
    f += [(f"recompute={r}", f"1 if recomputation is {r!r}") for r in _RECOMPUTE]
    f += [(f"precision={p}", f"1 if the precision is {p!r}") for p in _PRECISIONS]
    f += [("autocast", "1 if fp32 weights are cast at every GEMM (mixed_precision 'autocast')")]
    f += [("log_tokens_per_microbatch", "log tokens one rank processes per micro-batch (b·s/cp)"),
          ("log_gemm_n", "log hidden size per tensor-parallel rank"),
          ("log_model_flops_per_device", "log model FLOPs per device per iteration")]
    f += [(f"log_{k}_s", f"log seconds of the analytic {what}") for k, what in (
        ("compute", "compute of a stage's layers (roofline, recompute included) and its embedding/head"),
        ("tp_comm", "tensor/context/expert-parallel collectives inside the layers (blocking; overlapped expert "
                    "all-to-alls: what the kernels beside them do not hide)"),
        ("peak_compute", "compute at peak FLOP/s (model FLOPs, one more forward with full recompute)"),
        ("memory_bound", "memory-bound share of the layer compute, in seconds"),
        ("pp_comm", "pipeline sends and receives"),
        ("dp_comm", "gradient reduction and ZeRO gathers of the most loaded rank (cost model)"),
        ("optimizer", "optimizer step of the local parameters (cost model)"),
        ("total", "iteration (see AnalyticTime.total_s)"))]
    f += [("bubble_fraction", "pipeline bubble over compute, (p-1)/(v·m)"),
          ("comm_share", "analytic communication over the analytic total"),
          ("memory_share", "peak memory over device memory")]
    return tuple(f)


RUN_FEATURE_SCHEMA = FeatureSchema("run", RUN_FEATURE_SCHEMA_VERSION, _features())
"""Named, ordered features of one run (see module docstring)."""


class RunContext:
    """What one (model, hardware) pair contributes to every run's features, computed once.

    Args:
        model: a :class:`~learnedperf.specs.ModelSpec`.
        hardware: a :class:`~learnedperf.specs.HardwareSpec`.
    """

    def __init__(self, model: Any, hardware: Any):
        from ..cost import RooflineCost

        self.model = model
        self.hardware = hardware
        self.cost = RooflineCost(hardware)
        self.layer_costs: dict[tuple, tuple[float, ...]] = {}
        self.comm_costs: dict[tuple, float] = {}
        self.loads: dict[tuple, list] = {}
        g = operator_graph(model, 1)
        #: forward and backward FLOPs of one sequence (the MFU numerator per sequence)
        self.flops_fwd_per_seq = g.total_flops("fwd")
        self.flops_per_seq = self.flops_fwd_per_seq + g.total_flops("bwd")
        m, dev = model, hardware.device
        self.num_params = float(m.num_params())
        self.num_moe_layers = m.num_moe_layers
        self.is_cpu = 1.0 if dev.is_cpu else 0.0
        self.static = [math.log(self.num_params), float(m.num_layers), math.log(m.hidden_size),
                       float(m.num_attention_heads), m.num_kv_heads / m.num_attention_heads,
                       m.ffn_hidden_size / m.hidden_size, math.log(m.seq_length), math.log(m.vocab_size),
                       float(m.num_experts), float(m.moe_top_k), 1.0 if m.activation == "swiglu" else 0.0]
        self.static += [1.0 if m.arch == a else 0.0 for a in _ARCHS]
        mem_bw_Bps = dev.memory_bandwidth_GBps * 1e9
        nan = float("nan")
        self.device_static = [math.log(mem_bw_Bps), dev.memory_GiB, float(dev.num_sms), dev.l2_cache_MiB,
                              dev.clock_MHz, self.is_cpu,
                              # a level the run does not use is missing, as in the graph's features (why:
                              # features.graph.global_feature_vector)
                              *(math.log(bw * 1e9) if bw else nan
                                for bw in map(hardware.used_link_bandwidth_GBps, ("intra", "inter"))),
                              float(hardware.node_size), math.log(hardware.num_devices),
                              math.log(hardware.num_nodes)]

    def flops_per_seq_of(self, strategy: Any) -> float:
        """Model FLOPs of one sequence under ``strategy``: forward and backward, the forward alone for a
        forward-only step."""
        return self.flops_fwd_per_seq if strategy.forward_only else self.flops_per_seq


@dataclass(frozen=True, slots=True)
class AnalyticTime:
    """Closed-form seconds of one iteration's parts on the critical pipeline rank."""

    compute_s: float  # layers (and embedding or head) of one stage, every micro-batch
    layer_comm_s: float  # blocking collectives inside those layers
    peak_compute_s: float  # model FLOPs per device at peak (a feature, not in the total)
    memory_bound_s: float  # memory-bound part of compute_s (a feature)
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    bubble_fraction: float
    exposed_dp_s: float

    @property
    def total_s(self) -> float:
        """Compute, layer collectives and pipeline transfers stretched by the bubble, plus the
        unhidden gradient reduction and the optimizer step."""
        busy = self.compute_s + self.layer_comm_s + self.pp_comm_s
        return busy * (1.0 + self.bubble_fraction) + self.exposed_dp_s + self.optimizer_s


def _link_Bps(ctx: RunContext, size: int, stride: int) -> float:
    """Achievable bandwidth of one rank in a group of ``size`` ranks ``stride`` apart: the
    inter-node link once the group leaves a node. Raises SpecError naming the field when the
    run needs a link nobody gave, as the simulator does."""
    g = group_placement(size, stride, ctx.hardware.node_size)
    return ctx.cost.link_bandwidth_Bps("inter" if g.nodes > 1 else "intra")


def _costs(ctx: RunContext, ops: list) -> tuple[float, float, float, float, float]:
    """(compute s, memory-bound compute s, collective s, all-to-all s, weight-gradient s) of ``ops`` on
    ``ctx``'s cost model; the collectives include the all-to-alls, the compute the weight gradients."""
    comp = mem = comm = a2a = wgrad = 0.0
    kernels = chained = 0
    cost = ctx.cost
    for op in ops:
        if op.is_comm:
            t = cost.comm_time_s(op)
            comm += t
            if op.kind == "alltoall":
                a2a += t
        else:
            t = cost.compute_time_s(op)
            comp += t
            kernels += op.dispatches
            chained += op.chained_dispatches
            if op.kind not in ("matmul", "attention", "conv"):
                mem += t
            elif is_weight_gradient(op):
                wgrad += t
    # the block's kernels as the simulator times them: bound by the host where it issues them more slowly
    bound = host_bound_s(comp, kernels, cost.host_dispatch_s, chained, cost.chained_dispatch_s)
    if comp > 0 and bound > comp:
        stretch = bound / comp
        comp, mem, wgrad = bound, mem * stretch, wgrad * stretch
    return comp, mem, comm, a2a, wgrad


def layer_cost(run: Any, ctx: RunContext) -> tuple[float, ...]:
    """Seconds of one micro-batch on the run's shard: ``(dense layer compute, its memory-bound
    part, its collectives, MoE layer compute, its collectives, embedding, LM head, dense layer weight
    gradients, MoE layer weight gradients)``, forward + backward + recomputation (forward alone for a
    forward-only step; the weight gradients are part of the compute), cached per distinct shard in ``ctx``.

    With ``overlap_moe_comm`` a MoE layer is costed as the simulator's units are: its kernels slowed by
    the SMs the all-to-alls hold while both run, and of the all-to-alls only what outlasts the kernels
    (:meth:`learnedperf.simulate.simulator._Builder.unit_task`)."""
    s, m = run.strategy, ctx.model
    dpn = run.hardware.node_size
    tied_here = m.tied_head and s.pp * s.virtual_pipeline_stages == 1
    # what the shard is built from (forward_only among it), and the strategy fields the costing below reads besides
    key = (*(getattr(s, k) for k in SHARD_STRATEGY_KEYS), s.recompute, s.checkpoint_impl, s.overlap_moe_comm,
           tied_here)
    hit = ctx.layer_costs.get(key)
    if hit is not None:
        return hit
    sh = shard_for(run, group_placement(s.tp, 1, dpn), group_placement(s.cp, s.tp, dpn),
                   group_placement(s.ep, s.tp, dpn))

    def unit(fwd: list) -> tuple[float, float, float, float]:
        parts = (fwd,) if s.forward_only else (fwd, backward_of(fwd),
                                               recompute_ops(fwd, s.recompute, s.checkpoint_impl))
        comp, mem, comm, a2a, wgrad = (sum(x) for x in zip(*(_costs(ctx, ops) for ops in parts)))
        if s.overlap_moe_comm:
            slowed = kernels_beside_alltoalls_s(comp, a2a, run.hardware.device.num_sms)
            comm += max(0.0, a2a - slowed) - a2a
            comp = slowed
        return comp, mem, comm, wgrad

    def backward(ops: list) -> list:
        return [] if s.forward_only else ops

    dense = unit(layer_forward(m, sh, False))
    moe = unit(layer_forward(m, sh, True, "moe_layer")) if m.is_moe else (0.0, 0.0, 0.0, 0.0)
    emb = _costs(ctx, embedding_forward(m, sh))[0] + _costs(ctx, backward(embedding_backward(m, sh, tied_here)))[0]
    f = head_forward(m, sh)
    head = _costs(ctx, f)[0] + _costs(ctx, backward(backward_of(f)))[0]
    if len(ctx.layer_costs) >= 4096:
        ctx.layer_costs.pop(next(iter(ctx.layer_costs)))
    out = ctx.layer_costs[key] = (dense[0], dense[1], dense[2], moe[0], moe[2], emb, head, dense[3], moe[3])
    return out


def _collective_s(ctx: RunContext, kind: str, nbytes: float, group: Any, dtype: str, pieces: int = 1) -> float:
    """Seconds of ``pieces`` equal collectives moving ``nbytes`` in all, on the cost model."""
    if nbytes <= 0 or group.size <= 1:
        return 0.0
    # a planner's strategies repeat the same collectives: cache them like the layer costs
    key = (kind, nbytes, pieces, group.size, group.per_node, dtype)
    hit = ctx.comm_costs.get(key)
    if hit is None:
        if len(ctx.comm_costs) >= 16384:
            ctx.comm_costs.pop(next(iter(ctx.comm_costs)))
        hit = ctx.comm_costs[key] = pieces * ctx.cost.comm_time_s(comm("analytic", kind, "bwd", nbytes / pieces,
                                                                        group, dtype))
    return hit


def run_stage_loads(run: Any, ctx: RunContext) -> list:
    """The run's :func:`~learnedperf.graph.execution.stage_loads`, cached in ``ctx`` by what they depend
    on besides the model: tp, pp, virtual stages, their V placement and ep."""
    s = run.strategy
    key = (s.tp, s.pp, s.virtual_pipeline_stages, s.v_shape, s.ep)
    hit = ctx.loads.get(key)
    if hit is None:
        if len(ctx.loads) >= 4096:
            ctx.loads.pop(next(iter(ctx.loads)))
        hit = ctx.loads[key] = stage_loads(chunk_layout(run), s.pp, v_shape=s.v_shape)
    return hit


def analytic_time(run: Any, ctx: RunContext, loads: Optional[list] = None) -> AnalyticTime:
    """The :class:`AnalyticTime` of ``run`` (a RunSpec whose model and hardware are ``ctx``'s).

    ``loads`` are the run's :func:`~learnedperf.graph.execution.stage_loads` if the caller has them.
    Gradient reduction and ZeRO traffic are the simulator's collectives (DDP buckets, ZeRO-1/2
    reduce-scatter and parameter all-gather, ZeRO-3/FSDP gathers and reduce-scatters per layer and
    micro-batch) on the most loaded pipeline rank, timed alone on the cost model.
    """
    m, s = run.model, run.strategy
    n, dpn = run.hardware.num_devices, run.hardware.node_size
    tp, pp, dp, cp, v = s.tp, s.pp, s.dp, s.cp, s.virtual_pipeline_stages
    mb = run.num_microbatches
    peak = run.hardware.device.peak_flops(s.precision)
    flops = ctx.flops_per_seq_of(s) * s.global_batch_size / n
    if s.recompute == "full":
        flops += ctx.flops_fwd_per_seq * s.global_batch_size / n
    dense_c, dense_mem, dense_comm, moe_c, moe_comm, emb, head, dense_w, moe_w = layer_cost(run, ctx)
    moe_layers = ctx.num_moe_layers / pp
    dense_layers = m.num_layers / pp - moe_layers
    # the critical rank holds a stage's layers and the larger of embedding and head (both without a pipeline,
    # and on rank 0 in a V)
    ends = emb + head if pp == 1 or s.v_shape else max(emb, head)
    compute = (dense_layers * dense_c + moe_layers * moe_c + ends) * mb
    layer_comm = (dense_layers * dense_comm + moe_layers * moe_comm) * mb
    memory_bound = dense_layers * dense_mem * mb
    pp_s = 0.0
    if pp > 1 and not s.overlap_p2p:
        # the residual stream crosses stages: fp32 under autocast
        e = 4 if s.autocast else 2 if s.precision == "fp8" else _BYTES[s.precision]
        act = s.micro_batch_size * m.seq_length / cp * m.hidden_size * e
        p2p = act / (tp if s.sequence_parallel and tp > 1 else 1)
        # activations forward, their gradients backward, each send with its fixed exchange time
        sends = (1 if s.forward_only else 2) * mb * v
        pp_s = sends * (p2p / _link_Bps(ctx, pp, tp * cp * dp) + ctx.cost.pipeline_send_s)
    if loads is None:
        loads = stage_loads(chunk_layout(run), pp, v_shape=s.v_shape)
    heaviest = max(loads, key=lambda ld: ld.dense_params + ld.expert_params)
    dense_p, expert_p = heaviest.dense_params, heaviest.expert_params
    zero = s.effective_zero_stage
    pbytes, gbytes = state_bytes_per_param(s)  # no gradient bytes in a forward-only step: reductions move nothing
    dp_group = group_placement(dp * cp, tp, dpn)
    edp_group = group_placement(dp * cp // s.ep, tp * s.ep, dpn) if s.ep > 1 else dp_group
    shard_group, eshard_group, rep_group = sharding_groups(run)
    bucket = s.grad_bucket_size_MiB * 1048576.0
    red = s.reduce_precision
    dp_s = 0.0
    per_layer = s.per_layer_sharding and shard_group.size > 1
    replica_s = 0.0  # hybrid sharding: the reduced shards all-reduced over the replicas, once an iteration
    pieces = max(1, round(m.num_layers / pp))
    if per_layer:
        # per micro-batch and layer (the simulator groups layers into units but keeps every layer's
        # collective): gather the weights for forward and, fully sharded, again for backward;
        # reduce-scatter the gradients (a forward-only step gathers once and reduces nothing)
        params = dense_p + expert_p
        gathers = 2 if zero >= 3 and not s.forward_only else 1
        gather_mb = _collective_s(ctx, "allgather", params * pbytes, shard_group, s.precision, pieces)
        rs_mb = _collective_s(ctx, "reducescatter", params * gbytes, shard_group, red, pieces)
        replica_s = _collective_s(ctx, "allreduce", params * gbytes / shard_group.size, rep_group, red, pieces)
        dp_s = mb * (gathers * gather_mb + rs_mb) + replica_s
        # what a per-layer layout cannot hide: the first layer's gather (with the embedding and head) and
        # the last layer's reduce-scatter of each micro-batch
        root = heaviest.root_params
        one = (params - root) / max(1.0, m.num_layers / pp) + root
        first_gather = _collective_s(ctx, "allgather", one * pbytes, shard_group, s.precision)
        last_rs = _collective_s(ctx, "reducescatter", one * gbytes, shard_group, red)
        last_rs += _collective_s(ctx, "allreduce", one * gbytes / shard_group.size, rep_group, red) / mb
        if s.fsdp:
            # FSDP's copy-in / copy-out passes run on the compute stream
            layer_p = params / pieces
            copies = sum(ctx.cost.compute_time_s(op)
                         for op in fsdp_copy_ops("allgather", layer_p, shard_group.size, s))
            copies = gathers * copies + (0.0 if s.forward_only else sum(
                ctx.cost.compute_time_s(op) for op in fsdp_copy_ops("reducescatter", layer_p, shard_group.size, s)))
            compute += mb * pieces * copies
    else:
        kind = "allreduce" if zero == 0 else "reducescatter"
        groups = ((dense_p, dp_group), (expert_p, edp_group)) if zero == 0 else ((dense_p, shard_group),
                                                                                 (expert_p, eshard_group))
        for params, group in groups:
            total = params * gbytes
            buckets = max(1, round(total / bucket))
            if zero >= 1 and group.size <= 1:  # one rank per copy: only the replicas reduce (as the simulator)
                dp_s += _collective_s(ctx, "allreduce", total, rep_group, red, buckets)
                continue
            dp_s += _collective_s(ctx, kind, total, group, red, buckets)
            if zero >= 1:
                dp_s += _collective_s(ctx, "allreduce", total / group.size, rep_group, red, buckets)
        if zero >= 1:
            dp_s += _collective_s(ctx, "allgather", (dense_p + expert_p) * pbytes, shard_group, s.precision)
    # the last micro-batch's backward (about 2/3 of its compute) hides an overlapped reduction;
    # ZeRO-3 gathers are prefetched under the compute of every micro-batch, layer by layer
    if per_layer and s.forward_only and s.overlap_param_gather:
        # prefetched gathers hide behind each layer's forward except the first
        exposed = dp_s / pieces + max(0.0, dp_s - compute)
    elif per_layer:
        if s.overlap_param_gather:
            # backward gathers and reduce-scatters run on two streams side by side
            # (the replicas' all-reduce runs after the last micro-batch's reduce-scatters, on their stream)
            busy_mb = gather_mb + max((gathers - 1) * gather_mb, rs_mb + replica_s / mb)
            exposed = mb * (first_gather + last_rs + max(0.0, busy_mb - compute / mb))
        else:  # gathers block the compute stream; reduce-scatters still run beside the backward
            exposed = mb * (gathers * gather_mb + last_rs
                            + max(0.0, rs_mb + replica_s / mb - compute / mb * 2.0 / 3.0))
    else:
        exposed = max(0.0, dp_s - (compute * 2.0 / 3.0 / mb if s.overlap_grad_reduce else 0.0))
    local = sharded_params(s, dense_p, expert_p, 1)  # the optimizer step runs on this rank's shard
    opt = sum(ctx.cost.compute_time_s(op) for op in optimizer_ops(local, s.optimizer, s.weight_precision,
                                                                        s.optimizer_impl))
    bubble = (pp - 1) / (v * mb) if pp > 1 else 0.0
    layers_s = dense_layers * dense_c + moe_layers * moe_c
    if s.zero_bubble and pp > 1 and layers_s > 0:
        w_s = dense_layers * dense_w + moe_layers * moe_w
        if s.v_shape:
            # ZB-V (PyTorch's order): the last rank starts a chunk's forward F late, then idles no more when F
            # and the input gradient B take as long: (p-1)F against interleaving's (p-1)(F+B+W) of a chunk,
            # with F taken as half of F+B; below the simulator's bubble when they differ (unit costs, ad hoc)
            bubble *= max(0.0, layers_s - w_s) / (2.0 * layers_s)
        else:
            # zero bubble H1: the weight gradients W fill the bubble, (p-1)(F+B-W) against 1F1B's (p-1)(F+B+W)
            # (Qi et al., ICLR 2024, Table 1); interleaved zero bubble, of a chunk's passes against interleaving's
            # (the simulator's time on equal chunks, tests/test_interleaved_zb.py)
            bubble *= max(0.0, layers_s - 2.0 * w_s) / layers_s
    return AnalyticTime(compute, layer_comm, flops / peak, memory_bound, pp_s, dp_s, opt, bubble, exposed)


def run_features(run: Any, ctx: RunContext, peak_memory_GiB: float,
                 loads: Optional[list] = None) -> tuple[list[float], AnalyticTime]:
    """The :data:`RUN_FEATURE_SCHEMA` vector of ``run`` and its :class:`AnalyticTime`.

    Args:
        run: a RunSpec whose model and hardware are ``ctx``'s.
        ctx: the run's :class:`RunContext`.
        peak_memory_GiB: the run's peak memory per device.
        loads: the run's stage loads, if the caller has them.
    """
    s = run.strategy
    at = analytic_time(run, ctx, loads)
    x = list(ctx.static)
    x.append(math.log(run.hardware.device.peak_flops(s.precision)))
    x += ctx.device_static
    x += [float(s.tp), float(s.pp), math.log(s.dp), float(s.cp), float(s.ep), float(s.virtual_pipeline_stages),
          float(s.micro_batch_size), math.log(run.num_microbatches), math.log(s.global_batch_size),
          float(s.effective_zero_stage), 1.0 if s.fsdp else 0.0, math.log(s.dp_replicate),
          1.0 if s.sequence_parallel and s.tp > 1 else 0.0,
          1.0 if s.flash_attention else 0.0, 1.0 if s.overlap_grad_reduce else 0.0,
          1.0 if s.overlap_param_gather else 0.0, 1.0 if s.overlap_p2p else 0.0,
          float(_BYTES[s.reduce_precision]), 1.0 if s.optimizer == "adam" else 0.0, 1.0 if s.forward_only else 0.0,
          1.0 if s.moe_dispatcher == "deepep" else 0.0, 1.0 if s.overlap_moe_comm else 0.0]
    sched = s.pipeline_schedule if s.pp > 1 else ""
    x += [1.0 if sched == k else 0.0 for k in _SCHEDULES]
    x += [1.0 if s.recompute == k else 0.0 for k in _RECOMPUTE]
    x += [1.0 if s.precision == k else 0.0 for k in _PRECISIONS]
    x.append(1.0 if s.autocast else 0.0)
    m = run.model
    x += [math.log(s.micro_batch_size * m.seq_length / s.cp), math.log(m.hidden_size / s.tp),
          math.log(ctx.flops_per_seq_of(s) * s.global_batch_size / run.hardware.num_devices)]
    total = at.total_s
    comm = at.layer_comm_s + at.pp_comm_s + at.exposed_dp_s
    x += [math.log(max(t, _MIN_S)) for t in (at.compute_s, at.layer_comm_s, at.peak_compute_s, at.memory_bound_s,
                                             at.pp_comm_s, at.dp_comm_s, at.optimizer_s, total)]
    x += [at.bubble_fraction, comm / total, peak_memory_GiB / run.hardware.device.memory_GiB]
    return x, at


__all__ = ["AnalyticTime", "RUN_FEATURE_SCHEMA", "RUN_FEATURE_SCHEMA_VERSION", "RunContext", "analytic_time",
           "layer_cost", "run_features", "run_stage_loads"]
