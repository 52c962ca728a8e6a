"""Speed of the inference API on this machine: import, one prediction, predict_many, the batch CLI.

Prints what it measured (nothing is compared to a target here):

* ``import learnedperf`` in a fresh interpreter (median of 5), and ``import learnedperf.predict``;
* one in-process prediction, p50 / p99 over ``--single`` calls, fast and full tier;
* ``Predictor.predict_many`` throughput (fast tier) on two workloads:
  - *planner*: every strategy :func:`~learnedperf.predict.enumerate_strategies` yields for a few
    (model, cluster) pairs — what a scheduler or auto-parallel planner asks;
  - *diverse*: sampled runs (:func:`~learnedperf.data.sampler.sample_runs`), nearly every one a
    different model and hardware — the worst case for the per-(model, hardware) caches;
* ``learnedperf predict --input`` throughput excluding start-up: the wall time of a big batch
  minus that of a one-line batch, over the line difference.

Usage::

    python experiments/bench_predict.py [--runs 20000] [--cli-lines 20000] [--single 300] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from _checkpoint import add_checkpoint_argument, load_predictor

PLANNER_CASES = [("gpt3-13b", {"cluster": "dgx-a100", "num_devices": 64}, 512),
                 ("gpt3-175b", {"cluster": "dgx-a100", "num_devices": 1024}, 1536),
                 ("llama2-70b", {"cluster": "dgx-h100", "num_devices": 256}, 1024),
                 ("gpt3-1.3b", {"cluster": "dgx-a100", "num_devices": 8}, 64)]


def _import_seconds(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
             for _ in range(5)]
    return statistics.median(times)


def planner_runs(limit: int) -> list[dict]:
    """Every candidate strategy of the planner cases, as runs (at most ``limit``)."""
    from learnedperf.predict import enumerate_strategies
    from learnedperf.specs.run import SpecCache

    cache, runs = SpecCache(), []
    for model, hw, gbs in PLANNER_CASES:
        _c, cands = enumerate_strategies(cache.model(model), cache.hardware(hw), {"global_batch_size": gbs})
        runs += [{"model": model, "hardware": hw, "strategy": s} for s in cands]
    return runs[:limit]


def _throughput(predictor, runs: list, repeats: int = 3) -> tuple[float, int]:
    best, errors = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = predictor.predict_many(runs, errors="return")
        best = min(best, time.perf_counter() - t0)
        errors = sum("error" in p for p in out)
    return len(runs) / best, errors


def _latency_ms(fn, runs: list) -> tuple[float, float]:
    lat = []
    for run in runs:
        t0 = time.perf_counter()
        fn(run)
        lat.append((time.perf_counter() - t0) * 1e3)
    lat.sort()
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(0.99 * len(lat)))]


def _cli_seconds(path: str, out: str, checkpoint: str | None) -> float:
    cmd = [sys.executable, "-m", "learnedperf.cli", "predict", "--input", path, "--output", out]
    t0 = time.perf_counter()
    done = subprocess.run(cmd + (["--checkpoint", checkpoint] if checkpoint else []), check=False,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:  # a failed batch is not a fast one: say why instead of timing it
        raise SystemExit(f"bench_predict: error: learnedperf predict --input exited {done.returncode}: "
                         f"{done.stderr.strip()[-500:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20000, help="runs per predict_many workload")
    ap.add_argument("--cli-lines", type=int, default=20000, help="lines of the big CLI batch")
    ap.add_argument("--single", type=int, default=300, help="calls for the latency percentiles")
    add_checkpoint_argument(ap)
    args = ap.parse_args()

    from learnedperf.data.sampler import sample_runs

    print(f"host: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{platform.machine()}")
    print(f"import learnedperf: {_import_seconds('learnedperf') * 1e3:.1f} ms; "
          f"import learnedperf.predict: {_import_seconds('learnedperf.predict') * 1e3:.1f} ms (median of 5)")
    t0 = time.perf_counter()
    predictor = load_predictor(args.checkpoint, "bench_predict")
    print(f"Predictor.load() of {predictor.source}: {time.perf_counter() - t0:.2f} s (verifies every file, loads "
          "LightGBM and torch)")
    # what the CLI and the service do after loading: the models stay for the whole process, so the
    # cyclic collector need not scan them (without it, p99 latencies include full collections)
    import gc

    gc.freeze()

    # the planner workload keeps the valid strategies only (invalid ones are answered faster, with an error)
    planner = planner_runs(10 * args.runs)
    planner = [r for r, p in zip(planner, predictor.predict_many(planner, errors="return")) if "error" not in p]
    planner = planner[: args.runs]
    diverse = [raw for _i, raw in sample_runs(args.runs, seed=7)]
    for name, runs in (("planner", planner), ("diverse", diverse)):
        rate, errors = _throughput(predictor, runs)
        print(f"predict_many fast tier, {name} workload: {rate:,.0f} predictions/s over {len(runs):,} runs "
              f"({errors:,} answered with an error), best of 3")

    valid = planner
    single = valid[:: max(1, len(valid) // args.single)][: args.single]
    p50, p99 = _latency_ms(lambda r: predictor.predict(r), single)
    print(f"one predict() fast tier: p50 {p50:.3f} ms, p99 {p99:.3f} ms over {len(single)} calls")
    p50, p99 = _latency_ms(lambda r: predictor.predict(r, tier="full"), single[:60])
    print(f"one predict() full tier: p50 {p50:.3f} ms, p99 {p99:.3f} ms over {len(single[:60])} calls")

    with tempfile.TemporaryDirectory() as tmp:
        big, one, out = (os.path.join(tmp, n) for n in ("big.jsonl", "one.jsonl", "out.jsonl"))
        lines = (valid * (args.cli_lines // max(1, len(valid)) + 1))[: args.cli_lines]
        with open(big, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in lines)
        with open(one, "w") as f:
            f.write(json.dumps(lines[0]) + "\n")
        t_one = min(_cli_seconds(one, out, args.checkpoint) for _ in range(2))
        t_big = min(_cli_seconds(big, out, args.checkpoint) for _ in range(2))
        print(f"learnedperf predict --input (fast tier): start-up {t_one:.2f} s; "
              f"{(len(lines) - 1) / (t_big - t_one):,.0f} lines/s excluding start-up "
              f"({len(lines):,} lines in {t_big:.2f} s)")


if __name__ == "__main__":
    main()
