"""The run record: one schema for simulated and measured runs.

A record is one run (DESIGN.md run format) with its provenance, the columns a
model or an analysis filters on (family, device, scale, strategy), its targets
(iteration time, breakdown, memory) and a reference into the graph store.

* ``source = "simulated"``: the targets are the simulator's (``simulator_version``,
  ``cost_model_version`` say which); ``sim_*`` repeat them.
* ``source = "measured"``: the targets are measured (``iteration_time_ms`` and its
  spread, ``peak_memory_GiB`` where the measurement has it; no breakdown);
  ``sim_*`` hold the simulator's prediction of the same run where it can simulate
  it, for residual learning.

:data:`RECORD_COLUMNS` is the contract: name → (Arrow type, meaning), in storage order;
:data:`SCHEMA_VERSION` is bumped on any incompatible change.
"""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any, Optional

from ..specs.strategy import ZERO_BUBBLE_SCHEDULES

SCHEMA_VERSION = 1
"""Version of :data:`RECORD_COLUMNS`."""

#: Column → (Arrow type name, meaning). Every record has exactly these keys.
RECORD_COLUMNS: dict[str, tuple[str, str]] = {
    "run_id": ("string", "sha256 of the canonical JSON of 'run', first 16 hex digits (measure.records.run_id)"),
    "config_id": ("string", "run_id of the run without its 'id'/'meta': equal for identical configurations"),
    "run": ("string", "the run in the DESIGN.md run format (canonical JSON)"),
    "source": ("string", "'simulated' or 'measured'"),
    "origin": ("string", "where the record comes from: 'generator', 'vtrain', 'datasets/measured/<host>', "
                         "'ingested:<file>', ..."),
    "sample_index": ("int64", "generator sample index (its runs depend only on seed and index); -1 if measured"),
    "arch": ("string", "model family: 'gpt', 'llama', 'bert', 'moe'"),
    "model_name": ("string", "model name (catalog name, or the inline architecture's name)"),
    "num_params": ("int64", "model parameters (ModelSpec.num_params)"),
    "num_layers": ("int64", "transformer layers"),
    "hidden_size": ("int64", "hidden size"),
    "num_attention_heads": ("int64", "attention heads"),
    "seq_length": ("int64", "training sequence length"),
    "num_experts": ("int64", "experts per MoE layer (1 for dense models)"),
    "device_name": ("string", "device name as in the run (catalog name, 'synthetic-<base>-<k>', or a CPU's name)"),
    "device_type": ("string", "the catalog device it is or was derived from (synthetic devices: their base)"),
    "device_memory_GiB": ("float64", "memory of one device"),
    "cluster": ("string", "catalog cluster name, null when the hardware is given inline"),
    "num_devices": ("int64", "devices of the run"),
    "devices_per_node": ("int64", "devices per node (NVLink domain)"),
    "num_nodes": ("int64", "nodes the devices occupy"),
    "tp": ("int64", "tensor-parallel size"),
    "pp": ("int64", "pipeline-parallel size"),
    "dp": ("int64", "data-parallel size"),
    "cp": ("int64", "context-parallel size"),
    "ep": ("int64", "expert-parallel size"),
    "zero_stage": ("int64", "ZeRO stage as given (0-3)"),
    "fsdp": ("bool", "PyTorch FSDP full sharding"),
    "effective_zero_stage": ("int64", "ZeRO stage with FSDP counted as 3"),
    "recompute": ("string", "'none', 'selective' or 'full'"),
    "sequence_parallel": ("bool", "Megatron sequence parallelism"),
    "pipeline_schedule": ("string", "'gpipe', '1f1b', 'interleaved', 'zb-h1', 'zb-v' or 'interleaved-zb' "
                                    "(meaningful when pp > 1)"),
    "virtual_pipeline_stages": ("int64", "model chunks per pipeline rank"),
    "micro_batch_size": ("int64", "sequences per micro-batch"),
    "global_batch_size": ("int64", "sequences per iteration"),
    "num_microbatches": ("int64", "micro-batches per pipeline per iteration"),
    "precision": ("string", "'fp32', 'tf32', 'bf16', 'fp16' or 'fp8'"),
    "strategy_kind": ("string", "'tp', 'pp', 'cp', 'ep' parts then 'fsdp' / 'zero' / 'dp', '+'-joined; 'single'"),
    "iteration_time_ms": ("float64", "TARGET: time of one training iteration (simulated or measured median)"),
    "iteration_p10_ms": ("float64", "measured 10th percentile (null when unknown, and for simulated rows)"),
    "iteration_p90_ms": ("float64", "measured 90th percentile (null when unknown, and for simulated rows)"),
    "tokens_per_second": ("float64", "global_batch_size · seq_length / iteration time"),
    "mfu": ("float64", "model FLOPs utilisation of the iteration time (null if the simulator cannot run it)"),
    "forward_ms": ("float64", "simulated breakdown on the bottleneck stage: forward kernels (null if measured)"),
    "backward_ms": ("float64", "backward kernels (recompute excluded)"),
    "recompute_ms": ("float64", "activation recomputation"),
    "compute_ms": ("float64", "forward + backward + recompute"),
    "optimizer_ms": ("float64", "optimizer step"),
    "exposed_communication_ms": ("float64", "communication not hidden behind compute"),
    "pipeline_bubble_ms": ("float64", "waiting on other pipeline stages"),
    "peak_memory_GiB": ("float64", "TARGET: peak memory per device (simulated; measured: the measurement's peak, "
                                   "null if not measured)"),
    "weights_GiB": ("float64", "simulated memory of the weights (null if measured)"),
    "gradients_GiB": ("float64", "simulated memory of the gradients"),
    "optimizer_states_GiB": ("float64", "simulated optimizer states (master weights, moments)"),
    "activations_GiB": ("float64", "simulated activations kept for backward"),
    "temporary_GiB": ("float64", "simulated temporary buffers (logits, gathered ZeRO-3 weights)"),
    "fits_in_memory": ("bool", "peak memory <= device memory (measured runs: true, they ran)"),
    "sim_iteration_time_ms": ("float64", "simulator's iteration time (equals the target for simulated rows; "
                                         "null where the run cannot be simulated)"),
    "sim_peak_memory_GiB": ("float64", "simulator's peak memory"),
    "simulator_version": ("string", "learnedperf.simulate.SIMULATOR_VERSION of the sim_* columns"),
    "cost_model_version": ("string", "'<cost model name>:<sha256 of cost/data/params.json, 16 hex digits>'"),
    "repeats": ("int64", "measured: timed iterations (0 = not stated or simulated)"),
    "host": ("string", "measured: host name (null for simulated rows)"),
    "backend": ("string", "measured: communication backend (null for simulated rows)"),
    "measured_at": ("string", "measured: UTC ISO-8601 time (null when unknown or simulated)"),
    "graph_shard": ("string", "graph store file holding this run's execution graph, relative to the data set"),
    "graph_row": ("int64", "row of that file"),
    "graph_num_nodes": ("int64", "nodes of the coarsened execution graph"),
    "graph_num_edges": ("int64", "edges of the coarsened execution graph"),
}

