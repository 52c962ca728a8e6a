"""Two kernel models the shipped constants leave switched off: the tensor-core GEMMs' own inner-dimension ramp
(``gemm_k_half_tensor``) and the row reductions' share of the element-wise bandwidth (``reduction_memory_share``);
the roofline's closed forms with them set, and their fits recovering planted constants."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from conftest import A100_LIKE, KNOWN_PARAMS
from learnedperf.catalog import get_device
from learnedperf.cost import RooflineCost, default_params
from learnedperf.cost.calibrate import fit_gemm_tensor, fit_reduction_share, gemm_tensor_error
from learnedperf.errors import InputError
from learnedperf.graph.ops import Op
from learnedperf.specs import HardwareSpec

HW = HardwareSpec.parse({"device": A100_LIKE, "num_devices": 1, "devices_per_node": 1})
PEAK = {"bf16": 312e12, "fp32": 19.5e12}


def _gemm(dtype: str, k: int, m: int = 1296 * 128, n: int = 128, phase: str = "fwd") -> Op:
    # m/128 · n/128 = 1,296 tiles: exactly 12 waves of the 108 SMs (no quantisation loss); aligned in every dtype
    size = 2 if dtype == "bf16" else 4
    return Op("mm", "matmul", phase, 2.0 * m * n * k, float(size * (m * k + k * n + m * n)), dtype, (1, m, n, k))


def test_shipped_constants_leave_both_models_off():
    """The shipped params.json sets neither: one ramp for every GEMM, one bandwidth for every memory-bound op."""
    p = default_params()
    assert p.gemm_k_half_tensor is None and p.reduction_memory_share == 1.0


@pytest.mark.parametrize("k_half_tensor", [None, 192.0])
@pytest.mark.parametrize("k", [64, 256, 4096])
def test_a_tensor_core_gemm_follows_its_own_ramp_and_an_fp32_one_the_shipped_ramp(k, k_half_tensor):
    """``flops / (peak · eff · k / (k + k½))``: the tensor-core k½ on the bf16 peak (unset: the fp32 one's)."""
    p = replace(KNOWN_PARAMS, kernel_launch_us=0.0, gemm_k_half_tensor=k_half_tensor)
    cost = RooflineCost(HW, p)
    for dtype, eff, k_half in (("bf16", p.gemm_efficiency_tensor, k_half_tensor or p.gemm_k_half),
                               ("fp32", p.gemm_efficiency_fp32, p.gemm_k_half)):
        op = _gemm(dtype, k)
        compute = op.flops / (PEAK[dtype] * eff * k / (k + k_half))
        assert cost.compute_time_s(op) == pytest.approx(max(compute, op.bytes / (2039e9 * p.memory_efficiency)),
                                                        rel=1e-12)


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
def test_a_row_reduction_runs_at_its_share_of_the_bandwidth_and_element_wise_ops_do_not(kind):
    p = replace(KNOWN_PARAMS, kernel_launch_us=0.0, reduction_memory_share=0.6)
    cost = RooflineCost(HW, p)
    nbytes = 2.0 * 4 * 2 ** 24
    bw = 2039e9 * p.memory_efficiency
    reduction = Op("r", kind, "fwd", 0.0, nbytes, "fp32", (2 ** 14, 2 ** 10))
    elementwise = Op("e", "elementwise", "fwd", 0.0, nbytes, "fp32", (2 ** 24,))
    assert cost.compute_time_s(reduction) == pytest.approx(nbytes / (bw * 0.6), rel=1e-12)
    assert cost.compute_time_s(elementwise) == pytest.approx(nbytes / bw, rel=1e-12)


def _gemm_records(k_half: float, eff: float, floor_us: float) -> pd.DataFrame:
    """bf16 GEMM records a device following the model with these constants would give (plus its call floor),
    with backward and fp32 records the fit must not read."""
    p = replace(KNOWN_PARAMS, kernel_launch_us=0.0, gemm_efficiency_tensor=eff, gemm_k_half_tensor=k_half)
    cost = RooflineCost(HW, p)
    rows = []
    for k in (32, 64, 128, 256, 512, 1024, 4096, 8192):
        for n in (128, 256):
            for dtype, phase in (("bf16", "fwd"), ("bf16", "bwd"), ("fp32", "fwd")):
                op = _gemm(dtype, k, n=n, phase=phase)
                # what the fit must not read is recorded 10x slow: reading it would show in the error
                slow = 1.0 if (dtype, phase) == ("bf16", "fwd") else 10.0
                rows.append({"op": "linear", "kind": "matmul", "direction": phase, "shape": json.dumps(op.shape),
                             "params": "{}", "dtype": dtype, "flops": op.flops, "bytes": op.bytes,
                             "time_ms": slow * (cost.compute_time_s(op) + floor_us * 1e-6) * 1e3,
                             "device": json.dumps(A100_LIKE)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("k_half", [8.0, 192.0])
def test_fit_gemm_tensor_recovers_known_constants_from_forward_tensor_core_kernels(k_half):
    base = replace(KNOWN_PARAMS, kernel_launch_us=0.0)
    records = _gemm_records(k_half, 0.7, 10.0)
    fit = fit_gemm_tensor(records, base=base)
    assert (fit["k_half"], fit["eff"], fit["floor_us"]) == (k_half, 0.7, 10.0)
    assert fit["_mean_abs_log_error"] < 1e-9 and fit["_kernels"] == 16
    assert gemm_tensor_error(records, k_half, 0.7, 10.0, base=base) < 1e-9
    # another ramp leaves an error: the score reads the ramp it is given
    assert gemm_tensor_error(records, 64.0 if k_half != 64.0 else 8.0, 0.7, 10.0, base=base) > 0.01


def test_fit_gemm_tensor_without_tensor_core_records_says_so():
    records = _gemm_records(8.0, 0.7, 0.0)
    with pytest.raises(InputError, match="no forward matmul records in bf16/fp16"):
        fit_gemm_tensor(records[records["dtype"] == "fp32"])


def test_fit_reduction_share_recovers_a_planted_share_of_the_element_wise_bandwidth():
    """NeuSight-layout ln/softmax rows timed at ``bytes / (bandwidth · eff · share)`` on two catalog GPUs."""
    rows = []
    for name, catalog in (("Tesla V100-PCIE-32GB", "V100-PCIE-32GB"), ("Tesla T4", "T4")):
        bw = get_device(catalog)["memory_bandwidth_GBps"] * 1e9
        for op in ("ln", "softmax", "add"):
            for b in (4096, 16384, 65536):
                for h in (1024, 4096):
                    tensors = 3.0 if op == "add" else 2.0
                    share = 1.0 if op == "add" else 0.62
                    rows.append({"op": op, "device": name, "B": b, "H": h,
                                 "latency_ms": b * h * tensors * 4 / (bw * 0.8 * share) * 1e3})
    ops = pd.DataFrame(rows)
    fit = fit_reduction_share(ops, 0.8)
    assert fit["share"] == pytest.approx(0.62) and fit["_mean_abs_log_error"] < 1e-9
    with pytest.raises(InputError, match="no layer-norm or softmax"):
        fit_reduction_share(ops[ops["op"] == "add"], 0.8)
