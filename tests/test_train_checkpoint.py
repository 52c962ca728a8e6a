"""``learnedperf evaluate`` / ``train`` / ``predict --checkpoint`` end to end on a tiny data set, and
checkpoint verification (tampered, truncated, altered, incompatible checkpoints)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from learnedperf.checkpoint import MANIFEST, load_checkpoint
from learnedperf.cli import main
from learnedperf.data import load_records, run_generate
from learnedperf.errors import InputError
from learnedperf.models.evaluate import MEASURED_SCALE_THRESHOLD
from learnedperf.models.shapes import SHAPES_VERSION
from learnedperf.simulate import simulate

TINY_GNN = ["--gnn", "pretrain_epochs=1", "--gnn", "finetune_epochs=1", "--gnn", "hidden=8", "--gnn",
            "num_layers=1"]
RUN = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8}, "strategy": {"tp": 2}}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """30 simulated runs plus every measured run of the repository and vTrain."""
    out = tmp_path_factory.mktemp("ds") / "data"
    run_generate(30, out, seed=5, workers=1, progress=False, shard_size=15)
    return out


@pytest.fixture(scope="module")
def gnn_checkpoint(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ck") / "gnn"
    assert main(["train", "--data", str(data), "--out", str(out), "--method", "gnn_residual", "--no-progress",
                 "--limit-simulated", "20", "--surrogate-runs", "300", "--surrogate-near-runs", "100",
                 *TINY_GNN]) == 0
    return out


def test_evaluate_simulator_mape_matches_records(data, tmp_path, capsys):
    """The report's simulator MAPE on the unseen-scale split equals the one computed from the records."""
    report = tmp_path / "report.json"
    assert main(["evaluate", "--data", str(data), "--methods", "simulator,formula", "--splits", "unseen_scale",
                 "--out", str(report), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| unseen_scale |" in out and "Kendall tau" in out
    rep = json.loads(report.read_text())
    df = load_records(data)
    test = df[(df.source == "measured") & (df.num_devices > MEASURED_SCALE_THRESHOLD)]
    expected = float(np.mean(np.abs(test.sim_iteration_time_ms / test.iteration_time_ms - 1)) * 100)
    entry = rep["splits"]["unseen_scale"]
    assert entry["test_measured"] == len(test)
    assert entry["methods"]["simulator"]["mape"] == pytest.approx(expected, rel=1e-9)
    # the formula predicts one time per (model, cluster, batch): it cannot order strategies
    assert entry["methods"]["formula"]["kendall_tau"] == 0.0
    assert entry["methods"]["simulator"]["kendall_tau"] > 0.3
    assert 0.0 <= entry["methods"]["simulator"]["coverage"] <= 1.0
    assert {p["method"] for p in rep["predictions"]} == {"simulator", "formula"}


def test_evaluate_records_device_kernels_and_refuses_a_negative_count(data, tmp_path, capsys):
    report = tmp_path / "report.json"
    assert main(["evaluate", "--data", str(data), "--methods", "simulator", "--splits", "unseen_scale",
                 "--device-kernels", "30", "--out", str(report), "--no-progress"]) == 0
    assert json.loads(report.read_text())["device_kernels"] == 30
    capsys.readouterr()
    assert main(["evaluate", "--data", str(data), "--device-kernels", "-1"]) == 2
    assert "--device-kernels" in capsys.readouterr().err
    # such a report's devices were partly measured: it must not calibrate the interval of unseen ones
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "c"), "--method", "simulator",
                 "--evaluation", str(report), "--no-progress", "--surrogate-runs", "0"]) == 2
    assert "made with --device-kernels 30" in capsys.readouterr().err


def test_excluded_rows_keep_k_kernels_of_each_held_out_device():
    from learnedperf.models.pipeline import excluded_rows

    names = ["gpu-a"] * 10 + ["gpu-b"] * 5 + ["gpu-c"] * 3
    held = {"gpu-a", "gpu-c"}.__contains__
    assert excluded_rows(names, held).tolist() == [n in ("gpu-a", "gpu-c") for n in names]
    mask = excluded_rows(names, held, keep=4, seed=0)
    # gpu-a keeps 4 of its 10 rows, gpu-c all of its 3, gpu-b was never held out
    assert mask[:10].sum() == 6 and not mask[10:15].any() and not mask[15:].any()
    assert (excluded_rows(names, held, keep=4, seed=0) == mask).all()
    assert (excluded_rows(names, held, keep=4, seed=1) != mask).any()
    with pytest.raises(InputError, match="device_kernels"):
        excluded_rows(names, held, keep=-1)


def test_evaluate_rejects_unknown_method(data, capsys):
    assert main(["evaluate", "--data", str(data), "--methods", "oracle"]) == 2
    assert "unknown method" in capsys.readouterr().err


def test_train_needs_method_or_report(data, tmp_path, capsys):
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "c")]) == 2
    assert "--evaluation" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["train", "evaluate"])
@pytest.mark.parametrize("item, match", [
    ("hiden=8", "unknown GNN parameter(s) ['hiden']"),
    ("mode=direct", "'mode' is set by the method"),
    ("ensemble=0", "ensemble: must be >= 1, got 0"),
    ("hidden=abc", "invalid literal for int()"),
])
def test_bad_gnn_parameters_are_refused_before_any_data_is_read(cmd, item, match, tmp_path, capsys):
    # the data directory does not exist: the parameter is checked first, in one line, exit status 2
    args = ["--data", str(tmp_path / "absent"), "--gnn", item]
    args += ["--out", str(tmp_path / "c"), "--method", "gnn_residual"] if cmd == "train" else ["--methods", "gnn_direct"]
    assert main([cmd, *args]) == 2
    err = capsys.readouterr().err
    assert f"learnedperf {cmd}: error: --gnn: " in err and match in err and "Traceback" not in err


