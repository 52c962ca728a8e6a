"""Operator feature schema, the LightGBM op-time regressor, its storage and the learned cost model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import A100_LIKE, GPT_SMALL, make_run
from learnedperf.errors import InputError
from learnedperf.features import OP_FEATURE_SCHEMA, op_features, op_features_from_ops
from learnedperf.graph.ops import Op
from learnedperf.models import LearnedOpCost, OpTimeRegressor
from learnedperf.simulate import simulate
from learnedperf.specs import HardwareSpec

#: Frozen copy of the schema: changing names or order must come with a version bump (and this list).
#: Version 2 has version 1's names; it changed what an unknown L2 size reads as (NaN, not a cache of 0).
EXPECTED_NAMES = (
    [f"kind={k}" for k in ("matmul", "attention", "softmax", "layernorm", "rmsnorm", "elementwise", "embedding",
                           "cross_entropy", "optimizer", "conv", "other")]
    + [f"direction={d}" for d in ("fwd", "bwd", "fwd+bwd", "opt")]
    + [f"dtype={d}" for d in ("fp32", "tf32", "bf16", "fp16", "fp8")]
    + ["causal", "log_flops", "log_bytes", "log_intensity"]
    + [f"log_dim{i}" for i in range(5)]
    + ["num_dims", "log_peak_flops", "log_mem_bw_Bps", "log_ridge", "num_sms", "l2_cache_MiB", "clock_MHz",
       "log_bytes_per_l2", "log_compute_s", "log_memory_s", "log_roofline_s"]
)

DEVICES = [
    {"name": "dev-a", "peak_tflops": {"fp32": 19.5, "bf16": 312.0}, "memory_bandwidth_GBps": 2039.0,
     "memory_GiB": 80.0, "num_sms": 108, "l2_cache_MiB": 40.0, "clock_MHz": 1410.0},
    {"name": "dev-b", "peak_tflops": {"fp32": 14.0}, "memory_bandwidth_GBps": 900.0, "memory_GiB": 32.0,
     "num_sms": 80, "l2_cache_MiB": 6.0, "clock_MHz": 1370.0},
    {"name": "dev-c", "peak_tflops": {"fp32": 8.1, "fp16": 65.0}, "memory_bandwidth_GBps": 320.0,
     "memory_GiB": 16.0, "num_sms": 40, "l2_cache_MiB": 4.0, "clock_MHz": 1590.0},
]


def synthetic_records(n: int, seed: int) -> pd.DataFrame:
    """GEMM records whose time is known in closed form: 1.25 × the roofline bound."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        dev = DEVICES[i % len(DEVICES)]
        m, nn, k = (int(2 ** rng.uniform(5, 13)) for _ in range(3))
        dtype = "fp32" if rng.random() < 0.5 else "bf16"
        e = 4 if dtype == "fp32" else 2
        flops = 2.0 * m * nn * k
        nbytes = float((m * k + k * nn + m * nn) * e)
        peak = (dev["peak_tflops"].get(dtype) or dev["peak_tflops"]["fp32"]) * 1e12
        t_s = 1.25 * max(flops / peak, nbytes / (dev["memory_bandwidth_GBps"] * 1e9), 1e-9)
        rows.append({"op": "linear", "kind": "matmul", "direction": "fwd", "shape": json.dumps([1, m, nn, k]),
                     "params": "{}", "dtype": dtype, "flops": flops, "bytes": nbytes, "time_ms": t_s * 1e3,
                     "device": json.dumps(dev), "device_name": dev["name"]})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def fitted() -> OpTimeRegressor:
    return OpTimeRegressor(n_estimators=60, num_leaves=15).fit_records(synthetic_records(600, 0))


def test_schema_is_stable():
    assert OP_FEATURE_SCHEMA.version == 2
    assert OP_FEATURE_SCHEMA.names == EXPECTED_NAMES
    assert all(desc for _, desc in OP_FEATURE_SCHEMA.features)
    assert OP_FEATURE_SCHEMA.to_dict()["names"] == EXPECTED_NAMES


