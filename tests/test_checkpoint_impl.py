"""How recomputation runs (``strategy.checkpoint_impl``): what it costs the host, and who says which one a run used.

A recomputed op charges the host 1 + ``CHECKPOINT_HOST_EXCESS[impl]`` of its dispatches: the medians that
``experiments/checkpoint_overhead.py`` measured for PyTorch's reentrant and non-reentrant checkpoints. With a
host that takes 1 s a dispatch every block is host-bound, and the iteration time is a count of dispatches that
the graph gives independently of the checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import GPT_SMALL, KNOWN_PARAMS, LLAMA_GQA, make_run, roofline
from learnedperf.errors import SpecError
from learnedperf.graph.execution import CHECKPOINT_HOST_EXCESS
from learnedperf.graph.ops import Group
from learnedperf.graph.transformer import layer_forward, shard_for
from learnedperf.simulate import simulate

SLOW_HOST = replace(KNOWN_PARAMS, host_dispatch_us=1e6, eager_dispatch_us=1e6)


def _host_bound_s(run) -> float:
    return simulate(run, cost=roofline(run, SLOW_HOST), exact=True).iteration_time_s


def _layer_forward_dispatches(run) -> float:
    sh = shard_for(run, Group(1, 1), Group(1, 1), Group(1, 1))
    return sum(op.dispatches + op.chained_dispatches for op in layer_forward(run.model, sh))


@pytest.mark.parametrize("model, extra", [(GPT_SMALL, {}), (LLAMA_GQA, {"fused_elementwise": False})])
def test_a_recomputation_costs_the_host_its_forward_and_the_checkpoints_excess(model, extra):
    kw = dict(global_batch_size=2, precision="bf16", **extra)  # two micro-batches of one sequence
    none = make_run(model, **kw)
    reentrant = make_run(model, recompute="full", **kw)
    non_reentrant = make_run(model, recompute="full", checkpoint_impl="non_reentrant", **kw)
    forwards = 2 * model["num_layers"] * _layer_forward_dispatches(none)  # host seconds of the layers' forwards
    assert _host_bound_s(reentrant) - _host_bound_s(none) == pytest.approx(
        (1 + CHECKPOINT_HOST_EXCESS["reentrant"]) * forwards, rel=1e-9)
    assert _host_bound_s(non_reentrant) - _host_bound_s(reentrant) == pytest.approx(
        (CHECKPOINT_HOST_EXCESS["non_reentrant"] - CHECKPOINT_HOST_EXCESS["reentrant"]) * forwards, rel=1e-9)


def test_selective_recomputation_charges_only_core_attention():
    kw = dict(global_batch_size=1, precision="bf16", flash_attention=False)
    plain = make_run(GPT_SMALL, recompute="selective", **kw)
    hooked = make_run(GPT_SMALL, recompute="selective", checkpoint_impl="non_reentrant", **kw)
    sh = shard_for(plain, Group(1, 1), Group(1, 1), Group(1, 1))
    core = [op for op in layer_forward(plain.model, sh) if ".attn." in op.name
            and op.name.split(".")[-1] in ("scores", "softmax", "dropout", "context")]
    assert core, "the unfused attention has core ops to recompute"
    expected = GPT_SMALL["num_layers"] * sum(op.dispatches for op in core) * (
        CHECKPOINT_HOST_EXCESS["non_reentrant"] - CHECKPOINT_HOST_EXCESS["reentrant"])
    assert _host_bound_s(hooked) - _host_bound_s(plain) == pytest.approx(expected, rel=1e-9)


def test_a_device_bound_step_does_not_see_the_checkpoint():
    # a 1.3B layer at 4 sequences of 2048 tokens keeps an A100 busy far longer than the host issues its kernels
    from learnedperf.specs import RunSpec

    def run(**s):
        return RunSpec.from_dict({"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 1},
                                  "strategy": {"micro_batch_size": 4, "global_batch_size": 4, "recompute": "full",
                                               "precision": "bf16", **s}})

    assert simulate(run(checkpoint_impl="non_reentrant")).iteration_time_s == pytest.approx(
        simulate(run()).iteration_time_s, rel=1e-12)


def test_the_surrogate_costs_a_layer_as_the_simulator_does():
    from learnedperf.features.run import RunContext, layer_cost

    kw = dict(global_batch_size=1, precision="bf16", recompute="full")
    costs = {}
    for impl in ("reentrant", "non_reentrant"):
        run = make_run(GPT_SMALL, checkpoint_impl=impl, **kw)
        ctx = RunContext(run.model, run.hardware)
        ctx.cost = roofline(run, SLOW_HOST)
        costs[impl] = layer_cost(run, ctx)[0]  # one dense layer: forward, backward and recomputation
    excess = CHECKPOINT_HOST_EXCESS["non_reentrant"] - CHECKPOINT_HOST_EXCESS["reentrant"]
    assert costs["non_reentrant"] - costs["reentrant"] == pytest.approx(
        excess * _layer_forward_dispatches(make_run(GPT_SMALL, **kw)), rel=1e-9)


def test_a_checkpoint_without_recomputation_is_refused():
    with pytest.raises(SpecError, match="checkpoint_impl.*recompute is 'none'"):
        make_run(GPT_SMALL, checkpoint_impl="non_reentrant")
    with pytest.raises(SpecError, match="checkpoint_impl"):
        make_run(GPT_SMALL, recompute="full", checkpoint_impl="hooks")


def test_the_key_is_left_out_at_its_default_and_round_trips():
    from learnedperf.measure.records import run_id
    from learnedperf.specs import RunSpec

    plain = make_run(GPT_SMALL, recompute="full")
    assert "checkpoint_impl" not in plain.to_dict()["strategy"]
    hooked = make_run(GPT_SMALL, recompute="full", checkpoint_impl="non_reentrant")
    assert hooked.to_dict()["strategy"]["checkpoint_impl"] == "non_reentrant"
    assert RunSpec.from_dict(json.loads(json.dumps(hooked.to_dict()))) == hooked
    # a run that states the default is the run written before the key existed, and has its id
    stated = plain.to_dict()
    stated["strategy"]["checkpoint_impl"] = "reentrant"
    canonical = RunSpec.from_dict(stated).to_dict()
    assert canonical == plain.to_dict()
    assert run_id(canonical) == run_id(plain.to_dict()) != run_id(hooked.to_dict())


def test_measure_says_its_steps_recompute_without_reentry():
    from learnedperf.measure.steps import StepConfig, run_dict

    from test_measure_steps import HARDWARE, LLAMA

    full = run_dict(StepConfig(LLAMA, 1, {"recompute": "full"}), HARDWARE)["strategy"]
    assert full["checkpoint_impl"] == "non_reentrant"
    assert "checkpoint_impl" not in run_dict(StepConfig(LLAMA, 1, {}), HARDWARE)["strategy"]


def test_the_amendment_marks_recomputing_steps_only():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "amend_records.py"
    spec = importlib.util.spec_from_file_location("amend_records", path)
    amend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(amend)
    runs = [{"strategy": {"recompute": "full"}}, {"strategy": {}}, {"strategy": {"recompute": "none"}},
            {"strategy": {"recompute": "full", "checkpoint_impl": "reentrant"}}]
    for r in runs:
        amend.mark_checkpoint(r)
    assert [r["strategy"].get("checkpoint_impl") for r in runs] == ["non_reentrant", None, None, "reentrant"]


def test_the_cli_flag_and_the_search_give_it_to_recomputing_candidates_only(capsys):
    from learnedperf.cli import build_parser, main
    from learnedperf.predict import enumerate_strategies

    args = build_parser().parse_args(["simulate", "--model", "gpt2-small", "--device", "H100-SXM5-80GB",
                                      "--recompute", "full", "--checkpoint-impl", "non_reentrant"])
    assert args.checkpoint_impl == "non_reentrant"
    assert main(["simulate", "--model", "gpt2-small", "--device", "H100-SXM5-80GB", "--num-devices", "1",
                 "--checkpoint-impl", "non_reentrant"]) != 0
    err = capsys.readouterr().err
    assert "checkpoint_impl" in err and "Traceback" not in err
    run = make_run(GPT_SMALL, num_devices=2)
    _c, cands = enumerate_strategies(run.model, run.hardware, {"global_batch_size": 4, "recompute": ["none", "full"],
                                                                 "fixed": {"checkpoint_impl": "non_reentrant"}})
    assert {(s["recompute"], s.get("checkpoint_impl")) for s in cands} == {("none", None), ("full", "non_reentrant")}
