"""The dataset generator: sample → compile → simulate → record → Parquet shards, locally or on Dask.

:func:`run_generate` does everything ``learnedperf generate`` does:

1. checks the arguments and the output directory (a directory holding a
   generation with other arguments is refused, never mixed);
2. splits sample indices ``0 .. n-1`` into shards of ``shard_size`` (a function of
   ``n`` only, so a resume with other ``--workers`` sees the same shards);
3. generates every shard not yet finished — in this process (``workers=1``), in a
   process pool (default: one worker per core) or on a Dask cluster
   (``scheduler``) — plus one task for the measured runs; each task writes its
   Parquet files atomically and returns their sha256, which the parent appends
   to ``progress.jsonl``;
4. writes ``manifest.json`` (versions, counts, sha256 of every file, skipped rows,
   splits).

Killed at any moment (even SIGKILL) and started again with the same arguments,
it re-hashes the finished shards, regenerates the rest and ends with exactly the
records an uninterrupted run writes: a shard is deterministic in ``(seed, its
indices)``, and only a completely written file is ever listed.

Run as a module for a subprocess: ``python -m learnedperf.data.generate --n N --out DIR --seed S``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import InputError, LearnedPerfError, SpecError
from . import store
from .sampler import SAMPLER_VERSION, check_count, check_seed

GENERATOR_VERSION = "0.1.0"
"""Version of the generator (sampling, records, graphs and layout together)."""

DEFAULT_SHARD_SIZE = 250
"""Most sample indices per shard: small enough to lose little to a kill, large enough for cheap Parquet."""

TRANSFORMER_ARCHS = ("gpt", "llama", "bert", "moe")
"""Measured architectures the simulator (hence the record schema) covers."""

log = logging.getLogger("learnedperf.data")


def default_shard_size(n: int) -> int:
    """Shard size for ``n`` runs: at least 8 shards (parallelism, resumability), at most 250 runs each."""
    return max(1, min(DEFAULT_SHARD_SIZE, -(-n // 8)))


def _vtrain_steps() -> list[dict]:
    from ..measure.public import vtrain_step_records

    return vtrain_step_records()


def _neusight_steps() -> list[dict]:
    from ..measure.public import load_neusight_steps

    return load_neusight_steps().records


#: public training runs in ``../shared/data`` a data set may include: origin → (file, step records loader)
PUBLIC_STEPS: dict[str, tuple[str, Callable[[], list[dict]]]] = {
    "vtrain": ("vtrain/ground_truth_single_node.csv", _vtrain_steps),
    "neusight": ("neusight_step_times.csv", _neusight_steps),
}


def repo_measured_dir() -> Path:
    """``datasets/measured`` of the repository this package lives in (absent in a plain install)."""
    return Path(__file__).resolve().parents[2] / "datasets" / "measured"


# ====================================================================== tasks
def generate_shard(task: dict) -> dict:
    """Generate one shard of simulated records (runs in a worker process or on a Dask worker).

    Args:
        task: ``out``, ``shard``, ``start``, ``stop``, ``seed``, ``keep_oom``.

    Returns:
        the progress entry: key, files with sha256 and rows, sampler rejections, timing.
    """
    from ..cost import RooflineCost
    from ..simulate import simulate
    from .graphs import build_graph, graphs_table
    from .records import records_table, simulated_record
    from .sampler import draw

    t0 = time.perf_counter()
    out = Path(task["out"])
    shard, start, stop = task["shard"], task["start"], task["stop"]
    rec_rel, graph_rel = store.records_name(shard), store.graphs_name(shard)
    records, graphs, ids = [], [], []
    rejections: Counter = Counter()
    attempts = 0
    for i in range(start, stop):
        skip = 0
        while True:
            smp = draw(task["seed"], i, task["keep_oom"], skip)
            attempts += smp.attempts
            rejections.update(smp.rejections)
            cost = RooflineCost(smp.spec.hardware)
            # the simulator and the graph share one cost model: its per-op memo makes node times almost free
            try:
                pred = simulate(smp.spec, cost=cost).to_prediction()
            except Exception as exc:  # noqa: BLE001 - a simulator failure must not end a long generation
                if skip >= 20:
                    raise LearnedPerfError(f"sample {i}: the simulator failed on 20 candidates in a row: "
                                           f"{type(exc).__name__}: {exc}") from exc
                rejections[f"simulator error: {type(exc).__name__}"] += 1
                log.warning("sample %d: simulator failed (%s: %s) on %s; taking the next candidate", i,
                            type(exc).__name__, exc, json.dumps(smp.run, sort_keys=True))
                skip += 1
                continue
            break
        gb = build_graph(smp.graph, cost)
        ref = {"graph_shard": graph_rel, "graph_row": len(graphs), "graph_num_nodes": gb.num_nodes,
               "graph_num_edges": len(gb.src)}
        rec = simulated_record(i, smp.run, smp.spec, pred, ref)
        records.append(rec)
        graphs.append(gb)
        ids.append(rec["run_id"])
    # graphs in lz4: twice as fast to write as zstd for 20 % more bytes (records, small, stay zstd)
    g_sha = store.write_table_atomic(graphs_table(ids, graphs), out / graph_rel, compression="lz4")
    r_sha = store.write_table_atomic(records_table(records), out / rec_rel)
    return {
        "key": f"simulated-{shard:05d}", "kind": "simulated", "shard": shard, "start": start, "stop": stop,
        "rows": len(records),
        "files": {rec_rel: {"sha256": r_sha, "rows": len(records), "kind": "records", "source": "simulated"},
                  graph_rel: {"sha256": g_sha, "rows": len(records), "kind": "graphs", "source": "simulated"}},
        "attempts": attempts, "rejections": dict(sorted(rejections.items())),
        "fits_in_memory": sum(1 for r in records if r["fits_in_memory"]),
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }


def _step_files(paths: list[str]) -> list[tuple[Path, str]]:
    """(steps Parquet file, origin label) of every measured data set path (a file or a directory)."""
    out = []
    for p in paths:
        path = Path(p)
        if path.is_file():
            out.append((path, f"file:{path.name}"))
            continue
        default = path.resolve() == repo_measured_dir().resolve() if repo_measured_dir().exists() else False
        if (path / "manifest.json").exists() or any(path.glob("steps*.parquet")):
            hosts = [path]  # one data set directory
        else:
            hosts = sorted(d for d in path.iterdir() if d.is_dir()) if path.is_dir() else []
        for d in hosts:
            label = f"datasets/measured/{d.name}" if default else str(d)
            out.extend((f, label) for f in sorted(d.glob("steps*.parquet")))
    return out


def measured_rows(steps: list[dict], origin: str, seen: set, skipped: Counter, no_prediction: Counter,
                  graph_rel: str, graphs: list, graph_ids: list) -> list[dict]:
    """Records of measured step records (``measure.records.STEP_COLUMNS``), simulated alongside.

    Rows the schema cannot hold are counted in ``skipped`` by reason (never dropped silently);
    rows the simulator cannot predict are kept with null ``sim_*`` columns and counted in
    ``no_prediction``. ``seen`` holds run ids already taken (the first occurrence wins).
    """
    from ..cost import RooflineCost
    from ..graph.execution import compile_run
    from ..measure.records import run_id
    from ..simulate import simulate
    from ..specs import RunSpec
    from .graphs import build_graph
    from .records import measured_record

    out = []
    for step in steps:
        arch = step.get("arch")
        if arch not in TRANSFORMER_ARCHS:
            skipped[f"{origin}: arch {arch!r} is not a transformer (the simulator and the graph store model "
                    "transformers only)"] += 1
            continue
        try:
            run = json.loads(step["run"])
            spec = RunSpec.from_dict(run)
        except (TypeError, ValueError) as exc:  # SpecError is a ValueError; bad JSON too
            field = exc.field if isinstance(exc, SpecError) else "run"
            skipped[f"{origin}: invalid run ({field})"] += 1
            continue
        rid = run_id(run)
        if rid in seen:
            skipped[f"{origin}: duplicate run_id (the same run measured again; the first record is kept)"] += 1
            continue
        seen.add(rid)
        t = step.get("iteration_time_ms")
        if t is None or not t == t or t <= 0:
            skipped[f"{origin}: no positive iteration_time_ms"] += 1
            continue
        cost = RooflineCost(spec.hardware)
        try:
            pred = simulate(spec, cost=cost).to_prediction()
        except Exception as exc:  # noqa: BLE001 - kept without a prediction, and counted by reason
            pred = None
            no_prediction[f"{origin}: {type(exc).__name__}: {str(exc)[:120]}"] += 1
        ref: dict[str, Any] = {"graph_shard": None, "graph_row": None, "graph_num_nodes": None,
                               "graph_num_edges": None}
        try:
            gb = build_graph(compile_run(spec), cost)
        except Exception as exc:  # noqa: BLE001 - the record stays, without a graph; counted
            no_prediction[f"{origin}: no graph: {type(exc).__name__}: {str(exc)[:120]}"] += 1
        else:
            ref = {"graph_shard": graph_rel, "graph_row": len(graphs), "graph_num_nodes": gb.num_nodes,
                   "graph_num_edges": len(gb.src)}
            graphs.append(gb)
            graph_ids.append(rid)
        source = str(step.get("source") or "")
        # ingested and public data sets name themselves; this project's own measurements name their directory
        rec_origin = source if source.startswith("ingested:") or origin in PUBLIC_STEPS else origin
        out.append(measured_record(step, rec_origin, spec, run, pred, ref))
    return out


def generate_measured(task: dict) -> dict:
    """Turn every available measured run into records (one task; see :func:`measured_rows`).

    Args:
        task: ``out``; ``paths``: measured data set directories or step files; ``vtrain`` / ``neusight``:
            include vTrain's / NeuSight's public training runs (``../shared/data``) when present.
    """
    import pandas as pd

    from .graphs import graphs_table
    from .records import records_table

    t0 = time.perf_counter()
    out = Path(task["out"])
    rec_rel, graph_rel = store.measured_records_name(0), store.measured_graphs_name(0)
    skipped: Counter = Counter()
    no_prediction: Counter = Counter()
    unavailable: dict[str, str] = {}
    by_origin: Counter = Counter()
    seen: set = set()
    records: list[dict] = []
    graphs: list = []
    graph_ids: list = []
    paths = task.get("paths") or []
    files = _step_files(paths)
    for p in paths:
        if not Path(p).exists():
            unavailable[str(p)] = "path does not exist"
    if paths and not files:
        unavailable.setdefault(", ".join(map(str, paths)), "no steps*.parquet file found")
    for f, origin in files:
        try:
            steps = pd.read_parquet(f).to_dict("records")
        except Exception as exc:  # noqa: BLE001 - an unreadable file is reported, not fatal
            unavailable[str(f)] = f"cannot read: {type(exc).__name__}: {exc}"
            continue
        rows = measured_rows(steps, origin, seen, skipped, no_prediction, graph_rel, graphs, graph_ids)
        by_origin.update(r["origin"] for r in rows)
        records.extend(rows)
    from ..measure.public import default_shared_data

    for name, (rel, load) in PUBLIC_STEPS.items():
        if not task.get(name):
            continue
        path = default_shared_data() / rel
        if path.exists():
            rows = measured_rows(load(), name, seen, skipped, no_prediction, graph_rel, graphs, graph_ids)
            by_origin.update(r["origin"] for r in rows)
            records.extend(rows)
        else:
            unavailable[name] = f"{path} not found"
    for what, why in unavailable.items():
        log.warning("measured runs: %s skipped: %s", what, why)
    files_out = {}
    if records:
        g_sha = store.write_table_atomic(graphs_table(graph_ids, graphs), out / graph_rel, compression="lz4")
        r_sha = store.write_table_atomic(records_table(records), out / rec_rel)
        files_out = {rec_rel: {"sha256": r_sha, "rows": len(records), "kind": "records", "source": "measured"},
                     graph_rel: {"sha256": g_sha, "rows": len(graph_ids), "kind": "graphs", "source": "measured"}}
    return {"key": "measured", "kind": "measured", "rows": len(records), "files": files_out,
            "by_origin": dict(sorted(by_origin.items())), "skipped": dict(sorted(skipped.items())),
            "no_prediction": dict(sorted(no_prediction.items())), "unavailable": dict(sorted(unavailable.items())),
            "elapsed_s": round(time.perf_counter() - t0, 3)}


def _run_task(task: dict) -> dict:
    """Dispatch a task dict to its function (one picklable entry point for pools and Dask)."""
    return generate_measured(task) if task["kind"] == "measured" else generate_shard(task)


def _die_with_parent() -> None:
    """Pool initializer: on Linux, get SIGKILL when the parent dies (no orphan keeps writing after a kill)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            return
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


