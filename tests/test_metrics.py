"""Metrics and conformal intervals against values known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from learnedperf.errors import InputError
from learnedperf.models.intervals import ConformalInterval, conformal_quantile
from learnedperf.models.metrics import coverage, kendall_tau, mape, score, top1_regret


def test_mape_closed_form():
    # errors 10 %, 20 %, 0 % -> mean 10 %
    assert mape([110, 80, 50], [100, 100, 50]) == pytest.approx(10.0)


def test_metrics_reject_bad_values():
    with pytest.raises(InputError, match="not positive"):
        mape([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(InputError, match="NaN"):
        mape([1.0, float("nan")], [1.0, 1.0])
    with pytest.raises(InputError, match="differ in length"):
        mape([1.0], [1.0, 2.0])


def test_kendall_tau_perfect_reversed_and_tied():
    true = np.array([1.0, 2.0, 3.0, 4.0])
    assert kendall_tau(true * 2, true)["tau"] == pytest.approx(1.0)
    assert kendall_tau(true[::-1].copy(), true)["tau"] == pytest.approx(-1.0)
    # a formula that predicts every strategy equal orders nothing
    assert kendall_tau(np.ones(4), true)["tau"] == 0.0
    # one swapped pair of 6: (5 concordant - 1 discordant) / 6
    assert kendall_tau([1, 3, 2, 4], true)["tau"] == pytest.approx(4 / 6)


def test_kendall_tau_averages_groups():
    true = np.array([1.0, 2.0, 1.0, 2.0])
    pred = np.array([1.0, 2.0, 2.0, 1.0])
    out = kendall_tau(pred, true, group=["a", "a", "b", "b"])
    assert out["tau"] == pytest.approx(0.0) and out["groups"] == 2


def test_top1_regret():
    true = np.array([10.0, 12.0, 15.0])
    assert top1_regret([1, 2, 3], true)["mean"] == 0.0
    assert top1_regret([3, 1, 2], true)["mean"] == pytest.approx(0.2)
    # ties count against the predictor: the worst of the tied is taken
    assert top1_regret([1, 1, 1], true)["mean"] == pytest.approx(0.5)


def test_coverage_and_score():
    assert coverage([0, 0, 5], [2, 2, 6], [1, 3, 5]) == pytest.approx(2 / 3)
    s = score([110, 90], [100, 100], lower=[100, 80], upper=[120, 95])
    assert s["mape"] == pytest.approx(10.0) and s["coverage"] == pytest.approx(0.5)
    with pytest.raises(InputError, match="lower <= upper"):
        coverage([2], [1], [1])


def test_conformal_quantile_rank():
    r = np.arange(1, 20, dtype=float)  # n = 19: (n+1)*0.95 = 19 -> the largest; (n+1)*0.05 = 1 -> the smallest
    assert conformal_quantile(r, 0.95) == 19.0
    assert conformal_quantile(r, 0.05) == 1.0
    assert conformal_quantile(np.arange(1, 100, dtype=float), 0.95) == 95.0  # ceil(100*0.95) = 95th


def test_conformal_interval_covers_new_draws():
    """Exchangeable log-normal errors: calibrated on 2,000 draws, covers ~90 % of 20,000 new ones."""
    rng = np.random.default_rng(0)
    pred = rng.uniform(10, 1000, 2000)
    true = pred * np.exp(rng.normal(0.05, 0.2, 2000))
    ci = ConformalInterval(0.9).fit(pred, true)
    p2 = rng.uniform(10, 1000, 20000)
    t2 = p2 * np.exp(rng.normal(0.05, 0.2, 20000))
    lo, hi = ci.interval(p2)
    cov = coverage(lo, hi, t2)
    assert 0.88 <= cov <= 0.93
    # the log-normal's own 5 / 95 % points: 0.05 -/+ 1.645 * 0.2
    q_lo, q_hi = ci.bounds()
    assert q_lo == pytest.approx(0.05 - 1.645 * 0.2, abs=0.03)
    assert q_hi == pytest.approx(0.05 + 1.645 * 0.2, abs=0.03)


def test_conformal_mondrian_groups_and_round_trip():
    rng = np.random.default_rng(1)
    pred = np.full(400, 100.0)
    noise = np.r_[rng.normal(0, 0.05, 200), rng.normal(0, 0.4, 200)]
    group = np.array(["gpu"] * 200 + ["cpu"] * 200)
    ci = ConformalInterval(0.9, min_group_size=50).fit(pred, pred * np.exp(noise), group)
    w_gpu = np.subtract(*ci.bounds("gpu")[::-1])
    w_cpu = np.subtract(*ci.bounds("cpu")[::-1])
    assert w_cpu > 4 * w_gpu
    assert ci.bounds("tpu") == ci.bounds(None)  # unseen group -> pooled
    again = ConformalInterval.from_dict(ci.to_dict())
    assert again.bounds("cpu") == ci.bounds("cpu")
    lo, hi = again.interval([100.0], ["cpu"])
    assert lo[0] <= 100.0 <= hi[0]


@pytest.mark.parametrize("bad, match", [
    ({}, "lacks key"),
    ({"coverage": 0.9, "min_group_size": 30, "n_calibration": 5, "quantiles": {}}, "pooled"),
    ({"coverage": 0.9, "min_group_size": 30, "n_calibration": 5,
      "quantiles": {"*": {"log_lower": 0.1, "log_upper": 0.2, "n": 5}}}, "invalid bounds"),
    ({"coverage": "x", "min_group_size": 30, "n_calibration": 5, "quantiles": {}}, "bad value"),
])
def test_conformal_from_dict_rejects(bad, match):
    with pytest.raises(InputError, match=match):
        ConformalInterval.from_dict(bad)


def test_interval_contains_point_even_when_biased():
    # every measured time 2x the prediction: the interval is widened to hold the point itself
    ci = ConformalInterval(0.9).fit(np.full(50, 10.0), np.full(50, 20.0))
    lo, hi = ci.interval([10.0])
    assert lo[0] == pytest.approx(10.0) and hi[0] == pytest.approx(20.0)
    assert math.isclose(ci.bounds()[0], 0.0)