def test_cross_fitted_gnn_calibrates_each_measured_run_on_the_network_that_did_not_see_it(data):
    from learnedperf.models.dataset import load_runs
    from learnedperf.models.iteration import IterationModel, fold_index

    runs = load_runs(data, limit_simulated=20, progress=False)
    gnn = {"pretrain_epochs": 1, "finetune_epochs": 1, "hidden": 8, "num_layers": 1}
    fold = fold_index(runs.records, 3, seed=0)
    measured = runs.measured
    assert set(fold[measured].tolist()) == {0, 1, 2} and set(fold[~measured].tolist()) == {-1}
    model = IterationModel("gnn_residual", gnn_params=gnn, folds=3).fit(runs)
    assert model.gnn_.ensemble == 3 and model.n_train_measured_ == measured.sum()
    assert model.interval_.n_calibration_ == measured.sum()  # every measured run calibrates
    # the measured times of fold 0 changed tenfold: network 0, which left them out, is the same network
    changed = runs.records.copy()
    changed.loc[fold == 0, "iteration_time_ms"] *= 10.0
    other = IterationModel("gnn_residual", gnn_params=gnn, folds=3).fit(replace(runs, records=changed))
    sub = runs.subset(measured)
    a = model.gnn_.predict_log_members(model.samples(sub))
    b = other.gnn_.predict_log_members(other.samples(sub))
    assert np.array_equal(a[0], b[0]) and not np.allclose(a[1], b[1]) and not np.allclose(a[2], b[2])


def test_cross_fitted_formula_mfu_is_the_mean_of_the_folds_logs(data):
    from learnedperf.models.dataset import load_runs
    from learnedperf.models.iteration import IterationModel, fold_index, ideal_time_ms

    runs = load_runs(data, limit_simulated=5, progress=False)
    m = runs.measured
    fold = fold_index(runs.records, 4, seed=2)
    ratio = ideal_time_ms(runs.specs) / runs.records["iteration_time_ms"].to_numpy()
    mfus = [np.exp(np.mean(np.log(ratio[m & (fold != k)]))) for k in range(4)]
    model = IterationModel("formula", folds=4, seed=2).fit(runs)
    assert model.mfu_ == pytest.approx(np.exp(np.mean(np.log(mfus))), rel=1e-12)
    assert model.interval_.n_calibration_ == m.sum()
    with pytest.raises(InputError, match="folds: expected 0 .* or an integer >= 2, got 1"):
        IterationModel("formula", folds=1)
    with pytest.raises(InputError, match="folds=3 trains one network per fold; GNN parameter ensemble=2"):
        IterationModel("gnn_direct", gnn_params={"ensemble": 2}, folds=3)


@pytest.mark.parametrize("extra, match", [
    (["--folds", "1"], "--folds: expected 0 or an integer >= 2, got '1'"),
    (["--folds", "3", "--gnn", "ensemble=2"], "--folds 3 trains one network per fold; --gnn ensemble=2 differs"),
])
def test_bad_folds_are_refused_in_one_line(extra, match, tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "absent"), "--out", str(tmp_path / "c"), "--method",
                 "gnn_residual", *extra]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--surrogate-runs", "--surrogate-near-runs"])
def test_train_refuses_a_negative_surrogate_run_count(data, tmp_path, capsys, flag):
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "c"), "--method", "simulator",
                 flag, "-5"]) == 2
    assert f"{flag}: expected a number >= 0, got -5" in capsys.readouterr().err


