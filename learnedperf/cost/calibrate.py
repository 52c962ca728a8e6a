"""Fit the cost model's constants from public measurements.

* Memory-bound kernels (NeuSight element-wise, layer-norm and softmax ops on
  five GPUs, fp32, kernels over 100 µs): ``t = bytes / (bandwidth · η_mem)``
  with each device's data-sheet bandwidth → ``memory_efficiency``.
  This and the next fit read only the transformer-shaped part of NeuSight's grid (:data:`MODEL_SHAPED_SPLIT`):
  the same ops on random dimensions run slower, and the simulator costs transformer models.
* fp32 GEMMs (NeuSight ``linear`` and ``bmm`` on the same GPUs): the roofline
  GEMM model with wave quantisation → ``gemm_efficiency_fp32``, ``gemm_k_half`` and
  ``gemm_unaligned_share`` (the share a GEMM with a dimension not a multiple of 16 bytes keeps) on the
  three 250 W cards (A100, V100, P100 PCIe), then → ``slot_power_compute_share`` on the two powered by
  their slot alone (T4, P4: ``cost.params.slot_powered``), with the other three constants held.
* NVLink collectives (vTrain's NCCL all-reduce tables on 2-8 A100s):
  ``t = 2(n-1)·α + 2(n-1)/n·S / (η·B_NVLink)`` → ``alpha_intra_us``,
  ``link_efficiency_intra``. A call's fixed time beside them (``collective_base_us``) fits the tables
  better but not whole steps; it ships at 0 (:func:`fit_nvlink_allreduce_base`,
  ``experiments/allreduce_base.py``).

* Fused attention (the project's own GPU operator records, ``datasets/measured/*/ops_cuda.parquet``:
  torch SDPA kernels in bf16/fp16 over a GFLOP): the roofline attention model, a head of ``d`` reaching
  ``d / (d + attention_d_half)`` of the forward efficiency and the backward a share of it →
  ``attention_efficiency``, ``attention_bwd_share``, ``attention_d_half``.
* The host's rate for a bare tensor operation (same records: tiny forward element-wise kernels timed back
  to back) → ``eager_dispatch_us``, measured, not fitted.

Two kernel models fit their kernels better but whole steps worse, and ship switched off (``params.json`` leaves
them out; ``experiments/kernel_models_in_steps.py`` prints both fits and their steps): the tensor-core GEMMs' own
inner-dimension ramp (:func:`fit_gemm_tensor` → ``gemm_k_half_tensor``) and the row reductions' share of the
element-wise bandwidth (:func:`fit_reduction_share` → ``reduction_memory_share``).

The per-kernel overhead inside a training step (``kernel_launch_us``) is fit on
whole steps by ``experiments/calibrate_steps.py``.

:func:`fit_device_params` fits the same constants for one *measured* device (the
project's own operator records, ``datasets/measured/<host>/ops*.parquet``),
relative to the peaks and bandwidth its micro-benchmarks measured. Fits minimise the mean absolute log error (robust to the many small kernels).
Run ``python -m learnedperf.cost.calibrate [--data DIR]``; it prints the fits
and stores them with their provenance in ``cost/data/params.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from ..errors import InputError
from .params import gemm_aligned

_BINARY = {"add", "mul", "div", "pow"}
_UNARY = {"addu", "mulu", "divu", "powu", "gelu", "relu", "tanh", "ln", "softmax"}


#: NeuSight's operator grid has two parts (its ``split`` column): ``train_dims``, dimensions drawn at random
#: (nine tenths of the linear/bmm kernels), and ``test_dims``, the dimensions of transformer models (hidden sizes,
#: FFN widths, head sizes, vocabularies, token counts). The same op runs slower on random dimensions: fp32
#: linear kernels of over 10 GFLOP at a median 0.25 of the P4's peak against 0.80, 0.83 against 0.95 on the
#: V100; memory-bound kernels at 0.62-0.80 of the data-sheet bandwidth against 0.73-0.90. cuBLAS picks other
#: kernels for them (on the P4 ``maxwell_sgemm_64x64_tn`` against ``sgemm_128x128x8_NT_vec``), whether or not
#: their dimensions are multiples of 16 bytes. The simulator costs the operators of transformer models, and
#: the GEMMs of NeuSight's traced models reach the transformer grid's rates (the V100's 0.95-0.98 of its
#: peak), so the efficiencies are fit on that part (``experiments/gemm_fp32_power.py`` prints both).
MODEL_SHAPED_SPLIT = "test_dims"


def model_shaped(ops):
    """The rows of NeuSight's operator frame (``neusight_ops.parquet``) timed on transformer-model dimensions
    (:data:`MODEL_SHAPED_SPLIT`), the part the cost model's efficiencies are fit on."""
    if "split" not in ops.columns:
        raise InputError("NeuSight operator frame without a 'split' column: cannot tell transformer-shaped "
                         "kernels from the random grid")
    return ops[ops["split"] == MODEL_SHAPED_SPLIT]


def _devices() -> dict[str, dict]:
    from ..catalog import get_device

    names = {"NVIDIA A100-PCIE-40GB": "A100-PCIE-40GB", "Tesla P100-PCIE-16GB": "P100-PCIE-16GB",
             "Tesla P4": "P4", "Tesla T4": "T4", "Tesla V100-PCIE-32GB": "V100-PCIE-32GB"}
    return {k: get_device(v) for k, v in names.items()}


