"""The shape memory (``learnedperf.models.shapes``): which runs share a layer-shape key, the medians it keeps,
the leave-group-out factors its interval calibrates on, and its JSON."""

from __future__ import annotations

import json
import math

import pytest

from learnedperf.errors import InputError
from learnedperf.models.shapes import FREE_STRATEGY_FIELDS, SHAPES_VERSION, ShapeMemory, shape_key
from learnedperf.specs import RunSpec

BASE = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8},
        "strategy": {"tp": 2, "pp": 1, "micro_batch_size": 2, "global_batch_size": 64}}


def spec(model=None, hardware=None, **strategy) -> RunSpec:
    return RunSpec.from_dict({"model": model or BASE["model"], "hardware": {**BASE["hardware"], **(hardware or {})},
                              "strategy": {**BASE["strategy"], **strategy}})


def test_the_key_ignores_how_many_layers_a_device_holds_and_how_replicas_meet():
    key = shape_key(spec())
    # pipeline depth, data parallelism, sharding and the global batch leave one device's layers as they are
    assert shape_key(spec(pp=2)) == key
    assert shape_key(spec(pp=2, pipeline_schedule="interleaved", virtual_pipeline_stages=2)) == key
    assert shape_key(spec(zero_stage=1, global_batch_size=128)) == key
    assert shape_key(spec(hardware={"num_devices": 4})) == key  # dp 2 instead of 4
    # an inline copy of the catalog model is the same layers: the name is not in the key
    inline = spec().model.to_dict()
    inline["name"] = "my-copy"
    assert shape_key(spec(model=inline)) == key
    assert {"pp", "dp", "zero_stage", "global_batch_size"} <= set(FREE_STRATEGY_FIELDS)


@pytest.mark.parametrize("change", [
    {"tp": 4}, {"micro_batch_size": 4}, {"precision": "fp16"}, {"recompute": "full"}, {"sequence_parallel": True},
    {"flash_attention": False}, {"hardware": {"cluster": "dgx-h100"}}, {"model": "gpt3-2.7b"},
])
def test_the_key_tells_apart_what_changes_a_layers_kernels(change):
    change = dict(change)
    other = spec(model=change.pop("model", None), hardware=change.pop("hardware", None), **change)
    assert shape_key(other) != shape_key(spec())


def test_the_memory_keeps_each_keys_median_and_answers_nothing_elsewhere():
    a, b = spec(), spec(tp=4)
    ka, kb = shape_key(a), shape_key(b)
    mem = ShapeMemory().fit([ka, ka, ka, kb, kb], [0.1, -0.3, 0.2, 0.05, 0.15])
    assert mem.table_ == {ka: (0.1, 3), kb: (pytest.approx(0.1), 2)}  # medians of 3 and of 2 values
    factors, counts = mem.lookup([spec(pp=2), b, spec(micro_batch_size=8)])
    assert factors == [0.1, pytest.approx(0.1), 0.0] and counts == [3, 2, 0]
    # a run on another device is not looked up at all
    assert mem.lookup([spec(hardware={"cluster": "dgx-h100"})]) == ([0.0], [0])
    # a key needs min_runs runs
    assert ShapeMemory(min_runs=3).fit([ka, ka, ka, kb, kb], [0.1, -0.3, 0.2, 0.05, 0.15]).table_ == {ka: (0.1, 3)}


def test_leave_group_out_uses_the_runs_of_other_groups_only():
    mem = ShapeMemory()
    keys = ["k", "k", "k", "k", "j"]
    res = [0.1, 0.3, -0.2, 0.5, 0.4]
    groups = ["g1", "g1", "g2", "g3", "g1"]
    factors, counts = mem.leave_group_out(keys, res, groups)
    # run 0 (g1): its key's runs in g2 and g3 → median of (-0.2, 0.5); run 2 (g2): g1's and g3's (0.1, 0.3, 0.5)
    assert factors[0] == pytest.approx(0.15) and factors[1] == pytest.approx(0.15) and counts[:2] == [2, 2]
    assert factors[2] == pytest.approx(0.3) and counts[2] == 3
    assert factors[3] == pytest.approx(0.1) and counts[3] == 3  # median of (0.1, 0.3, -0.2)
    assert factors[4] == 0.0 and counts[4] == 0  # no other run of key j


