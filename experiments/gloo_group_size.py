"""Does a smaller gloo group make a collective faster, when the other groups run at the same time?

On a 2-core VM a hybrid-sharded FSDP2 step (2 copies x 2-rank shard groups on 4 gloo processes) was
no faster than full sharding over all 4 ranks (418 ms vs 410 ms), although the cost model, which
charges a collective by the bytes each rank receives in a ring (NCCL's bus-bandwidth convention:
``(g-1)/g * S`` for all-gather / reduce-scatter, ``2(g-1)/g * S`` for all-reduce), predicts a 2-rank
group to move 1/2 of the payload instead of 3/4. This script measures it directly: inside ONE
``--world``-process gloo job it times each collective on three layouts of the HSDP mesh (2, world/2):

* ``world``: the default group of all ``world`` ranks (full sharding);
* ``shard``: the two shard groups ``{0..h-1}`` and ``{h..world-1}`` (``h = world/2``), both at once;
* ``replica``: the ``h`` replica groups ``{i, i+h}`` (2 ranks each), all at once.

With ``--world 4`` these are ``{0,1,2,3}``, ``{0,1}+{2,3}`` and ``{0,2}+{1,3}``. Every rank calls
its own group's collective at the same moment, as in an HSDP step. ``--sizes-KiB`` is the size of
the FULL tensor (all-gather output, reduce-scatter input, all-reduce buffer), so each layout moves
the same logical payload. Each call is timed "in stream" as in ``collective_in_stream.py``:
``--matmuls`` fp32 matmuls of (128 x hidden) by (hidden x 2*hidden), then one collective with no
barrier; the first 10 calls warm up. The layouts are interleaved call by call (their order rotated
each round) so that drift of a shared, noisy machine hits all of them alike.

The all-gather / reduce-scatter use the flat-tensor calls FSDP2 uses (``all_gather_single`` /
``reduce_scatter_single``, called ``*_into_tensor`` / ``*_tensor`` in older torch); where gloo
lacks one, the list form, and for reduce-scatter then all-reduce + slice, is used instead. The
API chosen per op is probed (and its result checked) on every layout's groups and printed.

Statistics pool the timed calls of all ranks; ``max rank mean`` is the slowest rank's mean (a
step waits for it). ``ratio`` is a layout's mean over the world layout's mean; ``model`` is the
ratio of the ring bytes received per rank, i.e. what the cost model's bandwidth term predicts.

Usage: ``python experiments/gloo_group_size.py [--world 4] [--ops all_gather,reduce_scatter,all_reduce]
[--sizes-KiB 64,512,4096] [--repeats 100] [--matmuls 3] [--hidden 256] [--out FILE.json]``
(on a machine with nothing else running; the defaults take under a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

WARMUP = 10
OPS = ("all_gather", "reduce_scatter", "all_reduce")
#: API candidates per op, in order of preference: FSDP2's flat-tensor calls first
CANDIDATES = {
    "all_gather": ("all_gather_single", "all_gather_into_tensor", "all_gather (list)"),
    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter (list)",
                       "all_reduce + slice"),
    "all_reduce": ("all_reduce",),
}


def layouts(world: int) -> list[tuple[str, list[list[int]]]]:
    """``(name, groups)`` of the three layouts of the HSDP mesh (2, world/2) (see module docstring)."""
    h = world // 2
    return [("world", [list(range(world))]),
            ("shard", [list(range(h)), list(range(h, world))]),
            ("replica", [[i, i + h] for i in range(h)])]


def ring_bytes(op: str, g: int, nbytes: int) -> float:
    """Bytes one rank receives in a ring collective over ``g`` ranks of a ``nbytes`` full tensor
    (the cost model's bandwidth term, ``learnedperf.cost.collective``)."""
    return (2 if op == "all_reduce" else 1) * (g - 1) / g * nbytes


def _make_call(dist, torch, api: str, full, shard, group, index: int, g: int):
    """A no-argument callable running collective ``api`` of ``full`` / ``shard`` on ``group``, where
    this rank is member ``index`` of ``g``."""
    if api in ("all_gather_single", "all_gather_into_tensor"):
        fn = getattr(dist, api)
        return lambda: fn(full, shard, group=group)
    if api == "all_gather (list)":
        # the chunks are views of ``full``, so gloo writes the gathered shards in place
        chunks = list(full.chunk(g))
        return lambda: dist.all_gather(chunks, shard, group=group)
    if api in ("reduce_scatter_single", "reduce_scatter_tensor"):
        fn = getattr(dist, api)
        return lambda: fn(shard, full, group=group)
    if api == "reduce_scatter (list)":
        chunks = list(full.chunk(g))
        return lambda: dist.reduce_scatter(shard, chunks, group=group)
    if api == "all_reduce + slice":
        def call():
            # a copy, since the all-reduce overwrites its buffer and a reduce-scatter must not
            buf = full.clone()
            dist.all_reduce(buf, group=group)
            shard.copy_(buf.chunk(g)[index])
        return call
    if api == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    raise ValueError(f"unknown collective API {api!r}")


def _probe(dist, torch, rank: int, op: str, mine: list[tuple[object, list[int]]]) -> str:
    """The first API of ``op`` that works, with a correct result, on this rank's group of every
    layout on all ranks; all ranks agree on it. Raises RuntimeError when none works."""
    for api in CANDIDATES[op]:
        if not hasattr(dist, api.split(" ")[0]):
            continue  # every rank runs the same torch, so all skip it alike
        ok = True
        for pg, members in mine:
            g = len(members)
            full = torch.full((4 * g,), float(rank + 1))
            shard = torch.full((4,), float(rank + 1))
            try:
                _make_call(dist, torch, api, full, shard, pg, members.index(rank), g)()
            except (RuntimeError, NotImplementedError, ValueError):
                # gloo refuses an unsupported collective before it communicates, on every rank
                ok = False
                break
            if op == "all_gather":
                want = torch.tensor([float(m + 1) for m in members]).repeat_interleave(4)
                ok = ok and torch.equal(full, want)
            elif op == "reduce_scatter":
                ok = ok and torch.equal(shard, torch.full((4,), float(sum(m + 1 for m in members))))
            else:
                ok = ok and torch.equal(full, torch.full((4 * g,), float(sum(m + 1 for m in members))))
        # agree over the world: an API counts only if it worked on every rank
        flag = torch.tensor([1.0 if ok else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() == 1.0:
            return api
    raise RuntimeError(f"gloo: no working API for {op} (tried {', '.join(CANDIDATES[op])})")


def _worker(rank: int, world: int, store: str, ops: list[str], sizes: list[int], repeats: int, matmuls: int,
            hidden: int, gloo_timeout: float, outdir: str) -> None:
    """One rank: build the groups, pick the APIs, time every (op, size, layout); write its times to
    ``outdir/rank<rank>.json``."""
    from learnedperf.measure.bench import _process_group

    # gloo on loopback through a file store, one thread: the collective benchmark's own set-up
    with _process_group(rank, world, store, "gloo", 1, gloo_timeout) as (torch, dist, _device, _sync):
        mine = []  # (process group, member ranks) of the group holding this rank, per layout
        for name, groups in layouts(world):
            if name == "world":
                # the default group, which full sharding over all ranks uses
                mine.append((None, groups[0]))
                continue
            for members in groups:
                # new_group is collective over the world: every rank creates every group, same order
                pg = dist.new_group(members)
                if rank in members:
                    mine.append((pg, members))
        apis = {op: _probe(dist, torch, rank, op, mine) for op in ops}
        a, w = torch.randn(128, hidden), torch.randn(hidden, 2 * hidden)
        names = [name for name, _ in layouts(world)]
        times: dict[str, list[float]] = {}
        for op in ops:
            for size in sizes:
                calls = []
                for pg, members in mine:
                    g = len(members)
                    full = torch.ones(size // 4)
                    shard = torch.ones(size // 4 // g)
                    calls.append(_make_call(dist, torch, apis[op], full, shard, pg, members.index(rank), g))
                rows = [[] for _ in names]
                dist.barrier()  # start every (op, size) together, then no barrier until it is done
                for i in range(WARMUP + repeats):
                    # rotated so no layout always follows the same one; identical on all ranks
                    for k in range(len(names)):
                        j = (i + k) % len(names)
                        for _ in range(matmuls):
                            a @ w
                        t0 = time.perf_counter()
                        calls[j]()
                        if i >= WARMUP:
                            rows[j].append((time.perf_counter() - t0) * 1e3)
                for name, row in zip(names, rows):
                    times[f"{op}|{size}|{name}"] = row
        dist.barrier()
        with open(os.path.join(outdir, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
            json.dump({"apis": apis, "times": times}, fh)


def _stats(samples: list[float]) -> dict:
    """Median, mean and p90 (ms) of ``samples``."""
    s = sorted(samples)
    return {"median_ms": statistics.median(s), "mean_ms": statistics.mean(s), "p90_ms": s[int(0.9 * (len(s) - 1))]}


def _run(args, sizes: list[int], ops: list[str]) -> list[dict]:
    """Spawn the ``args.world`` ranks, wait at most ``args.timeout`` s, and return their payloads."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="learnedperf-groupsize-") as tmp:
        ctx = mp.start_processes(_worker, args=(args.world, os.path.join(tmp, "store"), ops, sizes, args.repeats,
                                                args.matmuls, args.hidden, args.gloo_timeout, tmp),
                                 nprocs=args.world, start_method="spawn", join=False)
        deadline = time.monotonic() + args.timeout
        try:
            # join() re-raises a worker's exception; it returns True once all ranks have exited
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks still running after {args.timeout:.0f} s")
        finally:
            for p in ctx.processes:  # only the processes this run started
                if p.is_alive():
                    p.terminate()
                    p.join(5.0)
        out = []
        for rank in range(args.world):
            with open(os.path.join(tmp, f"rank{rank}.json"), encoding="utf-8") as fh:
                out.append(json.load(fh))
    return out


def main(argv: list[str]) -> int:
    """Parse the options, run the ranks, print the table (and write ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=4, help="number of gloo processes (even, >= 4)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--sizes-KiB", default="64,512,4096", help="FULL-tensor sizes in KiB, comma-separated")
    ap.add_argument("--repeats", type=int, default=100, help="timed calls per (op, size, layout) and rank")
    ap.add_argument("--matmuls", type=int, default=3, help="fp32 matmuls before each collective")
    ap.add_argument("--hidden", type=int, default=256, help="matmul size: (128 x hidden) by (hidden x 2*hidden)")
    ap.add_argument("--timeout", type=float, default=600.0, help="limit for the whole run, s")
    ap.add_argument("--gloo-timeout", type=float, default=120.0, help="gloo's limit for one collective, s")
    ap.add_argument("--out", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.world < 4 or args.world % 2:
        ap.error(f"--world must be an even number >= 4, got {args.world}")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if not ops or any(o not in OPS for o in ops):
        ap.error(f"--ops must be a subset of {','.join(OPS)}, got {args.ops!r}")
    if args.repeats < 1 or args.matmuls < 0 or args.hidden < 1:
        ap.error("--repeats and --hidden must be >= 1, --matmuls >= 0")
    # whole fp32 elements, divisible by the world size so every group's shards are equal
    sizes = [int(float(v) * 1024) // (4 * args.world) * 4 * args.world for v in args.sizes_KiB.split(",")]
    if any(s <= 0 for s in sizes):
        ap.error(f"--sizes-KiB must be at least {args.world * 4 / 1024:g} KiB each, got {args.sizes_KiB!r}")

    t0 = time.perf_counter()
    payloads = _run(args, sizes, ops)
    wall = time.perf_counter() - t0
    apis = payloads[0]["apis"]
    lays = layouts(args.world)
    rows = []
    for op in ops:
        for size in sizes:
            world_row = None
            for name, groups in lays:
                key = f"{op}|{size}|{name}"
                per_rank = [p["times"][key] for p in payloads]
                g = len(groups[0])
                row = {"op": op, "api": apis[op], "layout": name, "groups": groups, "group_size": g,
                       "size_bytes": size, "ring_recv_bytes_per_rank": ring_bytes(op, g, size),
                       **_stats([t for ts in per_rank for t in ts]),
                       "rank0_mean_ms": statistics.mean(per_rank[0]),
                       "max_rank_mean_ms": max(statistics.mean(ts) for ts in per_rank)}
                world_row = world_row or row
                row["mean_ratio_to_world"] = row["mean_ms"] / world_row["mean_ms"]
                row["model_ratio_to_world"] = row["ring_recv_bytes_per_rank"] / world_row["ring_recv_bytes_per_rank"]
                rows.append(row)

    print(f"gloo collectives on {args.world} CPU processes (1 thread each), {args.repeats} timed calls per rank "
          f"after {WARMUP} warm-ups, each after {args.matmuls} matmuls (hidden {args.hidden}); ms over all ranks")
    for name, groups in lays:
        print(f"  layout {name:<8} {' + '.join('{' + ','.join(map(str, m)) + '}' for m in groups)}")
    for op in ops:
        print(f"  {op}: API {apis[op]}")
    print(f"{'op':<15} {'layout':<8} {'g':>2} {'size KiB':>9} {'ring recv KiB':>13} {'median':>8} {'mean':>8} "
          f"{'p90':>8} {'max rank mean':>13} {'ratio':>6} {'model':>6}")
    for r in rows:
        print(f"{r['op']:<15} {r['layout']:<8} {r['group_size']:>2} {r['size_bytes'] / 1024:>9.0f} "
              f"{r['ring_recv_bytes_per_rank'] / 1024:>13.1f} {r['median_ms']:>8.3f} {r['mean_ms']:>8.3f} "
              f"{r['p90_ms']:>8.3f} {r['max_rank_mean_ms']:>13.3f} {r['mean_ratio_to_world']:>6.2f} "
              f"{r['model_ratio_to_world']:>6.2f}")
    print(f"wall time {wall:.1f} s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"config": {"world": args.world, "ops": ops, "sizes_bytes": sizes, "repeats": args.repeats,
                                  "warmup": WARMUP, "matmuls": args.matmuls, "hidden": args.hidden},
                       "apis": apis, "wall_s": wall, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
