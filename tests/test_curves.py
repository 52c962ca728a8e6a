"""Measured kernel curves: the fits (against their closed form), the device spec fields, the cost
model on them, the curves a data set's step records carry, and the amendment of a data set."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from learnedperf.cost import CostParams, RooflineCost
from learnedperf.cost.curves import fit_kernel_curve, fit_optimizer_rate, ramp
from learnedperf.errors import InputError, SpecError
from learnedperf.graph.ops import Op
from learnedperf.graph.transformer import optimizer_ops
from learnedperf.measure.curves import attach_curves, fit_device_curves, with_curves
from learnedperf.measure.records import (OP_COLUMNS, STEP_COLUMNS, canonical_json, run_id, verify_manifest,
                                         write_manifest, write_parquet)
from learnedperf.specs import DeviceSpec, HardwareSpec

CPU_DATA = Path(__file__).resolve().parents[1] / "datasets" / "measured" / "vm-xeon-2c"

CPU_LIKE = {"name": "cpu-like", "peak_tflops": {"fp32": 0.16, "bf16": 1.0}, "memory_bandwidth_GBps": 15.0,
            "memory_GiB": 24.0}
CURVES = {"matmul": {"bf16": {"tflops": 1.0, "overhead_us": 30.0, "dim_half": 40.0},
                     "fp32": {"tflops": 0.16, "overhead_us": 3.0, "dim_half": 6.0}},
          "attention_fwd": {"bf16": {"tflops": 0.4, "overhead_us": 15.0, "dim_half": 30.0}},
          "attention_bwd": {"bf16": {"tflops": 0.1, "overhead_us": 15.0, "dim_half": 150.0}}}
RATES = {"adam": {"ns_per_param": 4.0, "overhead_us": 100.0}}
PARAMS = CostParams(gemm_efficiency_tensor=0.5, gemm_efficiency_fp32=0.8, gemm_k_half=64.0, kernel_launch_us=2.0,
                    memory_efficiency=1.0, kernel_floor_us=0.0, curve_efficiency=0.6, curve_memory_efficiency=0.5)


def _truth(curve: dict, dims, flops) -> float:
    rate = curve["tflops"] * 1e12 * np.prod([d / (d + curve["dim_half"]) for d in dims])
    return curve["overhead_us"] * 1e-6 + flops / rate


# ------------------------------------------------------------------------------ fits
def test_fit_kernel_curve_recovers_a_known_curve():
    rng = np.random.default_rng(0)
    curve = {"tflops": 1.2, "overhead_us": 25.0, "dim_half": 48.0}
    dims = rng.choice([16, 32, 64, 128, 256, 512, 1024, 2048], size=(80, 3))
    flops = 2.0 * dims.prod(axis=1)
    seconds = [_truth(curve, d, f) for d, f in zip(dims, flops)]
    fit = fit_kernel_curve(dims, flops, seconds)
    assert fit["tflops"] == pytest.approx(1.2, rel=0.01)
    assert fit["overhead_us"] == pytest.approx(25.0, rel=0.02)
    assert fit["dim_half"] == pytest.approx(48.0, rel=0.02)
    assert fit["mean_abs_log_error"] < 1e-3 and fit["timings"] == 80


def test_fit_optimizer_rate_recovers_a_known_rate():
    n = np.array([4096, 65536, 1 << 20, 1 << 22, 1 << 24], dtype=float)
    fit = fit_optimizer_rate(n, 150e-6 + n * 5e-9)
    assert fit["ns_per_param"] == pytest.approx(5.0, rel=1e-3)
    assert fit["overhead_us"] == pytest.approx(150.0, rel=1e-2)


def test_fits_refuse_bad_timings():
    with pytest.raises(InputError, match="at least 3 timings"):
        fit_kernel_curve([(1, 2, 3), (4, 5, 6)], [1.0, 2.0], [1e-3, 2e-3])
    with pytest.raises(InputError, match="finite and positive"):
        fit_kernel_curve([(1, 2, 3)] * 3, [1.0, 2.0, 3.0], [1e-3, -1e-3, 2e-3])
    with pytest.raises(InputError, match="finite and positive"):
        fit_optimizer_rate([1, 2, 3], [1e-3, float("nan"), 1e-3])
    with pytest.raises(InputError, match="does not grow"):
        fit_optimizer_rate([1e3, 1e6, 1e9], [3e-3, 2e-3, 1e-3])


# ------------------------------------------------------------------------------ spec
def test_device_spec_round_trips_and_names_a_bad_curve():
    dev = DeviceSpec.parse({**CPU_LIKE, "kernel_curves": CURVES, "optimizer_step": RATES})
    assert DeviceSpec.parse(json.loads(json.dumps(dev.to_dict()))) == dev
    assert dev.curve("matmul", "bf16").dim_half == 40.0 and dev.curve("matmul", "fp16") is None
    with pytest.raises(SpecError, match=r"kernel_curves\.conv.*unknown kernel"):
        DeviceSpec.parse({**CPU_LIKE, "kernel_curves": {"conv": CURVES["matmul"]}})
    with pytest.raises(SpecError, match=r"kernel_curves\.matmul\.fp64.*unknown dtype"):
        DeviceSpec.parse({**CPU_LIKE, "kernel_curves": {"matmul": {"fp64": CURVES["matmul"]["fp32"]}}})
    with pytest.raises(SpecError, match=r"kernel_curves\.matmul\.bf16\.tflops"):
        DeviceSpec.parse({**CPU_LIKE, "kernel_curves": {"matmul": {"bf16": {**CURVES["matmul"]["bf16"],
                                                                              "tflops": 0}}}})
    with pytest.raises(SpecError, match=r"optimizer_step\.lamb.*unknown optimizer"):
        DeviceSpec.parse({**CPU_LIKE, "optimizer_step": {"lamb": RATES["adam"]}})
    # absent curves leave the descriptor's JSON as it was
    assert "kernel_curves" not in DeviceSpec.parse(CPU_LIKE).to_dict()


# ------------------------------------------------------------------------------ cost model
def _cost(device: dict) -> RooflineCost:
    return RooflineCost(HardwareSpec.parse({"device": device, "num_devices": 1, "devices_per_node": 1}), PARAMS)


def test_cost_model_times_ops_on_the_curves_in_closed_form():
    cost = _cost({**CPU_LIKE, "kernel_curves": CURVES, "optimizer_step": RATES})
    # a compute-bound bf16 GEMM: overhead + FLOPs / (rate · η_curve · ramp), η_curve and not the
    # data-sheet η_tensor, which a measured rate already includes
    m, n, k = 128, 256, 512
    op = Op("fc", "matmul", "fwd", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), "bf16", (1, m, n, k))
    c = CURVES["matmul"]["bf16"]
    want = c["overhead_us"] * 1e-6 + op.flops / (1e12 * 0.6 * ramp((m, n, k), c["dim_half"]))
    assert cost.compute_time_s(op) == pytest.approx(want, rel=1e-12)
    # fp32 too: the same η_curve, not η_fp32
    cf = CURVES["matmul"]["fp32"]
    op32 = Op("fc", "matmul", "fwd", op.flops, op.bytes, "fp32", op.shape)
    want = cf["overhead_us"] * 1e-6 + op.flops / (0.16e12 * 0.6 * ramp((m, n, k), cf["dim_half"]))
    assert cost.compute_time_s(op32) == pytest.approx(want, rel=1e-12)
    # a GEMM moving far more bytes than it computes is memory bound, at curve_memory_efficiency of
    # the measured bandwidth (not memory_efficiency, a share of a data sheet's)
    fat = Op("fc", "matmul", "fwd", 2.0 * 8 * 8 * 8, 1e9, "fp32", (1, 8, 8, 8))
    assert cost.compute_time_s(fat) == pytest.approx(3e-6 + 1e9 / (0.5 * 15e9), rel=1e-12)
    # and so is an element-wise op
    gelu = Op("gelu", "elementwise", "fwd", 1e6, 8e6, "fp32", (1000, 1000))
    assert cost.compute_time_s(gelu) == pytest.approx(2e-6 + 8e6 / (0.5 * 15e9), rel=1e-12)
    # attention backward on its own curve (non-causal: all FLOPs executed)
    att = Op("sdpa.bwd", "attention", "bwd", 2 * 4.0 * 8 * 256 * 256 * 64, 1.0, "bf16", (1, 8, 256, 256, 64))
    cb = CURVES["attention_bwd"]["bf16"]
    want = cb["overhead_us"] * 1e-6 + att.flops / (0.1e12 * 0.6 * ramp((256, 256, 64), cb["dim_half"]))
    assert cost.compute_time_s(att) == pytest.approx(want, rel=1e-12)
    # the optimizer step at its measured rate; an optimizer without one keeps the streaming estimate
    adam, sgd = optimizer_ops(1e6, "adam", "fp32")[0], optimizer_ops(1e6, "sgd", "fp32")[0]
    assert adam.name == "optimizer.adam"
    assert cost.compute_time_s(adam) == pytest.approx(100e-6 + 1e6 * 4e-9, rel=1e-12)
    assert cost.compute_time_s(sgd) == pytest.approx(2e-6 + sgd.bytes / (0.5 * 15e9), rel=1e-12)


def test_without_measured_device_constants_curves_take_the_dtypes_data_sheet_efficiency():
    """Without curve_efficiency a curve's rate is scaled by the GEMM efficiency of the op's dtype (η_tensor 0.5
    for bf16, η_fp32 0.8 here), and without curve_memory_efficiency the bandwidth by memory_efficiency."""
    cost = RooflineCost(HardwareSpec.parse({"device": {**CPU_LIKE, "kernel_curves": CURVES}, "num_devices": 1,
                                            "devices_per_node": 1}),
                        replace(PARAMS, curve_efficiency=None, curve_memory_efficiency=None))
    m, n, k = 128, 256, 512
    for dtype, rate, eta in (("bf16", 1e12, 0.5), ("fp32", 0.16e12, 0.8)):
        op = Op("fc", "matmul", "fwd", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), dtype, (1, m, n, k))
        c = CURVES["matmul"][dtype]
        want = c["overhead_us"] * 1e-6 + op.flops / (rate * eta * ramp((m, n, k), c["dim_half"]))
        assert cost.compute_time_s(op) == pytest.approx(want, rel=1e-12)
    gelu = Op("gelu", "elementwise", "fwd", 1e6, 8e6, "fp32", (1000, 1000))
    assert cost.compute_time_s(gelu) == pytest.approx(2e-6 + 8e6 / 15e9, rel=1e-12)  # memory_efficiency 1.0


def test_cost_model_without_curves_is_unchanged():
    with_c, without = _cost({**CPU_LIKE, "kernel_curves": CURVES}), _cost(CPU_LIKE)
    op = Op("fc", "matmul", "fwd", 2.0 * 64 * 64 * 64, 3.0 * 64 * 64 * 2, "bf16", (1, 64, 64, 64))
    # k/(k+k½) ramp, launch, no wave quantisation on a device with no SMs
    want = 2e-6 + op.flops / (1e12 * 0.5 * 64 / (64 + 64))
    assert without.compute_time_s(op) == pytest.approx(want, rel=1e-12)
    assert with_c.compute_time_s(op) != pytest.approx(want, rel=1e-3)
    # a dtype the curves do not cover falls back to the fitted constants
    fp16 = Op("fc", "matmul", "fwd", op.flops, op.bytes, "fp16", op.shape)
    assert with_c.compute_time_s(fp16) == without.compute_time_s(fp16)


# ------------------------------------------------------------------------------ fit on records
def _op_records(device: dict) -> list[dict]:
    """Operator records timed exactly on CURVES / RATES (fwd GEMMs, attention both ways, Adam)."""
    dev = canonical_json(device)
    base = {"params": "{}", "world_size": 1, "time_p10_ms": 0.0, "time_p90_ms": 0.0, "repeats": 5, "warmup": 1,
            "timer": "perf_counter", "device_name": device["name"], "device": dev, "backend": "cpu", "threads": 1,
            "host": "test", "source": "synthetic", "measured_at": "2026-11-22T00:00:00+00:00"}
    out = []
    for m, n, k in [(a, b, c) for a in (16, 64, 256, 1024) for b in (32, 512) for c in (16, 128, 1024)]:
        f = 2.0 * m * n * k
        out.append({**base, "op": "linear", "kind": "matmul", "direction": "fwd", "shape": json.dumps([1, m, n, k]),
                    "dtype": "bf16", "flops": f, "bytes": 2.0 * (m * k + k * n + m * n),
                    "time_ms": _truth(CURVES["matmul"]["bf16"], (m, n, k), f) * 1e3})
    for s in (32, 64, 128, 256, 512, 1024, 2048):
        for d in (32, 128):
            f = 4.0 * 4 * s * s * d
            for direction, kernel, mult in (("fwd", "attention_fwd", 1), ("bwd", "attention_bwd", 2)):
                # an isolated backward also pays 80 µs of autograd start-up, which a step does not
                t = _truth(CURVES[kernel]["bf16"], (s, s, d), mult * f) + (80e-6 if direction == "bwd" else 0)
                out.append({**base, "op": "sdpa", "kind": "attention", "direction": direction,
                            "shape": json.dumps([1, 4, s, s, d]), "dtype": "bf16", "flops": mult * f,
                            "bytes": 1.0, "params": '{"causal":false}', "time_ms": t * 1e3})
    for n in (4096, 65536, 1 << 20, 1 << 22, 1 << 24, 1 << 25):
        out.append({**base, "op": "adamw", "kind": "optimizer", "direction": "opt", "shape": json.dumps([n, 1]),
                    "dtype": "fp32", "flops": 12.0 * n, "bytes": 36.0 * n, "params": '{"precision":"fp32"}',
                    "time_ms": (100e-6 + n * 4e-9) * 1e3})
    return out


def test_fit_device_curves_recovers_the_curves_of_its_records():
    curves, report = fit_device_curves(_op_records(CPU_LIKE))
    got = curves["kernel_curves"]
    for kernel in ("matmul", "attention_fwd"):
        for key, value in CURVES[kernel]["bf16"].items():
            assert got[kernel]["bf16"][key] == pytest.approx(value, rel=0.02), (kernel, key)
    # the backward's rate and d½ are its own; its overhead is the forward's, not the isolated call's
    assert got["attention_bwd"]["bf16"]["overhead_us"] == got["attention_fwd"]["bf16"]["overhead_us"]
    assert got["attention_bwd"]["bf16"]["tflops"] == pytest.approx(0.1, rel=0.05)
    assert curves["optimizer_step"]["adam"]["ns_per_param"] == pytest.approx(4.0, rel=1e-3)
    assert "sgd" not in curves["optimizer_step"] and not report["left_out"]
    with pytest.raises(InputError, match="one process"):
        fit_device_curves([{**r, "world_size": 2} for r in _op_records(CPU_LIKE)])


def test_with_curves_scales_rates_to_a_descriptor_of_several_processes():
    curves, _ = fit_device_curves(_op_records(CPU_LIKE))
    shared = {**CPU_LIKE, "name": "cpu-like-x2", "peak_tflops": {"fp32": 0.16, "bf16": 0.8},
              "memory_bandwidth_GBps": 7.5}
    out = with_curves(shared, curves, "test")
    mine = curves["kernel_curves"]["matmul"]["bf16"]
    assert out["kernel_curves"]["matmul"]["bf16"]["tflops"] == pytest.approx(mine["tflops"] * 0.8, rel=1e-5)
    assert out["kernel_curves"]["matmul"]["bf16"]["dim_half"] == pytest.approx(mine["dim_half"], abs=1e-3)
    assert out["optimizer_step"]["adam"]["ns_per_param"] == pytest.approx(8.0, rel=1e-3)  # half the bandwidth
    assert "cpu-like's" in out["sources"]["kernel_curves"]
    DeviceSpec.parse(out)  # a valid descriptor


def test_attach_curves_amends_a_data_set(tmp_path):
    d = tmp_path / "ds"
    d.mkdir()
    write_parquet(_op_records(CPU_LIKE), d / "ops_cpu.parquet", OP_COLUMNS, "operator")
    run = {"model": "gpt-small", "hardware": {"device": copy.deepcopy(CPU_LIKE), "num_devices": 1},
           "strategy": {"precision": "bf16"}}
    step = {k: None for k in STEP_COLUMNS} | {
        "run_id": run_id(run), "run": canonical_json(run), "model_name": "gpt-small", "arch": "gpt",
        "strategy_kind": "single", "world_size": 1, "iteration_time_ms": 10.0, "iteration_p10_ms": 9.0,
        "iteration_p90_ms": 11.0, "repeats": 5, "warmup": 1, "peak_memory_MiB": 1.0, "per_op": None,
        "device_name": "cpu-like", "device": canonical_json(CPU_LIKE), "backend": "cpu", "threads": 1,
        "host": "test", "source": "synthetic", "measured_at": "2026-11-22T00:00:00+00:00"}
    write_parquet([step], d / "steps_cpu.parquet", STEP_COLUMNS, "step")
    write_manifest(d, command="test", host={}, extra={"collections": [{"quiet": {"steps": [{"run_id": step["run_id"]}]}}]})
    attach_curves(d, command="amend")
    manifest = verify_manifest(d)  # checksums follow the rewritten file
    import pandas as pd

    rec = pd.read_parquet(d / "steps_cpu.parquet").iloc[0]
    new_run = json.loads(rec.run)
    assert new_run["hardware"]["device"]["kernel_curves"]["matmul"]["bf16"]["dim_half"] == pytest.approx(40, rel=0.02)
    assert rec.run_id == run_id(new_run) != step["run_id"]
    assert json.loads(rec.device) == new_run["hardware"]["device"]
    assert manifest["collections"][0]["quiet"]["steps"][0]["run_id"] == rec.run_id
    assert manifest["amendments"][-1]["command"] == "amend"
    # amending again changes no run (and no run id): the descriptor's source carries no date
    first = (d / "steps_cpu.parquet").read_bytes()
    attach_curves(d)
    assert (d / "steps_cpu.parquet").read_bytes() == first and len(verify_manifest(d)["amendments"]) == 2
    # a changed file is refused before anything is rewritten
    (d / "ops_cpu.parquet").write_bytes(b"corrupt")
    with pytest.raises(InputError, match="sha256 differs"):
        attach_curves(d)


def _assert_same_numbers(got, want, path="") -> None:
    """``got`` has ``want``'s keys and structure, and each number within 1e-5 of it."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (path, got, want)
        for k in want:
            _assert_same_numbers(got[k], want[k], f"{path}.{k}")
    else:
        assert got == pytest.approx(want, rel=1e-5, abs=1e-9), path


