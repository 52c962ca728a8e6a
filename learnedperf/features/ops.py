"""Operator features: one named, ordered, versioned schema for training and inference.

:data:`OP_FEATURE_SCHEMA` lists, in column order, every feature of one operator
on one device. :func:`op_features` builds the matrix from measured operator
records (the ``OP_COLUMNS`` frames of :mod:`learnedperf.measure.records`);
:func:`op_features_from_ops` builds the same matrix from graph
:class:`~learnedperf.graph.ops.Op` objects and a device descriptor, so that a
model trained on measurements answers for the ops of any execution graph.

The device enters only through its data-sheet descriptors (peak FLOP/s of the
op's dtype, memory bandwidth, SMs, L2, clock), never through its name, so that
a model can answer for devices it never saw. The last feature is the roofline
lower bound ``log(max(flops/peak, bytes/bandwidth))`` in seconds: regressors
learn the log ratio of measured time to this bound (see
:mod:`learnedperf.models.gbdt`), which transfers across devices far better
than raw time.

All logarithms are natural. Importing this module loads neither numpy's
heavy friends nor pandas: they are imported inside the functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import InputError
from ..graph.ops import COMPUTE_KINDS, Op

#: Kinds with a one-hot column (compute kinds; collectives are costed by the collective model).
KINDS = COMPUTE_KINDS
#: Directions with a one-hot column. Graph phases map onto them: "recompute" is a forward.
DIRECTIONS = ("fwd", "bwd", "fwd+bwd", "opt")
#: Element types with a one-hot column (also the per-dtype peaks looked up in the device).
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: Shape dimensions kept (attention has five: batch, heads, s_q, s_kv, head_dim); longer shapes are cut.
MAX_SHAPE_DIMS = 5
#: Floor of the roofline bound in seconds (1 ns), so that an op with no FLOPs and no bytes has a finite log.
MIN_BOUND_S = 1e-9


@dataclass(frozen=True)
class FeatureSchema:
    """A named, ordered, versioned list of features.

    Attributes:
        name: what the rows are (``"op"``).
        version: bumped on any change of names, order or meaning; checkpoints store it and
            refuse to load under another version.
        features: ``(name, description)`` pairs in column order.
    """

    name: str
    version: int
    features: tuple[tuple[str, str], ...]

    @property
    def names(self) -> list[str]:
        """Feature names in column order."""
        return [n for n, _ in self.features]

    def index(self, name: str) -> int:
        """Column index of feature ``name``."""
        return self.names.index(name)

    def to_dict(self) -> dict:
        """JSON-compatible form (stored next to every trained model)."""
        return {"name": self.name, "version": self.version, "names": self.names,
                "descriptions": {n: d for n, d in self.features}}

    def to_sidecar(self) -> dict:
        """What a model's sidecar records of the schema it was trained on."""
        return {"name": self.name, "version": self.version, "names": self.names}

    def check_sidecar(self, data: Any, where: Any) -> None:
        """Raise :class:`InputError` naming ``where`` unless ``data`` (a sidecar's ``feature_schema``)
        is this schema's version with these names in this order."""
        if not isinstance(data, dict):
            raise InputError(f"{where}: missing 'feature_schema'")
        if data.get("version") != self.version:
            raise InputError(f"{where}: feature schema version {data.get('version')} is incompatible with "
                             f"this package's {self.name} schema v{self.version}; retrain with 'learnedperf train'")
        if data.get("names") != self.names:
            raise InputError(f"{where}: feature names differ from this package's {self.name} schema v{self.version}")


def _schema_features() -> tuple[tuple[str, str], ...]:
    f: list[tuple[str, str]] = []
    f += [(f"kind={k}", f"1 if the op kind is {k!r}") for k in KINDS]
    f += [(f"direction={d}", f"1 if the direction is {d!r} (graph phase 'recompute' counts as 'fwd')")
          for d in DIRECTIONS]
    f += [(f"dtype={d}", f"1 if the element type is {d!r}") for d in DTYPES]
    f += [("causal", "1 for attention with a causal mask")]
    f += [("log_flops", "log(1 + FLOPs of the op)"),
          ("log_bytes", "log(1 + bytes read plus written)"),
          ("log_intensity", "log((1 + FLOPs) / (1 + bytes)): arithmetic intensity")]
    f += [(f"log_dim{i}", f"log(1 + shape[{i}]) in the kind's Op.shape convention, 0 if absent")
          for i in range(MAX_SHAPE_DIMS)]
    f += [("num_dims", "number of shape dimensions")]
    f += [("log_peak_flops", "log peak FLOP/s of the op's dtype on the device (fp32 peak if the dtype has none)"),
          ("log_mem_bw_Bps", "log memory bandwidth in bytes/s"),
          ("log_ridge", "log(peak FLOP/s / bandwidth): the roofline ridge point in FLOP/byte"),
          ("num_sms", "SMs / compute units (0 = unknown, e.g. CPUs)"),
          ("l2_cache_MiB", "last-level on-chip cache in MiB (NaN = not on the device's data sheet)"),
          ("clock_MHz", "boost clock in MHz"),
          ("log_bytes_per_l2", "log((1 + bytes) / (1 + L2 bytes)): does the working set fit in cache "
                               "(NaN when the cache size is unknown)")]
    f += [("log_compute_s", "log(max(FLOPs / peak, 1 ns)): compute-bound time in seconds"),
          ("log_memory_s", "log(max(bytes / bandwidth, 1 ns)): memory-bound time in seconds"),
          ("log_roofline_s", "log(max(FLOPs / peak, bytes / bandwidth, 1 ns)): the roofline lower bound in s")]
    return tuple(f)


