"""fit_device_params recovers known constants from operator records generated with them."""

from __future__ import annotations

import json

import pytest

from learnedperf.cost import CostParams, RooflineCost
from learnedperf.cost.calibrate import fit_device_params
from learnedperf.errors import InputError
from learnedperf.graph.ops import Op, elementwise, matmul
from learnedperf.specs import resolve_hardware

CPU_LIKE = {"name": "cpu-like", "peak_tflops": {"fp32": 2.0, "bf16": 8.0}, "memory_bandwidth_GBps": 20.0,
            "memory_GiB": 16.0}


def _records(params: CostParams) -> list[dict]:
    cost = RooflineCost(resolve_hardware({"device": CPU_LIKE, "num_devices": 1}), params)
    ops: list[Op] = []
    for dtype in ("fp32", "bf16"):
        for m in (16, 64, 256, 1024):
            for k in (8, 64, 512, 2048):
                ops.append(matmul("mm", "fwd", m, 512, k, dtype, 4 if dtype == "fp32" else 2))
    for n in (1e3, 1e4, 1e5, 1e6, 1e7):
        ops.append(elementwise("add", "elementwise", "fwd", n, 2, 1, 4, "fp32"))
        ops.append(elementwise("ln", "layernorm", "fwd", n, 1, 1, 4, "fp32", cols=256))
    return [{"op": op.name, "kind": op.kind, "direction": "fwd", "shape": json.dumps(list(op.shape)),
             "params": "{}", "dtype": op.dtype, "flops": op.flops, "bytes": op.bytes,
             "time_ms": cost.compute_time_s(op) * 1e3, "device": json.dumps(CPU_LIKE)} for op in ops]


def test_fit_recovers_the_constants_that_generated_the_records():
    truth = CostParams(kernel_launch_us=7.0, memory_efficiency=0.7, gemm_efficiency_fp32=0.6,
                       gemm_efficiency_tensor=0.35, gemm_k_half=64.0, kernel_floor_us=0.0)
    params, report = fit_device_params(_records(truth), passes=4)
    assert report["mean_abs_log_error"] < 0.02
    assert params.kernel_launch_us == pytest.approx(7.0)
    assert params.memory_efficiency == pytest.approx(0.7, abs=0.03)
    assert params.gemm_efficiency_fp32 == pytest.approx(0.6, abs=0.03)
    assert params.gemm_efficiency_tensor == pytest.approx(0.35, abs=0.03)
    assert params.gemm_k_half == 64.0
    assert "attention_efficiency" not in report["fitted"]  # no attention records: left alone


def test_fit_refuses_mixed_devices_and_empty_input():
    recs = _records(CostParams())
    recs[0] = dict(recs[0], device=json.dumps(dict(CPU_LIKE, name="other")))
    with pytest.raises(InputError, match="2 devices"):
        fit_device_params(recs)
    with pytest.raises(InputError, match="no compute"):
        fit_device_params([])