def test_committed_cpu_steps_carry_the_curves_of_their_operator_records():
    import pandas as pd

    ops = pd.read_parquet(CPU_DATA / "ops_cpu.parquet")
    curves, _ = fit_device_curves(ops[(ops.world_size == 1) & (ops.direction != "comm")].to_dict("records"))
    steps = pd.read_parquet(CPU_DATA / "steps_cpu.parquet")
    for text in steps["run"]:
        device = json.loads(text)["hardware"]["device"]
        plain = {k: v for k, v in device.items() if k not in ("kernel_curves", "optimizer_step")}
        want = with_curves(plain, curves, "")
        # the fit is a numerical optimisation: refitting under other numpy/scipy builds may move the 6th digit
        # that the records round to (0.571977 against 0.571978 tflops), so leaves compare to 1e-5
        _assert_same_numbers(device["kernel_curves"], want["kernel_curves"])
        _assert_same_numbers(device["optimizer_step"], want["optimizer_step"])
    # what the curves say about this CPU: its bf16 GEMMs ramp far more than its fp32 ones, its fused
    # bf16 attention runs at most at about half its bf16 GEMM rate, and its causal attention skips key
    # blocks of at least 256 keys (a GPU flash kernel's tile is 128; PyTorch's CPU kernel splits keys in 512s)
    kc = curves["kernel_curves"]
    assert kc["matmul"]["bf16"]["dim_half"] > 4 * kc["matmul"]["fp32"]["dim_half"]
    assert kc["attention_bwd"]["bf16"]["tflops"] < 0.6 * kc["matmul"]["bf16"]["tflops"]
    assert min(c["causal_block"] for k in ("attention_fwd", "attention_bwd") for c in kc[k].values()) >= 256


