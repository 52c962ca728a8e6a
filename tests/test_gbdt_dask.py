"""Data-parallel training of the operator regressor on a local Dask cluster (``lightgbm.dask``).

The cluster runs worker *processes* on 127.0.0.1 (as tests/test_data.py starts one, except that the
dashboard gets a free loopback port: ``dashboard_address=None`` still binds 8787 in this version of
distributed, which collides with any other cluster on the machine); LightGBM's
own network between the workers binds ports on the workers' addresses, so everything stays on the
loopback interface. The data are this project's CPU operator records
(``datasets/measured/vm-xeon-2c/ops_cpu.parquet``): real timings whose times span four orders of
magnitude, so a constant predictor is far off and a regressor has something to learn.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from learnedperf.errors import LearnedPerfError
from learnedperf.models import OpTimeRegressor
from learnedperf.models.gbdt import MEASURED_DIR

distributed = pytest.importorskip("distributed")
pytest.importorskip("dask.array")
pytest.importorskip("lightgbm.dask")

CPU_OPS = MEASURED_DIR / "vm-xeon-2c" / "ops_cpu.parquet"
PARAMS = {"n_estimators": 80, "num_leaves": 31}
CLUSTER = {"threads_per_worker": 1, "processes": True, "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}


@pytest.fixture(scope="module")
def client(request):
    cluster = distributed.LocalCluster(n_workers=2, **CLUSTER)
    c = distributed.Client(cluster)

    def close():
        c.close()
        cluster.close()

    request.addfinalizer(close)
    return c


@pytest.fixture(scope="module")
def split():
    if not CPU_OPS.is_file():
        pytest.skip(f"{CPU_OPS} not in this checkout")
    df = pd.read_parquet(CPU_OPS)
    df = df[df["kind"] != "optimizer"].reset_index(drop=True)
    test = np.random.default_rng(0).random(len(df)) < 0.25
    return df[~test], df[test]


def mape(pred, true) -> float:
    return float(np.mean(np.abs(pred - true) / true) * 100)


def test_dask_training_matches_local_and_round_trips(client, split, tmp_path):
    train, test = split
    y = test["time_ms"].to_numpy()
    local = OpTimeRegressor(**PARAMS).fit_records(train)
    dask_model = OpTimeRegressor(**PARAMS).fit_records(train, client=client)
    assert (dask_model.trained_with_, dask_model.dask_workers_) == ("dask", 2)
    m_local, m_dask = mape(local.predict_records(test), y), mape(dask_model.predict_records(test), y)
    m_const = mape(np.full(len(y), np.median(train["time_ms"])), y)
    # data-parallel histograms and per-worker bagging differ from one process: close, not equal
    assert abs(m_dask - m_local) < 5.0, (m_dask, m_local)
    assert m_dask < 0.2 * m_const, (m_dask, m_const)

    d = dask_model.save(tmp_path / "m")
    assert json.loads((d / "op_time_model.json").read_text())["training"] == {"trained_with": "dask",
                                                                              "dask_workers": 2}
    loaded = OpTimeRegressor.load(d)
    assert (loaded.trained_with_, loaded.dask_workers_) == ("dask", 2)
    np.testing.assert_array_equal(loaded.predict_records(test), dask_model.predict_records(test))


def test_cluster_without_workers_or_closed_is_a_clear_error(split):
    train, _ = split
    with distributed.LocalCluster(n_workers=0, **CLUSTER) as cl:
        with distributed.Client(cl) as c:
            with pytest.raises(LearnedPerfError, match="no workers"):
                OpTimeRegressor(**PARAMS).fit_records(train, client=c)
    with pytest.raises(LearnedPerfError, match="closed"):
        OpTimeRegressor(**PARAMS).fit_records(train, client=c)