def test_features_finite_and_same_from_records_and_ops():
    df = synthetic_records(30, 1)
    X = op_features(df)
    assert X.dtype == np.float32 and X.shape == (30, len(EXPECTED_NAMES))
    assert np.isfinite(X).all()
    # the inference path gives the same rows for the same ops on the same device
    row = df.iloc[0]
    op = Op("x", "matmul", "fwd", row["flops"], row["bytes"], row["dtype"], tuple(json.loads(row["shape"])))
    Xo = op_features_from_ops([op], json.loads(row["device"]))
    np.testing.assert_allclose(Xo[0], X[0], rtol=1e-6)
    # an op with no FLOPs and no bytes (and an unknown dtype) still has finite features
    empty = Op("e", "other", "recompute", 0.0, 0.0, "int8", ())
    assert np.isfinite(op_features_from_ops([empty], DEVICES[1])).all()


def test_regressor_learns_closed_form_target(fitted):
    test = synthetic_records(200, 7)
    pred = fitted.predict_records(test)
    rel = np.abs(pred / test.time_ms.to_numpy() - 1)
    assert np.median(rel) < 0.02 and rel.max() < 0.05


def test_save_load_round_trip(fitted, tmp_path):
    fitted.save(tmp_path)
    loaded = OpTimeRegressor.load(tmp_path)
    X = op_features(synthetic_records(50, 3))
    np.testing.assert_array_equal(loaded.predict(X), fitted.predict(X))
    assert "pickle" not in (tmp_path / "op_time_model.txt").read_text()[:100]


def test_load_rejects_tampered_truncated_or_incompatible(fitted, tmp_path):
    d = fitted.save(tmp_path / "m")
    model = d / "op_time_model.txt"
    text = model.read_text()
    model.write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match="sha256"):
        OpTimeRegressor.load(d)
    model.write_text(text)
    meta_path = d / "op_time_model.json"
    meta = json.loads(meta_path.read_text())
    meta["feature_schema"]["version"] = 999
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(InputError, match="version"):
        OpTimeRegressor.load(d)
    meta["feature_schema"]["version"] = OP_FEATURE_SCHEMA.version
    meta["feature_schema"]["names"] = list(reversed(meta["feature_schema"]["names"]))
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(InputError, match="names"):
        OpTimeRegressor.load(d)
    meta_path.write_text("{not json")
    with pytest.raises(InputError):
        OpTimeRegressor.load(d)
    with pytest.raises(InputError, match="cannot read"):
        OpTimeRegressor.load(tmp_path / "nowhere")


def test_learned_cost_drives_the_simulator(fitted):
    run = make_run(GPT_SMALL, num_devices=2, tp=2, micro_batch_size=1, global_batch_size=2, precision="bf16")
    assert run.hardware.device.name == A100_LIKE["name"]
    cost = LearnedOpCost(run.hardware, fitted)
    res = simulate(run, cost=cost)
    assert res.iteration_time_s > 0 and np.isfinite(res.iteration_time_s)
    assert cost._cache  # ops were costed through the regressor