def test_measure_steps_carry_curves_of_the_collection_operators(tmp_path):
    from learnedperf.measure.collect import _step_devices

    descriptors = {(1, 1): CPU_LIKE, (2, 1): {**CPU_LIKE, "name": "cpu-like-x2"}}
    logs: list[str] = []
    devices, report = _step_devices(descriptors, _op_records(CPU_LIKE), tmp_path / "none.parquet", logs.append)
    assert set(devices) == set(descriptors) and report["fits"]["matmul.bf16"]["timings"] == 24
    assert all("kernel_curves" in d and "adam" in d["optimizer_step"] for d in devices.values())
    # no operator records here or in the directory: plain descriptors, and the log says so
    devices, report = _step_devices(descriptors, None, tmp_path / "none.parquet", logs.append)
    assert devices == descriptors and report is None and "no operator records" in logs[-1]


def test_curves_command_names_a_bad_data_set(tmp_path, capsys):
    from learnedperf.measure.curves import main

    assert main([str(tmp_path)]) == 2
    assert "manifest" in capsys.readouterr().err


def test_fit_finds_the_causal_block_of_its_attention_records():
    # a causal kernel that skips 512-key blocks (PyTorch's CPU flash attention splits keys in 512s): up to 512
    # keys it does all the work, at 1024 three quarters, at 2048 five eighths; non-causal always all of it
    block = 512
    records = [r for r in _op_records(CPU_LIKE) if r["kind"] == "attention" and r["direction"] == "fwd"]
    causal = []
    for r in records:
        s = json.loads(r["shape"])[2]
        nb = -(-s // block)
        share = (nb + 1) / (2 * nb)
        t = _truth(CURVES["attention_fwd"]["bf16"], tuple(json.loads(r["shape"])[2:5]), r["flops"] * share)
        causal.append({**r, "params": '{"causal":true}', "time_ms": t * 1e3})
    curves, report = fit_device_curves(records + causal)
    got = curves["kernel_curves"]["attention_fwd"]["bf16"]
    assert got["causal_block"] == block
    assert got["tflops"] == pytest.approx(CURVES["attention_fwd"]["bf16"]["tflops"], rel=0.02)
    assert report["fits"]["attention_fwd.bf16"]["mean_abs_log_error"] < 0.01
    # the cost model skips the blocks the curve says: a causal 1024-key attention costs 3/4 of a full one
    dev = {**CPU_LIKE, "kernel_curves": {"attention_fwd": {"bf16": got}}}
    shape = (1, 4, 1024, 1024, 128)
    flops = 4.0 * 4 * 1024 * 1024 * 128
    full = Op("sdpa", "attention", "fwd", flops, 1.0, "bf16", shape)
    half = Op("sdpa", "attention", "fwd", flops, 1.0, "bf16", shape, None, True)
    over = got["overhead_us"] * 1e-6
    assert _cost(dev).compute_time_s(half) - over == pytest.approx(0.75 * (_cost(dev).compute_time_s(full) - over),
                                                                  rel=1e-9)
    with pytest.raises(SpecError, match=r"kernel_curves\.attention_fwd\.bf16\.causal_block"):
        DeviceSpec.parse({**CPU_LIKE, "kernel_curves": {"attention_fwd": {"bf16": {**got, "causal_block": 0}}}})
