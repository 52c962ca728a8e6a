"""What does ``torch.utils.checkpoint`` cost the host beyond the forward it recomputes?

``learnedperf measure`` recomputes a layer (``recompute: "full"``) with ``torch.utils.checkpoint`` (non-reentrant),
as Hugging Face's ``gradient_checkpointing`` does. The simulator charges the recomputation one more forward of
the layer's kernels. The lent GPUs' steps of small models, which their hosts bind, say full recomputation costs
much more than that: bert-large-like at micro-batch 4 (bf16) takes 49.8 ms without and 103.0 ms with it on the
H200, where one more forward is about 18 ms (``datasets/measured/lent-h200``).

This times, on this machine's CPU with one thread, the layers of tiny models of the harness's families (one
forward and backward per step, so the host's work is most of the time) with and without the checkpoint, and
prints the excess: the step with checkpoint, less the step without, less one forward without, in forwards
without (``excess / forward``), for the non-reentrant checkpoint the harness uses and the reentrant one
(Megatron-LM's ``CheckpointFunction`` works like the latter). Steps of the two kinds alternate and each figure
is a median, so a load that varies slowly weighs on both alike.

    python experiments/checkpoint_overhead.py [--layers 8] [--steps 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

#: Tiny shapes: the host's work per op dominates (hidden 64, 16 tokens, one sequence).
TINY = {"hidden_size": 64, "num_attention_heads": 2, "seq_length": 16, "vocab_size": 128}
FAMILIES = ("gpt-small", "bert-small", "llama-small")


def _model(name: str, layers: int) -> dict:
    from learnedperf.measure.steps import grid_model

    m = {**grid_model(name), **TINY, "num_layers": layers}
    m.pop("ffn_hidden_size", None)
    if "num_kv_heads" in m:
        m["num_kv_heads"] = TINY["num_attention_heads"]
    return m


def _times(net, ids, bf16: bool, steps: int) -> tuple[list[float], list[float]]:
    """Forward and forward+backward seconds of ``steps`` steps (after 5 warm-up steps)."""
    import torch

    fwd, tot = [], []
    for i in range(steps + 5):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = net(ids, ids)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if i >= 5:
            fwd.append(t1 - t0)
            tot.append(t2 - t0)
    return fwd, tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per round and kind")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the kinds")
    args = ap.parse_args(argv)
    import torch

    from learnedperf.measure.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, one thread; {args.layers} layers of {TINY}; "
          f"{args.rounds} rounds x {args.steps} steps per kind; medians in ms")
    print(f"{'model':12} {'prec':5} {'checkpoint':13} {'fwd':>7} {'step':>7} {'fwd ckpt':>9} {'step ckpt':>9} "
          f"{'excess/fwd':>10}")
    ratios: dict[str, list[float]] = {}
    real_checkpoint = torch.utils.checkpoint.checkpoint
    for name in FAMILIES:
        m = _model(name, args.layers)
        ids = torch.randint(0, TINY["vocab_size"], (1, TINY["seq_length"]))
        for bf16 in (False, True):
            for reentrant in (False, True):
                def ckpt(fn, *a, use_reentrant=None, _r=reentrant, **k):
                    return real_checkpoint(fn, *a, use_reentrant=_r, **k)

                torch.utils.checkpoint.checkpoint = ckpt  # the harness imports it at each call
                try:
                    nets = {rc: build_model(m, recompute=rc) for rc in ("none", "full")}
                    if reentrant:  # the reentrant checkpoint needs an input that requires grad to backpropagate
                        for net in nets.values():
                            net.embed.requires_grad_(True)
                    f = {"none": [], "full": []}
                    t = {"none": [], "full": []}
                    for _ in range(args.rounds):
                        for rc in ("none", "full"):
                            a, b = _times(nets[rc], ids, bf16, args.steps)
                            f[rc] += a
                            t[rc] += b
                finally:
                    torch.utils.checkpoint.checkpoint = real_checkpoint
                med = {k: statistics.median(v) * 1e3 for k, v in (("f0", f["none"]), ("t0", t["none"]),
                                                                   ("f1", f["full"]), ("t1", t["full"]))}
                ratio = (med["t1"] - med["t0"] - med["f0"]) / med["f0"]
                kind = "reentrant" if reentrant else "non-reentrant"
                ratios.setdefault(kind, []).append(ratio)
                print(f"{name:12} {'bf16' if bf16 else 'fp32':5} {kind:13} {med['f0']:7.2f} {med['t0']:7.2f} "
                      f"{med['f1']:9.2f} {med['t1']:9.2f} {ratio:10.2f}")
    for kind, r in ratios.items():
        print(f"{kind}: excess over one more forward, in forwards: median {statistics.median(r):.2f} "
              f"(range {min(r):.2f}-{max(r):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