def test_json_round_trip_and_one_clear_error_per_malformed_memory():
    k = shape_key(spec())
    mem = ShapeMemory().fit([k, k], [0.1, 0.2])
    back = ShapeMemory.from_dict(json.loads(json.dumps(mem.to_dict())))
    assert back.table_ == mem.table_ and back.lookup([spec()]) == mem.lookup([spec()])
    good = mem.to_dict()
    bad = [
        ({**good, "version": SHAPES_VERSION + 1}, "version"),
        ({**good, "min_runs": 0}, "min_runs must be an integer >= 1"),
        ({**good, "table": []}, "'table' must be a JSON object"),
        ({**good, "table": {"not json": [0.1, 2]}}, "is not a shape key"),
        ({**good, "table": {'["A100",null,8,{},{}]': [0.1, 2]}}, "is not a shape key"),  # no architecture in it
        ({**good, "table": {k: [math.inf, 2]}}, "finite median"),
        ({**good, "table": {k: [0.1, 0]}}, "runs >= min_runs"),
        ([], "expected a JSON object"),
    ]
    for data, match in bad:
        with pytest.raises(InputError, match=match):
            ShapeMemory.from_dict(data, where="shapes.json")
    # what the medians are residuals of travels with them
    over = ShapeMemory(over="simulator").fit([k, k], [0.1, 0.2])
    assert ShapeMemory.from_dict(json.loads(json.dumps(over.to_dict()))).over == "simulator"
    assert mem.over == "model" and back.over == "model"
    with pytest.raises(InputError, match="over must be one of model, simulator, got 'gnn'"):
        ShapeMemory.from_dict({**good, "over": "gnn"}, where="shapes.json")
    # a file of version 1 (before 'over') is a memory over the model, as it was written
    old = {k: v for k, v in good.items() if k != "over"} | {"version": 1}
    assert ShapeMemory.from_dict(old).over == "model" and ShapeMemory.from_dict(old).table_ == mem.table_
    with pytest.raises(InputError, match="version 1 has no 'over'"):
        ShapeMemory.from_dict(old | {"over": "simulator"}, where="shapes.json")
    with pytest.raises(InputError, match="2 keys but 1 residuals"):
        ShapeMemory().fit([k, k], [0.1])
    with pytest.raises(InputError, match="not finite"):
        ShapeMemory().fit([k], [math.nan])
    with pytest.raises(InputError, match="not fitted"):
        ShapeMemory().lookup([spec()])


def test_corrected_runs_are_calibrated_apart_from_the_others():
    import numpy as np

    from learnedperf.models.dataset import SHAPE_GROUP_PREFIX, device_group, shape_group
    from learnedperf.models.intervals import ConformalInterval

    g = device_group("A100-SXM4-80GB", 8)
    assert shape_group(g, False) == g
    assert shape_group(g, True) == tuple(SHAPE_GROUP_PREFIX + x for x in g) + (SHAPE_GROUP_PREFIX + "*",)
    # 60 corrected runs within ±1 %, 60 others within ±30 %: each kind gets the pair of its own errors
    rng = np.random.default_rng(0)
    hit = np.r_[np.ones(60, bool), np.zeros(60, bool)]
    r = np.where(hit, rng.uniform(-0.01, 0.01, 120), rng.uniform(-0.3, 0.3, 120))
    pred = np.full(120, 100.0)
    groups = [shape_group(g, h) for h in hit]
    iv = ConformalInterval(0.9).fit(pred, pred * np.exp(r), groups)
    specs = [spec()] * 2
    lo, hi = iv.interval_for_specs([100.0, 100.0], specs, shape_hits=[True, False])
    assert np.log(hi[0] / 100) <= 0.01 and np.log(lo[0] / 100) >= -0.01  # the corrected runs' pair
    assert np.log(hi[1] / 100) > 0.2 and np.log(lo[1] / 100) < -0.2  # the others'
