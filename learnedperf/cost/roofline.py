"""Analytical cost: roofline compute with per-kind efficiency, α-β collectives."""

from __future__ import annotations

import math

from ..graph.ops import Op
from ..specs import HardwareSpec
from .base import CommCost, CostModel
from .collective import collective_cost
from .curves import curve_rate_flops
from .params import REDUCTION_KINDS, CostParams, default_params, gemm_aligned, slot_powered

_TC_PRECISIONS = ("tf32", "bf16", "fp16", "fp8")


def attention_flops(op: Op, tile_n: int) -> float:
    """FLOPs a fused attention kernel executes for ``op``: a causal square one skips the key blocks
    (of ``tile_n`` keys) above the diagonal, leaving (nb+1)/(2nb) of them (FlashAttention)."""
    b, heads, s_q, s_kv, _hd = op.shape
    if op.causal and s_q == s_kv:
        nb = max(1, math.ceil(s_kv / tile_n))
        return op.flops * (nb + 1) / (2 * nb)
    return op.flops


class RooflineCost(CostModel):
    """Roofline cost of ops on the devices of ``hardware``.

    A GEMM takes ``launch + max(FLOPs / (peak·η), bytes / (bandwidth·η_mem))`` where
    η is the fitted large-GEMM efficiency times wave quantisation over the SMs
    (``tiles / (waves·SMs)``) times an inner-dimension factor ``k / (k + k½)`` (``gemm_k_half_tensor`` on the
    tensor-core peak, ``gemm_k_half`` on the fp32 one); an fp32 GEMM with a
    dimension that is not a multiple of 16 bytes (:func:`~learnedperf.cost.params.gemm_aligned`) reaches
    ``gemm_unaligned_share`` of that.
    Fused attention runs at a fitted fraction of peak and skips the masked half
    of a causal score matrix; every other kind is memory bound, a row reduction (softmax, layer or RMS norm)
    at ``reduction_memory_share`` of the element-wise bandwidth. A collective whose measured bus
    bandwidth is a fraction of all-reduce's (``hardware.collective_busbw_ratio``) moves its bytes
    at that fraction of the link rate.

    A device that carries measured kernel curves (``DeviceSpec.kernel_curves``, see
    :mod:`learnedperf.cost.curves`) has its GEMMs and fused attention costed on them instead:
    ``overhead + max(FLOPs / (rate·η·∏ d/(d+d½)), bytes / bandwidth)``, with η the share of an
    isolated kernel's rate kept inside a step (``curve_efficiency`` when set, else the dtype's fitted
    GEMM efficiency); a measured ``optimizer_step`` rate replaces the optimizer's streaming estimate.
    Such a device's bandwidth was measured too: memory-bound ops reach ``curve_memory_efficiency`` of
    it when that is set.
    """

    name = "roofline"

    def __init__(self, hardware: HardwareSpec, params: CostParams | None = None):
        self.hw = hardware
        self.p = params or default_params()
        d = hardware.device
        # a device with kernel curves was described by measurement, its bandwidth included: the share
        # of it a step reaches may be a constant of its own, not the share of a data sheet's
        mem_eff = self.p.memory_efficiency
        if d.kernel_curves is not None and self.p.curve_memory_efficiency is not None:
            mem_eff = self.p.curve_memory_efficiency
        self._bw = d.memory_bandwidth_GBps * 1e9 * mem_eff
        self._sms = d.num_sms
        self._launch = self.p.kernel_launch_us * 1e-6
        self._floor = self.p.kernel_floor_us * 1e-6
        self.host_dispatch_s = self.p.host_dispatch_us * 1e-6
        self.chained_dispatch_s = self.p.eager_dispatch_us * 1e-6
        self.pipeline_send_s = self.p.pipeline_send_us * 1e-6
        self._peak: dict[str, float] = {}
        # a slot-powered card cannot hold the boost clock its data-sheet peaks are quoted at (CostParams);
        # a measured kernel curve is an achieved rate and is not derated
        self._power_share = self.p.slot_power_compute_share if slot_powered(d) else 1.0
        self._attention_d_half = self.p.gemm_k_half if self.p.attention_d_half is None else self.p.attention_d_half
        self._k_half_tensor = self.p.gemm_k_half if self.p.gemm_k_half_tensor is None else self.p.gemm_k_half_tensor
        self._cache: dict[Op, float] = {}
        # the curve lookup of each op, once: LearnedOpCost asks has_curve before compute_time_s
        self._curves: dict[Op, float | None] = {}
        intra = hardware.intra_node_bandwidth_GBps
        inter = hardware.inter_node_bandwidth_GBps
        self._bw_intra = (intra or 0.0) * 1e9 * self.p.link_efficiency_intra
        self._bw_inter = (inter or 0.0) * 1e9 * self.p.link_efficiency_inter
        lat_intra = hardware.intra_node_latency_us
        lat_inter = hardware.inter_node_latency_us
        self._a_intra = (self.p.alpha_intra_us if lat_intra is None else lat_intra) * 1e-6
        self._a_inter = (self.p.alpha_inter_us if lat_inter is None else lat_inter) * 1e-6
        # a measured link latency (fit_link's two terms) already holds a call's fixed time
        measured_latency = lat_intra is not None or lat_inter is not None
        self._base = 0.0 if measured_latency else self.p.collective_base_us * 1e-6

    # ----------------------------------------------------------- compute
    def _peak_flops(self, dtype: str, kind: str) -> tuple[float, float]:
        """(peak FLOP/s, large-op efficiency) for ``dtype`` on this device."""
        key = dtype + kind
        if key not in self._peak:
            peaks = self.hw.device.peak_tflops
            if kind == "attention" and dtype == "fp8":
                dtype = "bf16"  # fused attention runs in bf16 in fp8 recipes (Transformer Engine)
            value = peaks.get(dtype) if dtype in _TC_PRECISIONS else None
            tensor = value is not None
            if tensor:
                eff = self.p.attention_efficiency if kind == "attention" else self.p.gemm_efficiency_tensor
            else:
                value = peaks.fp32
                eff = self.p.attention_efficiency if kind == "attention" else self.p.gemm_efficiency_fp32
            self._peak[key] = value * 1e12
            self._peak[key + "eff"] = eff
            # the GEMM's inner-dimension ramp: the tensor cores' where the op runs on them
            self._peak[key + "k_half"] = self._k_half_tensor if tensor else self.p.gemm_k_half
        return self._peak[key], self._peak[key + "eff"]

    def _wave_efficiency(self, tiles: int) -> float:
        if self._sms <= 0 or tiles <= 0:
            return 1.0
        waves = math.ceil(tiles / self._sms)
        return tiles / (waves * self._sms)

    def compute_time_s(self, op: Op) -> float:
        """Seconds of compute op ``op`` (memoised per distinct op)."""
        cached = self._cache.get(op)
        if cached is not None:
            return cached
        kind = op.kind
        curve = self._curve_of(op)
        if curve is not None:
            t = curve
        elif kind == "matmul":
            b, m, n, k = op.shape
            peak, eff = self._peak_flops(op.dtype, kind)
            tiles = b * math.ceil(m / self.p.tile_m) * math.ceil(n / self.p.tile_n)
            k_half = self._peak[op.dtype + kind + "k_half"]
            eff *= self._power_share * self._wave_efficiency(tiles) * k / (k + k_half)
            if op.dtype == "fp32" and not gemm_aligned(op.shape, 4):
                eff *= self.p.gemm_unaligned_share
            t = self._launch + max(op.flops / (peak * eff), op.bytes / self._bw)
        elif kind == "attention":
            b, heads, s_q, s_kv, hd = op.shape
            peak, eff = self._peak_flops(op.dtype, kind)
            flops = attention_flops(op, self.p.tile_n)
            tiles = b * heads * math.ceil(s_q / self.p.tile_m)
            # the scores' GEMM has the head dimension as its inner one: a ramp like the GEMMs' k½, fitted apart
            eff *= self._power_share * self._wave_efficiency(tiles) * hd / (hd + self._attention_d_half)
            if op.phase == "bwd":
                eff *= self.p.attention_bwd_share
            t = self._launch + max(flops / (peak * eff), op.bytes / self._bw)
        elif kind == "conv":
            peak, eff = self._peak_flops(op.dtype, "matmul")
            t = self._launch + max(op.flops / (peak * eff * self._power_share), op.bytes / self._bw)
        elif kind in REDUCTION_KINDS:
            t = self._launch + op.bytes / (self._bw * self.p.reduction_memory_share)
        else:
            t = self._launch + op.bytes / self._bw
        if t < self._floor:
            t = self._floor
        self._cache[op] = t
        return t

    def has_curve(self, op: Op) -> bool:
        """Whether ``op`` is costed on the device's measured curves (``kernel_curves``, ``optimizer_step``)."""
        return self._curve_of(op) is not None

    def _curve_of(self, op: Op) -> float | None:
        """:meth:`_curve` of ``op``, evaluated once per distinct op."""
        if op in self._curves:
            return self._curves[op]
        value = self._curves[op] = self._curve(op)
        return value

    def _curve(self, op: Op) -> float | None:
        """Seconds of ``op`` on the device's measured curves, or None when it has none for it."""
        d = self.hw.device
        if op.kind == "optimizer":
            # the graph names its step "optimizer.<adam|sgd>"; a measured operator record "adamw"
            name = op.name.rpartition(".")[2]
            rate = d.optimizer_step.get("adam" if name == "adamw" else name) if d.optimizer_step else None
            if rate is None:
                return None
            return rate.overhead_us * 1e-6 + op.shape[0] * rate.ns_per_param * 1e-9
        if d.kernel_curves is None or op.kind not in ("matmul", "attention"):
            return None
        matmul = op.kind == "matmul"
        curve = d.curve("matmul" if matmul else "attention_bwd" if op.phase == "bwd" else "attention_fwd", op.dtype)
        if curve is None:
            return None
        # a causal attention skips whole key blocks: the device's measured block, else the cost model's tile
        dims, flops = ((op.shape[1:4], op.flops) if matmul else
                       (op.shape[2:5], attention_flops(op, curve.causal_block or self.p.tile_n)))
        # η: the share of an isolated kernel's rate kept inside a step, the same for attention as for
        # GEMMs (both measured the same way), one value for every dtype (shipped: 1, the curve at face
        # value). Without it η is the data-sheet efficiency of the dtype, a share of a peak that a measured
        # rate already includes: vm-epyc-2c's fp32 steps came out 0.25 slower in log than its bf16 ones.
        # The memory bound still holds below the curve.
        eff = self.p.curve_efficiency
        if eff is None:
            _peak, eff = self._peak_flops(op.dtype, "matmul")
        return curve.overhead_us * 1e-6 + max(flops / curve_rate_flops(curve, dims, eff), op.bytes / self._bw)

    # ----------------------------------------------------- communication
    def link_bandwidth_Bps(self, level: str) -> float:
        """Achievable per-direction bytes/s of one rank's ``level`` link."""
        bw = self._bw_intra if level == "intra" else self._bw_inter
        if bw <= 0:
            field = "intra_node_bandwidth_GBps" if level == "intra" else "inter_node_bandwidth_GBps"
            self.hw.link(field)  # raises a SpecError naming the missing field
        return bw

    def comm_cost(self, op: Op) -> CommCost:
        """Latency and bytes per level of collective ``op``."""
        g = op.group
        if g is not None and g.size > 1:
            # check that the links this collective needs are known (clear error otherwise)
            if g.per_node > 1 or g.nodes == 1:
                self.link_bandwidth_Bps("intra")
            if g.nodes > 1:
                self.link_bandwidth_Bps("inter")
        c = collective_cost(op, self._a_intra, self._a_inter, self._bw_intra or 1.0, self._bw_inter or 1.0,
                            self._base)
        ratio = self.hw.busbw_ratio(op.kind)
        if ratio != 1.0:
            # a collective at a fraction of all-reduce's bus bandwidth takes as long as 1/ratio the bytes
            c = CommCost(c.latency_s, c.intra_bytes / ratio, c.inter_bytes / ratio, c.algorithm)
        return c
