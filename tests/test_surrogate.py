"""The fast tier's surrogate holds its time correction monotone in the device's capacities (TIME_MONOTONE)."""

from __future__ import annotations

import numpy as np
import pytest

from learnedperf.features.run import RUN_FEATURE_SCHEMA
from learnedperf.models.surrogate import TIME_MONOTONE, SurrogateRegressor


def test_every_constrained_feature_is_in_the_schema():
    # a renamed feature would silently drop its constraint
    assert set(TIME_MONOTONE) <= set(RUN_FEATURE_SCHEMA.names)
    assert set(TIME_MONOTONE.values()) <= {-1, 1}


@pytest.mark.parametrize("feature", sorted(TIME_MONOTONE))
def test_the_time_model_follows_its_constraint_against_the_data(feature):
    # labels whose time moves against the constraint with the feature (a slower run on more memory, say): the
    # unconstrained trees follow the labels, the constrained ones stay flat or move the allowed way
    rng = np.random.default_rng(0)
    names = RUN_FEATURE_SCHEMA.names
    j = names.index(feature)
    X = rng.uniform(0.0, 1.0, size=(1500, len(names)))
    other = names.index("log_params")
    wrong_way = -TIME_MONOTONE[feature]
    time_ms = np.exp(0.8 * wrong_way * X[:, j] + 0.5 * X[:, other] + rng.normal(0.0, 0.02, len(X)))
    analytic_s = np.full(len(X), 1e-3)  # the correction is then log(time_ms)
    grid = np.tile(X[:200].mean(axis=0), (11, 1))
    grid[:, j] = np.linspace(0.0, 1.0, 11)
    steps = {}
    for monotone in (True, False):
        s = SurrogateRegressor(n_estimators=60, monotone=monotone).fit(X, time_ms, analytic_s)
        steps[monotone] = np.diff(np.log(s.predict(grid, np.full(11, 1e-3))))
    assert (TIME_MONOTONE[feature] * steps[True] >= -1e-12).all()
    assert wrong_way * steps[False].sum() > 0.5  # the data's trend, which the constraint refused