def _grid_fit(loss, grids: dict[str, np.ndarray]) -> dict[str, float]:
    keys = list(grids)
    best, best_val = None, math.inf
    for combo in np.array(np.meshgrid(*grids.values(), indexing="ij")).reshape(len(keys), -1).T:
        val = loss(dict(zip(keys, combo)))
        if val < best_val:
            best, best_val = combo, val
    return {k: float(v) for k, v in zip(keys, best)} | {"_mean_abs_log_error": float(best_val)}


def _memory_bound_kernels(ops, names) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NeuSight's memory-bound kernels named in ``names`` over 100 µs: ``(bytes moved, the device's data-sheet
    bandwidth in bytes/s, log measured seconds)``, one fp32 read of each input and one write per element."""
    devs = _devices()
    # isolated-kernel timings carry a ~20-30 µs measurement floor (launch + event sync) that kernels queued
    # back to back in a training step do not pay: fit the bandwidth term on kernels above 100 µs only
    d = ops[ops.op.isin(names) & ops.device.isin(list(devs)) & (ops.latency_ms > 0.1)]
    numel = d.B.to_numpy(float) * d.H.to_numpy(float)
    tensors = np.where(d.op.isin(_BINARY), 3.0, 2.0)
    bw = d.device.map(lambda n: devs[n]["memory_bandwidth_GBps"] * 1e9).to_numpy(float)
    return numel * tensors * 4.0, bw, np.log(d.latency_ms.to_numpy(float) * 1e-3)


def fit_memory_bound(ops, names: frozenset[str] | set[str] | None = None) -> dict[str, float]:
    """Fit ``memory_efficiency`` and ``kernel_launch_us`` on NeuSight's memory-bound ops (those named in
    ``names``, default every element-wise, ``ln`` and ``softmax`` op: the shipped fit)."""
    nbytes, bw, y = _memory_bound_kernels(ops, (_BINARY | _UNARY) if names is None else names)

    def loss(p):
        t = p["launch_us"] * 1e-6 + nbytes / (bw * p["eff"])
        return float(np.mean(np.abs(np.log(t) - y)))

    return _grid_fit(loss, {"eff": np.linspace(0.3, 1.0, 71), "launch_us": np.array([0.0])})


#: NeuSight's row-reduction ops (PyTorch's layer norm and softmax kernels): ``reduction_memory_share``
_REDUCTIONS = frozenset({"ln", "softmax"})
#: NeuSight's element-wise ops: ``memory_efficiency``
_ELEMENTWISE = frozenset((_BINARY | _UNARY) - _REDUCTIONS)


def fit_reduction_share(ops, memory_eff: float) -> dict[str, float]:
    """Fit ``reduction_memory_share`` on NeuSight's layer-norm and softmax kernels over 100 µs, their bandwidth
    ``memory_eff`` (the element-wise kernels' efficiency) times the share: ``{"share", "_mean_abs_log_error"}``."""
    nbytes, bw, y = _memory_bound_kernels(ops, _REDUCTIONS)
    if not len(y):
        raise InputError("fit_reduction_share: no layer-norm or softmax kernels over 100 µs")

    def loss(p):
        return float(np.mean(np.abs(np.log(nbytes / (bw * memory_eff * p["share"])) - y)))

    return _grid_fit(loss, {"share": np.round(np.linspace(0.3, 1.2, 91), 3)})


def gemm_fp32_error(ops, memory_eff: float, tile: int = 128):
    """The roofline GEMM model (wave quantisation over the SMs, a k½ ramp, the memory bound) on NeuSight's fp32
    linear/bmm ops of ``ops`` that take over 0.1 ms.

    Returns:
        ``(log_error, kernels)``: ``log_error(eff, k_half, launch_us, unaligned)`` is the mean
        |log(model / measured)| of those kernels (the loss :func:`fit_gemm_fp32` minimises), a kernel with a
        dimension that is not a multiple of 16 bytes (:func:`~learnedperf.cost.params.gemm_aligned`) reaching
        ``unaligned`` of the efficiency, and ``kernels`` their number.
    """
    devs = _devices()
    d = ops[ops.op.isin(["linear", "bmm"]) & ops.device.isin(list(devs)) & (ops.latency_ms > 0.1)]
    # NeuSight's linear/bmm multiply [B,M,N] x [B,N,K] -> [B,M,K]: N is the reduction dimension
    # (the only layout consistent with the kernels' grid sizes in the data; see measure.public)
    B, M, K, N = (d[c].to_numpy(float) for c in ("B", "M", "N", "K"))
    flops = 2 * B * M * N * K
    nbytes = 4 * B * (M * K + K * N + M * N)
    peak = d.device.map(lambda n: devs[n]["peak_tflops"]["fp32"] * 1e12).to_numpy(float)
    sms = d.device.map(lambda n: devs[n].get("num_sms", 0)).to_numpy(float)
    bw = d.device.map(lambda n: devs[n]["memory_bandwidth_GBps"] * 1e9).to_numpy(float) * memory_eff
    tiles = B * np.ceil(M / tile) * np.ceil(N / tile)
    waves = np.ceil(tiles / sms)
    wave_eff = tiles / (waves * sms)
    y = np.log(d.latency_ms.to_numpy(float) * 1e-3)
    aligned = np.array([gemm_aligned((b, m, k, n), 4) for b, m, k, n in zip(B, M, K, N)])

    def log_error(eff: float, k_half: float, launch_us: float = 0.0, unaligned: float = 1.0) -> float:
        eff = eff * np.where(aligned, 1.0, unaligned) * wave_eff * K / (K + k_half)
        t = launch_us * 1e-6 + np.maximum(flops / (peak * eff), nbytes / bw)
        return float(np.mean(np.abs(np.log(t) - y)))

    return log_error, len(d)


def gemm_fp32_alignment_shares(records, min_flops: float = 1e10,
                               split: str | None = None) -> dict[str, tuple[float, int, float, int]]:
    """The premise of ``gemm_unaligned_share``, measured: for each device of the operator ``records``
    (:func:`learnedperf.measure.public.load_neusight_ops`' frame: NeuSight's linear/bmm kernels), the median share
    of its descriptor's fp32 peak that its GEMMs of over ``min_flops`` reach with every dimension a multiple of
    16 bytes and without, and how many of each: ``{device_name: (aligned median, aligned kernels, unaligned
    median, unaligned kernels)}``. ``split``: only the kernels of that part of NeuSight's grid
    (``"train_dims"``, ``"test_dims"``: :data:`MODEL_SHAPED_SPLIT`); None: both (most of the unaligned kernels
    are then random-grid ones and most aligned ones transformer-shaped, so the two parts' difference shows as
    one of alignment)."""
    sel = (records["kind"] == "matmul") & (records["flops"] > min_flops)
    if split is not None:
        sel &= records["params"].map(lambda p: json.loads(p).get("split") == split)
    out = {}
    for name, rows in records[sel].groupby("device_name"):
        peak = json.loads(rows["device"].iloc[0])["peak_tflops"]["fp32"] * 1e12
        share = (rows["flops"] / (rows["time_ms"] * 1e-3) / peak).to_numpy()
        aligned = np.array([gemm_aligned(json.loads(s), 4) for s in rows["shape"]], dtype=bool)
        out[name] = (float(np.median(share[aligned])), int(aligned.sum()),
                     float(np.median(share[~aligned])), int((~aligned).sum()))
    return out


def fit_gemm_fp32(ops, memory_eff: float, launch_us: float, tile: int = 128,
                  share_of: dict[str, float] | None = None) -> dict[str, float]:
    """Fit ``gemm_efficiency_fp32``, ``gemm_k_half`` and ``gemm_unaligned_share`` (``unaligned``) on NeuSight's
    fp32 linear/bmm ops (those of the devices ``ops`` holds; :func:`gemm_fp32_error`'s loss).

    ``share_of``: ``{"eff": e, "k_half": k, "unaligned": u}`` fixes those three and fits the share ``share`` of
    the efficiency a device reaches instead (``slot_power_compute_share``: pass the slot-powered devices'
    ops)."""
    log_error, _n = gemm_fp32_error(ops, memory_eff, tile)

    def loss(p):
        return log_error(p["eff"] * p["share"], p["k_half"], launch_us, p["unaligned"])

    if share_of is not None:
        return _grid_fit(loss, {"eff": np.array([share_of["eff"]]), "k_half": np.array([share_of["k_half"]]),
                                "unaligned": np.array([share_of["unaligned"]]),
                                "share": np.round(np.linspace(0.2, 1.0, 81), 3)})
    return _grid_fit(loss, {"eff": np.round(np.linspace(0.4, 1.0, 61), 3),
                            "k_half": np.array([0, 8, 16, 32, 48, 64, 96, 128, 192, 256]),
                            "unaligned": np.round(np.linspace(0.5, 1.0, 51), 3), "share": np.array([1.0])})


def allreduce_tables(data_dir: Path):
    """vTrain's A100 NCCL all-reduce tables, 2-8 GPUs, every row: ``(bytes, seconds, GPUs, link)``, three
    arrays and NVLink3's data-sheet bandwidth per direction (bytes/s), as the fits below read them."""
    from ..catalog import get_device

    link = get_device("A100-SXM4-80GB")["intra_node_bandwidth_GBps"] * 1e9
    xs, ys, ns = [], [], []
    for n in range(2, 9):
        path = data_dir / "vtrain" / "trace" / "a100" / f"AR_GPU{n}_1M_1024M_LUT"
        rows = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(0, 3))
        xs.append(rows[:, 0])
        ys.append(rows[:, 1] * 1e-9)
        ns.append(np.full(len(rows), n))
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ns), link


