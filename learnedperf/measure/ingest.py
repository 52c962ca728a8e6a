"""Ingest users' own measurements: run logs → step records, PyTorch profiler traces → operator records.

The full schema, with examples, is in ``docs/ingest.md``; this docstring is its summary.

Run logs
--------
One row per measured run, in CSV, Parquet or JSON Lines (chosen by the file
extension: ``.csv``, ``.parquet``, ``.jsonl``, ``.json``; a ``.json`` file may
also hold one JSON array of rows or a single row object). A row gives the run
in one of two ways:

* ``run``: the JSON of a run-format object (DESIGN.md: ``model``, ``hardware``,
  ``strategy``), as a JSON string in CSV/Parquet or as an object in JSON Lines; or
* flat columns: ``model`` (a catalog name or the JSON of an inline model), ``device``
  (catalog name or JSON descriptor) and/or ``cluster`` (catalog name),
  ``num_devices``, optionally ``seq_length`` (overrides the model's), the
  hardware link keys ``devices_per_node``, ``intra_node_bandwidth_GBps``,
  ``inter_node_bandwidth_GBps``, ``intra_node_latency_us``,
  ``inter_node_latency_us``, and any strategy key of the run format under its
  own name (``tp``, ``pp``, ``dp``, ``cp``, ``ep``, ``micro_batch_size``,
  ``global_batch_size``, ``pipeline_schedule``, ``virtual_pipeline_stages``,
  ``zero_stage``, ``fsdp``, ``recompute``, ``sequence_parallel``, ``precision``,
  ``flash_attention``, ...; every field of :class:`learnedperf.specs.Strategy`).

The measured target is ``iteration_time_ms``, or ``tokens_per_second``, or
``samples_per_second``, converted with the run's global batch ``B`` (sequences
per iteration, after ``dp`` and the batch are derived as the run format says) and
sequence length ``s``::

    iteration_time_ms = 1000 · B · s / tokens_per_second
    iteration_time_ms = 1000 · B / samples_per_second

When several targets are given they must agree within 1 %. Optional:
``iteration_p10_ms``, ``iteration_p90_ms`` (p10 ≤ median ≤ p90), ``repeats``,
``warmup``, ``peak_memory_MiB``, ``host``, ``measured_at`` (ISO-8601; a time
without zone is UTC), ``framework`` (kept in the run's ``meta``), ``backend``,
``threads``, ``id``. Any other column is an error unless listed in
``ignore_columns``: a misspelt ``t_p`` must not silently become ``tp = 1``.
Empty CSV cells, JSON ``null`` and Parquet nulls mean "not given".

Each row becomes one record with exactly the columns of
:data:`~learnedperf.measure.records.STEP_COLUMNS` (``source`` =
``"ingested:<file name>"``; see :func:`step_record` for the defaults of what a
log does not say). Every row is validated with
:meth:`learnedperf.specs.RunSpec.from_dict`; a bad row raises :class:`RowError`
(an :class:`~learnedperf.errors.InputError`) whose message names the file, the
location (CSV: ``line N``, 1-based in the file, header = line 1; JSON Lines:
``line N``; JSON array: ``item I``; Parquet: ``row I``, 0-based) and the field.
:func:`read_run_log` stops at the first bad row by default; with
``errors="collect"`` it returns the good records together with one error per
rejected row.

Profiler traces
---------------
:func:`ingest_trace` reads the Chrome trace written by
``torch.profiler.profile(...).export_chrome_trace`` (record_shapes=True) and
returns operator records (:data:`~learnedperf.measure.records.OP_COLUMNS`) and a
per-step summary; :func:`trace_step_times` gives the ``ProfilerStep#N`` spans.
Operators are the *outermost* ATen calls of a known kind (``aten::linear`` and
not the ``aten::addmm`` inside it), plus collectives (``c10d::*``,
``record_param_comms``, ``nccl:*``/``gloo:*``); kinds, FLOPs and bytes follow
the conventions of :mod:`learnedperf.graph.trace` (whose ATen name tables are
reused). An operator's time is the summed duration of the GPU kernels it
launched when it launched any, otherwise its wall time on the CPU (``dur`` of
the op event, sub-calls included). Occurrences of the same (op, kind,
direction, shape, dtype, params) are aggregated: median, p10, p90, count.
Unknown ATen ops are not made up into records: they are counted, with their
time, in ``TraceIngest.unmapped``; kernels launched outside any op are in
``TraceIngest.unattributed``.

Only the standard library is imported at module import; ``specs``, ``catalog``,
``graph`` and ``pyarrow`` are imported inside the functions that need them.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Union

from ..errors import InputError, SpecError
from .records import OP_COLUMNS, STEP_COLUMNS, canonical_json, run_id

PathLike = Union[str, "os.PathLike[str]"]

# ======================================================================= run logs
#: Hardware keys of the run format that a flat row may give (per device, per direction).
HARDWARE_COLUMNS = ("devices_per_node", "intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps",
                    "intra_node_latency_us", "inter_node_latency_us", "collective_busbw_ratio")
#: Measured targets, in order of precedence.
TARGET_COLUMNS = ("iteration_time_ms", "tokens_per_second", "samples_per_second")

#: The run-log schema: column → meaning. Strategy keys are every field of ``Strategy``.
RUN_LOG_COLUMNS = {
    "run": "JSON of a run-format object (model, hardware, strategy); replaces every flat run column",
    "model": "catalog model name, or the JSON of an inline model ({'arch': ...} or {'hf_config': ...})",
    "device": "catalog device name or the JSON of an inline device descriptor",
    "cluster": "catalog cluster name (gives device, devices_per_node and links)",
    "num_devices": "devices used by the run (integer >= 1)",
    "seq_length": "optional: training sequence length, overrides the model's",
    **{k: "optional hardware link key of the run format" for k in HARDWARE_COLUMNS},
    "collective_busbw_ratio": "optional: JSON object, bus bandwidth of allgather / reducescatter / alltoall / "
                              "p2p relative to all-reduce's (e.g. nccl-tests busbw ratios)",
    "<strategy key>": "tp, pp, dp, cp, ep, micro_batch_size, global_batch_size, pipeline_schedule, "
                      "virtual_pipeline_stages, zero_stage, fsdp, recompute, sequence_parallel, precision, "
                      "flash_attention, ... (every learnedperf.specs.Strategy field, same name, same default)",
    "iteration_time_ms": "measured median time of one training iteration (ms)",
    "tokens_per_second": "alternative target: iteration_time_ms = 1000 * global_batch_size * seq_length / it",
    "samples_per_second": "alternative target: iteration_time_ms = 1000 * global_batch_size / it",
    "iteration_p10_ms": "optional: 10th percentile of the iteration time",
    "iteration_p90_ms": "optional: 90th percentile of the iteration time",
    "repeats": "optional: timed iterations (default 0 = not stated)",
    "warmup": "optional: untimed iterations before timing (default 0 = not stated)",
    "peak_memory_MiB": "optional: peak memory of the busiest device (default null)",
    "host": "optional: host name (default 'unknown')",
    "measured_at": "optional: ISO-8601 time of the measurement, UTC if no zone (default null)",
    "framework": "optional: training framework, stored in the run's meta.framework",
    "backend": "optional: communication backend, e.g. 'nccl' (default 'unknown')",
    "threads": "optional: intra-op threads per process (default 0 = not stated)",
    "id": "optional: the run's id (stored in the run)",
}

_FLAT_RUN_COLUMNS = ("model", "device", "cluster", "num_devices", "seq_length", "id")
_OPTIONAL_COLUMNS = ("iteration_p10_ms", "iteration_p90_ms", "repeats", "warmup", "peak_memory_MiB", "host",
                     "measured_at", "framework", "backend", "threads")
#: Relative disagreement allowed between two targets of one row.
_TARGET_TOLERANCE = 0.01
_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
             ".json": "json"}


class RowError(InputError):
    """One rejected row of a run log.

    Attributes:
        path: the file, as given.
        location: ``"line N"`` (CSV, JSON Lines), ``"item I"`` (JSON array) or ``"row I"`` (Parquet).
        field: the offending column, or the run-format field (``"strategy.dp"``); ``""`` when the
            row as a whole is bad (e.g. a truncated JSON line).
        message: what is wrong.
    """

    def __init__(self, path: str, location: str, field: str, message: str):
        self.path = path
        self.location = location
        self.field = field
        self.message = message
        where = f"{path}: {location}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


class IngestResult(NamedTuple):
    """What :func:`read_run_log` returns with ``errors="collect"``: the good records and one error per bad row."""

    records: list
    errors: list

    @property
    def rejected(self) -> int:
        """Number of rejected rows (one :class:`RowError` each)."""
        return len(self.errors)


class _FieldError(Exception):
    """A problem with one field of a row (turned into a :class:`RowError` with the location)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


