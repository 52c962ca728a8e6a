"""Fitted constants of the analytical cost model.

The values live in ``cost/data/params.json``, written by the fitting code in
:mod:`learnedperf.cost.calibrate` (operator- and collective-level fits on the
public measurements in ``shared/data``), ``experiments/calibrate_steps.py`` (whole-step fit on
vTrain and SC21) and :mod:`learnedperf.simulate.calibrate` (the measured-device constants, fitted on
this project's measured steps by ``experiments/calibrate_steps.py --measured``); each value's
provenance is stored next to it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Optional


#: The most a PCI Express x16 slot supplies without an auxiliary power cable (PCI Express Card
#: Electromechanical Specification: 75 W for a x16 graphics card). A card whose data-sheet power is at most
#: this is powered by the slot alone and is built to that budget, not to hold its boost clock under load.
SLOT_POWER_W = 75.0

#: The width of the vector loads a GEMM kernel reads its operands with: 16 bytes (NVIDIA, *Matrix
#: Multiplication Background User's Guide*, "Tensor Core Requirements": dimensions that are multiples of
#: 16 bytes; the 128-bit LDG of CUTLASS's SIMT and tensor-core iterators, whose ``kAlignment`` is 16 bytes
#: over the element size). A dimension of another length makes cuBLAS take a kernel of narrower loads.
GEMM_ALIGN_BYTES = 16


#: Op kinds costed as row reductions (``CostParams.reduction_memory_share``)
REDUCTION_KINDS = ("softmax", "layernorm", "rmsnorm")


def gemm_aligned(shape, dtype_bytes: int) -> bool:
    """Whether a GEMM of ``shape`` ``(b, m, n, k)`` has every one of m, n and k a multiple of
    :data:`GEMM_ALIGN_BYTES` bytes of its ``dtype_bytes``-byte elements."""
    step = max(1, GEMM_ALIGN_BYTES // dtype_bytes)
    return all(int(d) % step == 0 for d in shape[1:4])


def slot_powered(device) -> bool:
    """Whether ``device`` (a DeviceSpec or a catalog dict) is a card powered by its slot alone: its data
    sheet's ``tdp_W`` is known and at most :data:`SLOT_POWER_W`."""
    tdp = device.get("tdp_W") if isinstance(device, dict) else getattr(device, "tdp_W", None)
    return tdp is not None and tdp <= SLOT_POWER_W


