"""torch.optim's implementations and gradients freed each step: what they cost the optimizer step and the peak.

The closed forms follow torch's own code (torch/optim/adam.py): the foreach Adam makes ``sqrt`` of the second
moment as a new list of fp32 tensors, one element per parameter, while every state and gradient is alive; the
for-loop makes it one parameter at a time; a fused kernel makes nothing. ``zero_grad(set_to_none=True)`` frees the
gradients, so that a step of one micro-batch holds them only from its backward on. The measured peaks of the lent
GPUs' steps (``datasets/measured/lent-*``, measured by ``learnedperf measure``, which runs exactly that loop) are
the check that these are the moments that matter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import GPT_SMALL, LLAMA_GQA, load_experiment, make_run
from learnedperf.errors import SpecError
from learnedperf.graph.execution import compile_run, sharded_params
from learnedperf.graph.transformer import optimizer_ops
from learnedperf.measure.records import run_id
from learnedperf.simulate.memory import (CUBLAS_WORKSPACE_BYTES, HOPPER_CUBLAS_WORKSPACE_BYTES,
                                         eager_attention_extra_bytes, gpu_library_workspace_bytes,
                                         layer_activation_bytes, peak_memory, peak_memory_of)
from learnedperf.specs import RunSpec

REPO = Path(__file__).resolve().parents[1]
TORCH_LOOP = {"optimizer_impl": "foreach", "persistent_grads": False}
#: the two cuBLAS workspaces of a training step on the tests' inline A100-like device (no compute capability given)
WORKSPACES = 2 * CUBLAS_WORKSPACE_BYTES


def both(run):
    """The compiled schedule's peak, checked against the closed form a planner uses."""
    mem = peak_memory(compile_run(run))
    assert mem == peak_memory_of(run)
    return mem


def test_a_foreach_adam_step_peaks_with_an_fp32_copy_of_the_parameters():
    # fp32 weights, gradients, two moments and the sqrt list: 20 bytes a parameter, activations freed
    run = make_run(GPT_SMALL, precision="fp32", **TORCH_LOOP)
    mem = both(run)
    psi = run.model.num_params()
    assert mem.phase == "optimizer_step" and mem.activations == 0
    assert mem.total == pytest.approx(20 * psi + WORKSPACES, rel=1e-12)
    fused = both(make_run(GPT_SMALL, precision="fp32", persistent_grads=False))
    assert fused.phase == "forward_backward"  # a fused step adds nothing: the backward holds more
    assert fused.total < mem.total


def test_a_sharded_foreach_step_copies_its_shard_only():
    run = make_run({**GPT_SMALL, "seq_length": 128}, num_devices=2, zero_stage=1, precision="fp32", **TORCH_LOOP)
    mem = both(run)
    local = sharded_params(run.strategy, run.model.num_params(), 0.0, 1)
    assert mem.phase == "optimizer_step"
    assert mem.temporary == pytest.approx(4 * local + WORKSPACES, rel=1e-12)


def test_the_for_loop_holds_two_copies_of_its_largest_parameter():
    # the sqrt of one parameter's second moment and its quotient by the bias correction, alive together: here the
    # tied embedding (vocabulary x hidden), larger than any FFN matrix
    run = make_run(GPT_SMALL, precision="fp32", optimizer_impl="for_loop", persistent_grads=False)
    mem = both(run)
    m = run.model
    assert m.vocab_size * m.hidden_size > m.hidden_size * m.ffn_hidden_size
    assert mem.phase == "optimizer_step"
    assert mem.temporary == pytest.approx(2 * 4 * m.vocab_size * m.hidden_size + WORKSPACES,
                                          rel=1e-12)
    assert mem.total < both(make_run(GPT_SMALL, precision="fp32", **TORCH_LOOP)).total


def test_freed_gradients_are_not_alive_in_a_single_micro_batch_backward():
    big = dict(micro_batch_size=8, global_batch_size=8, precision="bf16")
    kept, freed = both(make_run(LLAMA_GQA, **big)), both(make_run(LLAMA_GQA, persistent_grads=False, **big))
    assert freed.phase == kept.phase == "forward_backward"
    assert freed.gradients == 0 and kept.gradients > 0
    assert kept.total - freed.total == pytest.approx(kept.gradients, rel=1e-12)
    # accumulating over two micro-batches, the second runs with the first one's gradients made
    two = both(make_run(LLAMA_GQA, persistent_grads=False, micro_batch_size=8, global_batch_size=16))
    assert two.gradients == kept.gradients and two.total == pytest.approx(kept.total, rel=1e-12)
    # DDP's buckets hold a gradient-sized buffer across iterations; FSDP shards and frees its gradients
    ddp = both(make_run(LLAMA_GQA, num_devices=2, persistent_grads=False, micro_batch_size=8, global_batch_size=16))
    assert ddp.gradients == both(make_run(LLAMA_GQA, num_devices=2, micro_batch_size=8,
                                          global_batch_size=16)).gradients > 0
    fsdp = both(make_run(LLAMA_GQA, num_devices=2, fsdp=True, persistent_grads=False, micro_batch_size=8,
                         global_batch_size=16))
    assert fsdp.phase == "forward_backward" and fsdp.gradients == 0