def test_simulator_checkpoint_predicts_the_simulator(data, tmp_path, capsys):
    ck = tmp_path / "sim"
    assert main(["train", "--data", str(data), "--out", str(ck), "--method", "simulator", "--no-progress",
                 "--surrogate-runs", "0"]) == 0
    capsys.readouterr()
    run = tmp_path / "run.json"
    run.write_text(json.dumps(RUN))
    # without a surrogate the fast tier is refused by name, not answered some other way
    assert main(["predict", "--checkpoint", str(ck), "--run", str(run)]) == 1
    assert "no surrogate for tier 'fast'" in capsys.readouterr().err
    assert main(["predict", "--checkpoint", str(ck), "--run", str(run), "--format", "json", "--tier", "full"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["iteration_time_ms"] == pytest.approx(simulate(RUN).iteration_time_s * 1e3, rel=1e-12)
    assert pred["source"] == f"checkpoint:{ck.name}:simulator"
    lo, hi = pred["interval_ms"]
    assert lo <= pred["iteration_time_ms"] <= hi and lo < hi


def test_train_with_evaluation_widens_novel_runs(data, tmp_path, capsys):
    """--evaluation: the interval's novelty classes are calibrated on the report's leave-domain-out
    predictions of the method, say which splits they used, and widen a run beyond the training scale."""
    from learnedperf.specs import RunSpec

    report = tmp_path / "report.json"
    assert main(["evaluate", "--data", str(data), "--methods", "simulator", "--splits", "unseen_scale",
                 "--out", str(report), "--no-progress"]) == 0
    ck = tmp_path / "sim"
    assert main(["train", "--data", str(data), "--out", str(ck), "--method", "simulator", "--evaluation",
                 str(report), "--no-progress", "--surrogate-runs", "0"]) == 0
    assert "novel runs on leave-domain-out residuals (unseen_device: n=" in capsys.readouterr().out
    n_test = json.loads(report.read_text())["splits"]["unseen_scale"]["test_measured"]
    manifest = json.loads((ck / MANIFEST).read_text())
    novelty = manifest["interval"]["novelty"]
    assert novelty["unseen_scale"]["calibrated_on"] == {"splits": {"unseen_scale": n_test}, "fallback": False}
    assert novelty["unseen_device"]["calibrated_on"]["fallback"] and novelty["unseen_device"]["n"] == n_test
    assert manifest["interval"]["domain"]["max_num_devices"] == 8  # vTrain's largest measured run
    assert manifest["training_data"]["used"]["novelty_calibration"]["residuals"]["unseen_scale"] == n_test
    interval = load_checkpoint(ck).interval
    specs = [RunSpec.from_dict(RUN), RunSpec.from_dict({**RUN, "hardware": {"cluster": "dgx-a100", "num_devices": 64}})]
    assert interval.novelties(specs) == ["in_domain", "unseen_scale"]
    (lo_in, lo_out), (hi_in, hi_out) = interval.interval_for_specs([100.0, 100.0], specs)
    assert lo_out <= lo_in and hi_out >= hi_in


def test_gnn_checkpoint_round_trip(gnn_checkpoint, data, tmp_path, capsys):
    manifest = json.loads((gnn_checkpoint / MANIFEST).read_text())
    assert manifest["method"] == "gnn_residual"
    assert "gnn/gnn.safetensors" in manifest["files"] and not list(gnn_checkpoint.rglob("*.pt"))
    assert manifest["versions"]["torch"] and manifest["feature_schema"]["graph"]
    assert manifest["normalisation"] is not None
    assert manifest["training_data"]["used"]["by_origin"]["vtrain"] > 0
    ck = load_checkpoint(gnn_checkpoint)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(RUN))
    assert main(["predict", "--checkpoint", str(gnn_checkpoint), "--run", str(run), "--format", "json",
                 "--tier", "full"]) == 0
    pred = json.loads(capsys.readouterr().out)
    sim_ms = simulate(RUN).iteration_time_s * 1e3
    assert pred["simulator_iteration_time_ms"] == pytest.approx(sim_ms, rel=1e-12)
    assert pred["iteration_time_ms"] == pytest.approx(sim_ms * pred["breakdown_scale"], rel=1e-9)
    assert pred["tokens_per_second"] * pred["iteration_time_ms"] == pytest.approx(
        simulate(RUN).to_prediction()["tokens_per_second"] * sim_ms, rel=1e-9)
    lo, hi = pred["interval_ms"]
    assert lo <= pred["iteration_time_ms"] <= hi
    assert ck.interval.coverage == pytest.approx(0.9)
    # the fast tier, distilled from this checkpoint's full tier: same memory, time within its fidelity bounds
    fid = manifest["surrogate_fidelity"]
    assert fid["n_labelled"] + fid["n_failed"] == 300 and fid["log_lower"] <= 0 <= fid["log_upper"]
    # and on 100 runs near the data set's measured ones, anchored on every (model, hardware) pair they have
    near = fid["near"]
    assert near["n_labelled"] + near["n_failed"] == 100 and near["n_holdout"] > 0 and near["holdout_mape"] >= 0
    df = load_records(data, sources=("measured",))
    used = df[df.graph_shard.notna() & (df.sim_iteration_time_ms > 0) & (df.iteration_time_ms > 0)]
    pairs = {json.dumps([(r := json.loads(x))["model"], r["hardware"]], sort_keys=True) for x in used.run}
    assert near["n_anchor_groups"] == len(pairs) > 10
    assert main(["predict", "--checkpoint", str(gnn_checkpoint), "--run", str(run), "--format", "json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["source"] == pred["source"] + ":fast" and fast["peak_memory_GiB"] == pred["peak_memory_GiB"]
    assert fast["interval_ms"][0] <= fast["iteration_time_ms"] <= fast["interval_ms"][1]


def test_distillation_near_no_anchors_or_bad_ones_is_refused_before_labelling(gnn_checkpoint):
    from learnedperf.predict import Predictor, distil_surrogate

    predictor = Predictor.load(gnn_checkpoint)
    with pytest.raises(InputError, match="needs anchor runs"):
        distil_surrogate(predictor, n=100, n_near=10, anchors=[])
    with pytest.raises(InputError, match=r"anchors\[0\]: not a valid run"):
        distil_surrogate(predictor, n=100, n_near=10, anchors=[{**RUN, "strategy": {"tp": 3}}])


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_tampered_weights_are_refused(gnn_checkpoint, tmp_path, capsys):
    ck = _copy(gnn_checkpoint, tmp_path)
    f = ck / "gnn" / "gnn.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(InputError, match="gnn.safetensors: sha256 differs"):
        load_checkpoint(ck)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(RUN))
    assert main(["predict", "--checkpoint", str(ck), "--run", str(run)]) == 1
    err = capsys.readouterr().err
    assert "sha256 differs" in err and "Traceback" not in err


def test_truncated_and_altered_checkpoints_are_refused(gnn_checkpoint, tmp_path):
    ck = _copy(gnn_checkpoint, tmp_path)
    (ck / MANIFEST).write_text((ck / MANIFEST).read_text()[:200])
    with pytest.raises(InputError, match="manifest.json"):
        load_checkpoint(ck)
    ck2 = tmp_path / "extra"
    shutil.copytree(gnn_checkpoint, ck2)
    (ck2 / "gnn" / "extra.bin").write_bytes(b"x")
    with pytest.raises(InputError, match="not listed"):
        load_checkpoint(ck2)
    ck3 = tmp_path / "missing"
    shutil.copytree(gnn_checkpoint, ck3)
    (ck3 / "gnn" / "gnn.json").unlink()
    with pytest.raises(InputError, match="missing"):
        load_checkpoint(ck3)
    with pytest.raises(InputError, match="no checkpoint manifest"):
        load_checkpoint(tmp_path / "nowhere")


@pytest.mark.parametrize("key, value, match", [
    ("compat.simulator_version", "0.0.0-old", "incompatible checkpoint: simulator_version"),
    ("compat.graph_feature_schema_version", 99, "incompatible checkpoint: graph_feature_schema_version"),
    # operator features v1 read an unknown L2 size as a cache of 0 bytes: its regressors are not v2's
    ("compat.op_feature_schema_version", 1, "incompatible checkpoint: op_feature_schema_version is 1, this code has 2"),
    ("format_version", 7, "format version 7"),
    ("method", "oracle", "unknown method"),
])
def test_incompatible_checkpoints_are_refused(gnn_checkpoint, tmp_path, key, value, match):
    ck = _copy(gnn_checkpoint, tmp_path)
    manifest = json.loads((ck / MANIFEST).read_text())
    node = manifest
    *path, last = key.split(".")
    for p in path:
        node = node[p]
    node[last] = value
    (ck / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=match):
        load_checkpoint(ck)


def test_a_checkpoint_of_another_simulator_is_refused(gnn_checkpoint, monkeypatch):
    """The simulator changed behaviour since training (its fingerprint moved, its version did not): the
    checkpoint's correction is of another simulator's times, and loading it says so."""
    load_checkpoint(gnn_checkpoint)  # this code's simulator: loads
    monkeypatch.setattr("learnedperf.simulate.fingerprint.simulator_fingerprint", lambda: "0123456789abcdef")
    with pytest.raises(InputError, match="incompatible checkpoint: simulator_fingerprint is '[0-9a-f]{16}', "
                                         "this code has '0123456789abcdef'"):
        load_checkpoint(gnn_checkpoint)


def test_a_data_set_of_another_simulator_is_refused(data, tmp_path, monkeypatch, capsys):
    """Training and evaluation read the simulated times the data set stores: another simulator's are
    refused in one line, before anything is fitted."""
    monkeypatch.setattr("learnedperf.simulate.fingerprint.simulator_fingerprint", lambda: "0123456789abcdef")
    for argv in (["train", "--data", str(data), "--out", str(tmp_path / "ck"), "--method", "simulator"],
                 ["evaluate", "--data", str(data), "--methods", "simulator", "--out", str(tmp_path / "r.json")]):
        assert main([*argv, "--no-progress"]) != 0
        err = capsys.readouterr().err
        assert "was generated by a simulator with fingerprint" in err and "generate it again" in err
        assert "Traceback" not in err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "r.json").exists()


def _report(methods: dict) -> dict:
    return {"methods": list(methods), "predictions": [],
            "splits": {"unseen_scale": {"test_measured": 3, "methods": {m: {"mape": v} for m, v in methods.items()}},
                       "random": {"test_measured": 2, "methods": {m: {"mape": 0.0} for m in methods}}}}


def test_choose_method_uses_unseen_splits_only():
    from learnedperf.models.pipeline import choose_method

    best, means, _ = choose_method(_report({"simulator": 8.0, "gnn_residual": 6.5}))
    assert best == "gnn_residual" and means == {"simulator": 8.0, "gnn_residual": 6.5}
    with pytest.raises(InputError, match="scores no method"):
        choose_method({"methods": ["simulator"], "splits": {}})


def test_choose_method_weighs_criteria_not_device_splits():
    from learnedperf.models.pipeline import choose_method

    def split(mapes):
        return {"test_measured": 3, "methods": {m: {"mape": v} for m, v in mapes.items()}}

    # "a" wins three device splits and loses scale badly; "b" is even. Split by split "a" would win
    # ((2+2+2+10)/4 = 4 < 5); with the devices one criterion it loses ((2+10)/2 = 6 > 5)
    report = {"methods": ["a", "b"], "predictions": [],
              "splits": {"unseen_device:A100": split({"a": 2.0, "b": 5.0}),
                         "unseen_device:Xeon": split({"a": 2.0, "b": 5.0}),
                         "unseen_device:V100": split({"a": 2.0, "b": 5.0}),
                         "unseen_scale": split({"a": 10.0, "b": 5.0})}}
    best, means, _ = choose_method(report)
    assert best == "b" and means == {"a": 6.0, "b": 5.0}


def test_choose_method_counts_the_held_out_hopper_as_a_device():
    """The lent H100's and H200's steps are held out together as ``unseen_device:Hopper``: one more draw of an
    unseen device. "a" is better on the A100 and far worse on Hopper: (2 + 12) / 2 = 7 against 5."""
    from learnedperf.models.pipeline import choose_method

    def split(mapes):
        return {"test_measured": 3, "methods": {m: {"mape": v} for m, v in mapes.items()}}

    report = {"methods": ["a", "b"], "predictions": [],
              "splits": {"unseen_device:A100": split({"a": 2.0, "b": 5.0}),
                         "unseen_device:Hopper": split({"a": 12.0, "b": 5.0})}}
    best, means, _ = choose_method(report)
    assert best == "b" and means == {"a": 7.0, "b": 5.0}


def test_choose_method_breaks_a_near_tie_by_the_worst_split():
    """A lead smaller than the standard error of the split differences is a tie, and the lower worst split wins;
    a lead beyond it stands. With b's scale split at 10.79, "a" leads "b" by 0.04 points over the four criteria
    while losing the V100 by 8 points: differences (b - a) 0.5, 0.5, -8, 0.5, 0.5, 0.5, 0.79, standard error
    1.22. With it at 30, a leads by 4.84 points, differences ... 20, standard error 3.22."""
    from learnedperf.models.pipeline import choose_method

    def split(mapes):
        return {"test_measured": 3, "methods": {m: {"mape": v} for m, v in mapes.items()}}

    def report(b_scale):
        return {"methods": ["a", "b"], "predictions": [],
                "splits": {"unseen_device:A100": split({"a": 10.0, "b": 10.5}),
                           "unseen_device:Xeon": split({"a": 7.0, "b": 7.5}),
                           "unseen_device:V100": split({"a": 20.9, "b": 12.9}),
                           "unseen_device:T4": split({"a": 9.0, "b": 9.5}),
                           "unseen_family": split({"a": 10.0, "b": 10.5}),
                           "unseen_strategy": split({"a": 8.0, "b": 8.5}),
                           "unseen_scale": split({"a": 10.0, "b": b_scale})}}

    best, means, why = choose_method(report(30.0))
    # devices (11.725 vs 10.1), family, strategy, scale: a (11.725+10+8+10)/4 = 9.93125, b (10.1+10.5+8.5+30)/4
    assert means == {"a": 9.931, "b": 14.775}
    assert best == "a" and why == "lowest mean MAPE over the unseen criteria"
    best, means, why = choose_method(report(10.79))
    assert means["b"] - means["a"] < 0.05
    assert best == "b" and "lowest worst unseen split (12.90 %)" in why and "a 9.93 (worst 20.90)" in why


def test_merge_reports():
    from learnedperf.models.evaluate import merge_reports

    merged = merge_reports([_report({"gnn_residual": 6.5}), _report({"simulator": 8.0})])
    assert merged["methods"] == ["simulator", "gnn_residual"]  # METHODS order
    assert set(merged["splits"]["unseen_scale"]["methods"]) == {"simulator", "gnn_residual"}
    with pytest.raises(InputError, match="more than one report"):
        merge_reports([_report({"simulator": 8.0}), _report({"simulator": 7.0})])
    other = _report({"formula": 50.0})
    other["splits"]["unseen_scale"]["test_measured"] = 4
    with pytest.raises(InputError, match="different test sets"):
        merge_reports([_report({"simulator": 8.0}), other])


@pytest.mark.parametrize("key, value, match", [
    ("folds", 5, r"differ in their folds: 0, 5"),  # a report without "folds" was calibrated on a held-out share
    ("seed", 1, r"differ in their seed: None, 1"),
    ("gnn_params", {"hidden": 8}, r"differ in their GNN parameters"),
    ("data", {"dataset_manifest_sha256": "ab"}, r"differ in their data set: None, 'ab'"),
    # a held-out device with 100 of its kernels measured is another experiment than an unseen one
    ("device_kernels", 100, r"differ in their kernels of the held-out devices: 0, 100"),
])
def test_merge_reports_refuses_reports_trained_differently(key, value, match):
    from learnedperf.models.evaluate import merge_reports

    other = _report({"formula": 50.0})
    other[key] = value
    with pytest.raises(InputError, match=match):
        merge_reports([_report({"simulator": 8.0}), other])


def test_merge_reports_of_disjoint_splits():
    """The same methods evaluated on disjoint splits (two processes with --splits) merge into the report one
    process would have written; a split scored by the same method twice is refused."""
    from learnedperf.models.evaluate import merge_reports

    whole = _report({"simulator": 8.0, "gnn_residual": 6.5})
    whole["predictions"] = [{"split": s, "method": m} for s in whole["splits"] for m in whole["methods"]]
    parts = []
    for split in whole["splits"]:
        part = {**whole, "splits": {split: whole["splits"][split]},
                "predictions": [p for p in whole["predictions"] if p["split"] == split]}
        parts.append(part)
    merged = merge_reports(parts)
    assert merged["splits"] == whole["splits"]
    assert sorted(map(str, merged["predictions"])) == sorted(map(str, whole["predictions"]))
    assert merged["methods"] == ["simulator", "gnn_residual"]
    with pytest.raises(InputError, match="'random': method.*'simulator'.*more than one report"):
        merge_reports([parts[1], _report({"simulator": 7.0})])


def test_merge_reports_refuses_other_training_sets():
    from learnedperf.models.evaluate import merge_reports

    a, b = _report({"simulator": 8.0}), _report({"formula": 50.0})
    a["splits"]["unseen_scale"]["train"] = {"simulated": 1500, "measured": 800}
    b["splits"]["unseen_scale"]["train"] = {"simulated": 1000, "measured": 800}  # another --limit-simulated
    with pytest.raises(InputError, match="'unseen_scale': the reports have different training sets"):
        merge_reports([a, b])


def test_a_cpu_split_refits_the_measured_device_constants_without_that_cpu(data):
    """refit_measured_constants on the EPYC split: the measured-device constants are fitted on the Xeon's
    single-process steps alone, every CPU step is simulated with them (each step simulated again here), and
    every other run is left as it was."""
    from learnedperf.cost import RooflineCost, default_params
    from learnedperf.models.dataset import load_runs
    from learnedperf.models.evaluate import refit_measured_constants, test_mask

    runs = load_runs(data)
    test = test_mask(runs.records, "unseen_device:EPYC")
    refit, fitted = refit_measured_constants(runs, test)
    assert list(fitted["fit_on"]) == ["datasets/measured/vm-xeon-2c"] and fitted["fit_on"]["datasets/measured/vm-xeon-2c"] > 0
    params = replace(default_params(), curve_efficiency=fitted["curve_efficiency"],
                     curve_memory_efficiency=fitted["curve_memory_efficiency"])
    cpu = np.array([s.hardware.device.kernel_curves is not None for s in runs.specs])
    assert cpu[test].all() and cpu.sum() > test.sum()  # the EPYC's steps and the Xeon's
    for i in np.flatnonzero(cpu)[::7]:
        spec = runs.specs[i]
        want = simulate(spec, cost=RooflineCost(spec.hardware, params)).iteration_time_s * 1e3
        assert refit.sim_ms[i] == pytest.approx(want, rel=1e-12)
        assert refit.records["sim_iteration_time_ms"].iat[i] == pytest.approx(want, rel=1e-12)
        assert refit.records["iteration_time_ms"].iat[i] == runs.records["iteration_time_ms"].iat[i]  # measured
    assert not np.allclose(refit.sim_ms[cpu], runs.sim_ms[cpu])
    assert (refit.sim_ms[~cpu] == runs.sim_ms[~cpu]).all()
    assert all(refit.graphs[i] is runs.graphs[i] for i in np.flatnonzero(~cpu))


def test_a_device_split_with_no_measured_run_is_skipped_before_a_regressor_is_fitted(tmp_path):
    # a data set with no measured run on a Hopper GPU (the repository's CPU data sets and vTrain):
    # its split is skipped with the reason, and no operator regressor is fitted without the Hopper kernels
    # (minutes on the full data) just to find that out
    from learnedperf.data.generate import repo_measured_dir
    from learnedperf.models.evaluate import OP_DEVICE_HOLDOUT, evaluate
    from learnedperf.models.pipeline import _loader

    cpus = [str(d) for d in sorted(repo_measured_dir().iterdir()) if any(d.glob("steps_cpu*.parquet"))]
    assert cpus, "the repository's measured CPU data sets"
    data = tmp_path / "data"
    run_generate(20, data, seed=5, workers=1, progress=False, shard_size=10, measured_paths=cpus,
                 neusight=False)  # vTrain: unseen_scale's test runs
    fitted = []
    report = evaluate(_loader(data, False, 20, node_times=False), methods=("simulator",),
                      splits=("unseen_scale", "unseen_device:Hopper"),
                      op_regressor_for=lambda exclude: fitted.append(exclude))
    assert report["splits"]["unseen_device:Hopper"]["skipped"] == "no measured test run"
    assert "methods" in report["splits"]["unseen_scale"]
    assert fitted == [None] and OP_DEVICE_HOLDOUT["unseen_device:Hopper"] not in fitted


# the columns that set one device's layer shapes in vTrain's runs (every other key field is one value there)
VTRAIN_SHAPE = ["num_layers", "hidden_size", "num_attention_heads", "tp", "micro_batch_size"]


def _vtrain_medians(records, rows) -> dict:
    """Median log(measured / simulated) of vTrain's ``rows`` per layer shape, from the records' own columns."""
    df = records[rows & (records["origin"] == "vtrain").to_numpy()]
    r = np.log(df["iteration_time_ms"] / df["sim_iteration_time_ms"])
    return r.groupby([df[c] for c in VTRAIN_SHAPE]).agg(["median", "size"]).to_dict("index")


def test_the_simulators_shape_memory_is_each_layer_shapes_median_miss(data):
    from learnedperf.models.dataset import load_runs
    from learnedperf.models.iteration import IterationModel

    runs = load_runs(data, limit_simulated=5, progress=False)
    model = IterationModel("simulator+shapes").fit(runs)
    rec = runs.records
    expected = _vtrain_medians(rec, runs.measured)
    p = model.predict_point(runs)
    sim = runs.sim_ms
    vt = (rec["origin"] == "vtrain").to_numpy()
    for i in np.flatnonzero(vt)[::37]:
        shape = tuple(rec[c].iat[i] for c in VTRAIN_SHAPE)
        assert p[i] == pytest.approx(sim[i] * np.exp(expected[shape]["median"]), rel=1e-9)
    # a simulated run on a device nobody measured is the simulator's answer
    unmeasured = ~runs.measured & ~rec["device_type"].isin(set(rec.loc[runs.measured, "device_type"])).to_numpy()
    assert unmeasured.any() and np.array_equal(p[unmeasured], sim[unmeasured])
    # its interval is calibrated on each run corrected by its key's runs of other strategy groups only
    assert model.interval_.n_calibration_ == runs.measured.sum()
    with pytest.raises(InputError, match="has its shape memory already"):
        model.with_shapes()


def test_evaluation_of_shapes_uses_the_training_sides_runs_of_each_test_runs_shape(data, tmp_path):
    report = tmp_path / "report.json"
    assert main(["evaluate", "--data", str(data), "--methods", "simulator,simulator+shapes", "--splits",
                 "unseen_strategy", "--out", str(report), "--no-progress"]) == 0
    rep = json.loads(report.read_text())
    df = load_records(data).reset_index(drop=True)
    test = ((df.tp > 1) & (df.pp > 1)).to_numpy() | (df.virtual_pipeline_stages > 1).to_numpy()
    measured = (df.source == "measured").to_numpy()
    expected = _vtrain_medians(df, measured & ~test)
    sim = {p["run_id"]: p["predicted_ms"] for p in rep["predictions"] if p["method"] == "simulator"}
    rows = df.set_index("run_id")
    hits = 0
    for p in (p for p in rep["predictions"] if p["method"] == "simulator+shapes"):
        if p["shape_runs"] == 0:
            assert p["predicted_ms"] == sim[p["run_id"]]  # nothing measured of its shape: the simulator's answer
            continue
        r = rows.loc[p["run_id"]]
        if r["origin"] == "vtrain":
            e = expected[tuple(r[c] for c in VTRAIN_SHAPE)]
            assert p["shape_runs"] == e["size"]
            assert p["predicted_ms"] == pytest.approx(sim[p["run_id"]] * np.exp(e["median"]), rel=1e-9)
            hits += 1
    assert hits >= 300  # vTrain's tp x pp mixes: their layers ran under tp-only or pp-only strategies too


def test_a_shapes_checkpoint_applies_its_memory_in_both_tiers_and_verifies_it(data, tmp_path, capsys):
    import hashlib

    from learnedperf.predict import Predictor

    ck = tmp_path / "shapes"
    assert main(["train", "--data", str(data), "--out", str(ck), "--method", "simulator+shapes", "--no-progress",
                 "--surrogate-runs", "200", "--surrogate-near-runs", "50"]) == 0
    capsys.readouterr()
    df = load_records(data)
    row = df[(df.origin == "vtrain") & (df.tp == 2) & (df.pp == 2)].iloc[0]
    expected = _vtrain_medians(df.reset_index(drop=True), (df.source == "measured").to_numpy())
    e = expected[tuple(row[c] for c in VTRAIN_SHAPE)]
    pred = Predictor.load(ck)
    full = pred.predict(json.loads(row["run"]), tier="full")
    assert full["shape_runs"] == e["size"] and full["source"] == f"checkpoint:{ck.name}:simulator+shapes"
    assert full["iteration_time_ms"] == pytest.approx(full["simulator_iteration_time_ms"] * np.exp(e["median"]),
                                                      rel=1e-9)
    fast = pred.predict(json.loads(row["run"]), tier="fast")
    assert fast["shape_runs"] == e["size"]
    assert pred.predict(RUN, tier="full")["shape_runs"] == 0  # a shape nobody measured: no factor
    run_file = tmp_path / "vtrain.json"
    run_file.write_text(row["run"])
    assert main(["predict", "--checkpoint", str(ck), "--run", str(run_file), "--tier", "full"]) == 0
    assert f"corrected by {e['size']} measured run(s) of these layer shapes" in capsys.readouterr().out
    # the memory is a verified file: tampered, malformed (its sha256 updated) or missing, one clear error
    bad = _copy(ck, tmp_path)
    (bad / "shapes.json").write_text((bad / "shapes.json").read_text().replace("0.", "1.", 1))
    with pytest.raises(InputError, match="shapes.json: sha256 differs"):
        load_checkpoint(bad)
    manifest = json.loads((bad / MANIFEST).read_text())
    (bad / "shapes.json").write_text(json.dumps({"version": SHAPES_VERSION, "min_runs": 1, "over": "model",
                                                 "table": {"x": [0.1, 2]}}))
    digest = hashlib.sha256((bad / "shapes.json").read_bytes()).hexdigest()
    manifest["files"]["shapes.json"] = digest
    (bad / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="shapes.json: its entry in manifest.json must be an object"):
        load_checkpoint(bad)  # a bare hash where an entry belongs
    manifest["files"]["shapes.json"] = {"bytes": (bad / "shapes.json").stat().st_size, "sha256": digest}
    (bad / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"shapes.json: key 'x' is not a shape key"):
        load_checkpoint(bad)
    other = tmp_path / "method"
    shutil.copytree(ck, other)
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["method"] = "simulator"
    (other / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="has no shape memory, but components lists one"):
        load_checkpoint(other)
    del manifest["components"]["shapes"], manifest["files"]["shapes.json"]
    manifest["method"] = "simulator+shapes"
    (other / "shapes.json").unlink()
    (other / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="method 'simulator\\+shapes' needs components.shapes"):
        load_checkpoint(other)


TINY_PARAMS = {"pretrain_epochs": 1, "finetune_epochs": 1, "hidden": 8, "num_layers": 1}


@pytest.fixture(scope="module")
def residual_model(data):
    """A cross-fitted tiny gnn_residual on the data set, and its runs."""
    from learnedperf.models.dataset import load_runs
    from learnedperf.models.iteration import IterationModel

    runs = load_runs(data, limit_simulated=20, progress=False)
    return IterationModel("gnn_residual", gnn_params=TINY_PARAMS, folds=2).fit(runs), runs


def _with_simulator(model, simulator_ms):
    """``model``'s +shapes variant as if the simulator had answered ``simulator_ms`` on its calibration runs."""
    import copy

    other = copy.copy(model)
    other.calibration_simulator_ms_ = np.asarray(simulator_ms, dtype=float)
    return other.with_shapes()


def test_a_correcting_models_memory_is_over_the_base_that_holds_out_better(residual_model):
    from learnedperf.models.dataset import strategy_group
    from learnedperf.models.iteration import IterationModel
    from learnedperf.models.shapes import ShapeMemory, shape_key

    model, runs = residual_model
    y = model.calibration_records_["iteration_time_ms"].to_numpy(dtype=float)
    keys = [shape_key(s) for s in model.calibration_specs_]
    groups = strategy_group(model.calibration_records_)
    # each base's held-out MAPE on the corrected calibration runs, recomputed here from the two bases' answers
    expected = {}
    for over, base in (("model", model.base_calibration_pred_ms_), ("simulator", model.calibration_simulator_ms_)):
        factor, n = ShapeMemory().leave_group_out(keys, np.log(y / base), groups)
        hit = np.asarray(n) > 0
        expected[over] = float(np.mean(np.abs(base[hit] * np.exp(np.asarray(factor)[hit]) / y[hit] - 1)) * 100)
    shaped = model.with_shapes()
    assert hit.sum() >= 300  # vTrain's runs share their layer shapes across pipeline depths
    assert shaped.shape_choice_ == pytest.approx(expected, rel=1e-9)
    assert shaped.shapes_.over == min(expected, key=expected.get)
    # a simulator that missed every calibration run by the same 10 % is exact after its memory: it is chosen, and
    # a hit is the simulator's time of the run times 1.1; a run without a hit keeps the model's answer
    exact = _with_simulator(model, y / 1.1)
    assert exact.shapes_.over == "simulator" and exact.shape_choice_["simulator"] == pytest.approx(0.0, abs=1e-9)
    p, _lo, _hi, n = exact.predict(runs, shape_runs=True)
    hit = n > 0
    assert hit.any() and (~hit).any()
    assert np.allclose(p[hit], runs.sim_ms[hit] * 1.1, rtol=1e-9)
    assert np.allclose(p[~hit], model.predict_point(runs)[~hit], rtol=1e-9)
    # a simulator that missed each run by its own random ±70 % has nothing a median can carry: the model is kept
    rng = np.random.default_rng(0)
    noisy = _with_simulator(model, y * np.exp(rng.uniform(-0.7, 0.7, len(y))))
    assert noisy.shapes_.over == "model" and noisy.shape_choice_["simulator"] > noisy.shape_choice_["model"]
    # the simulator methods have only their own answer
    assert set(IterationModel("simulator").fit(runs).with_shapes().shape_choice_) == {"model"}


def test_a_memory_over_the_simulator_multiplies_the_simulators_time_in_both_tiers(residual_model, data, tmp_path):
    from learnedperf.checkpoint import add_surrogate, save_checkpoint
    from learnedperf.models.pipeline import data_description
    from learnedperf.models.surrogate import SurrogateRegressor
    from learnedperf.predict import Predictor, distil_surrogate
    from learnedperf.specs import RunSpec

    model, _runs = residual_model
    y = model.calibration_records_["iteration_time_ms"].to_numpy(dtype=float)
    shaped = _with_simulator(model, y / 1.1)  # every median log(measured / simulator) is log 1.1
    ck = tmp_path / "over"
    save_checkpoint(ck, shaped, data_description(data))
    surrogate, fidelity = distil_surrogate(Predictor.load(ck), n=200)
    assert fidelity["simulator"]["log_lower"] <= 0.0 <= fidelity["simulator"]["log_upper"]
    add_surrogate(ck, surrogate, fidelity)
    pred = Predictor.load(ck)
    df = load_records(data)
    row = df[(df.origin == "vtrain") & (df.tp == 2) & (df.pp == 2)].iloc[0]
    run = json.loads(row["run"])
    full = pred.predict(run, tier="full")
    assert full["shape_runs"] > 0
    assert full["iteration_time_ms"] == pytest.approx(full["simulator_iteration_time_ms"] * 1.1, rel=1e-9)
    fast = pred.predict(run, tier="fast")
    _ctx, _mem, x, at = pred._features(RunSpec.from_dict(run))
    sim_fast = float(pred.checkpoint.surrogate.predict_simulator(np.asarray([x]), [at.total_s])[0])
    assert fast["shape_runs"] == full["shape_runs"]
    assert fast["iteration_time_ms"] == pytest.approx(sim_fast * 1.1, rel=1e-9)
    # a run of a shape nobody measured is the model's own answer in both tiers
    assert pred.predict(RUN, tier="full")["iteration_time_ms"] == pytest.approx(
        pred.predict_with_result(RUN, shapes=False)[0]["iteration_time_ms"], rel=1e-12)
    assert pred.predict(RUN, tier="fast")["shape_runs"] == 0
    # a surrogate without the simulator model cannot answer those hits fast: refused at load, with the reason
    plain = SurrogateRegressor(n_estimators=20).fit(np.asarray([x, x]), [10.0, 11.0], [0.01, 0.01])
    add_surrogate(ck, plain, {"log_lower": -0.1, "log_upper": 0.1})
    with pytest.raises(InputError, match="the memory is over the simulator, but the surrogate has no simulator model"):
        load_checkpoint(ck)
