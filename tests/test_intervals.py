"""Novelty-aware conformal intervals: the training domain, leave-domain-out quantiles, JSON state."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from learnedperf.data.records import DOMAIN_COLUMNS, spec_columns
from learnedperf.errors import InputError
from learnedperf.models.evaluate import novelty_residuals
from learnedperf.models.intervals import (IN_DOMAIN, NOVELTY_CLASSES, ConformalInterval, TrainingDomain,
                                          conformal_log_bounds, conformal_quantile, novelty_of_split,
                                          pooled_conformal_quantile)
from learnedperf.specs import RunSpec

A100_8 = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8}}

#: an interval dict as checkpoints wrote it before the training domain existed
OLD_FORMAT = {"coverage": 0.9, "method": "split-conformal on log(measured/predicted)", "min_group_size": 30,
              "n_calibration": 216,
              "quantiles": {"*": {"log_lower": -0.159, "log_upper": 0.149, "n": 216},
                            "accelerator": {"log_lower": -0.127, "log_upper": 0.082, "n": 190}}}


def spec(model: str = "gpt3-1.3b", cluster: str = "dgx-a100", num_devices: int = 8) -> RunSpec:
    return RunSpec.from_dict({"model": model, "hardware": {"cluster": cluster, "num_devices": num_devices}})


@pytest.fixture(scope="module")
def domain() -> TrainingDomain:
    """Measured training runs: GPT and BERT on A100s, up to 8 devices."""
    return TrainingDomain.from_records(pd.DataFrame({"device_type": ["A100-SXM4-80GB"] * 3,
                                                     "arch": ["gpt", "bert", "gpt"], "num_devices": [2, 8, 4]}))


@pytest.mark.parametrize("model, cluster, num_devices, expected", [
    ("gpt3-1.3b", "dgx-a100", 8, IN_DOMAIN),
    ("bert-large", "dgx-a100", 2, IN_DOMAIN),
    ("gpt3-1.3b", "dgx-a100", 16, "unseen_scale"),
    ("llama-2-7b", "dgx-a100", 8, "unseen_family"),
    ("gpt3-1.3b", "dgx-h100", 8, "unseen_device"),
    # several at once: device before family before scale
    ("llama-2-7b", "dgx-h100", 64, "unseen_device"),
    ("llama-2-7b", "dgx-a100", 64, "unseen_family"),
])
def test_novelty_classification(domain, model, cluster, num_devices, expected):
    assert domain.novelty(spec(model, cluster, num_devices)) == expected


def test_domain_reads_the_record_columns_of_the_evaluation_splits(domain):
    """A domain built from records (spec_columns) puts those very runs in-domain; a synthetic device
    counts as its catalog base, as the records' device_type does."""
    specs = [spec(), spec("bert-large", num_devices=2)]
    records = pd.DataFrame([spec_columns(s, {"i": i}) for i, s in enumerate(specs)])
    built = TrainingDomain.from_records(records)
    assert [built.novelty(s) for s in specs] == [IN_DOMAIN, IN_DOMAIN]
    assert built.families == ("bert", "gpt") and built.max_num_devices == 8 and built.n_runs == 2
    assert built.device_classes == ("accelerator",)
    device = spec().hardware.device.to_dict()
    device["name"] = "synthetic-A100-SXM4-80GB-3"
    synthetic = RunSpec.from_dict({"model": "gpt3-1.3b", "hardware": {"device": device, "num_devices": 8,
                                                                      "devices_per_node": 8}})
    assert domain.novelty(synthetic) == IN_DOMAIN
    with pytest.raises(InputError, match="device_type"):
        TrainingDomain.from_records(records.drop(columns=["device_type"]))
    assert set(DOMAIN_COLUMNS) <= set(records.columns)


