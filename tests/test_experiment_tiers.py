"""The experiments' tiers of a checkpoint: one trained without a surrogate (``--surrogate-runs 0``) is scored on
its full tier alone, and a script that measures the fast tier exits with one line naming the checkpoint."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest


def _module():
    path = Path(__file__).resolve().parents[1] / "experiments" / "_checkpoint.py"
    spec = importlib.util.spec_from_file_location("experiments_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
