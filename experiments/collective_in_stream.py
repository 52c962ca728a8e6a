"""What one all-reduce costs inside a training step, next to what the collective benchmark reports.

``learnedperf measure`` times each collective after a barrier and keeps the median over
repetitions; the link figures of every measured run are fitted on those medians. A training
step is different: its collectives follow each other between computations, with no barrier,
and the step's time is their *sum*, so the expected (mean) time is what adds up, and any
skew between the ranks is paid too. This script times an all-reduce of each size on
``--world`` local gloo processes three ways and prints the median, mean and p90 of each:

* ``barrier``: after a barrier, as the benchmark does;
* ``bare``: back to back, no barrier;
* ``in stream``: each all-reduce after ``--matmuls`` fp32 matmuls of (128 × hidden) by
  (hidden × 2·hidden), the shape of a small tensor-parallel layer, no barrier.

Usage: ``python experiments/collective_in_stream.py [--world 2] [--sizes-KiB 16,128,1024]
[--repeats 300] [--matmuls 3] [--hidden 256]`` (on a machine with nothing else running).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def _worker(rank: int, world: int, store: str, sizes: list[int], repeats: int, matmuls: int, hidden: int,
            out: str) -> None:
    from learnedperf.measure.bench import _process_group

    # gloo on loopback through a file store, one thread: the collective benchmark's own set-up
    with _process_group(rank, world, store, "gloo", 1, 300.0) as (torch, dist, _device, _sync):
        a, w = torch.randn(128, hidden), torch.randn(hidden, 2 * hidden)
        rows = []
        for size in sizes:
            x = torch.zeros(size // 4)
            for mode in ("barrier", "bare", "in stream"):
                times = []
                for i in range(repeats + 10):  # the first 10 warm up
                    if mode == "barrier":
                        dist.barrier()
                    elif mode == "in stream":
                        for _ in range(matmuls):
                            a @ w
                    t0 = time.perf_counter()
                    dist.all_reduce(x)
                    if i >= 10:
                        times.append((time.perf_counter() - t0) * 1e3)
                times.sort()
                rows.append((size, mode, statistics.median(times), statistics.mean(times),
                             times[int(0.9 * (len(times) - 1))]))
        if rank == 0:
            with open(out, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write("\t".join(str(v) for v in row) + "\n")


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes-KiB", default="16,128,1024")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--matmuls", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args(argv)
    sizes = [int(float(v) * 1024) for v in args.sizes_KiB.split(",")]
    with tempfile.TemporaryDirectory(prefix="learnedperf-stream-") as tmp:
        out = os.path.join(tmp, "rows.tsv")
        mp.start_processes(_worker, args=(args.world, os.path.join(tmp, "store"), sizes, args.repeats,
                                          args.matmuls, args.hidden, out), nprocs=args.world, start_method="spawn")
        with open(out, encoding="utf-8") as fh:
            rows = [line.rstrip("\n").split("\t") for line in fh]
    print(f"all-reduce on {args.world} gloo processes, {args.repeats} timed calls each (rank 0's times, ms)")
    print(f"{'size':>9}  {'timing':<10} {'median':>8} {'mean':>8} {'p90':>8}")
    for size, mode, med, mean, p90 in rows:
        print(f"{int(size) // 1024:>6} KiB  {mode:<10} {float(med):8.3f} {float(mean):8.3f} {float(p90):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
