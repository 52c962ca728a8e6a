"""Per-layer sharded data parallelism (ZeRO-3 and PyTorch FSDP, FULL_SHARD and SHARD_GRAD_OP): the spec,
the simulator against the closed form of its serial case, prefetch, grouping of deep chunks, the
measured steps' records and the amendment of the committed data set."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import GPT_SMALL, KNOWN_PARAMS, make_run, roofline
from learnedperf.errors import InputError, SpecError
from learnedperf.graph.execution import MAX_SHARDED_UNITS, compile_run, fsdp_copy_ops
from learnedperf.graph.ops import comm
from learnedperf.measure.steps import StepConfig, plan_step, run_dict
from learnedperf.simulate import simulate
from learnedperf.specs import RunSpec

CPU_DATA = Path(__file__).resolve().parents[1] / "datasets" / "measured" / "vm-xeon-2c"


def test_fsdp_modes_in_the_spec():
    base = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8}}
    s = RunSpec.from_dict({**base, "strategy": {"fsdp": True}}).strategy
    assert (s.effective_zero_stage, s.per_layer_sharding) == (3, True)
    s = RunSpec.from_dict({**base, "strategy": {"fsdp": True, "zero_stage": 2}}).strategy
    assert (s.effective_zero_stage, s.per_layer_sharding) == (2, True)  # SHARD_GRAD_OP
    s = RunSpec.from_dict({**base, "strategy": {"zero_stage": 2}}).strategy
    assert (s.effective_zero_stage, s.per_layer_sharding) == (2, False)  # DeepSpeed's bucketed ZeRO-2
    with pytest.raises(SpecError, match=r"strategy\.fsdp.*ZeRO-1"):
        RunSpec.from_dict({**base, "strategy": {"fsdp": True, "zero_stage": 1}})


def _fsdp_run(num_layers: int, **strategy):
    model = {**GPT_SMALL, "num_layers": num_layers}
    return make_run(model, num_devices=8, dp=8, micro_batch_size=1, global_batch_size=8,
                    hw_extra={"comm_overlap": 0.0}, **strategy)


def _serial_parts(run: RunSpec, cost, gathers_per_layer: int) -> dict[str, float]:
    """The terms of a one-micro-batch FSDP step's serial time, each summed from the cost model: compute,
    one gather per layer (two when fully sharded) and one reduce-scatter per layer of that layer's
    parameters (the root's, embedding and final norm, with the first gather and the last
    reduce-scatter), FSDP's copies around each, and the optimizer."""
    eg = compile_run(run)
    c = eg.stages[0].chunks[0]
    s = run.strategy
    root = c.params - c.num_layers * c.layer_params  # a dense model: every layer holds layer_params
    sizes = [c.layer_params + root] + [c.layer_params] * (c.num_layers - 1)
    compute = sum(cost.compute_time_s(op) * rep for ops, rep in c.forward + c.backward for op in ops)
    gather = sum(cost.comm_time_s(comm("g", "allgather", "fwd", p * eg.param_bytes_per_param, eg.dp_group,
                                       s.precision)) for p in sizes)
    rs = sum(cost.comm_time_s(comm("r", "reducescatter", "bwd", p * eg.grad_bytes_per_param, eg.dp_group,
                                   s.reduce_precision)) for p in sizes)
    copies = sum(cost.compute_time_s(op) for p in sizes
                 for op in fsdp_copy_ops("allgather", p, 8, s) * gathers_per_layer
                 + fsdp_copy_ops("reducescatter", p, 8, s))
    opt = sum(cost.compute_time_s(op) for op in eg.stages[0].optimizer)
    return {"compute": compute, "gather": gathers_per_layer * gather, "rs": rs, "copies": copies, "opt": opt}