# ================================================================= arguments
def _config(n: int, seed: int, keep_oom: bool, shard_size: int, measured: bool, paths: list[str],
            vtrain: bool, neusight: bool) -> dict:
    from ..simulate import SIMULATOR_VERSION
    from ..simulate.fingerprint import simulator_fingerprint
    from .graphs import GRAPH_SCHEMA_VERSION
    from .records import SCHEMA_VERSION, cost_model_version

    return {"format": store.DATASET_FORMAT, "n": n, "seed": seed, "keep_oom": keep_oom, "shard_size": shard_size,
            "measured": measured, "measured_paths": paths if measured else [], "vtrain": bool(measured and vtrain),
            "neusight": bool(measured and neusight),
            "generator_version": GENERATOR_VERSION, "sampler_version": SAMPLER_VERSION,
            "simulator_version": SIMULATOR_VERSION, "simulator_fingerprint": simulator_fingerprint(),
            "cost_model_version": cost_model_version(), "record_schema_version": SCHEMA_VERSION,
            "graph_schema_version": GRAPH_SCHEMA_VERSION}


def _prepare_out(out: Path, config: dict) -> None:
    """Create ``out`` or check that it holds a generation with the same arguments."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / store.CONFIG
    if cfg_path.exists():
        try:
            old = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{cfg_path}: unreadable ({exc}); delete {out} to start over") from None
        diff = [k for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]
        if diff:
            what = "; ".join(f"{k}: {old.get(k)!r} there, {config.get(k)!r} now" for k in diff)
            raise InputError(f"--out {out}: holds a generation with other arguments or versions ({what}); "
                             "use another directory, or delete it to start over")
        return
    others = [p.name for p in out.iterdir() if p.name != ".lock"]
    if others:
        raise InputError(f"--out {out}: not empty and not a learnedperf generation "
                         f"(found {', '.join(sorted(others)[:3])}); use an empty or new directory")
    store.write_json_atomic(config, cfg_path)


def _lock(out: Path):
    """An exclusive lock on ``out`` (two generations never write one directory at once)."""
    import fcntl

    fh = open(out / ".lock", "a+")
    try:
        # a POSIX record lock belongs to this process only: forked workers do not inherit it
        fcntl.lockf(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise InputError(f"--out {out}: another generation is writing this directory") from None
    return fh


# ================================================================= execution
def _execute(tasks: list[dict], workers: int, scheduler: Optional[str], on_done) -> None:
    """Run ``tasks`` and call ``on_done(entry)`` in this process as each finishes."""
    if not tasks:
        return
    if scheduler:
        try:
            from distributed import Client, as_completed
        except ImportError:
            raise LearnedPerfError("--scheduler needs dask[distributed] (pip install 'dask[distributed]')") from None
        try:
            client = Client(scheduler, timeout="20s", set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise LearnedPerfError(f"--scheduler {scheduler}: cannot connect to the Dask scheduler: {exc}") from None
        try:
            futures = [client.submit(_run_task, t, pure=False, key=f"learnedperf-{t['key']}-{os.getpid()}")
                       for t in tasks]
            for fut in as_completed(futures, loop=client.loop):
                on_done(fut.result())
        finally:
            client.close()
        return
    if workers <= 1 or len(tasks) == 1:
        for t in tasks:
            on_done(_run_task(t))
        return
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx,
                             initializer=_die_with_parent) as pool:
        pending = {pool.submit(_run_task, t) for t in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    on_done(fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def run_generate(n: int, out: str | os.PathLike, seed: int = 0, workers: Optional[int] = None,
                 scheduler: Optional[str] = None, keep_oom: bool = False, progress: bool = True,
                 measured: bool = True, *, shard_size: Optional[int] = None,
                 measured_paths: Optional[list] = None, vtrain: bool = True, neusight: bool = True) -> dict:
    """Generate (or resume) a data set of ``n`` simulated runs plus the measured ones; return its manifest.

    Args:
        n: simulated runs (sample indices ``0 .. n-1``).
        out: data set directory (created; an existing one must hold this same generation).
        seed: sampler seed.
        workers: local worker processes (default ``os.cpu_count()``; 1 = in this process).
        scheduler: a Dask scheduler address (``tcp://host:port``): shards become Dask tasks. Workers
            write to ``out`` directly, so it must be on a file system they share.
        keep_oom: keep runs that do not fit in memory (``fits_in_memory = false``) instead of drawing again.
        progress: show a progress bar (rate and ETA) on stderr.
        measured: also turn every available measured run into records (``source = "measured"``).
        shard_size: sample indices per shard (default :func:`default_shard_size`).
        measured_paths: measured data sets (directories of ``steps*.parquet``, or such files); default the
            repository's ``datasets/measured``.
        vtrain: with ``measured``, include vTrain's 1,440 public runs when ``../shared/data`` has them.
        neusight: with ``measured``, include NeuSight's 3 public V100 training runs (forward and backward,
            no optimizer step) when ``../shared/data`` has them.

    Raises:
        InputError: bad arguments, or ``out`` holds something else (another generation, other files).
        LearnedPerfError: the Dask scheduler cannot be reached.
    """
    n = check_count(n, "n")
    seed = check_seed(seed)
    if workers is None:
        workers = os.cpu_count() or 1
    workers = check_count(workers, "workers")
    if shard_size is None:
        shard_size = default_shard_size(n)
    shard_size = check_count(shard_size, "shard_size")
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler.strip()):
        raise InputError("scheduler: expected a Dask scheduler address such as tcp://127.0.0.1:8786, "
                         f"got {scheduler!r}")
    if not isinstance(out, (str, os.PathLike)) or not str(out).strip():
        raise InputError(f"out: expected a directory path, got {out!r}")
    if measured_paths is None:
        measured_paths = [str(repo_measured_dir())] if repo_measured_dir().exists() else []
    paths = [str(Path(p).resolve()) for p in measured_paths]
    out = Path(out)
    config = _config(n, seed, bool(keep_oom), shard_size, bool(measured), paths, vtrain, neusight)
    _prepare_out(out, config)
    lock = _lock(out)
    try:
        return _generate(out, config, workers, scheduler, progress)
    finally:
        lock.close()


def _generate(out: Path, config: dict, workers: int, scheduler: Optional[str], progress: bool) -> dict:
    if (out / store.MANIFEST).exists():
        try:
            manifest = store.verify(out)
        except InputError as exc:
            log.warning("%s; regenerating what is missing or corrupted", exc)
        else:
            if manifest.get("config") == config:
                return manifest
    store.remove_temporaries(out)
    done = store.read_progress(out)
    n, size = config["n"], config["shard_size"]
    shards = [(k, k * size, min(n, (k + 1) * size)) for k in range(-(-n // size))]
    tasks: list[dict] = []
    if config["measured"] and "measured" not in done:
        tasks.append({"kind": "measured", "key": "measured", "out": str(out.resolve()),
                      "paths": config["measured_paths"], "vtrain": config["vtrain"],
                      "neusight": config["neusight"]})
    for k, start, stop in shards:
        key = f"simulated-{k:05d}"
        if key not in done:
            tasks.append({"kind": "simulated", "key": key, "out": str(out.resolve()), "shard": k, "start": start,
                          "stop": stop, "seed": config["seed"], "keep_oom": config["keep_oom"]})
    initial = sum(e["rows"] for e in done.values() if e.get("kind") == "simulated")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, initial=initial, unit="run", desc="generate", file=sys.stderr, dynamic_ncols=True,
                   smoothing=0.05)

    def on_done(entry: dict) -> None:
        store.append_progress(out, entry)
        done[entry["key"]] = entry
        if bar is not None:
            if entry["kind"] == "simulated":
                bar.update(entry["rows"])
            else:
                bar.set_postfix_str(f"measured: {entry['rows']} records")

    try:
        _execute(tasks, workers, scheduler, on_done)
    finally:
        if bar is not None:
            bar.close()
    manifest = _manifest(out, config, done, shards)
    store.write_json_atomic(manifest, out / store.MANIFEST)
    return manifest


def _manifest(out: Path, config: dict, done: dict, shards: list) -> dict:
    """The manifest of a finished generation (checks counts and run id uniqueness first)."""
    import pyarrow.parquet as pq

    from ..measure.records import now_utc, software_versions
    from .graphs import EDGE_TYPES, GRAPH_SCHEMA_VERSION, KINDS, NODE_FEATURES, PHASES, DTYPES
    from .records import RECORD_COLUMNS, SCHEMA_VERSION
    from .splits import split_summary

    sim = [done[f"simulated-{k:05d}"] for k, _a, _b in shards]
    meas = done.get("measured")
    files: dict[str, dict] = {}
    for e in sim + ([meas] if meas else []):
        files.update(e["files"])
    rows_sim = sum(e["rows"] for e in sim)
    if rows_sim != config["n"]:
        raise LearnedPerfError(f"{out}: {rows_sim} generated records instead of {config['n']} (a generator bug)")
    df = store.load_records(out, columns=["run_id", "config_id", "source", "arch", "device_type", "pipeline_schedule",
                                          "pp", "effective_zero_stage", "num_devices", "fits_in_memory"])
    dup = int(df["run_id"].duplicated().sum())
    if dup:
        raise LearnedPerfError(f"{out}: {dup} duplicate run_id(s) across the records (a generator bug)")
    for rel, info in files.items():
        rows = pq.ParquetFile(out / rel).metadata.num_rows
        if rows != info["rows"]:
            raise LearnedPerfError(f"{out / rel}: {rows} rows, {info['rows']} expected")
    rejections: Counter = Counter()
    for e in sim:
        rejections.update(e["rejections"])
    sim_df = df[df["source"] == "simulated"]
    return {
        "format": store.DATASET_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "graph_schema_version": GRAPH_SCHEMA_VERSION,
        "generator_version": GENERATOR_VERSION,
        "sampler_version": config["sampler_version"],
        "simulator_version": config["simulator_version"],
        "simulator_fingerprint": config["simulator_fingerprint"],
        "cost_model_version": config["cost_model_version"],
        "created": now_utc(),
        "command": (f"learnedperf generate --n {config['n']} --out {out} --seed {config['seed']}"
                    + (" --keep-oom" if config["keep_oom"] else "") + ("" if config["measured"] else " --no-measured")),
        "config": config,
        "software": software_versions(),
        "seed": config["seed"],
        "n": config["n"],
        "counts": {
            "records": int(len(df)),
            "by_source": {str(k): int(v) for k, v in sorted(Counter(df["source"]).items())},
            "by_origin": {"generator": rows_sim, **(meas["by_origin"] if meas else {})},
            "simulated_by_family": {str(k): int(v) for k, v in sorted(Counter(sim_df["arch"]).items())},
            "simulated_fits_in_memory": int(sim_df["fits_in_memory"].sum()),
            "duplicate_configurations": int(df["config_id"].duplicated().sum()),
        },
        "sampler": {"attempts": sum(e["attempts"] for e in sim), "rejected": dict(sorted(rejections.items()))},
        "skipped": {"measured": meas["skipped"] if meas else {}},
        "measured_without_prediction": meas["no_prediction"] if meas else {},
        "unavailable_sources": meas["unavailable"] if meas else {},
        "shards": [{"records": store.records_name(k), "graphs": store.graphs_name(k), "indices": [a, b]}
                   for k, a, b in shards],
        "files": dict(sorted(files.items())),
        "columns": {k: {"type": t, "description": d} for k, (t, d) in RECORD_COLUMNS.items()},
        "graph": {"node_features": {k: {"type": t, "description": d} for k, (t, d) in NODE_FEATURES.items()},
                  "kinds": list(KINDS), "phases": list(PHASES), "dtypes": list(DTYPES),
                  "edge_types": list(EDGE_TYPES)},
        "splits": split_summary(df),
    }


# ======================================================================= CLI
def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m learnedperf.data.generate`` (the same as ``learnedperf generate``)."""
    p = argparse.ArgumentParser(prog="python -m learnedperf.data.generate",
                                description="Sample, simulate and store a versioned data set of runs (resumable).")
    p.add_argument("--n", type=int, required=True, help="simulated runs to generate")
    p.add_argument("--out", required=True, metavar="DIR", help="data set directory (resumed if it holds this run)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--workers", type=int, default=None, help="local worker processes (default: all cores)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://127.0.0.1:8786")
    p.add_argument("--keep-oom", action="store_true", help="keep runs that do not fit in memory")
    p.add_argument("--shard-size", type=int, default=None, help="runs per shard (default: n/8, at most 250)")
    p.add_argument("--no-measured", dest="measured", action="store_false", help="leave measured runs out")
    p.add_argument("--no-vtrain", dest="vtrain", action="store_false", help="leave vTrain's public runs out")
    p.add_argument("--no-neusight", dest="neusight", action="store_false",
                   help="leave NeuSight's public training runs out")
    p.add_argument("--measured-path", action="append", default=None, metavar="PATH",
                   help="measured data set directory or steps parquet (repeatable; default datasets/measured)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point: run :func:`run_generate`, print a one-line summary; errors as one line, exit 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        manifest = run_generate(args.n, args.out, args.seed, workers=args.workers, scheduler=args.scheduler,
                                keep_oom=args.keep_oom, progress=args.progress, measured=args.measured,
                                shard_size=args.shard_size, measured_paths=args.measured_path, vtrain=args.vtrain,
                                neusight=args.neusight)
    except LearnedPerfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return 130
    c = manifest["counts"]
    print(f"{c['records']} records in {args.out} ({', '.join(f'{k}: {v}' for k, v in c['by_source'].items())})")
    return 0


if __name__ == "__main__":
    # call through the imported module so that pools and Dask pickle learnedperf.data.generate.*, not __main__.*
    from learnedperf.data.generate import main as _main

    sys.exit(_main())