def ring_allreduce_s(S, n, link_Bps: float, eff: float, alpha_us: float, base_us: float = 0.0):
    """Seconds of ring all-reduces of ``S`` bytes over ``n`` GPUs of one node (arrays alike):
    ``base + 2(n-1)·α + 2(n-1)/n·S / (η·B)``, the single-node ring of
    :func:`learnedperf.cost.collective.collective_cost`, vectorised for the fits below."""
    return (base_us + 2 * (n - 1) * alpha_us) * 1e-6 + 2 * (n - 1) / n * S / (link_Bps * eff)


def fit_nvlink_allreduce(data_dir: Path) -> dict[str, float]:
    """Fit ``alpha_intra_us`` and ``link_efficiency_intra`` on vTrain's A100 NCCL all-reduce tables."""
    S, t, n, link = allreduce_tables(data_dir)
    y = np.log(t)

    def loss(p):
        return float(np.mean(np.abs(np.log(ring_allreduce_s(S, n, link, p["eff"], p["alpha_us"])) - y)))

    return _grid_fit(loss, {"eff": np.linspace(0.4, 1.0, 61), "alpha_us": np.linspace(0.5, 15.0, 59)})


def fit_nvlink_allreduce_base(data_dir: Path, base_grid_us=None) -> dict[str, float]:
    """Fit a collective call's fixed time beside the per-step latency and the link efficiency on the same
    tables: ``t = base + 2(n-1)·α + 2(n-1)/n·S / (η·B_NVLink)`` → ``base_us`` (``collective_base_us``),
    ``alpha_us``, ``eff``. Not shipped: ``experiments/allreduce_base.py`` compares it with
    :func:`fit_nvlink_allreduce` on the tables and on whole steps.

    The loss is the mean absolute log error with each row weighted by ``1/S``: the tables step the size
    by 1 MB, so an unweighted mean is three quarters messages over 256 MB, and a training step's
    collectives (a tensor-parallel layer's activations, a data-parallel bucket: 4-100 MB) would count
    for little. Returns the fit, its weighted (``_mean_abs_log_error``) and unweighted
    (``_row_mean_abs_log_error``) errors. ``base_grid_us``: the fixed times tried (default 0-60 µs by 1;
    ``[0]`` fits the shipped two-term form under this loss).
    """
    S, t, n, link = allreduce_tables(data_dir)
    y = np.log(t)
    w = (1.0 / S) / np.sum(1.0 / S)
    effs = np.round(np.linspace(0.5, 1.0, 51), 3)
    # ring_allreduce_s over every efficiency at once: the volume term as a (efficiency, row) matrix
    volume_s = (2 * (n - 1) / n * S / link)[None, :] / effs[:, None]
    best = (math.inf, 0.0, 0.0, 0.0)
    for base_us in np.linspace(0.0, 60.0, 61) if base_grid_us is None else base_grid_us:
        for alpha_us in np.linspace(0.0, 15.0, 61):
            lat = (base_us + 2 * (n - 1) * alpha_us) * 1e-6
            losses = np.abs(np.log(lat[None, :] + volume_s) - y[None, :]) @ w
            i = int(np.argmin(losses))
            if losses[i] < best[0]:
                best = (float(losses[i]), float(effs[i]), float(alpha_us), float(base_us))
    fit = {"eff": best[1], "alpha_us": best[2], "base_us": best[3], "_mean_abs_log_error": best[0]}
    pred = ring_allreduce_s(S, n, link, fit["eff"], fit["alpha_us"], fit["base_us"])
    fit["_row_mean_abs_log_error"] = float(np.mean(np.abs(np.log(pred) - y)))
    return fit


