"""The schema of measured records and how they are stored.

Two kinds of record, both plain dicts with the columns below (so that they go
to Parquet with pandas and come back unchanged):

* **operator records** (``ops*.parquet``): one operator, one shape, one dtype,
  one direction, timed on one device. ``kind``, ``shape``, ``flops``, ``bytes``
  and ``dtype`` are the terms of :class:`learnedperf.graph.ops.Op`, so that a
  cost model can be asked about exactly the op that was timed;
* **step records** (``steps*.parquet``): one whole training iteration of a real
  model under a strategy on ``world_size`` processes, with the run in the
  DESIGN.md run format (``run``, a JSON string) and the measured time.

Times are milliseconds: ``time_ms`` / ``iteration_time_ms`` is the median of
``repeats`` timed repetitions after ``warmup`` untimed ones; ``*_p10_ms`` and
``*_p90_ms`` give the spread. ``device`` is the JSON of the device descriptor
(the DeviceSpec fields the micro-benchmarks measured, or the data sheet's for
GPUs), so a record is self-describing.

A data set directory holds the Parquet files and a ``manifest.json`` (host,
software versions, date, exact command, sha256 of every file) written by
:func:`write_manifest`; :func:`verify_manifest` detects a changed file.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from ..errors import InputError
from ..io import load_json_file

SCHEMA_VERSION = 1
"""Version of the record columns below; bumped on any incompatible change."""

OP_COLUMNS = {
    "op": "operator name as profiled, e.g. 'linear', 'sdpa', 'layer_norm', 'adamw'",
    "kind": "cost-model kind (learnedperf.graph.ops.COMPUTE_KINDS or COMM_KINDS)",
    "direction": "'fwd', 'bwd' or 'fwd+bwd' ('opt' for optimizer steps, 'comm' for collectives)",
    "shape": "JSON list: the Op.shape convention of the kind (matmul (batch, m, n, k); attention "
             "(batch, heads, s_q, s_kv, head_dim); others (rows, cols); comm (bytes,))",
    "params": "JSON object of the operator's own arguments (e.g. conv stride), '{}' if none",
    "dtype": "'fp32', 'bf16', 'fp16', ...",
    "flops": "floating-point operations of the timed direction",
    "bytes": "bytes read plus written in memory (message bytes for collectives)",
    "world_size": "processes taking part (1 for compute ops)",
    "time_ms": "median time of one call",
    "time_p10_ms": "10th percentile",
    "time_p90_ms": "90th percentile",
    "repeats": "timed repetitions",
    "warmup": "untimed repetitions before timing",
    "timer": "'perf_counter', 'cuda_event', 'cuda_event_xN' (N back-to-back calls per timed sample) or "
             "'torch.profiler'",
    "device_name": "name of the device descriptor",
    "device": "JSON of the device descriptor (DeviceSpec fields)",
    "backend": "'cpu' or 'cuda' (compute); 'gloo' or 'nccl' (collectives)",
    "threads": "torch intra-op threads per process",
    "host": "host name",
    "source": "'measured' (this project) or the name of a public data set",
    "measured_at": "UTC ISO-8601 time of the measurement",
}

STEP_COLUMNS = {
    "run_id": "stable id: sha256 of the canonical JSON of 'run' (first 16 hex digits)",
    "run": "JSON of the run in the DESIGN.md run format (model, hardware, strategy)",
    "model_name": "name of the model built for the step",
    "arch": "'gpt', 'llama', 'bert', 'mlp', 'cnn'",
    "strategy_kind": "'single', 'dp', 'tp', 'pp', 'zero', 'fsdp' or a '+'-joined mix such as 'tp+dp'",
    "world_size": "processes",
    "iteration_time_ms": "median time of one training iteration (forward, backward, optimizer step)",
    "iteration_p10_ms": "10th percentile",
    "iteration_p90_ms": "90th percentile",
    "repeats": "timed iterations",
    "warmup": "untimed iterations before timing",
    "peak_memory_MiB": "peak resident memory of the busiest process (CPU RSS or CUDA max allocated)",
    "per_op": "JSON list of per-operator timings when profiled, '[]' otherwise",
    "device_name": "name of the device descriptor",
    "device": "JSON of the device descriptor",
    "backend": "'gloo' or 'nccl' ('none' for one process)",
    "threads": "torch intra-op threads per process",
    "host": "host name",
    "source": "'measured' or the name of a public data set",
    "measured_at": "UTC ISO-8601 time",
}


#: Key of a device descriptor's ``sources`` that says its records describe a GPU by its data sheet
#: (:func:`learnedperf.measure.collect.gpu_datasheet`), not by what was measured on it.
DATASHEET_SOURCE = "basis"


def is_datasheet(descriptor: dict) -> bool:
    """Whether a record's device descriptor is a GPU's data sheet (see :data:`DATASHEET_SOURCE`)."""
    return DATASHEET_SOURCE in (descriptor.get("sources") or {})


def canonical_json(value) -> str:
    """Compact JSON with sorted keys: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def run_id(run: dict) -> str:
    """Stable id of a run: the first 16 hex digits of the sha256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(run).encode()).hexdigest()[:16]


def now_utc() -> str:
    """The current UTC time, ISO-8601 to the second."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def host_name() -> str:
    """This machine's host name (the ``<host>`` of ``datasets/measured/<host>/``)."""
    return socket.gethostname() or "unknown-host"


