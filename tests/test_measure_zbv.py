"""ZB-V in the step harness (``pipeline_schedule: "zb-v"``, ``virtual_pipeline_stages: 2``): rank ``r`` of ``p``
holds virtual stages ``r`` and ``2p-1-r`` of the model cut into ``2p``, runs PyTorch's ``ScheduleZBVZeroBubble``
order, and trains exactly like one process; plans that it cannot run are refused by name.

The multi-process checks run on CPU with gloo and tiny models (forked from the harness's fork server).
"""

from __future__ import annotations

import json

import pytest

from learnedperf.errors import InputError
from learnedperf.measure.steps import (StepConfig, chunked_schedule, measure_step, plan_step, run_dict, schedule,
                                       train_losses)
from learnedperf.specs import RunSpec
from test_measure_steps import HARDWARE

#: 8 layers: one per virtual stage of a V over 4 ranks, two over 2. GPT ties the embedding and the head.
GPT8 = {"name": "gpt8-test", "arch": "gpt", "num_layers": 8, "hidden_size": 64, "num_attention_heads": 4,
        "vocab_size": 256, "seq_length": 32}
LLAMA8 = {"name": "llama8-test", "arch": "llama", "num_layers": 8, "hidden_size": 64, "num_attention_heads": 4,
          "num_kv_heads": 2, "vocab_size": 256, "seq_length": 32}

ZBV = {"pipeline_schedule": "zb-v", "virtual_pipeline_stages": 2}

#: SGD with a large step: a missing or doubled gradient (the tied table's two halves) changes the later losses.
SGD = {"optimizer": "sgd"}
LR = 0.5


@pytest.mark.parametrize("model, world, extra, gbs", [
    (GPT8, 2, {"pp": 2}, 4),             # rank 1 hands chunk 0's output to its chunk 1 in place
    (GPT8, 4, {"pp": 4}, 8),             # 8 micro-batches: the V's steady state (2p - 1 = 7)
    (LLAMA8, 4, {"pp": 4}, 4),           # untied head; fewer micro-batches than 2p - 1 (PyTorch's dropped units)
    (GPT8, 4, {"pp": 2, "dp": 2}, 8),    # data-parallel all-reduce over both chunks' gradients
], ids=["gpt-pp2", "gpt-pp4", "llama-pp4-m4", "gpt-pp2-dp2"])
def test_zb_v_pipeline_matches_single_process(model, world, extra, gbs):
    strat = {**SGD, "global_batch_size": gbs}
    plain = train_losses(StepConfig(model, 1, strat, learning_rate=LR), 3)
    zb_v = train_losses(StepConfig(model, world, {**strat, **extra, **ZBV}, learning_rate=LR), 3)
    assert plain[0] != plain[2]  # the optimizer really moved the weights
    assert zb_v == pytest.approx(plain, rel=1e-4, abs=1e-5)


def test_the_loss_is_rank_0s_and_a_tied_table_is_held_once():
    from learnedperf.measure.models import build_model, count_parameters
    from learnedperf.measure.steps import _execute

    ranks = _execute(plan_step(StepConfig(GPT8, 2, {**SGD, "pp": 2, "global_batch_size": 4, **ZBV},
                                          learning_rate=LR)), 1)
    # rank 0 holds the last virtual stage (the head and the loss); rank 1 holds the middle of the V
    assert ranks[0]["losses"] is not None and ranks[1]["losses"] is None
    # the two ranks hold the model's parameters between them, the tied embedding once
    assert sum(r["local_params"] for r in ranks) == count_parameters(build_model(GPT8))


@pytest.mark.parametrize("model", [GPT8, LLAMA8], ids=["gpt-tied", "llama-untied"])
def test_v_chunks_hold_the_one_process_weights(model):
    import torch

    from learnedperf.graph.execution import rank_vstages
    from learnedperf.measure.models import ParallelContext, WeightGradStore, build_chunks, build_model

    plain = dict(build_model(model, seed=3).named_parameters())
    seen = set()
    for rank in range(4):
        store = WeightGradStore()
        chunks = build_chunks(model, ParallelContext(stage=rank, num_stages=4, weight_grads=store),
                              rank_vstages(rank, 4, 2, True), seed=3)
        # virtual stages r and 2p-1-r of 8, one layer each, sharing the rank's one store
        assert [c.ctx.stage for c in chunks] == [rank, 7 - rank]
        assert [c.layer_offset for c in chunks] == [rank, 7 - rank]
        assert all(c.ctx.weight_grads is store for c in chunks)
        for chunk in chunks:
            for name, p in chunk.named_parameters():
                key = chunk.global_name(name)
                if key == "head" and model.get("arch") == "gpt":
                    key = "embed"  # the one-process GPT's head is its embedding
                assert torch.equal(p, plain[key]), (rank, key)
                seen.add(key)
        if rank == 0:
            tied = chunks[1].head is chunks[0].embed
            assert tied == (model["arch"] == "gpt")
            assert len(list(chunks.parameters())) == sum(len(list(c.parameters())) for c in chunks) - tied
    assert seen == set(plain)