def test_learned_cost_uses_the_regressor_only_where_it_was_trained(fitted, tmp_path):
    from learnedperf.cost import RooflineCost

    # the synthetic records are fp32 and bf16 GEMMs on three accelerators, 600 in all
    assert set(fitted.coverage_) == {("accelerator", "matmul", "fp32"), ("accelerator", "matmul", "bf16")}
    assert sum(fitted.coverage_.values()) == 600
    run = make_run(GPT_SMALL, num_devices=1, precision="bf16")
    cost, roof = LearnedOpCost(run.hardware, fitted), RooflineCost(run.hardware)
    gemm = Op("g", "matmul", "fwd", 2.0 * 512 ** 3, 3.0 * 512 * 512 * 2, "bf16", (1, 512, 512, 512))
    half = Op("h", "matmul", "fwd", gemm.flops, gemm.bytes, "fp16", gemm.shape)  # no fp16 record
    soft = Op("s", "softmax", "fwd", 5.0 * 2 ** 20, 8.0 * 2 ** 20, "bf16", (1, 2 ** 20))  # no softmax record
    learned = fitted.predict_ops([gemm], run.hardware.device.to_dict())[0] * 1e-3
    assert cost.compute_time_s(gemm) == pytest.approx(learned, rel=1e-12)
    assert learned != pytest.approx(roof.compute_time_s(gemm), rel=1e-3)
    assert cost.compute_time_s(half) == roof.compute_time_s(half)
    assert cost.compute_time_s(soft) == roof.compute_time_s(soft)
    assert cost.costed == {"learned": 1, "roofline": 2}
    # a device with a measured bf16 GEMM curve is costed on its own curve, covered or not
    curves = {"matmul": {"bf16": {"tflops": 100.0, "overhead_us": 5.0, "dim_half": 64.0}}}
    timed = make_run(GPT_SMALL, num_devices=1, precision="bf16", device={**A100_LIKE, "kernel_curves": curves})
    timed_cost = LearnedOpCost(timed.hardware, fitted)
    assert RooflineCost(timed.hardware).has_curve(gemm) and not RooflineCost(timed.hardware).has_curve(soft)
    assert timed_cost.compute_time_s(gemm) == RooflineCost(timed.hardware).compute_time_s(gemm)
    assert timed_cost.costed == {"learned": 0, "roofline": 1}
    # a CPU is another device class: the accelerators' GEMMs do not cover it
    assert fitted.covers("dev-z", gemm) and not fitted.covers("cpu-some-host", gemm)
    # coverage is saved in the sidecar and read back; a matrix fit does not know the devices
    loaded = OpTimeRegressor.load(fitted.save(tmp_path / "m"))
    assert loaded.coverage_ == fitted.coverage_
    df = synthetic_records(60, 4)
    bare = OpTimeRegressor(n_estimators=5).fit(op_features(df), df["time_ms"])
    assert bare.coverage_ is None and bare.covers("cpu-some-host", soft)
    meta_path = tmp_path / "m" / "op_time_model.json"
    meta = json.loads(meta_path.read_text())
    meta["coverage"] = [["accelerator", "matmul", "bf16", 0]]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(InputError, match="coverage"):
        OpTimeRegressor.load(tmp_path / "m")


def test_a_kind_and_dtype_seen_on_too_few_devices_covers_only_those(tmp_path):
    # bf16 GEMMs on two devices (the lent H100 and H200 were one chip, two names), fp32 on all three: bf16 costs
    # the two by the trees and any other device by the roofline; fp32 costs every device of the class
    df = synthetic_records(600, 1)
    names = [d["name"] for d in DEVICES]
    assert len(names) == 3
    df = df[(df["dtype"] == "fp32") | (df["device_name"] != names[2])]
    reg = OpTimeRegressor(n_estimators=20, num_leaves=7).fit_records(df)
    assert reg.min_coverage_devices == 3
    assert reg.coverage_devices_[("accelerator", "matmul", "bf16")] == tuple(sorted(names[:2]))
    gemm = Op("g", "matmul", "fwd", 2.0 * 512 ** 3, 3.0 * 512 * 512 * 2, "bf16", (1, 512, 512, 512))
    single = Op("f", "matmul", "fwd", gemm.flops, 2 * gemm.bytes, "fp32", gemm.shape)
    assert reg.covers(names[0], gemm) and reg.covers(names[1], gemm)
    assert not reg.covers(names[2], gemm) and not reg.covers("another-gpu", gemm)
    assert all(reg.covers(n, single) for n in [*names, "another-gpu"])
    assert OpTimeRegressor(n_estimators=20, num_leaves=7, min_coverage_devices=2).fit_records(df).covers("x", gemm)
    # saved and read back; a sidecar from before device names were recorded covers as it did (any record)
    d = reg.save(tmp_path / "m")
    assert OpTimeRegressor.load(d).coverage_devices_ == reg.coverage_devices_
    assert not OpTimeRegressor.load(d).covers("another-gpu", gemm)
    meta_path = d / "op_time_model.json"
    meta = json.loads(meta_path.read_text())
    old = {k: v for k, v in meta.items() if k != "coverage_devices"}
    old["params"] = {k: v for k, v in meta["params"].items() if k != "min_coverage_devices"}
    meta_path.write_text(json.dumps(old))
    assert OpTimeRegressor.load(d).coverage_devices_ is None and OpTimeRegressor.load(d).covers("another-gpu", gemm)
    meta["coverage_devices"] = [["accelerator", "matmul", "bf16", []]]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(InputError, match="'coverage_devices' must be"):
        OpTimeRegressor.load(d)
    with pytest.raises(InputError, match="min_coverage_devices"):
        OpTimeRegressor(min_coverage_devices=0)