# ----------------------------------------------------------------- value coercion
def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if isinstance(value, str) and not value.strip():
        return True
    return type(value).__name__ in ("NAType", "NaTType")


def _plain(value: Any) -> Any:
    """numpy / pyarrow scalars → Python scalars (they are not ``int``/``bool`` subclasses)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes, list, dict, tuple)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


def _to_int(value: Any, name: str) -> int:
    value = _plain(value)
    if isinstance(value, bool):
        raise _FieldError(name, f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if math.isfinite(f) and f.is_integer():
                return int(f)
    raise _FieldError(name, f"expected an integer, got {value!r}")


def _to_float(value: Any, name: str) -> float:
    value = _plain(value)
    if isinstance(value, bool):
        raise _FieldError(name, f"expected a number, got {value!r}")
    try:
        out = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise _FieldError(name, f"expected a number, got {value!r}") from None
    if not math.isfinite(out):
        raise _FieldError(name, f"expected a finite number, got {value!r}")
    return out


_TRUE = {"true", "t", "yes", "y", "1", "on"}
_FALSE = {"false", "f", "no", "n", "0", "off"}


def _to_bool(value: Any, name: str) -> bool:
    value = _plain(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _FieldError(name, f"expected true or false, got {value!r}")


def _to_str(value: Any, name: str) -> str:
    value = _plain(value)
    if isinstance(value, str):
        return value.strip()
    raise _FieldError(name, f"expected a string, got {value!r}")


def _to_positive(value: Any, name: str) -> float:
    out = _to_float(value, name)
    if out <= 0:
        raise _FieldError(name, f"must be > 0, got {out!r}")
    return out


def _to_count(value: Any, name: str) -> int:
    out = _to_int(value, name)
    if out < 0:
        raise _FieldError(name, f"must be >= 0, got {out}")
    return out


def _json_or_name(value: Any, name: str, what: str) -> Any:
    """A catalog name, or a JSON object given as text (CSV/Parquet) or as an object (JSON Lines)."""
    value = _plain(value)
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            return _json_object(text, name)
        return text
    raise _FieldError(name, f"expected a {what} name or a JSON object, got {value!r}")


def _json_object(value: Any, name: str) -> dict:
    value = _plain(value)
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            out = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _FieldError(name, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        if isinstance(out, dict):
            return out
    raise _FieldError(name, "expected a JSON object")


def _kind_of(annotation: Any) -> str:
    """'int' / 'float' / 'bool' / 'str' for a Strategy field annotation (Optional and Literal unwrapped)."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind_of(args[0]) if args else "str"
    if origin is typing.Literal:
        first = typing.get_args(annotation)[0]
        return "bool" if isinstance(first, bool) else "int" if isinstance(first, int) else "str"
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(annotation, "json")


@cache
def _strategy_kinds() -> dict[str, str]:
    """Strategy key → value kind, read from the spec so that new strategy keys are accepted as they come."""
    from ..specs import Strategy

    return {name: _kind_of(f.annotation) for name, f in Strategy.model_fields.items()}


_COERCE = {"int": _to_int, "float": _to_float, "bool": _to_bool, "str": _to_str,
           "json": lambda v, n: _plain(v)}


def allowed_columns() -> frozenset[str]:
    """Every column name a run log may use (``run``, flat run columns, strategy keys, targets, optional)."""
    return frozenset({"run", *_FLAT_RUN_COLUMNS, *HARDWARE_COLUMNS, *_strategy_kinds(), *TARGET_COLUMNS,
                      *_OPTIONAL_COLUMNS})


# ----------------------------------------------------------------- records
def strategy_kind(strategy: Any) -> str:
    """The ``strategy_kind`` of a step record for a resolved :class:`~learnedperf.specs.Strategy`.

    ``'tp'``, ``'pp'``, ``'cp'``, ``'ep'`` for each model-parallel degree > 1, then the flavour of data
    parallelism when ``dp`` > 1 or the state is sharded: ``'fsdp'``, ``'zero'`` (ZeRO stage >= 1) or
    ``'dp'``; joined with ``'+'`` (``'tp+pp+dp'``); ``'single'`` when nothing is split.
    """
    parts = [name for name in ("tp", "pp", "cp", "ep") if getattr(strategy, name, 1) > 1]
    dp = strategy.dp or 1
    if strategy.fsdp:
        parts.append("fsdp")
    elif strategy.zero_stage > 0:
        parts.append("zero")
    elif dp > 1:
        parts.append("dp")
    return "+".join(parts) or "single"


def _iso_utc(value: Any, name: str = "measured_at") -> str:
    """ISO-8601 UTC text of a time given as text or datetime; a time without zone is taken as UTC."""
    value = _plain(value)
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip())
        except ValueError:
            raise _FieldError(name, f"expected an ISO-8601 time such as 2024-05-01T12:00:00Z, got {value!r}") \
                from None
    else:
        if hasattr(value, "to_pydatetime"):  # pandas Timestamp
            dt = value.to_pydatetime()
        else:
            raise _FieldError(name, f"expected an ISO-8601 time, got {value!r}")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).isoformat()


def step_record(run: dict, iteration_time_ms: float, *, source: str, spec: Any = None,
                iteration_p10_ms: Optional[float] = None, iteration_p90_ms: Optional[float] = None,
                repeats: int = 0, warmup: int = 0, peak_memory_MiB: Optional[float] = None, per_op: str = "[]",
                backend: str = "unknown", threads: int = 0, host: str = "unknown",
                measured_at: Optional[str] = None) -> dict:
    """One step record (exactly :data:`STEP_COLUMNS`) for a run in the run format and its measured time.

    Args:
        run: the run-format dict, stored as given (catalog names are kept, so ``run_id`` is the
            hash of what the user wrote).
        iteration_time_ms: measured median iteration time.
        source: provenance, e.g. ``"ingested:runs.csv"``, ``"vtrain"``, ``"neusight"``.
        spec: the already validated :class:`~learnedperf.specs.RunSpec` of ``run`` (validated here if None).
        iteration_p10_ms, iteration_p90_ms: spread; ``None`` (stored as null) when not measured —
            an unknown spread must not look like a zero spread.
        repeats, warmup: timed and untimed iterations; 0 means "not stated".
        peak_memory_MiB: ``None`` when not measured.
        per_op: JSON list of per-operator timings, ``'[]'`` when none.
        backend: ``'nccl'``, ``'gloo'``, ``'none'``...; ``'unknown'`` when not stated.
        threads: intra-op threads per process; 0 means "not stated".
        host: host name; ``'unknown'`` when not stated.
        measured_at: UTC ISO-8601 time or ``None`` when not stated.

    Raises:
        SpecError: ``run`` is not a valid run (naming the field).
    """
    if spec is None:
        from ..specs import RunSpec

        spec = RunSpec.from_dict(run)
    device = spec.hardware.device
    rec = {
        "run_id": run_id(run),
        "run": canonical_json(run),
        "model_name": spec.model.name,
        "arch": spec.model.arch,
        "strategy_kind": strategy_kind(spec.strategy),
        "world_size": int(spec.hardware.num_devices),
        "iteration_time_ms": float(iteration_time_ms),
        "iteration_p10_ms": None if iteration_p10_ms is None else float(iteration_p10_ms),
        "iteration_p90_ms": None if iteration_p90_ms is None else float(iteration_p90_ms),
        "repeats": int(repeats),
        "warmup": int(warmup),
        "peak_memory_MiB": None if peak_memory_MiB is None else float(peak_memory_MiB),
        "per_op": per_op,
        "device_name": device.name,
        "device": canonical_json(device.to_dict()),
        "backend": backend,
        "threads": int(threads),
        "host": host,
        "source": source,
        "measured_at": measured_at,
    }
    assert set(rec) == set(STEP_COLUMNS)  # the schema is the contract; fail loudly if it moves
    return rec


def _model_with_seq(model: Any, seq: int) -> Any:
    """The ``model`` value with its sequence length replaced (catalog names are expanded to do so)."""
    if isinstance(model, str):
        from ..catalog import get_model

        try:
            return {**get_model(model, field="model"), "seq_length": seq}
        except SpecError as exc:
            raise _FieldError(exc.field, exc.message) from None
    return {**model, "seq_length": seq}


