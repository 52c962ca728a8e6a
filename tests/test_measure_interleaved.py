"""Interleaved pipelines in the step harness (``pipeline_schedule`` ``"interleaved"``, Megatron's interleaved 1F1B, and
``"interleaved-zb"``, PyTorch's ``ScheduleInterleavedZeroBubble``): rank ``r`` of ``p`` holds virtual stages
``r, r+p, ...`` of the model cut into ``p·v``, runs the simulator's order and trains exactly like one process; plans
that it cannot run are refused by name.

The multi-process checks run on CPU with gloo and tiny models (forked from the harness's fork server).
"""

from __future__ import annotations

import pytest

from learnedperf.errors import InputError
from learnedperf.measure.steps import (StepConfig, chunked_schedule, plan_step, run_dict, schedule, step_grid,
                                       train_losses)
from learnedperf.specs import RunSpec
from test_measure_moe import LAYOUT as MOE_LAYOUT
from test_measure_steps import HARDWARE
from test_measure_zbv import GPT8, LLAMA8, LR, SGD


def interleaved(v: int, zero_bubble: bool = False) -> dict:
    """The strategy keys of an interleaved schedule with ``v`` chunks per rank."""
    return {"pipeline_schedule": "interleaved-zb" if zero_bubble else "interleaved", "virtual_pipeline_stages": v}


@pytest.mark.parametrize("model, world, extra, gbs", [
    (GPT8, 2, {"pp": 2, **interleaved(2)}, 4),        # tied: embedding in rank 0's chunk 0, head in rank 1's chunk 1
    (LLAMA8, 2, {"pp": 2, **interleaved(3)}, 4),      # 8 layers over 6 virtual stages: 2-2-1-1-1-1
    (GPT8, 4, {"pp": 4, **interleaved(2)}, 8),        # two groups of pp micro-batches per chunk
    (GPT8, 2, {"pp": 2, **interleaved(2, True)}, 4),  # the W passes of both chunks, one store
    (LLAMA8, 4, {"pp": 2, "dp": 2, **interleaved(2, True)}, 8),  # data-parallel all-reduce over both chunks
], ids=["gpt-pp2-v2", "llama-pp2-v3", "gpt-pp4-v2-m8", "gpt-zb-pp2-v2", "llama-zb-pp2-v2-dp2"])
def test_interleaved_pipeline_matches_single_process(model, world, extra, gbs):
    strat = {**SGD, "global_batch_size": gbs}
    plain = train_losses(StepConfig(model, 1, strat, learning_rate=LR), 3)
    losses = train_losses(StepConfig(model, world, {**strat, **extra}, learning_rate=LR), 3)
    assert plain[0] != plain[2]  # the optimizer really moved the weights
    assert losses == pytest.approx(plain, rel=1e-4, abs=1e-5)


def test_interleaved_moe_chunks_keep_the_expert_capacity():
    # one layer per virtual stage, the MoE layer 2 in rank 0's chunk 1: a capacity that drops tokens must reach it
    strat = {**SGD, "global_batch_size": 2, "moe_capacity_factor": 1.0}
    model = {**MOE_LAYOUT, "name": "moe-layout"}
    plain = train_losses(StepConfig(model, 1, strat, learning_rate=LR), 2)
    dropless = train_losses(StepConfig(model, 1, {**strat, "moe_capacity_factor": None}, learning_rate=LR), 2)
    assert plain != pytest.approx(dropless, rel=1e-4, abs=1e-5)
    losses = train_losses(StepConfig(model, 2, {**strat, "pp": 2, **interleaved(2)}, learning_rate=LR), 2)
    assert losses == pytest.approx(plain, rel=1e-4, abs=1e-5)


def test_the_loss_is_the_last_ranks_and_a_tied_head_is_a_copy():
    from learnedperf.measure.models import build_model, count_parameters
    from learnedperf.measure.steps import _execute

    ranks = _execute(plan_step(StepConfig(GPT8, 2, {**SGD, "pp": 2, "global_batch_size": 4, **interleaved(2)},
                                          learning_rate=LR)), 1)
    # rank p-1 holds the last virtual stage (the head and the loss)
    assert ranks[0]["losses"] is None and ranks[1]["losses"] is not None
    # the embedding (rank 0) and the head (rank 1) are two tables, as in a 1F1B pipeline
    vocab, hidden = GPT8["vocab_size"], GPT8["hidden_size"]
    assert sum(r["local_params"] for r in ranks) == count_parameters(build_model(GPT8)) + vocab * hidden


