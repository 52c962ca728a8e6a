"""Cards powered by their PCIe slot alone (data-sheet ``tdp_W`` <= 75 W): the cost model derates their
compute peaks by ``slot_power_compute_share`` (``learnedperf.cost.params``), fitted by
``learnedperf.cost.calibrate`` on NeuSight's T4 and P4 kernels."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from learnedperf.cost import CostParams, RooflineCost
from learnedperf.cost.calibrate import _devices, fit_gemm_fp32
from learnedperf.cost.params import SLOT_POWER_W, slot_powered
from learnedperf.graph.ops import Op
from learnedperf.measure.public import neusight_devices
from learnedperf.specs import HardwareSpec

from conftest import A100_LIKE, KNOWN_PARAMS, neusight_gemm_row

SHARE = 0.5


def _cost(tdp_W, **extra):
    device = {**copy.deepcopy(A100_LIKE), **extra}
    if tdp_W is not None:
        device["tdp_W"] = tdp_W
    hw = HardwareSpec.parse({"device": device, "num_devices": 1, "devices_per_node": 1})
    return RooflineCost(hw, CostParams(**{**KNOWN_PARAMS.to_dict(), "slot_power_compute_share": SHARE}))


def test_the_slot_limit_is_the_pcie_slots_75_watts():
    assert SLOT_POWER_W == 75.0
    assert slot_powered({"tdp_W": 70}) and slot_powered({"tdp_W": 75})
    assert not slot_powered({"tdp_W": 76}) and not slot_powered({"tdp_W": None}) and not slot_powered({})


def test_a_slot_powered_card_computes_at_the_share_of_its_peaks():
    """Compute-bound GEMMs, fused attention and convolutions take 1/share as long as on the same card
    with a cable; memory-bound ops and a card of unknown power are not derated."""
    slot, big, unknown = _cost(70.0), _cost(300.0), _cost(None)
    gemm = Op("fc", "matmul", "fwd", 2.0 * 4096 ** 3, 6 * 4096.0 ** 2, "bf16", (1, 4096, 4096, 4096))
    gemm32 = Op("fc", "matmul", "fwd", gemm.flops, gemm.bytes * 2, "fp32", gemm.shape)
    att = Op("sdpa", "attention", "fwd", 4.0 * 8 * 32 * 2048 * 2048 * 128, 1e6, "bf16", (8, 32, 2048, 2048, 128))
    conv = Op("conv", "conv", "fwd", 1e13, 1e6, "fp16", (1,))
    launch = KNOWN_PARAMS.kernel_launch_us * 1e-6
    for op in (gemm, gemm32, att, conv):
        assert slot.compute_time_s(op) - launch == pytest.approx((big.compute_time_s(op) - launch) / SHARE, rel=1e-12)
        assert unknown.compute_time_s(op) == big.compute_time_s(op)
    ew = Op("gelu", "elementwise", "fwd", 1e8, 8e8, "bf16", (10000, 10000))
    assert slot.compute_time_s(ew) == big.compute_time_s(ew)


def test_a_measured_kernel_curve_is_not_derated():
    """A curve is the card's achieved rate, its clock under load included."""
    curves = {"matmul": {"bf16": {"tflops": 100.0, "overhead_us": 3.0, "dim_half": 0.0}}}
    gemm = Op("fc", "matmul", "fwd", 2.0 * 4096 ** 3, 6 * 4096.0 ** 2, "bf16", (1, 4096, 4096, 4096))
    with_slot, with_cable = _cost(70.0, kernel_curves=curves), _cost(300.0, kernel_curves=curves)
    assert with_slot.compute_time_s(gemm) == with_cable.compute_time_s(gemm)


def test_the_share_fit_recovers_the_share_that_made_the_times():
    """Kernels timed by the roofline GEMM model at efficiency 0.8 × 0.55 on the T4 and P4 give back 0.55
    with the efficiency held at 0.8 (the grid's step is 0.01)."""
    devs = _devices()
    rng = np.random.default_rng(0)
    rows = []
    for name in ("Tesla T4", "Tesla P4"):
        d = devs[name]
        for _ in range(300):
            B, M, N, K = (int(x) for x in (rng.integers(1, 4), *rng.integers(256, 4096, size=3)))
            rows.append(neusight_gemm_row(name, d, B, M, N, K, 0.8 * 0.55 * K / (K + 32)))
    fit = fit_gemm_fp32(pd.DataFrame(rows), 0.7, 0.0, share_of={"eff": 0.8, "k_half": 32.0, "unaligned": 1.0})
    assert fit["share"] == pytest.approx(0.55, abs=1e-9)
    assert fit["_mean_abs_log_error"] < 1e-9


def test_neusight_devices_take_their_power_from_the_catalog():
    """NeuSight's device table has no power column; the T4 and P4 rows are slot-powered by their data sheets."""
    devices = neusight_devices()
    assert devices["Tesla T4"]["tdp_W"] == 70 and devices["Tesla P4"]["tdp_W"] == 75
    assert "T4" in devices["Tesla T4"]["sources"]["tdp_W"]
    assert [n for n, d in devices.items() if slot_powered(d)] == ["NVIDIA L4", "Tesla P4", "Tesla T4"]