def software_versions() -> dict[str, str]:
    """Versions of Python and of the libraries that shape a measurement."""
    from importlib import metadata

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("learnedperf", "torch", "numpy", "pandas", "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def check_records(records: Iterable[dict], columns: dict, what: str) -> list[dict]:
    """Return ``records`` as a list after checking each has exactly the schema's columns.

    Raises:
        InputError: naming the record index and the missing or unexpected column.
    """
    out = list(records)
    want = set(columns)
    for i, rec in enumerate(out):
        have = set(rec)
        if have != want:
            missing = sorted(want - have)
            extra = sorted(have - want)
            raise InputError(f"{what} record {i}: " + "; ".join(
                s for s in (f"missing column(s) {missing}" if missing else "",
                            f"unexpected column(s) {extra}" if extra else "") if s))
    return out


def write_parquet(records: Iterable[dict], path: str | Path, columns: dict, what: str) -> Path:
    """Write records (checked against ``columns``) to one Parquet file, columns in schema order."""
    import pandas as pd

    rows = check_records(records, columns, what)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=list(columns)).to_parquet(path, index=False)
    return path


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parquet_rows(path: str | Path) -> int:
    """Rows of a Parquet file, from its footer (pandas 3.0.6 with pyarrow 25, a lent GPU's image, reads a
    file with no column selected as 0 rows).

    Raises:
        InputError: the file is missing, truncated or not Parquet (the message names it).
    """
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path).num_rows)
    except Exception as exc:  # pyarrow: truncated or corrupt file
        raise InputError(f"{path}: cannot read its Parquet footer ({type(exc).__name__}: {exc})") from None


def write_manifest(directory: str | Path, *, command: str, host: dict, extra: dict | None = None) -> Path:
    """Write ``directory/manifest.json`` describing every ``*.parquet`` file in it.

    Args:
        directory: the data set directory.
        command: the exact command line that produced the data.
        host: descriptor of the machine (name, CPU, cores, GPU, measured DeviceSpec ...).
        extra: more keys to store (counts, notes).
    """
    directory = Path(directory)
    files = {}
    for f in sorted(directory.glob("*.parquet")):
        files[f.name] = {"sha256": sha256_file(f), "rows": parquet_rows(f)}
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created": now_utc(),
        "command": command,
        "host": host,
        "software": software_versions(),
        "files": files,
        **(extra or {}),
    }
    path = directory / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def verify_manifest(directory: str | Path) -> dict:
    """Load ``manifest.json`` and check every listed file's sha256.

    Raises:
        InputError: the manifest is missing or not JSON, a listed file is missing, or a
            file's checksum differs (the message names the file).
    """
    directory = Path(directory)
    path = directory / "manifest.json"
    manifest = load_json_file(path)
    if not isinstance(manifest, dict):
        raise InputError(f"{path}: expected a JSON object")
    verify_files(directory, manifest.get("files", {}), path.name)
    return manifest


