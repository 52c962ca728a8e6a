"""Add a measured communication/computation overlap to a data set's multi-process steps.

``learnedperf measure`` measures :func:`~learnedperf.measure.bench.bench_overlap` with the
collectives and writes it into every multi-process step's hardware (``comm_overlap``).
:func:`attach_overlap` does the same for a data set collected before it did: it measures the
overlap on this machine, for each process count of the data set's steps, and amends their runs
(:func:`~learnedperf.measure.records.amend_steps`). It refuses a data set measured on another
host (its CPU model or core count differ): the overlap is the machine's.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError


def attach_overlap(directory: str | Path, command: str = "", loops: int = 7, threads: int = 1) -> dict:
    """Measure the overlap for each process count of the data set's multi-process steps, and put it
    into their runs' hardware (``comm_overlap``).

    Returns:
        ``{world_size: bench_overlap result}``.

    Raises:
        InputError: no manifest or a changed file; a data set of another machine; no multi-process step.
        MeasureError: a benchmark process failed.
    """
    import pandas as pd

    from .bench import bench_overlap, other_machine
    from .records import amend_steps, verify_manifest

    directory = Path(directory)
    manifest = verify_manifest(directory)
    other = other_machine(manifest)
    if other:
        raise InputError(f"{directory}: measured on another machine ({other}); the overlap must be measured where "
                         "the steps were")
    worlds = sorted({int(w) for f in directory.glob("steps*.parquet")
                     for w in pd.read_parquet(f, columns=["world_size"]).world_size if int(w) > 1})
    if not worlds:
        raise InputError(f"{directory}: no multi-process step records")
    results = {w: bench_overlap(w, loops=loops, threads=threads) for w in worlds}

    def transform(run: dict) -> dict:
        w = run["hardware"]["num_devices"]
        if w in results:
            run["hardware"]["comm_overlap"] = round(results[w]["overlap"], 4)
        return run

    amend_steps(directory, transform, manifest=manifest, command=command,
                what="comm_overlap (learnedperf.measure.bench.bench_overlap, measured on this host at the date "
                     "of this amendment) added to the multi-process step records' hardware; run ids follow the runs",
                details={"overlap": {str(w): r for w, r in results.items()}})
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m learnedperf.measure.overlap DATASET_DIR``: amend a data set (:func:`attach_overlap`)."""
    import argparse
    import sys

    from ..errors import LearnedPerfError

    ap = argparse.ArgumentParser(description="Measure how much of an all-reduce concurrent computation hides, "
                                             "and add it to a data set's multi-process steps.")
    ap.add_argument("directory", type=Path)
    ap.add_argument("--loops", type=int, default=7)
    args = ap.parse_args(argv)
    command = f"python -m learnedperf.measure.overlap {args.directory}" + (
        f" --loops {args.loops}" if args.loops != 7 else "")
    try:
        results = attach_overlap(args.directory, command=command, loops=args.loops)
    except LearnedPerfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for w, r in results.items():
        print(f"{w} processes: overlap {r['overlap']:.3f} (loops {r['loop_overlaps']}); compute {r['comp_ms']:.1f} ms, "
              f"all-reduce of {r['bytes'] >> 20} MiB {r['comm_ms']:.1f} ms, both {r['both_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
