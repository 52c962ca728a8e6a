"""Communication/computation overlap: the spec field, the simulator against its closed form, the
benchmark on 2 gloo processes, the amendment of a data set, and the committed records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import KNOWN_PARAMS, LLAMA_GQA, make_run, roofline, serial_ddp_parts
from learnedperf.errors import InputError, SpecError
from learnedperf.measure.bench import bench_overlap
from learnedperf.simulate import simulate
from learnedperf.simulate.simulator import _overlap_s
from learnedperf.specs import RunSpec

CPU_DATA = Path(__file__).resolve().parents[1] / "datasets" / "measured" / "vm-xeon-2c"


def test_overlap_of_interval_unions():
    # [0,2]∪[1,3] = [0,3]; against [2.5,4]∪[5,6]: 0.5
    assert _overlap_s([(0, 2), (1, 3)], [(2.5, 4), (5, 6)]) == pytest.approx(0.5)
    assert _overlap_s([(0, 1)], [(1, 2)]) == 0.0
    assert _overlap_s([], [(0, 1)]) == 0.0
    assert _overlap_s([(0, 10)], [(1, 2), (3, 4), (9, 12)]) == pytest.approx(3.0)


def _ddp(overlap):
    return make_run(LLAMA_GQA, num_devices=8, dp=8, overlap_grad_reduce=True,
                    hw_extra=None if overlap is None else {"comm_overlap": overlap})


def test_no_overlap_makes_overlapped_reduction_serial():
    # DDP reducing during backward, on links that computation does not hide at all: every second of
    # the all-reduces is paid, as if they ran after backward (the closed form of the serial case)
    run = _ddp(0.0)
    cost = roofline(run, KNOWN_PARAMS)
    compute, comm, opt = serial_ddp_parts(run, cost)
    r = simulate(run, cost=cost)
    assert r.iteration_time_s == pytest.approx(compute + comm + opt, rel=1e-9)
    assert r.breakdown_s["exposed_communication"] == pytest.approx(comm, rel=1e-9)
    # full overlap is the default (left out = 1) and hides part of it; the time is linear in between
    full, default = simulate(_ddp(1.0), cost=cost), simulate(_ddp(None), cost=cost)
    assert default.iteration_time_s == full.iteration_time_s < r.iteration_time_s
    half = simulate(_ddp(0.5), cost=cost).iteration_time_s
    assert half == pytest.approx((full.iteration_time_s + r.iteration_time_s) / 2, rel=1e-9)


def test_comm_overlap_is_validated_and_round_trips():
    run = _ddp(0.25)
    assert RunSpec.from_dict(json.loads(json.dumps(run.to_dict()))).hardware.comm_overlap == 0.25
    for bad in (-0.1, 1.5, "0.5"):
        d = _ddp(None).to_dict()
        d["hardware"]["comm_overlap"] = bad
        with pytest.raises(SpecError, match=r"hardware\.comm_overlap"):
            RunSpec.from_dict(d)


def test_bench_overlap_on_two_processes():
    r = bench_overlap(2, nbytes=1 << 20, loops=2, reps=2)
    assert r["world_size"] == 2 and r["bytes"] == 1 << 20 and r["matmuls"] >= 1
    assert 0.0 <= r["overlap"] <= 1.0 and len(r["loop_overlaps"]) == 2
    assert r["comm_ms"] > 0 and r["comp_ms"] > 0 and r["both_ms"] > 0
    with pytest.raises(InputError, match="loops/reps"):
        bench_overlap(2, loops=0)


def test_attach_overlap_refuses_another_machines_data_set(tmp_path):
    from learnedperf.measure.overlap import attach_overlap
    from learnedperf.measure.records import sha256_file

    d = tmp_path / "ds"
    shutil.copytree(CPU_DATA, d)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["host"]["cpu_model"] = "another CPU"
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="another machine .cpu_model"):
        attach_overlap(d)
    assert sha256_file(d / "steps_cpu.parquet") == manifest["files"]["steps_cpu.parquet"]["sha256"]


def test_committed_multi_process_steps_carry_the_measured_overlap():
    import pandas as pd

    manifest = json.loads((CPU_DATA / "manifest.json").read_text())
    measured = next(a for a in reversed(manifest["amendments"]) if "overlap" in a)["overlap"]
    seen = 0
    for text in pd.read_parquet(CPU_DATA / "steps_cpu.parquet")["run"]:
        hw = json.loads(text)["hardware"]
        if hw["num_devices"] == 1:
            assert "comm_overlap" not in hw
            continue
        assert hw["comm_overlap"] == round(measured[str(hw["num_devices"])]["overlap"], 4)
        seen += 1
    assert seen == 94


def test_other_machine_names_what_differs():
    from learnedperf.measure.bench import host_descriptor, other_machine

    here = host_descriptor()
    assert other_machine({"host": here}) == ""
    # what a data set measured elsewhere says: the differing key, its value there and here
    text = other_machine({"host": {**here, "cpu_model": "another CPU"}})
    assert text == f"cpu_model 'another CPU', here {here['cpu_model']!r}"
