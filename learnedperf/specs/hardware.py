"""Devices and clusters.

A :class:`DeviceSpec` is one accelerator as its data sheet describes it; a
:class:`HardwareSpec` is ``num_devices`` of them grouped in nodes (or NVLink
domains) of ``devices_per_node``, with the per-device, per-direction bandwidth
and latency of the links inside and across nodes.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from ..errors import SpecError
from ..units import PRECISIONS
from ._base import FieldValueError, Spec, key_text


class PeakTflops(Spec):
    """Dense peak throughput per precision in TFLOP/s (no sparsity); ``None`` = unsupported."""

    fp32: float = Field(gt=0)
    tf32: Optional[float] = Field(default=None, gt=0)
    bf16: Optional[float] = Field(default=None, gt=0)
    fp16: Optional[float] = Field(default=None, gt=0)
    fp8: Optional[float] = Field(default=None, gt=0)

    def get(self, precision: str) -> Optional[float]:
        """Peak TFLOP/s of ``precision`` or None when the device has no such math."""
        if precision not in PRECISIONS:
            raise SpecError("strategy.precision", f"unknown precision {precision!r}")
        return getattr(self, precision)


#: Kernels a device may carry a measured throughput curve for (:class:`KernelCurve`).
CURVE_KERNELS = ("matmul", "attention_fwd", "attention_bwd")
#: Optimizers a device may carry a measured step rate for (:class:`OptimizerRate`).
CURVE_OPTIMIZERS = ("adam", "sgd")


class KernelCurve(Spec):
    """Measured time of one compute kernel of one dtype on this device, as a function of size.

    ``time = overhead_us + FLOPs / (tflops · ∏ d / (d + dim_half))`` over the op's dimensions
    (a GEMM's m, n, k; an attention's s_q, s_kv, head dim): Hockney's fixed start-up plus a rate
    that falls when any dimension is small against ``dim_half``, where blocked kernels cannot fill
    their tiles. Fitted by :func:`learnedperf.cost.curves.fit_kernel_curve` on operator timings.
    """

    tflops: float = Field(gt=0, le=1e5, description="rate of large ops, TFLOP/s")
    overhead_us: float = Field(ge=0, le=1e6, description="fixed time of one call, µs")
    dim_half: float = Field(ge=0, le=1e6, description="dimension at which the rate halves")
    causal_block: Optional[int] = Field(
        default=None, ge=1, le=1 << 20,
        description="attention only: keys per block that a causal kernel skips whole above the diagonal "
                    "(fitted on causal and non-causal timings); left out = the cost model's tile")


class OptimizerRate(Spec):
    """Measured time of one optimizer step over N fp32 parameters: ``overhead_us + N · ns_per_param``
    (fitted by :func:`learnedperf.cost.curves.fit_optimizer_rate`)."""

    ns_per_param: float = Field(gt=0, le=1e6)
    overhead_us: float = Field(ge=0, le=1e7)


class DeviceSpec(Spec):
    """One accelerator. Link fields are per device and per direction.

    ``kernel_curves`` (``{kernel: {dtype: KernelCurve}}``, kernels :data:`CURVE_KERNELS`) and
    ``optimizer_step`` (``{optimizer: OptimizerRate}``) are optional measured descriptions of a device
    whose kernels the peak figures alone misjudge (a CPU whose bf16 GEMMs only reach their peak at
    large sizes and whose fused attention does not use its matrix units); the cost model uses them
    in place of its fitted ramps when given.
    """

    name: str
    vendor: str = "unknown"
    peak_tflops: PeakTflops
    memory_bandwidth_GBps: float = Field(gt=0)
    memory_GiB: float = Field(gt=0)
    num_sms: int = Field(default=0, ge=0, description="SMs (NVIDIA) or compute units (AMD); 0 = unknown")
    compute_capability: Optional[str] = Field(
        default=None, pattern=r"^1?\d\.\d$",
        description="NVIDIA's CUDA compute capability, major.minor ('9.0' for Hopper); None for other vendors or "
                    "unknown")
    l2_cache_MiB: float = Field(default=0.0, ge=0)
    clock_MHz: float = Field(default=0.0, ge=0)
    intra_node_bandwidth_GBps: Optional[float] = Field(default=None, gt=0)
    inter_node_bandwidth_GBps: Optional[float] = Field(default=None, gt=0)
    intra_node_latency_us: Optional[float] = Field(default=None, ge=0)
    inter_node_latency_us: Optional[float] = Field(default=None, ge=0)
    tdp_W: Optional[float] = Field(default=None, gt=0)
    devices_per_node: Optional[int] = Field(default=None, ge=1,
                                            description="usual node (NVLink domain) size of the platform")
    kernel_curves: Optional[dict[str, dict[str, KernelCurve]]] = None
    optimizer_step: Optional[dict[str, OptimizerRate]] = None
    sources: dict[str, str] = Field(default_factory=dict)

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _capability_text(cls, value: Any) -> Any:
        # 9.0 and "9.0" name the same capability: a number is read as major.minor
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return f"{value:.1f}"
        return value

    @model_validator(mode="after")
    def _check_curves(self) -> "DeviceSpec":
        for kernel, per_dtype in (self.kernel_curves or {}).items():
            if kernel not in CURVE_KERNELS:
                raise FieldValueError(f"kernel_curves.{key_text(kernel)}",
                                      f"unknown kernel (known: {', '.join(CURVE_KERNELS)})")
            for dtype in per_dtype:
                if dtype not in PRECISIONS:
                    raise FieldValueError(f"kernel_curves.{kernel}.{key_text(dtype)}",
                                          f"unknown dtype (known: {', '.join(PRECISIONS)})")
        for opt in self.optimizer_step or {}:
            if opt not in CURVE_OPTIMIZERS:
                raise FieldValueError(f"optimizer_step.{key_text(opt)}",
                                      f"unknown optimizer (known: {', '.join(CURVE_OPTIMIZERS)})")
        return self

    @property
    def is_cpu(self) -> bool:
        """True for a CPU: the project names CPU descriptors ``cpu-<model>`` (``learnedperf measure``)."""
        return self.name.lower().startswith("cpu")

    def curve(self, kernel: str, dtype: str) -> Optional[KernelCurve]:
        """The measured curve of ``kernel`` in ``dtype``, or None."""
        curves = self.kernel_curves
        return curves.get(kernel, {}).get(dtype) if curves else None

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s of ``precision`` (raises SpecError if unsupported)."""
        value = self.peak_tflops.get(precision)
        if value is None:
            raise SpecError("strategy.precision", f"device {self.name} has no {precision} math")
        return value * 1e12


