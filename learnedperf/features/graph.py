"""Graph features: one versioned schema for the nodes, edges and run of an execution graph.

The graph-level model (:mod:`learnedperf.models.gnn`) sees a run as three
matrices, each with a named, ordered :class:`~learnedperf.features.ops.FeatureSchema`:

* :data:`NODE_FEATURE_SCHEMA` — one row per node of the coarsened execution graph
  (:mod:`learnedperf.data.graphs`): op kind / phase / dtype one-hots, log FLOPs and
  bytes, the cost model's time of one execution (and optionally a learned one), how
  often the node runs per iteration, its share of the graph's total time, its
  collective group and its place in the pipeline;
* :data:`EDGE_FEATURE_SCHEMA` — one-hot of the edge type (:data:`~learnedperf.data.graphs.EDGE_TYPES`);
* :data:`GLOBAL_FEATURE_SCHEMA` — one vector per run: parallelism, batch, precision,
  device and link data-sheet figures, model size, the ideal (peak-FLOP/s) time, and the
  simulator's iteration time and breakdown (:data:`SIMULATOR_GLOBAL_FEATURES`; a model
  that must not rely on the simulator zeroes these columns).

:data:`GRAPH_FEATURE_SCHEMA_VERSION` covers all three; :func:`graph_feature_schema_dict`
is what a checkpoint stores and compares on load. All logarithms are natural; times in
the node features are seconds, in the global features milliseconds (as the records).

Every function takes plain numpy arrays / run specs and returns ``float32`` numpy
arrays, all finite; malformed input raises :class:`~learnedperf.errors.InputError`
naming what is wrong. Importing this module loads no numpy, pandas or torch: they are
imported inside the functions.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from ..data.graphs import DTYPES, EDGE_TYPES, KINDS, NODE_FEATURES, PHASES, SHAPE_WIDTH
from ..errors import InputError
from .ops import FeatureSchema

GRAPH_FEATURE_SCHEMA_VERSION = 11
"""Version of the node, edge and global feature schemas together; bumped on any change of names,
order or meaning (checkpoints refuse to load under another version)."""

#: Floor of a node time in seconds (1 ns): keeps the log finite for free ops (e.g. a zero-byte collective).
MIN_TIME_S = 1e-9
#: Floor of a node's time share: a node of zero (or unknown) time gets log(1e-12), far below any real share.
MIN_SHARE = 1e-12
#: Parts of the simulator's breakdown, in column order (each is a ``<part>_ms`` record column).
BREAKDOWN_PARTS = ("forward", "backward", "recompute", "compute", "optimizer", "exposed_communication",
                   "pipeline_bubble")
#: Record column of the simulator's iteration time.
SIM_TIME_COLUMN = "sim_iteration_time_ms"

_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "interleaved-zb")
_RECOMPUTE = ("none", "selective", "full")
_ZERO_STAGES = (0, 1, 2, 3)


# ------------------------------------------------------------------ schemas
def _node_features() -> tuple[tuple[str, str], ...]:
    f: list[tuple[str, str]] = []
    f += [(f"kind={k}", f"1 if the node's op kind is {k!r}") for k in KINDS]
    f += [(f"phase={p}", f"1 if the node's phase is {p!r}") for p in PHASES]
    f += [(f"dtype={d}", f"1 if the node's element type is {d!r}") for d in DTYPES]
    f += [("log1p_flops", "log(1 + FLOPs of one execution)"),
          ("log1p_bytes", "log(1 + bytes of one execution: memory traffic, or message bytes of a collective)"),
          ("log_time_s", "log(max(time_s, 1 ns)): the cost model's seconds for one execution; 0 if unknown"),
          ("log_learned_time_s", "log(max(t, 1 ns)) of a learned per-op time in seconds where one is given "
                                 "and finite, else the cost model's time (same as log_time_s); 0 if unknown"),
          ("time_unknown", "1 if the cost model could not time the node (time_s is NaN)"),
          ("log_repeat", "log(repeat): identical layers the node stands for"),
          ("log_per_iteration", "log(per_iteration): executions per iteration per layer on one rank"),
          ("log_time_share", "log(max(share, 1e-12)), share = time_s·repeat·per_iteration over the sum of the "
                             "same over all nodes (unknown times count 0)"),
          ("is_comm", "1 for a collective or point-to-point transfer"),
          ("log_group_size", "log(ranks of the collective's group); 0 for compute"),
          ("group_frac_in_node", "group_per_node / group_size: fraction of the group inside one node "
                                 "(1 for compute)"),
          ("stage_position", "stage / last stage (max of stage + stage_repeat - 1 over the graph); 0 without "
                             "a pipeline"),
          ("log_stage_repeat", "log(stage_repeat): identical pipeline stages the node's stage group stands for"),
          ("chunk", "model chunk (virtual stage slot) on the rank, 0..v-1")]
    f += [(f"log1p_shape{i}", f"log(1 + shape[{i}]) in the op kind's shape convention, 0 if absent")
          for i in range(SHAPE_WIDTH)]
    return tuple(f)


def _global_features() -> tuple[tuple[str, str], ...]:
    f: list[tuple[str, str]] = []
    f += [("log_num_devices", "log(devices of the run)")]
    f += [(f"log_{k}", f"log({k}): {what}-parallel size") for k, what in
          (("tp", "tensor"), ("pp", "pipeline"), ("dp", "data"), ("cp", "context"), ("ep", "expert"))]
    f += [("log_num_nodes", "log(nodes / NVLink domains the devices occupy)"),
          ("log_node_size", "log(devices per node actually used)")]
    f += [(f"zero_stage={z}", f"1 if the effective ZeRO stage is {z} (FSDP: 3, or 2 for SHARD_GRAD_OP)")
          for z in _ZERO_STAGES]
    f += [("fsdp", "1 with PyTorch FSDP (per-layer gathers through copy-in/copy-out buffers)"),
          ("log_dp_replicate", "log(copies of the sharded states): hybrid sharding, 0 = one copy")]
    f += [(f"recompute={r}", f"1 if activation recomputation is {r!r}") for r in _RECOMPUTE]
    f += [("sequence_parallel", "1 with Megatron sequence parallelism"),
          ("forward_only", "1 for a forward-only step (no backward, gradients or optimizer)"),
          ("deepep", "1 if expert tokens go once per rank and node (moe_dispatcher 'deepep')"),
          ("overlap_moe_comm", "1 if expert all-to-alls run beside another micro-batch's computation")]
    f += [(f"schedule={s}", f"1 if the pipeline schedule is {s!r}") for s in _SCHEDULES]
    f += [("log_virtual_pipeline_stages", "log(model chunks per pipeline rank)"),
          ("log_micro_batch_size", "log(sequences per micro-batch)"),
          ("log_num_microbatches", "log(micro-batches per pipeline per iteration)")]
    f += [(f"precision={p}", f"1 if the training precision is {p!r}") for p in DTYPES]
    f += [("autocast", "1 if fp32 weights are cast to the precision at every GEMM (torch.autocast)")]
    f += [("log_peak_flops", "log(peak FLOP/s of the run's precision; the fp32 peak if the device has none)"),
          ("log_mem_bw_Bps", "log(device memory bandwidth in bytes/s)"),
          ("log_device_memory_GiB", "log(device memory in GiB)"),
          ("log_intra_node_bw_Bps", "log(intra-node link bytes/s per device and direction); 0 if unknown or "
                                    "unused (one device per node)"),
          ("intra_node_bw_unknown", "1 if the run uses intra-node links and the hardware gives no bandwidth"),
          ("log_inter_node_bw_Bps", "log(inter-node link bytes/s per device and direction); 0 if unknown or "
                                    "unused (one node)"),
          ("inter_node_bw_unknown", "1 if the run uses inter-node links and the hardware gives no bandwidth")]
    f += [("log_num_params", "log(model parameters)"),
          ("log_num_layers", "log(transformer layers)"),
          ("log_hidden_size", "log(hidden size)"),
          ("log_seq_length", "log(training sequence length)"),
          ("log_tokens_per_iteration", "log(global_batch_size · seq_length)"),
          ("log_ideal_time_s", "log(model FLOPs per iteration / (num_devices · peak FLOP/s)): the iteration "
                               "time at 100 % MFU, in seconds")]
    f += [("log_sim_time_ms", "log(the simulator's iteration time in ms)")]
    f += [(f"frac_{p}", f"simulator breakdown: {p}_ms / iteration time") for p in BREAKDOWN_PARTS]
    return tuple(f)


#: Node features of the graph schema (version :data:`GRAPH_FEATURE_SCHEMA_VERSION`).
NODE_FEATURE_SCHEMA = FeatureSchema(name="graph.node", version=GRAPH_FEATURE_SCHEMA_VERSION,
                                    features=_node_features())
#: Edge features: one-hot of the edge type.
EDGE_FEATURE_SCHEMA = FeatureSchema(name="graph.edge", version=GRAPH_FEATURE_SCHEMA_VERSION,
                                    features=tuple((f"edge_type={t}", f"1 if the edge type is {t!r}")
                                                   for t in EDGE_TYPES))
#: Run-level features.
GLOBAL_FEATURE_SCHEMA = FeatureSchema(name="graph.global", version=GRAPH_FEATURE_SCHEMA_VERSION,
                                      features=_global_features())
#: Global columns that come from the simulator (zeroed by models that must not use it).
SIMULATOR_GLOBAL_FEATURES: tuple[str, ...] = ("log_sim_time_ms",) + tuple(f"frac_{p}" for p in BREAKDOWN_PARTS)


def graph_feature_schema_dict() -> dict:
    """The three graph feature schemas as JSON (stored in every graph-model checkpoint)."""
    return {"version": GRAPH_FEATURE_SCHEMA_VERSION, "node": NODE_FEATURE_SCHEMA.to_dict(),
            "edge": EDGE_FEATURE_SCHEMA.to_dict(), "global": GLOBAL_FEATURE_SCHEMA.to_dict(),
            "simulator_global_features": list(SIMULATOR_GLOBAL_FEATURES)}


# ------------------------------------------------------------------ helpers
def _stack(schema: FeatureSchema, cols: dict, n: int):
    """The (n, F) float32 matrix of ``cols`` in schema order (every schema name exactly once)."""
    import numpy as np

    names = schema.names
    if set(cols) != set(names):  # a programming error in this module, not bad input
        raise AssertionError(f"{schema.name}: columns {sorted(set(cols) ^ set(names))} differ from the schema")
    out = np.empty((n, len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        out[:, j] = cols[name]
    if not np.all(np.isfinite(out)):
        bad = [names[j] for j in range(len(names)) if not np.all(np.isfinite(out[:, j]))]
        raise InputError(f"{schema.name} features: non-finite value(s) in {bad}")
    return out.astype(np.float32)


def _array(graph: Mapping, name: str, n: int | None, width: int | None = None):
    """``graph[name]`` as a float64 array of shape (n,) (or (n, width)), checked."""
    import numpy as np

    if name not in graph:
        raise InputError(f"graph: missing array {name!r}")
    try:
        a = np.asarray(graph[name], dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"graph: {name!r} is not numeric") from None
    want = (n,) if width is None else (n, width)
    if a.ndim != len(want) or (n is not None and a.shape[0] != n) or (width is not None and a.shape[1] != width):
        raise InputError(f"graph: {name!r} has shape {a.shape}, expected {want} (one row per node / edge)")
    return a


def _codes(a, name: str, vocab: tuple) -> "Any":
    import numpy as np

    if a.size and (np.any(a != np.round(a)) or a.min() < 0 or a.max() >= len(vocab)):
        raise InputError(f"graph: {name!r} codes must be integers in 0..{len(vocab) - 1} ({name} vocabulary "
                         f"{list(vocab)})")
    return a.astype(np.int64)


def _at_least(a, name: str, low: float) -> None:
    import numpy as np

    if not np.all(np.isfinite(a)) or (a.size and a.min() < low):
        raise InputError(f"graph: {name!r} must be finite and >= {low:g}")


def _num_nodes(graph: Any) -> int:
    import numpy as np

    if not isinstance(graph, Mapping):
        raise InputError(f"graph: expected the dict of load_graph / graph_of, got {type(graph).__name__}")
    if "kind" not in graph:
        raise InputError("graph: missing array 'kind'")
    n = int(np.shape(graph["kind"])[0]) if np.ndim(graph["kind"]) == 1 else -1
    if n < 0:
        raise InputError(f"graph: 'kind' must be 1-D, got shape {np.shape(graph['kind'])}")
    if n == 0:
        raise InputError("graph: no nodes")
    if "num_nodes" in graph and int(graph["num_nodes"]) != n:
        raise InputError(f"graph: num_nodes = {graph['num_nodes']} but the node arrays have {n} rows")
    return n


# ------------------------------------------------------------------ nodes and edges
def node_feature_matrix(graph: Mapping, learned_time_s: Any = None) -> "Any":
    """Node features (``float32``, shape (N, F_node), columns of :data:`NODE_FEATURE_SCHEMA`).

    Args:
        graph: a graph dict as :func:`~learnedperf.data.graphs.load_graph` or
            :func:`~learnedperf.data.graphs.graph_of` return it (one array per
            :data:`~learnedperf.data.graphs.NODE_FEATURES` name).
        learned_time_s: optional (N,) seconds of one execution per node from a learned cost
            model; it fills column ``log_learned_time_s``. NaN entries mean "no learned time
            for this node" (e.g. collectives, which a learned compute model does not time) and
            take the cost model's time, as the column's description says. Without it the
            column repeats ``log_time_s``, so the width never changes.

    Raises:
        InputError: a node array is missing or has the wrong shape, a code is out of its
            vocabulary, a count is below 1, flops/bytes are negative, a time is negative or
            infinite.
    """
    import numpy as np

    n = _num_nodes(graph)
    a = {name: _array(graph, name, n, SHAPE_WIDTH if name == "shape" else None) for name in NODE_FEATURES}
    kind = _codes(a["kind"], "kind", KINDS)
    phase = _codes(a["phase"], "phase", PHASES)
    dtype = _codes(a["dtype"], "dtype", DTYPES)
    for name in ("flops", "bytes", "stage", "chunk", "shape"):
        _at_least(a[name], name, 0.0)
    for name in ("repeat", "per_iteration", "stage_repeat", "group_size", "group_per_node"):
        _at_least(a[name], name, 1.0)
    if np.any(a["group_per_node"] > a["group_size"]):
        raise InputError("graph: 'group_per_node' exceeds 'group_size'")
    time_s = a["time_s"]
    unknown = np.isnan(time_s)
    if np.any(np.isinf(time_s)) or np.any(time_s[~unknown] < 0):
        raise InputError("graph: 'time_s' must be >= 0 or NaN (unknown), not negative or infinite")
    log_t = np.where(unknown, 0.0, np.log(np.maximum(np.nan_to_num(time_s, nan=0.0), MIN_TIME_S)))

    if learned_time_s is None:
        log_learned = log_t
    else:
        try:
            lt = np.asarray(learned_time_s, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError("learned_time_s: not numeric") from None
        if lt.shape != (n,):
            raise InputError(f"learned_time_s: shape {lt.shape}, expected ({n},) (one time per node)")
        if np.any(np.isinf(lt)) or np.any(lt[~np.isnan(lt)] < 0):
            raise InputError("learned_time_s: times must be >= 0 or NaN (no learned time for the node)")
        has = ~np.isnan(lt)
        log_learned = np.where(has, np.log(np.maximum(np.nan_to_num(lt, nan=0.0), MIN_TIME_S)), log_t)

    contrib = np.where(unknown, 0.0, time_s) * a["repeat"] * a["per_iteration"]
    total = contrib.sum()
    share = contrib / total if total > 0 else np.zeros(n)
    last_stage = float(np.max(a["stage"] + a["stage_repeat"] - 1.0))

    cols: dict[str, Any] = {}
    for values, vocab, prefix in ((kind, KINDS, "kind"), (phase, PHASES, "phase"), (dtype, DTYPES, "dtype")):
        for i, v in enumerate(vocab):
            cols[f"{prefix}={v}"] = values == i
    cols.update({
        "log1p_flops": np.log1p(a["flops"]),
        "log1p_bytes": np.log1p(a["bytes"]),
        "log_time_s": log_t,
        "log_learned_time_s": log_learned,
        "time_unknown": unknown,
        "log_repeat": np.log(a["repeat"]),
        "log_per_iteration": np.log(a["per_iteration"]),
        "log_time_share": np.log(np.maximum(share, MIN_SHARE)),
        "is_comm": a["is_comm"] != 0,
        "log_group_size": np.log(a["group_size"]),
        "group_frac_in_node": a["group_per_node"] / a["group_size"],
        "stage_position": a["stage"] / last_stage if last_stage > 0 else np.zeros(n),
        "log_stage_repeat": np.log(a["stage_repeat"]),
        "chunk": a["chunk"],
    })
    shape = np.log1p(a["shape"])
    for i in range(SHAPE_WIDTH):
        cols[f"log1p_shape{i}"] = shape[:, i]
    return _stack(NODE_FEATURE_SCHEMA, cols, n)


def edge_feature_matrix(graph: Mapping) -> "Any":
    """Edge features (``float32``, shape (E, 4)): one-hot of ``edge_type`` in :data:`EDGE_TYPES` order.

    Also checks ``edge_index`` (shape (2, E), node indices in range), so that a graph that passes
    both feature functions is safe to hand to PyTorch Geometric.

    Raises:
        InputError: ``edge_index`` / ``edge_type`` missing, of the wrong shape, or out of range.
    """
    import numpy as np

    n = _num_nodes(graph)
    if "edge_index" not in graph or "edge_type" not in graph:
        raise InputError("graph: missing 'edge_index' or 'edge_type'")
    ei = np.asarray(graph["edge_index"])
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise InputError(f"graph: 'edge_index' has shape {ei.shape}, expected (2, E)")
    if ei.size and (not np.issubdtype(ei.dtype, np.integer) or ei.min() < 0 or ei.max() >= n):
        raise InputError(f"graph: 'edge_index' must hold integer node indices in 0..{n - 1}")
    et = _array(graph, "edge_type", ei.shape[1])
    codes = _codes(et, "edge_type", EDGE_TYPES)
    out = np.zeros((len(codes), len(EDGE_TYPES)), dtype=np.float32)
    out[np.arange(len(codes)), codes] = 1.0
    return out


# ------------------------------------------------------------------ run-level features
def _positive(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name}: expected a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"{name}: expected a finite positive number, got {value!r}")
    return v


def global_feature_vector(spec: Any, sim_time_ms: float, breakdown_ms: Mapping[str, float]) -> "Any":
    """Run-level features (``float32``, shape (F_global,), columns of :data:`GLOBAL_FEATURE_SCHEMA`).

    Args:
        spec: the run: a :class:`~learnedperf.specs.RunSpec` or a run-format dict.
        sim_time_ms: the simulator's iteration time in milliseconds (> 0).
        breakdown_ms: the simulator's breakdown in ms (``SimResult.to_prediction()["breakdown_ms"]``),
            with every part of :data:`BREAKDOWN_PARTS`.

    Raises:
        InputError: the run is invalid, the time is not a positive number, a breakdown part is
            missing, negative or not finite.
    """
    import numpy as np

    from ..errors import SpecError
    from ..graph.transformer import model_flops_per_iteration
    from ..specs import RunSpec

    if not hasattr(spec, "strategy"):
        try:
            spec = RunSpec.from_dict(spec)
        except SpecError as exc:
            raise InputError(f"run: {exc}") from None
    t_ms = _positive(sim_time_ms, "sim_time_ms")
    if not isinstance(breakdown_ms, Mapping):
        raise InputError(f"breakdown_ms: expected a mapping part → ms, got {type(breakdown_ms).__name__}")
    fracs = {}
    for p in BREAKDOWN_PARTS:
        if p not in breakdown_ms:
            raise InputError(f"breakdown_ms: missing part {p!r} (needs {list(BREAKDOWN_PARTS)})")
        try:
            v = float(breakdown_ms[p])
        except (TypeError, ValueError):
            raise InputError(f"breakdown_ms[{p!r}]: expected a number, got {breakdown_ms[p]!r}") from None
        if not math.isfinite(v) or v < 0:
            raise InputError(f"breakdown_ms[{p!r}]: expected a finite number >= 0, got {v!r}")
        fracs[f"frac_{p}"] = v / t_ms

    m, hw, s = spec.model, spec.hardware, spec.strategy
    dev = hw.device
    peak_flops = float(dev.peak_tflops.get(s.precision) or dev.peak_tflops.fp32) * 1e12
    ideal_s = model_flops_per_iteration(spec) / (hw.num_devices * peak_flops)
    cols: dict[str, Any] = {
        "log_num_devices": math.log(hw.num_devices),
        "log_tp": math.log(s.tp), "log_pp": math.log(s.pp), "log_dp": math.log(s.dp),
        "log_cp": math.log(s.cp), "log_ep": math.log(s.ep),
        "log_num_nodes": math.log(hw.num_nodes), "log_node_size": math.log(hw.node_size),
        "sequence_parallel": float(s.sequence_parallel),
        "autocast": float(s.autocast),
        "log_virtual_pipeline_stages": math.log(s.virtual_pipeline_stages),
        "log_micro_batch_size": math.log(s.micro_batch_size),
        "log_num_microbatches": math.log(spec.num_microbatches),
        "log_peak_flops": math.log(peak_flops),
        "log_mem_bw_Bps": math.log(dev.memory_bandwidth_GBps * 1e9),
        "log_device_memory_GiB": math.log(dev.memory_GiB),
        "log_num_params": math.log(m.num_params()),
        "log_num_layers": math.log(m.num_layers),
        "log_hidden_size": math.log(m.hidden_size),
        "log_seq_length": math.log(m.seq_length),
        "log_tokens_per_iteration": math.log(spec.tokens_per_iteration),
        "log_ideal_time_s": math.log(ideal_s),
        "log_sim_time_ms": math.log(t_ms),
        **fracs,
    }
    # a link level the run does not use reads as absent, whatever the hardware says of it: a single-device
    # step's time cannot depend on its links, and a learned correction that saw them told apart devices of
    # equal rates by their link figures (the MI250X GCD, whose catalog entry has a link, came out 8-12 %
    # behind the MI250 GCD, whose entry has none: experiments/device_dominance.py)
    for level in ("intra", "inter"):
        bw = hw.used_link_bandwidth_GBps(level)
        cols[f"log_{level}_node_bw_Bps"] = math.log(bw * 1e9) if bw else 0.0
        cols[f"{level}_node_bw_unknown"] = float(hw.uses_link_level(level) and not bw)
    for z in _ZERO_STAGES:
        cols[f"zero_stage={z}"] = float(s.effective_zero_stage == z)
    cols["fsdp"] = float(s.fsdp)
    cols["log_dp_replicate"] = math.log(s.dp_replicate)
    cols["forward_only"] = float(s.forward_only)
    cols["deepep"] = float(s.moe_dispatcher == "deepep")
    cols["overlap_moe_comm"] = float(s.overlap_moe_comm)
    for r in _RECOMPUTE:
        cols[f"recompute={r}"] = float(s.recompute == r)
    for sch in _SCHEDULES:
        cols[f"schedule={sch}"] = float(s.pipeline_schedule == sch)
    for p in DTYPES:
        cols[f"precision={p}"] = float(s.precision == p)
    return _stack(GLOBAL_FEATURE_SCHEMA, {k: np.asarray([v], dtype=np.float64) for k, v in cols.items()}, 1)[0]


def _column(row: Any, name: str) -> Any:
    try:
        return row[name]
    except (KeyError, IndexError):
        raise InputError(f"record: missing column {name!r}") from None


def _is_null(value: Any) -> bool:
    if value is None:
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return value.__class__.__name__ in ("NAType", "NaTType")  # pandas' missing markers


def global_features_from_record(row: Any) -> "Any":
    """:func:`global_feature_vector` of one record (a dict or a pandas row of ``RECORD_COLUMNS``).

    Uses the record's ``run`` JSON, ``sim_iteration_time_ms`` and the ``<part>_ms`` breakdown
    columns. Measured records carry no breakdown (it is not a measurement): the caller
    re-simulates such a run and calls :func:`global_feature_vector` instead.

    Raises:
        InputError: ``run`` is not a valid run, or the simulator time or a breakdown column is
            missing or null (the message names the column).
    """
    from ..errors import SpecError
    from ..specs import RunSpec

    text = _column(row, "run")
    try:
        spec = RunSpec.from_dict(json.loads(text) if isinstance(text, str) else text)
    except json.JSONDecodeError as exc:
        raise InputError(f"record column 'run': not JSON ({exc.msg})") from None
    except SpecError as exc:
        raise InputError(f"record column 'run': {exc}") from None
    rid = row.get("run_id", "?") if hasattr(row, "get") else "?"
    values: dict[str, Any] = {}
    for col in (SIM_TIME_COLUMN,) + tuple(f"{p}_ms" for p in BREAKDOWN_PARTS):
        v = _column(row, col)
        if _is_null(v):
            raise InputError(f"record {rid}: column {col!r} is null (measured records carry no simulator "
                             "breakdown: re-simulate the run and use global_feature_vector)")
        values[col] = v
    return global_feature_vector(spec, values[SIM_TIME_COLUMN],
                                 {p: values[f"{p}_ms"] for p in BREAKDOWN_PARTS})


__all__ = ["BREAKDOWN_PARTS", "EDGE_FEATURE_SCHEMA", "GLOBAL_FEATURE_SCHEMA", "GRAPH_FEATURE_SCHEMA_VERSION",
           "MIN_SHARE", "MIN_TIME_S", "NODE_FEATURE_SCHEMA", "SIMULATOR_GLOBAL_FEATURES", "SIM_TIME_COLUMN",
           "edge_feature_matrix", "global_feature_vector", "global_features_from_record",
           "graph_feature_schema_dict", "node_feature_matrix"]