@pytest.mark.parametrize("model", [GPT8, LLAMA8], ids=["gpt-tied", "llama-untied"])
def test_interleaved_chunks_hold_the_one_process_weights(model):
    import torch

    from learnedperf.graph.execution import rank_vstages
    from learnedperf.measure.models import ParallelContext, WeightGradStore, build_chunks, build_model

    plain = dict(build_model(model, seed=3).named_parameters())
    seen = set()
    p, v = 2, 4  # 8 virtual stages, one layer each
    for rank in range(p):
        store = WeightGradStore()
        chunks = build_chunks(model, ParallelContext(stage=rank, num_stages=p, weight_grads=store),
                              rank_vstages(rank, p, v, False), seed=3)
        assert [c.ctx.stage for c in chunks] == [c.layer_offset for c in chunks] == [rank + p * c for c in range(v)]
        assert all(c.ctx.num_stages == p * v and c.ctx.weight_grads is store for c in chunks)
        for chunk in chunks:
            for name, param in chunk.named_parameters():
                key = chunk.global_name(name)
                if key == "head" and model["arch"] == "gpt":
                    key = "embed"  # the one-process GPT's head is its embedding
                assert torch.equal(param, plain[key]), (rank, key)
                seen.add(key)
        # the tables whose gradients the harness all-reduces between ranks 0 and p-1: the embedding in chunk 0 of
        # rank 0, the head copy in chunk v-1 of rank p-1 (GPT ties them; Llama's head is its own)
        tied = [c.tied_parameter() for c in chunks]
        held = 0 if rank == 0 else v - 1
        assert [t is None for t in tied] == [c != held or model["arch"] != "gpt" for c in range(v)]
        if model["arch"] == "gpt":
            assert tied[held] is (chunks[0].embed if rank == 0 else chunks[-1].head)
    assert seen == set(plain)


def test_interleaved_orders_are_the_simulators_with_every_unit_once():
    from learnedperf.graph.execution import pipeline_order

    for kind in ("interleaved", "interleaved-zb"):
        ops = "FBW" if kind == "interleaved-zb" else "FB"
        for p, v, m in ((2, 2, 4), (2, 3, 2), (4, 2, 8)):
            for rank in range(p):
                order = chunked_schedule(kind, rank, p, v, m)
                assert order == pipeline_order(kind, p, v, m, rank)
                assert sorted(order) == sorted((op, c, i) for op in ops for c in range(v) for i in range(m))
                pos = {u: k for k, u in enumerate(order)}
                assert all(pos[("F", c, i)] < pos[("B", c, i)] for c in range(v) for i in range(m))
                if kind == "interleaved-zb":
                    assert all(pos[("B", c, i)] < pos[("W", c, i)] for c in range(v) for i in range(m))
        with pytest.raises(InputError, match=rf"^strategy\.pipeline_schedule: '{kind}' runs several model chunks"):
            schedule(kind, 0, 2, 4)
        with pytest.raises(InputError, match=r"^strategy\.virtual_pipeline_stages: .* expected an integer >= 2, got 1"):
            chunked_schedule(kind, 0, 2, 1, 4)


@pytest.mark.parametrize("model, world, strategy, message", [
    (GPT8, 2, {"pp": 2, "pipeline_schedule": "interleaved"},
     r"^strategy\.virtual_pipeline_stages: pipeline_schedule 'interleaved' places v >= 2 model chunks on each rank "
     r"\(virtual stages r, r\+p, \.\.\.\): expected an integer >= 2, got 1"),
    (GPT8, 2, {"pp": 2, "global_batch_size": 3, **interleaved(2)},
     r"^strategy\.global_batch_size: pipeline_schedule 'interleaved' needs the number of micro-batches, "
     r"global_batch_size / \(micro_batch_size·dp\) = 3 / \(1·1\) = 3, to be a multiple of pp=2"),
    (GPT8, 4, {"pp": 2, "dp": 2, "global_batch_size": 2, **interleaved(2, True)},
     r"^strategy\.global_batch_size: pipeline_schedule 'interleaved-zb' needs the number of micro-batches, .* = 1, "
     r"to be a multiple of pp=2"),
    (GPT8, 2, {"pp": 2, "global_batch_size": 4, "precision": "bf16", **interleaved(2, True)},
     r"^strategy\.pipeline_schedule: 'interleaved-zb' is measured in fp32, not 'bf16'"),
    (GPT8, 1, interleaved(2), r"^strategy\.pipeline_schedule: 'interleaved' needs pp >= 2"),
    (GPT8, 4, {"pp": 4, "global_batch_size": 4, **interleaved(3)},
     r"^strategy\.pp: pp·virtual_pipeline_stages = 4·3 = 12 exceeds num_layers=8"),
    ({**MOE_LAYOUT, "name": "moe-layout"}, 2, {"pp": 2, "global_batch_size": 2, **interleaved(2, True)},
     r"^strategy\.pipeline_schedule: 'interleaved-zb' is not measured for arch 'moe'"),
], ids=["v1", "m-not-multiple-of-pp", "zb-m-with-dp", "zb-bf16", "pp1", "too-few-layers", "zb-moe"])
def test_interleaved_plans_it_cannot_run_are_refused_by_name(model, world, strategy, message):
    with pytest.raises(InputError, match=message):
        plan_step(StepConfig(model, world, strategy))