def _row_run(row: dict) -> dict:
    """The run-format dict of a row (from its ``run`` column or its flat columns)."""
    kinds = _strategy_kinds()
    flat = [k for k in row if k in _FLAT_RUN_COLUMNS or k in HARDWARE_COLUMNS or k in kinds]
    if "run" in row:
        if flat:
            raise _FieldError(flat[0], "a row gives either a 'run' column or the flat run columns, not both")
        run = dict(_json_object(row["run"], "run"))
    else:
        if "model" not in row:
            raise _FieldError("model", "required column is missing (give model, device or cluster and "
                                       "num_devices, or one 'run' column)")
        model = _json_or_name(row["model"], "model", "catalog model")
        if "seq_length" in row:
            seq = _to_int(row["seq_length"], "seq_length")
            if seq < 1:
                raise _FieldError("seq_length", f"must be >= 1, got {seq}")
            model = _model_with_seq(model, seq)
        if "device" not in row and "cluster" not in row:
            raise _FieldError("device", "required column is missing (give device or cluster)")
        hardware: dict[str, Any] = {}
        if "device" in row:
            hardware["device"] = _json_or_name(row["device"], "device", "catalog device")
        if "cluster" in row:
            hardware["cluster"] = _to_str(row["cluster"], "cluster")
        if "num_devices" not in row:
            raise _FieldError("num_devices", "required column is missing")
        hardware["num_devices"] = _to_int(row["num_devices"], "num_devices")
        for key in HARDWARE_COLUMNS:
            if key in row:
                hardware[key] = (_to_int(row[key], key) if key == "devices_per_node" else
                                 _json_object(row[key], key) if key == "collective_busbw_ratio" else
                                 _to_float(row[key], key))
        strategy = {key: _COERCE[kind](row[key], key) for key, kind in kinds.items() if key in row}
        run = {"model": model, "hardware": hardware, "strategy": strategy}
        if "id" in row:
            run["id"] = str(_plain(row["id"])).strip()
    if "framework" in row:
        meta = run.get("meta") or {}
        if not isinstance(meta, dict):
            raise _FieldError("run.meta", "expected a JSON object")
        run["meta"] = {**meta, "framework": _to_str(row["framework"], "framework")}
    return run


def row_step_record(row: dict, *, source: str) -> dict:
    """Validate one run-log row (column → value, missing values already dropped) into a step record.

    Raises:
        SpecError: naming the offending column or run-format field (``RowError`` adds the location).
    """
    try:
        return _row_record(row, source)
    except _FieldError as exc:
        raise SpecError(exc.field, exc.message) from None


def _row_record(row: dict, source: str) -> dict:
    from ..specs import RunSpec

    run = _row_run(row)
    try:
        spec = RunSpec.from_dict(run)
    except SpecError as exc:
        raise _FieldError(exc.field, exc.message) from None

    given = {k: _to_positive(row[k], k) for k in TARGET_COLUMNS if k in row}
    if not given:
        raise _FieldError("iteration_time_ms", "required column is missing (give iteration_time_ms, "
                                               "tokens_per_second or samples_per_second)")
    batch, seq = spec.strategy.global_batch_size, spec.model.seq_length
    implied = {}
    for key, value in given.items():
        if key == "iteration_time_ms":
            implied[key] = value
        elif key == "tokens_per_second":
            implied[key] = 1000.0 * batch * seq / value
        else:
            implied[key] = 1000.0 * batch / value
    first = next(iter(implied))
    t_ms = implied[first]
    for key, value in implied.items():
        if abs(value - t_ms) > _TARGET_TOLERANCE * t_ms:
            raise _FieldError(key, f"implies iteration_time_ms = {value:.6g} (global batch {batch}, seq_length "
                                   f"{seq}) but {first} gives {t_ms:.6g}: more than 1 % apart")

    p10 = _to_positive(row["iteration_p10_ms"], "iteration_p10_ms") if "iteration_p10_ms" in row else None
    p90 = _to_positive(row["iteration_p90_ms"], "iteration_p90_ms") if "iteration_p90_ms" in row else None
    slack = 1e-9 * t_ms
    if p10 is not None and p10 > t_ms + slack:
        raise _FieldError("iteration_p10_ms", f"{p10:.6g} exceeds the median iteration time {t_ms:.6g}")
    if p90 is not None and p90 < t_ms - slack:
        raise _FieldError("iteration_p90_ms", f"{p90:.6g} is below the median iteration time {t_ms:.6g}")
    peak = None
    if "peak_memory_MiB" in row:
        peak = _to_float(row["peak_memory_MiB"], "peak_memory_MiB")
        if peak < 0:
            raise _FieldError("peak_memory_MiB", f"must be >= 0, got {peak}")
    return step_record(
        run, t_ms, source=source, spec=spec, iteration_p10_ms=p10, iteration_p90_ms=p90,
        repeats=_to_count(row["repeats"], "repeats") if "repeats" in row else 0,
        warmup=_to_count(row["warmup"], "warmup") if "warmup" in row else 0,
        peak_memory_MiB=peak,
        backend=_to_str(row["backend"], "backend") if "backend" in row else "unknown",
        threads=_to_count(row["threads"], "threads") if "threads" in row else 0,
        host=_to_str(row["host"], "host") if "host" in row else "unknown",
        measured_at=_iso_utc(row["measured_at"]) if "measured_at" in row else None,
    )


# ----------------------------------------------------------------- file readers
_Row = tuple[str, Union[dict, RowError]]


def _check_columns(columns: Iterable[str], allowed: frozenset[str], path: str, where: str) -> None:
    """Raise InputError for unknown or duplicate column names in a header (a whole-file problem)."""
    seen: set[str] = set()
    for name in columns:
        if name in seen:
            raise InputError(f"{path}: {where}: column {name!r}: appears twice")
        seen.add(name)
        if not name:
            raise InputError(f"{path}: {where}: a column has no name")
        if name not in allowed:
            raise InputError(f"{path}: {where}: column {name!r}: unknown column (see docs/ingest.md; list it in "
                             "ignore_columns to skip it)")


def _unknown_key(row: dict, allowed: frozenset[str]) -> Optional[str]:
    return next((k for k in row if k not in allowed), None)


def _clean(row: dict, ignore: frozenset[str]) -> dict:
    """Drop ignored columns and missing values; strip the names."""
    out = {}
    for key, value in row.items():
        key = str(key).strip()
        if key in ignore or _is_missing(value):
            continue
        out[key] = value
    return out


def _csv_rows(path: str, allowed: frozenset[str], ignore: frozenset[str]) -> Iterator[_Row]:
    try:
        fh = open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                return
            header = [h.strip() for h in header]
            _check_columns([h for h in header if h not in ignore], allowed, path, "line 1 (header)")
            prev = reader.line_num
            for cells in reader:
                # csv counts physical lines; a quoted cell may span several, so a row starts after the last one
                start, prev = prev + 1, reader.line_num
                if not any(c.strip() for c in cells):
                    continue
                where = f"line {start}"
                if len(cells) != len(header):
                    yield where, RowError(path, where, "", f"expected {len(header)} cells (as in the header), "
                                                           f"got {len(cells)}")
                    continue
                yield where, _clean(dict(zip(header, cells)), ignore)
        except csv.Error as exc:
            raise InputError(f"{path}: line {reader.line_num}: not valid CSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not UTF-8 text: {exc.reason}") from None


def _parquet_rows(path: str, allowed: frozenset[str], ignore: frozenset[str]) -> Iterator[_Row]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except Exception as exc:  # pyarrow raises ArrowInvalid etc. for a corrupt file
        raise InputError(f"{path}: not a readable Parquet file: {exc}") from None
    _check_columns([c for c in table.column_names if c not in ignore], allowed, path, "schema")
    for i, row in enumerate(table.to_pylist()):
        yield f"row {i}", _clean(row, ignore)


def _jsonl_rows(path: str, allowed: frozenset[str], ignore: frozenset[str]) -> Iterator[_Row]:
    from ..io import read_jsonl

    for line_no, item in read_jsonl(path):
        where = f"line {line_no}"
        if isinstance(item, InputError):
            message = str(item)
            prefix = f"{where}: "
            yield where, RowError(path, where, "", message[len(prefix):] if message.startswith(prefix) else message)
            continue
        yield where, _row_or_unknown(item, path, where, allowed, ignore)


def _row_or_unknown(item: Any, path: str, where: str, allowed: frozenset[str],
                    ignore: frozenset[str]) -> Union[dict, RowError]:
    if not isinstance(item, dict):
        return RowError(path, where, "", f"expected a JSON object, got {type(item).__name__}")
    row = _clean(item, ignore)
    unknown = _unknown_key(row, allowed)
    if unknown is not None:
        return RowError(path, where, unknown, "unknown column (see docs/ingest.md; list it in ignore_columns "
                                              "to skip it)")
    return row


def _json_rows(path: str, allowed: frozenset[str], ignore: frozenset[str]) -> Iterator[_Row]:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text: {exc.reason}") from None
    try:
        whole = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        whole = None
    if isinstance(whole, list):
        for i, item in enumerate(whole):
            yield f"item {i}", _row_or_unknown(item, path, f"item {i}", allowed, ignore)
    elif isinstance(whole, dict):
        yield "line 1", _row_or_unknown(whole, path, "line 1", allowed, ignore)
    else:  # not one JSON document: JSON Lines with a .json name
        yield from _jsonl_rows(path, allowed, ignore)