@pytest.mark.parametrize("num_layers", [3, 40])
def test_shard_grad_op_without_overlap_is_its_serial_sum(num_layers):
    # SHARD_GRAD_OP with gathers blocking the compute stream and collectives computation does not hide
    # (comm_overlap 0): every layer's gather, reduce-scatter and buffer copies are paid once. 40 layers
    # exceed MAX_SHARDED_UNITS: grouped units must keep every layer's latency and bytes.
    run = _fsdp_run(num_layers, fsdp=True, zero_stage=2, overlap_param_gather=False)
    cost = roofline(run, KNOWN_PARAMS)
    parts = _serial_parts(run, cost, gathers_per_layer=1)
    r = simulate(run, cost=cost)
    assert r.iteration_time_s == pytest.approx(sum(parts.values()), rel=1e-9)
    assert r.breakdown_s["exposed_communication"] == pytest.approx(parts["gather"] + parts["rs"], rel=1e-9)


def test_full_shard_gathers_twice_and_deepspeed_zero3_copies_nothing():
    # one layer: a backward gather never shares the link with a reduce-scatter, so the sum is exact
    run = _fsdp_run(1, fsdp=True, overlap_param_gather=False)
    cost = roofline(run, KNOWN_PARAMS)
    t = simulate(run, cost=cost).iteration_time_s
    parts = _serial_parts(run, cost, gathers_per_layer=2)
    # FSDP keeps its root (embedding, final norm) gathered from forward to backward: the backward gathers
    # are the layers' alone
    eg = compile_run(run)
    c = eg.stages[0].chunks[0]
    root = c.params - c.num_layers * c.layer_params
    root_gather = cost.comm_time_s(comm("g", "allgather", "fwd", (c.layer_params + root) * eg.param_bytes_per_param,
                                        eg.dp_group, run.strategy.precision)) - cost.comm_time_s(
        comm("g", "allgather", "fwd", c.layer_params * eg.param_bytes_per_param, eg.dp_group, run.strategy.precision))
    root_copy = sum(cost.compute_time_s(op) for op in fsdp_copy_ops("allgather", c.layer_params + root, 8,
                                                                       run.strategy)) - sum(
        cost.compute_time_s(op) for op in fsdp_copy_ops("allgather", c.layer_params, 8, run.strategy))
    assert t == pytest.approx(sum(parts.values()) - root_gather - root_copy, rel=1e-9)
    # DeepSpeed's ZeRO-3 (no fsdp) gathers the same layers without FSDP's copy-in/copy-out buffers
    ds = _fsdp_run(1, zero_stage=3, overlap_param_gather=False)
    t_ds = simulate(ds, cost=cost).iteration_time_s
    assert t_ds == pytest.approx(sum(parts.values()) - parts["copies"], rel=1e-9)


def test_prefetched_layer_gathers_hide_behind_compute():
    # On NVLink with enough work per layer, a gather runs while the previous layer computes: only the first
    # one (with the root's embedding) and the last reduce-scatter stay exposed, where gathering the whole
    # model before its forward would expose every byte.
    kw = dict(num_devices=8, dp=8, micro_batch_size=8, global_batch_size=64, fsdp=True)
    run = make_run(GPT_SMALL, **kw)
    cost = roofline(run, KNOWN_PARAMS)
    parts = _serial_parts(run, cost, gathers_per_layer=2)
    r = simulate(run, cost=cost)
    blocking = simulate(make_run(GPT_SMALL, overlap_param_gather=False, **kw), cost=cost)
    assert r.iteration_time_s < blocking.iteration_time_s
    comm_total = parts["gather"] + parts["rs"]
    assert r.breakdown_s["exposed_communication"] < 0.5 * comm_total
    assert r.iteration_time_s >= parts["compute"] + parts["copies"] + parts["opt"]