def test_excluded_features_do_not_change_predictions(fitted):
    X = op_features(synthetic_records(20, 5))
    X2 = X.copy()
    X2[:, OP_FEATURE_SCHEMA.index("num_sms")] += 1000.0  # an excluded raw device descriptor
    np.testing.assert_array_equal(fitted.predict(X2), fitted.predict(X))
    with pytest.raises(InputError):
        OpTimeRegressor(exclude_features=["no_such_feature"])


# ------------------------------------------------------------------ devices without an L2 size
def test_unknown_l2_size_is_missing_not_a_cache_of_no_bytes():
    op = Op("g", "matmul", "fwd", 2.0 * 512 ** 3, 3.0 * 512 * 512 * 4, "fp32", (1, 512, 512, 512))
    col, raw = OP_FEATURE_SCHEMA.index("log_bytes_per_l2"), OP_FEATURE_SCHEMA.index("l2_cache_MiB")
    known = op_features_from_ops([op], DEVICES[1])[0]
    assert known[col] == pytest.approx(np.log1p(op.bytes) - np.log1p(6.0 * 2 ** 20), rel=1e-6)
    no_l2 = {k: v for k, v in DEVICES[1].items() if k != "l2_cache_MiB"}
    # absent, null, or DeviceSpec's 0 default (the catalog's L4, T4): NaN in both cache columns
    for dev in (no_l2, {**no_l2, "l2_cache_MiB": None}, {**no_l2, "l2_cache_MiB": 0}):
        row = op_features_from_ops([op], dev)[0]
        assert np.isnan(row[col]) and np.isnan(row[raw])
        others = [j for j in range(len(row)) if j not in (col, raw)]
        np.testing.assert_array_equal(row[others], known[others])


def test_unknown_cache_rows_added_in_fit():
    from learnedperf.models.gbdt import UNKNOWN_CACHE_SHARE

    X = op_features(synthetic_records(40, 2))
    col = OP_FEATURE_SCHEMA.index("log_bytes_per_l2")
    X[:4, col] = np.nan  # rows of a device whose L2 size is already unknown are not copied
    y, w = np.arange(40.0), np.arange(40.0) + 100.0
    reg = OpTimeRegressor()
    assert reg.unknown_cache_share == UNKNOWN_CACHE_SHARE == 0.25
    X2, y2, w2 = reg._with_unknown_cache(X, y, w)
    assert X2.shape == (49, X.shape[1]) and len(y2) == len(w2) == 49  # round(0.25 × 36 known rows) = 9
    np.testing.assert_array_equal(X2[:40], X)
    added = y2[40:].astype(int)
    assert set(added) <= set(range(4, 40)) and len(set(added)) == 9
    assert np.isnan(X2[40:, col]).all()
    keep = [j for j in range(X.shape[1]) if j != col]
    np.testing.assert_array_equal(X2[40:][:, keep], X[added][:, keep])
    np.testing.assert_array_equal(w2[40:], w[added])
    for off in (OpTimeRegressor(unknown_cache_share=0),
                OpTimeRegressor(exclude_features=("num_sms", "log_bytes_per_l2"))):
        assert off._with_unknown_cache(X, y, w)[0] is X
    for bad in (-0.1, 1.5, "half", True):
        with pytest.raises(InputError, match="unknown_cache_share"):
            OpTimeRegressor(unknown_cache_share=bad)


def cache_records(n: int, seed: int) -> pd.DataFrame:
    """Memory-bound ops on two devices that differ only in L2 size (2 and 64 MiB): an op whose bytes
    exceed the cache takes 3× the roofline bound, one that fits takes the bound."""
    rng = np.random.default_rng(seed)
    base = {"peak_tflops": {"fp32": 10.0}, "memory_bandwidth_GBps": 500.0, "memory_GiB": 16.0,
            "num_sms": 40, "clock_MHz": 1500.0}
    rows = []
    for i in range(n):
        l2 = (2.0, 64.0)[i % 2]
        dev = {**base, "name": f"cache-{int(l2)}", "l2_cache_MiB": l2}
        nbytes = float(2 ** rng.uniform(19, 28))  # 0.5-256 MiB
        t_s = (3.0 if nbytes > l2 * 2 ** 20 else 1.0) * nbytes / 500e9
        rows.append({"op": "add", "kind": "elementwise", "direction": "fwd", "shape": json.dumps([int(nbytes / 8)]),
                     "params": "{}", "dtype": "fp32", "flops": nbytes / 8, "bytes": nbytes, "time_ms": t_s * 1e3,
                     "device": json.dumps(dev), "device_name": dev["name"]})
    return pd.DataFrame(rows)