MAX_DEVICES = 1 << 20
"""Most devices a run may have (see :class:`HardwareSpec`)."""

_LINK_FIELDS = ("intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps", "intra_node_latency_us",
                "inter_node_latency_us")

#: Collectives whose bus bandwidth may be given relative to all-reduce's (``collective_busbw_ratio``).
BUSBW_RATIO_KINDS = ("allgather", "reducescatter", "alltoall", "p2p")


class HardwareSpec(Spec):
    """A set of identical devices in nodes, with resolved link parameters."""

    device: DeviceSpec
    # bounded so that absurd sizes are refused by name instead of predicted: the largest training
    # clusters built are ~1e5 accelerators; 2^20 leaves an order of magnitude of headroom
    num_devices: int = Field(ge=1, le=MAX_DEVICES)
    devices_per_node: int = Field(ge=1, le=MAX_DEVICES)
    cluster: Optional[str] = None
    intra_node_bandwidth_GBps: Optional[float] = Field(default=None, gt=0)
    inter_node_bandwidth_GBps: Optional[float] = Field(default=None, gt=0)
    intra_node_latency_us: Optional[float] = Field(default=None, ge=0)
    inter_node_latency_us: Optional[float] = Field(default=None, ge=0)
    # A run that names a device, not a cluster, and spans nodes without saying how fast their network
    # is takes the network of the device's reference system (DGX A100 for the A100 SXM4 80GB): the
    # setting its data sheet describes, and the one a published table means when it names the GPU alone
    # (measure.published reads rows so). It is an assumption, so the spec keeps where it came from and
    # every prediction of the run says so (assumptions()).
    links_from: Optional[str] = Field(
        default=None, description="catalog cluster whose inter-node bandwidth was taken because neither the run "
        "nor its device gave one (the device's reference system)")
    # The link fields describe all-reduce (NCCL's ring reaches the same bus bandwidth in all-gather,
    # reduce-scatter and all-reduce: nccl-tests doc/PERFORMANCE.md defines busbw so that it does).
    # Other libraries differ: gloo's reduce-scatter on this project's CPU moves data at a third of its
    # all-reduce bus bandwidth (datasets/measured/vm-xeon-2c). A measured ratio per collective says so.
    collective_busbw_ratio: Optional[dict[str, float]] = Field(
        default=None, description="bus bandwidth of a collective / bus bandwidth of all-reduce on the same "
        "links, measured (nccl-tests busbw ratio at large messages); kinds left out: 1")

    # NCCL runs its collectives on the GPU's own copy and SM resources beside the kernels; gloo on a
    # CPU runs them on the cores the computation uses, and this project's 2-core CPU hides 0-0.35 of
    # an all-reduce behind concurrent matmuls (measure.bench.bench_overlap). A measured share says so.
    comm_overlap: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="share of a collective's time that computation running at "
        "the same time hides, measured (bench_overlap: 1 = fully hidden, 0 = none); left out: 1")

    @model_validator(mode="after")
    def _check(self) -> "HardwareSpec":
        if self.num_devices > self.devices_per_node and self.num_devices % self.devices_per_node:
            raise FieldValueError("num_devices", f"num_devices={self.num_devices} is not a multiple of "
                             f"devices_per_node={self.devices_per_node}")
        for kind, ratio in (self.collective_busbw_ratio or {}).items():
            if kind not in BUSBW_RATIO_KINDS:
                raise FieldValueError(f"collective_busbw_ratio.{key_text(kind)}",
                                      f"unknown collective (known: {', '.join(BUSBW_RATIO_KINDS)})")
            # (0, 10]: a ratio of 0 would make the collective endless; 10x all-reduce's bus bandwidth is
            # beyond any link (all-reduce already runs at the link's rate)
            if not 0.0 < ratio <= 10.0:  # also refuses NaN
                raise FieldValueError(f"collective_busbw_ratio.{kind}", f"must be in (0, 10], got {ratio!r}")
        return self

    def busbw_ratio(self, kind: str) -> float:
        """Bus bandwidth of collective ``kind`` relative to all-reduce's (1 unless measured otherwise)."""
        ratios = self.collective_busbw_ratio
        return ratios.get(kind, 1.0) if ratios else 1.0

    @property
    def num_nodes(self) -> int:
        """Number of nodes (NVLink domains) the devices occupy."""
        return max(1, -(-self.num_devices // self.devices_per_node))

    @property
    def node_size(self) -> int:
        """Devices in one node actually used (a single partial node counts as one)."""
        return min(self.devices_per_node, self.num_devices)

    def uses_link_level(self, level: str) -> bool:
        """Whether the run's devices use the ``level`` (``"intra"`` or ``"inter"``) node links: more than one
        device in a node, more than one node."""
        if level not in ("intra", "inter"):
            raise ValueError(f"level: expected 'intra' or 'inter', got {level!r}")
        return self.node_size > 1 if level == "intra" else self.num_nodes > 1

    def used_link_bandwidth_GBps(self, level: str) -> Optional[float]:
        """Bandwidth of the ``level`` node links where the run uses that level (:meth:`uses_link_level`), else
        None, whatever the spec says of it: a run cannot depend on links it does not use."""
        return getattr(self, f"{level}_node_bandwidth_GBps") if self.uses_link_level(level) else None

    def assumptions(self) -> list[str]:
        """What was filled in for this hardware rather than given (one sentence each; empty when nothing was)."""
        if self.links_from is None:
            return []
        return [f"hardware.inter_node_bandwidth_GBps: {self.inter_node_bandwidth_GBps:g} GB/s per device assumed, the "
                f"network of catalog cluster {self.links_from}, as the run spans nodes and names neither a cluster nor "
                "this bandwidth; give either for another network"]

    def link(self, name: str) -> float:
        """A resolved link value; SpecError naming the field if the run needs it and nothing gave it."""
        value = getattr(self, name)
        if value is None:
            raise SpecError(f"hardware.{name}", f"not given and not known for device {self.device.name}; "
                            "set it in hardware or use a catalog cluster")
        return value


def resolve_hardware(value: Any, prefix: str = "hardware") -> HardwareSpec:
    """Resolve the run format's ``hardware`` object (device name / inline device / cluster name)."""
    from ..catalog import device_key, get_cluster, get_device, reference_cluster

    if isinstance(value, HardwareSpec):
        return value
    if not isinstance(value, dict):
        raise SpecError(prefix, f"expected a JSON object, got {type(value).__name__}")
    allowed = {"device", "cluster", "num_devices", "devices_per_node", "collective_busbw_ratio", "comm_overlap",
               "links_from", *_LINK_FIELDS}
    for key in value:
        if key not in allowed:
            raise SpecError(f"{prefix}.{key_text(key)}", "unknown field")
    cluster_name = value.get("cluster")
    base: dict[str, Any] = {}
    if cluster_name is not None:
        if not isinstance(cluster_name, str):
            raise SpecError(f"{prefix}.cluster", "expected a catalog cluster name")
        base = dict(get_cluster(cluster_name, field=f"{prefix}.cluster"))
    device_value = value.get("device", base.get("device"))
    if device_value is None:
        raise SpecError(f"{prefix}.device", "required field is missing (give device or cluster)")
    if isinstance(device_value, str):
        device = DeviceSpec.parse(get_device(device_value, field=f"{prefix}.device"), f"{prefix}.device")
    else:
        device = DeviceSpec.parse(device_value, f"{prefix}.device")
    if cluster_name is not None and value.get("device") is not None:
        # a cluster is built of one device: another one beside it would silently win over (or lose to) the
        # cluster's; the cluster's own device, by any of its catalog names or inline (as to_dict writes it), is
        # accepted
        own = base["device"]
        if (device_key(device.name) or device.name) != (device_key(own) or own):
            raise SpecError(f"{prefix}.device", f"device {device.name!r} conflicts with cluster {base['name']!r}, "
                                                f"which is built of {own!r}: give the cluster alone, or the device "
                                                "with its links instead of the cluster")
    if "num_devices" not in value:
        raise SpecError(f"{prefix}.num_devices", "required field is missing")
    resolved: dict[str, Any] = {
        "device": device,
        "num_devices": value["num_devices"],
        "cluster": base.get("name"),
    }
    # A bare inline device without a node size is one per node: that never invents an NVLink domain.
    resolved["devices_per_node"] = value.get("devices_per_node",
                                             base.get("devices_per_node", device.devices_per_node or 1))
    for f in _LINK_FIELDS:
        # precedence: the run's own value, then the cluster's, then the device's catalog entry
        resolved[f] = value.get(f, base.get(f, getattr(device, f)))
    # a network the run needs and nothing gave: the device's reference system's (see HardwareSpec.links_from)
    links_from = value.get("links_from")
    if links_from is not None and not isinstance(links_from, str):
        raise SpecError(f"{prefix}.links_from", "expected a catalog cluster name")
    n, per_node = resolved["num_devices"], resolved["devices_per_node"]
    spans_nodes = isinstance(n, int) and isinstance(per_node, int) and per_node >= 1 and n > per_node
    if links_from is None and cluster_name is None and spans_nodes and resolved["inter_node_bandwidth_GBps"] is None:
        links_from = reference_cluster(device.name)
    if links_from is not None:
        ref = get_cluster(links_from, field=f"{prefix}.links_from").get("inter_node_bandwidth_GBps")
        if resolved["inter_node_bandwidth_GBps"] is None and spans_nodes:
            resolved["inter_node_bandwidth_GBps"] = ref
        # kept only where the value is the cluster's (a spec written by to_dict reads back the same)
        resolved["links_from"] = links_from if resolved["inter_node_bandwidth_GBps"] == ref else None
    resolved["collective_busbw_ratio"] = value.get("collective_busbw_ratio", base.get("collective_busbw_ratio"))
    resolved["comm_overlap"] = value.get("comm_overlap", base.get("comm_overlap"))
    data = {k: v for k, v in resolved.items() if v is not None}
    data["device"] = device
    try:
        return HardwareSpec.model_validate(data)
    except Exception as exc:  # pydantic ValidationError → one SpecError
        from pydantic import ValidationError

        from ._base import spec_error_from

        if isinstance(exc, ValidationError):
            raise spec_error_from(exc, prefix) from None
        raise

