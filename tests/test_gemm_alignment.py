"""fp32 GEMMs with a dimension that is not a multiple of 16 bytes: the cost model gives them
``gemm_unaligned_share`` of the fp32 efficiency (``learnedperf.cost.params.gemm_aligned``), fitted by
``learnedperf.cost.calibrate`` on NeuSight's kernels beside the efficiency and k½."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from learnedperf.cost import CostParams, RooflineCost
from learnedperf.cost.calibrate import _devices, fit_gemm_fp32, gemm_fp32_alignment_shares
from learnedperf.cost.params import GEMM_ALIGN_BYTES, gemm_aligned, slot_powered
from learnedperf.graph.ops import Op
from learnedperf.measure.public import default_shared_data, load_neusight_ops
from learnedperf.specs import HardwareSpec

from conftest import A100_LIKE, KNOWN_PARAMS, neusight_gemm_row

SHARE = 0.8


def test_alignment_is_sixteen_bytes_of_every_gemm_dimension():
    """16 bytes: 4 fp32 elements, 8 bf16 ones, 16 fp8 ones; the batch does not count."""
    assert GEMM_ALIGN_BYTES == 16
    assert gemm_aligned((3, 4096, 50272, 1024), 4)
    assert not gemm_aligned((1, 4096, 50257, 1024), 4)  # GPT-2's vocabulary
    assert not gemm_aligned((1, 4098, 4096, 1024), 4) and not gemm_aligned((1, 4096, 4096, 1026), 4)
    assert gemm_aligned((1, 4, 8, 12), 4) and not gemm_aligned((1, 4, 12, 12), 2)
    assert gemm_aligned((1, 16, 32, 48), 1) and not gemm_aligned((1, 16, 32, 40), 1)


def _cost(share=SHARE):
    hw = HardwareSpec.parse({"device": copy.deepcopy(A100_LIKE), "num_devices": 1, "devices_per_node": 1})
    return RooflineCost(hw, CostParams(**{**KNOWN_PARAMS.to_dict(), "gemm_unaligned_share": share}))


def test_an_unaligned_fp32_gemm_computes_at_the_share():
    """Same FLOPs, bytes, tiles and k: an fp32 GEMM with an odd dimension takes 1/share as long, an aligned
    one and a bf16 one (tensor cores: not derated) take what they take with the share at 1."""
    derated, plain = _cost(), _cost(1.0)
    launch = KNOWN_PARAMS.kernel_launch_us * 1e-6
    flops, nbytes = 2.0 * 4096 ** 3, 12 * 4096.0 ** 2
    odd = Op("fc", "matmul", "fwd", flops, nbytes, "fp32", (1, 4095, 4096, 4096))  # 32 row tiles either way
    even = Op("fc", "matmul", "fwd", flops, nbytes, "fp32", (1, 4096, 4096, 4096))
    assert plain.compute_time_s(odd) == plain.compute_time_s(even)
    assert derated.compute_time_s(odd) - launch == pytest.approx((derated.compute_time_s(even) - launch) / SHARE,
                                                                 rel=1e-12)
    assert derated.compute_time_s(even) == plain.compute_time_s(even)
    bf16 = Op("fc", "matmul", "fwd", flops, nbytes / 2, "bf16", (1, 4095, 4096, 4096))
    assert derated.compute_time_s(bf16) == plain.compute_time_s(bf16)


def test_the_fit_recovers_the_share_that_made_the_times():
    """Kernels timed by the roofline GEMM model at efficiency 0.85, k½ 32 and an unaligned share of 0.8 on
    the three cards with a power cable give back all three (grid steps 0.01 and 0.01)."""
    devs = {n: d for n, d in _devices().items() if not slot_powered(d)}
    rng = np.random.default_rng(0)
    rows = []
    for name, d in devs.items():
        for _ in range(300):
            B, M, N, K = (int(x) for x in (rng.integers(1, 4), *rng.integers(256, 4096, size=3)))
            if rng.random() < 0.5:  # half of them aligned
                M, N, K = 4 * (M // 4), 4 * (N // 4), 4 * (K // 4)
            eff = 0.85 * K / (K + 32) * (1.0 if M % 4 == N % 4 == K % 4 == 0 else 0.8)
            rows.append(neusight_gemm_row(name, d, B, M, N, K, eff))
    fit = fit_gemm_fp32(pd.DataFrame(rows), 0.7, 0.0)
    assert (fit["eff"], fit["k_half"], fit["unaligned"]) == pytest.approx((0.85, 32.0, 0.8), abs=1e-9)
    assert fit["_mean_abs_log_error"] < 1e-9


@pytest.mark.skipif(not (default_shared_data() / "neusight_ops.parquet").exists(), reason="shared/data not present")
def test_aligned_fp32_gemms_run_faster_on_every_neusight_gpu():
    """The premise, measured: on each of NeuSight's five GPUs the fp32 linear/bmm kernels of over 10 GFLOP
    with every dimension a multiple of 16 bytes reach a higher median share of the data-sheet peak than the
    others (by 11-22 % on the three cards with a power cable, 28-116 % on the two powered by their slot;
    2026-11-29)."""
    shares = gemm_fp32_alignment_shares(load_neusight_ops(ops=("linear", "bmm")))
    assert len(shares) == 5
    for name, (aligned, n_aligned, unaligned, n_unaligned) in shares.items():
        assert n_aligned > 500 and n_unaligned > 500, name
        assert aligned > 1.05 * unaligned, name
