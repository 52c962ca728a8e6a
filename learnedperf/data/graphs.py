"""The graph store: a compact, PyG-friendly execution graph per run, in Parquet.

The graph of a run is its :class:`~learnedperf.graph.execution.ExecutionGraph`
coarsened so that its size does not grow with the cluster:

* one representative rank per pipeline stage (data-, tensor-, context-parallel
  replicas do the same work), and consecutive stages with identical programs
  (same chunks, same layer blocks) merged into one *stage group* with a
  ``stage_repeat`` count — a 64-stage pipeline of identical middle stages has
  three groups, not 64;
* identical layers as one block of ops with a ``repeat`` count;
* per op, ``per_iteration``: how often one rank runs it in an iteration
  (micro-batches for forward/backward ops, 1 for the optimizer, the number of
  buckets for gradient reduction).

Nodes are ops (compute kernels and collectives) with numeric features
(:data:`NODE_FEATURES`); edges are typed (:data:`EDGE_TYPES`): ``data`` (op order
within a chunk's forward or backward), ``pipeline`` (activations / gradients
between virtual stages through a p2p node), ``gradient`` (backward → gradient
reduction → optimizer) and ``control`` (forward → backward of a chunk, parameter
gathers before the ops that need them, backward → optimizer).

Storage: one Parquet file per shard, one row per run: ``run_id``, ``num_nodes``,
``num_edges`` and one list column per node feature (``node_<name>``) and per edge
array (``edge_src``, ``edge_dst``, ``edge_type``). No pickles. :func:`load_graph`
returns numpy arrays, ready for ``torch_geometric.data.Data(x=..., edge_index=...)``.
"""

from __future__ import annotations

import math
from itertools import chain
from pathlib import Path
from typing import Any, Iterator

from ..errors import InputError

GRAPH_SCHEMA_VERSION = 1
"""Version of the graph store layout and feature codes."""

#: Operator kinds in code order (node feature ``kind`` is the index).
KINDS = ("matmul", "attention", "softmax", "layernorm", "rmsnorm", "elementwise", "embedding", "cross_entropy",
         "optimizer", "conv", "other", "allreduce", "allgather", "reducescatter", "alltoall", "p2p")
#: Phases in code order.
PHASES = ("fwd", "bwd", "recompute", "opt")
#: Dtypes in code order.
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: Edge types in code order.
EDGE_TYPES = ("data", "pipeline", "gradient", "control")

#: Node feature → (Arrow type, meaning). Stored as ``node_<name>`` list columns.
NODE_FEATURES: dict[str, tuple[str, str]] = {
    "kind": ("int8", "index into KINDS"),
    "phase": ("int8", "index into PHASES"),
    "dtype": ("int8", "index into DTYPES"),
    "flops": ("float64", "FLOPs of one execution"),
    "bytes": ("float64", "bytes moved in memory (compute) or message bytes (collectives) of one execution"),
    "time_s": ("float64", "the cost model's seconds for one execution on idle links (NaN if it cannot say)"),
    "repeat": ("int32", "identical layers this op stands for (block repeat)"),
    "per_iteration": ("int32", "executions per iteration per layer on one rank (micro-batches, buckets, 1)"),
    "stage": ("int32", "first pipeline stage of the node's stage group"),
    "stage_repeat": ("int32", "pipeline stages of the group (identical programs)"),
    "chunk": ("int32", "model chunk (virtual stage slot) on the rank, 0..v-1"),
    "is_comm": ("bool", "collective or point-to-point transfer"),
    "group_size": ("int32", "ranks of the collective's group (1 for compute)"),
    "group_per_node": ("int32", "of which in one node (1 for compute)"),
    "shape": ("int64", "5 ints per node: the Op.shape (matmul b,m,n,k; attention b,h,s_q,s_kv,d; others rows,cols), "
                       "zero-padded"),
}
SHAPE_WIDTH = 5
_KIND = {k: i for i, k in enumerate(KINDS)}
_PHASE = {k: i for i, k in enumerate(PHASES)}
_DTYPE = {k: i for i, k in enumerate(DTYPES)}
_DATA, _PIPE, _GRAD, _CTRL = range(4)


