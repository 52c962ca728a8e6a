"""Simulate one training iteration of a run: execution graph → events → times.

One representative rank per pipeline stage executes its program on up to five
streams — ``compute`` (kernels, blocking tensor/context/expert-parallel
collectives and, unless overlapped, pipeline sends), ``dp`` (gradient
reduction, ZeRO/FSDP gathers), ``reduce_scatter`` (ZeRO-3/FSDP's per-layer
reduce-scatters), ``p2p`` (overlapped pipeline sends) and ``ep`` (expert all-to-alls
that another micro-batch's computation hides, ``overlap_moe_comm``) — over
two links per rank (``intra``: inside the node; ``inter``: its network share)
whose bandwidth concurrent transfers share. Where the hardware says computation hides only a
share of a collective (``comm_overlap``, measured), the rest of the time the collectives of the stage
that finishes last ran beside its computation is added to the iteration. The breakdown is the
bottleneck stage's: the one that waits least on the others.

Long steady states are extrapolated exactly: the iteration time of a pipeline
of identical micro-batches is, after the warm-up, linear in their number, so
runs with many micro-batches are simulated at two smaller counts and
extended along that line (``exact=True`` simulates every micro-batch). Zero
bubble H1 nears its line more slowly: it is extrapolated from larger counts,
and not always exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..cost import CostModel, RooflineCost, host_bound_s
from ..graph.execution import (Chunk, ExecutionGraph, compile_run, fsdp_copy_ops, gradient_buckets, replica_allreduce,
                               sharded_units_per_chunk, split_weight_gradients, stage_of)
from ..graph.ops import Group, Op, comm
from ..graph.transformer import model_flops_per_iteration
from ..specs import RunSpec
from ..units import GiB
from .engine import Engine
from .memory import MemoryBreakdown, memory_microbatches, peak_memory

SIMULATOR_VERSION = "0.1.0"

#: SMs that expert all-to-alls hold while they run beside computation: DeepSeek-V3's dispatch and combine
#: kernels fill IB and NVLink with 20 of the H800's 132 SMs (DeepSeek-AI 2024, arXiv 2412.19437, section 3.2.2).
MOE_COMM_SMS = 20


def kernels_beside_alltoalls_s(kernels_s: float, alltoalls_s: float, num_sms: int) -> float:
    """Seconds of ``kernels_s`` of kernels that run beside ``alltoalls_s`` of expert all-to-alls: slowed by
    ``SMs / (SMs - MOE_COMM_SMS)`` while both run; on a device with no more SMs than the all-to-alls hold, one
    after the other."""
    if num_sms > MOE_COMM_SMS:
        return kernels_s + min(kernels_s, alltoalls_s) * MOE_COMM_SMS / (num_sms - MOE_COMM_SMS)
    return kernels_s + alltoalls_s


@dataclass
class SimResult:
    """The outcome of simulating one run."""

    run: RunSpec
    iteration_time_s: float
    breakdown_s: dict[str, float]
    memory: MemoryBreakdown
    model_flops: float
    num_events: int
    extrapolated: bool
    trace: Optional[list[dict]] = None
    cost_model: str = "roofline"
    notes: list[str] = field(default_factory=list)

    def to_prediction(self, source: str = "simulator") -> dict:
        """The prediction object of DESIGN.md (times in ms, memory in GiB)."""
        run, t = self.run, self.iteration_time_s
        n = run.hardware.num_devices
        tflops = self.model_flops / t / n / 1e12
        peak = run.hardware.device.peak_tflops.get(run.strategy.precision) or run.hardware.device.peak_tflops.fp32
        mem_gib = self.memory.total / GiB
        out = {
            "iteration_time_ms": t * 1e3,
            "tokens_per_second": run.tokens_per_iteration / t,
            "samples_per_second": run.strategy.global_batch_size / t,
            "tflops_per_device": tflops,
            "mfu": tflops / peak,
            "peak_memory_GiB": mem_gib,
            "memory_GiB": self.memory.to_GiB(),
            "peak_memory_phase": self.memory.phase,
            "fits_in_memory": mem_gib <= run.hardware.device.memory_GiB,
            "breakdown_ms": {k: v * 1e3 for k, v in self.breakdown_s.items()},
            # the analytical simulator has no calibrated spread yet: the interval is the point itself
            "interval_ms": [t * 1e3, t * 1e3],
            "source": source,
            "simulator_version": SIMULATOR_VERSION,
            "cost_model": self.cost_model,
        }
        if run.id is not None:
            out["id"] = run.id
        notes = [*self.notes, *run.hardware.assumptions()]
        if notes:
            out["notes"] = notes
        return out


# ------------------------------------------------------------------ costs
def _block_cost(ops, cost: CostModel, hide_alltoall: bool) -> tuple:
    """One block's ops once: ``(kernel seconds, (host dispatches, chained dispatches), {phase: kernel seconds},
    collectives)``, the collectives
    as ``(hidden, latency, intra bytes, inter bytes)`` in op order (``hidden``: an expert all-to-all that runs
    beside computation, ``hide_alltoall``)."""
    block = 0.0
    kernels = chained = 0
    cats: dict[str, float] = {}
    comms = []
    for op in ops:
        if op.is_comm:
            c = cost.comm_cost(op)
            comms.append((hide_alltoall and op.kind == "alltoall", c.latency_s, c.intra_bytes, c.inter_bytes))
        else:
            t = cost.compute_time_s(op)
            block += t
            kernels += op.dispatches
            chained += op.chained_dispatches
            cats[op.phase] = cats.get(op.phase, 0.0) + t
    return block, (kernels, chained), cats, comms


def _unit_cost(blocks, cost: CostModel, hide_alltoall: bool = False, memo: Optional[dict] = None) -> tuple:
    """Compute seconds and aggregated collective load of a list of (ops, repeat) blocks:
    ``(comp, lat, intra, inter, a_lat, a_intra, a_inter, by_cat)``. The expert all-to-alls' latency and bytes
    are in ``a_*`` when ``hide_alltoall`` (they run beside computation), else with the blocking ones.

    ``memo`` (a dict that one builder owns, with one cost model) keeps each ops list's :func:`_block_cost` by
    identity: a compiled graph shares one list among the identical layers of every chunk, so the ops of a layer
    are costed once per build rather than once per chunk (and per unit of :func:`_layer_units`). The sums below
    take the same terms in the same order either way."""
    comp = 0.0
    blocking, hidden = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]  # latency, intra bytes, inter bytes
    by_cat: dict[str, float] = {}
    host = cost.host_dispatch_s
    for ops, rep in blocks:
        if memo is None:
            block, (kernels, chained), cats, comms = _block_cost(ops, cost, hide_alltoall)
        else:
            key = (id(ops), hide_alltoall)
            hit = memo.get(key)
            if hit is None or hit[0] is not ops:  # the memo holds the list, so its id is not reused meanwhile
                hit = memo[key] = (ops, _block_cost(ops, cost, hide_alltoall))
            block, (kernels, chained), cats, comms = hit[1]
        for is_hidden, lat, intra, inter in comms:
            load = hidden if is_hidden else blocking
            load[0] += lat * rep
            load[1] += intra * rep
            load[2] += inter * rep
        # a block's kernels are issued back to back: the host binds it where it issues them more slowly than
        # the device runs them, and each phase takes its share of the block
        bound = host_bound_s(block, kernels, host, chained, cost.chained_dispatch_s)
        stretch = bound / block if block > 0 else 0.0
        comp += bound * rep
        for phase, t in cats.items():
            by_cat[phase] = by_cat.get(phase, 0.0) + t * stretch * rep
    return (comp, *blocking, *hidden, by_cat)


def _layer_units(blocks, cost: CostModel, first_end: bool, last_end: bool, max_units: int,
                 hide_alltoall: bool = False, memo: Optional[dict] = None) -> list[tuple[int, tuple]]:
    """A chunk's forward or backward as per-layer units: [(layers, (comp, lat, intra, inter, a_lat, a_intra,
    a_inter))] (:func:`_unit_cost`).

    ``blocks`` are the chunk's (ops, repeat) blocks in execution order; ``first_end`` / ``last_end``
    say whether the first / last block is a non-layer end (embedding, LM head), whose cost joins the
    first / last unit. Consecutive layers are grouped so that there are at most ``max_units`` units.
    ``memo``: :func:`_unit_cost`'s.
    """
    rest = list(blocks)
    first = [rest.pop(0)] if first_end and rest else []
    last = [rest.pop()] if last_end and rest else []
    head, tail = _unit_cost(first, cost, hide_alltoall, memo)[:7], _unit_cost(last, cost, hide_alltoall, memo)[:7]
    layers: list[tuple] = []
    for ops, rep in rest:
        one = _unit_cost([(ops, 1)], cost, hide_alltoall, memo)[:7]
        layers.extend([one] * rep)
    if not layers:
        return [(0, tuple(a + b for a, b in zip(head, tail)))]
    n = len(layers)
    k = -(-n // max_units)  # layers per unit
    units = []
    for lo in range(0, n, k):
        group = layers[lo:lo + k]
        units.append((len(group), tuple(sum(v) for v in zip(*group))))
    units[0] = (units[0][0], tuple(a + b for a, b in zip(units[0][1], head)))
    units[-1] = (units[-1][0], tuple(a + b for a, b in zip(units[-1][1], tail)))
    return units


class _Builder:
    """Lays the execution graph out as engine tasks."""

    def __init__(self, eg: ExecutionGraph, cost: CostModel):
        self.eg, self.cost = eg, cost
        self.run = eg.run
        self.e = Engine()
        self.links: dict[tuple[int, str], int] = {}
        self.compute_part: dict[int, float] = {}  # task -> seconds of kernels (rest: blocking collectives)
        self.comm_memo: dict[tuple, object] = {}
        self.grad_memo: dict[tuple, tuple] = {}
        self.copy_memo: dict[tuple, float] = {}
        self.sharded_memo: dict[tuple, tuple] = {}
        self.block_memo: dict[tuple, tuple] = {}  # _unit_cost's, for this builder's graph and cost model

    def link(self, stage: int, level: str) -> int:
        key = (stage, level)
        if key not in self.links:
            self.links[key] = self.e.add_link(f"stage{stage}.{level}", self.cost.link_bandwidth_Bps(level))
        return self.links[key]

    def demands(self, stage: int, intra: float, inter: float) -> list[tuple[int, float]]:
        out = []
        if intra > 0:
            out.append((self.link(stage, "intra"), intra))
        if inter > 0:
            out.append((self.link(stage, "inter"), inter))
        return out

    def comm_cost(self, op: Op):
        """The cost model's CommCost of ``op``, memoised on what determines it (not the name)."""
        key = (op.kind, op.bytes, op.group, op.dtype)
        c = self.comm_memo.get(key)
        if c is None:
            c = self.comm_memo[key] = self.cost.comm_cost(op)
        return c

    def collective(self, stream: int, stage: int, op: Op, deps, category: str) -> int:
        c = self.comm_cost(op)
        return self.e.transfer(stream, c.latency_s, self.demands(stage, c.intra_bytes, c.inter_bytes), deps,
                               category, op.name)

    def sharded_comm(self, stream: int, stage: int, kind: str, params: float, layers: int, deps,
                     name: str) -> int:
        """One unit's ZeRO-3/FSDP gather, reduce-scatter or (``kind`` "allreduce", hybrid sharding) all-reduce of
        the reduced shards over the replicas: ``layers`` collectives of ``params / layers``.

        A unit of grouped layers keeps each layer's collective latency and bytes in one task.
        """
        key = (stage, kind, params, layers)
        hit = self.sharded_memo.get(key)
        if hit is None:
            s, eg = self.run.strategy, self.eg
            per = params / max(1, layers)
            if kind == "allgather":
                op = comm(name, kind, "fwd", per * eg.param_bytes_per_param, eg.shard_group, s.precision)
            else:
                op = comm(name, "reducescatter", "bwd", per * eg.grad_bytes_per_param, eg.shard_group,
                          s.reduce_precision)
                if kind == "allreduce":  # hybrid sharding: this rank's shard of it, all-reduced over the replicas
                    op = replica_allreduce(eg, op)
            c = self.comm_cost(op)
            n = max(1, layers)
            hit = self.sharded_memo[key] = (c.latency_s * n, self.demands(stage, c.intra_bytes * n, c.inter_bytes * n))
        return self.e.transfer(stream, hit[0], hit[1], deps, "dp_comm", name)

    def unit_task(self, stage: int, unit: tuple, deps, send, last: bool, category: str,
                  name: str) -> tuple[int, Optional[tuple]]:
        """One forward or backward unit on the stage's compute stream; returns the task and the send left.

        ``unit`` is ``(comp, lat, intra, inter, a_lat, a_intra, a_inter)`` (:func:`_unit_cost`). The unit's
        kernels and blocking TP/CP/EP collectives are one task: compute time first, then the collectives'
        bytes on the shared links (the part beyond ``comp`` is exposed). A blocking pipeline send (``send``,
        when ``last``) ends the unit: its bytes join the same task (fewer events).

        Expert all-to-alls that another micro-batch's computation hides (``a_*``, ``overlap_moe_comm``) run
        on the stage's ``ep`` stream beside that task, and the unit ends when both have: the steady state of
        a schedule that pairs one micro-batch's forward with another's backward, taken for every unit.
        While they run they hold :data:`MOE_COMM_SMS` of the device's SMs (:func:`kernels_beside_alltoalls_s`,
        with the all-to-alls' time alone on the links).
        """
        comp, lat, intra, inter, a_lat, a_intra, a_inter = unit
        dem = self.demands(stage, intra, inter)
        if last and send is not None and not self.run.strategy.overlap_p2p:
            lat += send[0]
            dem = dem + send[1]
            send = None
        hidden = a_lat > 0 or a_intra > 0 or a_inter > 0
        if hidden:
            alone = a_lat + max(a_intra / self.cost.link_bandwidth_Bps("intra") if a_intra else 0.0,
                                a_inter / self.cost.link_bandwidth_Bps("inter") if a_inter else 0.0)
            comp = kernels_beside_alltoalls_s(comp, alone, self.run.hardware.device.num_sms)
        t = self.e.transfer(self.compute_streams[stage], comp + lat, dem, deps, category, name)
        self.compute_part[t] = comp
        if hidden:
            x = self.e.transfer(self.ep_streams[stage], a_lat, self.demands(stage, a_intra, a_inter), deps,
                                "ep_comm", f"{name}.alltoall")
            t = self.e.compute(self.compute_streams[stage], 0.0, (t, x), category, name)
            self.compute_part[t] = 0.0
        return t, send

    def split_comm(self, stream: int, stage: int, kind: str, per_layer: float, root: float, layers: int,
                   rest_deps, one_deps, one_first: bool, name: str) -> tuple[int, int]:
        """A unit's gather or reduce-scatter as two tasks: one layer's (with the root's parameters, if any)
        and the unit's other layers'; returns (that layer's task, the last task).

        A unit groups layers only to bound events; splitting off the layer that the computation waits for
        (a gather's first, a reduce-scatter's last) keeps what a per-layer layout exposes: only that
        layer's collective, while the rest overlap the unit's computation. ``one_first`` puts the single
        layer before the rest on the stream (gathers); ``rest_deps`` and ``one_deps`` are each part's
        dependencies. A unit of one layer is one task.
        """
        if layers <= 1:
            t = self.sharded_comm(stream, stage, kind, per_layer * layers + root, layers, one_deps, name)
            return t, t
        parts = [("one", per_layer + root, 1, one_deps), ("rest", per_layer * (layers - 1), layers - 1, rest_deps)]
        tasks = {}
        for part, params, n, deps in (parts if one_first else parts[::-1]):
            tasks[part] = self.sharded_comm(stream, stage, kind, params, n, deps, f"{name}.{part}")
        return tasks["one"], tasks["one" if not one_first else "rest"]

    def layer_gather(self, stream: int, stage: int, per_layer: float, root: float, layers: int, done: list[int],
                     name: str) -> tuple[int, float]:
        """A unit's ZeRO-3/FSDP parameter gather (:meth:`split_comm`) and the seconds of FSDP's copies.

        The gather waits for the unit two before it (``done``: the units laid out so far), so that it
        runs while the previous unit computes: one unit of prefetch, when prefetching at all. Returns the
        task the unit's computation waits for: the gather of its first layer.
        """
        s = self.run.strategy
        pre = (done[-2],) if len(done) >= 2 and s.overlap_param_gather else ()
        first, _ = self.split_comm(stream, stage, "allgather", per_layer, root, layers, (), pre, True, name)
        copy_s = self.fsdp_copy_s("allgather", per_layer * layers + root, layers) if s.fsdp else 0.0
        return first, copy_s

    def fsdp_copy_s(self, kind: str, params: float, layers: int) -> float:
        """Seconds of PyTorch FSDP's buffer copies (:func:`fsdp_copy_ops`) around one unit's collectives."""
        key = (kind, params, layers)
        t = self.copy_memo.get(key)
        if t is None:
            n = max(1, layers)
            ops = fsdp_copy_ops(kind, params / n, self.eg.shard_group.size, self.run.strategy)
            t = self.copy_memo[key] = n * sum(self.cost.compute_time_s(op) for op in ops)
        return t

    def grad_segments(self, chunk: Chunk, max_segments: int) -> tuple[int, list[tuple[int, float, float, float]]]:
        """Gradient reduction of ``chunk`` split over at most ``max_segments`` backward segments.

        Returns the number of segments the backward is cut into (no more than there are buckets) and
        (segment, latency, intra bytes, inter bytes) of the reduction each segment releases.

        Buckets released by the same backward segment run back to back on the dp stream, so they are
        one transfer here: their latencies and bytes add up (a DDP model with 1,000 buckets would
        otherwise cost 1,000 events per stage without changing the answer beyond the per-bucket latency
        that is kept).
        """
        key = (chunk.dense_params, chunk.expert_params, max_segments)
        out = self.grad_memo.get(key)
        if out is None:
            buckets = gradient_buckets(self.eg, chunk)
            total = sum(n for _op, n in buckets)
            nseg = min(max_segments, max(1, total))
            merged: dict[int, list[float]] = {}
            k0 = 0
            for op, n in buckets:
                parts = [self.comm_cost(op)]
                follow = replica_allreduce(self.eg, op)
                if follow is not None:  # hybrid sharding: the bucket's shard is all-reduced over the replicas
                    parts.append(self.comm_cost(follow))
                # bucket k (over all kinds) is released by segment k·nseg // total
                for seg in range(k0 * nseg // total, (k0 + n - 1) * nseg // total + 1):
                    lo = max(k0, -(-seg * total // nseg))
                    hi = min(k0 + n, -(-(seg + 1) * total // nseg))
                    if hi <= lo:
                        continue
                    acc = merged.setdefault(seg, [0.0, 0.0, 0.0])
                    for c in parts:
                        acc[0] += c.latency_s * (hi - lo)
                        acc[1] += c.intra_bytes * (hi - lo)
                        acc[2] += c.inter_bytes * (hi - lo)
                k0 += n
            out = self.grad_memo[key] = (nseg, [(seg, *acc) for seg, acc in sorted(merged.items())])
        return out

    def chunk_grads(self, chunk: Chunk, releases: bool) -> tuple[int, list[tuple[int, float, float, float]]]:
        """The segments a backward unit of ``chunk`` is cut into and the gradient reductions they release
        (:meth:`grad_segments`: one segment per layer when reduction overlaps the backward) if the unit
        ``releases`` the chunk's gradients; else one segment and none."""
        if not releases:
            return 1, []
        return self.grad_segments(chunk, max(1, chunk.num_layers) if self.run.strategy.overlap_grad_reduce else 1)

    def reduce_grads(self, stage: int, vs: int, grads: list[tuple[int, float, float, float]],
                     done: list[int]) -> list[int]:
        """Tasks of the reductions ``grads`` (:meth:`chunk_grads`) on the stage's dp stream, each after the task
        of ``done`` (the unit's segments) that releases it when gradients are reduced during the backward."""
        overlap = self.run.strategy.overlap_grad_reduce
        return [self.e.transfer(self.dp_streams[stage], g_lat, self.demands(stage, g_intra, g_inter),
                                (done[seg],) if overlap else (), "dp_comm", f"grad_reduce{vs}.{seg}")
                for seg, g_lat, g_intra, g_inter in grads]

    def build(self) -> None:
        eg, run, e, cost = self.eg, self.run, self.e, self.cost
        s = run.strategy
        pp, v = s.pp, s.virtual_pipeline_stages
        n_v = pp * v
        zero = s.effective_zero_stage
        self.compute_streams = [e.add_stream(f"stage{st}.compute") for st in range(pp)]
        self.dp_streams = dp_streams = [e.add_stream(f"stage{st}.dp") for st in range(pp)]
        p2p_streams = [e.add_stream(f"stage{st}.p2p") for st in range(pp)] if s.overlap_p2p else self.compute_streams
        self.comm_streams = [[dp_streams[st]] + ([p2p_streams[st]] if s.overlap_p2p else []) for st in range(pp)]
        hide = s.overlap_moe_comm
        if hide:
            self.ep_streams = [e.add_stream(f"stage{st}.ep") for st in range(pp)]
            for st in range(pp):
                self.comm_streams[st].append(self.ep_streams[st])

        # per chunk: forward and backward unit costs
        fcost: dict[int, tuple] = {}
        bcost: dict[int, tuple] = {}
        wcost: dict[int, tuple] = {}  # zero-bubble schedules: the weight-gradient GEMMs, apart from bcost
        zb = s.zero_bubble
        for st in eg.stages:
            for c in st.chunks:
                fcost[c.vstage] = _unit_cost(c.forward, cost, hide, self.block_memo)
                if zb:
                    b_blocks, w_blocks = split_weight_gradients(c.backward)
                    bcost[c.vstage] = _unit_cost(b_blocks, cost, hide, self.block_memo)
                    wcost[c.vstage] = _unit_cost(w_blocks, cost, hide, self.block_memo)
                else:
                    bcost[c.vstage] = _unit_cost(c.backward, cost, hide, self.block_memo)

        # pipeline p2p: adjacent virtual stages on the same node or not
        pg = eg.p2p_group
        def p2p_level(a: int, b: int) -> str:
            per = max(1, pg.per_node)
            return "intra" if pg.size > 1 and per > 1 and a // per == b // per else "inter"
        lat_of = {}

        def p2p(src: int, dst: int):
            """(latency, link demands) of sending one micro-batch's activations from ``src`` to ``dst``."""
            lvl = p2p_level(src, dst)
            if lvl not in lat_of:  # only the levels a send uses: a one-node pipeline needs no network figures
                lat_of[lvl] = cost.comm_cost(comm("p2p", "p2p", "fwd", eg.p2p_bytes,
                                                  Group(2, 2 if lvl == "intra" else 1), s.precision))
            # the framework's exchange around each send (CostParams.pipeline_send_us) on top of the link's latency
            return (lat_of[lvl].latency_s + cost.pipeline_send_s,
                    [(self.link(src, lvl), eg.p2p_bytes), (self.link(dst, lvl), eg.p2p_bytes)])
        # (p2p is not kept on self: a closure over self stored on self is a reference cycle, which left every
        # builder, its engine and its graph for the cyclic garbage collector, a fifth of the simulation's time)

        sends: dict[tuple[int, int], Optional[tuple]] = {}  # (rank, to_vs) -> hand_over's, asked every unit

        def hand_over(i: int, to_vs: int):
            """:meth:`p2p` from rank ``i`` to the rank of virtual stage ``to_vs``; None past either end of the
            pipeline, or where that rank is ``i`` itself (the turn of a V keeps the activations in place)."""
            key = (i, to_vs)
            if key in sends:
                return sends[key]  # callers copy the demands, never change them
            if not 0 <= to_vs < n_v:
                out = None
            else:
                to = stage_of(to_vs, pp, s.v_shape)
                out = None if to == i else p2p(i, to)
            sends[key] = out
            return out

        fwd_done: dict[tuple[int, int], int] = {}  # (vstage, mb) -> task whose end delivers activations
        bwd_done: dict[tuple[int, int], int] = {}
        # the last backward unit of each chunk releases its gradients: its last "W" in a zero-bubble schedule
        grad_kind = "W" if zb else "B"
        releasing_mb: dict[int, int] = {}  # vstage -> the micro-batch whose unit releases the chunk's gradients
        for st in eg.stages:
            for kind, c, mb in st.schedule:
                if kind == grad_kind:
                    releasing_mb[st.chunks[c].vstage] = mb

        # ZeRO-1/2 parameter all-gather overlapped into the iteration start (distributed optimizer)
        param_gather: dict[int, int] = {}
        grad_tasks: dict[int, list[int]] = {st.index: [] for st in eg.stages}
        sharded_grads: dict[int, list[int]] = {st.index: [] for st in eg.stages}  # ZeRO-3/FSDP reduce-scatters
        pbytes = eg.param_bytes_per_param
        # ZeRO-3 and FSDP gather parameters and reduce-scatter gradients layer by layer (FSDP's SHARD_GRAD_OP
        # gathers in forward only); ZeRO-1/2 reduce buckets and gather the whole state after the step
        per_layer = s.per_layer_sharding and eg.shard_group.size > 1
        gather_bwd = per_layer and zero >= 3
        if per_layer:
            # gathers prefetch on their own stream (or block the compute stream); reduce-scatters on a third
            gather_streams = dp_streams if s.overlap_param_gather else self.compute_streams
            rs_streams = [e.add_stream(f"stage{st}.reduce_scatter") for st in range(pp)]
            for st in range(pp):
                self.comm_streams[st].append(rs_streams[st])
            cap = sharded_units_per_chunk(n_v)
            funits = {c.vstage: _layer_units(c.forward, cost, c.vstage == 0, c.vstage == n_v - 1, cap, hide,
                                             self.block_memo)
                      for st in eg.stages for c in st.chunks}
            bunits = {c.vstage: _layer_units(c.backward, cost, c.vstage == n_v - 1, c.vstage == 0, cap, hide,
                                             self.block_memo)
                      for st in eg.stages for c in st.chunks}
        elif zero in (1, 2) and eg.shard_group.size > 1 and s.overlap_param_gather:
            for st in eg.stages:
                for c in st.chunks:
                    op = comm(f"chunk{c.vstage}.param_allgather", "allgather", "fwd", c.params * pbytes,
                              eg.shard_group, s.precision)
                    param_gather[c.vstage] = self.collective(dp_streams[st.index], st.index, op, (), "dp_comm")

        # Build in a global order that respects cross-stage deps: iterate schedules round-robin by position
        pending = {st.index: list(st.schedule) for st in eg.stages}
        ptr = {i: 0 for i in pending}
        remaining = sum(len(x) for x in pending.values())
        first_f_done: set[int] = set()
        while remaining:
            progressed = False
            for st in eg.stages:
                i = st.index
                while ptr[i] < len(pending[i]):
                    kind, c_idx, mb = pending[i][ptr[i]]
                    chunk = st.chunks[c_idx]
                    vs = chunk.vstage
                    if kind == "F":
                        if vs > 0 and (vs - 1, mb) not in fwd_done:
                            break
                        deps = [fwd_done[(vs - 1, mb)]] if vs > 0 else []
                        if vs in param_gather and vs not in first_f_done:
                            deps.append(param_gather[vs])
                            first_f_done.add(vs)
                        units = funits[vs] if per_layer else [(0, fcost[vs][:7])]
                        send = hand_over(i, vs + 1)
                        done: list[int] = []
                        for u, (layers, unit) in enumerate(units):
                            d = list(deps) if u == 0 else [done[-1]]
                            if per_layer:
                                g, copy_s = self.layer_gather(gather_streams[i], i, chunk.params_per_layer,
                                                              chunk.root_params if u == 0 else 0.0, layers, done,
                                                              f"chunk{vs}.fsdp_allgather.f{mb}.{u}")
                                d.append(g)
                                unit = (unit[0] + copy_s,) + unit[1:]
                            t, send = self.unit_task(i, unit, d, send, u == len(units) - 1, "forward", f"F{vs}.{mb}")
                            done.append(t)
                        if send is not None:
                            t = e.transfer(p2p_streams[i], send[0], send[1], (t,), "pp_comm", f"send F{vs}.{mb}")
                        fwd_done[(vs, mb)] = t
                    elif kind == "W":
                        # a weight-gradient pass: kernels only, after its B on the same stream (the schedule
                        # puts every W after its B)
                        nseg, grads = self.chunk_grads(chunk, releasing_mb.get(vs) == mb)
                        done = []
                        for u in range(nseg):
                            done.append(e.compute(self.compute_streams[i], wcost[vs][0] / nseg, done[-1:], "backward",
                                                  f"W{vs}.{mb}"))
                            self.compute_part[done[-1]] = wcost[vs][0] / nseg
                        grad_tasks[i] += self.reduce_grads(i, vs, grads, done)
                    else:
                        if vs < n_v - 1 and (vs + 1, mb) not in bwd_done:
                            break
                        deps = [bwd_done[(vs + 1, mb)]] if vs < n_v - 1 else [fwd_done[(vs, mb)]]
                        is_last = not zb and releasing_mb.get(vs) == mb
                        if per_layer:
                            units, grads = bunits[vs], []
                        else:
                            nseg, grads = self.chunk_grads(chunk, is_last)
                            units = [(0, tuple(x / nseg for x in bcost[vs][:7]))] * nseg
                        send = hand_over(i, vs - 1)
                        done = []
                        for u, (layers, unit) in enumerate(units):
                            d = list(deps) if u == 0 else [done[-1]]
                            if per_layer:
                                body = chunk.params_per_layer
                                root = chunk.root_params if u == len(units) - 1 else 0.0
                                comp = unit[0]
                                if gather_bwd:
                                    # FSDP keeps its root's parameters gathered from forward to backward
                                    g, copy_s = self.layer_gather(gather_streams[i], i, body,
                                                                  chunk.root_params if u == 0 and not s.fsdp else 0.0,
                                                                  layers, done, f"chunk{vs}.fsdp_allgather.b{mb}.{u}")
                                    d.append(g)
                                    comp += copy_s
                                if s.fsdp:
                                    comp += self.fsdp_copy_s("reducescatter", body * layers + root, layers)
                                unit = (comp,) + unit[1:]
                            t, send = self.unit_task(i, unit, d, send, u == len(units) - 1, "backward", f"B{vs}.{mb}")
                            done.append(t)
                            if per_layer:
                                # every micro-batch's gradients are reduce-scattered as each layer's backward
                                # ends, whatever overlap_grad_reduce says (deferring them would hold every
                                # layer's unsharded gradients): the unit's earlier layers while it computes
                                # (from when it can start), its last layer (with the root's) once it is done
                                _, last = self.split_comm(rs_streams[i], i, "reducescatter", body, root, layers, d,
                                                          (t,), False, f"chunk{vs}.fsdp_reducescatter.b{mb}.{u}")
                                if is_last and eg.replicate_group.size > 1:
                                    # hybrid sharding: the accumulated shards are all-reduced over the replicas
                                    # once, after the last micro-batch's reduce-scatter of the unit
                                    last = self.sharded_comm(rs_streams[i], i, "allreduce", body * layers + root,
                                                             layers, (last,), f"chunk{vs}.hsdp_allreduce.{u}")
                                sharded_grads[i].append(last)
                        grad_tasks[i] += self.reduce_grads(i, vs, grads, done)
                        if send is not None:
                            t = e.transfer(p2p_streams[i], send[0], send[1], (t,), "pp_comm", f"send B{vs}.{mb}")
                        bwd_done[(vs, mb)] = t
                    ptr[i] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule has a cyclic dependency")

        # without overlap, gradient reduction waits for the whole backward of the stage
        if not s.overlap_grad_reduce:
            for st in eg.stages:
                last = e.stream_tasks[self.compute_streams[st.index]][-1]
                for tid in grad_tasks[st.index]:
                    e.t_succ[last].append(tid)
                    e.t_ndeps[tid] += 1
        # tied embeddings: first and last stage sum their embedding gradients
        if eg.tied_embedding_bytes and pp > 1:
            for idx in {0, pp - 1}:
                op = comm("tied_embedding_allreduce", "allreduce", "bwd", eg.tied_embedding_bytes,
                          Group(2, 2 if eg.p2p_group.per_node >= pp else 1), s.reduce_precision)
                last = e.stream_tasks[self.compute_streams[idx]][-1]
                grad_tasks[idx].append(self.collective(dp_streams[idx], idx, op, (last,), "dp_comm"))
        # optimizer step after every gradient of the stage is reduced
        self.opt_tasks = []
        for st in eg.stages:
            i = st.index
            deps = list(grad_tasks[i]) + list(sharded_grads[i]) + [e.stream_tasks[self.compute_streams[i]][-1]]
            dur = sum(cost.compute_time_s(op) for op in st.optimizer)
            t = e.compute(self.compute_streams[i], dur, deps, "optimizer", f"optimizer{i}")
            if zero in (1, 2) and not per_layer and eg.shard_group.size > 1 and not s.overlap_param_gather:
                for c in st.chunks:
                    op = comm(f"chunk{c.vstage}.param_allgather", "allgather", "opt", c.params * pbytes,
                              eg.shard_group, s.precision)
                    t = self.collective(self.compute_streams[i], i, op, (t,), "dp_comm")
            self.opt_tasks.append(t)
        self.fcost, self.bcost, self.wcost = fcost, bcost, wcost


def _stage_breakdown(b: _Builder, st: int, total: float) -> dict[str, float]:
    """Where stage ``st``'s compute stream spends the iteration's ``total`` seconds."""
    e = b.e
    tasks = e.stream_tasks[b.compute_streams[st]]
    bd = {"forward": 0.0, "backward": 0.0, "recompute": 0.0, "optimizer": 0.0, "exposed_communication": 0.0,
          "pipeline_bubble": 0.0}
    prev_end = 0.0
    recompute_share = {}
    for vs, (comp, *_load, cats) in b.bcost.items():
        recompute_share[vs] = cats.get("recompute", 0.0) / comp if comp else 0.0
    for i in tasks:
        gap = e.start[i] - prev_end
        if gap > 0:
            w = e.waited[i]
            cause = e.t_cat[w] if w >= 0 else ""
            # waiting on a gradient/parameter collective, or on expert all-to-alls that outlasted the kernels
            # beside them, is exposed communication; waiting on another stage's activations (compute or its
            # send) is the pipeline bubble
            if cause in ("dp_comm", "tp_comm", "ep_comm"):
                bd["exposed_communication"] += gap
            else:
                bd["pipeline_bubble"] += gap
        dur = e.end[i] - e.start[i]
        cat = e.t_cat[i]
        if cat in ("forward", "backward"):
            comp = min(dur, b.compute_part.get(i, dur))
            bd["exposed_communication"] += dur - comp
            if cat == "backward":
                name = e.t_name[i]
                # a zero-bubble W (weight gradients) recomputes nothing; its B's share is of the B alone
                r = 0.0 if name[0] == "W" else recompute_share.get(int(name[1:].split(".")[0]), 0.0)
                bd["recompute"] += comp * r
                bd["backward"] += comp * (1 - r)
            else:
                bd["forward"] += comp
        elif cat == "optimizer":
            bd[cat] += dur
        else:
            bd["exposed_communication"] += dur
        prev_end = e.end[i]
    # anything after the stage's last task (other stages still finishing) is bubble
    bd["pipeline_bubble"] += max(0.0, total - prev_end)
    bd["compute"] = bd["forward"] + bd["backward"] + bd["recompute"]
    return bd


def _analyse(b: _Builder, stage: Optional[int] = None) -> tuple[float, dict[str, float], int]:
    """Iteration time, and the breakdown of the bottleneck stage: ``stage`` if given, else the stage that waits
    least on the others (the least pipeline bubble; among equals the last to finish). Returns the stage too.

    The bottleneck, not the last stage to finish: in an unbalanced pipeline the first stage finishes last
    but spends its time waiting on a slower stage, whose own compute and communication are what the
    iteration pays for.
    """
    e = b.e
    total = e.run()
    last_stage, last_end = 0, -1.0
    for st, sid in enumerate(b.compute_streams):
        tasks = e.stream_tasks[sid]
        end = e.end[tasks[-1]] if tasks else 0.0
        if end > last_end:
            last_stage, last_end = st, end
    if stage is None:
        stage, bd = last_stage, _stage_breakdown(b, last_stage, total)
        for st in range(len(b.compute_streams)):
            if st != last_stage:
                other = _stage_breakdown(b, st, total)
                if other["pipeline_bubble"] < bd["pipeline_bubble"]:
                    stage, bd = st, other
    else:
        bd = _stage_breakdown(b, stage, total)
    overlap = b.eg.run.hardware.comm_overlap
    if overlap is not None and overlap < 1.0:
        # collectives that computation only partly hides (gloo on the cores the kernels use): the
        # unhidden share of the time they ran beside the compute of the stage that finishes last is paid on top
        tasks = e.stream_tasks[b.compute_streams[last_stage]]
        hidden = _overlap_s([(e.start[i], e.end[i]) for sid in b.comm_streams[last_stage] for i in e.stream_tasks[sid]],
                            [(e.start[i], e.end[i]) for i in tasks])
        extra = (1.0 - overlap) * hidden
        total += extra
        bd["exposed_communication"] += extra
    return total, bd, stage


def _overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the time covered both by the union of intervals ``a`` and by the union of ``b``."""
    def union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
        out: list[list[float]] = []
        for lo, hi in sorted(iv):
            if hi <= lo:
                continue
            if out and lo <= out[-1][1]:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        return [(lo, hi) for lo, hi in out]

    ua, ub = union(a), union(b)
    i = j = 0
    total = 0.0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if hi > lo:
            total += hi - lo
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


#: The parts of a breakdown that are waits rather than work (see :func:`_extrapolated_breakdown`)
_WAITS = ("exposed_communication", "pipeline_bubble")
#: The parts that add up to the iteration time (``compute`` is forward + backward + recompute)
_PARTS = ("forward", "backward", "recompute", "optimizer") + _WAITS


def _extrapolated_breakdown(bd1: dict, bd2: dict, slope: float, total: float) -> tuple[float, dict]:
    """The iteration time and its breakdown along the lines through the breakdowns ``bd1`` and ``bd2`` of two
    shorter steps; ``total`` is the time's own line there.

    The parts add up to the time at both steps, so their lines add up to the time's line; but a short pipeline
    can class a wait otherwise than the steady state does (with ZeRO-3, a stage of a short pipeline waits on a
    neighbour that waits on a gather: a bubble; in a longer one it waits on its own gathers), and a wait
    whose line falls below zero must stop there. The work parts (forward, backward, recompute, optimizer) are
    durations, linear in the micro-batches; the waits then share what the work leaves of ``total`` in the
    proportions of their lines, so that the parts still add up to the time. The stage runs its work one task
    after another, so the time is at least the work: where two steps too short for the steady state put the
    time's line under it (the waits' lines both below zero), the time is the work
    (``experiments/breakdown_extrapolation.py`` compares both with simulating every micro-batch).
    """
    bd = {k: max(0.0, bd2[k] + (bd2[k] - bd1[k]) * slope) for k in bd2}
    work = sum(bd[k] for k in _PARTS if k not in _WAITS)
    total = max(total, work)
    waits = sum(bd[k] for k in _WAITS)
    left = max(0.0, total - work)
    if waits > 0:
        for k in _WAITS:
            bd[k] *= left / waits
    else:
        bd["pipeline_bubble"] = left
    bd["compute"] = bd["forward"] + bd["backward"] + bd["recompute"]
    return total, bd


def simulate_line(run: RunSpec, cost: CostModel, m1: int, m2: int) -> tuple[float, dict, "_Builder", ExecutionGraph]:
    """The iteration of ``run`` along the line through ``m1`` and ``m2`` < ``run.num_microbatches`` micro-batches:
    ``(time s, breakdown, m2's builder, m2's graph)`` (:func:`simulate` takes its pair by schedule).

    The bottleneck stage of m2's pipeline is analysed at m1 too: the breakdown's line joins one stage.
    """
    t2, bd2, b2, eg, stage = _simulate_once(run, cost, m2)
    t1, bd1, _b1, _, _ = _simulate_once(run, cost, m1, stage)
    slope = (run.num_microbatches - m2) / (m2 - m1)
    total, bd = _extrapolated_breakdown(bd1, bd2, slope, t2 + (t2 - t1) * slope)
    return total, bd, b2, eg


def _simulate_once(run: RunSpec, cost: CostModel, m: int, stage: Optional[int] = None):
    eg = compile_run(run, m)
    b = _Builder(eg, cost)
    b.build()
    total, bd, stage = _analyse(b, stage)
    return total, bd, b, eg, stage


def simulate(run: RunSpec | dict, *, cost: CostModel | None = None, trace: bool = False,
             exact: bool = False) -> SimResult:
    """Simulate one iteration of ``run`` and return a :class:`SimResult`.

    Args:
        run: a :class:`RunSpec` or a run-format dict.
        cost: the cost model (default: :class:`RooflineCost` with the fitted constants).
        trace: also return a Chrome/Perfetto trace of the iteration (simulates every micro-batch).
        exact: simulate every micro-batch instead of extrapolating a long steady state.
    """
    run = RunSpec.from_dict(run) if not isinstance(run, RunSpec) else run
    cost = cost or RooflineCost(run.hardware)
    s = run.strategy
    m = run.num_microbatches
    # after the warm-up (p-1 micro-batches) every stage repeats the same pattern: two counts that are
    # multiples of p (the interleaved schedule's period) past it fix the line exactly. Gathers and reduce-scatters
    # of sharded states (ZeRO 1-3, FSDP) and shared links delay the first micro-batches unevenly, so the line is
    # taken from 2p and 4p: of 228 sampled pipelines of 4p to 64p micro-batches (sampler 11, seed 0) 8 extrapolate
    # more than 1 % off the exact time (worst 3.1 %), against 20 (worst 11.6 %, a ZeRO-3 GPipe run) from p and 2p,
    # for 1.6 times the simulation time of such a run (experiments/breakdown_extrapolation.py --compare-pairs)
    m1, m2 = (2 * s.pp, 4 * s.pp) if s.pp > 1 else (2, 3)
    if s.zero_bubble and s.v_shape:
        # deferred weight passes let early delays (the parameter gather, shared links) spread over the first
        # micro-batches, so ZB-H1 reaches its line later: from 2p and 4p, 248 of 250 sampled runs extrapolate
        # to within 0.1 % of the exact time, from p and 2p 221 (experiments/zero_bubble.py --n 1500 --seeds
        # 0,1,2; sampler 9), interleaved zero bubble 97 of 98 (worst 0.51 %; from p and 2p 81; sampler 10). ZB-V,
        # laid out on at least 2p-1 micro-batches, gets there later still: from 4p and 8p 78 of 83 (worst 0.65 %),
        # from max(2p, 8) and max(4p, 16) 73 (worst 2.6 %; sampler 10)
        m1, m2 = 4 * s.pp, 8 * s.pp
    extrapolate = not (exact or trace) and m > m2
    if extrapolate:
        total, bd, b2, eg = simulate_line(run, cost, m1, m2)
        events = len(b2.e.t_stream)
        if m2 < memory_microbatches(run):  # m2's graph has the peak memory unless activations still grow
            eg = compile_run(run)
    else:
        total, bd, b2, eg, _ = _simulate_once(run, cost, m)
        events = len(b2.e.t_stream)
    mem = peak_memory(eg)
    result = SimResult(run, total, bd, mem, model_flops_per_iteration(run), events, extrapolate,
                       cost_model=cost.name)
    if trace:
        from .trace import chrome_trace

        result.trace = chrome_trace(b2.e)
    return result
