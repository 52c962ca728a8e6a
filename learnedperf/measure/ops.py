"""Operator profiling on the local device.

A grid of operator cases (GEMMs, attention, normalisations, element-wise passes,
embedding, convolution, cross-entropy, optimizer steps), each timed forward and
backward in each dtype, gives operator records in the schema of
:data:`learnedperf.measure.records.OP_COLUMNS`.

* :class:`OpCase` — one operator, shape, dtype and its own arguments;
* :func:`op_grid` — the full (or quick) grid of cases;
* :func:`as_op` / :func:`flops_bytes` — the :class:`~learnedperf.graph.ops.Op` a case
  stands for, i.e. its FLOPs and bytes in the conventions of :mod:`learnedperf.graph`
  (the single place where those counts are written for measured operators);
* :func:`profile_op` — time one case, one record per direction;
* :func:`profile_grid` — time many cases, yielding records.

Timing: ``warmup`` untimed calls, then up to ``repeats`` individually timed calls
(fewer, but at least ``min_repeats``, once the timed calls of one direction pass
``budget_s``: a 100 ms GEMM needs no 20 repetitions to give a stable median, and
the whole grid must fit in minutes). On CPU each call is timed with
``time.perf_counter``; on CUDA with a pair of CUDA events and a synchronize, so
asynchronous launches are charged to the kernel that ran.

Backward is the time of ``autograd`` backward alone: the forward runs once,
untimed, and ``backward(retain_graph=True)`` is then timed repeatedly, with the
gradients of the leaves reset to ``None`` (untimed) before each call, as
``zero_grad(set_to_none=True)`` does in training.

torch is imported inside the functions that need it, never at module import.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator, Optional

from ..errors import InputError, LearnedPerfError
from ..graph.ops import Op, elementwise, matmul
from ..graph.transformer import backward_of, optimizer_ops
from ..units import dtype_bytes
from .records import OP_COLUMNS, canonical_json, host_name, now_utc


class UnsupportedCase(LearnedPerfError):
    """A case cannot be timed on this device (dtype or operator unsupported, out of memory...).

    Raised by :func:`profile_op`; :func:`profile_grid` hands it to ``on_skip`` so the caller
    can count and report skips with their reason.

    Attributes:
        case: the :class:`OpCase` that failed.
        reason: one line saying why.
    """

    def __init__(self, case: "OpCase", reason: str):
        self.case = case
        self.reason = reason
        super().__init__(f"{case.label()}: {reason}")


# ------------------------------------------------------------------ cases
#: Operator name -> cost-model kind (learnedperf.graph.ops.COMPUTE_KINDS).
OP_KINDS = {
    "linear": "matmul",
    "bmm": "matmul",
    "sdpa": "attention",
    "layer_norm": "layernorm",
    "rms_norm": "rmsnorm",
    "softmax": "softmax",
    "gelu": "elementwise",
    "silu": "elementwise",
    "add": "elementwise",
    "mul": "elementwise",
    "dropout": "elementwise",
    "embedding": "embedding",
    "conv2d": "conv",
    "cross_entropy": "cross_entropy",
    "adamw": "optimizer",
    "sgd": "optimizer",
}

#: Names of the shape fields per kind (the Op.shape convention of learnedperf.graph.ops).
SHAPE_FIELDS = {
    "matmul": ("batch", "m", "n", "k"),
    "attention": ("batch", "heads", "s_q", "s_kv", "head_dim"),
    "conv": ("batch", "c_in", "c_out", "kernel", "H", "W"),
    "optimizer": ("N", "1"),
    "embedding": ("tokens", "hidden"),
    "cross_entropy": ("rows", "vocab"),
}
_ROWS_COLS = ("rows", "cols")

#: Element types the profiler knows (torch dtype names are looked up lazily).
DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class OpCase:
    """One operator to time: name, cost-model kind, shape, own arguments and dtype.

    Attributes:
        op: operator name, a key of :data:`OP_KINDS` (``"linear"``, ``"sdpa"``...).
        kind: cost-model kind (``OP_KINDS[op]``).
        shape: dimensions in the convention of ``kind`` (:data:`SHAPE_FIELDS`; ``(rows, cols)`` otherwise).
        params: the operator's own arguments (``causal``, ``vocab``, ``stride``, ``precision``...).
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (optimizer cases: the master-weight dtype, ``"fp32"``).

    Raises:
        InputError: naming the field when a dimension is not a positive integer, the
            operator or dtype is unknown, or a parameter is invalid.
    """

    op: str
    kind: str
    shape: tuple
    params: dict = field(default_factory=dict)
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.op not in OP_KINDS:
            raise InputError(f"op: unknown operator {self.op!r} (known: {', '.join(OP_KINDS)})")
        if self.kind != OP_KINDS[self.op]:
            raise InputError(f"kind: operator {self.op!r} has kind {OP_KINDS[self.op]!r}, got {self.kind!r}")
        if self.dtype not in DTYPES:
            raise InputError(f"dtype: unknown dtype {self.dtype!r} (known: {', '.join(DTYPES)})")
        names = self.shape_fields()
        shape = tuple(self.shape)
        if len(shape) != len(names):
            raise InputError(f"shape: {self.kind} expects {len(names)} dimensions {names}, got {list(shape)}")
        for i, (name, value) in enumerate(zip(names, shape)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"shape[{i}] ({name}): must be a positive integer, got {value!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "params", dict(self.params))
        self._check_params()

    def _check_params(self) -> None:
        p = self.params
        if self.kind == "embedding" and (not isinstance(p.get("vocab"), int) or p["vocab"] <= 0):
            raise InputError(f"params.vocab: embedding needs a positive integer vocab, got {p.get('vocab')!r}")
        if self.kind == "conv":
            for key, low in (("stride", 1), ("padding", 0)):
                v = p.get(key, low)
                if isinstance(v, bool) or not isinstance(v, int) or v < low:
                    raise InputError(f"params.{key}: must be an integer >= {low}, got {v!r}")
            _b, _ci, _co, k, H, W = self.shape
            pad = p.get("padding", 0)
            if H + 2 * pad < k or W + 2 * pad < k:
                raise InputError(f"shape[3] (kernel): {k} is larger than the padded input {H}x{W} (padding {pad})")
        if self.kind == "optimizer":
            prec = p.get("precision", "fp32")
            if prec not in DTYPES:
                raise InputError(f"params.precision: unknown precision {prec!r}")
        if self.op == "dropout":
            prob = p.get("p", 0.1)
            if not isinstance(prob, (int, float)) or not 0.0 <= prob < 1.0:
                raise InputError(f"params.p: dropout probability must be in [0, 1), got {prob!r}")

    def __hash__(self) -> int:  # params is a dict: hash its canonical JSON
        return hash((self.op, self.kind, self.shape, canonical_json(self.params), self.dtype))

    def shape_fields(self) -> tuple:
        """Names of the shape dimensions of this case's kind."""
        return SHAPE_FIELDS.get(self.kind, _ROWS_COLS)

    @property
    def directions(self) -> tuple[str, ...]:
        """Directions timed: ``("opt",)`` for optimizer steps, ``("fwd", "bwd")`` otherwise."""
        return ("opt",) if self.kind == "optimizer" else ("fwd", "bwd")

    def label(self) -> str:
        """Short readable label, e.g. ``linear[1,64,64,64] bf16``."""
        extra = "".join(f" {k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.op}[{','.join(map(str, self.shape))}] {self.dtype}{extra}"


# -------------------------------------------------------- FLOPs and bytes
# The one place where the FLOPs and bytes of a measured operator are written. They are
# the Op of learnedperf.graph for the same computation, so a cost model (or a learned
# model trained on these records) is asked about exactly the op that was timed:
#
# * matmul [m,k]×[k,n] (batch b): 2·b·m·n·k FLOPs (one multiply and one add per term);
#   bytes = both inputs read + output written. Backward is two GEMMs of the same FLOPs
#   (dX = dY·Wᵀ and dW = Xᵀ·dY), so 2× the forward FLOPs and bytes (graph.transformer.backward_of).
# * attention (fused, FlashAttention-style): 4·b·h·s_q·s_kv·d FLOPs (Q·Kᵀ and P·V, 2 FLOPs
#   per multiply-add each), counted in full even when causal (the mask is a flag, cost models
#   skip the masked blocks); bytes = Q and O (s_q rows) + K and V (s_kv rows), the score matrix
#   never touching memory. Backward: the graph's model-FLOPs convention, 2× forward (dQ, dK, dV
#   and dP GEMMs). FlashAttention's own count is 2.5× because it also recomputes Q·Kᵀ; that
#   recompute is charged to time, not to FLOPs, as in MFU accounting, so the two stay comparable.
# * memory-bound ops: numel × (tensors read + tensors written) × element size, with the FLOPs
#   per element of the graph (norms 5, activations 8, dropout 2, add/mul 1). Backward reads
#   the output gradient and the saved input and writes the input gradient: 2× forward.
# * embedding: the looked-up rows written plus the int64 indices read (T·h·e + 8·T); backward 2×.
# * conv2d: implicit GEMM, 2·b·c_out·H_out·W_out·c_in·k² FLOPs; bytes = input + weight + output;
#   backward = data gradient + weight gradient = 2×, like a GEMM.
# * optimizer step: graph.transformer.optimizer_ops — Adam(W) reads weight, gradient and two
#   moments, writes weight and moments (+ the low-precision weight copy in mixed precision)
#   plus one more read of the gradients for the norm of gradient clipping; SGD reads weight and
#   gradient and writes weight, plus the same norm pass.

#: Memory-bound ops: (tensors read, tensors written, FLOPs per element), forward.
ELEMENTWISE_TRAFFIC = {
    "layer_norm": (1, 1, 5.0),
    "rms_norm": (1, 1, 5.0),
    "softmax": (1, 1, 5.0),
    "gelu": (1, 1, 8.0),
    "silu": (1, 1, 8.0),
    "add": (2, 1, 1.0),
    "mul": (2, 1, 1.0),
    "dropout": (1, 1, 2.0),
    "cross_entropy": (2, 1, 5.0),  # log-softmax pass over the logits, then the gather of the targets
}


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def as_op(case: OpCase, direction: str = "fwd") -> Op:
    """The :class:`~learnedperf.graph.ops.Op` that ``case`` computes in ``direction``.

    Backward of an op that the graph splits in several (a GEMM's dgrad and wgrad) is
    returned as one Op with their summed FLOPs and bytes and the forward shape.

    Raises:
        InputError: ``direction`` is not one the case has.
    """
    if direction not in case.directions:
        raise InputError(f"direction: {case.op} has directions {case.directions}, got {direction!r}")
    e = dtype_bytes(case.dtype)
    k, dt, name = case.kind, case.dtype, case.op
    if k == "optimizer":
        opt = "adam" if case.op == "adamw" else "sgd"
        base = optimizer_ops(case.shape[0], opt, case.params.get("precision", "fp32"))[0]
        return Op(name, k, "opt", base.flops, base.bytes, base.dtype, case.shape)
    if k == "matmul":
        b, m, n, kk = case.shape
        fwd = matmul(name, "fwd", m, n, kk, dt, e, batch=b)
    elif k == "attention":
        b, h, s_q, s_kv, d = case.shape
        flops = 4.0 * b * h * s_q * s_kv * d
        nbytes = (b * s_q * 2 * h * d + 2 * b * s_kv * h * d) * e
        fwd = Op(name, k, "fwd", flops, float(nbytes), dt, case.shape, None, bool(case.params.get("causal", False)))
    elif k == "embedding":
        T, hidden = case.shape
        fwd = Op(name, k, "fwd", 0.0, float(T * hidden * e + T * 8), dt, case.shape)
    elif k == "conv":
        b, c_in, c_out, ker, H, W = case.shape
        stride, pad = case.params.get("stride", 1), case.params.get("padding", 0)
        Ho, Wo = _conv_out(H, ker, stride, pad), _conv_out(W, ker, stride, pad)
        flops = 2.0 * b * c_out * Ho * Wo * c_in * ker * ker
        nbytes = (b * c_in * H * W + c_out * c_in * ker * ker + b * c_out * Ho * Wo) * e
        fwd = Op(name, k, "fwd", flops, float(nbytes), dt, case.shape)
    else:
        rows, cols = case.shape
        reads, writes, fpe = ELEMENTWISE_TRAFFIC[case.op]
        fwd = elementwise(name, k, "fwd", rows * cols, reads, writes, e, dt, fpe, cols)
    if direction == "fwd":
        return fwd
    bwd = backward_of([fwd])
    return Op(name, k, "bwd", sum(o.flops for o in bwd), sum(o.bytes for o in bwd), dt, case.shape, None,
              fwd.causal)


def flops_bytes(case: OpCase, direction: str = "fwd") -> tuple[float, float]:
    """(FLOPs, bytes read + written) of ``case`` in ``direction`` (see :func:`as_op`)."""
    op = as_op(case, direction)
    return op.flops, op.bytes


# ------------------------------------------------------------------- grid
def _log_range(lo: int, hi: int, per_octave: int = 1) -> list[int]:
    """Log-spaced integers lo..hi: powers of two times ``lo``, plus the 1.5× points between them
    when ``per_octave == 2`` (32, 48, 64, 96, ...: the sizes real models use, e.g. 768, 1536)."""
    out, v = [], lo
    while v <= hi:
        out.append(v)
        if per_octave >= 2 and v * 3 // 2 <= hi:
            out.append(v * 3 // 2)
        v *= 2
    return out


def _spread(candidates: list, count: int, size_of: Callable[[Any], float]) -> list:
    """``count`` candidates evenly spaced in the size order (deterministic), small to large."""
    cands = sorted(set(candidates), key=lambda c: (size_of(c), c))
    if len(cands) <= count:
        return cands
    step = (len(cands) - 1) / (count - 1)
    return [cands[round(i * step)] for i in range(count)]


def default_dtypes(device: str = "cpu") -> tuple[str, ...]:
    """The dtypes the full grid uses on ``device``.

    fp32 and bf16 always; fp16 on CUDA, and on CPU when fp16 GEMMs run at a reasonable speed
    (:func:`dtype_skip_reason`); other fp16 operators that have no fast CPU kernels are then
    skipped one by one, with their reason, when profiled. On CUDA bf16 comes first, then fp32: the
    grid runs in this order, and a time budget that runs out (a lent GPU's minutes) cuts the last
    dtype. bf16 is what training runs in; fp32 is what NeuSight measured five other GPUs in.
    """
    if device.startswith("cuda"):
        return ("bf16", "fp32", "fp16")
    return ("fp32", "bf16") if dtype_skip_reason(device, "fp16", "linear") else ("fp32", "bf16", "fp16")


#: A dtype whose forward + backward is more than this many times slower than fp32 is skipped on
#: CPU: such a gap means a scalar fallback (e.g. fp16 conv2d backward: ~100x), which would cost
#: minutes per case and describe no kernel a real CPU run would choose.
SLOW_DTYPE_FACTOR = 4.0

#: Medium shapes used to compare an operator's speed across dtypes (one per operator).
_PROBE_CASES = {
    "linear": ((1, 256, 256, 256), {}), "bmm": ((4, 128, 128, 128), {}),
    "sdpa": ((1, 4, 128, 128, 64), {"causal": True}), "layer_norm": ((256, 1024), {"eps": 1e-5}),
    "rms_norm": ((256, 1024), {"eps": 1e-6}), "softmax": ((256, 1024), {}), "gelu": ((256, 1024), {}),
    "silu": ((256, 1024), {}), "add": ((256, 1024), {}), "mul": ((256, 1024), {}),
    "dropout": ((256, 1024), {"p": 0.1}), "embedding": ((1024, 256), {"vocab": 8192}),
    "conv2d": ((2, 16, 32, 3, 28, 28), {"stride": 1, "padding": 1}), "cross_entropy": ((128, 4096), {}),
}


@lru_cache(maxsize=None)
def dtype_skip_reason(device: str, dtype: str, op: str) -> Optional[str]:
    """None when ``op`` runs in ``dtype`` on ``device`` at a reasonable speed, else why to skip it.

    Only fp16 on CPU is checked (bf16 and fp32 always run; CUDA has fp16 kernels): the forward +
    backward of a medium probe shape is timed in fp32 and in fp16 (best of a few calls, robust to
    preemption on a shared machine), and fp16 is skipped when it fails or is more than
    :data:`SLOW_DTYPE_FACTOR` times slower. Cached per (device, dtype, op).
    """
    if device.startswith("cuda") or dtype != "fp16" or op not in _PROBE_CASES:
        return None
    import torch

    shape, params = _PROBE_CASES[op]

    def best_ms(dt: str) -> float:
        built = _build(OpCase(op, OP_KINDS[op], shape, params, dt), device)
        best = math.inf
        for i in range(3):
            for leaf in built.leaves:
                leaf.grad = None
            t0 = time.perf_counter()
            out = built.forward()
            out.backward(None if out.dim() == 0 else torch.ones_like(out))
            if i:  # the first call pays one-time kernel selection
                best = min(best, (time.perf_counter() - t0) * 1e3)
        return best

    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = best_ms("fp32")
        got = best_ms(dtype)
    except (RuntimeError, NotImplementedError) as exc:
        return f"{dtype} {op} fails on {device}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    finally:
        torch.set_num_threads(prev)
    if got > SLOW_DTYPE_FACTOR * ref:
        return (f"{dtype} {op} forward+backward runs {got / ref:.0f}x slower than fp32 on {device} "
                f"({got:.2f} vs {ref:.2f} ms at shape {list(shape)}): no fast {dtype} kernel")
    return None


def op_grid(quick: bool = False, dtypes: Optional[Iterable[str]] = None, device: str = "cpu") -> list[OpCase]:
    """The grid of operator cases to profile.

    Sizes span small to medium for a CPU core (GEMM dimensions 32..2048 log-spaced with
    half-octave steps, so non-powers of two appear too; FLOPs capped so that one call stays
    under ~100 ms on one core). Each operator draws a fixed number of shapes evenly spread over
    its candidates ordered by size, so the grid is deterministic.

    Args:
        quick: a small grid (~60 records in fp32 and bf16) that runs in seconds, for tests and
            smoke checks.
        dtypes: dtypes to include; default :func:`default_dtypes` (``("fp32", "bf16")`` when quick).
        device: ``"cpu"`` or ``"cuda"``: only used to choose the default dtypes.

    Returns:
        The cases; optimizer cases appear once per precision with dtype ``"fp32"`` (master weights).
    """
    if dtypes is None:
        dtypes = ("fp32", "bf16") if quick else default_dtypes(device)
    dtypes = tuple(dtypes)
    for d in dtypes:
        if d not in DTYPES:
            raise InputError(f"dtypes: unknown dtype {d!r} (known: {', '.join(DTYPES)})")
    shapes = _quick_shapes() if quick else _full_shapes(device)
    cases: list[OpCase] = []
    for dt in dtypes:
        for op, shape, params in shapes:
            if OP_KINDS[op] == "optimizer":
                continue
            cases.append(OpCase(op, OP_KINDS[op], shape, params, dt))
    # optimizer steps: fp32 master weights; AdamW once per training precision (mixed precision adds
    # the low-precision weight copy), SGD in fp32 only (the graph's SGD has no copy term)
    for op, shape, params in shapes:
        if OP_KINDS[op] != "optimizer":
            continue
        precisions = [d for d in dtypes if op == "adamw" or d == "fp32"]
        for prec in precisions:
            cases.append(OpCase(op, "optimizer", shape, {**params, "precision": prec}, "fp32"))
    return cases


def _quick_shapes() -> list[tuple[str, tuple, dict]]:
    return [
        ("linear", (1, 64, 96, 128), {}),
        ("bmm", (4, 32, 48, 64), {}),
        ("sdpa", (1, 2, 64, 64, 32), {"causal": True}),
        ("layer_norm", (64, 256), {"eps": 1e-5}),
        ("rms_norm", (64, 256), {"eps": 1e-6}),
        ("softmax", (64, 256), {}),
        ("gelu", (64, 256), {}),
        ("silu", (64, 256), {}),
        ("add", (64, 256), {}),
        ("mul", (64, 256), {}),
        ("dropout", (64, 256), {"p": 0.1}),
        ("embedding", (128, 64), {"vocab": 1000}),
        ("conv2d", (1, 8, 16, 3, 16, 16), {"stride": 1, "padding": 1}),
        ("cross_entropy", (32, 512), {}),
        ("adamw", (4096, 1), {"clip_grad_norm": 1.0}),
        ("sgd", (4096, 1), {"clip_grad_norm": 1.0}),
    ]


#: Shapes per operator in the full grid (per dtype: two records each, fwd and bwd).
FULL_COUNTS = {"linear": 420, "bmm": 130, "sdpa": 150, "layer_norm": 50, "rms_norm": 50, "softmax": 50,
               "gelu": 30, "silu": 30, "add": 30, "mul": 30, "dropout": 30, "embedding": 48, "conv2d": 80,
               "cross_entropy": 48, "adamw": 16, "sgd": 12}


#: Size limits of the full grid. CPU: one call stays under ~100 ms on one core at ~100 GFLOP/s (fp32) and
#: ~10 GB/s (a 2^32-FLOP GEMM is ~40 ms forward, twice that backward). GPU: the sizes training runs on. A
#: 2^32-FLOP GEMM takes ~5 µs on an H100 in bf16 (8192^3 ran at ~790 TFLOP/s there: the device tool's notes),
#: under its launch overhead, so a CPU-sized grid would teach the regressor nothing of a GPU's large
#: kernels; 2^41 FLOPs is ~3 ms in bf16 and ~40 ms in fp32, and a 2^28-element tensor is 1 GiB in fp32.
_SIZE_LIMITS = {
    "cpu": {"gemm_flops": 2.0**32, "gemm_dims": (32, 2048), "bmm_dims": (16, 512), "seq": (64, 2048),
            "rows": (32, 16384), "cols": (64, 8192), "elems": 2**24, "emb_tokens": 16384, "emb_elems": 2**25,
            "conv_elems": 2**23, "ce_rows": 8192, "ce_vocabs": (1000, 8192, 32000, 50257), "ce_elems": 2**24,
            "params": (2**12, 2**25)},
    "cuda": {"gemm_flops": 2.0**41, "gemm_dims": (32, 16384), "bmm_dims": (16, 4096), "seq": (64, 8192),
             "rows": (32, 65536), "cols": (64, 16384), "elems": 2**28, "emb_tokens": 65536, "emb_elems": 2**30,
             "conv_elems": 2**27, "ce_rows": 32768, "ce_vocabs": (1000, 32000, 50257, 128256), "ce_elems": 2**29,
             "params": (2**12, 2**28)},
}


def _full_shapes(device: str = "cpu") -> list[tuple[str, tuple, dict]]:
    lim = _SIZE_LIMITS["cuda" if device.startswith("cuda") else "cpu"]
    gemm_cap = lim["gemm_flops"]
    dims = _log_range(*lim["gemm_dims"], 2)  # 32, 48, 64, 96, 128, ... 1536, 2048 (CPU)
    out: list[tuple[str, tuple, dict]] = []

    lin = [(1, m, n, k) for m in dims for n in dims for k in dims if 2 * m * n * k <= gemm_cap]
    out += [("linear", s, {}) for s in _spread(lin, FULL_COUNTS["linear"], lambda s: 2 * math.prod(s))]
    small = _log_range(*lim["bmm_dims"], 2)
    bmm = [(b, m, n, k) for b in (2, 4, 8, 16, 32, 64) for m in small for n in small for k in small
           if 2 * b * m * n * k <= gemm_cap]
    out += [("bmm", s, {}) for s in _spread(bmm, FULL_COUNTS["bmm"], lambda s: 2 * math.prod(s))]

    seqs = _log_range(*lim["seq"], 1)
    att = [(b, h, s, s, d, c) for b in (1, 2, 4, 8) for h in (1, 2, 4, 8, 16) for s in seqs
           for d in (32, 64, 128) for c in (False, True) if 4 * b * h * s * s * d <= gemm_cap / 2]
    # a few cross-attention / decoding-like shapes with s_q != s_kv (not causal)
    att += [(b, h, sq, skv, d, False) for b in (1, 4) for h in (4, 8) for sq in (1, 64, 256) for skv in (512, 2048)
            for d in (64, 128) if 4 * b * h * sq * skv * d <= gemm_cap / 2]
    for b, h, sq, skv, d, c in _spread(att, FULL_COUNTS["sdpa"], lambda s: 4 * math.prod(s[:5]) + s[5]):
        out.append(("sdpa", (b, h, sq, skv, d), {"causal": c}))

    rows = _log_range(*lim["rows"], 1)
    cols = _log_range(*lim["cols"], 2)
    rc = [(r, c) for r in rows for c in cols if 4096 <= r * c <= lim["elems"]]
    for op, params in (("layer_norm", {"eps": 1e-5}), ("rms_norm", {"eps": 1e-6}), ("softmax", {}),
                       ("gelu", {}), ("silu", {}), ("add", {}), ("mul", {}), ("dropout", {"p": 0.1})):
        # offset the spread per op so different ops see different aspect ratios of the same sizes
        picks = _spread(rc, FULL_COUNTS[op] * 3, lambda s: s[0] * s[1])
        start = sum(map(ord, op)) % 3
        out += [(op, s, params) for s in picks[start::3][: FULL_COUNTS[op]]]

    emb = [(t, h, v) for t in _log_range(64, lim["emb_tokens"], 1) for h in (128, 256, 512, 768, 1024, 2048, 4096)
           for v in (1000, 8192, 32000, 50257) if t * h <= lim["elems"] and v * h <= lim["emb_elems"]]
    out += [("embedding", (t, h), {"vocab": v})
            for t, h, v in _spread(emb, FULL_COUNTS["embedding"], lambda s: s[0] * s[1] + s[1] * s[2])]

    conv = []
    for b in (1, 4, 16, 32):
        for ci in (3, 16, 32, 64, 128, 256):
            for co in (16, 32, 64, 128, 256):
                for k in (1, 3, 5, 7):
                    for hw in (7, 14, 28, 56, 112, 224):
                        for stride in (1, 2):
                            if k > hw:
                                continue
                            ho = _conv_out(hw, k, stride, k // 2)
                            if 2.0 * b * co * ho * ho * ci * k * k <= gemm_cap and b * ci * hw * hw <= lim["conv_elems"]:
                                conv.append((b, ci, co, k, hw, stride))
    for b, ci, co, k, hw, stride in _spread(conv, FULL_COUNTS["conv2d"],
                                            lambda s: 2.0 * s[0] * s[2] * s[4] ** 2 * s[1] * s[3] ** 2 / s[5] ** 2):
        out.append(("conv2d", (b, ci, co, k, hw, hw), {"stride": stride, "padding": k // 2}))

    ce = [(r, v) for r in _log_range(32, lim["ce_rows"], 1) for v in lim["ce_vocabs"] if r * v <= lim["ce_elems"]]
    out += [("cross_entropy", s, {}) for s in _spread(ce, FULL_COUNTS["cross_entropy"], lambda s: s[0] * s[1])]

    sizes = _log_range(*lim["params"], 2)  # flat parameter of 4 K .. 32 M elements (CPU)
    out += [("adamw", (n, 1), {"clip_grad_norm": 1.0}) for n in _spread(sizes, FULL_COUNTS["adamw"], float)]
    out += [("sgd", (n, 1), {"clip_grad_norm": 1.0}) for n in _spread(sizes, FULL_COUNTS["sgd"], float)]
    return out


# ---------------------------------------------------------------- timing
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


class _Built:
    """Tensors and callables of one case: ``forward()`` returns the output whose backward is timed."""

    def __init__(self, forward: Callable[[], Any], leaves: list, step: Optional[Callable[[], None]] = None):
        self.forward = forward
        self.leaves = leaves
        self.step = step


def _drawn_on(device: str) -> tuple[Any, str]:
    """A generator seeded 0 and the device random inputs are drawn on: a GPU's own (the GPU grid's tensors
    reach 2^28 elements, seconds each on one core), else the CPU."""
    import torch

    where = device if device.startswith("cuda") else "cpu"
    return torch.Generator(device=where).manual_seed(0), where


def _build(case: OpCase, device: str) -> _Built:
    """Allocate the inputs of ``case`` on ``device`` and return its callables."""
    import torch
    import torch.nn.functional as F

    dt = _torch_dtype(case.dtype)
    gen, where = _drawn_on(device)
    # index tensors (embedding, cross entropy) are drawn on the CPU; there, from the same stream as the inputs
    g = gen if where == "cpu" else torch.Generator().manual_seed(0)

    def rnd(*shape, grad=True, dtype=dt, scale=1.0):
        t = (torch.randn(*shape, generator=gen, device=where) * scale).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    op, p, s = case.op, case.params, case.shape
    if op == "linear":
        _b, m, n, k = s
        x, w = rnd(m, k), rnd(n, k, scale=k**-0.5)
        return _Built(lambda: F.linear(x, w), [x, w])
    if op == "bmm":
        b, m, n, k = s
        x, w = rnd(b, m, k), rnd(b, k, n, scale=k**-0.5)
        return _Built(lambda: torch.bmm(x, w), [x, w])
    if op == "sdpa":
        b, h, sq, skv, d = s
        q, k_, v = rnd(b, h, sq, d), rnd(b, h, skv, d), rnd(b, h, skv, d)
        causal = bool(p.get("causal", False))
        return _Built(lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=causal), [q, k_, v])
    if op in ("layer_norm", "rms_norm", "softmax", "gelu", "silu", "add", "mul", "dropout"):
        rows, cols = s
        x = rnd(rows, cols)
        if op == "layer_norm":
            w, bias = rnd(cols), rnd(cols)
            eps = p.get("eps", 1e-5)
            return _Built(lambda: F.layer_norm(x, (cols,), w, bias, eps), [x, w, bias])
        if op == "rms_norm":
            w = rnd(cols)
            eps = p.get("eps", 1e-6)
            if hasattr(F, "rms_norm"):
                return _Built(lambda: F.rms_norm(x, (cols,), w, eps), [x, w])
            return _Built(lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, [x, w])
        if op == "softmax":
            return _Built(lambda: torch.softmax(x, dim=-1), [x])
        if op == "gelu":
            return _Built(lambda: F.gelu(x), [x])
        if op == "silu":
            return _Built(lambda: F.silu(x), [x])
        if op == "dropout":
            prob = float(p.get("p", 0.1))
            return _Built(lambda: F.dropout(x, prob, training=True), [x])
        y = rnd(rows, cols)
        if op == "add":
            return _Built(lambda: x + y, [x, y])
        return _Built(lambda: x * y, [x, y])
    if op == "embedding":
        T, hidden = s
        vocab = p["vocab"]
        w = rnd(vocab, hidden)
        idx = torch.randint(0, vocab, (T,), generator=g).to(device)
        return _Built(lambda: F.embedding(idx, w), [w])
    if op == "conv2d":
        b, ci, co, k, H, W = s
        x, w = rnd(b, ci, H, W), rnd(co, ci, k, k, scale=(ci * k * k) ** -0.5)
        stride, pad = p.get("stride", 1), p.get("padding", 0)
        return _Built(lambda: F.conv2d(x, w, None, stride, pad), [x, w])
    if op == "cross_entropy":
        rows, vocab = s
        logits = rnd(rows, vocab)
        target = torch.randint(0, vocab, (rows,), generator=g).to(device)
        return _Built(lambda: F.cross_entropy(logits, target), [logits])
    if op in ("adamw", "sgd"):
        return _build_optimizer(case, device)
    raise InputError(f"op: no implementation for {op!r}")  # unreachable: OpCase validates op


def _build_optimizer(case: OpCase, device: str) -> _Built:
    """One optimizer step over a flat fp32 parameter of N elements, as the graph's optimizer op:
    gradient-norm clipping, the update, and (mixed precision) the copy to low-precision weights."""
    import torch

    n = case.shape[0]
    prec = case.params.get("precision", "fp32")
    clip = float(case.params.get("clip_grad_norm", 1.0))
    master = torch.nn.Parameter(torch.zeros(n, device=device, dtype=torch.float32))
    gen, where = _drawn_on(device)
    grad = torch.randn(n, generator=gen, device=where).to(device) * 1e-3
    if case.op == "adamw":
        opt = torch.optim.AdamW([master], lr=1e-4, weight_decay=0.01)
    else:
        opt = torch.optim.SGD([master], lr=1e-4)
    low = None if prec == "fp32" else torch.empty(n, device=device, dtype=_torch_dtype(prec))

    def step() -> None:
        master.grad = grad  # the gradient a backward pass left behind (not part of the step)
        torch.nn.utils.clip_grad_norm_([master], clip)
        opt.step()
        if low is not None:
            low.copy_(master.detach())

    return _Built(lambda: None, [], step)


class _Timer:
    """Times one call: perf_counter on CPU, CUDA events + synchronize on CUDA."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.name = "cuda_event" if self.cuda else "perf_counter"
        self.device = device
        if self.cuda:
            import torch

            self._torch = torch

    def sync(self) -> None:
        """Wait for queued device work (no-op on CPU)."""
        if self.cuda:
            # the case's device ("cuda:N"), which need not be the current one
            self._torch.cuda.synchronize(self.device)

    def time_ms(self, fn: Callable[[], Any], calls: int = 1, prepare: Callable[[], None] = lambda: None) -> float:
        """Milliseconds one call of ``fn`` takes on the device: ``calls`` back-to-back calls (CUDA only; each
        after ``prepare``, host work that queues no kernel) between one pair of events, over ``calls``."""
        if self.cuda:
            torch = self._torch
            # the events go on the stream the case's kernels are queued on: the current stream of its
            # device (a bare Event.record() uses the current device's, wrong for "cuda:N" when N is not current)
            stream = torch.cuda.current_stream(self.device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for i in range(calls):
                if i:
                    prepare()
                fn()
            end.record(stream)
            end.synchronize()
            return float(start.elapsed_time(end)) / calls
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


#: On a GPU, the timed calls of one sample span at least this long (ms), at most :data:`GPU_MAX_CALLS` calls.
#: One call timed from an idle GPU includes the host's launch (5-20 µs forward, 30-100 µs for a backward
#: through autograd): most of a small kernel. Back to back, the host queues the next call while the GPU runs
#: this one, as in a training step, and a kernel shorter than its launch is timed at the host's rate.
GPU_MIN_SPAN_MS = 0.5
GPU_MAX_CALLS = 100


def gpu_calls(one_call_ms: float) -> int:
    """Back-to-back calls per timed sample on a GPU for a call that took ``one_call_ms`` alone."""
    if not one_call_ms > 0:
        return GPU_MAX_CALLS
    return max(1, min(GPU_MAX_CALLS, math.ceil(GPU_MIN_SPAN_MS / one_call_ms)))


def _repeat(timer: _Timer, call: Callable[[], Any], prepare: Callable[[], None], warmup: int, repeats: int,
            min_repeats: int, budget_s: float) -> tuple[list[float], int]:
    """Run ``warmup`` untimed calls, then timed samples until ``repeats`` or the time budget
    (never fewer than ``min_repeats``); ``prepare`` runs untimed before each call. A sample is one
    call on CPU and :func:`gpu_calls` back-to-back calls on a GPU. Returns the per-call times of the
    samples and the calls per sample."""
    for _ in range(warmup):
        prepare()
        call()
    timer.sync()
    calls = 1
    if timer.cuda:
        prepare()
        timer.sync()
        calls = gpu_calls(timer.time_ms(call))
    times: list[float] = []
    while len(times) < repeats:
        prepare()
        timer.sync()
        times.append(timer.time_ms(call, calls, prepare))
        if len(times) >= min_repeats and sum(times) * calls >= budget_s * 1e3:
            break
    return times, calls


def _stats(times_ms: list[float]) -> tuple[float, float, float]:
    import numpy as np

    arr = np.asarray(times_ms, dtype=float)
    return float(np.median(arr)), float(np.percentile(arr, 10)), float(np.percentile(arr, 90))


def _default_descriptor_json(device: str, threads: int) -> str:
    from .bench import cached_descriptor_json

    return cached_descriptor_json(device, threads)


def _resolve_device(device: str) -> str:
    if device in ("cuda", "gpu"):
        return "cuda"
    if device.startswith("cuda") or device == "cpu":
        return device
    raise InputError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")


def _in_schema(values: dict) -> dict:
    """``values`` in the column order of OP_COLUMNS (KeyError on a missing column: a bug here)."""
    return {k: values[k] for k in OP_COLUMNS}


def profile_op(case: OpCase, device: str = "cpu", warmup: int = 2, repeats: int = 20, threads: int = 1,
               descriptor: Optional[dict] = None, min_repeats: int = 5, budget_s: float = 0.4) -> list[dict]:
    """Time ``case`` on ``device``: one record per direction, with exactly the OP_COLUMNS keys.

    Args:
        case: what to time.
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:N"``).
        warmup: untimed calls before timing (first-call allocation and kernel selection).
        repeats: most timed calls per direction.
        threads: torch intra-op threads while timing (restored afterwards).
        descriptor: the device descriptor to store in the records (a DeviceSpec dict); default
            :func:`learnedperf.measure.bench.describe_device` of ``device`` and ``threads``,
            measured once per process and cached.
        min_repeats: fewest timed calls once the budget is spent.
        budget_s: timed seconds per direction after which timing stops (at ``min_repeats`` or later).

    Raises:
        UnsupportedCase: the operator or dtype does not run on this device (the reason says why).
        InputError: invalid arguments (device name, repeats...).
    """
    import torch

    device = _resolve_device(device)
    if repeats < 1 or min_repeats < 1 or warmup < 0 or threads < 1:
        raise InputError(f"repeats/min_repeats/warmup/threads: need repeats>=1, min_repeats>=1, warmup>=0, "
                         f"threads>=1, got {repeats}/{min_repeats}/{warmup}/{threads}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedCase(case, "device 'cuda' asked but torch.cuda.is_available() is False")
    if case.dtype != "fp32" and case.kind != "optimizer":
        reason = dtype_skip_reason(device, case.dtype, case.op)
        if reason:
            raise UnsupportedCase(case, reason)
    desc_json = canonical_json(descriptor) if descriptor is not None else _default_descriptor_json(device, threads)
    desc_name = json.loads(desc_json).get("name", "unknown")
    timer = _Timer(device)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    # fp32 is FP32 math, as the data sheets' fp32 peak and NeuSight's fp32 kernels are: cuDNN's convolutions
    # default to TF32 on Ampere and later (matmuls do not), which would make fp32 conv2d records TF32 ones
    prev_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    records = []
    try:
        torch.manual_seed(0)
        built = _build(case, device)
        for direction in case.directions:
            if direction == "opt":
                times, calls = _repeat(timer, built.step, lambda: None, warmup, repeats, min_repeats, budget_s)
            elif direction == "fwd":
                times, calls = _repeat(timer, built.forward, lambda: None, warmup, repeats, min_repeats, budget_s)
            else:
                out = built.forward()
                grad_out = None if out.dim() == 0 else torch.ones_like(out)
                leaves = built.leaves

                def prepare() -> None:
                    for leaf in leaves:
                        leaf.grad = None

                times, calls = _repeat(timer, lambda: out.backward(grad_out, retain_graph=True), prepare, warmup,
                                       repeats, min_repeats, budget_s)
                del out, grad_out
            med, p10, p90 = _stats(times)
            flops, nbytes = flops_bytes(case, direction)
            records.append(_in_schema({
                "op": case.op, "kind": case.kind, "direction": direction,
                "shape": canonical_json(list(case.shape)), "params": canonical_json(case.params),
                "dtype": case.dtype, "flops": float(flops), "bytes": float(nbytes), "world_size": 1,
                "time_ms": med, "time_p10_ms": p10, "time_p90_ms": p90, "repeats": len(times), "warmup": warmup,
                "timer": timer.name + (f"_x{calls}" if calls > 1 else ""), "device_name": desc_name,
                "device": desc_json,
                "backend": "cuda" if device.startswith("cuda") else "cpu", "threads": threads,
                "host": host_name(), "source": "measured", "measured_at": now_utc(),
            }))
    except (RuntimeError, NotImplementedError, MemoryError) as exc:
        # torch reports unsupported dtype/operator combinations and OOM as these
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedCase(case, f"{type(exc).__name__}: {msg[:300]}") from exc
    finally:
        torch.set_num_threads(prev_threads)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev_tf32
    return records


def profile_grid(cases: Iterable[OpCase], device: str = "cpu", warmup: int = 2, repeats: int = 20,
                 threads: int = 1, descriptor: Optional[dict] = None,
                 progress: Optional[Callable[[int, int, OpCase], None]] = None,
                 on_skip: Optional[Callable[[OpCase, str], None]] = None, **timing: Any) -> Iterator[dict]:
    """Profile ``cases`` one after another, yielding records as they are measured.

    Args:
        cases: the cases (e.g. :func:`op_grid`).
        device, warmup, repeats, threads, descriptor: as :func:`profile_op` (the descriptor is
            measured once up front when not given).
        progress: called as ``progress(i, n, case)`` after case ``i`` (1-based) of ``n``.
        on_skip: called as ``on_skip(case, reason)`` for a case that cannot run here; when None the
            :class:`UnsupportedCase` propagates, so no case is ever dropped silently.
        **timing: ``min_repeats`` / ``budget_s`` passed to :func:`profile_op`.
    """
    cases = list(cases)
    device = _resolve_device(device)
    if descriptor is None:
        descriptor = json.loads(_default_descriptor_json(device, threads))
    for i, case in enumerate(cases, start=1):
        try:
            yield from profile_op(case, device, warmup, repeats, threads, descriptor, **timing)
        except UnsupportedCase as exc:
            if on_skip is None:
                raise
            on_skip(case, exc.reason)
        if progress is not None:
            progress(i, len(cases), case)