#: Order of the values in a node row (the per-op features first, then the placement); ``shape`` is
#: the five values ``shape0`` .. ``shape4``. Rows are flat numbers so that a shard's nodes become one
#: float64 matrix in a single numpy call.
_ROW = ("kind", "phase", "dtype", "flops", "bytes", "time_s", "is_comm", "group_size", "group_per_node",
        "shape0", "shape1", "shape2", "shape3", "shape4", "repeat", "per_iteration", "stage", "stage_repeat", "chunk")
_SHAPE_COL = _ROW.index("shape0")


class GraphBuilder:
    """Accumulates the nodes (one tuple per node, in :data:`_ROW` order) and typed edges of one graph."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.etype: list[int] = []
        self._pipe: set[tuple[int, int]] = set()

    @property
    def num_nodes(self) -> int:
        """Nodes added so far."""
        return len(self.rows)


    def node(self, features: tuple, repeat: int, per_iteration: int, stage: int, stage_repeat: int,
             chunk: int) -> int:
        """Add a node with per-op ``features`` (see :func:`op_features`); returns its index."""
        self.rows.append(features + (repeat, per_iteration, stage, stage_repeat, chunk))
        return len(self.rows) - 1

    def edge(self, src: int, dst: int, etype: int) -> None:
        """Add an edge (pipeline edges once: merged stage groups repeat them)."""
        if etype == _PIPE:
            if (src, dst) in self._pipe:
                return
            self._pipe.add((src, dst))
        self.src.append(src)
        self.dst.append(dst)
        self.etype.append(etype)


def op_features(op: Any, time_s: float) -> tuple:
    """The per-op part of a node row: kind, phase, dtype, flops, bytes, time, comm placement, shape."""
    is_comm = op.group is not None
    shape = tuple(int(x) for x in op.shape[:SHAPE_WIDTH])
    return (_KIND.get(op.kind, _KIND["other"]), _PHASE.get(op.phase, 0), _DTYPE.get(op.dtype, 0), float(op.flops),
            float(op.bytes), time_s, is_comm, op.group.size if is_comm else 1, op.group.per_node if is_comm else 1,
            *shape, *(0,) * (SHAPE_WIDTH - len(shape)))


def node_op(graph: dict, i: int) -> Any:
    """The :class:`~learnedperf.graph.ops.Op` that node ``i`` of a graph dict (:func:`load_graph`,
    :func:`graph_of`) stands for: the inverse of :func:`op_features` for what a node stores (kind,
    phase, dtype, FLOPs, bytes, shape). The causal flag and the collective's group are not stored."""
    from ..graph.ops import Op

    shape = tuple(int(x) for x in graph["shape"][i] if x > 0)  # shapes are zero-padded to SHAPE_WIDTH
    return Op("node", KINDS[int(graph["kind"][i])], PHASES[int(graph["phase"][i])], float(graph["flops"][i]),
              float(graph["bytes"][i]), DTYPES[int(graph["dtype"][i])], shape)


def _stage_signature(stage: Any) -> tuple:
    """What makes two stage programs identical: their chunks' op blocks, repeats and parameters."""
    return tuple((tuple((id(ops), rep) for ops, rep in c.forward), c.num_layers, c.params) for c in stage.chunks)