def iter_run_log(path: PathLike, *, ignore_columns: Iterable[str] = ()) -> Iterator[Union[dict, RowError]]:
    """Yield, per row of a run log, its step record or the :class:`RowError` that rejects it.

    Raises:
        InputError: the file cannot be read, its extension is not supported, or its header names an
            unknown or duplicate column (a whole-file problem, raised on the first ``next()``).
    """
    name = os.fspath(path)
    fmt = _SUFFIXES.get(Path(name).suffix.lower())
    if fmt is None:
        raise InputError(f"{name}: unsupported file type {Path(name).suffix or '(none)'!r}; a run log is "
                         ".csv, .parquet, .jsonl or .json")
    if not Path(name).is_file():
        raise InputError(f"{name}: cannot read: no such file")
    ignore = frozenset(str(c) for c in ignore_columns)
    allowed = allowed_columns()
    source = f"ingested:{Path(name).name}"
    reader = {"csv": _csv_rows, "parquet": _parquet_rows, "jsonl": _jsonl_rows, "json": _json_rows}[fmt]
    for where, row in reader(name, allowed, ignore):
        if isinstance(row, RowError):
            yield row
            continue
        try:
            yield _row_record(row, source)
        except _FieldError as exc:
            yield RowError(name, where, exc.field, exc.message)


def read_run_log(path: PathLike, *, errors: str = "raise",
                 ignore_columns: Iterable[str] = ()) -> Union[list[dict], IngestResult]:
    """Read a run log (CSV, Parquet, JSON Lines or JSON) into step records.

    Args:
        path: the file; its extension selects the format.
        errors: ``"raise"`` (default): the first bad row raises its :class:`RowError`, so nothing is
            dropped silently. ``"collect"``: return an :class:`IngestResult` with the good records and
            one :class:`RowError` per rejected row (``result.rejected`` counts them).
        ignore_columns: extra columns to skip on purpose (notes, job ids...); any other unknown
            column is an error.

    Returns:
        A list of step records (``"raise"``), or an :class:`IngestResult` (``"collect"``).

    Raises:
        RowError: (``"raise"``) a row is invalid; the message names the file, line/row and field.
        InputError: the file itself cannot be read (in both modes).
        ValueError: ``errors`` is neither ``"raise"`` nor ``"collect"``.
    """
    if errors not in ("raise", "collect"):
        raise ValueError(f"errors must be 'raise' or 'collect', got {errors!r}")
    records: list[dict] = []
    bad: list[RowError] = []
    for item in iter_run_log(path, ignore_columns=ignore_columns):
        if isinstance(item, RowError):
            if errors == "raise":
                raise item
            bad.append(item)
        else:
            records.append(item)
    return records if errors == "raise" else IngestResult(records, bad)


# ======================================================================= profiler traces
#: Event categories of host-side events (ops, annotations, CUDA runtime calls), lower case.
_HOST_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "operator", "runtime",
                        "privateuse1_runtime", "xpu_runtime", "mtia_runtime", "privateuse1_driver"})
#: Event categories of device activity.
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "privateuse1_runtime", "xpu_runtime",
                           "mtia_runtime", "privateuse1_driver"})

#: Kineto "Input type" of a tensor → (dtype name, bytes per element).
_TORCH_DTYPES = {
    "float": ("fp32", 4), "c10::BFloat16": ("bf16", 2), "c10::Half": ("fp16", 2), "double": ("fp64", 8),
    "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1), "long int": ("int64", 8), "long": ("int64", 8), "int": ("int32", 4),
    "short int": ("int16", 2), "short": ("int16", 2), "signed char": ("int8", 1), "unsigned char": ("uint8", 1),
    "bool": ("bool", 1), "c10::complex<float>": ("complex64", 8), "c10::complex<double>": ("complex128", 16),
    "c10::complex<c10::Half>": ("complex32", 4),
}
#: record_param_comms "dtype" (c10 ScalarType names) → (dtype name, bytes per element).
_COMM_DTYPES = {"Float": ("fp32", 4), "BFloat16": ("bf16", 2), "Half": ("fp16", 2), "Double": ("fp64", 8),
                "Long": ("int64", 8), "Int": ("int32", 4), "Short": ("int16", 2), "Char": ("int8", 1),
                "Byte": ("uint8", 1), "Bool": ("bool", 1), "Float8_e4m3fn": ("fp8", 1), "Float8_e5m2": ("fp8", 1)}
_FLOAT_DTYPES = frozenset({"fp32", "bf16", "fp16", "fp64", "fp8"})

#: FLOPs per element of the largest tensor, per memory-bound kind: the values of graph.trace.
_FLOPS_PER_ELEM = {"elementwise": 1.0, "softmax": 5.0, "layernorm": 5.0, "rmsnorm": 5.0, "cross_entropy": 5.0,
                   "embedding": 0.0, "optimizer": 0.0}
#: Reductions whose output is smaller than their input (dims in Concrete Inputs[1], keepdim in [2]).
_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "var", "std", "norm", "prod", "all", "any",
                         "argmax", "argmin", "logsumexp", "count_nonzero", "linalg_vector_norm", "var_mean",
                         "std_mean"})
#: Attention kernels outside graph.trace's table (the inner calls of SDPA on CUDA).
_EXTRA_ATTENTION = frozenset({"_flash_attention_forward", "_efficient_attention_forward", "_flash_attention",
                              "_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
                              "_scaled_dot_product_cudnn_attention"})
#: Argument position of ``is_causal`` per attention op (forward and ``*_backward``).
_CAUSAL_ARG = {"scaled_dot_product_attention": 5, "_scaled_dot_product_flash_attention": 4,
               "_scaled_dot_product_flash_attention_for_cpu": 4, "_scaled_dot_product_efficient_attention": 6,
               "_scaled_dot_product_cudnn_attention": 6,
               "_scaled_dot_product_flash_attention_backward": 11,
               "_scaled_dot_product_flash_attention_for_cpu_backward": 7,
               "_scaled_dot_product_efficient_attention_backward": 11}
#: Convolution argument positions: (input, weight, stride, padding, dilation, transposed, output_padding,
#: groups, output_mask); None = not an argument of that op.
_CONV_ARGS = {
    "conv1d": (0, 1, 3, 4, 5, None, None, 6, None), "conv2d": (0, 1, 3, 4, 5, None, None, 6, None),
    "conv3d": (0, 1, 3, 4, 5, None, None, 6, None),
    "conv_transpose1d": (0, 1, 3, 4, 7, "T", 5, 6, None), "conv_transpose2d": (0, 1, 3, 4, 7, "T", 5, 6, None),
    "conv_transpose3d": (0, 1, 3, 4, 7, "T", 5, 6, None),
    "convolution": (0, 1, 3, 4, 5, 6, 7, 8, None), "_convolution": (0, 1, 3, 4, 5, 6, 7, 8, None),
    "convolution_backward": (1, 2, 4, 5, 6, 7, 8, 9, 10),
}
_COMM_PREFIXES = ("c10d::", "c10d_functional::", "_c10d_functional::", "nccl:", "gloo:")
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


class TraceIngest(NamedTuple):
    """What :func:`ingest_trace` returns.

    Attributes:
        ops: operator records (exactly :data:`OP_COLUMNS`), aggregated per identical op.
        steps: per ``ProfilerStep#N`` summary dicts: ``step``, ``time_ms`` (host span), ``num_ops``,
            ``op_time_ms`` (sum of the op occurrences' times inside the step), ``kernel_time_ms`` (summed
            duration of the device activity launched inside it), ``comm_time_ms``.
        unmapped: ATen ops of unknown kind (or without recorded shapes) that made no record:
            name → ``{"count", "time_ms", "reason"}``; nothing is dropped silently.
        unattributed: device activity launched outside any op: kernel name → ``{"count", "time_ms"}``.
        occurrences: number of op calls aggregated into ``ops``.
    """

    ops: list
    steps: list
    unmapped: dict
    unattributed: dict
    occurrences: int


class _Node:
    """A host event in its thread's call tree."""

    __slots__ = ("index", "event", "name", "cat", "ts", "end", "children")

    def __init__(self, index: int, event: dict):
        self.index = index
        self.event = event
        self.name = str(event.get("name", ""))
        self.cat = str(event.get("cat", "")).lower()
        self.ts = float(event["ts"])
        self.end = self.ts + float(event["dur"])
        self.children: list[_Node] = []


@dataclass
class _Occurrence:
    op: str
    kind: str
    direction: str
    shape: list
    params: dict
    dtype: str
    flops: float
    bytes: float
    world_size: int
    backend: str
    time_ms: float
    ts: float
    comm: bool = False
    on_device: bool = False