_DIRECTION_PHASE = {"fwd": "fwd", "bwd": "bwd", "fwd+bwd": "bwd", "opt": "opt"}


def _record_ops(rows) -> tuple[list, np.ndarray]:
    """Operator records (a DataFrame of ``OP_COLUMNS`` rows) as graph ops, and log(measured seconds)."""
    import json

    from ..graph.ops import Op

    ops = []
    for r in rows.itertuples(index=False):
        params = json.loads(r.params) if isinstance(r.params, str) else (r.params or {})
        shape = json.loads(r.shape) if isinstance(r.shape, str) else r.shape
        ops.append(Op(r.op, r.kind, _DIRECTION_PHASE.get(r.direction, "fwd"), float(r.flops), float(r.bytes),
                      r.dtype, tuple(int(x) for x in shape), causal=bool(params.get("causal", False))))
    return ops, np.log(rows["time_ms"].to_numpy(float) * 1e-3)


def _device_groups(rows) -> tuple[list, np.ndarray]:
    """Operator records grouped by the device descriptor each was recorded with: ``([(hardware, ops)], log
    measured seconds)`` in group order. Measured curves are dropped from the descriptors: they would replace the
    model being fitted."""
    import json

    from ..specs import HardwareSpec

    groups, ys = [], []
    for device, dev_rows in rows.groupby("device", sort=True):
        desc = {k: v for k, v in json.loads(device).items() if k not in ("kernel_curves", "optimizer_step")}
        hw = HardwareSpec.parse({"device": desc, "num_devices": 1, "devices_per_node": 1})
        ops, y = _record_ops(dev_rows)
        groups.append((hw, ops))
        ys.append(y)
    return groups, (np.concatenate(ys) if ys else np.zeros(0))


def _groups_time_s(groups, params) -> np.ndarray:
    """The roofline's seconds of every op of :func:`_device_groups`' groups with ``params``, in order."""
    from .roofline import RooflineCost

    out = []
    for hw, ops in groups:
        cost = RooflineCost(hw, params)
        out.append(np.fromiter((cost.compute_time_s(op) for op in ops), float, len(ops)))
    return np.concatenate(out) if out else np.zeros(0)


#: Fused-attention kernels the attention fit reads: tensor-core dtypes, over a GFLOP (smaller ones are the
#: host's launch more than the kernel's work)
ATTENTION_FIT_DTYPES = ("bf16", "fp16")
ATTENTION_FIT_MIN_FLOPS = 1e9


def _attention_kernels(records, base=None):
    """The measured fused-attention kernels :func:`attention_error` reads: ``(model_s, log_measured_s, bwd)``,
    ``model_s(eff, bwd_share, d_half=None)`` the roofline's seconds of each with those constants, no floor."""
    from dataclasses import replace

    from .params import default_params

    d = records[(records["kind"] == "attention") & records["dtype"].isin(ATTENTION_FIT_DTYPES)
                & (records["flops"] >= ATTENTION_FIT_MIN_FLOPS)]
    groups, y = _device_groups(d)
    base = replace(base or default_params(), kernel_launch_us=0.0, kernel_floor_us=0.0)

    def model_s(eff: float, bwd_share: float, d_half: float | None = None) -> np.ndarray:
        # d_half: the head-dimension ramp's half point to try (None: ``base``'s)
        return _groups_time_s(groups, replace(base, attention_efficiency=eff, attention_bwd_share=bwd_share,
                                              attention_d_half=base.attention_d_half if d_half is None else d_half))

    bwd = np.array([op.phase == "bwd" for _hw, ops in groups for op in ops], bool)
    return model_s, y, bwd


