"""The roofline's fused-attention model (head-dimension ramp, backward share) and its fit on measured kernels,
and the host's rate for a bare tensor operation read from measured records."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from conftest import A100_LIKE, KNOWN_PARAMS
from learnedperf.cost import RooflineCost
from learnedperf.cost.calibrate import attention_error, eager_dispatch_us, fit_attention
from learnedperf.graph.ops import Op
from learnedperf.specs import HardwareSpec

HW = HardwareSpec.parse({"device": A100_LIKE, "num_devices": 1, "devices_per_node": 1})


def _attention(phase: str, hd: int, causal: bool = False, b: int = 27, heads: int = 16, s: int = 1024) -> Op:
    # 27 x 16 heads x 8 query tiles = 3,456 tiles: exactly 32 waves of the 108 SMs (no quantisation loss)
    flops = 4.0 * b * heads * s * s * hd * (2 if phase == "bwd" else 1)
    nbytes = 4.0 * b * heads * s * hd * 2 * (2 if phase == "bwd" else 1)
    return Op("a", "attention", phase, flops, nbytes, "bf16", (b, heads, s, s, hd), None, causal)


@pytest.mark.parametrize("d_half", [None, 96.0])
@pytest.mark.parametrize("hd", [32, 64, 128])
def test_attention_time_follows_the_head_ramp_and_the_backward_share(hd, d_half):
    """``flops / (peak · eff · share · d / (d + d½))``, d½ the attention's own or, unset, the GEMMs' k½."""
    p = replace(KNOWN_PARAMS, attention_efficiency=0.8, attention_bwd_share=0.6, kernel_launch_us=0.0,
                attention_d_half=d_half)
    cost = RooflineCost(HW, p)
    peak = 312e12
    ramp = hd / (hd + (p.gemm_k_half if d_half is None else d_half))
    for phase, share in (("fwd", 1.0), ("bwd", 0.6)):
        op = _attention(phase, hd)
        expected = op.flops / (peak * 0.8 * share * ramp)
        assert cost.compute_time_s(op) == pytest.approx(expected, rel=1e-12)
    # a causal square attention skips the key blocks above the diagonal: (nb + 1) / (2 nb) of the work
    nb = 1024 // p.tile_n
    assert cost.compute_time_s(_attention("fwd", hd, causal=True)) == \
        pytest.approx(cost.compute_time_s(_attention("fwd", hd)) * (nb + 1) / (2 * nb), rel=1e-12)


def _records(eff: float, share: float, floor_fwd_us: float, floor_bwd_us: float, dtype: str = "bf16",
             d_half: float | None = None) -> pd.DataFrame:
    """Attention records a device following the model with these constants would give (plus its floors)."""
    p = replace(KNOWN_PARAMS, attention_efficiency=eff, attention_bwd_share=share, kernel_launch_us=0.0,
                attention_d_half=d_half)
    cost = RooflineCost(HW, p)
    rows = []
    for hd in (32, 64, 128):
        for s in (1024, 2048, 4096, 8192):
            for causal in (False, True):
                for phase, floor in (("fwd", floor_fwd_us), ("bwd", floor_bwd_us)):
                    op = _attention(phase, hd, causal, b=4, heads=16, s=s)
                    rows.append({"op": "sdpa", "kind": "attention", "direction": phase, "shape": json.dumps(op.shape),
                                 "params": json.dumps({"causal": causal}), "dtype": dtype, "flops": op.flops,
                                 "bytes": op.bytes, "time_ms": (cost.compute_time_s(op) + floor * 1e-6) * 1e3,
                                 "device": json.dumps(A100_LIKE)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("d_half", [16.0, 96.0])
def test_fit_attention_recovers_known_constants(d_half):
    base = replace(KNOWN_PARAMS, kernel_launch_us=0.0)
    fit = fit_attention(_records(0.7, 0.6, 30.0, 120.0, d_half=d_half), base=base)
    assert (fit["eff"], fit["bwd_share"], fit["floor_fwd_us"], fit["floor_bwd_us"], fit["d_half"]) == \
        (0.7, 0.6, 30.0, 120.0, d_half)
    assert fit["_mean_abs_log_error"] < 1e-9 and fit["_kernels"] == 48
    # fp32 records are not read: their kernels are not the tensor-core ones
    assert attention_error(_records(0.7, 0.6, 0, 0, dtype="fp32"), base=base)[1] == 0


def test_attention_error_is_the_log_ratio_to_the_measurement():
    base = replace(KNOWN_PARAMS, kernel_launch_us=0.0)
    err, n = attention_error(_records(0.5, 1.0, 0.0, 0.0), base=base)
    # twice the efficiency: every kernel predicted in half the time (none is memory bound at these shapes)
    assert np.allclose(err(1.0, 1.0), -math.log(2.0), atol=1e-12) and n == 48


def test_eager_dispatch_is_the_median_of_small_back_to_back_forward_records():
    def rec(direction, nbytes, timer, us):
        return {"kind": "elementwise", "direction": direction, "bytes": nbytes, "timer": timer, "time_ms": us / 1e3}

    rows = [rec("fwd", 4096, "cuda_event_x20", us) for us in (12.0, 14.0, 30.0)]
    rows += [rec("fwd", 10 ** 9, "cuda_event_x2", 400.0),  # the device's time, not the host's
             rec("fwd", 4096, "cuda_event", 40.0),  # one call from an idle GPU: its launch as well
             rec("bwd", 4096, "cuda_event_x20", 100.0)]  # a backward through autograd
    assert eager_dispatch_us(pd.DataFrame(rows)) == (pytest.approx(14.0), 3)
    n = eager_dispatch_us(pd.DataFrame(rows[3:]))
    assert math.isnan(n[0]) and n[1] == 0
