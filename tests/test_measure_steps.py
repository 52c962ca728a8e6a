"""Measured training steps: multi-process DDP / TP / PP end to end, numerical equivalence of the
sharded models with the plain one, validation before anything starts, and failure surfacing.

Everything runs on CPU with gloo and tiny models; ranks are forked from a fork server that has
torch preloaded, so after the first run each multi-process step takes well under a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time

import pytest

from learnedperf.errors import InputError, LearnedPerfError
from learnedperf.measure.records import STEP_COLUMNS
from learnedperf.measure.steps import (StepConfig, plan_step, run_dict, schedule, step_grid, train_losses,
                                       measure_step)
from learnedperf.specs import ModelSpec, RunSpec

CPU_DEVICE = {"name": "test-cpu", "vendor": "test", "peak_tflops": {"fp32": 0.1, "bf16": 0.8},
              "memory_bandwidth_GBps": 20.0, "memory_GiB": 24.0}
HARDWARE = {"device": CPU_DEVICE, "devices_per_node": 4, "intra_node_bandwidth_GBps": 5.0,
            "intra_node_latency_us": 20.0}

GPT = {"name": "gpt-test", "arch": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
       "vocab_size": 256, "seq_length": 32}
LLAMA = {"name": "llama-test", "arch": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_kv_heads": 2, "vocab_size": 256, "seq_length": 32}
BERT = {**GPT, "name": "bert-test", "arch": "bert"}

#: SGD with a large step: a gradient wrong in scale or direction changes the second loss visibly
#: (Adam's first step is scale-invariant and would hide a factor-of-tp error).
SGD = {"optimizer": "sgd"}
LR = 0.5


def _check_record(rec: dict, world: int, kind: str) -> dict:
    assert set(rec) == set(STEP_COLUMNS)
    assert rec["world_size"] == world
    assert rec["strategy_kind"] == kind
    assert rec["backend"] == ("gloo" if world > 1 else "none")
    assert 0 < rec["iteration_p10_ms"] <= rec["iteration_time_ms"] <= rec["iteration_p90_ms"]
    assert rec["peak_memory_MiB"] > 0
    assert rec["device_name"] == CPU_DEVICE["name"]
    assert json.loads(rec["device"]) == CPU_DEVICE
    run = json.loads(rec["run"])
    spec = RunSpec.from_dict(run)
    assert spec.hardware.num_devices == world
    assert spec.strategy.tp * spec.strategy.pp * spec.strategy.dp == world
    assert json.loads(rec["per_op"]) == []
    return run


def test_ddp_step_two_processes():
    cfg = StepConfig(GPT, 2, {"grad_bucket_size_MiB": 1.0}, warmup=1, repeats=3)
    run = _check_record(measure_step(cfg, HARDWARE), 2, "dp")
    assert run["strategy"]["dp"] == 2 and run["strategy"]["overlap_grad_reduce"] is True
    assert run["strategy"]["grad_bucket_size_MiB"] == 1.0


def test_tp_step_two_processes():
    cfg = StepConfig(LLAMA, 2, {"tp": 2, "precision": "bf16"}, warmup=1, repeats=3)
    run = _check_record(measure_step(cfg, HARDWARE), 2, "tp")
    assert run["strategy"]["tp"] == 2 and run["strategy"]["precision"] == "bf16"
    assert run["model"] == ModelSpec.parse(LLAMA).to_dict()  # the record states the model that ran


def test_pp_1f1b_step_two_processes():
    cfg = StepConfig(GPT, 2, {"pp": 2, "global_batch_size": 4, "pipeline_schedule": "1f1b"}, warmup=1, repeats=3)
    run = _check_record(measure_step(cfg, HARDWARE), 2, "pp")
    assert RunSpec.from_dict(run).num_microbatches == 4


@pytest.mark.parametrize("model", [GPT, LLAMA], ids=["gpt", "llama-gqa"])
def test_tensor_parallel_matches_unsharded(model):
    plain = train_losses(StepConfig(model, 1, {**SGD, "global_batch_size": 2}, learning_rate=LR), 3)
    tp = train_losses(StepConfig(model, 2, {**SGD, "tp": 2, "global_batch_size": 2}, learning_rate=LR), 3)
    assert plain[0] != plain[2]  # the optimizer really moved the weights
    assert tp == pytest.approx(plain, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("sched", ["gpipe", "1f1b", "zb-h1"])
def test_pipeline_schedules_match_single_process(sched):
    # zb-h1: the linear layers' weight gradients are computed in W passes after the backward (WeightGradStore)
    # GPT ties the embedding and the head, which live on different stages: their gradients must be summed.
    strat = {**SGD, "global_batch_size": 4}
    plain = train_losses(StepConfig(GPT, 1, strat, learning_rate=LR), 3)
    pp = train_losses(StepConfig(GPT, 2, {**strat, "pp": 2, "pipeline_schedule": sched}, learning_rate=LR), 3)
    assert pp == pytest.approx(plain, rel=1e-4, abs=1e-5)


def test_data_parallel_and_fsdp_match_single_process():
    strat = {**SGD, "global_batch_size": 4}
    plain = train_losses(StepConfig(BERT, 1, strat, learning_rate=LR), 2)
    for extra in ({}, {"fsdp": True}):
        dp = train_losses(StepConfig(BERT, 2, {**strat, **extra}, learning_rate=LR), 2)
        assert dp == pytest.approx(plain, rel=1e-4, abs=1e-5), extra


def test_model_parameter_count_matches_spec():
    from learnedperf.measure.models import build_model, count_parameters

    for model in (GPT, LLAMA, BERT):
        assert count_parameters(build_model(model)) == ModelSpec.parse(model).num_params()


@pytest.mark.parametrize("strategy, world, field", [
    ({"tp": 3}, 3, "strategy.tp"),                       # 3 does not divide 4 heads
    ({"tp": 2, "dp": 2}, 2, "strategy.dp"),              # tp·pp·dp = 4 != 2
    ({"pp": 4}, 4, "strategy.pp"),                       # 2 layers < pp
    ({"global_batch_size": 3}, 2, "strategy.global_batch_size"),
    ({"cp": 2}, 2, "strategy.cp"),                       # not a measured-step key
    ({"precision": "fp8"}, 1, "strategy.precision"),
    ({"zero_stage": 1, "tp": 2}, 2, "strategy.zero_stage"),
    ({"fsdp": True, "dp_replicate": 3}, 4, "strategy.dp_replicate"),   # 3 does not divide dp = 4
    ({"fsdp": True, "dp_replicate": 4}, 4, "strategy.dp_replicate"),   # = dp: one rank per copy, plain DP
    ({"fsdp": True, "dp_replicate": 0}, 4, "strategy.dp_replicate"),
    ({"fsdp": True, "dp_replicate": True}, 4, "strategy.dp_replicate"),
    ({"dp_replicate": 2}, 4, "strategy.dp_replicate"),                 # nothing sharded to replicate
    ({"zero_stage": 1, "dp_replicate": 2}, 4, "strategy.dp_replicate"),  # ZeRO-1 is not measured on FSDP2
    ({"pp": 2, "pipeline_schedule": "zb-v"}, 2, "strategy.virtual_pipeline_stages"),  # ZB-V's V has 2 chunks
    ({"pp": 2, "pipeline_schedule": "zb-v", "virtual_pipeline_stages": 3}, 2, "strategy.virtual_pipeline_stages"),
    ({"pp": 2, "virtual_pipeline_stages": 2}, 2, "strategy.virtual_pipeline_stages"),  # 1F1B: one chunk per rank
    ({"pipeline_schedule": "zb-v", "virtual_pipeline_stages": 2}, 1, "strategy.pipeline_schedule"),  # pp = 1
    ({"pp": 2, "pipeline_schedule": "zb-v", "virtual_pipeline_stages": 2}, 2, "strategy.pp"),  # 2 layers < 2·pp
])
def test_invalid_config_is_rejected_before_starting(strategy, world, field):
    t0 = time.perf_counter()
    with pytest.raises(InputError) as err:
        measure_step(StepConfig(GPT, world, strategy), HARDWARE)
    assert str(err.value).startswith(field)
    assert "gpt-test" in str(err.value)
    assert time.perf_counter() - t0 < 2.0  # nothing was spawned


def test_invalid_model_names_the_field():
    with pytest.raises(InputError, match=r"^model\.arch"):
        plan_step(StepConfig({"arch": "rnn"}, 1))
    with pytest.raises(InputError, match=r"^model\.depth"):
        plan_step(StepConfig({"arch": "mlp", "depth": 3}, 1))
    # the harness builds language models: a classification head is refused, not measured as an LM head
    with pytest.raises(InputError, match=r"^model\.lm_head"):
        plan_step(StepConfig({**GPT, "lm_head": False}, 1))


def test_failing_rank_surfaces_as_one_error():
    from learnedperf.measure.steps import _execute

    plan = plan_step(StepConfig(GPT, 2, {"tp": 2}, warmup=0, repeats=1))
    # Bypass validation: tp=2 cannot split 3 heads, so every rank fails while building its model.
    broken = dataclasses.replace(plan, model={**plan.model, "num_attention_heads": 3, "hidden_size": 63})
    t0 = time.perf_counter()
    with pytest.raises(LearnedPerfError, match=r"failed on rank \d \(step config: gpt-test"):
        _execute(broken)
    assert time.perf_counter() - t0 < 30


def test_timeout_kills_the_ranks():
    with pytest.raises(LearnedPerfError, match="timed out"):
        measure_step(StepConfig(GPT, 2, {}, warmup=50, repeats=50, timeout_s=0.5), HARDWARE)


def test_single_process_profile_and_mlp():
    rec = measure_step(StepConfig({"arch": "mlp", "name": "mlp-test", "input_size": 32, "hidden_size": 64,
                                   "num_layers": 2, "num_classes": 10}, 1, {"micro_batch_size": 8},
                                  warmup=1, repeats=3, profile=True), HARDWARE)
    assert set(rec) == set(STEP_COLUMNS) and rec["arch"] == "mlp" and rec["strategy_kind"] == "single"
    ops = json.loads(rec["per_op"])
    assert ops and {"name", "calls", "self_time_ms"} <= set(ops[0])
    assert any("addmm" in op["name"] or "linear" in op["name"] for op in ops)


def test_a_profiler_that_fails_costs_per_op_only(monkeypatch, capsys):
    """One process: the timed iterations stand when the profiled one cannot run (no CUPTI in a VM, say); the
    failure is said on stderr."""
    import torch.profiler

    from learnedperf.measure import steps as st

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    plan = st.plan_step(StepConfig(GPT, 1, {}, warmup=1, repeats=2, profile=True))
    (rank,) = st._run_in_process(plan, None)
    assert len(rank["times_s"]) == 2 and all(t > 0 for t in rank["times_s"]) and rank["per_op"] == []
    err = capsys.readouterr().err
    assert "profiling" in err and "CUPTI_ERROR_NOT_INITIALIZED" in err and "kept without per_op" in err


def test_pipeline_schedules_are_valid():
    for kind in ("gpipe", "1f1b"):
        for pp in (2, 4):
            for stage in range(pp):
                order = schedule(kind, stage, pp, 6)
                assert sorted(order) == sorted([("F", i) for i in range(6)] + [("B", i) for i in range(6)])
                assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(6))
                if kind == "1f1b":  # at most pp - stage micro-batches in flight
                    live = peak = 0
                    for op, _ in order:
                        live += 1 if op == "F" else -1
                        peak = max(peak, live)
                    assert peak <= pp - stage
    for pp in (2, 4):
        for stage in range(pp):
            order = schedule("zb-h1", stage, pp, 6)
            # 1F1B's forwards and backwards, each micro-batch's weight pass after its backward
            assert [u for u in order if u[0] != "W"] == schedule("1f1b", stage, pp, 6)
            assert sorted(i for op, i in order if op == "W") == list(range(6))
            assert all(order.index(("B", i)) < order.index(("W", i)) for i in range(6))


def test_grid_is_large_valid_and_parses():
    grid = step_grid(quick=False)
    plans = [plan_step(c) for c in grid]
    assert len(grid) >= 110
    assert sum(p.world_size > 1 for p in plans) >= 50
    assert {p.kind for p in plans} >= {"single", "dp", "tp", "pp", "zero", "fsdp", "tp+dp", "pp+dp"}
    assert {p.strategy["pipeline_schedule"] for p in plans if p.pp > 1} == {"gpipe", "1f1b", "interleaved", "zb-h1",
                                                                              "zb-v", "interleaved-zb"}
    zb_v = [p for p in plans if p.strategy["pipeline_schedule"] == "zb-v"]
    assert sorted(p.pp for p in zb_v) == [2] * 5 + [4] * 2
    assert all(p.strategy["virtual_pipeline_stages"] == 2 and p.model["num_layers"] >= 2 * p.pp for p in zb_v)
    assert {p.model["arch"] for p in plans} == {"gpt", "llama", "bert", "moe", "mlp", "cnn"}
    assert len({c.label() for c in grid}) == len(grid)
    for c, p in zip(grid, plans):
        if p.is_transformer:
            RunSpec.from_dict(run_dict(c, HARDWARE))
    quick = [plan_step(c) for c in step_grid(quick=True)]
    assert 3 <= len(quick) <= 5 and any(p.world_size > 1 for p in quick)


def test_importing_steps_does_not_import_torch():
    code = "import sys, learnedperf.measure.steps; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_four_process_combinations_match_single_process():
    # pp+dp exercises the bucketed data-parallel all-reduce after the flush and the tied-embedding group
    # per replica; tp+pp runs tensor-parallel stages exchanging activations.
    strat = {**SGD, "global_batch_size": 8}
    plain = train_losses(StepConfig(GPT, 1, strat, learning_rate=LR), 2)
    for extra in ({"pp": 2}, {"tp": 2, "pp": 2, "pipeline_schedule": "gpipe"}):
        losses = train_losses(StepConfig(GPT, 4, {**strat, **extra}, learning_rate=LR), 2)
        assert losses == pytest.approx(plain, rel=1e-4, abs=1e-5), extra


def test_hsdp_step_four_processes():
    # two replicas of states sharded over two ranks, two micro-batches (the replica all-reduce once, after both)
    cfg = StepConfig(GPT, 4, {"fsdp": True, "dp_replicate": 2, "global_batch_size": 8}, warmup=1, repeats=3)
    run = _check_record(measure_step(cfg, HARDWARE), 4, "fsdp")
    assert run["strategy"]["dp_replicate"] == 2 and run["strategy"]["zero_stage"] == 3
    spec = RunSpec.from_dict(run)
    assert (spec.strategy.dp_replicate, spec.strategy.shard_size, spec.num_microbatches) == (2, 2, 2)
    # without hybrid sharding the run says nothing of it, as records written before dp_replicate existed
    assert "dp_replicate" not in run_dict(StepConfig(GPT, 4, {"fsdp": True}), HARDWARE)["strategy"]
    assert run_dict(StepConfig(GPT, 4, {"zero_stage": 2, "dp_replicate": 2}), HARDWARE)["strategy"]["fsdp"] is True


def test_hsdp_shards_over_half_the_ranks_and_trains_like_one_process():
    from learnedperf.measure.models import build_model, count_parameters
    from learnedperf.measure.steps import _execute

    full = count_parameters(build_model(GPT))
    strat = {**SGD, "global_batch_size": 8}
    plain = train_losses(StepConfig(GPT, 1, strat, learning_rate=LR), 2)
    for extra, copies in (({"fsdp": True}, 1), ({"fsdp": True, "dp_replicate": 2}, 2),
                          ({"zero_stage": 2, "dp_replicate": 2}, 2)):
        ranks = _execute(plan_step(StepConfig(GPT, 4, {**strat, **extra}, learning_rate=LR)), 2)
        # FSDP2 shards each parameter's dim 0 over the shard group (every dim 0 of GPT divides by 4): FSDP's 4 ranks
        # hold a quarter of the model each, HSDP's shard groups of 2 a half
        assert [r["local_params"] for r in ranks] == [full * copies // 4] * 4, extra
        losses = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(2)]
        assert losses == pytest.approx(plain, rel=1e-4, abs=1e-5), extra


#: The step grid's MoE configurations, which the committed CPU data set has no record of yet.
MOE_NOT_YET_MEASURED = [{"step": "moe-small world=1 default strategy"},
                        {"step": "moe-small world=1 moe_capacity_factor=1.0"},
                        {"step": "moe-small world=1 moe_capacity_factor=2.0"},
                        {"step": "moe-small world=2 default strategy"}]

#: The step grid's ZB-V configurations (added with the harness's ZB-V schedule), not measured yet either.
ZBV_NOT_YET_MEASURED = [
    {"step": f"{name} world={world} global_batch_size={gbs} pipeline_schedule=zb-v pp={world} "
             "virtual_pipeline_stages=2"}
    for name, world, gbs in (("gpt-small", 2, 4), ("gpt-medium", 2, 4), ("llama-small", 2, 4), ("llama-medium", 2, 4),
                             ("bert-small", 2, 4), ("gpt-large", 4, 8), ("llama-large", 4, 8))]


#: The step grid's interleaved configurations (added with the harness's interleaved schedules), not measured yet.
INTERLEAVED_NOT_YET_MEASURED = [
    {"step": f"{name} world={pp} global_batch_size={gbs} pipeline_schedule={sched} pp={pp} "
             f"virtual_pipeline_stages={v}"}
    for name, pp, v, gbs in (("gpt-small", 2, 2, 4), ("llama-small", 2, 2, 4), ("gpt-medium", 2, 3, 4),
                             ("llama-large", 4, 2, 8))
    for sched in ("interleaved", "interleaved-zb")]


def _unmeasured_grid_config(config) -> bool:
    return config.model.get("name") == "moe-small" or config.strategy.get("pipeline_schedule") in (
        "zb-v", "interleaved", "interleaved-zb")


def test_committed_cpu_steps_cover_the_grid(tmp_path, monkeypatch):
    from pathlib import Path

    import pandas as pd

    from learnedperf.measure import bench, collect
    from learnedperf.measure.records import STEP_COLUMNS as COLS, sha256_file, verify_manifest, write_parquet

    from learnedperf.measure import steps as steps_module

    data = Path(__file__).resolve().parents[1] / "datasets" / "measured" / "vm-xeon-2c"
    # every grid configuration has a record whose run is exactly what measure_step would now write, but the MoE
    # ones: added to the grid on 2026-11-22, on a VM whose CPU model differs from the data set's, where
    # add_missing_steps refuses to measure them (experiments/moe_capacity.py times them there instead); and the
    # ZB-V and interleaved ones, added to the grid with the harness's schedules of theirs and not measured yet
    missing = collect.add_missing_steps(data, dry_run=True)
    not_yet = MOE_NOT_YET_MEASURED + ZBV_NOT_YET_MEASURED + INTERLEAVED_NOT_YET_MEASURED
    assert sorted(missing, key=str) == sorted(not_yet, key=str)
    grid = steps_module.step_grid
    monkeypatch.setattr(steps_module, "step_grid", lambda quick=False, device="cpu": [
        c for c in grid(quick, device) if not _unmeasured_grid_config(c)])
    assert collect.add_missing_steps(data, dry_run=True) == []
    steps = pd.read_parquet(data / "steps_cpu.parquet")
    hsdp = [json.loads(r)["strategy"] for r in steps["run"] if '"dp_replicate"' in r]
    assert len(hsdp) == 4 and all(s["dp_replicate"] == 2 and s["fsdp"] for s in hsdp)

    # a copy without one (cheap) record: only that configuration is measured again, and appended
    copy = tmp_path / "ds"
    copy.mkdir()
    for f in ("manifest.json", "steps_cpu.parquet"):
        (copy / f).write_bytes((data / f).read_bytes())
    plain = {"precision": "fp32", "recompute": "none", "micro_batch_size": 1, "global_batch_size": 1}
    gone = next(i for i, r in enumerate(steps.to_dict("records"))
                if r["model_name"] == "gpt-tiny" and r["threads"] == 1
                and plain.items() <= json.loads(r["run"])["strategy"].items())
    kept = steps.drop(index=gone).reset_index(drop=True)
    write_parquet(kept.to_dict("records"), copy / "steps_cpu.parquet", COLS, "step")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"] = {"steps_cpu.parquet": {"sha256": sha256_file(copy / "steps_cpu.parquet"), "rows": len(kept)}}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert collect.add_missing_steps(copy, dry_run=True) == [{"step": "gpt-tiny world=1 default strategy"}]
    monkeypatch.setattr(bench, "host_descriptor", lambda: manifest["host"])  # this machine stands in for the VM
    monkeypatch.setattr(collect, "wait_until_quiet", lambda: None)
    added = collect.add_missing_steps(copy, command="test", progress=False, log=lambda msg: None)
    assert [r["run_id"] for r in added] == [steps["run_id"][gone]]
    again = pd.read_parquet(copy / "steps_cpu.parquet")
    assert again.iloc[:len(kept)].equals(kept) and len(again) == len(steps)
    amended = verify_manifest(copy)
    assert amended["files"]["steps_cpu.parquet"]["rows"] == len(steps)
    assert amended["amendments"][-1]["rows_added"] == 1 and amended["amendments"][-1]["command"] == "test"


# ------------------------------------------------------------------ CUDA steps (planned here; no GPU needed)
H100 = {"device": "H100-SXM5-80GB", "devices_per_node": 1}


def test_a_cuda_step_runs_in_one_process():
    # the strategies' groups and meshes are built for gloo: on CUDA only world_size 1 is measured
    with pytest.raises(InputError, match=r"^device: steps on several processes are measured on CPU only"):
        plan_step(StepConfig(GPT, 2, device="cuda"))
    with pytest.raises(InputError, match=r"^device: expected 'cpu' or 'cuda', got 'tpu'"):
        plan_step(StepConfig(GPT, 1, device="tpu"))
    plan = plan_step(StepConfig(GPT, 1, {"precision": "bf16"}, device="cuda"))
    assert plan.cuda and plan.kind == "single"
    # the label says the device; a CPU step's label (quoted in manifests) is as before
    assert StepConfig(GPT, 1, device="cuda").label() == "gpt-test world=1 device=cuda"
    assert StepConfig(GPT, 1).label() == "gpt-test world=1 default strategy"


def test_the_gpu_grid_is_one_process_runs_of_valid_specs():
    grid = step_grid(device="cuda")
    assert len(grid) == 49 and {c.device for c in grid} == {"cuda"} and {c.world_size for c in grid} == {1}
    assert len({c.label() for c in grid}) == len(grid)
    for config in grid:
        run = run_dict(config, H100)
        spec = RunSpec.from_dict(run)  # every step is a run the predictor can be scored on
        assert spec.strategy.precision in ("fp32", "bf16")
    # the published shapes: TinyLlama-1.1B's config.json (22 layers, d 2048, 4 KV heads) is 1.10B parameters
    tiny_llama = next(c for c in grid if c.model["name"] == "tinyllama-1.1b-like")
    assert ModelSpec.model_validate(
        {k: v for k, v in tiny_llama.model.items() if k != "name"}).num_params() == pytest.approx(1.1e9, rel=0.01)
    # Llama 3 8B's first 4 layers: its 8.03B parameters less 28 of its 32 layers (each 218.1M: q and o 4096²,
    # k and v 4096·1024, a SwiGLU MLP 3·4096·14336, two norms) = 1.92B
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    llama3 = next(c for c in grid if c.model["name"] == "llama-3-8b-4-layers-like")
    assert ModelSpec.model_validate({k: v for k, v in llama3.model.items() if k != "name"}).num_params() == \
        pytest.approx(8.03e9 - 28 * layer, rel=0.01)
    # the large layers first, in bf16; then GPU-sized (21) and small (25) steps in turns: a time budget that runs
    # out leaves some of each
    from learnedperf.measure.steps import GPU_GRID_MODELS

    assert [c.model["name"] == "llama-3-8b-4-layers-like" for c in grid[:3]] == [True] * 3
    assert {c.strategy.get("precision") for c in grid[:3]} == {"bf16"}
    assert [c.model["name"] in GPU_GRID_MODELS for c in grid[3:]] == [True, False] * 21 + [False] * 4
    # the GPU-sized models' micro-batch-4 steps in both precisions, and only they, profile one more iteration
    profiled = sorted((c.model["name"], c.strategy["precision"]) for c in grid if c.profile)
    assert profiled == sorted((n, p) for n in GPU_GRID_MODELS if n != "llama-3-8b-4-layers-like"
                              for p in ("fp32", "bf16"))
    assert all(c.strategy["micro_batch_size"] == 4 and "recompute" not in c.strategy for c in grid if c.profile)
    quick = step_grid(quick=True, device="cuda")
    assert [c.world_size for c in quick] == [1, 1]
    with pytest.raises(InputError, match="device: expected 'cpu' or 'cuda'"):
        step_grid(device="tpu")


def test_collectives_a_machine_has_too_few_gpus_for_are_skipped_with_the_reason():
    from learnedperf.measure.collect import _gpu_worlds

    skipped, lines = [], []
    assert _gpu_worlds({2, 4}, 1, skipped, lines.append) == set()
    assert [s["op"] for s in skipped] == ["collectives over 2 processes", "collectives over 4 processes"]
    assert "NCCL needs one GPU per rank: 4 processes on this machine's 1 GPU(s)" in skipped[1]["reason"]
    assert len(lines) == 2
    skipped = []
    assert _gpu_worlds({2, 4}, 8, skipped, lines.append) == {2, 4} and skipped == []
    assert _gpu_worlds({2, 4}, 2, skipped, lines.append) == {2}


def test_the_cuda_branch_moves_the_step_to_the_gpu_and_times_it_synchronised(monkeypatch):
    # No GPU here: torch's CUDA calls are stood in for, so that the CUDA branch of one rank's step runs
    # on the CPU and what it asks of torch is recorded (placement, synchronisation, GPU peak memory).
    import torch

    from learnedperf.measure import steps as S

    moved, syncs = [], []
    module_to, tensor_to = torch.nn.Module.to, torch.Tensor.to

    def fake_module_to(self, *args, **kwargs):
        if args and args[0] == "cuda":
            moved.append("module")
            return self
        return module_to(self, *args, **kwargs)

    def fake_tensor_to(self, *args, **kwargs):
        if args and args[0] == "cuda":
            moved.append("tensor")
            return self
        return tensor_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", fake_module_to)
    monkeypatch.setattr(torch.Tensor, "to", fake_tensor_to)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 123 * 2**20)
    monkeypatch.setattr(S, "_peak_rss_MiB", lambda: pytest.fail("a CUDA step reads the GPU's peak, not the RSS"))
    casts = []

    def fake_autocast(device_type, dtype=None, enabled=True):
        casts.append((device_type, dtype, enabled))
        return contextlib.nullcontext()

    monkeypatch.setattr(torch, "autocast", fake_autocast)
    plan = plan_step(StepConfig(GPT, 1, {"global_batch_size": 2, "precision": "bf16"}, warmup=1, repeats=2,
                                device="cuda"))
    out = S._run_rank(plan, 0)
    # the model once, then tokens and targets of both micro-batches; bf16 under CUDA's autocast
    assert moved == ["module"] + ["tensor"] * 4
    assert set(casts) == {("cuda", torch.bfloat16, True)} and len(casts) == 3 * 2  # 3 iterations × 2 micro-batches
    assert len(syncs) == 2 * 3  # before and after each of the 1 + 2 iterations
    assert len(out["times_s"]) == 2 and out["peak_memory_MiB"] == 123.0


def test_rotary_steps_need_an_even_head_width():
    # the rotation pairs the two halves of each head: an odd head width has no halves
    with pytest.raises(InputError, match=r"^model\.hidden_size: rotary embeddings need an even head_dim, got 25"):
        plan_step(StepConfig({**LLAMA, "hidden_size": 100, "num_attention_heads": 4, "num_kv_heads": 2}))
    with pytest.raises(InputError, match=r"^model\.head_dim: rotary embeddings need an even head_dim, got 33"):
        plan_step(StepConfig({**LLAMA, "head_dim": 33}))
    assert plan_step(StepConfig({**LLAMA, "head_dim": 32})).model["head_dim"] == 32


def test_sgd_steps_keep_no_momentum(monkeypatch):
    """The run format's 'sgd' keeps no optimizer state (no bytes per parameter beside the weights), so the
    harness's SGD must not either: a momentum buffer is 4 bytes a parameter the record would not say."""
    import torch

    made = []
    real = torch.optim.SGD

    class Recording(real):
        def __init__(self, params, **kwargs):
            made.append(kwargs)
            super().__init__(params, **kwargs)

    monkeypatch.setattr(torch.optim, "SGD", Recording)
    losses = train_losses(StepConfig(GPT, 1, {**SGD, "global_batch_size": 2}, learning_rate=LR), 2)
    assert losses[0] != losses[1]
    assert made and all(kw.get("momentum", 0.0) == 0.0 for kw in made)
    from learnedperf.graph.execution import optimizer_bytes_per_param

    spec = RunSpec.from_dict({"model": "gpt3-125m", "hardware": {"cluster": "dgx-a100", "num_devices": 1},
                              "strategy": {"optimizer": "sgd", "precision": "fp32"}})
    assert optimizer_bytes_per_param(spec.strategy) == 0  # what the record says the step kept
