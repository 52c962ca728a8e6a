"""Collective communication volumes: α-β model per topology level, ring and tree.

For a group of ``n`` ranks with ``k`` in each of ``N = n/k`` nodes and a buffer of
``S`` bytes, NCCL's ring moves per rank (Thakur et al. 2005; NCCL's
``busBw`` convention, nccl-tests doc/PERFORMANCE.md):

* all-reduce: ``2(k-1)/k·S`` over the node link and ``2(N-1)/N·S/k`` over the
  rank's network share (the node's NICs carry ``2(N-1)/N·S`` split over its
  ``k`` rings) — the hierarchical bound;
* all-gather / reduce-scatter: half of that;
* all-to-all: ``(k-1)/n·S`` inside the node, ``(n-k)/n·S`` across;
* point-to-point: ``S`` on the level the two ranks share.

Latency: a ring takes ``2(n-1)`` (all-reduce) or ``n-1`` steps, each at the latency
of the link it crosses. A ring of ``n`` ranks over ``N`` nodes has ``N`` links between
nodes, so a pass of ``n-1`` steps crosses about ``N`` of them and ``n-1-N`` NVLink (intra)
links: ``N·α_inter + (n-1-N)·α_intra`` per pass, twice for an all-reduce. NCCL's tuner
counts a ring's latency the same way, intra steps at the intra latency and inter steps at
the network's (``src/graph/tuning.cc``, ``ncclTopoTuneModel``). Charging every step at the
network latency, as this model did before, made a reduce-scatter plus an all-gather
(ZeRO-1/2) cost ``k`` times an all-reduce's latency on ``k``-GPU nodes and grow without bound
with the data-parallel size. NCCL's tree (double binary tree across nodes, a chain inside)
takes ``2(k-1)`` intra steps plus ``2·log2(N)`` inter steps and moves about ``2·S/k`` per
rank's network share. The faster of the two is used, as NCCL's tuner does.

Every collective call also costs a fixed ``base`` whatever its ranks and size (kernel launch and the
ranks' handshake; NCCL's tuner has a base latency per algorithm beside the per-hop one). Without it,
the per-step latency fitted on NCCL's all-reduce tables has to stand for both: vTrain's A100 tables
(1 MB: 44 µs on 2 GPUs, 93 µs on 8) then put too little latency on small groups and too much on
large ones (``learnedperf.cost.calibrate.fit_nvlink_allreduce_base``). Whole steps say otherwise, so
the shipped base is 0 (``CostParams.collective_base_us``, ``experiments/allreduce_base.py``).
"""

from __future__ import annotations

import math

from ..graph.ops import Op
from .base import CommCost


def collective_cost(op: Op, alpha_intra_s: float, alpha_inter_s: float, bw_intra_Bps: float,
                    bw_inter_Bps: float, base_s: float = 0.0) -> CommCost:
    """Latency and bytes per level of collective ``op`` (see module docstring); ``base_s`` is the fixed
    time of one call, added to the latency of every kind."""
    c = _collective_cost(op, alpha_intra_s, alpha_inter_s, bw_intra_Bps, bw_inter_Bps)
    if base_s and c.algorithm != "none":
        c = CommCost(c.latency_s + base_s, c.intra_bytes, c.inter_bytes, c.algorithm)
    return c


def _collective_cost(op: Op, alpha_intra_s: float, alpha_inter_s: float, bw_intra_Bps: float,
                     bw_inter_Bps: float) -> CommCost:
    g = op.group
    S = op.bytes
    if g is None or g.size <= 1 or S <= 0:
        return CommCost(0.0, 0.0, 0.0, "none")
    n, k = g.size, max(1, g.per_node)
    N = max(1, n // k)
    a_step = alpha_inter_s if N > 1 else alpha_intra_s
    # one pass of a ring: n-1 steps, of which those that cross a node boundary wait on the network
    inter_steps = min(N, n - 1) if N > 1 else 0
    ring_pass_s = inter_steps * alpha_inter_s + (n - 1 - inter_steps) * alpha_intra_s
    kind = op.kind
    if kind == "allreduce":
        ring = CommCost(2 * ring_pass_s, 2 * (k - 1) / k * S, 2 * (N - 1) / N * S / k if N > 1 else 0.0)
        if N <= 2:
            return ring
        tree = CommCost(2 * (k - 1) * alpha_intra_s + 2 * math.log2(N) * alpha_inter_s,
                        2 * (k - 1) / k * S, 2 * S / k, "tree")
        return min((ring, tree), key=lambda c: _standalone(c, bw_intra_Bps, bw_inter_Bps))
    if kind in ("allgather", "reducescatter"):
        return CommCost(ring_pass_s, (k - 1) / k * S, (N - 1) / N * S / k if N > 1 else 0.0)
    if kind == "alltoall":
        return CommCost((n - 1) * a_step if N > 1 else (k - 1) * alpha_intra_s, (k - 1) / n * S,
                        (n - k) / n * S)
    if kind == "p2p":
        # a ring exchange inside the group (context parallelism) or one send between stages
        steps = max(1, n - 1) if n > 2 else 1
        if N > 1:
            return CommCost(steps * alpha_inter_s, 0.0, S, "p2p")
        return CommCost(steps * alpha_intra_s, S, 0.0, "p2p")
    raise ValueError(f"not a collective: {kind}")


def _standalone(c: CommCost, bw_intra: float, bw_inter: float) -> float:
    return c.latency_s + max(c.intra_bytes / bw_intra if c.intra_bytes else 0.0,
                             c.inter_bytes / bw_inter if c.inter_bytes else 0.0)