def test_novelty_of_split():
    assert novelty_of_split("unseen_device:Xeon") == "unseen_device"
    assert novelty_of_split("unseen_family") == "unseen_family"
    assert novelty_of_split("unseen_scale") == "unseen_scale"
    # held-out strategies and fully sharded states are both combinations the training runs lacked
    assert novelty_of_split("unseen_strategy") == "unseen_strategy"
    assert novelty_of_split("unseen_sharding") == "unseen_strategy"
    assert novelty_of_split("random") is None


def _fitted(domain=None) -> ConformalInterval:
    """In-domain quantiles exactly ±0.1 (cpu group ±0.5): 19 residuals per group, ranks 1 and 19."""
    r_acc, r_cpu = np.linspace(-0.1, 0.1, 19), np.linspace(-0.5, 0.5, 19)
    pred = np.full(38, 100.0)
    true = pred * np.exp(np.r_[r_acc, r_cpu])
    return ConformalInterval(0.9, min_group_size=10).fit(pred, true, ["accelerator"] * 19 + ["cpu"] * 19,
                                                         domain=domain)


def test_novelty_quantiles_follow_the_rank_formula():
    # n = 99, coverage 0.9: upper rank ceil(100 * 0.95) = 95, lower rank floor(100 * 0.05) = 5
    r = (np.arange(1, 100) - 50) / 100.0
    rng = np.random.default_rng(0)
    ci = _fitted().fit_novelty({"unseen_family": rng.permutation(r)}, {"unseen_family": {"splits": {"s": 99}}})
    q = ci.novelty_["unseen_family"]
    assert q["log_lower"] == pytest.approx(-0.45) and q["log_upper"] == pytest.approx(0.45) and q["n"] == 99
    assert q["calibrated_on"] == {"splits": {"s": 99}}
    assert ci.bounds("accelerator", "unseen_family") == (pytest.approx(-0.45), pytest.approx(0.45))
    # n = 19: the ranks are the extremes
    assert conformal_log_bounds(np.linspace(-0.3, 0.2, 19), 0.9) == {"log_lower": pytest.approx(-0.3),
                                                                     "log_upper": pytest.approx(0.2), "n": 19}
    with pytest.raises(InputError, match="unseen_weather"):
        ci.fit_novelty({"unseen_weather": r})


def test_novelty_never_narrows_the_device_class_pair():
    ci = _fitted().fit_novelty({"unseen_scale": np.linspace(-0.2, 0.2, 19)})
    assert ci.bounds("accelerator", "unseen_scale") == (pytest.approx(-0.2), pytest.approx(0.2))
    assert ci.bounds("cpu", "unseen_scale") == (pytest.approx(-0.5), pytest.approx(0.5))  # cpu is wider already
    assert ci.bounds("accelerator", "unseen_device") == ci.bounds("accelerator")  # class not calibrated
    with pytest.raises(InputError, match="novelty class"):
        ci.bounds("cpu", "unseen_moon")


def test_interval_for_specs_widens_novel_runs(domain):
    ci = _fitted(domain).fit_novelty({"unseen_device": np.linspace(-0.3, 0.6, 19), "unseen_scale": np.zeros(19)})
    specs = [spec(), spec(cluster="dgx-h100"), spec(num_devices=16)]
    assert ci.novelties(specs) == [IN_DOMAIN, "unseen_device", "unseen_scale"]
    lo, hi = ci.interval_for_specs([100.0] * 3, specs)
    assert lo[0] == pytest.approx(100 * math.exp(-0.1)) and hi[0] == pytest.approx(100 * math.exp(0.1))
    assert lo[1] == pytest.approx(100 * math.exp(-0.3)) and hi[1] == pytest.approx(100 * math.exp(0.6))
    # zero residuals: the in-domain pair stays
    assert lo[2] == pytest.approx(lo[0]) and hi[2] == pytest.approx(hi[0])
    # without a domain every run is in-domain: the device-class behaviour
    no_domain = _fitted().fit_novelty({"unseen_device": np.linspace(-0.3, 0.6, 19)})
    lo2, hi2 = no_domain.interval_for_specs([100.0] * 3, specs)
    assert np.allclose(lo2, lo[0]) and np.allclose(hi2, hi[0])