#: The operator feature schema. Version 2: a device whose descriptor gives no L2 size (DeviceSpec's
#: ``l2_cache_MiB`` 0, as the catalog's L4 or T4) has NaN in ``l2_cache_MiB`` and
#: ``log_bytes_per_l2``; version 1 read it as a cache of no bytes, which no training device has.
OP_FEATURE_SCHEMA = FeatureSchema(name="op", version=2, features=_schema_features())

#: Column of the roofline bound, the baseline the regressors learn a residual against.
ROOFLINE_COLUMN = "log_roofline_s"


# ------------------------------------------------------------------ devices
def device_descriptor(device: Any) -> dict:
    """A device descriptor as a plain dict (accepts a dict, a JSON string or a DeviceSpec)."""
    if isinstance(device, str):
        try:
            device = json.loads(device)
        except json.JSONDecodeError as exc:
            raise InputError(f"device: not JSON ({exc.msg})") from None
    elif hasattr(device, "to_dict"):
        device = device.to_dict()
    elif hasattr(device, "model_dump"):
        device = device.model_dump()
    if not isinstance(device, Mapping):
        raise InputError(f"device: expected a device descriptor object, got {type(device).__name__}")
    return dict(device)


def _device_row(device: Any) -> list[float]:
    """[peak FLOP/s per DTYPES..., bandwidth B/s, num_sms, l2 MiB, clock MHz] of one descriptor.

    An L2 size that is absent, null or 0 is unknown (NaN): every device has an on-chip cache, and
    DeviceSpec stores a size missing from the data sheet as 0.
    """
    d = device_descriptor(device)
    peaks = d.get("peak_tflops") or {}
    if not isinstance(peaks, Mapping) or not peaks.get("fp32"):
        raise InputError(f"device {d.get('name', '?')}: peak_tflops.fp32 is required")
    fp32 = float(peaks["fp32"])
    bw = d.get("memory_bandwidth_GBps")
    if not bw or float(bw) <= 0:
        raise InputError(f"device {d.get('name', '?')}: memory_bandwidth_GBps is required")
    # a dtype without its own math runs at the fp32 peak (upcast), as the roofline cost assumes
    row = [float(peaks.get(t) or fp32) * 1e12 for t in DTYPES]
    row += [float(bw) * 1e9, float(d.get("num_sms") or 0), float(d.get("l2_cache_MiB") or "nan"),
            float(d.get("clock_MHz") or 0)]
    return row


# ------------------------------------------------------------------ assembly
def _assemble(kind, direction, dtype, causal, flops, nbytes, dims, ndims, dev):
    """The feature matrix from per-row arrays; ``dev`` is (n, len(DTYPES) + 4) from :func:`_device_row`."""
    import numpy as np

    n = len(flops)
    out = np.zeros((n, len(OP_FEATURE_SCHEMA.features)), dtype=np.float64)
    col = 0
    for values, vocab in ((kind, KINDS), (direction, DIRECTIONS), (dtype, DTYPES)):
        for v in vocab:
            out[:, col] = values == v
            col += 1
    out[:, col] = causal
    col += 1
    flops = np.maximum(np.asarray(flops, dtype=np.float64), 0.0)
    nbytes = np.maximum(np.asarray(nbytes, dtype=np.float64), 0.0)
    out[:, col] = np.log1p(flops)
    out[:, col + 1] = np.log1p(nbytes)
    out[:, col + 2] = np.log1p(flops) - np.log1p(nbytes)
    col += 3
    out[:, col:col + MAX_SHAPE_DIMS] = np.log1p(np.maximum(dims, 0.0))
    col += MAX_SHAPE_DIMS
    out[:, col] = ndims
    col += 1
    dtype_idx = np.zeros(n, dtype=np.int64)  # unknown dtypes fall back to fp32 (index 0)
    for i, t in enumerate(DTYPES):
        dtype_idx[dtype == t] = i
    peak = dev[np.arange(n), dtype_idx]
    bw = dev[:, len(DTYPES)]
    sms, l2, clock = (dev[:, len(DTYPES) + j] for j in (1, 2, 3))
    out[:, col] = np.log(peak)
    out[:, col + 1] = np.log(bw)
    out[:, col + 2] = np.log(peak) - np.log(bw)
    out[:, col + 3] = sms
    out[:, col + 4] = l2
    out[:, col + 5] = clock
    out[:, col + 6] = np.log1p(nbytes) - np.log1p(l2 * 2.0 ** 20)  # NaN where the L2 size is unknown
    col += 7
    t_c = np.maximum(flops / peak, MIN_BOUND_S)
    t_m = np.maximum(nbytes / bw, MIN_BOUND_S)
    out[:, col] = np.log(t_c)
    out[:, col + 1] = np.log(t_m)
    out[:, col + 2] = np.log(np.maximum(t_c, t_m))
    col += 3
    assert col == out.shape[1]
    return out.astype(np.float32)


