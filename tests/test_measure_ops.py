"""Operator profiling and hardware micro-benchmarks on the local CPU (no GPU needed, ~15 s)."""

from __future__ import annotations

import json
import math
import multiprocessing
import subprocess
import sys

import numpy as np
import pytest

from learnedperf.errors import InputError
from learnedperf.graph.ops import COMM_KINDS, COMPUTE_KINDS
from learnedperf.measure.bench import (bench_collectives, describe_device, fit_link, fit_link_in_stream,
                                      host_descriptor)
from learnedperf.measure.ops import (OP_KINDS, OpCase, UnsupportedCase, as_op, flops_bytes, op_grid, profile_grid,
                                     profile_op)
from learnedperf.measure.records import OP_COLUMNS, check_records, write_parquet
from learnedperf.specs import DeviceSpec


@pytest.fixture(scope="module")
def descriptor() -> dict:
    return describe_device("cpu", threads=1, quick=True)


def _check_op_record(rec: dict) -> None:
    assert set(rec) == set(OP_COLUMNS)
    assert rec["time_ms"] > 0 and rec["time_p10_ms"] > 0
    assert rec["time_p10_ms"] <= rec["time_ms"] <= rec["time_p90_ms"]
    assert rec["repeats"] >= 1 and rec["source"] == "measured"
    assert isinstance(json.loads(rec["shape"]), list) and isinstance(json.loads(rec["params"]), dict)
    assert rec["kind"] in COMPUTE_KINDS + COMM_KINDS


# ------------------------------------------------------------ operator grid
def test_quick_grid_profiles_end_to_end(descriptor, tmp_path):
    cases = op_grid(quick=True)
    skips: list[tuple[OpCase, str]] = []
    records = list(profile_grid(cases, "cpu", warmup=1, repeats=5, threads=1, descriptor=descriptor,
                                on_skip=lambda case, reason: skips.append((case, reason))))
    # every case yields one record per direction, or a skip with its reason: nothing vanishes
    assert len(records) + sum(len(c.directions) for c, _ in skips) == sum(len(c.directions) for c in cases)
    assert all(reason for _, reason in skips)
    assert 50 <= len(records) <= 70
    for rec in records:
        _check_op_record(rec)
        assert rec["world_size"] == 1 and rec["backend"] == "cpu" and rec["timer"] == "perf_counter"
        assert rec["device_name"] == descriptor["name"]
        assert DeviceSpec.parse(json.loads(rec["device"])).name == descriptor["name"]
    assert {r["op"] for r in records} == set(OP_KINDS)  # every operator family is covered
    assert {r["direction"] for r in records} == {"fwd", "bwd", "opt"}
    # FLOPs/bytes in the records are those of the graph conventions
    lin = next(r for r in records if r["op"] == "linear" and r["direction"] == "bwd")
    b, m, n, k = json.loads(lin["shape"])
    assert lin["flops"] == 4.0 * b * m * n * k
    # the records go to Parquet unchanged through the schema check
    write_parquet(records, tmp_path / "ops.parquet", OP_COLUMNS, "op")
    assert len(check_records(records, OP_COLUMNS, "op")) == len(records)


def test_full_grid_size_and_span():
    cases = op_grid(quick=False, dtypes=("fp32", "bf16", "fp16"))
    assert len(set(cases)) == len(cases)
    assert sum(len(c.directions) for c in cases) >= 2500
    dims = [d for c in cases if c.op == "linear" for d in c.shape[1:]]
    assert min(dims) == 32 and max(dims) == 2048
    assert {c.params["causal"] for c in cases if c.op == "sdpa"} == {True, False}
    assert {c.params["precision"] for c in cases if c.op == "adamw"} == {"fp32", "bf16", "fp16"}