def test_round_trip(domain):
    ci = _fitted(domain).fit_novelty({"unseen_family": np.linspace(-0.4, 0.3, 30)},
                                     {"unseen_family": {"splits": {"unseen_family": 30}, "fallback": False}})
    again = ConformalInterval.from_dict(json.loads(json.dumps(ci.to_dict())))
    assert again.domain_ == domain
    assert again.novelty_ == ci.novelty_ and again.quantiles_ == ci.quantiles_
    assert again.to_dict() == ci.to_dict()
    specs = [spec("llama-2-7b"), spec()]
    assert np.allclose(again.interval_for_specs([50.0, 50.0], specs), ci.interval_for_specs([50.0, 50.0], specs))


def test_old_format_still_loads():
    ci = ConformalInterval.from_dict(OLD_FORMAT)
    assert ci.domain_ is None and ci.novelty_ == {}
    lo, hi = ci.interval_for_specs([100.0], [spec("llama-2-7b", "dgx-h100", 64)])
    assert lo[0] == pytest.approx(100 * math.exp(-0.127)) and hi[0] == pytest.approx(100 * math.exp(0.082))
    assert ConformalInterval.from_dict(ci.to_dict()).to_dict() == ci.to_dict()


def test_a_device_with_enough_runs_is_calibrated_on_its_own():
    """Groups are (device type on one device or several, device class): a device with min_group_size runs of
    that kind gets the split-conformal pair of its own residuals, one with fewer its class's pair over all the
    class's runs, an unknown class the pooled pair."""
    from learnedperf.models.dataset import device_group, interval_group

    rng = np.random.default_rng(3)
    r_a, r_h, r_v, r_cpu = (rng.normal(0, s, n) for s, n in ((0.05, 300), (0.3, 40), (0.2, 10), (0.1, 60)))
    types = ["A100-SXM4-80GB"] * 300 + ["H100-SXM5-80GB"] * 40 + ["V100-PCIE-32GB"] * 10 + ["cpu-x"] * 60
    devices = [8] * 300 + [1] * 110  # the A100 runs on a node, the others on one device
    groups = interval_group(pd.DataFrame({"device_type": types, "num_devices": devices}))
    assert groups[0] == ("device:A100-SXM4-80GB:multi", "accelerator")
    assert groups[-1] == ("device:cpu-x:single", "cpu")
    r = np.concatenate([r_a, r_h, r_v, r_cpu])
    ci = ConformalInterval(0.9, min_group_size=30).fit(np.full(len(r), 100.0), 100.0 * np.exp(r), groups)

    def pair(x):
        q = conformal_log_bounds(x, 0.9)
        return q["log_lower"], q["log_upper"]

    assert ci.bounds(device_group("H100-SXM5-80GB", 1)) == pytest.approx(pair(r_h))
    assert ci.bounds(device_group("A100-SXM4-80GB", 64)) == pytest.approx(pair(r_a))
    # 10 V100 runs: too few of its own, so the class's 350
    assert "device:V100-PCIE-32GB:single" not in ci.quantiles_
    assert ci.bounds(device_group("V100-PCIE-32GB", 1)) == pytest.approx(pair(np.concatenate([r_a, r_h, r_v])))
    assert ci.bounds(device_group("L40S", 1)) == ci.bounds("accelerator")
    assert ci.bounds(("device:tpu-v5:single", "tpu")) == pytest.approx(pair(r))
    # the Hopper's own pair is wider than the class's, which the A100 runs dominate
    lo, hi = ci.bounds(device_group("H100-SXM5-80GB", 1))
    c_lo, c_hi = ci.bounds("accelerator")
    assert hi - lo > 2 * (c_hi - c_lo)
    # measured on one H100 only: a run on eight keeps the class's pair, and an A100 on one device too
    assert ci.bounds(device_group("H100-SXM5-80GB", 8)) == ci.bounds("accelerator")
    assert ci.bounds(device_group("A100-SXM4-80GB", 1)) == ci.bounds("accelerator")
    again = ConformalInterval.from_dict(json.loads(json.dumps(ci.to_dict())))
    assert again.bounds(device_group("H100-SXM5-80GB", 1)) == ci.bounds(device_group("H100-SXM5-80GB", 1))
    # a spec reads its group the same way: one H100 gets the H100's pair, eight the class's
    lo_ms, hi_ms = again.interval_for_specs([100.0, 100.0], [spec("llama-2-7b", "dgx-h100", 1),
                                                             spec("llama-2-7b", "dgx-h100", 8)])
    assert (lo_ms[0], hi_ms[0]) == pytest.approx((100 * math.exp(lo), 100 * math.exp(hi)))
    assert (lo_ms[1], hi_ms[1]) == pytest.approx((100 * math.exp(c_lo), 100 * math.exp(c_hi)))


