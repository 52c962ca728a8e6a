"""Operators and the operator graph.

An :class:`Op` is one kernel-level operation (a GEMM, an attention kernel, a
normalisation, an element-wise pass, a collective) described in the terms the
cost models use: kind, shape, FLOPs, bytes moved to and from device memory,
dtype. An :class:`OpGraph` is a DAG of ops with data-dependency edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

#: Compute operator kinds the cost models know.
COMPUTE_KINDS = ("matmul", "attention", "softmax", "layernorm", "rmsnorm", "elementwise", "embedding",
                 "cross_entropy", "optimizer", "conv", "other")
#: Communication operator kinds.
COMM_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "p2p")


@dataclass(frozen=True, slots=True)
class Group:
    """Placement of a communication group: ``size`` ranks, ``per_node`` of them in each node.

    ``nodes = size / per_node``; ``per_node == size`` means the group never leaves a node.
    """

    size: int
    per_node: int

    @property
    def nodes(self) -> int:
        """Number of nodes (NVLink domains) the group spans."""
        return max(1, self.size // max(1, self.per_node))


@dataclass(frozen=True, slots=True)
class Op:
    """One operator.

    Attributes:
        name: readable name, e.g. ``"layer.attn.qkv"``.
        kind: one of :data:`COMPUTE_KINDS` or :data:`COMM_KINDS`.
        phase: ``"fwd"``, ``"bwd"``, ``"recompute"`` or ``"opt"``.
        flops: floating-point operations (model-FLOPs convention: attention counted in full,
            a causal mask is recorded in ``causal`` so costs can skip masked blocks).
        bytes: bytes read plus written in device memory (compute) or message size (comm).
        dtype: element type name (``"bf16"``...).
        shape: kind-specific dimensions: matmul ``(batch, m, n, k)``; attention
            ``(batch, heads, s_q, s_kv, head_dim)``; others ``(rows, cols)``.
        group: for collectives, the placement of the group.
        causal: attention with a causal mask.
        kernels: kernels the host launches for the op (its time is theirs together): more than one where
            a mixture of experts runs its experts one at a time (``Strategy.moe_grouped_gemm`` false), what
            the host's dispatch is charged for (:func:`~learnedperf.cost.host_bound_s`).
        host_free: launched inside another op's call, so the host is charged no dispatch for it (autocast's
            forward casts: torch.autocast converts a GEMM's inputs within the GEMM's own call).
        chained: how many of ``kernels`` are bare tensor operations an eager chain issues after its first
            (RoPE's or SwiGLU's under eager PyTorch, ``Strategy.fused_elementwise`` false): the host issues
            them at its rate for one tensor operation (``CostModel.chained_dispatch_s``), not at the rate of
            a framework-level operator (``host_dispatch_s``).
        bwd: ``(bytes, kernels, chained)`` of a memory-bound op's backward where it is not the convention of
            :func:`~learnedperf.graph.transformer.backward_of` (twice the forward's traffic, its kernels): an
            eager chain, whose autograd nodes each read and write their own tensors. None: the convention.
        host_weight: host work of each of its dispatches, in dispatches: more than 1 where the framework does
            more around the op than issue it (a recomputed op under ``torch.utils.checkpoint``,
            :data:`~learnedperf.graph.execution.CHECKPOINT_HOST_EXCESS`).
    """

    name: str
    kind: str
    phase: str
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "bf16"
    shape: tuple = ()
    group: Optional[Group] = None
    causal: bool = False
    kernels: int = 1
    host_free: bool = False
    chained: int = 0
    bwd: Optional[tuple] = None
    host_weight: float = 1.0

    @property
    def dispatches(self) -> float:
        """Dispatches the host is charged for at a framework operator's rate (:func:`~learnedperf.cost.host_bound_s`):
        ``kernels`` less the ``chained`` ones, times ``host_weight``, or 0 when ``host_free``."""
        return 0 if self.host_free else (self.kernels - self.chained) * self.host_weight

    @property
    def chained_dispatches(self) -> float:
        """Kernels the host issues at the rate of a bare tensor operation (``chained``), times ``host_weight``,
        0 when ``host_free``."""
        return 0 if self.host_free else self.chained * self.host_weight

    @property
    def is_comm(self) -> bool:
        """True for collectives and point-to-point transfers."""
        return self.kind in COMM_KINDS


@dataclass
class OpGraph:
    """A DAG of operators: ``edges`` are (producer index, consumer index) pairs.

    ``repeat`` lets one block of ops stand for many identical layers: op ``i``
    occurs ``repeat[i]`` times in the real model (default 1), which keeps graphs
    small at any scale.
    """

    ops: list[Op] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    repeat: list[int] = field(default_factory=list)

    def add(self, op: Op, deps: tuple[int, ...] | list[int] = (), repeat: int = 1) -> int:
        """Append ``op`` depending on the ops at indices ``deps``; return its index."""
        idx = len(self.ops)
        self.ops.append(op)
        self.repeat.append(repeat)
        self.edges.extend((d, idx) for d in deps)
        return idx

    def total_flops(self, phase: str | None = None) -> float:
        """Sum of FLOPs (weighted by repeat), optionally of one phase."""
        return sum(op.flops * r for op, r in zip(self.ops, self.repeat) if phase is None or op.phase == phase)

    def total_bytes(self, phase: str | None = None) -> float:
        """Sum of bytes moved (weighted by repeat), optionally of one phase."""
        return sum(op.bytes * r for op, r in zip(self.ops, self.repeat) if phase is None or op.phase == phase)

    def by_kind(self) -> dict[str, float]:
        """FLOPs per operator kind."""
        out: dict[str, float] = {}
        for op, r in zip(self.ops, self.repeat):
            out[op.kind] = out.get(op.kind, 0.0) + op.flops * r
        return out

    def to_dict(self) -> dict:
        """JSON-compatible form (for storage and PyG conversion)."""
        return {
            "ops": [{"name": o.name, "kind": o.kind, "phase": o.phase, "flops": o.flops, "bytes": o.bytes,
                     "dtype": o.dtype, "shape": list(o.shape), "causal": o.causal,
                     **({"group": [o.group.size, o.group.per_node]} if o.group else {})} for o in self.ops],
            "edges": [list(e) for e in self.edges],
            "repeat": list(self.repeat),
        }


# ----------------------------------------------------------------- builders
def matmul(name: str, phase: str, m: int, n: int, k: int, dtype: str, e: int, batch: int = 1) -> Op:
    """A (batched) GEMM ``[m,k] × [k,n]``: 2·m·n·k FLOPs, reads both inputs, writes the output."""
    return Op(name, "matmul", phase, 2.0 * batch * m * n * k, float(batch * (m * k + k * n + m * n) * e),
              dtype, (batch, m, n, k))


def elementwise(name: str, kind: str, phase: str, numel: float, reads: float, writes: float, e: int,
                dtype: str, flops_per_elem: float = 1.0, cols: int = 0) -> Op:
    """A memory-bound pass over ``numel`` elements reading ``reads`` and writing ``writes`` tensors of that size."""
    return Op(name, kind, phase, flops_per_elem * numel, float(numel * (reads + writes) * e), dtype,
              (int(numel // cols) if cols else int(numel), cols or 1))


def comm(name: str, kind: str, phase: str, nbytes: float, group: Group, dtype: str) -> Op:
    """A collective (or p2p) moving a buffer of ``nbytes`` within ``group``."""
    return Op(name, kind, phase, 0.0, float(nbytes), dtype, (), group)