def verify_files(directory: str | Path, files: dict, listed_in: str, what: str = "file") -> None:
    """Check that every ``{relative name: {"sha256": ...}}`` of ``files`` exists with that sha256.

    Raises:
        InputError: naming the missing, changed or corrupted file (``what`` says what it is).
    """
    directory = Path(directory)
    for name, info in sorted(files.items()):
        f = directory / name
        if not f.is_file():
            raise InputError(f"{f}: {what} listed in {listed_in} is missing")
        if not isinstance(info, dict):  # e.g. a bare hash written by hand: named, not a traceback
            raise InputError(f"{f}: its entry in {listed_in} must be an object with a 'sha256', got {info!r}")
        if sha256_file(f) != info.get("sha256"):
            raise InputError(f"{f}: sha256 differs from {listed_in} ({what} changed or corrupted)")


def amend_steps(directory: str | Path, transform, *, command: str, what: str, details: dict | None = None,
                manifest: dict | None = None, record_unchanged: bool = True, kind=None) -> int:
    """Rewrite every step record's run of a data set with ``transform(run) -> run``.

    The ``device`` column and the ``run_id`` follow the new run, and so does ``strategy_kind`` when
    ``kind(run, old_kind) -> kind`` is given; measured values stay as they are.
    Files with a changed run are rewritten; the manifest's file checksums, its quiet-check entries
    (by run id) and its ``amendments`` list (date, command, what, rows changed, and ``details``)
    are updated. ``manifest`` is the already verified (and possibly edited) manifest to write,
    verified here if None. With ``record_unchanged`` false, an amendment that changes no run
    writes nothing at all (running it again changes nothing).

    Returns:
        The number of runs that changed.

    Raises:
        InputError: a missing manifest or a file whose checksum differs (before anything is written).
    """
    import pandas as pd

    directory = Path(directory)
    manifest = verify_manifest(directory) if manifest is None else manifest
    renamed: dict[str, str] = {}
    changed = 0
    for f in sorted(directory.glob("steps*.parquet")):
        steps = pd.read_parquet(f)
        runs, devices, ids, kinds = [], [], [], []
        for rec in steps.to_dict("records"):
            run = transform(json.loads(rec["run"]))
            new_id = run_id(run)
            if new_id != rec["run_id"]:
                renamed[rec["run_id"]] = new_id
            runs.append(canonical_json(run))
            devices.append(canonical_json(run["hardware"]["device"]))
            ids.append(new_id)
            kinds.append(kind(run, rec["strategy_kind"]) if kind is not None else rec["strategy_kind"])
        n = sum(a != b for a, b in zip(ids, steps["run_id"]))
        if not n:
            continue
        changed += n
        steps["run"], steps["device"], steps["run_id"], steps["strategy_kind"] = runs, devices, ids, kinds
        write_parquet(steps.to_dict("records"), f, STEP_COLUMNS, "step")
        manifest["files"][f.name] = {"sha256": sha256_file(f), "rows": int(len(steps))}
    if not changed and not record_unchanged:
        return 0
    for c in manifest.get("collections", []):
        for entry in (c.get("quiet") or {}).get("steps", []):
            if entry.get("run_id") in renamed:
                entry["run_id"] = renamed[entry["run_id"]]
    manifest.setdefault("amendments", []).append({"date": now_utc(), "command": command, "what": what,
                                                   "rows_changed": changed, **(details or {})})
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return changed