def test_eager_cross_entropy_holds_three_logits_and_the_fused_one_two():
    run, eager = make_run(LLAMA_GQA), make_run(LLAMA_GQA, fused_elementwise=False)
    m = run.model
    logits = 4.0 * run.strategy.micro_batch_size * m.seq_length * m.vocab_size
    assert both(eager).temporary - both(run).temporary == pytest.approx(logits, rel=1e-12)


def test_a_full_recompute_backward_holds_one_recomputed_layer():
    run = make_run(LLAMA_GQA, recompute="full")
    mem = both(run)
    m = run.model
    logits = 2 * 4.0 * run.strategy.micro_batch_size * m.seq_length * m.vocab_size
    assert mem.temporary == pytest.approx(WORKSPACES + logits + layer_activation_bytes(run, "none"),
                                          rel=1e-12)
    assert layer_activation_bytes(run, "none") > layer_activation_bytes(run)


def test_the_gpu_libraries_workspaces_follow_pytorch_s_rule():
    # one cuBLAS workspace per handle, a handle per thread: a training step's forward and backward threads, an
    # inference step's one; 32 MiB on compute capability 9.0, 8 MiB and 128 KiB elsewhere; none on a CPU
    cpu = {"name": "cpu-test", "vendor": "test", "peak_tflops": {"fp32": 1.0, "bf16": 1.0},
           "memory_bandwidth_GBps": 20.0, "memory_GiB": 24.0}
    gpu, host = make_run(GPT_SMALL, precision="fp32"), make_run(GPT_SMALL, precision="fp32", device=cpu)
    assert both(gpu).total - both(host).total == pytest.approx(WORKSPACES, rel=1e-9)
    h100, a100 = (RunSpec.from_dict({"model": "gpt2-small", "hardware": {"device": d, "num_devices": 1}})
                  for d in ("H100-SXM5-80GB", "A100-SXM4-80GB"))
    assert (h100.hardware.device.compute_capability, a100.hardware.device.compute_capability) == ("9.0", "8.0")
    assert gpu_library_workspace_bytes(h100.hardware.device) == 2 * 32 * 2 ** 20 == 2 * HOPPER_CUBLAS_WORKSPACE_BYTES
    assert gpu_library_workspace_bytes(a100.hardware.device) == 2 * (8 * 2 ** 20 + 128 * 2 ** 10)
    assert gpu_library_workspace_bytes(a100.hardware.device, forward_only=True) == CUBLAS_WORKSPACE_BYTES
    assert gpu_library_workspace_bytes(host.hardware.device) == 0


def test_torch_optim_adam_streams_72_bytes_a_parameter_the_fused_kernel_28():
    # besides the gradient-norm pass (4 bytes) and, for bf16 weights, the low-precision copy (2)
    for precision, copy in (("fp32", 0), ("bf16", 2)):
        (fused,) = optimizer_ops(1e6, "adam", precision)
        for impl in ("foreach", "for_loop"):
            (torch_loop,) = optimizer_ops(1e6, "adam", precision, impl)
            assert torch_loop.bytes == (72 + copy + 4) * 1e6 and fused.bytes == (28 + copy + 4) * 1e6
            assert torch_loop.flops == fused.flops
    assert optimizer_ops(1e6, "sgd", "fp32", "foreach")[0].bytes == optimizer_ops(1e6, "sgd", "fp32")[0].bytes


def test_the_keys_are_checked_and_their_defaults_keep_run_ids():
    with pytest.raises(SpecError, match="optimizer_impl"):
        make_run(GPT_SMALL, optimizer="none", optimizer_impl="foreach")
    with pytest.raises(SpecError, match="optimizer_impl"):
        make_run(GPT_SMALL, optimizer_impl="apex")
    plain = make_run(GPT_SMALL)
    stated = plain.to_dict()
    stated["strategy"].update(optimizer_impl="fused", persistent_grads=True)
    assert run_id(RunSpec.from_dict(stated).to_dict()) == run_id(plain.to_dict())
    loop = make_run(GPT_SMALL, **TORCH_LOOP)
    assert RunSpec.from_dict(json.loads(json.dumps(loop.to_dict()))) == loop
    assert run_id(loop.to_dict()) != run_id(plain.to_dict())