SOURCES = ("simulated", "measured")
"""Values of the ``source`` column."""

_ARROW_TYPES = {"string": "string", "int64": "int64", "float64": "float64", "bool": "bool_"}


def arrow_schema():
    """The :mod:`pyarrow` schema of :data:`RECORD_COLUMNS` (every shard has exactly it)."""
    import pyarrow as pa

    return pa.schema([pa.field(name, getattr(pa, _ARROW_TYPES[t])()) for name, (t, _d) in RECORD_COLUMNS.items()])


@cache
def cost_model_version(name: str = "roofline") -> str:
    """``'<name>:<hash>'``: the cost model and the sha256 (16 hex digits) of its fitted constants file."""
    from importlib import resources

    data = resources.files("learnedperf.cost").joinpath("data", "params.json").read_bytes()
    return f"{name}:{hashlib.sha256(data).hexdigest()[:16]}"


def strategy_kind(strategy: Any) -> str:
    """The ``strategy_kind`` of a resolved strategy (the rule of measured step records,
    :func:`learnedperf.measure.ingest.strategy_kind`)."""
    from ..measure.ingest import strategy_kind as kind

    return kind(strategy)


#: The record columns a run's :func:`strategy_signature` reads.
STRATEGY_SIGNATURE_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "effective_zero_stage", "pipeline_schedule")


def strategy_signature(tp: int, pp: int, dp: int, cp: int, ep: int, zero_stage: int, schedule: str) -> str:
    """The parallel techniques a run combines, in the terms of the held-out strategy and sharding splits
    (:mod:`learnedperf.models.evaluate`): ``tp``, ``pp`` (and the schedule unless 1F1B or GPipe), ``cp``,
    ``ep``, then how the data-parallel ranks hold the states — ``zero3`` (ZeRO-3 or FSDP's FULL_SHARD),
    ``zero2``, ``zero1`` or plain ``dp`` — joined with ``+`` in that order; ``single`` when nothing is split.
    Sizes do not count: tp 2 and tp 8 combine the same techniques."""
    parts = [name for name, n in (("tp", tp), ("pp", pp)) if n > 1]
    if pp > 1 and schedule in ("interleaved", *ZERO_BUBBLE_SCHEDULES):
        parts.append(schedule)
    parts += [name for name, n in (("cp", cp), ("ep", ep)) if n > 1]
    if zero_stage >= 1:
        parts.append(f"zero{min(int(zero_stage), 3)}")
    elif dp > 1:
        parts.append("dp")
    return "+".join(parts) or "single"