@pytest.mark.parametrize("zero_bubble, v", [(False, 2), (True, 3)], ids=["interleaved-v2", "interleaved-zb-v3"])
def test_an_interleaved_run_dict_is_a_valid_run_of_the_same_schedule(zero_bubble, v):
    strategy = {"pp": 2, "global_batch_size": 4, **interleaved(v, zero_bubble)}
    run = run_dict(StepConfig(GPT8, 2, strategy), HARDWARE)
    assert run["strategy"]["pipeline_schedule"] == strategy["pipeline_schedule"]
    assert run["strategy"]["virtual_pipeline_stages"] == v
    spec = RunSpec.from_dict(run)
    assert (spec.strategy.pipeline_schedule, spec.strategy.pp, spec.strategy.virtual_pipeline_stages,
            spec.num_microbatches) == (strategy["pipeline_schedule"], 2, v, 4)


def test_the_grid_measures_each_interleaved_step_and_its_zero_bubble_twin():
    plans = [plan_step(c) for c in step_grid()]
    chunked = {kind: sorted((p.model["name"], p.pp, p.strategy["virtual_pipeline_stages"], p.num_microbatches)
                            for p in plans if p.strategy["pipeline_schedule"] == kind)
               for kind in ("interleaved", "interleaved-zb")}
    assert chunked["interleaved"] == chunked["interleaved-zb"]
    assert {(pp, v) for _name, pp, v, _m in chunked["interleaved"]} == {(2, 2), (2, 3), (4, 2)}
    for p in plans:
        if p.strategy["pipeline_schedule"] in ("interleaved", "interleaved-zb"):
            # fp32 (the zero-bubble W passes are), one layer per virtual stage, whole groups of pp micro-batches
            assert p.strategy["precision"] == "fp32" and p.num_microbatches % p.pp == 0
            assert p.model["num_layers"] == p.pp * p.strategy["virtual_pipeline_stages"]


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2)])
def test_layers_that_do_not_divide_are_cut_as_the_simulator_cuts_them(schedule, v):
    # 6 layers on 4 ranks: the simulator gives the middle ranks the spare layers (1, 2, 2, 1; Llama 3 405B's
    # layout), where an even cut from the first stage would give 2, 2, 1, 1; interleaved, 10 layers over 4·2
    # virtual stages go 1, 1, 2, 1, 1, 2, 1, 1 (ranks of 2, 3, 3, 2), not 2, 2, 1, 1, 1, 1, 1, 1 (ranks of 3, 3, 2,
    # 2); each rank holds exactly the simulator's layers
    from learnedperf.graph.execution import layers_per_vstage, rank_vstages
    from learnedperf.measure.models import ParallelContext, build_chunks, build_model, count_parameters
    from learnedperf.measure.steps import _execute

    pp, layers = 4, (6 if v == 1 else 10)
    model = {**GPT8, "num_layers": layers}
    counts = tuple(layers_per_vstage(layers, pp, v))
    assert counts == ((1, 2, 2, 1) if v == 1 else (1, 1, 2, 1, 1, 2, 1, 1))
    strategy = {**SGD, "pp": pp, "global_batch_size": 2 * pp, "pipeline_schedule": schedule,
                "virtual_pipeline_stages": v}
    ranks = _execute(plan_step(StepConfig(model, pp, strategy, learning_rate=LR)), 1)
    for r, got in enumerate(ranks):
        ctx = ParallelContext(stage=r, num_stages=pp, layer_counts=counts)
        net = build_model(model, ctx) if v == 1 else build_chunks(model, ctx, rank_vstages(r, pp, v, False))
        assert got["local_params"] == count_parameters(net), r