def test_a_device_without_l2_size_gets_the_average_cache_not_an_edge():
    # An op of 16 MiB fits the 64-MiB cache (1× the bound) and not the 2-MiB one (3×). A device whose L2
    # size nobody knows gets what the training caches have in common: between the two, away from both
    # (about √3 in log); read as a cache of 0 bytes, or as LightGBM reads an unseen NaN (a working set the
    # cache's size), it would take one edge.
    model = OpTimeRegressor(n_estimators=100, num_leaves=15).fit_records(cache_records(800, 0))
    base = json.loads(cache_records(2, 0)["device"].iloc[0])
    op = Op("a", "elementwise", "fwd", 2.0 ** 21, 16.0 * 2 ** 20, "fp32", (2 ** 21,))
    bound_ms = op.bytes / 500e9 * 1e3
    ratio = {l2: model.predict_ops([op], {**base, "l2_cache_MiB": l2})[0] / bound_ms for l2 in (2.0, 64.0, None)}
    assert ratio[2.0] == pytest.approx(3.0, rel=0.1) and ratio[64.0] == pytest.approx(1.0, rel=0.1)
    assert 1.3 < ratio[None] < 2.3


# ------------------------------------------------------------------ how a model was trained
def test_sidecar_records_local_training_and_old_sidecars_load_as_unknown(fitted, tmp_path):
    assert (fitted.trained_with_, fitted.dask_workers_) == ("local", 0)
    d = fitted.save(tmp_path / "m")
    meta = json.loads((d / "op_time_model.json").read_text())
    assert meta["training"] == {"trained_with": "local", "dask_workers": 0}
    assert OpTimeRegressor.load(d).trained_with_ == "local"
    # a sidecar written before training was recorded still loads, and says it does not know
    del meta["training"]
    (d / "op_time_model.json").write_text(json.dumps(meta))
    assert OpTimeRegressor.load(d).trained_with_ == "unknown"
    meta["training"] = {"trained_with": "carrier-pigeon"}
    (d / "op_time_model.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="trained_with"):
        OpTimeRegressor.load(d)


# ------------------------------------------------------------------ device offsets
from learnedperf.models.gbdt import MAX_DEVICE_OFFSET, fit_device_offsets  # noqa: E402


def test_device_offsets_are_shrunk_medians_in_closed_form():
    # device x: 30 fp32 GEMMs at log residual 0.2, 10 fp32 softmaxes at -0.1, 10 bf16 GEMMs at 0.5;
    # device y: 5 fp32 GEMMs at 0.4; prior weight 20 records
    names = ["x"] * 50 + ["y"] * 5
    kinds = ["matmul"] * 30 + ["softmax"] * 10 + ["matmul"] * 10 + ["matmul"] * 5
    dtypes = ["fp32"] * 40 + ["bf16"] * 10 + ["fp32"] * 5
    r = [0.2] * 30 + [-0.1] * 10 + [0.5] * 10 + [0.4] * 5
    got = fit_device_offsets(names, kinds, dtypes, r, 20.0)
    x32 = 0.2 * 40 / 60  # the median of x's fp32 residuals, 40 records against a prior of 20
    x16 = 0.5 * 10 / 30
    y32 = 0.4 * 5 / 25
    expected = {"x": {"*/fp32": x32, "matmul/fp32": x32 + (0.2 - x32) * 30 / 50,
                      "softmax/fp32": x32 + (-0.1 - x32) * 10 / 30,
                      "*/bf16": x16, "matmul/bf16": x16 + (0.5 - x16) * 10 / 30},
                "y": {"*/fp32": y32, "matmul/fp32": y32 + (0.4 - y32) * 5 / 25}}
    assert got.keys() == expected.keys()
    for name, per in expected.items():
        assert got[name].keys() == per.keys()
        for key, value in per.items():
            assert got[name][key] == pytest.approx(value, abs=1e-6)
    # an absurd residual is clipped to what a sidecar may carry
    assert fit_device_offsets(["z"] * 1000, ["matmul"] * 1000, ["fp32"] * 1000, [9.0] * 1000, 20.0)["z"]["*/fp32"] \
        == MAX_DEVICE_OFFSET


def speed_records(n: int, seed: int) -> pd.DataFrame:
    """GEMMs on two devices with the same data sheet, one at 1× the roofline bound, one at 1.5×."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        name, factor = (("fast-gpu", 1.0), ("slow-gpu", 1.5))[i % 2]
        dev = {**DEVICES[1], "name": name}
        m, nn, k = (int(2 ** rng.uniform(6, 12)) for _ in range(3))
        flops, nbytes = 2.0 * m * nn * k, float((m * k + k * nn + m * nn) * 4)
        t_s = factor * max(flops / 14e12, nbytes / 900e9)
        rows.append({"op": "linear", "kind": "matmul", "direction": "fwd", "shape": json.dumps([1, m, nn, k]),
                     "params": "{}", "dtype": "fp32", "flops": flops, "bytes": nbytes, "time_ms": t_s * 1e3,
                     "device": json.dumps(dev), "device_name": name})
    return pd.DataFrame(rows)


def test_a_measured_device_gets_its_own_speed_and_an_unmeasured_one_the_average(tmp_path):
    # The data sheets are equal, so the trees can only learn the two devices' geometric mean, √1.5 ≈ 1.22× the
    # bound. Each device's own records say where it is (1× and 1.5×, shrunk by 400 / 420 in log); a device
    # of another name, and a dtype neither device was measured in, keep the trees' answer.
    records = speed_records(800, 0)
    model = OpTimeRegressor(n_estimators=80, num_leaves=15).fit_records(records)
    trees = OpTimeRegressor(n_estimators=80, num_leaves=15, device_offsets=False).fit_records(records)
    assert trees.device_offsets_ == {} and set(model.device_offsets_) == {"fast-gpu", "slow-gpu"}
    op = Op("mm", "matmul", "fwd", 2.0 * 1024 ** 3, 3 * 1024 ** 2 * 4.0, "fp32", (1, 1024, 1024, 1024))
    bound_ms = op.flops / 14e12 * 1e3
    shrink = 400 / 420

    def ratio(m, name, o=op):
        return m.predict_ops([o], {**DEVICES[1], "name": name})[0] / bound_ms

    mean = 1.5 ** 0.5
    assert ratio(trees, "slow-gpu") == pytest.approx(mean, rel=0.05)
    assert ratio(model, "other-gpu") == pytest.approx(mean, rel=0.05)
    assert ratio(model, "slow-gpu") == pytest.approx(mean * (1.5 / mean) ** shrink, rel=0.05)
    assert ratio(model, "fast-gpu") == pytest.approx(mean * (1.0 / mean) ** shrink, rel=0.05)
    bf16 = Op("mm", "matmul", "fwd", op.flops, op.bytes / 2, "bf16", op.shape)
    assert ratio(model, "slow-gpu", bf16) == pytest.approx(ratio(trees, "slow-gpu", bf16), rel=1e-6)
    # the records API applies each row's device, the learned cost model the run's
    per_row = model.predict_records(records) / trees.predict_records(records)
    slow = (records["device_name"] == "slow-gpu").to_numpy()
    assert np.all(per_row[slow] > 1.1) and np.all(per_row[~slow] < 0.95)
    hw = HardwareSpec.parse({"device": {**DEVICES[1], "name": "slow-gpu"}, "num_devices": 1, "devices_per_node": 1})
    assert LearnedOpCost(hw, model).compute_time_s(op) * 1e3 == pytest.approx(ratio(model, "slow-gpu") * bound_ms)
    # the offsets travel with the model
    loaded = OpTimeRegressor.load(model.save(tmp_path / "m"))
    assert loaded.device_offsets_ == model.device_offsets_
    assert ratio(loaded, "slow-gpu") == pytest.approx(ratio(model, "slow-gpu"), rel=1e-9)


def test_a_graph_op_is_never_costed_under_its_roofline_bound():
    # records at half the roofline bound (a kernel faster than the data sheet allows: NeuSight's "fp32"
    # convolutions ran in TF32 on the A100): the records API predicts what was measured, but the cost the
    # simulator gets never beats the device's peak, or an iteration's MFU could exceed 1
    records = speed_records(400, 1)
    records["time_ms"] = records["time_ms"] / records["device_name"].map({"fast-gpu": 1.0, "slow-gpu": 1.5}) * 0.5
    model = OpTimeRegressor(n_estimators=60, num_leaves=15).fit_records(records)
    bound = np.exp(op_features(records)[:, OP_FEATURE_SCHEMA.index("log_roofline_s")].astype(float)) * 1e3
    assert np.median(model.predict_records(records) / bound) == pytest.approx(0.5, rel=0.1)
    op = Op("mm", "matmul", "fwd", 2.0 * 1024 ** 3, 3 * 1024 ** 2 * 4.0, "fp32", (1, 1024, 1024, 1024))
    bound_ms = op.flops / 14e12 * 1e3
    for name in ("fast-gpu", "other-gpu"):
        assert model.predict_ops([op], {**DEVICES[1], "name": name})[0] == pytest.approx(bound_ms, rel=1e-5)  # float32 features


def test_device_offsets_in_a_sidecar_are_checked(fitted, tmp_path):
    d = fitted.save(tmp_path / "m")
    path = d / "op_time_model.json"
    meta = json.loads(path.read_text())
    for bad in ({"dev-a": {"matmul/fp32": 99.0}}, {"dev-a": {"matmul": 0.1}}, {"dev-a": {"matmul/fp32": "fast"}},
                {"dev-a": [0.1]}, ["dev-a"]):
        path.write_text(json.dumps({**meta, "device_offsets": bad}))
        with pytest.raises(InputError, match="device_offsets"):
            OpTimeRegressor.load(d)
    # a sidecar written before offsets were learnt loads with none
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "device_offsets"}))
    assert OpTimeRegressor.load(d).device_offsets_ == {}


@pytest.mark.parametrize("kwargs", [{"device_offsets": "yes"}, {"device_offset_prior_rows": 0},
                                    {"device_offset_prior_rows": float("nan")}, {"device_offset_prior_rows": True}])
def test_bad_device_offset_settings_are_refused(kwargs):
    with pytest.raises(InputError, match=next(iter(kwargs))):
        OpTimeRegressor(**kwargs)


def test_fit_rejects_something_that_is_not_a_dask_client():
    with pytest.raises(InputError, match="client: expected a dask.distributed.Client"):
        OpTimeRegressor(n_estimators=5).fit_records(synthetic_records(30, 0), client="tcp://127.0.0.1:8786")


# ------------------------------------------------------------------ training data
from learnedperf.models.gbdt import MEASURED_DIR, load_op_training_data  # noqa: E402
from learnedperf.measure.records import OP_COLUMNS  # noqa: E402


def test_training_data_from_the_repository_measurements():
    if not (MEASURED_DIR / "vm-xeon-2c" / "ops_cpu.parquet").is_file():
        pytest.skip(f"{MEASURED_DIR}/vm-xeon-2c not in this checkout")
    df = load_op_training_data(neusight=False)
    assert list(df.columns) == list(OP_COLUMNS) + ["provenance"]
    cpu = df[df["provenance"] == "datasets/measured/vm-xeon-2c"]
    raw = pd.read_parquet(MEASURED_DIR / "vm-xeon-2c" / "ops_cpu.parquet")
    assert len(cpu) == len(raw) and cpu["device_name"].iloc[0] == raw["device_name"].iloc[0]
    # the collectives file has no compute kind: left out, and counted
    assert not df["kind"].isin(["allreduce", "allgather", "reducescatter", "p2p"]).any()
    assert df.attrs["skipped"]["datasets/measured/vm-xeon-2c/ops_cpu_collectives.parquet: "
                               "collective records (costed by the collective model)"] == 64
    a = load_op_training_data(neusight=False, rows_per_device=500, seed=3)
    b = load_op_training_data(neusight=False, rows_per_device=500, seed=3)
    # 500 rows of each measured device (the repository's CPUs), the same rows for the same seed
    assert (a.groupby("device_name").size() == 500).all() and a.equals(b)
    assert not a.equals(load_op_training_data(neusight=False, rows_per_device=500, seed=4))


def test_training_data_names_a_corrupt_or_changed_file(tmp_path):
    good = synthetic_records(20, 0)
    for c in OP_COLUMNS:
        if c not in good.columns:
            good[c] = None
    d = tmp_path / "host-a"
    d.mkdir()
    good[list(OP_COLUMNS)].to_parquet(d / "ops_gpu.parquet")
    df = load_op_training_data([d], neusight=False)
    assert len(df) == 20 and set(df["provenance"]) == {str(d)}
    (d / "ops_bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputError, match="ops_bad.parquet"):
        load_op_training_data([d], neusight=False)
    (d / "ops_bad.parquet").unlink()
    good.drop(columns=["flops"]).to_parquet(d / "ops_bad.parquet")
    with pytest.raises(InputError, match=r"ops_bad.parquet: missing column\(s\) \['flops'\]"):
        load_op_training_data([d], neusight=False)
    (d / "ops_bad.parquet").unlink()
    # a manifest's checksum is checked before anything is read
    from learnedperf.measure.records import sha256_file

    (d / "manifest.json").write_text(json.dumps({"files": {"ops_gpu.parquet": {"sha256": sha256_file(d / "ops_gpu.parquet")}}}))
    assert len(load_op_training_data([d], neusight=False)) == 20
    good.iloc[:5][list(OP_COLUMNS)].to_parquet(d / "ops_gpu.parquet")
    with pytest.raises(InputError, match="ops_gpu.parquet: sha256 differs"):
        load_op_training_data([d], neusight=False)
    with pytest.raises(InputError, match="no such directory"):
        load_op_training_data([tmp_path / "nowhere"], neusight=False)
    with pytest.raises(InputError, match="rows_per_device"):
        load_op_training_data([d], neusight=False, rows_per_device=0)


def test_a_manifest_can_hold_its_operator_records_out_of_training(tmp_path):
    from learnedperf.measure.records import sha256_file

    good = synthetic_records(20, 0)
    for c in OP_COLUMNS:
        if c not in good.columns:
            good[c] = None
    dirs = []
    for name in ("kept", "held"):
        d = tmp_path / name
        d.mkdir()
        good[list(OP_COLUMNS)].to_parquet(d / "ops_gpu.parquet")
        dirs.append(d)
    files = {"ops_gpu.parquet": {"sha256": sha256_file(dirs[1] / "ops_gpu.parquet")}}

    def manifest(entry):
        (dirs[1] / "manifest.json").write_text(json.dumps({"files": files, "operator_training": entry}))

    manifest({"use": False, "why": "timed on a host that binds them"})
    df = load_op_training_data(dirs, neusight=False)
    # the held-out set's 20 records are counted, with the manifest's reason; the other set's are all there
    assert len(df) == 20 and set(df["provenance"]) == {str(dirs[0])}
    assert df.attrs["skipped"] == {f"{dirs[1]}/ops_gpu.parquet: held out of operator training by its manifest "
                                   "(timed on a host that binds them)": 20}
    manifest({"use": True, "why": "kept"})
    assert len(load_op_training_data(dirs, neusight=False)) == 40
    for bad in ({"use": "no", "why": "x"}, {"use": False}, {"use": False, "why": " "}, False, ["use"]):
        manifest(bad)
        with pytest.raises(InputError, match="'operator_training' must be"):
            load_op_training_data(dirs, neusight=False)


def test_the_pipeline_regressor_learns_accelerator_kernels_only():
    from learnedperf.graph.ops import Op
    from learnedperf.measure.public import default_shared_data
    from learnedperf.models.pipeline import fit_op_regressor

    if not (default_shared_data() / "neusight_ops.parquet").exists():
        pytest.skip("../shared/data/neusight_ops.parquet not available")
    reg = fit_op_regressor(rows_per_device=200, n_estimators=5)
    # the repository's CPU records are loaded but left out: CPU ops keep their measured curves and roofline
    assert {cls for cls, _kind, _dtype in reg.coverage_} == {"accelerator"}
    op = Op("mm", "matmul", "fwd", flops=2 * 256**3, bytes=3 * 4 * 256**2, dtype="fp32", shape=(1, 256, 256, 256))
    assert reg.covers("V100-PCIE-32GB", op) and not reg.covers("cpu-amd-epyc-1t", op)
