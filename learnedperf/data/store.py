"""Storage of a generated data set: Parquet shards, the graph store and ``manifest.json``.

Layout of a data set directory::

    manifest.json                   schema/generator/simulator/cost versions, counts, sha256 of every file,
                                    skipped rows by reason, named splits (written last)
    generate.json                   the arguments and versions of the generation (guards a resume)
    progress.jsonl                  one line per finished shard (what a resume trusts, after re-hashing)
    records-00000.parquet           generated (simulated) records of sample indices [0, S), [S, 2S) ...
    _graphs/graphs-00000.parquet    their execution graphs (one row per run, same order)
    _measured/records-00000.parquet measured records (source = "measured")
    _graphs/measured-00000.parquet  their graphs

The top level holds exactly the generated records, so ``DIR/*.parquet`` of a
``--n N`` generation gives the N runs asked for; measured records and the graphs
are side data in ``_``-prefixed directories (the prefix Parquet tools such as
pyarrow datasets and Spark leave out of a table's files). :func:`load_records`
reads every record of the data set, measured ones included.

Every file is written to a hidden temporary name and moved into place with
:func:`os.replace`, so a reader (or a resumed generation) never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional

from ..errors import InputError
from ..io import load_json_object
from ..measure.records import sha256_file, verify_files

MANIFEST = "manifest.json"
CONFIG = "generate.json"
PROGRESS = "progress.jsonl"
GRAPH_DIR = "_graphs"
MEASURED_DIR = "_measured"
DATASET_FORMAT = "learnedperf-dataset"


def records_name(shard: int) -> str:
    """Relative path of generated records shard ``shard``."""
    return f"records-{shard:05d}.parquet"


def graphs_name(shard: int) -> str:
    """Relative path of the graph shard of generated records shard ``shard``."""
    return f"{GRAPH_DIR}/graphs-{shard:05d}.parquet"


def measured_records_name(part: int = 0) -> str:
    """Relative path of measured records shard ``part``."""
    return f"{MEASURED_DIR}/records-{part:05d}.parquet"


def measured_graphs_name(part: int = 0) -> str:
    """Relative path of the graph shard of measured records shard ``part``."""
    return f"{GRAPH_DIR}/measured-{part:05d}.parquet"


def write_table_atomic(table: Any, path: Path, compression: str = "zstd") -> str:
    """Write a pyarrow table to ``path`` through a temporary file and ``os.replace``; return its sha256."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    pq.write_table(table, tmp, compression=compression)
    digest = sha256_file(tmp)
    os.replace(tmp, path)
    return digest


def write_json_atomic(data: Any, path: Path) -> None:
    """Write JSON (sorted keys, indented) to ``path`` atomically."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def remove_temporaries(directory: Path) -> int:
    """Delete temporary files a killed writer left behind; return how many."""
    count = 0
    for sub in (directory, directory / GRAPH_DIR, directory / MEASURED_DIR):
        if sub.is_dir():
            for f in sub.glob(".*.tmp-*"):
                f.unlink(missing_ok=True)
                count += 1
    return count


def append_progress(directory: Path, entry: dict) -> None:
    """Append one finished shard to ``progress.jsonl`` (one line, flushed and synced)."""
    with open(directory / PROGRESS, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_progress(directory: Path) -> dict[str, dict]:
    """Finished shards whose files still have the recorded sha256, keyed by shard key.

    A line cut by a kill, a missing file or a changed file makes its shard count as
    not done (it is generated again).
    """
    path = directory / PROGRESS
    out: dict[str, dict] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a killed run
        if not isinstance(entry, dict) or "key" not in entry or "files" not in entry:
            continue
        ok = all((directory / rel).is_file() and sha256_file(directory / rel) == info.get("sha256")
                 for rel, info in entry["files"].items())
        if ok:
            out[entry["key"]] = entry
        else:
            out.pop(entry["key"], None)
    return out


def verify(directory: str | Path) -> dict:
    """Load ``manifest.json`` and check the sha256 and row count of every file it lists.

    Returns:
        the manifest.

    Raises:
        InputError: the manifest is missing or unreadable, or a listed file is missing, changed or
            corrupted (the message names the file).
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        raise InputError(f"{path}: no manifest (not a generated data set, or its generation has not finished)")
    manifest = load_json_object(path, "learnedperf data set manifest", DATASET_FORMAT)
    verify_files(directory, manifest.get("files", {}), MANIFEST, what="shard")
    return manifest


def record_files(directory: Path, manifest: Optional[dict] = None, sources: Iterable[str] = ("simulated", "measured")
                 ) -> list[Path]:
    """The record shards of a data set (generated first, then measured), in order."""
    sources = set(sources)
    if manifest is not None:
        files = [directory / rel for rel, info in sorted(manifest["files"].items())
                 if info.get("kind") == "records" and info.get("source") in sources]
        return files
    out = []
    if "simulated" in sources:
        out += sorted(directory.glob("records-*.parquet"))
    if "measured" in sources:
        out += sorted((directory / MEASURED_DIR).glob("records-*.parquet"))
    return out


def load_records(directory: str | Path, columns: Optional[list[str]] = None,
                 sources: Iterable[str] = ("simulated", "measured"), check: bool = False):
    """Every record of a data set as one :class:`pandas.DataFrame` (generated, then measured rows).

    Args:
        directory: the data set directory.
        columns: columns to read (default: all).
        sources: which sources to read.
        check: verify the manifest's checksums first (:func:`verify`).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .records import arrow_schema

    directory = Path(directory)
    manifest = verify(directory) if check else None
    files = record_files(directory, manifest, sources)
    schema = arrow_schema()
    if columns is not None:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise InputError(f"unknown record column(s) {unknown}")
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f, columns=columns))
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{f}: cannot read records shard: {exc}") from None
    if not tables:
        empty = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        return empty.empty_table().to_pandas()
    return pa.concat_tables(tables).to_pandas() if len(tables) > 1 else tables[0].to_pandas()


__all__ = ["CONFIG", "DATASET_FORMAT", "GRAPH_DIR", "MANIFEST", "MEASURED_DIR", "PROGRESS", "append_progress",
           "graphs_name", "load_records", "measured_graphs_name", "measured_records_name", "read_progress",
           "record_files", "records_name", "remove_temporaries", "verify", "write_json_atomic",
           "write_table_atomic"]
