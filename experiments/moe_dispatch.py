"""DeepSeek-V3's pre-training step under each way of moving expert tokens, next to the report's figure.

The DeepSeek-V3 report (DeepSeek-AI 2024, arXiv 2412.19437) gives one whole-training figure: "training
DeepSeek-V3 on each trillion tokens requires only 180K H800 GPU hours, i.e., 3.7 days on our cluster with
2048 H800 GPUs" (section 1), with 16-way pipeline, 64-way expert parallelism over 8 nodes, ZeRO-1 data
parallelism, fp8 GEMMs, 4K sequences and a final batch of 15,360 sequences (sections 3.2, 3.3 and 4.2),
IB at 50 GB/s and NVLink at 160 GB/s per GPU (section 3.2.2), the dispatch and combine of its own kernels
(DeepEP) and DualPipe, which hides the all-to-alls behind another micro-batch's computation. This prints
the simulator's and the shipped checkpoint's time of one 15,360-sequence step of that run, with the
alltoall or DeepEP dispatch, all-to-alls blocking or overlapped, and the step time the report's figure
implies: tokens a step / (10^12 tokens / (180,000 GPU-hours / 2048 GPUs)).

One published figure, not a table: it includes what the run format does not model (DualPipe's
bidirectional schedule is run as 1F1B, the multi-token-prediction layer, the batch-size warm-up from 3,072
sequences, recomputed norms and up-projections, load imbalance), and the H800's NVLink here is the data
sheet's 200 GB/s per direction, not the report's measured 160. It is a sanity check of the dispatch
model's direction and size, not an accuracy figure; nothing is fitted to it.

    python experiments/moe_dispatch.py [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import sys

from _checkpoint import add_checkpoint_argument, load_predictor, tiers_of

GPUS, SEQUENCES, SEQ = 2048, 15360, 4096
GPU_HOURS_PER_TRILLION = 180_000  # DeepSeek-V3 report, section 1
RUN = {"model": "deepseek-v3",
       # H800 nodes of 8 (NVLink 400 GB/s both directions); one 400 Gb/s InfiniBand NIC per GPU (section 3.2.2)
       "hardware": {"device": "H800-SXM5-80GB", "num_devices": GPUS, "devices_per_node": 8,
                    "intra_node_bandwidth_GBps": 200, "inter_node_bandwidth_GBps": 50},
       "strategy": {"pp": 16, "ep": 64, "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": SEQUENCES,
                    "precision": "fp8"}}
VARIANTS = (("alltoall, blocking", {}), ("deepep, blocking", {"moe_dispatcher": "deepep"}),
            ("alltoall, overlapped", {"overlap_moe_comm": True}),
            ("deepep, overlapped", {"moe_dispatcher": "deepep", "overlap_moe_comm": True}))


def main(argv=None) -> int:
    """Predict each variant and print it against the report's implied step time."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_argument(ap)
    args = ap.parse_args(argv)
    from learnedperf.simulate import simulate

    predictor = load_predictor(args.checkpoint, "moe_dispatch")
    has_fast = "fast" in tiers_of(predictor, "moe_dispatch")
    seconds_per_trillion = GPU_HOURS_PER_TRILLION / GPUS * 3600.0
    implied_s = SEQUENCES * SEQ / (1e12 / seconds_per_trillion)
    print(f"DeepSeek-V3, {GPUS} H800, pp 16, ep 64, ZeRO-1, fp8, {SEQUENCES} x {SEQ} tokens a step")
    print(f"report's 180K GPU-hours per trillion tokens: {implied_s:.1f} s a step\n")
    print(f"{'dispatch':24s} {'simulator':>10s} {'full':>8s} {'fast':>8s} {'fast/report':>12s}")
    for label, knobs in VARIANTS:
        run = {**RUN, "strategy": {**RUN["strategy"], **knobs}}
        sim_s = simulate(run).iteration_time_s
        full_s = predictor.predict(run, tier="full")["iteration_time_ms"] / 1e3
        if has_fast:
            fast_s = predictor.predict(run, tier="fast")["iteration_time_ms"] / 1e3
            print(f"{label:24s} {sim_s:9.1f}s {full_s:7.1f}s {fast_s:7.1f}s {fast_s / implied_s:11.2f}x")
        else:
            print(f"{label:24s} {sim_s:9.1f}s {full_s:7.1f}s {'-':>8s} {'-':>12s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
