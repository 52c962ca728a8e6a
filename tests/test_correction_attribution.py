"""``experiments/correction_attribution.py``: the correction it attributes is the full tier's, a feature already at
its training mean has no part, and a checkpoint without a GNN gets one line."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import load_experiment
from learnedperf.errors import InputError
from learnedperf.measure.public import load_sc21
from learnedperf.predict import Predictor


def _module():
    return load_experiment("correction_attribution")


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return Predictor.load()


def test_the_attributed_correction_is_the_full_tiers_and_a_feature_at_its_mean_has_no_part(predictor):
    m = _module()
    run = load_sc21()[1].run  # 64 GPUs, tp 2
    c, parts = m.attribution(predictor, run)
    pred = predictor.predict(run, tier="full")
    # the sample built for the attribution is the one the full tier corrects with (the time is not bounded by peak)
    assert c == pytest.approx(math.log(pred["iteration_time_ms"] / pred["simulator_iteration_time_ms"]), abs=1e-9)
    from learnedperf.features import GLOBAL_FEATURE_SCHEMA

    assert list(parts) == GLOBAL_FEATURE_SCHEMA.names
    gnn = predictor.checkpoint.gnn
    from learnedperf.graph.execution import compile_run
    from learnedperf.simulate.memory import memory_microbatches
    from learnedperf.specs import RunSpec

    spec = RunSpec.from_dict(run)
    bd = {k: v / pred["breakdown_scale"] for k, v in pred["breakdown_ms"].items()}
    eg = compile_run(spec, memory_microbatches(spec))
    sample = predictor.gnn_sample(spec, eg, pred["simulator_iteration_time_ms"], bd)
    at_mean = np.flatnonzero(sample.global_x == gnn.global_mean_)
    moved = np.flatnonzero(sample.global_x != gnn.global_mean_)
    assert len(moved) > 0
    for j in at_mean:  # setting it to its mean changes nothing (but the rounding of a batch of other size)
        assert abs(parts[GLOBAL_FEATURE_SCHEMA.names[j]]) < 1e-6


def test_a_checkpoint_without_a_gnn_gets_one_line(monkeypatch, capsys):
    m = _module()
    fake = SimpleNamespace(checkpoint=SimpleNamespace(gnn=None, method="simulator"), source="checkpoint:ck:simulator")
    monkeypatch.setattr(m, "load_predictor", lambda path, prog: fake)
    assert m.main([]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("correction_attribution: error: checkpoint checkpoint:ck:simulator has no GNN (method "
                   "'simulator'): no correction to attribute")


def test_gnn_sample_refuses_a_checkpoint_without_a_gnn():
    bare = Predictor(SimpleNamespace(gnn=None, method="simulator", path=Path("ck")))
    with pytest.raises(InputError, match="has no GNN"):
        bare.gnn_sample(None, None, 1.0, {})
