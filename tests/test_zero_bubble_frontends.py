"""Zero bubble H1 (``pipeline_schedule: "zb-h1"``) at the front ends: published tables, the command line, search.

Expected values come from the schedules themselves (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism"):
ZB-H1 keeps 1F1B's micro-batches in flight with one model chunk per rank, so it is the run format's ``zb-h1``;
ZB-H2 holds more micro-batches in flight, ZB-V and DualPipe place two chunks per rank in a V shape (DualPipe feeding
both ends), and an interleaved zero bubble runs several chunks per rank — none of them is ``zb-h1``; the interleaved
one is ``interleaved-zb`` with the depth the row states. A zero-bubble
schedule needs a pipeline (pp >= 2), and the run validation refuses it with per-layer sharding (ZeRO-3 or FSDP).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learnedperf.cli import main
from learnedperf.errors import InputError
from learnedperf.measure.published import load_published
from learnedperf.specs import RunSpec
from test_published import _hybrid_table

MODEL, CLUSTER = "gpt3-1.3b", "dgx-a100"  # 16 heads, 24 layers; 8 x A100-SXM4-80GB per node
A100_8 = {"cluster": CLUSTER, "num_devices": 8}


# ------------------------------------------------------------------ published tables
def _table(tmp_path: Path, **row: str) -> Path:
    """A one-row published table: GPT 1B on two H100 nodes with Megatron-LM, pp 4 (dp 4)."""
    return _hybrid_table(tmp_path, {"num_gpus": "16", "pp": "4", "framework": "Megatron-LM, FlashAttention", **row})


@pytest.mark.parametrize("text", ["ZB-H1", "zb h1", "zero bubble H1", "Zero-Bubble (H1)", "ZB-H1, vpp=1"])
def test_zb_h1_words_become_the_zb_h1_schedule(tmp_path, text):
    got = load_published(_table(tmp_path, vpp_or_schedule=text))
    assert not got.skipped, got.skipped
    (m,) = got.runs
    assert m.run["strategy"]["pipeline_schedule"] == "zb-h1"
    s = RunSpec.from_dict(m.run).strategy
    assert (s.pipeline_schedule, s.pp, s.virtual_pipeline_stages) == ("zb-h1", 4, 1)
    assert not any("zb-h1" in a for a in m.run["meta"]["assumed"])  # named, not assumed


@pytest.mark.parametrize("text", ["ZB-1p", "ZB1P"])
def test_the_papers_zb_1p_is_read_as_zb_h1_and_counted(tmp_path, text):
    # ZB-1p is the paper's automatic schedule within 1F1B's activation memory: ZB-H1's micro-batches in flight,
    # its order searched on profiled times — close to ZB-H1, but not its handcrafted order, so it is an assumption
    got = load_published(_table(tmp_path, vpp_or_schedule=text))
    (m,) = got.runs
    assert m.run["strategy"]["pipeline_schedule"] == "zb-h1"
    note = "zb-h1 for ZB-1p (the paper's automatic schedule within 1F1B's activation memory)"
    assert note in m.run["meta"]["assumed"] and got.assumptions[note] == 1


@pytest.mark.parametrize("text, why", [
    ("ZB-H2", "holds more micro-batches in flight than 1F1B"),
    ("ZB-2p", "holds more micro-batches in flight than 1F1B"),
    ("DualPipe", "feeds micro-batches into both ends of the pipeline"),
    ("DualPipeV", "feeds micro-batches into both ends of the pipeline"),
    ("ZB-VPP", "the zero-bubble repository's interleaved variant"),
    ("zero bubble", "the row does not say which kind"),
    ("ZB-H1 or ZB-V", "the row names several (ZB-V, ZB-H1)"),
    ("interleaved ZB-H2", "the row names several (interleaved zero bubble, ZB-H2)"),
])
def test_other_zero_bubble_schedules_are_skipped_naming_why(tmp_path, text, why):
    got = load_published(_table(tmp_path, vpp_or_schedule=text))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert reason.startswith(f"vpp_or_schedule {text!r}: of the zero-bubble schedules only ZB-H1, ZB-V and "
                             "interleaved zero bubble are modelled; ")
    assert why in reason


@pytest.mark.parametrize("text, v, assumed", [("InterleavedZeroBubble, vpp=2", 2, False),
                                              ("interleaved ZB-H1 (4 chunks)", 4, False),
                                              ("Interleaved zero bubble, v=3", 3, False),
                                              ("ZB-1p interleaved, vpp 2", 2, True)])
def test_interleaved_zero_bubble_rows_are_interleaved_zb(tmp_path, text, v, assumed):
    # torchtitan's InterleavedZeroBubble is PyTorch's fixed order for the paper's ZB-1p, interleaved: the run format's
    # 'interleaved-zb'; a row naming the paper's automatic ZB-1p counts that as an assumption, as for ZB-H1
    got = load_published(_table(tmp_path, vpp_or_schedule=text, global_batch_size_seqs="32"))
    assert not got.skipped, got.skipped
    s = RunSpec.from_dict(got.runs[0].run).strategy
    assert (s.pipeline_schedule, s.pp, s.virtual_pipeline_stages) == ("interleaved-zb", 4, v)
    note = ("interleaved-zb for an interleaved ZB-1p (the paper's automatic schedule; PyTorch's "
            "InterleavedZeroBubble is its fixed order)")
    listed = [a for a in got.runs[0].run["meta"]["assumed"] if "interleav" in a]
    assert listed == ([note] if assumed else [])  # named, not assumed, but for the paper's automatic ZB-1p


@pytest.mark.parametrize("text, why", [
    ("InterleavedZeroBubble", "and the row does not state how many (say 'vpp=N' or 'N chunks')"),
    ("interleaved ZB-H1", "and the row does not state how many (say 'vpp=N' or 'N chunks')"),
    ("interleaved zero bubble, vpp=1", "but the row states 1"),
])
def test_interleaved_zero_bubble_without_a_depth_of_two_or_more_is_skipped(tmp_path, text, why):
    got = load_published(_table(tmp_path, vpp_or_schedule=text))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert reason == (f"vpp_or_schedule {text!r}: an interleaved zero-bubble schedule runs two or more model chunks "
                      f"per rank, {why}")


@pytest.mark.parametrize("text", ["ZB-H1, vpp=2", "ZB-H1 (2 chunks)"])
def test_zb_h1_with_a_stated_depth_is_skipped(tmp_path, text):
    # zb-h1 has one model chunk per rank; a stated depth of 2 is another schedule, not read as either half
    got = load_published(_table(tmp_path, vpp_or_schedule=text))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert reason.startswith(f"vpp_or_schedule {text!r}: ZB-H1 places one model chunk on each rank")
    assert "2 virtual stages" in reason


@pytest.mark.parametrize("sharding", ["ZeRO-3", "FSDP"])
def test_zb_h1_with_per_layer_sharding_is_skipped_by_the_run_validation(tmp_path, sharding):
    # the same row with 1F1B is a run: only the zero-bubble schedule with parameters gathered layer by layer is
    # refused, and the skip says so through the run validation's message, naming the field
    ok = load_published(_table(tmp_path, vpp_or_schedule="1F1B", zero_or_fsdp=sharding))
    assert not ok.skipped and ok.runs[0].run["strategy"]["pipeline_schedule"] == "1f1b"
    got = load_published(_table(tmp_path, vpp_or_schedule="ZB-H1", zero_or_fsdp=sharding))
    assert not got.runs
    ((label, reason),) = got.skipped
    assert label == "line 2 (row_id h1)"
    assert reason.startswith("strategy.pipeline_schedule: 'zb-h1'") and "zero_stage 3 or fsdp" in reason
    with pytest.raises(InputError, match="strategy.pipeline_schedule"):
        load_published(_table(tmp_path, vpp_or_schedule="ZB-H1", zero_or_fsdp=sharding), strict=True)


# ------------------------------------------------------------------ command line
FLAGS = ["--model", MODEL, "--cluster", CLUSTER, "--num-devices", "8", "--tp", "2"]


def test_the_schedule_flag_takes_zb_h1():
    # parsing and run building only: no simulation
    from learnedperf.cli import _run_from_args, build_parser

    args = build_parser().parse_args(["simulate", *FLAGS, "--pp", "2", "--schedule", "zb-h1"])
    run = _run_from_args(args, "learnedperf simulate")
    assert run["strategy"] == {"tp": 2, "pp": 2, "pipeline_schedule": "zb-h1"}
    s = RunSpec.from_dict(run).strategy
    assert (s.pipeline_schedule, s.virtual_pipeline_stages, s.dp) == ("zb-h1", 1, 2)


@pytest.mark.parametrize("extra, field", [
    (["--pp", "2", "--zero", "3"], "strategy.pipeline_schedule"),   # per-layer sharding
    (["--pp", "2", "--fsdp"], "strategy.pipeline_schedule"),
    ([], "strategy.pipeline_schedule"),                             # no pipeline: pp 1
])
def test_an_invalid_zb_h1_run_is_one_line_naming_the_field(capsys, extra, field):
    # refused by the run validation before anything is simulated: exit 1 (a bad run), not 2 (a bad flag)
    assert main(["simulate", *FLAGS, "--schedule", "zb-h1", *extra]) == 1
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_simulate_prints_a_zb_h1_run(capsys):
    # needs the simulator's zb-h1 schedule
    assert main(["simulate", *FLAGS, "--pp", "2", "--schedule", "zb-h1"]) == 0
    out = capsys.readouterr().out
    assert "tp 2, pp 2, dp 2" in out and "zb-h1" in out


def test_search_with_no_valid_candidate_says_why(capsys):
    # every zb-h1 candidate with FSDP is refused by the run validation: no result, and the reason printed
    argv = ["search", "--model", MODEL, "--cluster", CLUSTER, "--num-devices", "8", "--global-batch-size", "16",
            "--constraints", json.dumps({"schedules": ["zb-h1"], "pp": [2, 4], "zero_stages": [0],
                                         "recompute": ["none"], "fixed": {"fsdp": True}})]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "0 valid" in out
    assert "no valid strategy under these constraints" in out
    assert "by strategy.pipeline_schedule" in out and "'zb-h1' with parameters gathered layer by layer" in out


# ------------------------------------------------------------------ search
def _specs():
    from learnedperf.specs.run import SpecCache

    cache = SpecCache()
    return cache.model(MODEL), cache.hardware(A100_8)


BASE = {"global_batch_size": 16, "micro_batch_size": [1], "recompute": ["none"], "zero_stages": [0],
        "sequence_parallel": [False], "cp": [1], "pp": [1, 2, 4, 8]}


def test_search_offers_zb_h1_to_pipelined_candidates_only():
    from learnedperf.predict import enumerate_strategies

    model, hw = _specs()
    # tp, pp in {1, 2, 4, 8} with tp·pp | 8: 10 pairs, 6 of them with pp > 1 (1,2) (1,4) (1,8) (2,2) (2,4) (4,2);
    # each pipelined pair also takes zb-h1, so 10 + 6 candidates
    _c, cands = enumerate_strategies(model, hw, {**BASE, "schedules": ["1f1b", "zb-h1"]})
    assert len(cands) == 16
    zb = [s for s in cands if s["pipeline_schedule"] == "zb-h1"]
    assert sorted((s["tp"], s["pp"]) for s in zb) == [(1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2)]
    assert all(s["virtual_pipeline_stages"] == 1 for s in zb)
    assert all(s["pipeline_schedule"] == "1f1b" for s in cands if s["pp"] == 1)
    for s in zb:  # every one is a valid run
        assert RunSpec.from_dict({"model": MODEL, "hardware": A100_8, "strategy": s}).strategy.pipeline_schedule \
            == "zb-h1"
    # zb-h1 alone: the pp 1 candidates keep 1f1b (a schedule needs a pipeline), the others are all zb-h1
    _c, only = enumerate_strategies(model, hw, {**BASE, "schedules": ["zb-h1"]})
    assert {(s["pp"] > 1, s["pipeline_schedule"]) for s in only} == {(False, "1f1b"), (True, "zb-h1")}
    assert len(only) == 10
    # a schedule the run format does not have is named
    with pytest.raises(InputError, match="constraints.schedules"):
        enumerate_strategies(model, hw, {**BASE, "schedules": ["zb-h1", "zb-h2"]})


def test_search_counts_zb_h1_candidates_the_run_validation_refuses():
    # FSDP fixed for every candidate: the zb-h1 ones are kept in the space and counted invalid by the field the
    # validation names; the 1f1b ones are searched. tp·pp | 8 with pp 2: tp 1, 2, 4 → 3 candidates per schedule.
    from learnedperf.predict import Predictor

    cons = {**BASE, "pp": [2], "schedules": ["1f1b", "zb-h1"], "fixed": {"fsdp": True}}
    result = Predictor.load().search(MODEL, A100_8, cons, top=3, rescore=3)
    assert result["candidates"] == 6 and result["valid"] == 3
    assert result["invalid_by_field"] == {"strategy.pipeline_schedule": 3}
    assert "zero_stage 3 or fsdp" in result["invalid_example"]["strategy.pipeline_schedule"]
    assert {r["strategy"]["pipeline_schedule"] for r in result["results"]} == {"1f1b"}