class _ShapeError(Exception):
    """The op's recorded inputs do not fit its kind's conventions (the op goes to ``unmapped``)."""


def read_chrome_trace(path: PathLike) -> dict:
    """Read and check a Chrome trace JSON (``.json`` or gzip-compressed ``.json.gz``).

    Returns:
        The trace object (a bare JSON array of events is wrapped as ``{"traceEvents": [...]}``).

    Raises:
        InputError: unreadable, not JSON, no ``traceEvents`` list, or an event without a numeric
            ``ts`` (or ``dur``, for complete ``'X'`` events); the message names the file and the
            event index (``traceEvents[i]``).
    """
    name = os.fspath(path)
    try:
        if name.endswith(".gz"):
            with gzip.open(name, "rt", encoding="utf-8") as fh:
                text = fh.read()
        else:
            text = Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, EOFError) as exc:
        raise InputError(f"{name}: not a JSON trace: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: not a JSON trace: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{name}: not a JSON trace: nested too deeply") from None
    return check_trace(data, name)


def check_trace(data: Any, name: str = "<trace>") -> dict:
    """Check the structure of a parsed Chrome trace; return it (a bare event list is wrapped).

    Raises:
        InputError: see :func:`read_chrome_trace`.
    """
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(f"{name}: not a Chrome trace: no 'traceEvents' list")
    for i, ev in enumerate(data["traceEvents"]):
        if not isinstance(ev, dict):
            raise InputError(f"{name}: traceEvents[{i}]: expected a JSON object, got {type(ev).__name__}")
        ph = ev.get("ph")
        if ph == "M":
            continue  # metadata events carry no time
        need = ("ts", "dur") if ph == "X" else ("ts",)
        for key in need:
            value = ev.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                what = "missing" if value is None else f"expected a number, got {value!r}"
                raise InputError(f"{name}: traceEvents[{i}] ({ev.get('name', '?')!r}): field {key!r}: {what}")
        if ph == "X" and ev["dur"] < 0:
            raise InputError(f"{name}: traceEvents[{i}] ({ev.get('name', '?')!r}): field 'dur': negative")
        args = ev.get("args")
        if args is not None and not isinstance(args, dict):
            raise InputError(f"{name}: traceEvents[{i}]: field 'args': expected a JSON object")
    return data


def _load_trace(trace: Any) -> tuple[dict, str]:
    if isinstance(trace, (str, os.PathLike)):
        return read_chrome_trace(trace), os.fspath(trace)
    return check_trace(trace), "<trace>"


def _build_trees(events: list) -> tuple[list[_Node], dict, dict]:
    """Host call trees per (pid, tid), device events by correlation id, device events by External id."""
    by_thread: dict[tuple, list[_Node]] = {}
    dev_by_corr: dict[Any, list[int]] = {}
    dev_by_ext: dict[Any, list[int]] = {}
    for i, ev in enumerate(events):
        if ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        if cat in _HOST_CATS:
            by_thread.setdefault((str(ev.get("pid")), str(ev.get("tid"))), []).append(_Node(i, ev))
        elif cat in _DEVICE_CATS:
            args = ev.get("args") or {}
            if "correlation" in args:
                dev_by_corr.setdefault(args["correlation"], []).append(i)
            if "External id" in args:
                dev_by_ext.setdefault(args["External id"], []).append(i)
    roots: list[_Node] = []
    for nodes in by_thread.values():
        nodes.sort(key=lambda n: (n.ts, -n.end))
        stack: list[_Node] = []
        for node in nodes:
            # 1 ns of slack: Kineto rounds ts and dur separately, so a child may overhang its parent by a hair
            while stack and not (node.ts >= stack[-1].ts and node.end <= stack[-1].end + 1e-3):
                stack.pop()
            (stack[-1].children if stack else roots).append(node)
            stack.append(node)
    return roots, dev_by_corr, dev_by_ext


def _input_list(ev: dict) -> tuple[list, list, list]:
    args = ev.get("args") or {}
    dims = args.get("Input Dims")
    types = args.get("Input type") or []
    concrete = args.get("Concrete Inputs") or []
    if not isinstance(dims, list):
        raise _ShapeError("no 'Input Dims' (profile with record_shapes=True)")
    return dims, list(types), list(concrete)


class _Inputs:
    """The recorded inputs of one op: tensor dims and dtypes by argument position, concrete scalars."""

    def __init__(self, ev: dict):
        dims, types, concrete = _input_list(ev)
        self.dims: list[Optional[list]] = []
        self.dtypes: list[Optional[tuple[str, int]]] = []
        self.lists: list[Optional[list]] = []
        for i, d in enumerate(dims):
            t = types[i] if i < len(types) else ""
            if t in _TORCH_DTYPES and isinstance(d, list) and all(isinstance(x, int) for x in d):
                self.dims.append([int(x) for x in d])
                self.dtypes.append(_TORCH_DTYPES[t])
                self.lists.append(None)
            elif t == "TensorList" and isinstance(d, list) and all(isinstance(x, list) for x in d):
                self.dims.append(None)
                self.dtypes.append(None)
                self.lists.append([[int(v) for v in x] for x in d])
            else:
                self.dims.append(None)
                self.dtypes.append(None)
                self.lists.append(None)
        self.concrete = concrete
        floats = [dt for dt in self.dtypes if dt is not None and dt[0] in _FLOAT_DTYPES]
        anyt = [dt for dt in self.dtypes if dt is not None]
        self.op_dtype = (floats or anyt or [("fp32", 4)])[0]

    def tensor(self, pos: int) -> list:
        """Dims of the tensor argument at ``pos`` (raises _ShapeError when it is not a tensor)."""
        if pos >= len(self.dims) or self.dims[pos] is None:
            raise _ShapeError(f"argument {pos} is not a recorded tensor")
        return self.dims[pos]

    def maybe(self, pos: int) -> Optional[list]:
        return self.dims[pos] if pos < len(self.dims) else None

    def nbytes(self, pos: int) -> float:
        d = self.dims[pos] if pos < len(self.dims) else None
        if d is None:
            lists = self.lists[pos] if pos < len(self.lists) else None
            return float(sum(math.prod(x) for x in lists) * self.op_dtype[1]) if lists else 0.0
        return float(math.prod(d) * self.dtypes[pos][1])

    def all_bytes(self) -> float:
        return sum(self.nbytes(i) for i in range(len(self.dims)))

    def tensors(self) -> list[list]:
        return [d for d in self.dims if d is not None]

    def value(self, pos: int, default: Any = None) -> Any:
        """A concrete scalar argument parsed from its text ('[2, 2]' → [2, 2], 'True' → True)."""
        if pos is None or pos >= len(self.concrete):
            return default
        text = str(self.concrete[pos]).strip()
        if not text:
            return default
        if text in ("True", "False"):
            return text == "True"
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text


def _numel(d: list) -> int:
    return math.prod(d) if d else 1


