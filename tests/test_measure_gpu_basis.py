"""``learnedperf measure`` on a GPU describes its records by the GPU's data sheet.

No GPU here: the CUDA collection runs with torch's device calls stood in for (the driver's name, the
measured descriptor, the timings run on the CPU), so what is checked is what the records and the
manifest *say*, which is what the learned models read.
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from learnedperf.catalog import device_by_reported_name, get_device
from learnedperf.cli import main
from learnedperf.errors import InputError, LearnedPerfError
from learnedperf.measure import collect as C
from learnedperf.measure.records import is_datasheet, verify_manifest

H100_NAME = "NVIDIA H100 80GB HBM3"  # what torch.cuda.get_device_properties(0).name gives on an H100 SXM5


@pytest.mark.parametrize("reported, key", [
    (H100_NAME, "H100-SXM5-80GB"), ("NVIDIA H100 PCIe", "H100-PCIE-80GB"), ("NVIDIA H200", "H200-SXM-141GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"), ("Tesla T4", "T4"), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"), ("AMD Instinct MI300X", "MI300X"),
    # another part, a MIG slice and a CPU are not catalog devices: nothing near is taken for them
    ("NVIDIA H100 NVL", None), (H100_NAME + " MIG 1g.10gb", None), ("cpu", None)])
def test_a_drivers_name_finds_its_catalog_device_and_only_it(reported, key):
    assert device_by_reported_name(reported) == key


def test_the_data_sheet_is_the_catalogs_and_must_describe_the_gpu():
    sheet, report = C.gpu_datasheet(H100_NAME, 132, 79.65)
    catalog = get_device("H100-SXM5-80GB")
    assert sheet["name"] == "H100-SXM5-80GB" and sheet["peak_tflops"]["bf16"] == catalog["peak_tflops"]["bf16"]
    assert sheet["memory_bandwidth_GBps"] == catalog["memory_bandwidth_GBps"] and is_datasheet(sheet)
    assert report["device"] == "H100-SXM5-80GB" and report["reported_name"] == H100_NAME
    # a part the catalog does not know needs its data sheet, given
    with pytest.raises(InputError, match=r"GPU 'NVIDIA H100 NVL' is not in the catalog.*--device-spec"):
        C.gpu_datasheet("NVIDIA H100 NVL", 132, 93.0)
    sheet, report = C.gpu_datasheet("NVIDIA H100 NVL", 114, 79.0, "H100-PCIE-80GB")
    assert sheet["name"] == "H100-PCIE-80GB" and "as given" in report["how"]
    own = {"name": "H100-NVL-94GB", "peak_tflops": {"fp32": 60.0, "bf16": 835.0}, "memory_bandwidth_GBps": 3900,
           "memory_GiB": 94, "num_sms": 132}
    assert C.gpu_datasheet("NVIDIA H100 NVL", 132, 93.0, own)[0]["name"] == "H100-NVL-94GB"
    # a data sheet that is not this GPU's: another SM count (a MIG slice), more memory than it has
    with pytest.raises(InputError, match=r"H100-SXM5-80GB has 132 SMs, this GPU .* 16: a MIG slice"):
        C.gpu_datasheet(H100_NAME, 16, 9.75, "H100-SXM5-80GB")
    with pytest.raises(InputError, match=r"H200-SXM-141GB has 141 GiB, this GPU .* reports 79.65 GiB"):
        C.gpu_datasheet(H100_NAME, 132, 79.65, "H200-SXM-141GB")
    with pytest.raises(LearnedPerfError, match="unknown device 'H1000'"):
        C.gpu_datasheet(H100_NAME, 132, 79.65, "H1000")
    with pytest.raises(InputError, match=r"device_spec\.peak_tflops"):
        C.gpu_datasheet(H100_NAME, 132, 79.65, {"name": "x", "memory_bandwidth_GBps": 1.0})


def test_achieved_share_is_the_measured_peak_over_the_data_sheets():
    sheet = C.gpu_datasheet(H100_NAME, 132, 79.65)[0]
    measured = {"peak_tflops": {"fp32": 50.25, "bf16": 742.125, "fp16": 0.0}, "memory_bandwidth_GBps": 2680.0}
    # 50.25 / 67 = 0.75, 742.125 / 989.5 = 0.75, 2680 / 3350 = 0.8; no fp16 measured: no share
    assert C.achieved_share(measured, sheet) == {"fp32": 0.75, "bf16": 0.75, "memory_bandwidth": 0.8}


def _fake_gpu(monkeypatch, reported=H100_NAME, sms=132, memory_GiB=79.65):
    """Stand-ins for the CUDA calls of a collection: the driver's identity, the measured descriptor, and
    operator cases and steps timed on the CPU (with the descriptor the collection gives them)."""
    from learnedperf.measure import bench, ops, steps

    calls = {"describe": 0}
    measured = {"name": "nvidia-h100-80gb-hbm3-1t", "vendor": "nvidia", "memory_GiB": memory_GiB,
                "peak_tflops": {"fp32": 50.25, "bf16": 742.125}, "memory_bandwidth_GBps": 2680.0, "num_sms": sms,
                "l2_cache_MiB": 50.0, "clock_MHz": 1980.0, "sources": {"all": "stand-in for describe_device"}}

    def describe(device, threads=1, concurrent=1, quick=False):
        assert device == "cuda"
        calls["describe"] += 1
        return dict(measured)

    profile_grid, op_grid = ops.profile_grid, ops.op_grid
    monkeypatch.setattr(C, "_cuda_identity", lambda: (reported, sms, memory_GiB))
    monkeypatch.setattr(C, "_cuda_device_count", lambda: 1)
    monkeypatch.setattr(bench, "describe_device", describe)
    # four cheap cases: linear, bmm, sdpa and layer_norm in fp32
    monkeypatch.setattr(ops, "op_grid", lambda quick=False, device="cpu": op_grid(quick=True, dtypes=["fp32"])[:4])
    monkeypatch.setattr(ops, "profile_grid", lambda cases, device, **kw: profile_grid(cases, "cpu", **kw))
    grid = steps.step_grid(quick=True, device="cuda")
    monkeypatch.setattr(steps, "step_grid", lambda quick=False, device="cpu": grid[:1])
    measure_step = steps.measure_step
    monkeypatch.setattr(steps, "measure_step", lambda config, hw, **kw: measure_step(
        dataclasses.replace(config, device="cpu", warmup=1, repeats=2), hw, **kw))
    return calls, measured, grid[0]


def test_a_gpu_collection_describes_every_record_by_the_data_sheet(tmp_path, monkeypatch):
    calls, measured, _ = _fake_gpu(monkeypatch)
    out = tmp_path / "gpu"
    manifest = C.collect(out, quick=True, parts=("ops", "steps"), device="cuda", progress=False, log=lambda m: None)
    sheet = C.gpu_datasheet(H100_NAME, 132, 79.65)[0]
    ops = pd.read_parquet(out / "ops_cuda_quick.parquet")
    assert len(ops) >= 4 and {json.loads(d)["name"] for d in ops.device} == {"H100-SXM5-80GB"}
    assert json.loads(ops.device[0]) == sheet
    steps = pd.read_parquet(out / "steps_cuda_quick.parquet")
    device = json.loads(steps.run[0])["hardware"]["device"]
    # the step is a run on the data sheet, as `learnedperf predict --device H100-SXM5-80GB` asks it:
    # no kernel curves (they are in the manifest, fitted on the GPU's operators)
    assert device == sheet and "kernel_curves" not in device
    collection = manifest["collections"][-1]
    assert collection["kernel_curves"] is not None
    assert collection["devices"]["1x1"] == measured  # what was measured stays in the manifest
    assert collection["datasheet"]["device"] == "H100-SXM5-80GB"
    assert collection["datasheet"]["achieved_share"] == {"fp32": 0.75, "bf16": 0.75, "memory_bandwidth": 0.8}
    verify_manifest(out)
    # the records are what the learned models read: features, a run that validates
    from learnedperf.features.ops import device_descriptor, op_features
    from learnedperf.specs import RunSpec

    assert device_descriptor(ops.device[0])["name"] == "H100-SXM5-80GB"
    assert op_features(ops).shape[0] == len(ops)
    assert RunSpec.from_dict(json.loads(steps.run[0])).hardware.device.name == "H100-SXM5-80GB"
    # curves are not added to a data sheet afterwards either
    from learnedperf.measure.curves import attach_curves

    with pytest.raises(InputError, match="describe a GPU by its data sheet"):
        attach_curves(out)


def test_an_unknown_gpu_stops_before_anything_is_timed(tmp_path, monkeypatch):
    calls, _, _ = _fake_gpu(monkeypatch, reported="NVIDIA H100 NVL", memory_GiB=93.0)
    with pytest.raises(InputError, match="not in the catalog"):
        C.collect(tmp_path / "x", quick=True, parts=("ops",), device="cuda", progress=False, log=lambda m: None)
    assert calls["describe"] == 0 and not list((tmp_path / "x").glob("*.parquet"))
    # a CPU has no data sheet to give
    with pytest.raises(InputError, match="device_spec: a GPU's data sheet"):
        C.collect(tmp_path / "y", quick=True, parts=("ops",), device="cpu", device_spec="T4", progress=False)
    assert main(["measure", "--device-spec", "T4", "--parts", "ops"]) == 2


def test_a_spent_time_budget_keeps_what_was_measured_and_lists_the_rest(tmp_path, monkeypatch):
    step = _fake_gpu(monkeypatch)[2]
    checks = {"n": 0}

    def spent(deadline):  # the budget runs out after the third operator case
        assert deadline is not None
        checks["n"] += 1
        return checks["n"] > 2

    monkeypatch.setattr(C, "_spent", spent)
    out = tmp_path / "gpu"
    manifest = C.collect(out, quick=True, parts=("ops", "steps"), device="cuda", progress=False,
                         time_budget_s=60, log=lambda m: None)
    ops = pd.read_parquet(out / "ops_cuda_quick.parquet")
    # the three cases measured before the budget ran out are kept, the fourth and the one step are listed
    assert set(ops.op) == {"linear", "bmm", "sdpa"}
    skipped = [s for s in manifest["collections"][-1]["skipped"] if "time budget" in s["reason"]]
    assert [s["op"] for s in skipped] == ["1 operator case(s) from layer_norm[64,256] fp32 eps=1e-05 on",
                                          f"1 step(s) from {step.label()} on"]
    assert pd.read_parquet(out / "steps_cuda_quick.parquet").empty
    assert manifest["collections"][-1]["time_budget_s"] == 60
    with pytest.raises(InputError, match="time_budget_s: expected a positive number"):
        C.collect(tmp_path / "z", quick=True, parts=("ops",), time_budget_s=0, progress=False)
