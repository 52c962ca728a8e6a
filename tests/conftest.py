"""Shared fixtures of the graph, collective, simulator and memory tests.

Everything is inline: an A100-like device descriptor (data-sheet numbers, no catalog lookup), small
model dicts, and explicit :class:`~learnedperf.cost.CostParams` so that no test depends on the fitted
constants in ``cost/data/params.json``.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from pathlib import Path

import pytest

from learnedperf.cost import CostParams, RooflineCost
from learnedperf.specs import RunSpec

# A100-SXM4-80GB data-sheet figures (dense peaks), links per device and per direction.
A100_LIKE = {
    "name": "a100-like",
    "vendor": "test",
    "peak_tflops": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "memory_bandwidth_GBps": 2039.0,
    "memory_GiB": 80.0,
    "num_sms": 108,
    "l2_cache_MiB": 40.0,
    "clock_MHz": 1410.0,
    "intra_node_bandwidth_GBps": 300.0,
    "inter_node_bandwidth_GBps": 25.0,
    "devices_per_node": 8,
}

#: Known, hand-picked constants (not the fitted ones).
KNOWN_PARAMS = CostParams(gemm_efficiency_tensor=0.7, gemm_efficiency_fp32=0.8, gemm_k_half=64.0, tile_m=128,
                          tile_n=128, attention_efficiency=0.5, memory_efficiency=0.8, kernel_launch_us=4.0,
                          link_efficiency_intra=0.8, link_efficiency_inter=0.8, alpha_intra_us=5.0,
                          alpha_inter_us=10.0)

#: Ideal machine: no launch overhead, (practically) free communication.
FREE_COMM_PARAMS = CostParams(gemm_efficiency_tensor=0.7, gemm_efficiency_fp32=0.8, gemm_k_half=64.0, tile_m=128,
                              tile_n=128, attention_efficiency=0.5, memory_efficiency=0.8, kernel_launch_us=0.0,
                              link_efficiency_intra=1e9, link_efficiency_inter=1e9, alpha_intra_us=0.0,
                              alpha_inter_us=0.0)

GPT_SMALL = {"name": "gpt-small", "arch": "gpt", "num_layers": 8, "hidden_size": 1024,
             "num_attention_heads": 16, "vocab_size": 50304, "seq_length": 1024}

LLAMA_GQA = {"name": "llama-gqa", "arch": "llama", "num_layers": 4, "hidden_size": 4096,
             "num_attention_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336,
             "vocab_size": 32000, "seq_length": 4096}

MOE = {"name": "moe-8x", "arch": "moe", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
       "num_kv_heads": 4, "ffn_hidden_size": 5632, "vocab_size": 32000, "seq_length": 2048,
       "num_experts": 8, "moe_top_k": 2}


def neusight_gemm_row(name: str, device: dict, B: int, M: int, N: int, K: int, eff: float,
                      memory_eff: float = 0.7) -> dict:
    """A raw ``neusight_ops.parquet`` row of a linear kernel ``[B,M,K] x [K,N]`` on the catalog ``device`` named
    ``name``, timed by the roofline GEMM model (128×128 tiles over the SMs) at ``eff`` of the fp32 peak, a share
    that already holds the k½ ramp and any alignment or power share: synthetic data for the calibration fits."""
    flops, nbytes = 2.0 * B * M * N * K, 4.0 * B * (M * K + K * N + M * N)
    tiles = B * math.ceil(M / 128) * math.ceil(N / 128)
    wave = tiles / (math.ceil(tiles / device["num_sms"]) * device["num_sms"])
    t = max(flops / (device["peak_tflops"]["fp32"] * 1e12 * eff * wave),
            nbytes / (device["memory_bandwidth_GBps"] * 1e9 * memory_eff))
    # NeuSight's columns: N is the reduction dimension (calibrate.fit_gemm_fp32)
    return {"op": "linear", "device": name, "latency_ms": t * 1e3, "B": B, "M": M, "N": K, "K": N}


#: The experiment scripts (``python experiments/NAME.py``), which some tests load as modules.
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load_experiment(name: str):
    """The script ``experiments/<name>.py`` as a module, loaded with its folder on ``sys.path`` (the scripts import
    ``_checkpoint`` beside them) and the folder taken off again."""
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXPERIMENTS))


def hardware(num_devices: int = 8, devices_per_node: int = 8, device: dict | None = None, **links) -> dict:
    """Run-format ``hardware`` object on the inline A100-like device."""
    return {"device": copy.deepcopy(device or A100_LIKE), "num_devices": num_devices,
            "devices_per_node": devices_per_node, **links}


def make_run(model: dict, num_devices: int = 1, devices_per_node: int = 8, device: dict | None = None,
             hw_extra: dict | None = None, **strategy) -> RunSpec:
    """A validated :class:`RunSpec` from an inline model dict, hardware size and strategy keys."""
    return RunSpec.from_dict({"model": copy.deepcopy(model),
                              "hardware": hardware(num_devices, devices_per_node, device, **(hw_extra or {})),
                              "strategy": dict(strategy)})


def roofline(run: RunSpec, params: CostParams = KNOWN_PARAMS) -> RooflineCost:
    """The roofline cost of ``run``'s hardware with explicit constants."""
    return RooflineCost(run.hardware, params)


def serial_ddp_parts(run: RunSpec, cost: RooflineCost) -> tuple[float, float, float]:
    """Seconds of a single-stage data-parallel run's compute (forward + backward), gradient
    collectives and optimizer step, each summed from the cost model: the terms of its serial time."""
    from learnedperf.graph.execution import compile_run, gradient_collectives

    eg = compile_run(run)
    c = eg.stages[0].chunks[0]
    compute = sum(cost.compute_time_s(op) * rep for ops, rep in c.forward + c.backward for op in ops)
    comm = sum(cost.comm_time_s(op) for op in gradient_collectives(eg, c))
    opt = sum(cost.compute_time_s(op) for op in eg.stages[0].optimizer)
    return compute, comm, opt


@pytest.fixture
def a100_device() -> dict:
    """A fresh copy of the inline A100-like device descriptor."""
    return copy.deepcopy(A100_LIKE)


@pytest.fixture
def known_params() -> CostParams:
    """Hand-picked cost constants."""
    return KNOWN_PARAMS


@pytest.fixture
def free_comm_params() -> CostParams:
    """Constants of an ideal machine: no launch overhead, free communication."""
    return FREE_COMM_PARAMS
