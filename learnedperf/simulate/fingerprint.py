"""A behavioural fingerprint of the simulator: what it answers, not what it is called.

A checkpoint's learned correction multiplies the simulator's time (``gnn_residual``), and a data set's
simulated labels are the simulator's times. Both mean something else once the simulator's behaviour
changes, and a declared version number (``SIMULATOR_VERSION``) is only as good as the discipline of bumping
it: it stayed at 0.1.0 through every change of the graph and of the host model. The fingerprint is the
sha256 of the simulated iteration time, time breakdown and memory per device of a fixed set of reference
runs (tensor, pipeline, sequence, context, expert and sharded data parallelism, interleaved and zero-bubble
schedules, recomputation (and a host-bound step with a non-reentrant checkpoint), autocast with eager
element-wise chains, torch.optim's foreach Adam with gradients freed each step, fp8 and fp32, Hugging Face's
eager attention and written-out GELU, an inference forward and a classification head, on A100s, H100s, a V100
and a T4). A change to the graph
builder, the simulator, the cost model or the catalog that moves any of them changes it; one that moves none
of them (a device, dispatcher or schedule they do not use) does not: the set covers the common paths, not
every path.

Values are rounded to 6 significant digits before hashing: a change below one part in a million is not a
change of behaviour, and the rounding absorbs last-bit differences between platforms (except for a value
that sits on a rounding edge).
"""

from __future__ import annotations

import functools
import hashlib
import json

#: The reference runs (run format). Each exercises a part of the simulator the others do not.
REFERENCE_RUNS: tuple[dict, ...] = (
    {"id": "tp-pp-sp", "model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8},
     "strategy": {"tp": 2, "pp": 2, "micro_batch_size": 2, "global_batch_size": 16, "sequence_parallel": True,
                  "recompute": "selective", "precision": "bf16"}},
    {"id": "interleaved-full-recompute", "model": "gpt3-13b", "hardware": {"cluster": "dgx-a100", "num_devices": 32},
     "strategy": {"tp": 4, "pp": 4, "virtual_pipeline_stages": 2, "pipeline_schedule": "interleaved",
                  "micro_batch_size": 1, "global_batch_size": 64, "recompute": "full", "precision": "bf16"}},
    {"id": "zb-h1", "model": "llama-2-7b", "hardware": {"cluster": "dgx-h100", "num_devices": 8},
     "strategy": {"pp": 4, "pipeline_schedule": "zb-h1", "micro_batch_size": 1, "global_batch_size": 16,
                  "precision": "bf16"}},
    {"id": "fsdp-autocast-eager", "model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_devices": 16},
     "strategy": {"fsdp": True, "micro_batch_size": 1, "global_batch_size": 16, "precision": "bf16",
                  "mixed_precision": "autocast", "fused_elementwise": False}},
    {"id": "torch-optim-loop", "model": "gpt2-medium", "hardware": {"device": "H100-SXM5-80GB", "num_devices": 1},
     "strategy": {"micro_batch_size": 2, "global_batch_size": 2, "precision": "bf16", "mixed_precision": "autocast",
                  "fused_elementwise": False, "optimizer_impl": "foreach", "persistent_grads": False}},
    {"id": "zero1-cp", "model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_devices": 16},
     "strategy": {"cp": 2, "tp": 2, "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": 16,
                  "precision": "bf16"}},
    {"id": "moe-ep", "model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_devices": 32},
     "strategy": {"ep": 8, "pp": 4, "zero_stage": 1, "recompute": "full", "micro_batch_size": 1,
                  "global_batch_size": 64, "precision": "bf16"}},
    {"id": "fp8", "model": "llama-2-13b", "hardware": {"cluster": "dgx-h100", "num_devices": 8},
     "strategy": {"tp": 8, "micro_batch_size": 2, "global_batch_size": 16, "precision": "fp8"}},
    {"id": "fp32-single", "model": "bert-large", "hardware": {"device": "V100-PCIE-32GB", "num_devices": 1},
     "strategy": {"micro_batch_size": 8, "global_batch_size": 8, "precision": "fp32"}},
    # Hugging Face models in eager PyTorch without a fused attention: GPT-2's written-out GELU and the causal
    # eager softmax chain, dropout off in an inference forward; a BERT classifier's backward (the
    # non-causal chain) and its classification head
    {"id": "hf-eager-inference", "hardware": {"device": "T4", "num_devices": 1},
     "model": {"arch": "gpt", "num_layers": 4, "hidden_size": 1280, "num_attention_heads": 20, "vocab_size": 50257,
               "seq_length": 1024, "activation": "gelu_new"},
     "strategy": {"micro_batch_size": 4, "global_batch_size": 4, "precision": "fp32", "flash_attention": False,
                  "fused_elementwise": False, "optimizer": "none", "forward_only": True}},
    {"id": "hf-eager-classifier", "hardware": {"device": "T4", "num_devices": 1},
     "model": {"arch": "bert", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 30522,
               "seq_length": 512, "lm_head": False},
     "strategy": {"micro_batch_size": 8, "global_batch_size": 8, "precision": "fp32", "flash_attention": False,
                  "fused_elementwise": False, "optimizer": "adam"}},
    # small enough that the host binds it: the host cost of a non-reentrant checkpoint shows
    {"id": "host-bound-checkpoint", "model": "bert-base", "hardware": {"cluster": "dgx-h100", "num_devices": 1},
     "strategy": {"micro_batch_size": 2, "global_batch_size": 2, "precision": "bf16", "mixed_precision": "autocast",
                  "recompute": "full", "checkpoint_impl": "non_reentrant"}},
)


def fingerprint_values() -> dict[str, list[str]]:
    """``{run id: [iteration time (s), memory per device (bytes), breakdown (s) by sorted key…]}`` of every
    reference run, each value rounded to 6 significant digits and written as text (what
    :func:`simulator_fingerprint` hashes)."""
    from .simulator import simulate

    out = {}
    for run in REFERENCE_RUNS:
        res = simulate(run)
        values = [res.iteration_time_s, res.memory.total] + [res.breakdown_s[k] for k in sorted(res.breakdown_s)]
        out[run["id"]] = [f"{v:.6g}" for v in values]
    return out


@functools.lru_cache(maxsize=1)
def simulator_fingerprint() -> str:
    """16 hex digits of the sha256 of :func:`fingerprint_values` (computed once per process)."""
    text = json.dumps(fingerprint_values(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = ["REFERENCE_RUNS", "fingerprint_values", "simulator_fingerprint"]
