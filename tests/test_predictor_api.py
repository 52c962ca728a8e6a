"""The Predictor API on the shipped checkpoint: both tiers, batches, rank and search."""

from __future__ import annotations

import json
import shutil

import pytest

from learnedperf.errors import InputError, SpecError
from learnedperf.predict import Predictor, enumerate_strategies

A100_8 = {"cluster": "dgx-a100", "num_devices": 8}
RUN = {"model": "gpt3-1.3b", "hardware": A100_8, "strategy": {"tp": 2, "global_batch_size": 16}}


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return Predictor.load()


def _runs(n: int, seed: int):
    from learnedperf.data.sampler import sample_runs

    return [raw for _i, raw in sample_runs(n, seed=seed)]


def test_fast_tier_memory_is_the_simulators(predictor):
    # the fast tier computes memory in closed form; the full tier compiles and simulates the run
    for run in _runs(12, seed=21):
        fast, full = predictor.predict(run, tier="fast"), predictor.predict(run, tier="full")
        assert fast["peak_memory_GiB"] == pytest.approx(full["peak_memory_GiB"], rel=1e-12)
        assert fast["memory_GiB"] == pytest.approx(full["memory_GiB"], rel=1e-12)
        assert fast["fits_in_memory"] == full["fits_in_memory"]
        assert fast["tier"] == "fast" and full["tier"] == "full"
        assert fast["source"] == full["source"] + ":fast"


def test_fast_tier_agrees_with_the_full_tier_within_its_fidelity(predictor):
    # the surrogate's interval adds its measured disagreement with the full tier (90 % conformal on
    # held-out distilled runs): on fresh sampled runs most full-tier times fall inside it
    runs = _runs(60, seed=22)
    fast = predictor.predict_many(runs)
    full = predictor.predict_many(runs, tier="full")
    inside = sum(f["interval_ms"][0] <= g["iteration_time_ms"] <= f["interval_ms"][1] for f, g in zip(fast, full))
    assert inside >= 0.8 * len(runs)
    for f in fast:
        lo, hi = f["interval_ms"]
        assert lo <= f["iteration_time_ms"] <= hi
        # throughput follows from the time: global batch x sequence / time
        assert f["tokens_per_second"] * f["iteration_time_ms"] / 1e3 > 0


def test_predict_many_matches_predict_and_keeps_order(predictor):
    runs = _runs(10, seed=23)
    batch = predictor.predict_many(runs)
    for run, pred in zip(runs, batch):
        one = predictor.predict(run)
        assert one["iteration_time_ms"] == pytest.approx(pred["iteration_time_ms"], rel=1e-12)
        assert one["peak_memory_GiB"] == pred["peak_memory_GiB"]


def test_predict_many_returns_errors_in_place(predictor):
    bad_tp = {**RUN, "id": "bad", "strategy": {"tp": 3}}
    out = predictor.predict_many([RUN, bad_tp, "not a run", RUN], errors="return")
    assert "iteration_time_ms" in out[0] and "iteration_time_ms" in out[3]
    assert out[1]["index"] == 1 and out[1]["id"] == "bad" and "strategy.tp" in out[1]["error"]
    assert out[2]["index"] == 2 and "JSON object" in out[2]["error"]
    with pytest.raises(SpecError, match="strategy.tp"):
        predictor.predict_many([RUN, bad_tp])
    with pytest.raises(InputError, match="tier"):
        predictor.predict(RUN, tier="fastest")
    with pytest.raises(InputError, match="errors"):
        predictor.predict_many([RUN], errors="ignore")


def test_a_checkpoint_without_surrogate_refuses_the_fast_tier(tmp_path, predictor):
    from learnedperf.checkpoint import MANIFEST, SURROGATE_DIR, default_checkpoint_dir

    ck = tmp_path / "ck"
    shutil.copytree(default_checkpoint_dir(), ck)
    shutil.rmtree(ck / SURROGATE_DIR)
    m = json.loads((ck / MANIFEST).read_text())
    del m["components"]["surrogate"]
    m["files"] = {k: v for k, v in m["files"].items() if not k.startswith(SURROGATE_DIR + "/")}
    (ck / MANIFEST).write_text(json.dumps(m))
    p = Predictor.load(ck)
    assert p.predict(RUN, tier="full")["iteration_time_ms"] > 0
    with pytest.raises(InputError, match="no surrogate"):
        p.predict(RUN)


def test_tampered_surrogate_is_refused(tmp_path):
    from learnedperf.checkpoint import SURROGATE_DIR, default_checkpoint_dir, load_checkpoint

    ck = tmp_path / "ck"
    shutil.copytree(default_checkpoint_dir(), ck)
    with open(ck / SURROGATE_DIR / "time.txt", "a") as f:
        f.write("\n")
    with pytest.raises(InputError, match="time.txt"):
        load_checkpoint(ck)


def test_rank_orders_fitting_strategies_first(predictor):
    strategies = [{"tp": 1, "global_batch_size": 16}, {"tp": 8, "global_batch_size": 16},
                  {"tp": 3}, {"tp": 2, "pp": 2, "global_batch_size": 16}]
    ranked = predictor.rank("gpt3-1.3b", A100_8, strategies)
    ok = [r for r in ranked if r["rank"] is not None]
    times = [r["prediction"]["iteration_time_ms"] for r in ok]
    assert [r["rank"] for r in ok] == [1, 2, 3] and times == sorted(times)
    assert ranked[-1]["rank"] is None and ranked[-1]["strategy"] == {"tp": 3} and "strategy.tp" in ranked[-1]["error"]