def build_graph(eg: Any, cost: Any) -> GraphBuilder:
    """The coarsened graph of execution graph ``eg`` with op times from cost model ``cost``."""
    from ..graph.execution import gradient_buckets, replica_allreduce, stage_of
    from ..graph.ops import Group, comm

    run = eg.run
    s = run.strategy
    pp, v = s.pp, s.virtual_pipeline_stages
    n_v = pp * v
    m = run.num_microbatches  # the run's own (eg may be compiled with a shortened schedule)
    zero = s.effective_zero_stage
    g = GraphBuilder()

    memo: dict[int, tuple] = {}
    keep: list = []  # ops whose id() is memoised stay alive until the end

    def feat(op: Any) -> tuple:
        # identical layers and stages share their op objects: features and cost once per object
        f = memo.get(id(op))
        if f is None:
            try:
                t = float(cost.comm_time_s(op) if op.is_comm else cost.compute_time_s(op))
            except Exception:  # noqa: BLE001 - e.g. a link the hardware does not describe: unknown, not fatal
                t = math.nan
            f = memo[id(op)] = op_features(op, t)
            keep.append(op)
        return f

    block_memo: dict[int, list] = {}

    def block_feats(ops: list) -> list:
        # a block's op list is shared by every stage holding those layers: its features once
        fs = block_memo.get(id(ops))
        if fs is None:
            fs = block_memo[id(ops)] = [feat(op) for op in ops]
            keep.append(ops)
        return fs

    # stage groups: consecutive identical stage programs
    groups: list[tuple[int, int]] = []  # (first stage, count)
    prev = None
    for st in eg.stages:
        sig = _stage_signature(st)
        if groups and sig == prev:
            groups[-1] = (groups[-1][0], groups[-1][1] + 1)
        else:
            groups.append((st.index, 1))
        prev = sig
    group_of_stage = {}
    for gi, (first, count) in enumerate(groups):
        for st in range(first, first + count):
            group_of_stage[st] = gi

    # per (group, chunk): first/last node of forward and backward
    f_first: dict[tuple[int, int], int] = {}
    f_last: dict[tuple[int, int], int] = {}
    b_first: dict[tuple[int, int], int] = {}
    b_last: dict[tuple[int, int], int] = {}
    opt_node: dict[int, int] = {}
    pbytes, gbytes = eg.param_bytes_per_param, eg.grad_bytes_per_param
    for gi, (first, count) in enumerate(groups):
        stage = eg.stages[first]
        grad_nodes: list[int] = []
        for ci, chunk in enumerate(stage.chunks):
            for blocks, table_first, table_last in ((chunk.forward, f_first, f_last),
                                                    (chunk.backward, b_first, b_last)):
                last = -1
                for ops, rep in blocks:
                    fs = block_feats(ops)
                    if not fs:
                        continue
                    i0, k = len(g.rows), len(fs)
                    tail = (rep, m, first, count, ci)
                    g.rows.extend([f + tail for f in fs])
                    # data edges: the previous block's last op, then op by op along the block
                    if last >= 0:
                        g.edge(last, i0, _DATA)
                    else:
                        table_first[(gi, ci)] = i0
                    g.src.extend(range(i0, i0 + k - 1))
                    g.dst.extend(range(i0 + 1, i0 + k))
                    g.etype.extend([_DATA] * (k - 1))
                    last = i0 + k - 1
                if last >= 0:
                    table_last[(gi, ci)] = last
            if not s.forward_only:
                g.edge(f_last[(gi, ci)], b_first[(gi, ci)], _CTRL)
            if s.per_layer_sharding and eg.shard_group.size > 1:
                # one gather (forward; again for backward when fully sharded) and one reduce-scatter per layer;
                # a forward-only step gathers for its forward only
                layers = max(1, chunk.num_layers)
                phases = ((("fwd", f_first), ("bwd", b_first)) if zero >= 3 and not s.forward_only
                          else (("fwd", f_first),))
                for phase, target in phases:
                    op = comm(f"chunk.fsdp_allgather.{phase}", "allgather", phase, chunk.params / layers * pbytes,
                              eg.shard_group, s.precision)
                    g.edge(g.node(feat(op), layers, m, first, count, ci), target[(gi, ci)], _CTRL)
                if s.forward_only:
                    continue
                op = comm("chunk.fsdp_reducescatter", "reducescatter", "bwd", chunk.params / layers * gbytes,
                          eg.shard_group, s.reduce_precision)
                rs = g.node(feat(op), layers, m, first, count, ci)
                g.edge(b_last[(gi, ci)], rs, _GRAD)
                follow = replica_allreduce(eg, op)
                if follow is not None:  # hybrid sharding: once an iteration, after the last reduce-scatter
                    ar = g.node(feat(follow), layers, 1, first, count, ci)
                    g.edge(rs, ar, _GRAD)
                    rs = ar
                grad_nodes.append(rs)
            else:
                if zero in (1, 2) and eg.shard_group.size > 1:
                    op = comm("chunk.param_allgather", "allgather", "fwd", chunk.params * pbytes, eg.shard_group,
                              s.precision)
                    g.edge(g.node(feat(op), 1, 1, first, count, ci), f_first[(gi, ci)], _CTRL)
                for op, nb in gradient_buckets(eg, chunk):
                    i = g.node(feat(op), nb, 1, first, count, ci)
                    g.edge(b_last[(gi, ci)], i, _GRAD)
                    follow = replica_allreduce(eg, op)
                    if follow is not None:  # hybrid sharding: each bucket's shard over the replicas
                        ar = g.node(feat(follow), nb, 1, first, count, ci)
                        g.edge(i, ar, _GRAD)
                        i = ar
                    grad_nodes.append(i)
        if eg.tied_embedding_bytes and pp > 1 and (first == 0 or first + count - 1 == pp - 1):
            op = comm("tied_embedding_allreduce", "allreduce", "bwd", eg.tied_embedding_bytes,
                      Group(2, 2 if eg.p2p_group.per_node >= pp else 1), s.reduce_precision)
            i = g.node(feat(op), 1, 1, first, count, 0)
            g.edge(b_last[(gi, 0)], i, _GRAD)
            grad_nodes.append(i)
        last_opt = -1
        for op in stage.optimizer:
            i = g.node(feat(op), 1, 1, first, count, 0)
            if last_opt < 0:
                opt_node[gi] = i
                for ci in range(len(stage.chunks)):
                    g.edge(b_last[(gi, ci)], i, _CTRL)
                for gn in grad_nodes:
                    g.edge(gn, i, _GRAD)
            else:
                g.edge(last_opt, i, _DATA)
            last_opt = i

    # pipeline: virtual stage vs → vs+1 (forward activations) and back (gradients), through p2p nodes; chunk
    # vs // pp of its rank (interleaved or in a V), where the turn of a V hands them over in place
    if n_v > 1:
        send_f: dict[tuple[int, int], int] = {}
        send_b: dict[tuple[int, int], int] = {}
        for vs in range(n_v - 1):
            rank_a, rank_b = stage_of(vs, pp, s.v_shape), stage_of(vs + 1, pp, s.v_shape)
            a = (group_of_stage[rank_a], vs // pp)
            b = (group_of_stage[rank_b], (vs + 1) // pp)
            if rank_a == rank_b:
                g.edge(f_last[a], f_first[b], _DATA)
                if not s.forward_only:
                    g.edge(b_last[b], b_first[a], _DATA)
                continue
            stage_a, count_a = groups[a[0]]
            stage_b, count_b = groups[b[0]]
            if a not in send_f:
                op = comm("pipeline.send_activations", "p2p", "fwd", eg.p2p_bytes, eg.p2p_group, s.precision)
                send_f[a] = g.node(feat(op), 1, m, stage_a, count_a, a[1])
                g.edge(f_last[a], send_f[a], _PIPE)
            g.edge(send_f[a], f_first[b], _PIPE)
            if s.forward_only:
                continue
            if b not in send_b:
                op = comm("pipeline.send_gradients", "p2p", "bwd", eg.p2p_bytes, eg.p2p_group, s.precision)
                send_b[b] = g.node(feat(op), 1, m, stage_b, count_b, b[1])
                g.edge(b_last[b], send_b[b], _PIPE)
            g.edge(send_b[b], b_first[a], _PIPE)
    return g


def graph_of(eg: Any, cost: Any) -> dict:
    """The coarsened graph of ``eg`` as numpy arrays (the dict :func:`load_graph` returns, without run_id)."""
    return _to_numpy(build_graph(eg, cost))


def _node_matrix(rows: list[tuple]):
    """The node rows as one float64 matrix (every value is a number below 2^53: exact)."""
    import numpy as np

    # fromiter over the flat values is several times faster than np.array on a list of tuples
    return np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=len(rows) * len(_ROW)).reshape(-1, len(_ROW))


def _to_numpy(gb: GraphBuilder) -> dict:
    import numpy as np

    mat = _node_matrix(gb.rows)
    out: dict[str, Any] = {}
    for name, (t, _d) in NODE_FEATURES.items():
        if name == "shape":
            out[name] = mat[:, _SHAPE_COL:_SHAPE_COL + SHAPE_WIDTH].astype(np.int64)
        else:
            out[name] = mat[:, _ROW.index(name)].astype(np.bool_ if t == "bool" else t)
    out["edge_index"] = np.asarray([gb.src, gb.dst], dtype=np.int64).reshape(2, -1)
    out["edge_type"] = np.asarray(gb.etype, dtype=np.int8)
    out["num_nodes"] = gb.num_nodes
    return out


# ------------------------------------------------------------------ storage
def graph_arrow_schema():
    """The :mod:`pyarrow` schema of a graph shard."""
    import pyarrow as pa

    fields = [pa.field("run_id", pa.string()), pa.field("num_nodes", pa.int64()), pa.field("num_edges", pa.int64())]
    for name, (t, _d) in NODE_FEATURES.items():
        fields.append(pa.field(f"node_{name}", pa.list_(getattr(pa, "bool_" if t == "bool" else t)())))
    fields += [pa.field("edge_src", pa.list_(pa.int32())), pa.field("edge_dst", pa.list_(pa.int32())),
               pa.field("edge_type", pa.list_(pa.int8()))]
    return pa.schema(fields)


def graphs_table(run_ids: list[str], graphs: list[GraphBuilder]):
    """One :class:`pyarrow.Table` row per graph: flat numpy value arrays with offsets, no per-row objects."""
    import numpy as np
    import pyarrow as pa

    schema = graph_arrow_schema()
    node_off = np.zeros(len(graphs) + 1, dtype=np.int32)
    node_off[1:] = np.cumsum([gb.num_nodes for gb in graphs])
    edge_off = np.zeros(len(graphs) + 1, dtype=np.int32)
    edge_off[1:] = np.cumsum([len(gb.src) for gb in graphs])
    mat = _node_matrix([r for gb in graphs for r in gb.rows])
    cols: dict[str, Any] = {
        "run_id": pa.array(run_ids, pa.string()),
        "num_nodes": pa.array(np.diff(node_off).astype(np.int64)),
        "num_edges": pa.array(np.diff(edge_off).astype(np.int64)),
    }
    offsets = pa.array(node_off)
    for name, (t, _d) in NODE_FEATURES.items():
        if name == "shape":
            flat = mat[:, _SHAPE_COL:_SHAPE_COL + SHAPE_WIDTH].astype(np.int64).ravel()
            cols["node_shape"] = pa.ListArray.from_arrays(pa.array(node_off * SHAPE_WIDTH), pa.array(flat))
        else:
            values = mat[:, _ROW.index(name)].astype(np.bool_ if t == "bool" else t)
            cols[f"node_{name}"] = pa.ListArray.from_arrays(offsets, pa.array(values))
    eoff = pa.array(edge_off)
    for name, attr, dtype in (("edge_src", "src", np.int32), ("edge_dst", "dst", np.int32),
                              ("edge_type", "etype", np.int8)):
        values = np.fromiter(chain.from_iterable(getattr(gb, attr) for gb in graphs), dtype=dtype,
                             count=int(edge_off[-1]))
        cols[name] = pa.ListArray.from_arrays(eoff, pa.array(values))
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


def _graph_files(store_dir: Path) -> list[Path]:
    base = store_dir / "_graphs" if (store_dir / "_graphs").is_dir() else store_dir
    return sorted(base.glob("*.parquet"))


def _row_to_graph(table, row: int) -> dict:
    import numpy as np

    rec = table.slice(row, 1)
    out: dict[str, Any] = {"run_id": rec.column("run_id")[0].as_py(), "num_nodes": rec.column("num_nodes")[0].as_py()}
    for name, (t, _d) in NODE_FEATURES.items():
        values = rec.column(f"node_{name}").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        arr = np.asarray(values, dtype=np.bool_ if t == "bool" else t)
        out[name] = arr.reshape(-1, SHAPE_WIDTH) if name == "shape" else arr
    src = rec.column("edge_src").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    dst = rec.column("edge_dst").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    out["edge_index"] = np.stack([np.asarray(src, np.int64), np.asarray(dst, np.int64)])
    out["edge_type"] = np.asarray(rec.column("edge_type").combine_chunks().flatten().to_numpy(zero_copy_only=False),
                                  np.int8)
    return out


def load_graph(store_dir: str | Path, run_id: str, shard: str | None = None) -> dict:
    """The graph of ``run_id`` as numpy arrays.

    Args:
        store_dir: a generated data set directory (its ``_graphs/`` is searched) or a graph store directory.
        run_id: the record's ``run_id``.
        shard: the record's ``graph_shard`` (relative to the data set), to skip the search.

    Returns:
        ``{"run_id", "num_nodes", <every NODE_FEATURES name>: array (shape: (N, 5)), "edge_index": (2, E) int64,
        "edge_type": (E,) int8}``.

    Raises:
        InputError: no graph of that run id in the store.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    store_dir = Path(store_dir)
    files = [store_dir / shard] if shard else _graph_files(store_dir)
    for f in files:
        try:
            ids = pq.read_table(f, columns=["run_id"]).column("run_id")
        except (OSError, ValueError) as exc:
            raise InputError(f"{f}: cannot read graph shard: {exc}") from None
        hits = pc.index(ids, run_id).as_py()
        if hits >= 0:
            return _row_to_graph(pq.read_table(f), hits)
    raise InputError(f"{store_dir}: no graph for run_id {run_id!r}")


def load_graphs(store_dir: str | Path, refs: list[tuple[str, int]]) -> list[dict]:
    """The graphs at ``refs`` (a record's ``(graph_shard, graph_row)``), each shard read once, in ``refs`` order.

    Raises:
        InputError: a shard cannot be read or has no such row (the message names the shard).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    store_dir = Path(store_dir)
    out: list[Any] = [None] * len(refs)
    by_shard: dict[str, list[int]] = {}
    for i, (shard, _row) in enumerate(refs):
        by_shard.setdefault(shard, []).append(i)
    for shard, idx in by_shard.items():
        try:
            table = pq.read_table(store_dir / shard)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{store_dir / shard}: cannot read graph shard: {exc}") from None
        for i in idx:
            row = int(refs[i][1])
            if not 0 <= row < table.num_rows:
                raise InputError(f"{store_dir / shard}: no row {row} (the shard has {table.num_rows})")
            out[i] = _row_to_graph(table, row)
    return out


def iter_graphs(store_dir: str | Path) -> Iterator[dict]:
    """Every graph of a store, shard by shard, as :func:`load_graph` returns them."""
    import pyarrow.parquet as pq

    for f in _graph_files(Path(store_dir)):
        table = pq.read_table(f)
        for row in range(table.num_rows):
            yield _row_to_graph(table, row)


__all__ = ["DTYPES", "EDGE_TYPES", "GRAPH_SCHEMA_VERSION", "GraphBuilder", "KINDS", "NODE_FEATURES", "PHASES",
           "SHAPE_WIDTH", "build_graph", "op_features", "graph_arrow_schema", "graph_of", "graphs_table", "iter_graphs",
           "load_graph", "load_graphs", "node_op"]