def _with(key: str, value) -> dict:
    good = _fitted(TrainingDomain(("A100-SXM4-80GB",), ("gpt",), 8, 3)).fit_novelty(
        {"unseen_scale": np.linspace(-0.2, 0.2, 19)}).to_dict()
    part, _, field = key.partition(".")
    if field:
        good[part] = dict(good[part], **{field: value}) if value is not None else \
            {k: v for k, v in good[part].items() if k != field}
    else:
        good[part] = value
    return good


@pytest.mark.parametrize("bad, match", [
    (_with("domain.families", None), "lacks key 'families'"),
    (_with("domain.devices", "A100"), "'devices' must be a list of strings"),
    (_with("domain.max_num_devices", "eight"), "max_num_devices"),
    (_with("domain.n_runs", 0), "n_runs"),
    (_with("domain", ["A100"]), "training domain must be a JSON object"),
    (_with("novelty", {"unseen_weather": {"log_lower": -0.1, "log_upper": 0.1, "n": 3}}), "unseen_weather"),
    (_with("novelty", {"unseen_scale": {"log_lower": -0.1, "n": 3}}), "unseen_scale.*lacks key 'log_upper'"),
    (_with("novelty", {"unseen_scale": {"log_lower": 0.1, "log_upper": 0.2, "n": 3}}), "invalid bounds"),
    (_with("novelty", [1, 2]), "'novelty' must be a JSON object"),
])
def test_malformed_dicts_name_the_key(bad, match):
    with pytest.raises(InputError, match=match):
        ConformalInterval.from_dict(bad)


def test_novelty_residuals_pool_splits_and_fall_back():
    def rows(split, method, pairs):
        return [{"split": split, "method": method, "predicted_ms": p, "measured_ms": m} for p, m in pairs]

    report = {"predictions": rows("unseen_device:A", "m", [(10, 20)] * 3) + rows("unseen_device:B", "m", [(10, 5)])
              + rows("unseen_family", "m", [(10, 10)] * 2) + rows("random", "m", [(10, 99)])
              + rows("unseen_scale", "other", [(10, 30)])}
    ratios, calibrated_on = novelty_residuals(report, "m")
    assert set(ratios) == set(NOVELTY_CLASSES)
    assert list(ratios["unseen_device"]) == ["unseen_device:A", "unseen_device:B"]  # kept apart: equal weights
    assert list(ratios["unseen_device"]["unseen_device:A"]) == pytest.approx([math.log(2)] * 3)
    assert list(ratios["unseen_device"]["unseen_device:B"]) == pytest.approx([math.log(0.5)])
    assert calibrated_on["unseen_device"] == {"splits": {"unseen_device:A": 3, "unseen_device:B": 1},
                                              "fallback": False}
    # no unseen_scale split for method m: every unseen split is pooled, never the in-domain 'random' one
    assert calibrated_on["unseen_scale"]["fallback"] and sum(map(len, ratios["unseen_scale"].values())) == 6
    _, cal = novelty_residuals(report, "m", leave_out=("unseen_device:A",))
    assert cal["unseen_device"]["splits"] == {"unseen_device:B": 1}
    assert novelty_residuals(report, "absent") == ({}, {})
    with pytest.raises(InputError, match="predicted_ms"):
        novelty_residuals({"predictions": [{"split": "unseen_family", "method": "m", "measured_ms": 1.0}]}, "m")
    with pytest.raises(InputError, match="unseen_family"):
        novelty_residuals({"predictions": rows("unseen_family", "m", [(-1.0, 2.0)])}, "m")