def attention_error(records, base=None):
    """The roofline's fused-attention model on measured attention kernels of one or more devices.

    Args:
        records: operator records (a DataFrame in ``OP_COLUMNS`` layout); those of kind ``attention`` in
            :data:`ATTENTION_FIT_DTYPES` over :data:`ATTENTION_FIT_MIN_FLOPS` are used, each costed on
            the data-sheet descriptor it was recorded with (its ``device`` column, measured curves dropped:
            they would replace the model being judged).
        base: constants the model starts from (default :func:`~learnedperf.cost.params.default_params`).

    Returns:
        ``(log_error, kernels)``. ``log_error(eff, bwd_share, floor_fwd_us, floor_bwd_us)`` is the per-kernel
        log(model / measured) with ``attention_efficiency`` and ``attention_bwd_share`` set, plus a
        measurement floor per direction: a kernel timed alone pays its call's start-up (tens of µs forward, a
        backward's autograd engine ~100 µs) that a training step does not, so the floors are fitted and not
        kept. ``kernels`` is their number.
    """
    model_s, y, bwd = _attention_kernels(records, base)

    def log_error(eff: float, bwd_share: float, floor_fwd_us: float = 0.0, floor_bwd_us: float = 0.0) -> np.ndarray:
        return np.log(model_s(eff, bwd_share) + np.where(bwd, floor_bwd_us, floor_fwd_us) * 1e-6) - y

    return log_error, len(y)


#: Head dimensions at which :func:`fit_attention` tries the attention ramp's half point (``attention_d_half``)
ATTENTION_D_HALF_GRID = np.array([0.0, 8, 16, 32, 48, 64, 96, 128, 192])


def fit_attention(records, base=None, d_half_grid=None) -> dict[str, float]:
    """Fit ``attention_efficiency``, ``attention_bwd_share`` and ``attention_d_half`` (``d_half``, over
    ``d_half_grid``, default :data:`ATTENTION_D_HALF_GRID`; and the two measurement floors, reported and
    not kept) on measured fused-attention kernels, minimising :func:`attention_error`'s mean |log error|.

    A forward kernel's time depends on the efficiency alone and a backward's on the product efficiency ×
    share, each with its own floor, so the two halves of the loss are minimised apart, each over a grid of its
    efficiency and floor; the share is the ratio of the two efficiencies (rounded to 3 digits).
    """
    from dataclasses import replace

    from .params import default_params

    # the records are read once; each grid point only re-costs them
    model_s, y, bwd = _attention_kernels(records, base)
    if not len(y):
        raise InputError("fit_attention: no fused-attention records in "
                         f"{'/'.join(ATTENTION_FIT_DTYPES)} over {ATTENTION_FIT_MIN_FLOPS:g} FLOPs")
    floors = {False: np.array([0.0, 5, 10, 20, 30, 50]), True: np.array([0.0, 20, 50, 80, 100, 120, 150, 200])}
    d_halves = ATTENTION_D_HALF_GRID if d_half_grid is None else np.asarray(d_half_grid, float)
    fits = []
    for d_half in d_halves:
        best = {False: (math.inf, 0.0, 0.0), True: (math.inf, 0.0, 0.0)}
        # a share of the tensor-core peak: at most 1 (the ramp takes the share down for a finite head)
        for eff in np.round(np.linspace(0.1, 1.0, 91), 3):
            # at a share of 1 a backward runs at ``eff``: the grid of its product
            t = model_s(float(eff), 1.0, float(d_half))
            for phase, grid in floors.items():
                mask = bwd == phase
                for floor in grid:
                    val = float(np.sum(np.abs(np.log(t[mask] + floor * 1e-6) - y[mask])))
                    if val < best[phase][0] - 1e-12:
                        best[phase] = (val, float(eff), float(floor))
        fits.append((best[False][0] + best[True][0], float(d_half), best))
    _total, d_half, best = min(fits, key=lambda f: f[0])
    eff = best[False][1]
    p = {"eff": eff, "bwd_share": round(best[True][1] / eff, 3), "floor_fwd_us": best[False][2],
         "floor_bwd_us": best[True][2]}
    log_error, n = attention_error(records, replace(base or default_params(), attention_d_half=d_half))
    return p | {"d_half": d_half, "_mean_abs_log_error": float(np.mean(np.abs(log_error(**p)))), "_kernels": n}


#: Tensor-core GEMM kernels :func:`fit_gemm_tensor` reads: forward calls (a backward timed alone pays the autograd
#: engine's start-up, ~100 µs, which would swamp the ramp) in the tensor-core dtypes, over a GFLOP
GEMM_TENSOR_FIT_DTYPES = ("bf16", "fp16")
GEMM_TENSOR_FIT_MIN_FLOPS = 1e9
#: Inner dimensions at which :func:`fit_gemm_tensor` tries the tensor-core ramp's half point
GEMM_K_HALF_TENSOR_GRID = np.array([0.0, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512])


def _gemm_tensor_kernels(records, base=None):
    """The measured tensor-core GEMMs :func:`fit_gemm_tensor` reads: ``(model_s, log_measured_s)``,
    ``model_s(eff, k_half)`` the roofline's seconds of each with ``gemm_efficiency_tensor`` = ``eff`` and
    ``gemm_k_half_tensor`` = ``k_half``, no floor, each on the data-sheet descriptor it was recorded with."""
    from dataclasses import replace

    from .params import default_params

    d = records[(records["kind"] == "matmul") & records["dtype"].isin(GEMM_TENSOR_FIT_DTYPES)
                & (records["direction"] == "fwd") & (records["flops"] >= GEMM_TENSOR_FIT_MIN_FLOPS)]
    groups, y = _device_groups(d)
    base = replace(base or default_params(), kernel_launch_us=0.0, kernel_floor_us=0.0)

    def model_s(eff: float, k_half: float) -> np.ndarray:
        return _groups_time_s(groups, replace(base, gemm_efficiency_tensor=eff, gemm_k_half_tensor=k_half))

    return model_s, y