def test_measure_says_how_its_optimizer_ran():
    from learnedperf.measure.steps import StepConfig, run_dict

    from test_measure_steps import HARDWARE, LLAMA

    cpu = run_dict(StepConfig(LLAMA, 1, {}), HARDWARE)["strategy"]
    cuda = run_dict(StepConfig(LLAMA, 1, {}, device="cuda"), HARDWARE)["strategy"]
    assert (cpu["optimizer_impl"], cuda["optimizer_impl"]) == ("for_loop", "foreach")
    assert cpu["persistent_grads"] is False is cuda["persistent_grads"]


def test_the_amendment_follows_the_device_the_data_set_ran_on(tmp_path):
    import shutil

    amend = load_experiment("amend_records")
    runs = [{"strategy": {"optimizer": "adam"}}, {"strategy": {"optimizer": "none"}},
            {"strategy": {"optimizer": "adam", "optimizer_impl": "fused"}}]
    for r in runs:
        amend.optimizer_marker("foreach")(r)
    assert [r["strategy"].get("optimizer_impl") for r in runs] == ["foreach", None, "fused"]
    assert [r["strategy"].get("persistent_grads") for r in runs] == [False, None, None]
    # the committed data sets carry it already: amending a copy again changes nothing
    copy = tmp_path / "lent-h100"
    shutil.copytree(REPO / "datasets" / "measured" / "lent-h100", copy)
    assert amend.amend_optimizer(copy, "test") == 0


def test_the_lent_gpus_peaks_are_the_models():
    # measured: the caching allocator's peak of every step the lent H100 and H200 ran (81 steps); the model's
    # workspace constant is the smallest residual of the steps that peak in the optimizer step
    mod = load_experiment("memory_accuracy")
    rows = [r for d in ("lent-h100", "lent-h200") for r in mod.steps_of(REPO / "datasets" / "measured" / d)]
    assert len(rows) == 81
    step = [r for r in rows if r["phase"] == "optimizer_step"]
    assert len(step) >= 40
    assert all(abs(r["pred"] / r["meas"] - 1) < 0.04 for r in step)
    assert {r["workspace"] for r in step} == {2 * HOPPER_CUBLAS_WORKSPACE_BYTES}  # two Hopper workspaces, measured
    assert min(r["meas"] - r["pred"] for r in step) == pytest.approx(0.0, abs=2 ** 20)
    assert sum(abs(r["pred"] / r["meas"] - 1) for r in rows) / len(rows) < 0.03
    # the backward's peaks too, TinyLlama's eager GQA steps included (6 % under before the eager attention's rule)
    backward = [r for r in rows if r["phase"] == "forward_backward"]
    assert len(backward) >= 25 and all(abs(r["pred"] / r["meas"] - 1) < 0.04 for r in backward)


def test_the_cli_flags_reach_the_run_and_a_contradiction_is_one_line(capsys):
    from learnedperf.cli import main

    base = ["simulate", "--model", "gpt2-small", "--device", "H100-SXM5-80GB", "--num-devices", "1",
            "--precision", "fp32", "--seq-length", "128", "--format", "json"]
    assert main(base + ["--optimizer-impl", "foreach", "--no-persistent-grads"]) == 0
    loop = json.loads(capsys.readouterr().out)
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert loop["peak_memory_phase"] == "optimizer_step" != plain["peak_memory_phase"]
    assert loop["breakdown_ms"]["optimizer"] > plain["breakdown_ms"]["optimizer"]
    assert main(base + ["--optimizer", "none", "--optimizer-impl", "foreach"]) != 0
    err = capsys.readouterr().err
    assert "optimizer_impl" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_sampler_trains_its_eager_runs_in_torch_s_own_loop():
    from learnedperf.data.sampler import sample_runs

    runs = [run for _i, run in sample_runs(300, seed=5)]
    eager = [r["strategy"] for r in runs if r["strategy"].get("fused_elementwise") is False]
    assert eager
    for s in eager:
        if s.get("optimizer", "adam") == "none":
            assert "optimizer_impl" not in s and "persistent_grads" not in s
        else:
            assert (s["optimizer_impl"], s["persistent_grads"]) == ("foreach", False)
    assert not any("optimizer_impl" in r["strategy"] for r in runs if r["strategy"].get("fused_elementwise", True))