@dataclass(frozen=True)
class CostParams:
    """Efficiency and overhead constants of :class:`~learnedperf.cost.roofline.RooflineCost`.

    Attributes:
        gemm_efficiency_tensor: fraction of the data-sheet tensor-core peak a large GEMM reaches.
        gemm_efficiency_fp32: fraction of the fp32 (non-tensor-core) peak a large GEMM reaches.
        gemm_k_half: inner dimension at which a GEMM reaches half its large-k efficiency.
        gemm_k_half_tensor: the same for a GEMM on the tensor-core peak (tf32/bf16/fp16/fp8): a tensor-core kernel
            steps through k in deeper tiles (a CUTLASS Hopper bf16 tile is 128×128×64, an Ampere SIMT fp32 one
            128×128×8), so a short inner dimension leaves more of its pipeline unfilled. None (shipped):
            ``gemm_k_half``, one ramp for every GEMM. The lent GPUs' bf16/fp16 kernels fit 192 (mean |log err|
            0.200 against 0.218 at 8), but it costs SC21's steps 2.6 → 5.1 % (5.4 % with the tensor-core
            efficiency refitted on vTrain's) and moves no other step set much
            (``experiments/kernel_models_in_steps.py``).
        tile_m, tile_n: output tile of a GEMM thread block (CUTLASS/cuBLAS Ampere default 128×128)
            used for wave quantisation over the SMs.
        attention_efficiency: fraction of tensor-core peak a fused (flash) attention kernel's forward
            reaches at a large head dimension; a head of ``d`` reaches ``d / (d + attention_d_half)`` of it (the
            scores' GEMM has the head dimension as its inner dimension).
        attention_d_half: head dimension at which a fused attention kernel reaches half its large-head
            efficiency (its ramp ``d / (d + attention_d_half)``), fitted on measured attention kernels apart from
            the GEMMs' ``gemm_k_half``: the two ramps differ (the lent GPUs' SDPA kernels fit 96, mean |log err|
            0.163, where the fp32 GEMMs' 8 leaves them at 0.206). None: ``gemm_k_half``, the one ramp of both
            before 2026-11-29.
        attention_bwd_share: the share of the forward's efficiency the backward reaches, its FLOPs counted
            as twice the forward's (FlashAttention's backward recomputes the scores: five GEMMs to two).
        memory_efficiency: fraction of data-sheet DRAM bandwidth a memory-bound kernel reaches.
        reduction_memory_share: the share of that bandwidth a row-reduction kernel (softmax, layer norm, RMS norm:
            :data:`REDUCTION_KINDS`) keeps: it reads each row for its statistics before it writes, and holds
            fewer bytes in flight than an element-wise kernel. 1 (shipped): every memory-bound kernel alike.
            NeuSight's kernels fit 0.76 of the element-wise kernels' 0.76, which also fits the lent GPUs' norm
            kernels better, but whole steps worse (SC21 2.6 → 3.1 %, NeuSight's 8.5 → 9.6 %;
            ``experiments/kernel_models_in_steps.py``).
        kernel_launch_us: fixed time added to every kernel (launch gap and tail).
        kernel_floor_us: shortest time a kernel occupies the stream in a training step (the host's
            per-operator dispatch time, which small kernels cannot hide), kernel by kernel.
        eager_dispatch_us: time the host takes to issue one bare tensor operation of an eager chain
            (``Op.chained``: RoPE's and SwiGLU's kernels after their first under eager PyTorch), which
            costs the host less than a framework-level operator. 0: chained kernels are free to issue.
        pipeline_send_us: fixed time one pipeline-parallel send of a micro-batch's activations or gradients
            adds to its link time (α + bytes / bandwidth), on the stream it runs on: the framework's exchange
            around it (a blocking send/receive pair and the device synchronisation Megatron-LM runs after its
            batched isend/irecv; DeepSpeed's pipeline instructions). Fitted on whole steps
            (``experiments/calibrate_steps.py``): without it the simulator's miss on vTrain's pipelined runs
            grows with the micro-batches and shrinks with the layers per stage (``experiments/
            vtrain_pipeline_bias.py``), a cost per send. 0: a send costs its link time alone.
        host_dispatch_us: time the host takes to issue one kernel: a block of kernels issued back to back
            (a layer's forward or backward) takes at least that many times it
            (:func:`~learnedperf.cost.base.host_bound_s`). 0: the host never binds.
        link_efficiency_intra / link_efficiency_inter: fraction of data-sheet link bandwidth a
            collective reaches (NCCL bus bandwidth / link bandwidth).
        alpha_intra_us / alpha_inter_us: per-step latency of a ring collective inside / across nodes.
        collective_base_us: fixed time of one collective call whatever its ranks and size (NCCL's
            kernel launch and the ranks' handshake; NCCL's own tuner models a base latency per algorithm
            beside the per-hop one, ``src/graph/tuning.cc``), charged once per collective on links the
            run takes from the catalog. A hardware spec that states its link latencies (measured with
            :func:`~learnedperf.measure.bench.fit_link`, whose two-term fit folds the fixed time into its
            per-step latency) is charged none. 0 (the default; not in ``params.json``): a collective's
            latency is its steps' alone. Left at 0 because, fitted beside ``alpha_intra_us`` on NCCL's
            all-reduce tables, it fits them better but raises the simulator's error on whole steps
            (``experiments/allreduce_base.py``).
        curve_efficiency: on a device described by measurement (one that carries kernel curves), the
            share of an isolated kernel's measured rate a GEMM or fused attention keeps inside a
            training step, one value for every dtype. Shipped: 1, not fitted (the curve at face value).
            None: the GEMM efficiency of the op's dtype above, a share of a *data-sheet* peak.
        curve_memory_efficiency: on such a device, the share of its *measured* streaming bandwidth
            a memory-bound op reaches inside a step. None (shipped): ``memory_efficiency``.
        slot_power_compute_share: on a card powered by its PCIe slot alone (data-sheet ``tdp_W`` at most
            :data:`SLOT_POWER_W`, as the T4, P4 and L4), the share of its data-sheet compute peaks, quoted
            at the boost clock, that it sustains under a GEMM's load: its GEMM efficiencies are the other
            devices' times this. 1: no derating.
        gemm_unaligned_share: the share of ``gemm_efficiency_fp32`` an fp32 GEMM reaches when one of its
            dimensions (m, n or the inner k) is not a multiple of :data:`GEMM_ALIGN_BYTES` bytes: its operands
            cannot be read with 16-byte vector loads, and cuBLAS may fall back to kernels that read them element
            by element. Tensor-core GEMMs are not derated (no unaligned tensor-core kernel has been measured).
            1: alignment ignored. Fitted on NeuSight's transformer-shaped kernels it is 0.99: there only the
            P100 and P4 slow down, and only with an unaligned inner dimension (a vocabulary's, in the LM head's
            input gradient); the 0.81 fitted on the whole grid came from its random-dimension part, which runs
            slower aligned or not (``experiments/gemm_fp32_power.py``, section 0).

    Held out one CPU at a time, the shipped learned model is best with nothing fitted on CPU steps
    (README, *Constants of a measured device*): ``gnn_residual+ops`` on the Xeon / EPYC was at 10.6 /
    15.9 % with the data-sheet efficiencies on the curves, 21.3 / 9.9 % with both constants fitted on the
    other CPU's steps (``experiments/calibrate_steps.py --measured`` fits them), and 9.0 / 11.3 % with the
    curves at face value. A fitted value's provenance starts "fit by", and the evaluation then refits it
    in each CPU's split.
    """

    gemm_efficiency_tensor: float = 0.8
    gemm_efficiency_fp32: float = 0.8
    gemm_k_half: float = 64.0
    gemm_k_half_tensor: Optional[float] = None
    tile_m: int = 128
    tile_n: int = 128
    attention_efficiency: float = 0.5
    attention_d_half: Optional[float] = None
    attention_bwd_share: float = 1.0
    memory_efficiency: float = 0.8
    reduction_memory_share: float = 1.0
    kernel_launch_us: float = 5.0
    kernel_floor_us: float = 0.0
    host_dispatch_us: float = 0.0
    pipeline_send_us: float = 0.0
    eager_dispatch_us: float = 0.0
    link_efficiency_intra: float = 0.8
    link_efficiency_inter: float = 0.8
    alpha_intra_us: float = 5.0
    alpha_inter_us: float = 10.0
    collective_base_us: float = 0.0
    curve_efficiency: Optional[float] = None
    curve_memory_efficiency: Optional[float] = None
    slot_power_compute_share: float = 1.0
    gemm_unaligned_share: float = 1.0

    def to_dict(self) -> dict:
        """Plain dict of the constants."""
        return asdict(self)


def _path() -> Path:
    return Path(str(resources.files(__package__).joinpath("data", "params.json")))


@cache
def default_params() -> CostParams:
    """The shipped fitted constants (``cost/data/params.json``)."""
    data = json.loads(_path().read_text(encoding="utf-8"))
    names = {f.name for f in fields(CostParams)}
    values = {k: v["value"] for k, v in data.items() if k in names}
    return replace(CostParams(), **values)


def provenance() -> dict:
    """Each constant with the data and method that produced it."""
    return json.loads(_path().read_text(encoding="utf-8"))


def write_params(updates: dict[str, tuple[float, str]]) -> None:
    """Store fitted ``{name: (value, provenance)}`` into ``params.json`` (used by calibration)."""
    path = _path()
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    for name, (value, how) in updates.items():
        data[name] = {"value": value, "provenance": how}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    default_params.cache_clear()
