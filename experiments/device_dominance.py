"""Does the checkpoint ever predict a run slower on a device that has more of everything?

A catalog device *dominates* another when its data sheet gives it at least the other's peak FLOP/s in
every precision the other has, at least its memory bandwidth and memory, and more peak FLOP/s or more
bandwidth somewhere (the H200 over the H100, the A100 80GB over the A100 40GB, the B200 over the H100,
...). A single-device run cannot be slower on the dominating device: no physical reason makes it so, and
a prediction that says otherwise reads something of the descriptor that is not throughput (an
unknown figure, say). For every dominating pair and a few single-device training steps, this prints each
prediction that breaks the order, per tier, and how many comparisons were made. Nothing here is
measured; it is a consistency check of a trained checkpoint on devices nobody measured.

    python experiments/device_dominance.py [--checkpoint DIR] [--tolerance 0.0]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

from _checkpoint import add_checkpoint_argument, load_predictor, tiers_of

#: Single-device training steps (model, micro-batch = global batch, precision) checked on every pair.
RUNS = (("gpt2-medium", 8, "fp32"), ("gpt2-medium", 8, "bf16"), ("gpt3-2.7b", 8, "fp16"), ("llama-2-7b", 1, "bf16"))


def dominates(a: dict, b: dict) -> bool:
    """Whether device ``a`` has at least ``b``'s every peak, bandwidth and memory, and more peak or bandwidth."""
    pa, pb = a["peak_tflops"], b["peak_tflops"]
    if any(v and not (pa.get(k) and pa[k] >= v) for k, v in pb.items()):
        return False
    if a["memory_bandwidth_GBps"] < b["memory_bandwidth_GBps"] or a["memory_GiB"] < b["memory_GiB"]:
        return False
    more_peak = any(v and (not pb.get(k) or v > pb[k]) for k, v in pa.items())
    return more_peak or a["memory_bandwidth_GBps"] > b["memory_bandwidth_GBps"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_checkpoint_argument(ap)
    ap.add_argument("--tolerance", type=float, default=0.0,
                    help="relative excess tolerated before a prediction counts as breaking the order")
    args = ap.parse_args(argv)
    from learnedperf.catalog import get_device, names
    from learnedperf.errors import LearnedPerfError

    t0 = time.perf_counter()
    predictor = load_predictor(args.checkpoint, "device_dominance")
    devices = {n: get_device(n) for n in names("devices")}
    pairs = [(a, b) for a, b in itertools.permutations(sorted(devices), 2) if dominates(devices[a], devices[b])]
    times: dict = {}

    def predict(device: str, run: tuple, tier: str):
        key = (device, run, tier)
        if key not in times:
            model, batch, precision = run
            spec = {"model": model, "hardware": {"device": device, "num_devices": 1, "devices_per_node": 1},
                    "strategy": {"micro_batch_size": batch, "global_batch_size": batch, "precision": precision}}
            try:
                times[key] = predictor.predict(spec, tier=tier)["iteration_time_ms"]
            except LearnedPerfError:  # no such precision on the device, or the run does not fit: not compared
                times[key] = None
        return times[key]

    print(f"checkpoint {predictor.source}: {len(pairs)} ordered pairs of catalog devices where the first "
          f"dominates the second; runs: {', '.join(f'{m} batch {b} {p}' for m, b, p in RUNS)}")
    for tier in tiers_of(predictor, "device_dominance"):
        compared, broken = 0, []
        for a, b in pairs:
            for run in RUNS:
                ta, tb = predict(a, run, tier), predict(b, run, tier)
                if ta is None or tb is None:
                    continue
                compared += 1
                if ta > tb * (1.0 + args.tolerance):
                    broken.append((ta / tb - 1.0, a, ta, b, tb, run))
        print(f"\n{tier} tier: {len(broken)} of {compared} comparisons put the dominating device behind")
        for excess, a, ta, b, tb, run in sorted(broken, reverse=True):
            print(f"  {run[0]} batch {run[1]} {run[2]}: {a} {ta:,.1f} ms > {b} {tb:,.1f} ms ({excess:+.1%})")
    print(f"\n# {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