def test_flop_and_byte_formulas_match_closed_forms():
    # GEMM [m,k]x[k,n], batch b: 2bmnk FLOPs, A + B read and C written; backward dX and dW = 2x both
    b, m, n, k = 3, 64, 32, 16
    mm = OpCase("bmm", "matmul", (b, m, n, k), {}, "fp32")
    assert flops_bytes(mm, "fwd") == (2.0 * b * m * n * k, 4.0 * b * (m * k + k * n + m * n))
    assert flops_bytes(mm, "bwd") == (4.0 * b * m * n * k, 8.0 * b * (m * k + k * n + m * n))
    # fused attention: 4·b·h·s_q·s_kv·d; Q and O over s_q rows, K and V over s_kv rows (bf16: 2 bytes)
    bb, h, sq, skv, d = 2, 4, 128, 256, 64
    att = OpCase("sdpa", "attention", (bb, h, sq, skv, d), {"causal": False}, "bf16")
    fwd_flops = 4.0 * bb * h * sq * skv * d
    fwd_bytes = 2.0 * (2 * bb * h * sq * d + 2 * bb * h * skv * d)
    assert flops_bytes(att, "fwd") == (fwd_flops, fwd_bytes)
    assert flops_bytes(att, "bwd") == (2.0 * fwd_flops, 2.0 * fwd_bytes)  # graph.transformer.backward_of
    assert as_op(OpCase("sdpa", "attention", (1, 1, 8, 8, 8), {"causal": True}, "fp32")).causal
    # memory-bound: rows·cols·(reads + writes)·element size
    assert flops_bytes(OpCase("layer_norm", "layernorm", (10, 20), {}, "bf16"))[1] == 10 * 20 * 2 * 2
    assert flops_bytes(OpCase("add", "elementwise", (10, 20), {}, "fp32"))[1] == 10 * 20 * 3 * 4
    # conv: implicit GEMM over the output pixels
    conv = OpCase("conv2d", "conv", (2, 3, 8, 3, 10, 10), {"stride": 2, "padding": 1}, "fp32")
    ho = (10 + 2 - 3) // 2 + 1
    assert flops_bytes(conv, "fwd")[0] == 2.0 * 2 * 8 * ho * ho * 3 * 9
    # AdamW, fp32 master weights with a bf16 copy: 16 B read + 12 B written + 2 B copy + 4 B norm pass
    adam = OpCase("adamw", "optimizer", (1000, 1), {"precision": "bf16"}, "fp32")
    assert flops_bytes(adam, "opt")[1] == 1000 * (16 + 12 + 2 + 4)
    with pytest.raises(InputError, match="direction"):
        as_op(adam, "fwd")


@pytest.mark.parametrize("shape, field", [((1, 0, 4, 4), "shape[1] (m)"), ((1, 4, -2, 4), "shape[2] (n)"),
                                          ((1, 4, 4, 2.5), "shape[3] (k)"), ((4, 4, 4), "shape:")])
def test_bad_shape_raises_input_error_naming_the_field(shape, field):
    with pytest.raises(InputError) as info:
        OpCase("linear", "matmul", shape, {}, "fp32")
    assert field in str(info.value)


def test_bad_case_arguments_raise_input_error():
    with pytest.raises(InputError, match="params.vocab"):
        OpCase("embedding", "embedding", (8, 8), {}, "fp32")
    with pytest.raises(InputError, match="dtype"):
        OpCase("gelu", "elementwise", (8, 8), {}, "int8")
    with pytest.raises(InputError, match="kind"):
        OpCase("gelu", "softmax", (8, 8), {}, "fp32")
    with pytest.raises(InputError, match="attention expects 5"):
        OpCase("sdpa", "attention", (1, 2, 3, 4), {}, "fp32")
    with pytest.raises(InputError, match="device"):
        profile_op(OpCase("gelu", "elementwise", (8, 8), {}, "fp32"), device="tpu", descriptor={"name": "x"})


def test_unsupported_case_is_reported_not_dropped(descriptor):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: this checks the no-CUDA path")
    case = OpCase("gelu", "elementwise", (8, 8), {}, "fp32")
    skips = []
    out = list(profile_grid([case], "cuda", descriptor=descriptor, on_skip=lambda c, r: skips.append((c, r))))
    assert out == [] and len(skips) == 1 and "cuda" in skips[0][1]
    with pytest.raises(UnsupportedCase):
        list(profile_grid([case], "cuda", descriptor=descriptor))


# ------------------------------------------------------------ micro-benchmarks
def test_describe_device_quick_is_a_valid_device_spec(descriptor):
    spec = DeviceSpec.parse(descriptor)
    assert spec.peak_tflops.fp32 > 0 and spec.memory_bandwidth_GBps > 0 and spec.memory_GiB > 0
    assert spec.num_sms == 0  # unknown on CPU: no wave quantisation
    assert spec.name.startswith("cpu-") and spec.name.endswith("-1t")
    assert {"peak_tflops", "memory_bandwidth_GBps", "memory_GiB"} <= set(spec.sources)
    assert "measured" in spec.sources["peak_tflops"]
    host = host_descriptor()
    assert host["torch"] and host["logical_cores"] >= 1 and "host" not in descriptor