def test_deep_chunks_are_grouped_into_bounded_units():
    # at most MAX_SHARDED_UNITS units a model; a unit of several layers splits each collective in two
    # (the layer the computation waits for, and the rest), a one-layer unit does not
    for layers in (40, 8, 3):
        run = _fsdp_run(layers, fsdp=True)
        r = simulate(run, cost=roofline(run, KNOWN_PARAMS), trace=True)
        names = [e["name"] for e in r.trace if e.get("ph") == "X"]
        per_unit = -(-layers // MAX_SHARDED_UNITS)
        units = -(-layers // per_unit)
        tasks = units * (2 if per_unit > 1 else 1)
        assert units <= MAX_SHARDED_UNITS
        for tag in (".fsdp_allgather.f0.", ".fsdp_allgather.b0.", ".fsdp_reducescatter.b0."):
            assert sum(tag in n for n in names) == tasks, (layers, tag)


@pytest.mark.parametrize("layers", [8, 40])
@pytest.mark.parametrize("sharding", [{"fsdp": True}, {"zero_stage": 3}])
def test_grouped_units_time_like_one_unit_per_layer(layers, sharding, monkeypatch):
    # with every layer's collectives shorter than its computation (NVLink, 8 sequences a micro-batch), a
    # per-layer layout exposes one layer's gather and one reduce-scatter; grouping layers, with the waited-for
    # layer's collective split off, exposes the same: the times agree to rounding
    import learnedperf.graph.execution as execution

    run = make_run({**GPT_SMALL, "num_layers": layers}, num_devices=8, dp=8, micro_batch_size=8,
                   global_batch_size=128, **sharding)
    cost = roofline(run, KNOWN_PARAMS)
    grouped = simulate(run, cost=cost)
    monkeypatch.setattr(execution, "MAX_SHARDED_UNITS", 1000)
    per_layer = simulate(run, cost=cost)
    assert per_layer.num_events > grouped.num_events
    assert grouped.iteration_time_s == pytest.approx(per_layer.iteration_time_s, rel=1e-12)


def test_measured_zero2_says_it_ran_on_fsdp():
    model = {"arch": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
             "seq_length": 32}
    hw = {"device": {"name": "cpu", "peak_tflops": {"fp32": 0.1}, "memory_bandwidth_GBps": 10.0,
                     "memory_GiB": 8.0}, "intra_node_bandwidth_GBps": 1.0}
    for strategy in ({"zero_stage": 2}, {"zero_stage": 2, "fsdp": True}):
        cfg = StepConfig(model, 2, strategy)
        assert plan_step(cfg).kind == "fsdp"
        s = run_dict(cfg, hw)["strategy"]
        assert (s["zero_stage"], s["fsdp"]) == (2, True)
        assert RunSpec.from_dict(run_dict(cfg, hw)).strategy.effective_zero_stage == 2
    with pytest.raises(InputError, match=r"^strategy\.fsdp.*ZeRO-1"):
        plan_step(StepConfig(model, 2, {"zero_stage": 1, "fsdp": True}))


def test_committed_zero2_steps_say_fsdp_and_the_amendment_is_idempotent(tmp_path):
    import sys

    steps = pd.read_parquet(CPU_DATA / "steps_cpu.parquet")
    strategies = [json.loads(r)["strategy"] for r in steps["run"]]
    zero2 = [i for i, s in enumerate(strategies) if s.get("zero_stage") == 2]
    assert zero2 and all(strategies[i]["fsdp"] for i in zero2)
    assert set(steps["strategy_kind"].iloc[zero2]) == {"fsdp"}

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    try:
        from amend_records import amend_fsdp
    finally:
        sys.path.pop(0)
    data = tmp_path / "data"
    shutil.copytree(CPU_DATA, data)
    assert amend_fsdp(data, "test") == 0  # already amended: nothing changes, nothing is written
    assert (data / "steps_cpu.parquet").read_bytes() == (CPU_DATA / "steps_cpu.parquet").read_bytes()

    # undo the amendment in the copy (through the same machinery, so the manifest stays valid), then redo it:
    # the runs, run ids and kinds come back as committed
    from learnedperf.measure.records import amend_steps

    def strip(run: dict) -> dict:
        if run["strategy"].get("zero_stage") == 2:
            run["strategy"]["fsdp"] = False
        return run

    assert amend_steps(data, strip, command="test", what="undo", record_unchanged=False,
                       kind=lambda run, old: "zero" if run["strategy"].get("zero_stage") == 2 else old) == len(zero2)
    assert amend_fsdp(data, "test") == len(zero2) == 4  # three ZeRO-2 steps and one hybrid
    again = pd.read_parquet(data / "steps_cpu.parquet")
    for col in ("run", "run_id", "strategy_kind", "iteration_time_ms"):
        assert again[col].tolist() == steps[col].tolist(), col