def spec_strategy_signature(spec: Any) -> str:
    """:func:`strategy_signature` of a :class:`~learnedperf.specs.RunSpec` (what its record's columns give)."""
    s = spec.strategy
    return strategy_signature(s.tp, s.pp, s.dp, s.cp, s.ep, s.effective_zero_stage, s.pipeline_schedule)


#: The record columns that place a run in or out of a training domain: the columns the held-out
#: splits over family, device and scale read (:mod:`learnedperf.data.splits`,
#: :mod:`learnedperf.models.evaluate`) and :class:`learnedperf.models.intervals.TrainingDomain` compares.
DOMAIN_COLUMNS = ("arch", "device_type", "num_devices")


def domain_columns(spec: Any) -> dict:
    """The :data:`DOMAIN_COLUMNS` of a run's record, from its :class:`~learnedperf.specs.RunSpec`: model
    family, the catalog device it is or was derived from, and its number of devices."""
    from .sampler import device_type

    return {"arch": spec.model.arch, "device_type": device_type(spec.hardware.device.name),
            "num_devices": spec.hardware.num_devices}


def spec_columns(spec: Any, run: dict) -> dict:
    """The descriptive columns of a record that follow from the run alone."""
    from ..measure.records import canonical_json

    m, hw, s = spec.model, spec.hardware, spec.strategy
    domain = domain_columns(spec)
    text = canonical_json(run)
    bare = {k: v for k, v in run.items() if k not in _NOT_CONFIG}
    return {
        # the hash of measure.records.run_id, computed once from the text also stored
        "run_id": hashlib.sha256(text.encode()).hexdigest()[:16],
        "config_id": hashlib.sha256(canonical_json(bare).encode()).hexdigest()[:16],
        "run": text,
        "arch": domain["arch"],
        "model_name": m.name,
        "num_params": int(m.num_params()),
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "seq_length": m.seq_length,
        "num_experts": m.num_experts,
        "device_name": hw.device.name,
        "device_type": domain["device_type"],
        "device_memory_GiB": float(hw.device.memory_GiB),
        "cluster": hw.cluster,
        "num_devices": domain["num_devices"],
        "devices_per_node": hw.devices_per_node,
        "num_nodes": hw.num_nodes,
        "tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "ep": s.ep,
        "zero_stage": int(s.zero_stage),
        "fsdp": bool(s.fsdp),
        "effective_zero_stage": int(s.effective_zero_stage),
        "recompute": s.recompute,
        "sequence_parallel": bool(s.sequence_parallel),
        "pipeline_schedule": s.pipeline_schedule,
        "virtual_pipeline_stages": s.virtual_pipeline_stages,
        "micro_batch_size": s.micro_batch_size,
        "global_batch_size": s.global_batch_size,
        "num_microbatches": spec.num_microbatches,
        "precision": s.precision,
        "strategy_kind": strategy_kind(s),
    }


_NOT_CONFIG = ("id", "run_id", "meta", "name")  # labels, not configuration (see sampler.config_id)
_BREAKDOWN = ("forward", "backward", "recompute", "compute", "optimizer", "exposed_communication",
              "pipeline_bubble")
_MEMORY = ("weights", "gradients", "optimizer_states", "activations", "temporary")


def _sim_columns(pred: Optional[dict]) -> dict:
    """The simulator's targets of a prediction dict (``SimResult.to_prediction``), or nulls."""
    if pred is None:
        out = {f"{k}_ms": None for k in _BREAKDOWN}
        out.update({f"{k}_GiB": None for k in _MEMORY})
        return out
    out = {f"{k}_ms": float(pred["breakdown_ms"].get(k, 0.0)) for k in _BREAKDOWN}
    out.update({f"{k}_GiB": float(pred["memory_GiB"][k]) for k in _MEMORY})
    return out