def _parse_shape(text) -> list[float]:
    if isinstance(text, (list, tuple)):
        dims = text
    else:
        try:
            dims = json.loads(text) if text else []
        except (TypeError, json.JSONDecodeError):
            raise InputError(f"op record shape: not a JSON list: {text!r}") from None
    if not isinstance(dims, list | tuple):
        raise InputError(f"op record shape: not a JSON list: {text!r}")
    return [float(x) for x in dims]


def _shape_matrix(shapes: list[list[float]]):
    import numpy as np

    dims = np.zeros((len(shapes), MAX_SHAPE_DIMS), dtype=np.float64)
    ndims = np.zeros(len(shapes), dtype=np.float64)
    for i, s in enumerate(shapes):
        s = s[:MAX_SHAPE_DIMS]
        dims[i, :len(s)] = s
        ndims[i] = len(s)
    return dims, ndims


_REQUIRED = ("kind", "direction", "shape", "params", "dtype", "flops", "bytes", "device")


def op_features(records) -> "Any":
    """Feature matrix (``float32``, columns of :data:`OP_FEATURE_SCHEMA`) of operator records.

    Args:
        records: a pandas DataFrame with the ``OP_COLUMNS`` of :mod:`learnedperf.measure.records`
            (at least kind, direction, shape, params, dtype, flops, bytes, device).

    Vectorised: JSON columns (shape, params, device) are parsed once per distinct value, so a
    frame of 270k rows takes well under a second per column.

    Raises:
        InputError: a column is missing, or a shape or device is not valid JSON.
    """
    import numpy as np
    import pandas as pd

    df = records
    missing = [c for c in _REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"op records: missing column(s) {missing}")
    codes, uniq = pd.factorize(df["shape"].astype(str), use_na_sentinel=False)
    dims_u, ndims_u = _shape_matrix([_parse_shape(s) for s in uniq])
    dims, ndims = dims_u[codes], ndims_u[codes]
    pcodes, puniq = pd.factorize(df["params"].fillna("{}").astype(str), use_na_sentinel=False)
    causal_u = np.array([_causal(p) for p in puniq], dtype=np.float64)
    dcodes, duniq = pd.factorize(df["device"].astype(str), use_na_sentinel=False)
    dev = np.array([_device_row(d) for d in duniq], dtype=np.float64)[dcodes]
    return _assemble(df["kind"].astype(str).to_numpy(), df["direction"].astype(str).to_numpy(),
                     df["dtype"].astype(str).to_numpy(), causal_u[pcodes],
                     df["flops"].to_numpy(dtype=np.float64), df["bytes"].to_numpy(dtype=np.float64),
                     dims, ndims, dev)


def _causal(params: str) -> float:
    try:
        p = json.loads(params)
    except (TypeError, json.JSONDecodeError):
        return 0.0
    return float(bool(isinstance(p, dict) and p.get("causal")))


def _phase_direction(phase: str) -> str:
    # recomputation re-runs the forward kernels; everything else maps one to one
    return "fwd" if phase == "recompute" else phase


def op_features_from_ops(ops: Iterable[Op], device: Any) -> "Any":
    """Feature matrix of graph ops on one device (the inference path of :func:`op_features`).

    Args:
        ops: :class:`~learnedperf.graph.ops.Op` objects (compute ops; collectives get rows too but
            their features mean little).
        device: the device descriptor: a dict in the run format, its JSON text or a ``DeviceSpec``.
    """
    import numpy as np

    ops = list(ops)
    row = _device_row(device)
    dev = np.tile(np.asarray(row, dtype=np.float64), (len(ops), 1))
    dims, ndims = _shape_matrix([[float(x) for x in op.shape] for op in ops])
    return _assemble(np.array([op.kind for op in ops], dtype=object),
                     np.array([_phase_direction(op.phase) for op in ops], dtype=object),
                     np.array([op.dtype for op in ops], dtype=object),
                     np.array([float(op.causal) for op in ops], dtype=np.float64),
                     np.array([op.flops for op in ops], dtype=np.float64),
                     np.array([op.bytes for op in ops], dtype=np.float64), dims, ndims, dev)