def fit_gemm_tensor(records, base=None, k_half_grid=None) -> dict[str, float]:
    """Fit the tensor-core GEMMs' inner-dimension ramp ``gemm_k_half_tensor`` on measured GEMM kernels.

    Args:
        records: operator records (a DataFrame in ``OP_COLUMNS`` layout) of one or more GPUs; the forward
            ``matmul`` kernels in :data:`GEMM_TENSOR_FIT_DTYPES` over :data:`GEMM_TENSOR_FIT_MIN_FLOPS` are read.
        base: constants the model starts from (its memory efficiency bounds the small-k kernels).
        k_half_grid: half points to try (default :data:`GEMM_K_HALF_TENSOR_GRID`).

    Returns:
        ``{"k_half", "eff", "floor_us", "_mean_abs_log_error", "_kernels"}``: the half point, with the large-GEMM
        efficiency and a per-call measurement floor fitted beside it over grids (a kernel timed alone pays its
        call's start-up, which a training step's queue hides). Only ``k_half`` would be a constant of the
        simulator, which ships without it (module docstring); its efficiency is fitted on whole steps
        (``experiments/calibrate_steps.py``), and the floor is the measurement's.
    """
    model_s, y = _gemm_tensor_kernels(records, base)
    if not len(y):
        raise InputError("fit_gemm_tensor: no forward matmul records in "
                         f"{'/'.join(GEMM_TENSOR_FIT_DTYPES)} over {GEMM_TENSOR_FIT_MIN_FLOPS:g} FLOPs")
    grid = GEMM_K_HALF_TENSOR_GRID if k_half_grid is None else np.asarray(k_half_grid, float)
    best = (math.inf, 0.0, 0.0, 0.0)
    for k_half in grid:
        for eff in np.round(np.linspace(0.1, 1.0, 91), 3):
            t = model_s(float(eff), float(k_half))
            for floor in (0.0, 5, 10, 15, 20, 30, 50):
                val = float(np.mean(np.abs(np.log(t + floor * 1e-6) - y)))
                if val < best[0] - 1e-12:
                    best = (val, float(k_half), float(eff), float(floor))
    return {"k_half": best[1], "eff": best[2], "floor_us": best[3], "_mean_abs_log_error": best[0],
            "_kernels": len(y)}


def gemm_tensor_error(records, k_half: float, eff: float, floor_us: float, base=None) -> float:
    """Mean |log(model / measured)| of the roofline on the tensor-core GEMM kernels :func:`fit_gemm_tensor` reads,
    with the given ramp, efficiency and measurement floor (to score a fit on another GPU's kernels)."""
    model_s, y = _gemm_tensor_kernels(records, base)
    if not len(y):
        raise InputError("gemm_tensor_error: no tensor-core GEMM records to score")
    return float(np.mean(np.abs(np.log(model_s(eff, k_half) + floor_us * 1e-6) - y)))


#: Forward element-wise records the eager dispatch rate is read from: small enough (bytes read and written)
#: that the device finishes each before the host has issued the next
EAGER_DISPATCH_MAX_BYTES = 256 * 1024


def eager_dispatch_us(records) -> tuple[float, int]:
    """The host's time to issue one bare tensor operation: the median per-call time of forward element-wise
    records of at most :data:`EAGER_DISPATCH_MAX_BYTES` timed back to back on a GPU (timer
    ``cuda_event_xN``, N > 1: the calls are queued as a step queues them, so a kernel shorter than its
    launch is timed at the host's rate). Returns ``(µs, records)``; NaN and 0 without such records."""
    d = records[(records["kind"] == "elementwise") & (records["direction"] == "fwd")
                & (records["bytes"] <= EAGER_DISPATCH_MAX_BYTES)
                & records["timer"].astype(str).str.match(r"cuda_event_x\d+$")]
    if d.empty:
        return float("nan"), 0
    return float(np.median(d["time_ms"].to_numpy(float)) * 1e3), len(d)

# the constants fit_device_params searches, with their grids (wide: a CPU's caches can beat DRAM bandwidth,
# so efficiencies above 1 relative to the measured streaming bandwidth are allowed)
_DEVICE_GRIDS = {
    "kernel_launch_us": np.array([0.0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 75, 100]),
    "memory_efficiency": np.round(np.linspace(0.1, 3.0, 59), 3),
    "gemm_efficiency_fp32": np.round(np.linspace(0.05, 1.5, 59), 3),
    "gemm_efficiency_tensor": np.round(np.linspace(0.05, 1.5, 59), 3),
    "gemm_k_half": np.array([0.0, 4, 8, 16, 32, 64, 128, 256, 512]),
    "attention_efficiency": np.round(np.linspace(0.02, 1.5, 75), 3),
}


_FLOOR_GRID_US = np.array([0.0, 5, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150, 200])