def simulated_record(index: int, run: dict, spec: Any, prediction: dict, graph_ref: dict) -> dict:
    """The record of a generated run from its simulator prediction.

    Args:
        index: the sampler index.
        run: the run-format dict as sampled (its hash is the run id).
        spec: its validated RunSpec.
        prediction: ``SimResult.to_prediction()`` of the run.
        graph_ref: ``graph_shard``, ``graph_row``, ``graph_num_nodes``, ``graph_num_edges``.
    """
    rec = spec_columns(spec, run)
    t_ms = float(prediction["iteration_time_ms"])
    rec.update(
        source="simulated", origin="generator", sample_index=int(index),
        iteration_time_ms=t_ms, iteration_p10_ms=None, iteration_p90_ms=None,
        tokens_per_second=float(prediction["tokens_per_second"]), mfu=float(prediction["mfu"]),
        peak_memory_GiB=float(prediction["peak_memory_GiB"]), fits_in_memory=bool(prediction["fits_in_memory"]),
        sim_iteration_time_ms=t_ms, sim_peak_memory_GiB=float(prediction["peak_memory_GiB"]),
        simulator_version=prediction["simulator_version"],
        cost_model_version=cost_model_version(prediction.get("cost_model", "roofline")),
        repeats=0, host=None, backend=None, measured_at=None, **_sim_columns(prediction), **graph_ref)
    return rec


def measured_record(step: dict, origin: str, spec: Any, run: dict, prediction: Optional[dict],
                    graph_ref: dict) -> dict:
    """The record of a measured step record (``measure.records.STEP_COLUMNS``).

    Args:
        step: the step record (measured ``iteration_time_ms``, spread, memory, host...).
        origin: where it came from (``'vtrain'``, ``'datasets/measured/<host>'``, ``'ingested:<file>'``).
        spec: the validated RunSpec of its run.
        run: the run-format dict (as stored in the step record; its hash is the run id).
        prediction: the simulator's prediction of the run, or None when it cannot be simulated.
        graph_ref: graph store reference (null values when no graph).
    """
    from ..simulate import SIMULATOR_VERSION

    rec = spec_columns(spec, run)
    t_ms = float(step["iteration_time_ms"])
    mem_mib = step.get("peak_memory_MiB")
    mem = None if mem_mib is None or mem_mib != mem_mib else float(mem_mib) / 1024.0
    s = spec.strategy
    sim = _sim_columns(None)  # measured rows carry no breakdown: the simulator's is not a measurement

    def _opt(value: Any) -> Optional[float]:
        return None if value is None or value != value else float(value)

    rec.update(
        source="measured", origin=origin, sample_index=-1,
        iteration_time_ms=t_ms, iteration_p10_ms=_opt(step.get("iteration_p10_ms")),
        iteration_p90_ms=_opt(step.get("iteration_p90_ms")),
        tokens_per_second=s.global_batch_size * spec.model.seq_length / (t_ms / 1e3),
        mfu=(None if prediction is None else
             float(prediction["mfu"]) * float(prediction["iteration_time_ms"]) / t_ms),
        peak_memory_GiB=mem, fits_in_memory=True,
        sim_iteration_time_ms=None if prediction is None else float(prediction["iteration_time_ms"]),
        sim_peak_memory_GiB=None if prediction is None else float(prediction["peak_memory_GiB"]),
        simulator_version=SIMULATOR_VERSION if prediction is not None else None,
        cost_model_version=(cost_model_version(prediction.get("cost_model", "roofline"))
                            if prediction is not None else None),
        repeats=int(step.get("repeats") or 0), host=step.get("host"), backend=step.get("backend"),
        measured_at=step.get("measured_at"), **sim, **graph_ref)
    return rec


def check_record(rec: dict) -> dict:
    """``rec`` itself after checking it has exactly :data:`RECORD_COLUMNS` (a programming error otherwise)."""
    if set(rec) != set(RECORD_COLUMNS):
        missing = sorted(set(RECORD_COLUMNS) - set(rec))
        extra = sorted(set(rec) - set(RECORD_COLUMNS))
        raise AssertionError(f"record columns differ from RECORD_COLUMNS: missing {missing}, extra {extra}")
    return rec


def records_table(records: list[dict]):
    """A :class:`pyarrow.Table` of records with exactly :func:`arrow_schema` (columns in order)."""
    import pyarrow as pa

    schema = arrow_schema()
    cols = [pa.array([r[f.name] for r in records], type=f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


__all__ = ["DOMAIN_COLUMNS", "RECORD_COLUMNS", "SCHEMA_VERSION", "SOURCES", "STRATEGY_SIGNATURE_COLUMNS",
           "arrow_schema", "check_record", "cost_model_version", "domain_columns", "measured_record", "records_table",
           "simulated_record", "spec_columns", "spec_strategy_signature", "strategy_kind", "strategy_signature"]
