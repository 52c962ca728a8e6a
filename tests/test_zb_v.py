"""ZB-V (``pipeline_schedule: "zb-v"``): two model chunks per rank in a V, the backward split into B and W.

Expected values have independent sources:

* the order of each rank's units is PyTorch's ``ScheduleZBVZeroBubble`` (``torch.distributed.pipelining``, the
  schedule torchtitan runs as ``ZBVZeroBubble``), computed by torch itself;
* with every chunk's forward, input-gradient and weight-gradient passes equally long (``F = B >= W``) and free
  communication, the last rank cannot start before ``(p-1)F`` and then has ``2m(F+B+W)`` of work; PyTorch's
  docstring says the order leaves no bubble in that case, so the step takes exactly their sum;
* the activations in flight: rank ``r`` runs ``2p-r-1`` chunk-0 forwards and ``r+1`` chunk-1 forwards before its
  first ``B``: ``2p`` chunk units, the ``p`` whole-stage micro-batches of 1F1B's first stage (the paper's claim
  that ZB-V keeps 1F1B's activation memory);
* the V places virtual stages ``r`` and ``2p-1-r`` on rank ``r``: the embedding and the LM head share rank 0 (one
  tied table, no all-reduce between ranks), and the turn on rank ``p-1`` hands activations over in place.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conftest import GPT_SMALL, make_run
from learnedperf.errors import SpecError
from learnedperf.graph.execution import chunk_layout, compile_run, rank_vstages, schedule_zb_v, stage_of, stage_loads
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import in_flight_microbatches, peak_in_flight, peak_memory
from test_zero_bubble import UnitCost


def _zbv(p: int, m: int, layers: int | None = None, **strategy):
    """GPT_SMALL with one layer per chunk (two per rank) on ``p`` devices under ZB-V."""
    model = dict(GPT_SMALL, num_layers=layers or 2 * p)
    return make_run(model, num_devices=p, pp=p, micro_batch_size=1, global_batch_size=m,
                    pipeline_schedule="zb-v", virtual_pipeline_stages=2, **strategy)


# ------------------------------------------------------------------ the order
def test_order_is_pytorchs_zbv_schedule():
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    kinds = {"F": "F", "I": "B", "W": "W"}
    checked = 0
    for p in range(2, 7):
        for m in range(1, 3 * p + 2):
            rank_state = SimpleNamespace(pp_group_size=p, num_stages=2 * p, _n_microbatches=m)
            for r in range(p):
                theirs = [(kinds[a.computation_type.value], 0 if a.stage_index == r else 1, a.microbatch_index)
                          for a in ScheduleZBVZeroBubble._calculate_single_rank_operations(rank_state, r)
                          if a is not None]
                assert schedule_zb_v(p, m, r) == theirs, (p, m, r)
                checked += 1
    assert checked == sum(p * (3 * p + 1) for p in range(2, 7))


@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (4, 3), (4, 7), (4, 16), (6, 11)])
def test_every_pass_runs_once_after_the_one_it_needs(p, m):
    for r in range(p):
        order = schedule_zb_v(p, m, r)
        assert len(order) == len(set(order)) == 6 * m
        pos = {u: i for i, u in enumerate(order)}
        for c in (0, 1):
            for i in range(m):
                assert pos[("F", c, i)] < pos[("B", c, i)] < pos[("W", c, i)]


def test_placement_is_a_v():
    p = 4
    assert [rank_vstages(r, p, 2, True) for r in range(p)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [stage_of(vs, p, True) for vs in range(2 * p)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [stage_of(vs, p, False) for vs in range(2 * p)] == [0, 1, 2, 3, 0, 1, 2, 3]  # interleaving
    eg = compile_run(_zbv(p, 8))
    assert [[c.vstage for c in st.chunks] for st in eg.stages] == [[0, 7], [1, 6], [2, 5], [3, 4]]


# ------------------------------------------------------------------ time
@pytest.mark.parametrize("p,m,f,b,w", [(2, 3, 1.0, 1.0, 1.0), (4, 7, 1.0, 1.0, 1.0), (4, 12, 1.0, 1.0, 1.0),
                                       (8, 16, 1.0, 1.0, 0.5), (8, 40, 1.0, 1.0, 1.0), (3, 20, 2.0, 2.0, 1.0)])
@pytest.mark.parametrize("exact", [True, False])
def test_equal_chunks_leave_only_the_last_ranks_start(p, m, f, b, w, exact):
    got = simulate(_zbv(p, m), cost=UnitCost(f, b, w), exact=exact)
    assert got.iteration_time_s == pytest.approx(2 * m * (f + b + w) + (p - 1) * f, rel=1e-9)
    bd = got.breakdown_s
    assert bd["forward"] == pytest.approx(2 * m * f) and bd["backward"] == pytest.approx(2 * m * (b + w))
    assert bd["forward"] + bd["backward"] + bd["pipeline_bubble"] == pytest.approx(got.iteration_time_s)


def test_faster_than_interleaving_and_zb_h1_on_equal_chunks():
    # the same layers, devices and micro-batches: interleaving (two chunks per rank) idles (p-1)(F+B+W) of a
    # chunk and ZB-H1 (one chunk of two layers per rank) (p-1)(F+B-W) of a whole stage
    p, m, cost = 4, 12, UnitCost(1.0, 1.0, 1.0)
    times = {}
    for sched, v in (("zb-v", 2), ("interleaved", 2), ("zb-h1", 1)):
        run = make_run(dict(GPT_SMALL, num_layers=2 * p), num_devices=p, pp=p, micro_batch_size=1,
                       global_batch_size=m, pipeline_schedule=sched, virtual_pipeline_stages=v)
        times[sched] = simulate(run, cost=cost).iteration_time_s
    assert times == pytest.approx({"zb-v": 6 * m + (p - 1), "interleaved": 6 * m + 3 * (p - 1),
                                   "zb-h1": 6 * m + 2 * (p - 1)})


def test_fast_tier_closed_form_on_equal_chunks():
    from learnedperf.features.run import RunContext, analytic_time

    p, m, f = 4, 16, 1.0
    run = _zbv(p, m, optimizer="sgd")
    ctx = RunContext(run.model, run.hardware)
    ctx.cost = UnitCost(f, f, f)
    at = analytic_time(run, ctx)
    total = (at.compute_s + at.layer_comm_s + at.pp_comm_s) * (1.0 + at.bubble_fraction)
    assert total == pytest.approx(2 * m * 3 * f + (p - 1) * f, rel=1e-9)


def test_the_turn_of_the_v_sends_nothing():
    # with p2p on its own stream every send is an event: each micro-batch crosses 2p-2 ranks' boundaries forward
    # and as many backward, against interleaving's 2p-1 (its chunk 0 to chunk 1 hop crosses back to rank 0)
    p, m = 4, 8

    def sends(sched):
        run = make_run(dict(GPT_SMALL, num_layers=2 * p), num_devices=p, pp=p, micro_batch_size=1,
                       global_batch_size=m, pipeline_schedule=sched, virtual_pipeline_stages=2, overlap_p2p=True)
        return sum(1 for e in simulate(run, trace=True).trace if str(e.get("name", "")).startswith("send "))

    assert sends("zb-v") == 2 * m * (2 * p - 2)
    assert sends("interleaved") == 2 * m * (2 * p - 1)


# ------------------------------------------------------------------ memory
@pytest.mark.parametrize("p,m", [(2, 1), (2, 9), (4, 2), (4, 5), (4, 16), (8, 3), (8, 40)])
def test_closed_form_in_flight_equals_the_order(p, m):
    run = _zbv(p, m)
    for r in range(p):
        assert peak_in_flight(run, r) == in_flight_microbatches(schedule_zb_v(p, m, r))
        if m >= 2 * p - 1:
            assert peak_in_flight(run, r) == 2 * p  # p whole-stage micro-batches


def test_activations_are_1f1bs_first_stage():
    p, m = 4, 16
    model = dict(GPT_SMALL, num_layers=4 * p)
    zbv = make_run(model, num_devices=p, pp=p, micro_batch_size=1, global_batch_size=m, pipeline_schedule="zb-v",
                   virtual_pipeline_stages=2)
    ref = make_run(model, num_devices=p, pp=p, micro_batch_size=1, global_batch_size=m, pipeline_schedule="1f1b")
    assert peak_memory(compile_run(zbv)).activations == pytest.approx(peak_memory(compile_run(ref)).activations,
                                                                      rel=1e-12)


def test_one_tied_table_on_rank_zero():
    # GPT_SMALL ties its embedding: interleaving keeps a copy on the last virtual stage's rank and all-reduces
    # their gradients; the V has both ends on rank 0, one table and no all-reduce
    p = 4
    model = dict(GPT_SMALL, num_layers=2 * p)
    table = model["vocab_size"] * model["hidden_size"]
    zbv = _zbv(p, 8)
    inter = make_run(model, num_devices=p, pp=p, micro_batch_size=1, global_batch_size=8,
                     pipeline_schedule="interleaved", virtual_pipeline_stages=2)
    assert zbv.model.tie_embeddings
    assert compile_run(zbv).tied_embedding_bytes == 0 and compile_run(inter).tied_embedding_bytes > 0
    last_zbv, last_inter = chunk_layout(zbv)[-1], chunk_layout(inter)[-1]
    assert last_inter.root_params - last_zbv.root_params == table
    loads = stage_loads(chunk_layout(zbv), p, v_shape=True)
    assert loads[0].last and not any(ld.last for ld in loads[1:])
    # the head's weight gradient is added to the table's on rank 0, as on one device
    names = [op.name for ops, _ in compile_run(zbv).stages[0].chunks[0].backward for op in ops]
    assert "embedding.tied_grad_add" in names


# ------------------------------------------------------------------ validation and front ends
@pytest.mark.parametrize("strategy, field", [
    ({"virtual_pipeline_stages": 1}, "virtual_pipeline_stages"),
    ({"virtual_pipeline_stages": 4}, "virtual_pipeline_stages"),
    ({"virtual_pipeline_stages": 2, "fsdp": True}, "pipeline_schedule"),
    ({"virtual_pipeline_stages": 2, "forward_only": True, "optimizer": "none"}, "pipeline_schedule"),
])
def test_refused_where_not_modelled(strategy, field):
    with pytest.raises(SpecError) as err:
        make_run(dict(GPT_SMALL, num_layers=8), num_devices=4, pp=4, micro_batch_size=1, global_batch_size=8,
                 pipeline_schedule="zb-v", **strategy)
    assert f"strategy.{field}" in str(err.value)


def test_needs_a_pipeline_and_two_layers_per_rank():
    with pytest.raises(SpecError, match="strategy.pipeline_schedule"):
        make_run(GPT_SMALL, num_devices=2, pp=1, pipeline_schedule="zb-v", virtual_pipeline_stages=2)
    with pytest.raises(SpecError, match="strategy.pp"):
        make_run(dict(GPT_SMALL, num_layers=6), num_devices=4, pp=4, global_batch_size=8, pipeline_schedule="zb-v",
                 virtual_pipeline_stages=2)
    # any number of micro-batches (interleaving needs a multiple of pp)
    assert _zbv(4, 7).num_microbatches == 7


def test_cli_simulates_a_zb_v_run(capsys):
    from learnedperf.cli import _SCHEDULES, main
    from learnedperf.specs.strategy import PIPELINE_SCHEDULES

    assert _SCHEDULES == PIPELINE_SCHEDULES  # the flag's choices are the run format's
    flags = ["simulate", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--num-devices", "8", "--pp", "4",
             "--schedule", "zb-v"]
    assert main([*flags, "--virtual-stages", "2"]) == 0
    assert "zb-v" in capsys.readouterr().out
    assert main(flags) == 1  # without two chunks per rank: one line naming the field
    err = capsys.readouterr().err
    assert "strategy.virtual_pipeline_stages" in err and len(err.strip().splitlines()) == 1


def test_search_gives_zb_v_candidates_two_chunks():
    from learnedperf.predict import enumerate_strategies
    from learnedperf.specs import RunSpec
    from learnedperf.specs.run import SpecCache

    cache = SpecCache()
    model, hw = cache.model("gpt3-1.3b"), cache.hardware({"cluster": "dgx-a100", "num_devices": 8})
    cons = {"global_batch_size": 16, "micro_batch_size": [1], "recompute": ["none"], "zero_stages": [0],
            "sequence_parallel": [False], "cp": [1], "pp": [1, 2, 4], "schedules": ["zb-v"]}
    _c, cands = enumerate_strategies(model, hw, cons)
    piped = [s for s in cands if s["pp"] > 1]
    assert piped and all((s["pipeline_schedule"], s["virtual_pipeline_stages"]) == ("zb-v", 2) for s in piped)
    for s in piped:
        run = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8}, "strategy": s}
        assert RunSpec.from_dict(json.loads(json.dumps(run))).strategy.v_shape


@pytest.mark.parametrize("text", ["ZB-V", "ZBV", "ZBVZeroBubble", "zb-v, vpp=2", "ZB-V (2 chunks)"])
def test_published_zb_v_rows_are_zb_v(tmp_path, text):
    from learnedperf.measure.published import load_published
    from test_zero_bubble_frontends import _table

    got = load_published(_table(tmp_path, vpp_or_schedule=text))
    assert not got.skipped, got.skipped
    (m,) = got.runs
    s = m.run["strategy"]
    assert (s["pipeline_schedule"], s["virtual_pipeline_stages"]) == ("zb-v", 2)


def test_published_zb_v_with_another_depth_is_skipped(tmp_path):
    from learnedperf.measure.published import load_published
    from test_zero_bubble_frontends import _table

    got = load_published(_table(tmp_path, vpp_or_schedule="ZB-V, vpp=4"))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert "ZB-V places two model chunks on each rank" in reason and "4 virtual stages" in reason


def test_execution_graph_for_the_gnn_hands_over_in_place():
    # the coarsened graph links virtual stages through p2p nodes only where they change rank: four pipeline
    # edges per crossing (activations out and in, gradients out and in)
    from learnedperf.cost import RooflineCost
    from learnedperf.data.graphs import _PIPE, build_graph

    p = 2
    for sched, crossings in (("zb-v", 2 * p - 2), ("interleaved", 2 * p - 1)):
        run = make_run(dict(GPT_SMALL, num_layers=2 * p), num_devices=p, pp=p, micro_batch_size=1,
                       global_batch_size=4, pipeline_schedule=sched, virtual_pipeline_stages=2)
        g = build_graph(compile_run(run), RooflineCost(run.hardware))
        assert sum(1 for t in g.etype if t == _PIPE) == 4 * crossings, sched


@pytest.mark.parametrize("layers, p, per_rank", [(6, 2, [3, 3]), (10, 4, [2, 2, 3, 3]), (8, 4, [2, 2, 2, 2])])
def test_spare_layers_go_to_the_ranks_without_the_ends(layers, p, per_rank):
    # rank 0 holds the embedding and the LM head; a rank's chunks are its V pair (interleaving's placement put
    # 2 and 4 layers on the ranks of a 6-layer model at pp 2)
    run = _zbv(p, 2 * p, layers=layers)
    layout = chunk_layout(run)
    assert [sum(layout[vs].num_layers for vs in rank_vstages(r, p, 2, True)) for r in range(p)] == per_rank
    assert sum(c.num_layers for c in layout) == layers
