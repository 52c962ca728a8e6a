"""Interleaved zero bubble (``pipeline_schedule: "interleaved-zb"``): Megatron's placement of v chunks per rank, the
backward split into B and W.

Expected values have independent sources:

* the order of each rank's units is PyTorch's ``ScheduleInterleavedZeroBubble`` (``torch.distributed.pipelining``,
  torchtitan's ``InterleavedZeroBubble``), computed by torch itself; with one chunk per rank it is ZB-H1, whose
  order this package takes from the paper (Qi et al., ICLR 2024, section 3.1);
* with every chunk's passes equally long (``F``, ``B >= W``) and free communication the step takes the work of a
  rank, ``v·m(F+B+W)``, plus ZB-H1's bubble ``(p-1)(F+B-W)`` (the paper's Table 1) on a chunk's passes, as
  interleaving divides 1F1B's bubble ``(p-1)(F+B+W)`` by the chunks (Narayanan et al., SC21, section 2.2);
* rank ``r`` runs ``(v-1)p + p-r`` chunk forwards before its first ``B``: rank 0 holds ``v·p`` chunk units, the
  ``p`` whole-stage micro-batches of 1F1B's first stage, fewer than interleaving's ``(v-1)p + 2p-1``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conftest import GPT_SMALL, make_run
from learnedperf.errors import SpecError
from learnedperf.graph.execution import compile_run, schedule_interleaved_zb, schedule_zb_h1
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import in_flight_microbatches, peak_in_flight, peak_memory
from test_zero_bubble import UnitCost


def _izb(p: int, v: int, m: int, schedule: str = "interleaved-zb", **strategy):
    """GPT_SMALL with one layer per chunk on ``p`` devices, ``v`` chunks per rank."""
    return make_run(dict(GPT_SMALL, num_layers=v * p), num_devices=p, pp=p, micro_batch_size=1, global_batch_size=m,
                    pipeline_schedule=schedule, virtual_pipeline_stages=v, **strategy)


# ------------------------------------------------------------------ the order
def test_order_is_pytorchs_interleaved_zero_bubble():
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    kinds = {"F": "F", "I": "B", "W": "W"}
    checked = 0
    for p in range(2, 7):
        for v in range(2, 5):
            for m in range(p, 4 * p + 1, p):
                # PyTorch's rounds hold p micro-batches each when m is a multiple of p
                state = SimpleNamespace(pp_group_size=p, n_local_stages=v, _n_microbatches=m, microbatches_per_round=p)
                for r in range(p):
                    actions = [a for a in ScheduleInterleavedZeroBubble._calculate_single_rank_operations(state, r)
                               if a is not None]
                    assert all(a.stage_index % p == r for a in actions)  # Megatron's placement
                    theirs = [(kinds[a.computation_type.value], a.stage_index // p, a.microbatch_index)
                              for a in actions]
                    assert schedule_interleaved_zb(p, v, m, r) == theirs, (p, v, m, r)
                    checked += 1
    assert checked == 3 * sum(4 * p for p in range(2, 7))


@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (4, 3), (4, 16), (6, 11)])
def test_one_chunk_is_zb_h1(p, m):
    for r in range(p):
        assert schedule_interleaved_zb(p, 1, m, r) == schedule_zb_h1(p, m, r)


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 3, 6), (4, 2, 4), (4, 4, 12), (6, 3, 12)])
def test_every_pass_runs_once_after_the_one_it_needs(p, v, m):
    for r in range(p):
        order = schedule_interleaved_zb(p, v, m, r)
        assert len(order) == len(set(order)) == 3 * v * m
        pos = {u: i for i, u in enumerate(order)}
        for c in range(v):
            for i in range(m):
                assert pos[("F", c, i)] < pos[("B", c, i)] < pos[("W", c, i)]


# ------------------------------------------------------------------ time
@pytest.mark.parametrize("p,v,m,f,b,w", [(2, 2, 2, 1.0, 1.0, 1.0), (4, 2, 8, 1.0, 1.0, 0.5),
                                         (4, 3, 16, 1.0, 2.0, 1.0), (8, 2, 16, 2.0, 2.0, 1.0),
                                         (8, 4, 32, 1.0, 1.5, 0.7), (3, 2, 21, 1.0, 1.0, 1.0)])
@pytest.mark.parametrize("exact", [True, False])
def test_equal_chunks_leave_zb_h1s_bubble_of_a_chunk(p, v, m, f, b, w, exact):
    got = simulate(_izb(p, v, m), cost=UnitCost(f, b, w), exact=exact)
    assert got.iteration_time_s == pytest.approx(v * m * (f + b + w) + (p - 1) * (f + b - w), rel=1e-9)
    bd = got.breakdown_s
    assert bd["forward"] == pytest.approx(v * m * f) and bd["backward"] == pytest.approx(v * m * (b + w))
    assert bd["forward"] + bd["backward"] + bd["pipeline_bubble"] == pytest.approx(got.iteration_time_s)
    inter = simulate(_izb(p, v, m, "interleaved"), cost=UnitCost(f, b, w), exact=exact).iteration_time_s
    assert inter == pytest.approx(v * m * (f + b + w) + (p - 1) * (f + b + w), rel=1e-9)


def test_fast_tier_closed_form_on_equal_chunks():
    from learnedperf.features.run import RunContext, analytic_time

    p, v, m, f, w = 4, 2, 16, 1.0, 0.5
    run = _izb(p, v, m, optimizer="sgd")
    ctx = RunContext(run.model, run.hardware)
    ctx.cost = UnitCost(f, f, w)
    at = analytic_time(run, ctx)
    total = (at.compute_s + at.layer_comm_s + at.pp_comm_s) * (1.0 + at.bubble_fraction)
    assert total == pytest.approx(v * m * (2 * f + w) + (p - 1) * (2 * f - w), rel=1e-9)


# ------------------------------------------------------------------ memory
@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 3, 8), (4, 2, 4), (4, 3, 8), (4, 2, 16), (8, 2, 8), (8, 4, 40)])
def test_closed_form_in_flight_equals_the_order(p, v, m):
    run = _izb(p, v, m)
    for r in range(p):
        assert peak_in_flight(run, r) == in_flight_microbatches(schedule_interleaved_zb(p, v, m, r))
    assert peak_in_flight(run, 0) == v * p  # p whole-stage micro-batches


def test_activations_are_1f1bs_first_stage_and_fewer_than_interleavings():
    p, v, m = 4, 2, 16
    # a small vocabulary: the first rank, not the LM head's logits on the last, sets the peak
    model = dict(GPT_SMALL, num_layers=v * p * 2, vocab_size=512)

    def activations(schedule, chunks):
        run = make_run(model, num_devices=p, pp=p, micro_batch_size=1, global_batch_size=m,
                       pipeline_schedule=schedule, virtual_pipeline_stages=chunks)
        return peak_memory(compile_run(run)).activations

    izb = activations("interleaved-zb", v)
    assert izb == pytest.approx(activations("1f1b", 1), rel=1e-12)
    # Korthikanti et al. (MLSys 2023) section 4.2.3: interleaving holds 1 + (p-1)/(p·v) times 1F1B's first stage
    assert activations("interleaved", v) == pytest.approx(izb * (1 + (p - 1) / (p * v)), rel=1e-12)


# ------------------------------------------------------------------ validation and front ends
@pytest.mark.parametrize("strategy, field", [
    ({"virtual_pipeline_stages": 1}, "virtual_pipeline_stages"),
    ({"virtual_pipeline_stages": 2, "fsdp": True}, "pipeline_schedule"),
    ({"virtual_pipeline_stages": 2, "zero_stage": 3}, "pipeline_schedule"),
    ({"virtual_pipeline_stages": 2, "forward_only": True, "optimizer": "none"}, "pipeline_schedule"),
])
def test_refused_where_not_modelled(strategy, field):
    with pytest.raises(SpecError) as err:
        make_run(dict(GPT_SMALL, num_layers=8), num_devices=4, pp=4, micro_batch_size=1, global_batch_size=8,
                 pipeline_schedule="interleaved-zb", **strategy)
    assert f"strategy.{field}" in str(err.value)


def test_needs_a_pipeline_whole_rounds_and_a_layer_per_chunk():
    with pytest.raises(SpecError, match="strategy.pipeline_schedule"):
        make_run(GPT_SMALL, num_devices=2, pp=1, pipeline_schedule="interleaved-zb", virtual_pipeline_stages=2)
    with pytest.raises(SpecError, match="strategy.global_batch_size") as err:
        _izb(4, 2, 6)
    assert "'interleaved-zb' schedule needs the number of micro-batches (6) to be a multiple of pp=4" in str(err.value)
    with pytest.raises(SpecError, match="strategy.pp"):
        make_run(dict(GPT_SMALL, num_layers=6), num_devices=4, pp=4, global_batch_size=8,
                 pipeline_schedule="interleaved-zb", virtual_pipeline_stages=2)


def test_cli_simulates_an_interleaved_zb_run(capsys):
    from learnedperf.cli import main

    flags = ["simulate", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--num-devices", "8", "--pp", "4",
             "--global-batch-size", "16", "--schedule", "interleaved-zb"]
    assert main([*flags, "--virtual-stages", "3"]) == 0
    assert "interleaved-zb" in capsys.readouterr().out
    assert main(flags) == 1  # one chunk per rank: one line naming the field
    err = capsys.readouterr().err
    assert "strategy.virtual_pipeline_stages" in err and len(err.strip().splitlines()) == 1


def test_search_gives_interleaved_zb_candidates_the_virtual_stages():
    from learnedperf.predict import enumerate_strategies
    from learnedperf.specs import RunSpec
    from learnedperf.specs.run import SpecCache

    cache = SpecCache()
    model, hw = cache.model("gpt3-1.3b"), cache.hardware({"cluster": "dgx-a100", "num_devices": 8})
    cons = {"global_batch_size": 16, "micro_batch_size": [1], "recompute": ["none"], "zero_stages": [0],
            "sequence_parallel": [False], "cp": [1], "pp": [1, 2, 4], "schedules": ["1f1b", "interleaved-zb"],
            "virtual_stages": [2, 3]}
    _c, cands = enumerate_strategies(model, hw, cons)
    got = {(s["pp"], s["pipeline_schedule"], s["virtual_pipeline_stages"]) for s in cands if s["pp"] > 1}
    assert {(pp, "interleaved-zb", v) for pp in (2, 4) for v in (2, 3)} <= got
    assert {sch for _, sch, _ in got} == {"1f1b", "interleaved-zb"}
    for s in cands:
        run = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8}, "strategy": s}
        RunSpec.from_dict(json.loads(json.dumps(run)))


def test_counts_as_interleaving_in_the_held_out_strategy_splits():
    # the placement is interleaving's: training on interleaved-zb runs would leak the held-out strategy
    import pandas as pd

    from learnedperf.data.records import strategy_signature
    from learnedperf.data.splits import split_mask
    from learnedperf.models.evaluate import EVAL_SPLITS

    assert strategy_signature(1, 4, 2, 1, 1, 0, "interleaved-zb") == "pp+interleaved-zb+dp"
    df = pd.DataFrame({"pipeline_schedule": ["interleaved-zb", "interleaved", "zb-v", "1f1b"], "pp": [4] * 4,
                       "tp": [1] * 4})
    assert split_mask(df, "unseen_strategy").tolist() == [True, True, False, False]
    assert EVAL_SPLITS["unseen_strategy"][1](df).tolist() == [True, True, False, False]