def test_enumeration_counts_and_constraint_errors():
    from learnedperf.specs.run import SpecCache

    cache = SpecCache()
    model, hw = cache.model("gpt3-1.3b"), cache.hardware(A100_8)
    base = {"global_batch_size": 16, "micro_batch_size": [1], "recompute": ["none"], "zero_stages": [0],
            "sequence_parallel": [False], "schedules": ["1f1b"], "cp": [1]}
    # tp, pp in {1, 2, 4, 8} with tp·pp | 8: (1,1) (1,2) (1,4) (1,8) (2,1) (2,2) (2,4) (4,1) (4,2) (8,1) = 10
    _c, cands = enumerate_strategies(model, hw, {**base, "pp": [1, 2, 4, 8]})
    assert len(cands) == 10
    assert all(s["tp"] * s["pp"] * s["dp"] == 8 for s in cands)
    # interleaving doubles every pipelined candidate per virtual-stage count: 6 pipelined x (1f1b + v2)
    _c, cands = enumerate_strategies(model, hw, {**base, "pp": [1, 2, 4, 8], "schedules": ["1f1b", "interleaved"],
                                                 "virtual_stages": [2]})
    assert len(cands) == 10 + 6
    # by default context parallelism is searched where every rank keeps >= 1024 of the 2048 tokens: cp 1, 2
    c, cands = enumerate_strategies(model, hw, {**base, "cp": None, "pp": [1]})
    assert sorted({s["cp"] for s in cands}) == [1, 2] and all(s["tp"] * s["cp"] * s["dp"] == 8 for s in cands)
    with pytest.raises(InputError, match="constraints.max_tpp"):
        enumerate_strategies(model, hw, {**base, "max_tpp": 2})
    with pytest.raises(InputError, match="constraints.global_batch_size"):
        enumerate_strategies(model, hw, {})
    with pytest.raises(InputError, match="constraints.recompute"):
        enumerate_strategies(model, hw, {**base, "recompute": ["sometimes"]})
    with pytest.raises(InputError, match="max_candidates"):
        enumerate_strategies(model, hw, {"global_batch_size": 16, "max_candidates": 5})


def test_search_finds_the_full_tier_optimum_of_a_small_space(predictor):
    # a space small enough to re-score every candidate: search's best must be the argmin of the
    # full tier over every candidate that fits, computed here one by one
    cons = {"global_batch_size": 16, "micro_batch_size": [1, 2], "recompute": ["none", "full"], "zero_stages": [0],
            "sequence_parallel": [False], "schedules": ["1f1b"], "pp": [1, 2]}
    result = predictor.search("gpt3-1.3b", A100_8, cons, top=3, rescore=100)
    _c, cands = enumerate_strategies(predictor._specs.model("gpt3-1.3b"), predictor._specs.hardware(A100_8), cons)
    full = [predictor.predict({"model": "gpt3-1.3b", "hardware": A100_8, "strategy": s}, tier="full") for s in cands]
    best = min(p["iteration_time_ms"] for p in full if p["fits_in_memory"])
    assert result["candidates"] == len(cands) and result["rescored"] == result["fit_in_memory"]
    assert result["rescore_failed"] == []
    assert result["valid"] + sum(result["invalid_by_field"].values()) == result["candidates"]
    assert result["results"][0]["iteration_time_ms"] == pytest.approx(best, rel=1e-9)
    times = [r["iteration_time_ms"] for r in result["results"]]
    assert times == sorted(times) and len(times) == 3
    assert sum(r["p_fastest"] for r in result["results"]) <= 1.0 + 1e-9
    assert all(0.0 <= r["p_faster_than_next"] <= 1.0 for r in result["results"])


def test_spec_cache_resolves_once_and_never_caches_errors():
    from learnedperf.specs.run import SpecCache

    cache = SpecCache(max_entries=2)
    a = cache.hardware({"cluster": "dgx-a100", "num_devices": 8})
    assert cache.hardware({"cluster": "dgx-a100", "num_devices": 8}) is a
    for _ in range(2):
        with pytest.raises(SpecError, match="hardware"):
            cache.hardware({"cluster": "no-such-cluster", "num_devices": 8})
    cache.hardware({"cluster": "dgx-a100", "num_devices": 16})
    cache.hardware({"cluster": "dgx-a100", "num_devices": 32})
    assert len(cache._hardware) == 2  # bounded: the oldest entry went first


def test_a_prediction_says_what_widened_its_interval(predictor):
    # the shipped checkpoint's measured runs: vTrain's A100-SXM4-80GB steps on up to 8 GPUs (tp/pp/dp mixes), and
    # since 2026-11-28 the lent H100's and H200's single-GPU steps: a B200 is a device none of them had
    b200 = {"model": "llama-2-7b", "hardware": {"cluster": "dgx-b200", "num_devices": 64},
            "strategy": {"cp": 2, "global_batch_size": 64}}
    for tier in ("fast", "full"):
        near, far = predictor.predict(RUN, tier=tier), predictor.predict(b200, tier=tier)
        assert near["novelty"] == []
        assert far["novelty"] == ["unseen_device", "unseen_scale", "unseen_strategy"]
        # each class widens: the far run's interval is relatively wider
        width = [p["interval_ms"][1] / p["interval_ms"][0] for p in (near, far)]
        assert width[1] > width[0]