def _rows_cols(d: list) -> list[int]:
    if not d:
        return [1, 1]
    cols = max(1, d[-1])
    return [max(1, _numel(d) // cols), cols]


@cache
def _aten_tables() -> dict:
    """The ATen name → kind tables of graph.trace (one owner of the mapping)."""
    from ..graph import trace as gt

    return {"view": gt._VIEW_OPS | gt._EMPTY_OPS | {"lift_fresh", "result_type"},
            "classify": gt._classify}


def aten_kind(name: str) -> tuple[Optional[str], bool]:
    """Kind of an ATen op name (with or without ``aten::``) and whether it is a backward op.

    Returns:
        ``(kind, backward)``: kind ``None`` for views and allocations (no data moved), ``"other"`` for
        ops of unknown kind, else a :data:`~learnedperf.graph.ops.COMPUTE_KINDS` name.
    """
    base = name[6:] if name.startswith("aten::") else name
    tables = _aten_tables()
    stripped = base[:-1] if base.endswith("_") and not base.endswith("__") else base
    if stripped in tables["view"]:
        return None, False
    if stripped.startswith("_foreach_"):
        return "elementwise", False
    if stripped.startswith(("_fused_adam", "_fused_sgd", "_fused_adagrad")):
        return "optimizer", False
    backward = False
    for suffix in ("_backward_data", "_backward"):
        if stripped.endswith(suffix):
            stripped, backward = stripped[: -len(suffix)], True
            break
    if stripped in ("embedding_dense", "embedding_sparse", "_embedding_bag_dense"):
        return "embedding", backward
    if stripped in _EXTRA_ATTENTION:
        return "attention", backward
    if stripped == "cross_entropy_loss":
        return "cross_entropy", backward
    kind = tables["classify"](stripped)
    return kind, backward


def _gemm(base: str, x: _Inputs) -> tuple[list, float, float]:
    """(shape [batch, m, n, k], flops, bytes) of a matmul op from its recorded inputs."""
    b = base.rstrip("_")
    out_mn = None  # output elements when it is not batch·m·n
    if b == "linear":
        a, w = x.tensor(0), x.tensor(1)
        k, n, m, batch = a[-1], w[0], _numel(a[:-1]), 1
        if len(w) != 2 or w[1] != k:
            raise _ShapeError(f"linear input {a} and weight {w} do not match")
    elif b in ("mm", "_int_mm"):
        a, w = x.tensor(0), x.tensor(1)
        (m, k), n, batch = a, w[1], 1
    elif b in ("addmm", "_addmm_activation"):
        a, w = x.tensor(1), x.tensor(2)
        (m, k), n, batch = a, w[1], 1
    elif b == "bmm":
        a, w = x.tensor(0), x.tensor(1)
        batch, m, k = a
        n = w[2]
    elif b in ("baddbmm", "addbmm"):
        a, w = x.tensor(1), x.tensor(2)
        batch, m, k = a
        n = w[2]
        if b == "addbmm":
            out_mn = m * n
    elif b in ("mv", "addmv"):
        off = 1 if b == "addmv" else 0
        (m, k), n, batch = x.tensor(off), 1, 1
    elif b in ("dot", "vdot"):
        k, m, n, batch = x.tensor(0)[0], 1, 1, 1
    elif b == "matmul":
        a, w = x.tensor(0), x.tensor(1)
        if len(a) == 1 and len(w) == 1:
            batch, m, n, k = 1, 1, 1, a[0]
        elif len(w) == 1:
            batch, m, k, n = 1, _numel(a[:-1]), a[-1], 1
        elif len(a) == 1:
            batch, m, k, n = _numel(w[:-2]), 1, a[0], w[-1]
        elif len(w) == 2:
            batch, m, k, n = 1, _numel(a[:-1]), a[-1], w[-1]
        else:
            lead_a, lead_b = a[:-2], w[:-2]
            width = max(len(lead_a), len(lead_b))
            lead_a = [1] * (width - len(lead_a)) + lead_a
            lead_b = [1] * (width - len(lead_b)) + lead_b
            batch = math.prod(max(p, q) for p, q in zip(lead_a, lead_b))
            m, k, n = a[-2], a[-1], w[-1]
    else:
        raise _ShapeError(f"no matmul convention for {base}")
    out = out_mn if out_mn is not None else batch * m * n
    flops = 2.0 * batch * m * n * k
    nbytes = x.all_bytes() + out * x.op_dtype[1]
    return [int(batch), int(m), int(n), int(k)], flops, nbytes


def _attention(base: str, x: _Inputs, backward: bool) -> tuple[list, float, float, dict]:
    off = 1 if backward else 0  # backward ops take grad_out first
    q, k, v = x.tensor(off), x.tensor(off + 1), x.tensor(off + 2)
    if len(q) < 2:
        raise _ShapeError(f"attention query {q} has fewer than 2 dims")
    lead = q[:-2]
    bsz = lead[0] if len(lead) >= 2 else 1
    heads = _numel(lead) // max(1, bsz) if lead else 1
    sq, d, skv, dv = q[-2], q[-1], k[-2], v[-1]
    flops = 2.0 * bsz * heads * sq * skv * (d + dv)
    e = x.op_dtype[1]
    if backward:
        writes = (_numel(q) + _numel(k) + _numel(v)) * e
        flops *= 2.0  # graph.trace: attention backward = 2x the forward FLOPs
    else:
        writes = bsz * heads * sq * dv * e
    pos = _CAUSAL_ARG.get(base)
    causal = bool(x.value(pos, False)) if pos is not None else False
    return [int(bsz), int(heads), int(sq), int(skv), int(d)], flops, x.all_bytes() + writes, {"causal": causal}


def _int_list(value: Any, n: int, default: int) -> list[int]:
    if value is None:
        return [default] * n
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * n
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return value * n if len(value) == 1 else value
    raise _ShapeError(f"cannot read {value!r} as {n} integers")


def _conv(base: str, x: _Inputs) -> tuple[list, float, float, dict]:
    """Implicit-GEMM shape (groups, N·out_spatial, Cout/groups, Cin/groups·kernel) as graph.trace."""
    pos = _CONV_ARGS.get(base)
    if pos is None:  # other backends' conv ops: defaults (stride 1, no padding)
        pos = (0, 1, None, None, None, None, None, None, None)
    i_in, i_w, i_s, i_p, i_d, i_t, i_op, i_g, i_mask = pos
    inp, w = x.tensor(i_in), x.tensor(i_w)
    nsp = len(inp) - 2
    if nsp < 1 or len(w) != len(inp):
        raise _ShapeError(f"convolution input {inp} and weight {w} do not match")
    stride = _int_list(x.value(i_s), nsp, 1)
    dilation = _int_list(x.value(i_d), nsp, 1)
    transposed = True if i_t == "T" else bool(x.value(i_t, False))
    out_pad = _int_list(x.value(i_op), nsp, 0)
    pad_value = x.value(i_p)
    groups = x.value(i_g)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        groups = (inp[1] // w[1]) if not transposed and w[1] else 1
    kernel = w[2:]
    spatial = inp[2:]
    if pad_value == "same":
        out_sp = list(spatial)
        padding = None
    else:
        padding = [0] * nsp if pad_value == "valid" else _int_list(pad_value, nsp, 0)
        if transposed:
            out_sp = [(s - 1) * st - 2 * p + dl * (kk - 1) + op + 1
                      for s, st, p, dl, kk, op in zip(spatial, stride, padding, dilation, kernel, out_pad)]
        else:
            out_sp = [(s + 2 * p - dl * (kk - 1) - 1) // st + 1
                      for s, st, p, dl, kk in zip(spatial, stride, padding, dilation, kernel)]
    if any(o < 1 for o in out_sp):
        raise _ShapeError(f"convolution output size {out_sp} < 1")
    n = inp[0]
    if transposed:  # weight [Cin, Cout/groups, *k]
        shape = [groups, n * _numel(spatial), w[1] * _numel(kernel), w[0] // groups]
        cout = w[1] * groups
    else:  # weight [Cout, Cin/groups, *k]
        shape = [groups, n * _numel(out_sp), w[0] // groups, w[1] * _numel(kernel)]
        cout = w[0]
    flops = 2.0 * _numel(shape)
    e = x.op_dtype[1]
    if i_mask is not None:  # convolution_backward: input and/or weight gradients
        mask = x.value(i_mask, [True, True, True])
        mask = mask if isinstance(mask, list) and len(mask) >= 2 else [True, True, True]
        grads = int(bool(mask[0])) + int(bool(mask[1]))
        flops *= grads
        writes = (_numel(inp) if mask[0] else 0) + (_numel(w) if mask[1] else 0) + \
                 (cout if len(mask) > 2 and mask[2] else 0)
    else:
        writes = n * cout * _numel(out_sp)
    params = {"stride": stride, "padding": padding if padding is not None else "same", "dilation": dilation,
              "groups": groups, "transposed": transposed}
    return [int(s) for s in shape], flops, x.all_bytes() + writes * e, params


def _memory_bound(base: str, kind: str, backward: bool, x: _Inputs) -> tuple[list, float, float]:
    """(shape [rows, cols], flops, bytes) of a memory-bound op: reads every tensor input, writes its output."""
    e = x.op_dtype[1]
    stripped = base.rstrip("_")
    tensors = x.tensors()
    lists = [lst for lst in x.lists if lst]
    if kind == "embedding":
        if backward:  # embedding_dense_backward(grad_output, indices, num_weights, ...)
            grad, idx = x.tensor(0), x.tensor(1)
            rows = x.value(2)
            h = grad[-1] if grad else 1
            writes = (rows if isinstance(rows, int) else _numel(idx)) * h * e
            return [int(_numel(idx)), int(h)], 0.0, x.all_bytes() + writes
        weight, idx = x.tensor(0), x.tensor(1)
        h = weight[-1] if weight else 1
        out = _numel(idx) * h
        # graph.trace: an embedding reads only the gathered rows (plus the indices) and writes them
        return [int(_numel(idx)), int(h)], 0.0, x.nbytes(1) + 2.0 * out * e
    if kind == "cross_entropy":
        if backward:  # nll_loss_backward(grad_output, self, target, ...): writes the full-size input gradient
            inp = x.tensor(1)
            shape = [_numel(inp) // max(1, inp[1] if len(inp) >= 2 else _numel(inp)),
                     inp[1] if len(inp) >= 2 else _numel(inp)]
            reads = x.nbytes(0) + x.nbytes(2)
            return shape, 2.0 * 5.0 * _numel(inp), reads + _numel(inp) * e
        inp = x.tensor(0)
        classes = inp[1] if len(inp) >= 2 else _numel(inp)
        rows = _numel(inp) // max(1, classes)
        reduction = x.value(3, 1)
        out = rows if reduction == 0 else 1
        gather = rows * e + x.nbytes(1) + out * e  # nll_loss: one element per row, the targets, the loss
        if stripped == "cross_entropy_loss":
            gather += 2.0 * _numel(inp) * e  # its log_softmax reads and writes the logits once
        return [int(rows), int(classes)], 5.0 * _numel(inp), float(gather)
    if not tensors and not lists:
        raise _ShapeError("no tensor inputs recorded")
    if lists:  # _foreach_* and fused optimizers over lists of tensors
        total = sum(math.prod(d) for d in lists[0])
        reads = x.all_bytes()
        writes = total * e
        return [int(total), 1], _FLOPS_PER_ELEM.get(kind, 1.0) * total, reads + writes
    big = max(tensors, key=_numel)
    numel = _numel(big)
    if kind == "layernorm" and backward:  # writes the input gradient and the weight and bias gradients
        # native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, mask)
        out = _numel(x.tensor(1)) + sum(_numel(d) for d in (x.maybe(5), x.maybe(6)) if d is not None)
    elif kind in ("layernorm", "rmsnorm", "softmax") or backward:
        out = numel
    elif stripped in _REDUCTIONS:
        dims = x.value(1)
        if isinstance(dims, int) and not isinstance(dims, bool):
            dims = [dims]
        if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
            axes = {d % max(1, len(big)) for d in dims}
            # keepdim only adds size-1 dims: the element count is the same either way
            out = math.prod(s for i, s in enumerate(big) if i not in axes)
        else:
            out = 1
    else:
        out = numel
    flops = _FLOPS_PER_ELEM.get(kind, 1.0) * numel * (2.0 if backward else 1.0)
    return _rows_cols(big), flops, x.all_bytes() + out * e


def _compute_occurrence(node: _Node, kind: str, backward: bool, direction: str) -> _Occurrence:
    base = node.name[6:] if node.name.startswith("aten::") else node.name
    x = _Inputs(node.event)
    params: dict = {}
    if kind == "matmul":
        shape, flops, nbytes = _gemm(base, x)
    elif kind == "attention":
        shape, flops, nbytes, params = _attention(base, x, backward)
    elif kind == "conv":
        shape, flops, nbytes, params = _conv(base, x)
    else:
        shape, flops, nbytes = _memory_bound(base, kind, backward, x)
    if backward and direction == "fwd":
        direction = "bwd"
    return _Occurrence(node.name, kind, direction, shape, params, x.op_dtype[0], float(flops), float(nbytes),
                       1, "cpu", 0.0, node.ts)


def _comm_kind(name: str) -> Optional[str]:
    """allreduce / allgather / reducescatter / alltoall / p2p from a collective's name, else None."""
    text = name.split("::")[-1].split(":")[-1].lower().replace("_", "").replace("-", "")
    for prefix, kind in (("allreduce", "allreduce"), ("allgather", "allgather"), ("reducescatter", "reducescatter"),
                         ("alltoall", "alltoall")):
        if text.startswith(prefix):
            return kind
    if text in ("send", "recv", "isend", "irecv", "sendrecv", "batchisendirecv", "p2p"):
        return "p2p"
    return None


def _is_comm_event(node: _Node) -> bool:
    return node.name == "record_param_comms" or node.name.startswith(_COMM_PREFIXES)


def _walk(node: _Node) -> Iterator[_Node]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children)


class _Analysis:
    """One pass over a trace: op occurrences, unmapped ops, kernel attribution, steps."""

    def __init__(self, trace: dict, name: str):
        self.trace = trace
        self.name = name
        self.events = trace["traceEvents"]
        self.roots, self.dev_by_corr, self.dev_by_ext = _build_trees(self.events)
        self.claimed: set[int] = set()
        self.occurrences: list[_Occurrence] = []
        self.unmapped: dict[str, dict] = {}
        dist = trace.get("distributedInfo") or {}
        self.dist_backend = str(dist.get("backend", "")) if isinstance(dist, dict) else ""
        self.dist_world = dist.get("world_size") if isinstance(dist, dict) else None

    # -------------------------------------------------- kernels of a subtree
    def device_events(self, node: _Node) -> list[int]:
        out: list[int] = []
        for n in _walk(node):
            args = n.event.get("args") or {}
            if n.cat in _RUNTIME_CATS and "correlation" in args:
                out.extend(self.dev_by_corr.get(args["correlation"], ()))
            elif n.cat == "cpu_op" and "External id" in args:
                # fallback link for kernels whose runtime event was not recorded
                out.extend(i for i in self.dev_by_ext.get(args["External id"], ())
                           if (self.events[i].get("args") or {}).get("correlation") not in self._runtime_corrs)
        return sorted(set(out))

    @property
    def _runtime_corrs(self) -> set:
        if not hasattr(self, "_corrs"):
            corrs = set()
            for root in self.roots:
                for n in _walk(root):
                    if n.cat in _RUNTIME_CATS:
                        c = (n.event.get("args") or {}).get("correlation")
                        if c is not None:
                            corrs.add(c)
            self._corrs = corrs
        return self._corrs

    def timed(self, node: _Node) -> tuple[float, bool, list[int]]:
        """(time_ms, on_device, device event indices) of an op: kernel time if it launched any, else CPU time."""
        dev = self.device_events(node)
        self.claimed.update(dev)
        if dev:
            return sum(float(self.events[i]["dur"]) for i in dev) / 1e3, True, dev
        return (node.end - node.ts) / 1e3, False, dev

    # -------------------------------------------------- walking the call trees
    def run(self) -> None:
        for root in self.roots:
            self.visit(root, "fwd")

    def visit(self, node: _Node, direction: str) -> bool:
        name = node.name
        if direction != "opt":
            if name.startswith("Optimizer.step#") or name.startswith("Optimizer.zero_grad#"):
                direction = "opt"
            elif name.startswith("autograd::engine::evaluate_function") or re.search(r"Backward\d*$", name):
                direction = "bwd"
        if node.cat in ("cpu_op", "user_annotation", "operator"):
            if _is_comm_event(node):
                if self.comm(node):
                    return True
            elif name.startswith("aten::"):
                kind, backward = aten_kind(name)
                if kind is not None and kind != "other":
                    try:
                        occ = _compute_occurrence(node, kind, backward, direction)
                    except _ShapeError as exc:
                        self.unmap(node, f"{kind}: {exc}")
                        return True
                    occ.time_ms, occ.on_device, _ = self.timed(node)
                    occ.backend = "cuda" if occ.on_device else "cpu"
                    self.occurrences.append(occ)
                    return True
        found = False
        for child in node.children:
            found = self.visit(child, direction) or found
        if not found and name.startswith("aten::") and node.cat in ("cpu_op", "operator"):
            kind, _ = aten_kind(name)
            if kind == "other":
                self.unmap(node, "unknown ATen op kind")
                return True
        return found

    def unmap(self, node: _Node, reason: str) -> None:
        time_ms, _, _ = self.timed(node)
        entry = self.unmapped.setdefault(node.name, {"count": 0, "time_ms": 0.0, "reason": reason})
        entry["count"] += 1
        entry["time_ms"] += time_ms

    def comm(self, node: _Node) -> bool:
        """Record the collective rooted at ``node`` (the outermost comm event); False if it is none."""
        info: dict = {}
        for n in _walk(node):
            args = n.event.get("args") or {}
            if n.name == "record_param_comms" or "Collective name" in args:
                info = args
                break
        time_ms, on_dev, dev = self.timed(node)
        kernel_names = [str(self.events[i].get("name", "")) for i in dev]
        kind = None
        for candidate in (str(info.get("Collective name", "")), node.name):
            kind = kind or (_comm_kind(candidate) if candidate and candidate != "record_param_comms" else None)
        for kname in kernel_names:
            m = _NCCL_KERNEL.search(kname)
            if kind is None and m:
                kind = _comm_kind(m.group(1))
        if kind is None:
            self.unmap(node, "collective of unknown kind (barrier, broadcast, ...)")
            return True
        dtype = _COMM_DTYPES.get(str(info.get("dtype", "")))
        nelems = [info.get(k) for k in ("In msg nelems", "Out msg nelems")]
        nelems = [int(v) for v in nelems if isinstance(v, (int, float)) and not isinstance(v, bool)]
        try:
            x = _Inputs(node.event)
        except _ShapeError:
            x = None
        if dtype is None:
            dtype = x.op_dtype if x is not None else ("fp32", 4)
        if nelems:
            # allgather's output and reducescatter's input are the full buffer: the message of the collective
            nbytes = float(max(nelems) * dtype[1])
        elif x is not None and (x.tensors() or any(x.lists)):
            nbytes = x.nbytes(0)
        else:
            self.unmap(node, f"{kind}: message size unknown (no record_param_comms, no input dims)")
            return True
        group = info.get("Group size")
        group = int(group) if isinstance(group, (int, float)) and not isinstance(group, bool) else \
            (int(self.dist_world) if isinstance(self.dist_world, int) else 0)
        if any(k.lower().startswith("nccl") for k in kernel_names) or "nccl" in node.name.lower():
            backend = "nccl"
        elif "gloo" in node.name.lower():
            backend = "gloo"
        else:
            backend = self.dist_backend or ("cuda" if on_dev else "unknown")
        params = {"group_size": group}
        if info.get("Collective name"):
            params["collective"] = str(info["Collective name"])
        self.occurrences.append(_Occurrence(node.name, kind, "comm", [int(nbytes)], params, dtype[0], 0.0, nbytes,
                                            group, backend, time_ms, node.ts, comm=True, on_device=on_dev))
        return True

    # -------------------------------------------------- summaries
    def steps(self) -> list[dict]:
        spans = []
        for root in self.roots:
            for n in _walk(root):
                m = re.fullmatch(r"ProfilerStep#(\d+)", n.name)
                if m and n.cat == "user_annotation":
                    spans.append((int(m.group(1)), n))
        spans.sort(key=lambda s: (s[0], s[1].ts))
        out = []
        for step, n in spans:
            occ = [o for o in self.occurrences if n.ts <= o.ts <= n.end]
            dev = self.device_events(n)
            comm_dev = sum(o.time_ms for o in occ if o.comm)
            out.append({"step": step, "time_ms": (n.end - n.ts) / 1e3, "num_ops": len(occ),
                        "op_time_ms": sum(o.time_ms for o in occ),
                        "kernel_time_ms": sum(float(self.events[i]["dur"]) for i in dev) / 1e3,
                        "comm_time_ms": comm_dev})
        return out

    def unattributed(self) -> dict:
        out: dict[str, dict] = {}
        for i, ev in enumerate(self.events):
            if ev.get("ph") == "X" and str(ev.get("cat", "")).lower() in _DEVICE_CATS and i not in self.claimed:
                entry = out.setdefault(str(ev.get("name", "")), {"count": 0, "time_ms": 0.0})
                entry["count"] += 1
                entry["time_ms"] += float(ev["dur"]) / 1e3
        return out


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of sorted ``values``."""
    pos = (len(values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _device_from_catalog(name: str) -> Optional[dict]:
    from ..catalog import device_by_reported_name, get_device
    from ..specs import DeviceSpec

    key = device_by_reported_name(name)
    return None if key is None else DeviceSpec.parse(get_device(key), "device").to_dict()


def _resolve_device(trace: dict, device: Any, gpu: bool) -> dict:
    """The descriptor of the device the ops ran on (see :func:`ingest_trace`)."""
    if device is not None:
        from ..catalog import get_device
        from ..specs import DeviceSpec

        if isinstance(device, str):
            return DeviceSpec.parse(get_device(device, field="device"), "device").to_dict()
        return DeviceSpec.parse(device, "device").to_dict()
    if not gpu:
        return {"name": "cpu"}
    props = trace.get("deviceProperties") or []
    if props and isinstance(props[0], dict) and props[0].get("name"):
        p = props[0]
        found = _device_from_catalog(str(p["name"]))
        if found is not None:
            return found
        out: dict[str, Any] = {"name": str(p["name"])}
        if isinstance(p.get("totalGlobalMem"), (int, float)):
            out["memory_GiB"] = round(p["totalGlobalMem"] / 1024**3, 3)
        if isinstance(p.get("numSms"), int):
            out["num_sms"] = p["numSms"]
        return out
    return {"name": "unknown-gpu"}


def _measured_at(trace: dict) -> Optional[str]:
    """UTC time of the first event when the trace states its time base (``baseTimeNanoseconds``)."""
    base = trace.get("baseTimeNanoseconds")
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        return None
    first = min((float(e["ts"]) for e in trace["traceEvents"] if e.get("ph") == "X"), default=0.0)
    seconds = base / 1e9 + first / 1e6
    if not 946684800 <= seconds <= 4102444800:  # 2000..2100: anything else is not a wall-clock base
        return None
    return datetime.fromtimestamp(int(seconds), tz=timezone.utc).isoformat()


def ingest_trace(trace: Any, *, device: Any = None, host: Optional[str] = None, threads: int = 0,
                 source: Optional[str] = None) -> TraceIngest:
    """Operator records and a per-step summary from a PyTorch profiler (Kineto) Chrome trace.

    Args:
        trace: a path (``.json`` or ``.json.gz``) or the parsed trace dict.
        device: descriptor of the device the GPU ops ran on (catalog name or DeviceSpec dict). Default:
            the catalog entry of the trace's ``deviceProperties[0].name`` (its name and memory/SMs only
            if the catalog does not know it); ops that ran on the host get ``{"name": "cpu"}``.
        host: host name; default the trace's ``host_name``, else ``'unknown'``.
        threads: intra-op threads of the profiled process (the trace does not say; 0 = not stated).
        source: the ``source`` column; default ``'ingested:<file name>'``.

    Returns:
        A :class:`TraceIngest`.

    Raises:
        InputError: the trace is malformed (see :func:`read_chrome_trace`).
        SpecError: ``device`` is not a valid descriptor or catalog name.
    """
    data, name = _load_trace(trace)
    an = _Analysis(data, name)
    an.run()
    # ``device`` describes the accelerator when ops ran on one; in a CPU-only trace it describes the CPU
    on_device = any(o.on_device for o in an.occurrences)
    gpu_desc = _resolve_device(data, device, True) if on_device else None
    cpu_desc = _resolve_device(data, None if on_device else device, False)
    host_name = host or str(data.get("host_name") or "unknown")
    when = _measured_at(data)
    src = source or f"ingested:{Path(name).name}"

    groups: dict[tuple, list[_Occurrence]] = {}
    for occ in an.occurrences:
        key = (occ.op, occ.kind, occ.direction, canonical_json(occ.shape), occ.dtype, canonical_json(occ.params),
               occ.backend, occ.world_size, occ.flops, occ.bytes)
        groups.setdefault(key, []).append(occ)
    ops = []
    for key, occs in groups.items():
        times = sorted(o.time_ms for o in occs)
        first = occs[0]
        desc = gpu_desc if first.on_device and gpu_desc is not None else cpu_desc
        rec = {
            "op": first.op, "kind": first.kind, "direction": first.direction, "shape": canonical_json(first.shape),
            "params": canonical_json(first.params), "dtype": first.dtype, "flops": first.flops,
            "bytes": first.bytes, "world_size": first.world_size, "time_ms": _quantile(times, 0.5),
            "time_p10_ms": _quantile(times, 0.1), "time_p90_ms": _quantile(times, 0.9), "repeats": len(times),
            "warmup": 0, "timer": "torch.profiler", "device_name": str(desc.get("name", "unknown")),
            "device": canonical_json(desc), "backend": first.backend, "threads": int(threads), "host": host_name,
            "source": src, "measured_at": when,
        }
        assert set(rec) == set(OP_COLUMNS)
        ops.append(rec)
    return TraceIngest(ops, an.steps(), an.unmapped, an.unattributed(), len(an.occurrences))


def trace_op_records(trace: Any, **kwargs: Any) -> list[dict]:
    """The operator records of :func:`ingest_trace` (same arguments)."""
    return ingest_trace(trace, **kwargs).ops


def trace_step_times(trace: Any) -> list[float]:
    """Host-side durations (ms) of the ``ProfilerStep#N`` spans, in step order.

    With a GPU the host span of a step ends when the CPU reaches the next ``prof.step()``, which
    can run ahead of the device unless the loop synchronises (a ``.item()`` or an optimizer step
    on the host usually does).

    Raises:
        InputError: the trace is malformed.
    """
    data, name = _load_trace(trace)
    roots, _, _ = _build_trees(data["traceEvents"])
    spans = []
    for root in roots:
        for n in _walk(root):
            m = re.fullmatch(r"ProfilerStep#(\d+)", n.name)
            if m and n.cat == "user_annotation":
                spans.append((int(m.group(1)), n.ts, (n.end - n.ts) / 1e3))
    return [t for _, _, t in sorted(spans)]


__all__ = ["HARDWARE_COLUMNS", "IngestResult", "RUN_LOG_COLUMNS", "RowError", "TARGET_COLUMNS", "TraceIngest",
           "allowed_columns", "aten_kind", "check_trace", "ingest_trace", "iter_run_log", "read_chrome_trace",
           "read_run_log", "row_step_record", "step_record", "strategy_kind", "trace_op_records",
           "trace_step_times"]
