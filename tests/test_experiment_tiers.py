"""The experiments' tiers of a checkpoint: one trained without a surrogate (``--surrogate-runs 0``) is scored on
its full tier alone, and a script that measures the fast tier exits with one line naming the checkpoint."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import load_experiment


def _module():
    return load_experiment("_checkpoint")


def _predictor(surrogate):
    return SimpleNamespace(checkpoint=SimpleNamespace(surrogate=surrogate), source="checkpoint:ck:gnn_residual")


def test_a_checkpoint_with_a_surrogate_answers_both_tiers(capsys):
    m = _module()
    assert m.tiers_of(_predictor(object()), "script") == ("full", "fast")
    m.require_fast_tier(_predictor(object()), "script")  # no exit
    assert capsys.readouterr().out == ""


def test_without_a_surrogate_the_full_tier_alone_and_it_is_said(capsys):
    m = _module()
    assert m.tiers_of(_predictor(None), "script") == ("full",)
    out = capsys.readouterr().out
    assert "checkpoint:ck:gnn_residual has no surrogate" in out and "fast tier is not scored" in out
    with pytest.raises(SystemExit) as exc:
        m.require_fast_tier(_predictor(None), "fast_tier")
    assert str(exc.value).startswith("fast_tier: error: checkpoint checkpoint:ck:gnn_residual has no surrogate")


def _search_regret():
    return load_experiment("search_regret")


class _FullTierOnly:
    """A predictor whose checkpoint has no surrogate: ``rank`` answers with the full tier (time and simulator time =
    10 ms per tensor-parallel rank), and anything of the fast tier fails the test."""

    source = "checkpoint:ck:gnn_residual"
    checkpoint = SimpleNamespace(surrogate=None)

    @staticmethod
    def _pred(strategy):
        t = 10.0 * strategy["tp"]
        return {"iteration_time_ms": t, "interval_ms": [0.9 * t, 1.1 * t], "simulator_iteration_time_ms": t}

    def rank(self, model, hardware, strategies, tier="fast"):
        assert tier == "full"
        out = sorted(strategies, key=lambda s: s["tp"])
        return [{"rank": k + 1, "strategy": s, "prediction": self._pred(s)} for k, s in enumerate(out)]

    def search(self, *args, **kwargs):
        raise AssertionError("search screens with the fast tier")


def test_search_regret_scores_the_full_tier_and_skips_search_without_a_surrogate(monkeypatch, capsys):
    m = _search_regret()
    runs = [SimpleNamespace(run={"model": "gpt3-125m", "hardware": {"num_devices": 2},
                                 "strategy": {"tp": tp, "global_batch_size": 8}}, iteration_time_ms=t)
            for tp, t in ((1, 12.0), (2, 10.0))]  # measured: tp 2 is the faster, the predictor picks tp 1
    monkeypatch.setattr(m, "load_predictor", lambda path, prog: _FullTierOnly())
    monkeypatch.setattr(m, "vtrain_groups", lambda: [runs])
    monkeypatch.setattr("sys.argv", ["search_regret.py"])
    m.main()
    out = capsys.readouterr().out
    assert "fast tier is not scored" in out
    assert "rank, full tier: top-1 regret mean 20.00 %" in out  # 12 / 10 - 1
    assert "simulator alone (the full tier's base): top-1 regret mean 20.00 %" in out
    assert "search and the SC21 ranking need the fast tier, which this checkpoint has not: skipped" in out