def _param_relevant(name: str, ops) -> bool:
    """Whether the records contain ops whose cost depends on constant ``name``."""
    kinds = {(op.kind, op.dtype in ("tf32", "bf16", "fp16", "fp8")) for op in ops}
    if name in ("gemm_efficiency_fp32", "gemm_k_half"):
        return ("matmul", False) in kinds or ("conv", False) in kinds or (
            name == "gemm_k_half" and ("matmul", True) in kinds)
    if name == "gemm_efficiency_tensor":
        return ("matmul", True) in kinds or ("conv", True) in kinds
    if name == "attention_efficiency":
        return any(k == "attention" for k, _ in kinds)
    return True


def fit_device_params(records, base=None, passes: int = 3):
    """Fit roofline constants to one device's measured operator records.

    Args:
        records: operator records (``learnedperf.measure.records.OP_COLUMNS`` dicts) of compute ops,
            all measured on the same device descriptor (``device`` column).
        base: constants the fit starts from (default :class:`CostParams` defaults).
        passes: rounds of coordinate descent over the constants.

    Returns:
        ``(params, report)``: fitted :class:`CostParams` and a dict with the loss (mean absolute log
        error), the number of records and the MAPE per kind after the fit.

    The fit minimises the mean absolute log error of :class:`RooflineCost` over the records by
    coordinate descent on grids of ``kernel_launch_us``, ``memory_efficiency``, the GEMM efficiencies
    and ``gemm_k_half``, and ``attention_efficiency`` (only those the records exercise), plus a
    floor per isolated backward / optimizer call (reported, not used by the simulator). The per-step
    floor is set to 0 (records time operators one by one), and link efficiencies to 1 because a
    measured device's links are described by the *achieved* bandwidth of its collective benchmarks.
    """
    import json
    from dataclasses import replace

    from ..graph.ops import Op
    from ..specs import resolve_hardware
    from .params import CostParams
    from .roofline import RooflineCost

    rows = [r for r in records if r["kind"] not in ("allreduce", "allgather", "reducescatter", "alltoall", "p2p")]
    if not rows:
        raise InputError("fit_device_params: no compute operator records")
    devices = {r["device"] for r in rows}
    if len(devices) != 1:
        raise InputError(f"fit_device_params: records of {len(devices)} devices; fit one device at a time")
    device = json.loads(devices.pop())
    hw = resolve_hardware({"device": device, "num_devices": 1})
    ops, y = [], []
    for r in rows:
        params = json.loads(r["params"]) if isinstance(r["params"], str) else (r["params"] or {})
        shape = json.loads(r["shape"]) if isinstance(r["shape"], str) else r["shape"]
        ops.append(Op(r["op"], r["kind"], _DIRECTION_PHASE.get(r["direction"], "fwd"), float(r["flops"]),
                      float(r["bytes"]), r["dtype"], tuple(int(x) for x in shape),
                      causal=bool(params.get("causal", False))))
        y.append(float(r["time_ms"]) * 1e-3)
    y_log = np.log(np.asarray(y))

    # Timing one backward (or optimizer step) in isolation pays a fixed start-up cost (the autograd
    # engine's, a Python call) that a training step pays once for its whole graph, not per op: it is
    # fitted per phase as a measurement floor and kept out of the constants the simulator uses.
    # Forward calls are timed as a model's forward runs them, so their overhead is the per-op one.
    phase = np.array([op.phase for op in ops])
    floor_of = {"bwd": 0.0, "opt": 0.0}

    def model_s(p, floors) -> np.ndarray:
        cost = RooflineCost(hw, p)
        t = np.fromiter((cost.compute_time_s(op) for op in ops), float, len(ops))
        for ph, us in floors.items():
            t = t + np.where(phase == ph, us * 1e-6, 0.0)
        return t

    def loss(p, floors) -> float:
        return float(np.mean(np.abs(np.log(model_s(p, floors)) - y_log)))

    params = replace(base or CostParams(), kernel_floor_us=0.0, link_efficiency_intra=1.0,
                     link_efficiency_inter=1.0)
    names = [n for n in _DEVICE_GRIDS if _param_relevant(n, ops)]
    floor_names = [ph for ph in floor_of if (phase == ph).any()]
    best = loss(params, floor_of)
    for _ in range(passes):
        improved = False
        for name in names + floor_names:
            for value in (_FLOOR_GRID_US if name in floor_of else _DEVICE_GRIDS[name]):
                if name in floor_of:
                    trial_p, trial_f = params, {**floor_of, name: float(value)}
                else:
                    trial_p, trial_f = replace(params, **{name: float(value)}), floor_of
                val = loss(trial_p, trial_f)
                if val < best - 1e-12:
                    params, floor_of, best, improved = trial_p, trial_f, val, True
        if not improved:
            break
    pred = model_s(params, floor_of)
    per_kind: dict[str, list[float]] = {}
    for op, p_s, t in zip(ops, pred, y):
        per_kind.setdefault(op.kind, []).append(abs(p_s / t - 1))
    report = {"device": device.get("name"), "records": len(ops), "mean_abs_log_error": best,
              "fitted": names, "isolated_call_floor_us": {k: v for k, v in floor_of.items() if k in floor_names},
              "mape_by_kind": {k: float(np.mean(v)) for k, v in sorted(per_kind.items())}}
    return params, report