def test_a_compute_capability_is_read_as_major_minor_and_checked():
    dev = {"name": "gpu-x", "vendor": "test", "peak_tflops": {"fp32": 1.0, "bf16": 2.0},
           "memory_bandwidth_GBps": 100.0, "memory_GiB": 16.0}
    for given, read in ((9.0, "9.0"), ("8.6", "8.6"), (10, "10.0")):
        run = RunSpec.from_dict({"model": "gpt2-small", "hardware": {"device": {**dev, "compute_capability": given},
                                                                      "num_devices": 1}})
        assert run.hardware.device.compute_capability == read
    for bad in ("nine", 86, True):
        with pytest.raises(SpecError, match="hardware.device.compute_capability"):
            RunSpec.from_dict({"model": "gpt2-small", "hardware": {"device": {**dev, "compute_capability": bad},
                                                                    "num_devices": 1}})
    # the catalog's GPUs name theirs, with a source; AMD's have none
    from learnedperf.catalog import get_device, names

    for n in names("devices"):
        d = get_device(n)
        assert (d.get("compute_capability") is not None) == (d["vendor"] == "NVIDIA")
        if d["vendor"] == "NVIDIA":
            assert "compute_capability" in d["sources"]


def test_the_capability_amendment_takes_the_catalog_s_value():
    amend = load_experiment("amend_records")
    named = {"hardware": {"device": {"name": "H100-SXM5-80GB"}}}
    own = {"hardware": {"device": {"name": "gpu-x"}}}
    stated = {"hardware": {"device": {"name": "A100-SXM4-80GB", "compute_capability": "8.0"}}}
    by_name = {"hardware": {"device": "H100"}}
    for r in (named, own, stated, by_name):
        amend.mark_capability(r)
    assert named["hardware"]["device"]["compute_capability"] == "9.0"
    assert "compute_capability" not in own["hardware"]["device"]
    assert stated["hardware"]["device"]["compute_capability"] == "8.0" and by_name["hardware"]["device"] == "H100"


def test_eager_attention_keeps_the_qkv_output_or_the_repeated_heads():
    """Closed forms from what autograd saves in PyTorch's eager attention (the step harness's layer): RoPE by
    tensor operations keeps the QKV output's Q and K part beside the rotated Q and K; grouped-query attention in
    fp32 on a GPU repeats k and v to every query head, and the kernel saves the repeated copies instead."""
    T = 2 * LLAMA_GQA["seq_length"]
    a, kv, hd = LLAMA_GQA["num_attention_heads"], LLAMA_GQA["num_kv_heads"], 4096 // 32

    def extra(**strategy):
        run = make_run(LLAMA_GQA, micro_batch_size=2, global_batch_size=2, **strategy)
        fused = make_run(LLAMA_GQA, micro_batch_size=2, global_batch_size=2, **{**strategy, "fused_elementwise": True})
        # the layer's count differs from the fused run's by the eager SwiGLU's silu(gate) and this extra alone
        silu = T * LLAMA_GQA["ffn_hidden_size"] * (4 if strategy.get("precision", "bf16") == "fp32" else 2)
        assert layer_activation_bytes(run) - layer_activation_bytes(fused) == pytest.approx(
            silu + eager_attention_extra_bytes(run, T))
        return eager_attention_extra_bytes(run, T)

    assert extra(fused_elementwise=False, precision="bf16") == T * (a * hd + kv * hd) * 2
    assert extra(fused_elementwise=False, precision="fp32") == T * 2 * (a - kv) * hd * 4
    assert eager_attention_extra_bytes(make_run(LLAMA_GQA, fused_elementwise=True), T) == 0.0
    mla = RunSpec.from_dict({"model": "deepseek-v2-lite", "hardware": {"cluster": "dgx-h100", "num_devices": 8},
                             "strategy": {"fused_elementwise": False, "precision": "bf16"}})
    assert mla.model.kv_lora_rank > 0 and eager_attention_extra_bytes(mla, T) == 0.0  # not measured: nothing
    # on a CPU, SDPA takes enable_gqa in fp32 too: the rotary rule again
    cpu = make_run(LLAMA_GQA, device={"name": "cpu-test", "peak_tflops": {"fp32": 1.0}, "memory_GiB": 64,
                                      "memory_bandwidth_GBps": 50},
                   fused_elementwise=False, precision="fp32")
    assert cpu.hardware.device.is_cpu
    assert eager_attention_extra_bytes(cpu, T) == T * (a * hd + kv * hd) * 4
    # tensor parallelism splits the heads: one rank holds 1/tp of the extra
    one = make_run(LLAMA_GQA, fused_elementwise=False, precision="bf16")
    two = make_run(LLAMA_GQA, 2, tp=2, fused_elementwise=False, precision="bf16")
    f_one = make_run(LLAMA_GQA, fused_elementwise=True, precision="bf16")
    f_two = make_run(LLAMA_GQA, 2, tp=2, fused_elementwise=True, precision="bf16")
    seq = LLAMA_GQA["seq_length"]
    assert (layer_activation_bytes(two) - layer_activation_bytes(f_two)) == pytest.approx(
        (layer_activation_bytes(one) - layer_activation_bytes(f_one)) / 2)
    assert eager_attention_extra_bytes(one, seq) == eager_attention_extra_bytes(two, seq)