def test_bench_collectives_gloo_two_processes(descriptor):
    skipped: list[dict] = []
    records = bench_collectives(2, [4096, 16 << 20], backend="gloo", ops=("allreduce", "reducescatter", "broadcast"),
                                warmup=1, repeats=3, descriptor=descriptor, skipped=skipped)
    assert all(s["reason"] for s in skipped)
    assert len(records) + len(skipped) == 6
    assert {r["op"] for r in records} >= {"allreduce", "broadcast"}
    for rec in records:
        _check_op_record(rec)
        assert rec["direction"] == "comm" and rec["world_size"] == 2 and rec["backend"] == "gloo"
        assert json.loads(rec["shape"]) == [int(rec["bytes"])] and rec["flops"] == 0.0
    assert multiprocessing.active_children() == []  # every helper process was torn down
    fit = fit_link(records)
    assert fit["intra_node_bandwidth_GBps"] > 0 and fit["intra_node_latency_us"] >= 0


def test_fit_link_recovers_known_alpha_beta():
    alpha_s, bw_Bps = 25e-6, 3e9
    rng = np.random.default_rng(0)

    def synth(noise: float) -> list[dict]:
        out = []
        for p in (2, 4, 8):
            for s in np.logspace(10, 26, 17, base=2):
                t = 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * s / bw_Bps
                t *= 1.0 + noise * rng.standard_normal()
                out.append({"kind": "allreduce", "world_size": p, "bytes": float(s), "time_ms": t * 1e3})
        return out + [{"kind": "allgather", "world_size": 2, "bytes": 1e6, "time_ms": 1e6}]  # ignored: not allreduce

    exact = fit_link(synth(0.0))
    assert math.isclose(exact["intra_node_latency_us"], 25.0, rel_tol=1e-6)
    assert math.isclose(exact["intra_node_bandwidth_GBps"], 3.0, rel_tol=1e-6)
    assert exact["residual_rel_max"] < 1e-9 and exact["n_points"] == 51 and exact["world_sizes"] == [2, 4, 8]
    noisy = fit_link(synth(0.03), world_size=4)
    assert math.isclose(noisy["intra_node_latency_us"], 25.0, rel_tol=0.1)
    assert math.isclose(noisy["intra_node_bandwidth_GBps"], 3.0, rel_tol=0.1)
    assert noisy["world_sizes"] == [4] and 0 < noisy["residual_rel_rms"] < 0.1
    with pytest.raises(InputError, match="two message sizes"):
        fit_link([{"kind": "allreduce", "world_size": 2, "bytes": 1.0, "time_ms": 1.0}])


def test_in_stream_allreduce_on_two_processes():
    """A real in-stream measurement: every size costs something, and a 4096x larger message costs more.

    The sizes are far apart on purpose: gloo's latency on a small VM is heavy-tailed, and a 4 KiB
    all-reduce has been measured here at 2 ms against 1.5 ms for 1 MiB; 16 MiB takes ~15 ms."""
    import multiprocessing

    from learnedperf.measure.bench import bench_in_stream

    points = bench_in_stream(2, (4096, 1 << 24), loops=2, target_loop_s=0.02, timeout_s=120)
    assert [p["bytes"] for p in points] == [4096, 1 << 24]
    for p in points:
        assert p["world_size"] == 2 and 5 <= p["calls"] <= 200 and len(p["loop_costs_ms"]) == 2
        assert p["cost_ms"] > 0 and p["compute_ms"] > 0
    assert points[1]["cost_ms"] > points[0]["cost_ms"]
    assert multiprocessing.active_children() == []
    fit = fit_link_in_stream(points, 2)
    assert fit["intra_node_bandwidth_GBps"] > 0 and fit["intra_node_latency_us"] >= 0 and fit["dropped"] == []


def test_fit_link_in_stream_is_fit_link_on_the_added_costs():
    alpha_s, bw_Bps = 300e-6, 1e9  # ring all-reduce on 2 ranks: 2·α + S / B
    points = [{"world_size": 2, "bytes": float(s), "cost_ms": (2 * alpha_s + s / bw_Bps) * 1e3}
              for s in (4096, 65536, 1 << 20, 1 << 24)]
    fit = fit_link_in_stream(points + [{"world_size": 2, "bytes": 1024.0, "cost_ms": -0.01}], 2)
    assert math.isclose(fit["intra_node_latency_us"], 300.0, rel_tol=1e-6)
    assert math.isclose(fit["intra_node_bandwidth_GBps"], 1.0, rel_tol=1e-6)
    assert fit["dropped"] == [1024] and fit["n_points"] == 4  # the negative cost is listed, not fitted
    with pytest.raises(InputError, match="two message sizes"):
        fit_link_in_stream(points[:1], 2)


def test_importing_measure_modules_does_not_import_torch():
    code = ("import sys, learnedperf.measure.ops, learnedperf.measure.bench; "
            "print([m for m in ('torch', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