def main(argv: list[str] | None = None) -> int:
    """Fit every operator-level constant and store them in ``cost/data/params.json``."""
    from dataclasses import replace

    import pandas as pd

    from .params import default_params, slot_powered, write_params

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # shared/data sits next to the repository checkout
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data")
    ap.add_argument("--measured", type=Path, default=Path(__file__).resolve().parents[2] / "datasets" / "measured",
                    help="the project's measured data sets (GPU operator records: */ops_cuda.parquet)")
    ap.add_argument("--dry-run", action="store_true", help="print the fits without storing them")
    args = ap.parse_args(argv)
    # the transformer-shaped part of NeuSight's grid: the shapes the simulator costs (MODEL_SHAPED_SPLIT)
    ops = model_shaped(pd.read_parquet(args.data / "neusight_ops.parquet"))
    mem = fit_memory_bound(ops)
    print("memory-bound kernels:", mem)
    devs = _devices()
    slot = [name for name, dev in devs.items() if slot_powered(dev)]
    gemm = fit_gemm_fp32(ops[~ops.device.isin(slot)], mem["eff"], 0.0)
    print("fp32 GEMMs, cards not powered by their slot alone:", gemm)
    share = fit_gemm_fp32(ops[ops.device.isin(slot)], mem["eff"], 0.0, share_of=gemm)
    print("fp32 GEMMs, slot-powered cards' share:", share)
    ar = fit_nvlink_allreduce(args.data)
    print("NVLink all-reduce:", ar)
    # the project's own GPU operator records (datasets/measured/*/ops_cuda.parquet): fused attention and the
    # host's rate for bare tensor operations
    gpu_dirs = sorted(p.parent for p in args.measured.glob("*/ops_cuda.parquet"))
    gpu = {d.name: pd.read_parquet(d / "ops_cuda.parquet") for d in gpu_dirs}
    if not gpu:
        raise SystemExit(f"calibrate: no GPU operator records (*/ops_cuda.parquet) under {args.measured}")
    every = pd.concat(list(gpu.values()), ignore_index=True)
    # the attention model reads the memory bound fitted above (its head-dimension ramp is its own)
    fitted = replace(default_params(), memory_efficiency=mem["eff"], gemm_efficiency_fp32=gemm["eff"],
                     gemm_k_half=gemm["k_half"], gemm_unaligned_share=gemm["unaligned"],
                     slot_power_compute_share=share["share"])
    for name, rows in gpu.items():
        one = fit_attention(rows, base=fitted)
        others = pd.concat([r for n, r in gpu.items() if n != name], ignore_index=True) if len(gpu) > 1 else None
        if others is not None:
            err, _n = attention_error(others, base=replace(fitted, attention_d_half=one["d_half"]))
            held = float(np.mean(np.abs(err(one["eff"], one["bwd_share"], one["floor_fwd_us"], one["floor_bwd_us"]))))
            print(f"fused attention fitted on {name} alone: {one}; mean |log err| on the others' {_n}: {held:.3f}")
        print(f"eager dispatch on {name}: {eager_dispatch_us(rows)} (µs, records)")
    att = fit_attention(every, base=fitted)
    print("fused attention, every GPU:", att)
    eager, n_eager = eager_dispatch_us(every)
    print(f"eager dispatch, every GPU: {eager:.1f} µs ({n_eager} records)")
    src_ops = "fit by learnedperf.cost.calibrate on shared/data/neusight_ops.parquet"
    src_ar = "fit by learnedperf.cost.calibrate on shared/data/vtrain/trace/a100/AR_GPU*_LUT (NCCL all-reduce)"
    updates = {
        "memory_efficiency": (mem["eff"], f"{src_ops} (element-wise/ln/softmax, 5 GPUs); "
                                          f"mean |log err| {mem['_mean_abs_log_error']:.3f}"),
        "gemm_efficiency_fp32": (gemm["eff"], f"{src_ops} (linear+bmm fp32 of the GPUs not powered by their "
                                              f"slot alone: {', '.join(sorted(set(devs) - set(slot)))}); "
                                              f"mean |log err| {gemm['_mean_abs_log_error']:.3f}"),
        "gemm_k_half": (gemm["k_half"], f"{src_ops} (same fit)"),
        "gemm_unaligned_share": (gemm["unaligned"], f"{src_ops} (same fit; the 16-byte rule is NVIDIA's, "
                                                   f"cost.params.GEMM_ALIGN_BYTES)"),
        "slot_power_compute_share": (share["share"], f"{src_ops} (linear+bmm fp32 of the slot-powered GPUs, "
                                                    f"{', '.join(sorted(slot))}, with the three constants above "
                                                    f"held); mean |log err| {share['_mean_abs_log_error']:.3f}"),
        "alpha_intra_us": (ar["alpha_us"], f"{src_ar}; mean |log err| {ar['_mean_abs_log_error']:.3f}"),
        "link_efficiency_intra": (ar["eff"], f"{src_ar} (same fit; NVLink3 300 GB/s per direction)"),
        "attention_efficiency": (att["eff"], f"fit by learnedperf.cost.calibrate on the fused-attention kernels "
                                             f"(bf16/fp16, over 1 GFLOP) of {', '.join(gpu)} (torch SDPA), "
                                             f"{att['_kernels']} records, with attention_bwd_share and the "
                                             f"head-dimension ramp d/(d + attention_d_half); mean |log err| "
                                             f"{att['_mean_abs_log_error']:.3f}"),
        "attention_bwd_share": (att["bwd_share"], "fit by learnedperf.cost.calibrate (same fit)"),
        "attention_d_half": (att["d_half"], "fit by learnedperf.cost.calibrate (same fit, over "
                                            "cost.calibrate.ATTENTION_D_HALF_GRID)"),
        "eager_dispatch_us": (round(eager, 1), f"measured: median per-call time of {n_eager} forward element-wise "
                                               f"records of at most {EAGER_DISPATCH_MAX_BYTES} bytes timed back to "
                                               f"back on {', '.join(gpu)} (learnedperf.cost.calibrate)"),
    }
    if not args.dry_run:
        write_params(updates)
        print("stored in cost/data/params.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