def test_zb_v_order_is_the_simulators_with_every_unit_once():
    from learnedperf.graph.execution import schedule_zb_v

    for p in (2, 4):
        for m in (2, 4, 8):
            for rank in range(p):
                order = chunked_schedule("zb-v", rank, p, 2, m)
                assert order == schedule_zb_v(p, m, rank)
                units = [(op, c, i) for op in "FBW" for c in (0, 1) for i in range(m)]
                assert sorted(order) == sorted(units)
                pos = {u: k for k, u in enumerate(order)}
                assert all(pos[("F", c, i)] < pos[("B", c, i)] < pos[("W", c, i)] for c in (0, 1) for i in range(m))
    # the single-chunk orders are as they were; ZB-V's units need their chunk
    assert schedule("zb-h1", 0, 2, 3) == [(op, i) for op, _c, i in chunked_schedule("zb-h1", 0, 2, 1, 3)]
    with pytest.raises(InputError, match=r"^strategy\.pipeline_schedule: 'zb-v' runs two model chunks"):
        schedule("zb-v", 0, 2, 4)


@pytest.mark.parametrize("model, world, strategy, message", [
    (GPT8, 2, {"pp": 2, "pipeline_schedule": "zb-v"},
     r"^strategy\.virtual_pipeline_stages: pipeline_schedule 'zb-v' places two model chunks on each rank in a V: "
     r"expected 2, got 1"),
    (GPT8, 2, {"pp": 2, "pipeline_schedule": "zb-v", "virtual_pipeline_stages": 3},
     r"^strategy\.virtual_pipeline_stages: pipeline_schedule 'zb-v' places two model chunks on each rank in a V: "
     r"expected 2, got 3"),
    (GPT8, 2, {"pp": 2, "virtual_pipeline_stages": 2},
     r"^strategy\.virtual_pipeline_stages: pipeline_schedule '1f1b' runs one model chunk per rank: expected 1, got 2"),
    (GPT8, 1, ZBV, r"^strategy\.pipeline_schedule: 'zb-v' needs pp >= 2"),
    (GPT8, 2, {"pp": 2, "precision": "bf16", **ZBV}, r"^strategy\.pipeline_schedule: 'zb-v' is measured in fp32"),
    ({**GPT8, "num_layers": 6}, 4, {"pp": 4, **ZBV},
     r"^strategy\.pp: pp·virtual_pipeline_stages = 4·2 = 8 exceeds num_layers=6"),
    ({"name": "moe8-test", "arch": "moe", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
      "num_kv_heads": 2, "num_experts": 4, "moe_top_k": 2, "ffn_hidden_size": 64, "vocab_size": 256,
      "seq_length": 32}, 2, {"pp": 2, **ZBV}, r"^strategy\.pipeline_schedule: 'zb-v' is not measured for arch 'moe'"),
], ids=["zb-v-one-chunk", "zb-v-three-chunks", "1f1b-two-chunks", "pp1", "bf16", "too-few-layers", "moe"])
def test_zb_v_plans_it_cannot_run_are_refused_by_name(model, world, strategy, message):
    with pytest.raises(InputError, match=message):
        plan_step(StepConfig(model, world, strategy))


def test_a_zb_v_step_is_measured_and_recorded_as_a_valid_run():
    cfg = StepConfig(GPT8, 2, {"pp": 2, "global_batch_size": 4, **ZBV}, warmup=1, repeats=2)
    rec = measure_step(cfg, HARDWARE)
    assert rec["strategy_kind"] == "pp" and rec["iteration_time_ms"] > 0
    run = json.loads(rec["run"])
    assert run["strategy"]["pipeline_schedule"] == "zb-v" and run["strategy"]["virtual_pipeline_stages"] == 2
    spec = RunSpec.from_dict(run)
    assert (spec.strategy.pp, spec.strategy.virtual_pipeline_stages, spec.num_microbatches) == (2, 2, 4)
    # single-chunk runs say nothing of virtual stages, as their records did before ZB-V
    assert "virtual_pipeline_stages" not in run_dict(StepConfig(GPT8, 2, {"pp": 2}), HARDWARE)["strategy"]