def test_iteration_model_records_the_measured_training_domain():
    """The simulator method on hand-made runs: the domain holds the measured runs only."""
    from learnedperf.models.dataset import Runs
    from learnedperf.models.iteration import IterationModel

    specs = [spec(num_devices=n) for n in (2, 4, 8)] + [spec("llama-2-7b", "dgx-h100", 64)]
    records = pd.DataFrame([spec_columns(s, {"i": i}) for i, s in enumerate(specs)])
    records["source"] = ["measured"] * 3 + ["simulated"]
    records["iteration_time_ms"] = [100.0, 110.0, 90.0, 50.0]
    n = len(specs)
    runs = Runs(records, specs, [None] * n, [{}] * n, np.full(n, 100.0))
    model = IterationModel("simulator").fit(runs)
    dom = model.interval_.domain_
    assert dom == TrainingDomain(("A100-SXM4-80GB",), ("gpt",), 8, 3, ("dp",))
    assert model.interval_.novelties(specs) == [IN_DOMAIN] * 3 + ["unseen_device"]


@pytest.mark.parametrize("n", [1, 7, 19, 99, 250])
@pytest.mark.parametrize("level", [0.05, 0.1, 0.5, 0.9, 0.95])
def test_pooled_quantile_of_one_group_is_split_conformal(n, level):
    r = np.random.default_rng(n).normal(size=n)
    assert pooled_conformal_quantile([r], level) == conformal_quantile(r, level)


def test_pooled_quantile_weighs_groups_not_runs():
    """999 small errors of one held-out device and 19 large ones of another: by runs the large ones are
    2 % of the mass and the 95 % bound ignores them; by device they are half of it."""
    small = np.linspace(-0.1, 0.1, 999)
    large = np.full(19, 1.0)
    by_runs = conformal_quantile(np.concatenate([small, large]), 0.95)
    assert by_runs < 0.1
    # F(x) = (#small <= x / 999 + #large <= x / 19) / 2 reaches 0.95 only at the large errors
    assert pooled_conformal_quantile([small, large], 0.95) == 1.0
    # lower tail, on the negated errors: the large group's 19 give F = 0.5 first; the small group must
    # add 0.45 = k / 1998, k = 899.1 -> 900 of its negated errors: its 100th smallest error
    assert pooled_conformal_quantile([small, large], 0.05) == np.sort(small)[99]
    bounds = conformal_log_bounds({"A": small, "B": large}, 0.9)
    assert bounds == {"log_lower": np.sort(small)[99], "log_upper": 1.0, "n": 1018, "groups": 2}
    ci = ConformalInterval().fit(np.ones(50), np.ones(50)).fit_novelty({"unseen_device": {"A": small, "B": large}})
    assert ci.bounds(None, "unseen_device")[1] == 1.0
    with pytest.raises(InputError, match="finite"):
        ConformalInterval().fit(np.ones(50), np.ones(50)).fit_novelty({"unseen_device": {"A": [np.inf]}})


def test_pooled_quantile_reaches_its_level_with_groups_of_few_runs():
    """Eight held-out devices of 3 runs each, errors 0.01 .. 0.24: split conformal's n + 1 per group would
    leave a quarter of the mass out of reach and the 95 % bound at the largest error of all (0.24). The
    equally weighted empirical CDFs put 1/24 on each error, and F reaches 0.95 at the 23rd: 23/24 = 0.958."""
    errors = np.arange(1, 25) / 100.0
    groups = [errors[i::8] for i in range(8)]
    assert pooled_conformal_quantile(groups, 0.95) == pytest.approx(0.23)
    # and the lower tail likewise at the 2nd smallest (F of the negated errors reaches 0.95 at 23 of 24)
    assert pooled_conformal_quantile(groups, 0.05) == pytest.approx(0.02)


def _run(tp=1, pp=1, **strategy) -> RunSpec:
    return RunSpec.from_dict({**A100_8, "strategy": {"tp": tp, "pp": pp, **strategy}})


def test_strategy_signature_names_the_techniques_a_run_combines():
    from learnedperf.data.records import spec_strategy_signature, strategy_signature

    assert spec_strategy_signature(_run()) == "dp"
    assert spec_strategy_signature(_run(2, 2, pipeline_schedule="interleaved", virtual_pipeline_stages=2,
                                        zero_stage=1, global_batch_size=8)) == "tp+pp+interleaved+zero1"
    assert spec_strategy_signature(_run(fsdp=True)) == "zero3"  # FSDP's FULL_SHARD is ZeRO-3
    assert spec_strategy_signature(_run(fsdp=True, zero_stage=2)) == "zero2"
    assert spec_strategy_signature(_run(8)) == "tp"  # one data-parallel rank: nothing more
    assert strategy_signature(1, 1, 1, 1, 1, 0, "1f1b") == "single"
    assert strategy_signature(2, 4, 2, 2, 4, 0, "1f1b") == "tp+pp+cp+ep+dp"  # sizes do not count


def test_a_combination_of_techniques_no_measured_run_had_is_novel():
    specs = [_run(), _run(2), _run(2, 2)]
    records = pd.DataFrame([spec_columns(s, {"i": i}) for i, s in enumerate(specs[:2])])
    dom = TrainingDomain.from_records(records)
    assert dom.strategies == ("dp", "tp+dp")
    assert [dom.novelty(s) for s in specs] == [IN_DOMAIN, IN_DOMAIN, "unseen_strategy"]
    assert dom.novelty(_run(fsdp=True)) == "unseen_strategy"
    # scale before strategy: a run beyond the measured scale is an unseen scale whatever its strategy
    big = RunSpec.from_dict({**A100_8, "hardware": {"cluster": "dgx-a100", "num_devices": 16},
                             "strategy": {"tp": 2, "pp": 2}})
    assert dom.novelty(big) == "unseen_scale"
    # the JSON round trip keeps the strategies; a domain written before them has none: nothing is novel by strategy
    again = TrainingDomain.from_dict(json.loads(json.dumps(dom.to_dict())))
    assert again == dom
    older = {k: v for k, v in dom.to_dict().items() if k != "strategies"}
    assert TrainingDomain.from_dict(older).novelty(_run(2, 2)) == IN_DOMAIN
    with pytest.raises(InputError, match="'strategies' must be a list of strings"):
        TrainingDomain.from_dict({**older, "strategies": "dp"})


def test_a_run_new_in_several_respects_gets_the_wider_side_of_each(domain):
    # device pair wide below, scale pair wide above: a run on an unseen device at an unseen scale gets both
    ci = _fitted(domain).fit_novelty({"unseen_device": np.linspace(-0.6, 0.2, 19),
                                      "unseen_scale": np.linspace(-0.2, 0.7, 19)})
    both = spec(cluster="dgx-h100", num_devices=64)
    assert domain.novelty_classes(both) == ("unseen_device", "unseen_scale")
    assert domain.novelty(both) == "unseen_device"  # the first, as before
    lo, hi = ci.interval_for_specs([100.0], [both])
    assert lo[0] == pytest.approx(100 * math.exp(-0.6)) and hi[0] == pytest.approx(100 * math.exp(0.7))
    assert ci.bounds("accelerator", ("unseen_device", "unseen_scale")) == (pytest.approx(-0.6), pytest.approx(0.7))
    assert ci.bounds("accelerator", ()) == ci.bounds("accelerator")  # no class: the in-domain pair
    assert domain.novelty_classes(spec()) == ()
    with pytest.raises(InputError, match="unseen_moon"):
        ci.bounds("accelerator", ("unseen_scale", "unseen_moon"))
