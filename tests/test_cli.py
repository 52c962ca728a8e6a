"""Tests of the ``learnedperf`` command line and of the JSON Lines helpers it uses.

Commands run in-process through ``main([...])``; one test runs the installed
console script, and one checks in a fresh interpreter that importing the CLI
loads nothing heavy.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import learnedperf
from learnedperf.cli import main
from learnedperf.errors import InputError
from learnedperf.io import read_jsonl, read_records, write_jsonl

MODEL, CLUSTER = "gpt3-1.3b", "dgx-a100"  # 16 heads, 24 layers; 8 x A100-SXM4-80GB per node
FLAGS = ["--model", MODEL, "--cluster", CLUSTER, "--num-devices", "8", "--tp", "2"]

PREDICTION_FIELDS = {"iteration_time_ms", "tokens_per_second", "samples_per_second", "tflops_per_device",
                     "mfu", "peak_memory_GiB", "fits_in_memory", "breakdown_ms", "interval_ms", "source"}
BREAKDOWN_FIELDS = {"compute", "exposed_communication", "pipeline_bubble", "optimizer"}


def run_dict(**strategy) -> dict:
    """A valid run on one DGX A100 node; ``strategy`` overrides the default tp=2."""
    return {"model": MODEL, "hardware": {"cluster": CLUSTER, "num_devices": 8},
            "strategy": {"tp": 2, **strategy}}


def jsonl(*items) -> str:
    """JSON Lines text: dicts are dumped, strings are written as they are."""
    return "".join((it if isinstance(it, str) else json.dumps(it)) + "\n" for it in items)


def output_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def check_prediction(pred: dict) -> None:
    assert PREDICTION_FIELDS <= pred.keys()
    assert BREAKDOWN_FIELDS <= pred["breakdown_ms"].keys()
    assert pred["iteration_time_ms"] > 0 and pred["tokens_per_second"] > 0
    assert 0 < pred["mfu"] < 1
    assert pred["peak_memory_GiB"] > 0 and isinstance(pred["fits_in_memory"], bool)
    low, high = pred["interval_ms"]
    assert low <= pred["iteration_time_ms"] <= high


# --------------------------------------------------------------------------- one run
def test_single_run_from_flags_prints_a_table(capsys):
    assert main(["simulate", *FLAGS]) == 0
    out = capsys.readouterr().out
    for text in ("iteration time", "ms", "tokens/s", "TFLOP/s per device", "MFU", "peak memory",
                 "GiB of 80", "fits", "exposed communication", "source", "simulator", MODEL, "tp 2"):
        assert text in out


def test_single_run_json_has_the_design_fields(capsys):
    assert main(["simulate", *FLAGS, "--format", "json"]) == 0
    (pred,) = output_lines(capsys.readouterr().out)
    check_prediction(pred)
    assert pred["source"] == "simulator"


def test_run_file_with_flag_overrides(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_dict(tp=1), indent=2))
    assert main(["simulate", "--run", str(path), "--tp", "4", "--seq-length", "1024",
                 "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "tp 4" in out and "seq 1024" in out and "recompute full" in out


def test_forward_only_flag_implies_no_optimizer(capsys):
    from learnedperf.simulate import simulate

    assert main(["simulate", *FLAGS, "--forward-only", "--format", "json"]) == 0
    (pred,) = output_lines(capsys.readouterr().out)
    run = dict(run_dict(), strategy={"tp": 2, "forward_only": True, "optimizer": "none"})
    assert pred["iteration_time_ms"] == pytest.approx(simulate(run).iteration_time_s * 1e3, rel=1e-12)
    assert pred["breakdown_ms"]["backward"] == pred["breakdown_ms"]["optimizer"] == 0
    assert main(["simulate", *FLAGS, "--forward-only"]) == 0
    assert "forward only" in capsys.readouterr().out
    # an explicit optimizer is kept, and the contradiction named
    assert main(["simulate", *FLAGS, "--forward-only", "--optimizer", "adam"]) == 1
    err = capsys.readouterr().err
    assert "strategy.forward_only" in err and len(err.strip().splitlines()) == 1


def test_expert_dispatch_flags(capsys):
    from learnedperf.simulate import simulate

    flags = ["--model", "mixtral-8x7b", "--cluster", CLUSTER, "--num-devices", "16", "--ep", "8", "--tp", "2"]
    assert main(["simulate", *flags, "--moe-dispatcher", "deepep", "--overlap-moe-comm", "--format", "json"]) == 0
    (pred,) = output_lines(capsys.readouterr().out)
    run = {"model": "mixtral-8x7b", "hardware": {"cluster": CLUSTER, "num_devices": 16},
           "strategy": {"ep": 8, "tp": 2, "moe_dispatcher": "deepep", "overlap_moe_comm": True}}
    assert pred["iteration_time_ms"] == pytest.approx(simulate(run).iteration_time_s * 1e3, rel=1e-12)
    assert main(["simulate", *flags, "--moe-dispatcher", "deepep", "--overlap-moe-comm"]) == 0
    assert "deepep dispatch, all-to-alls overlapped" in capsys.readouterr().out
    # without expert parallelism there is nothing to dispatch: one error naming the field
    assert main(["simulate", *FLAGS, "--overlap-moe-comm"]) == 1
    err = capsys.readouterr().err
    assert "strategy.overlap_moe_comm" in err and len(err.strip().splitlines()) == 1


def test_expert_capacity_flag(capsys):
    from learnedperf.simulate import simulate

    flags = ["--model", "mixtral-8x7b", "--cluster", CLUSTER, "--num-devices", "16", "--ep", "8", "--tp", "2"]
    assert main(["simulate", *flags, "--moe-capacity-factor", "1.5", "--format", "json"]) == 0
    (pred,) = output_lines(capsys.readouterr().out)
    run = {"model": "mixtral-8x7b", "hardware": {"cluster": CLUSTER, "num_devices": 16},
           "strategy": {"ep": 8, "tp": 2, "moe_capacity_factor": 1.5}}
    assert pred["iteration_time_ms"] == pytest.approx(simulate(run).iteration_time_s * 1e3, rel=1e-12)
    assert main(["simulate", *flags, "--moe-capacity-factor", "1.5"]) == 0
    assert "expert capacity x1.5" in capsys.readouterr().out
    # a dense model has no experts to size: one error naming the field
    assert main(["simulate", *FLAGS, "--moe-capacity-factor", "1.5"]) == 1
    err = capsys.readouterr().err
    assert "strategy.moe_capacity_factor" in err and len(err.strip().splitlines()) == 1


def test_predict_says_its_source(capsys):
    """predict answers with the shipped checkpoint by default, and names it."""
    assert main(["predict", *FLAGS, "--format", "json"]) == 0
    (pred,) = output_lines(capsys.readouterr().out)
    check_prediction(pred)
    assert pred["source"].startswith("checkpoint:default:")
    lo, hi = pred["interval_ms"]
    assert lo <= pred["iteration_time_ms"] <= hi and lo < hi


def test_predict_without_checkpoint_is_one_clear_error(tmp_path, capsys):
    assert main(["predict", *FLAGS, "--checkpoint", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint manifest" in err and "learnedperf train" in err and "Traceback" not in err
    src = tmp_path / "runs.jsonl"
    src.write_text(jsonl(run_dict()))
    assert main(["predict", "--input", str(src), "--checkpoint", str(tmp_path / "none")]) == 1
    assert "no checkpoint manifest" in capsys.readouterr().err


def test_trace_is_a_chrome_trace(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    assert main(["simulate", *FLAGS, "--pp", "2", "--tp", "1", "--global-batch-size", "16",
                 "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())
    assert isinstance(events, list)
    spans = [e for e in events if e.get("ph") == "X"]
    assert spans and all({"name", "ts", "dur", "pid", "tid"} <= e.keys() for e in spans)
    assert "iteration time" in capsys.readouterr().out


def test_bad_single_run_is_one_line_exit_1(capsys):
    assert main(["simulate", "--model", MODEL, "--cluster", CLUSTER, "--num-devices", "6", "--tp", "6"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "strategy.tp" in captured.err and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- batches
def test_batch_with_bad_lines(tmp_path, capsys):
    src, dst = tmp_path / "runs.jsonl", tmp_path / "out.jsonl"
    src.write_text(jsonl(
        {**run_dict(), "id": "ok-1"},
        '{"model": "gpt3-1.3b", "hardware": ',                                    # invalid JSON
        {"model": MODEL, "hardware": {"device": "Z9000", "num_devices": 8}, "id": "bad-device"},
        "",                                                                       # blank: skipped
        {**run_dict(pp=2), "id": "ok-2"},
        {"model": MODEL, "hardware": {"cluster": CLUSTER, "num_devices": 3}, "strategy": {"tp": 3}},
        {**run_dict(zero_stage=1), "id": "ok-3"},
    ))
    assert main(["simulate", "--input", str(src), "--output", str(dst)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "3 of 6" in captured.err and "Traceback" not in captured.err

    lines = output_lines(dst.read_text())
    assert len(lines) == 6
    assert [line.get("id") for line in lines] == ["ok-1", None, "bad-device", "ok-2", None, "ok-3"]
    for i in (0, 3, 5):
        check_prediction(lines[i])
    errors = {line["line"]: line["error"] for line in lines if "error" in line}
    assert sorted(errors) == [2, 3, 6]  # physical line numbers, the blank line counted
    assert errors[2].startswith("line 2: ") and "invalid JSON" in errors[2]
    assert errors[3].startswith("line 3: ") and "hardware.device" in errors[3] and "Z9000" in errors[3]
    assert errors[6].startswith("line 6: ") and "strategy.tp" in errors[6]


def test_all_valid_batch_exits_0(tmp_path, capsys):
    src = tmp_path / "runs.jsonl"
    src.write_text(jsonl(*({**run_dict(micro_batch_size=m), "id": f"r{m}"} for m in (1, 2, 4))))
    assert main(["simulate", "--input", str(src)]) == 0
    captured = capsys.readouterr()
    lines = output_lines(captured.out)
    assert [line["id"] for line in lines] == ["r1", "r2", "r4"]
    assert all("error" not in line for line in lines)
    assert captured.err == ""


def test_stdin_to_stdout(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(jsonl(run_dict(), "not json", run_dict(pp=2))))
    assert main(["predict", "--input", "-", "--output", "-"]) == 1
    lines = output_lines(capsys.readouterr().out)
    assert len(lines) == 3 and "error" in lines[1] and lines[1]["line"] == 2
    assert lines[0]["source"] == lines[2]["source"] and lines[0]["source"].startswith("checkpoint:default:")


def test_pretty_printed_json_file_is_one_run(tmp_path, capsys):
    src = tmp_path / "run.json"
    src.write_text(json.dumps({**run_dict(), "id": "pretty"}, indent=2))
    assert main(["simulate", "--input", str(src)]) == 0
    (pred,) = output_lines(capsys.readouterr().out)
    assert pred["id"] == "pretty"
    check_prediction(pred)


def test_unexpected_exception_is_that_lines_error(monkeypatch, tmp_path, capsys):
    import learnedperf.simulate

    real = learnedperf.simulate.simulate

    def flaky(run, **kwargs):
        if run.id == "boom":
            raise RuntimeError("kaboom")
        return real(run, **kwargs)

    monkeypatch.setattr(learnedperf.simulate, "simulate", flaky)
    src = tmp_path / "runs.jsonl"
    src.write_text(jsonl({**run_dict(), "id": "boom"}, run_dict()))
    assert main(["simulate", "--input", str(src)]) == 1
    first, second = output_lines(capsys.readouterr().out)
    assert first["error"] == "line 1: internal error: RuntimeError: kaboom" and first["id"] == "boom"
    check_prediction(second)


def test_predict_batch_both_tiers_and_chunking(monkeypatch, tmp_path, capsys):
    """The batch path answers in chunks through predict_many: every line, in order, across chunk edges."""
    import learnedperf.cli as cli

    monkeypatch.setattr(cli, "_CHUNK_LINES", 3)
    src = tmp_path / "runs.jsonl"
    items = [{**run_dict(micro_batch_size=m), "id": f"r{k}"} for k, m in enumerate((1, 2, 4, 1, 2))]
    items.insert(2, {**run_dict(tp=3), "id": "bad"})
    src.write_text(jsonl(*items, "not json"))
    for tier in ("fast", "full"):
        assert main(["predict", "--input", str(src), "--tier", tier]) == 1
        lines = output_lines(capsys.readouterr().out)
        assert [line.get("id") for line in lines] == ["r0", "r1", "bad", "r2", "r3", "r4", None]
        assert lines[2]["line"] == 3 and "strategy.tp" in lines[2]["error"] and lines[6]["line"] == 7
        for line in lines[:2] + lines[3:6]:
            check_prediction(line)
            assert line["tier"] == tier


def test_trace_needs_the_full_tier(tmp_path, capsys):
    assert main(["predict", *FLAGS, "--tier", "fast", "--trace", str(tmp_path / "t.json")]) == 2
    assert "--tier full" in capsys.readouterr().err
    assert main(["predict", *FLAGS, "--trace", str(tmp_path / "t.json")]) == 0  # --trace alone means full
    assert "checkpoint:default:" in capsys.readouterr().out and (tmp_path / "t.json").is_file()


def test_search_prints_a_ranked_table_and_json(capsys):
    argv = ["search", "--model", MODEL, "--cluster", CLUSTER, "--num-devices", "8", "--global-batch-size", "16",
            "--constraints", '{"recompute": ["none"], "zero_stages": [0, 1]}']
    assert main([*argv, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "candidate strategies" in out and "P(fastest)" in out
    assert main([*argv, "--top", "3", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    times = [r["iteration_time_ms"] for r in result["results"]]
    assert len(times) == 3 and times == sorted(times)
    assert all(r["strategy"]["recompute"] == "none" and r["peak_memory_GiB"] <= 80 for r in result["results"])


def test_search_table_names_the_expert_dispatch_it_tried(capsys):
    argv = ["search", "--model", "mixtral-8x7b", "--cluster", CLUSTER, "--num-devices", "16", "--global-batch-size",
            "16", "--seq-length", "1024", "--top", "40", "--format", "json", "--constraints",
            '{"moe_dispatchers": ["alltoall", "deepep"], "overlap_moe_comm": [true], "tp": [2], "pp": [1], '
            '"cp": [1], "ep": [1, 8], "recompute": ["full"], "zero_stages": [3], "micro_batch_size": [1], '
            '"sequence_parallel": [true]}']
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    seen = {(r["strategy"]["ep"], r["strategy"].get("moe_dispatcher", "alltoall"),
             r["strategy"].get("overlap_moe_comm", False)) for r in result["results"]}
    assert seen == {(1, "alltoall", False), (8, "alltoall", True), (8, "deepep", True)}
    assert main(argv[:-4] + argv[-2:]) == 0  # the table
    out = capsys.readouterr().out
    assert "dispatch" in out and "deepep, overlapped" in out and "alltoall, overlapped" in out


def test_a_device_named_multi_node_run_says_which_network_it_assumed(capsys):
    # DGX A100's network (8 x 200 Gb/s HDR for 8 GPUs: 25 GB/s each), the catalog's first cluster of the A100 SXM4 80GB
    hw = ["--device", "A100-SXM4-80GB", "--num-devices", "16"]
    assert main(["predict", "--model", MODEL, *hw, "--tp", "8", "--global-batch-size", "16", "--format", "json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert any("dgx-a100" in n and "25 GB/s" in n for n in pred["notes"])
    argv = ["search", "--model", MODEL, *hw, "--global-batch-size", "16", "--top", "2", "--constraints",
            '{"recompute": ["none"], "zero_stages": [0]}']
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "dgx-a100" in notes[0]  # said once, not once per candidate
    assert main(["search", "--model", MODEL, "--cluster", CLUSTER, "--num-devices", "16", "--global-batch-size", "16",
                 "--top", "2", "--constraints", '{"recompute": ["none"], "zero_stages": [0]}']) == 0
    assert "note: " not in capsys.readouterr().out  # a named cluster's network is given, not assumed


def test_search_bad_constraint_is_one_line(tmp_path, capsys):
    assert main(["search", "--model", MODEL, "--cluster", CLUSTER, "--num-devices", "8", "--global-batch-size",
                 "16", "--constraints", '{"tp_max": 4}']) == 1
    err = capsys.readouterr().err
    assert "constraints.tp_max" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["search", "--model", MODEL, "--cluster", CLUSTER, "--num-devices", "8"]) == 1
    assert "constraints.global_batch_size" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    assert main(["search", "--run", str(bad), "--global-batch-size", "16"]) == 1
    err = capsys.readouterr().err
    assert "invalid JSON" in err and "Traceback" not in err


# --------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize("argv, expected", [
    (["simulate", "--input", "no/such/runs.jsonl"], "no/such/runs.jsonl"),
    (["simulate", "--run", "no/such/run.json"], "no/such/run.json"),
    (["simulate", "--tp", "two"], "--tp"),
    (["simulate", "--model", MODEL], "--num-devices"),
    (["simulate", "--input", "-", "--tp", "2"], "--input cannot be combined"),
    (["simulate", "--input", "-", "--trace", "t.json"], "--trace"),
    (["frobnicate"], "frobnicate"),
    ([], "COMMAND"),
])
def test_usage_errors_exit_2_with_one_line(argv, expected, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert expected in captured.err and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_catalog_and_version(capsys):
    assert main(["catalog", "models"]) == 0
    assert MODEL in capsys.readouterr().out.split()
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    assert "devices:" in out and CLUSTER in out
    assert main(["--version"]) == 0
    assert learnedperf.__version__ in capsys.readouterr().out


# --------------------------------------------------------------------------- io helpers
def test_read_jsonl_keeps_going_after_bad_lines(tmp_path):
    src = tmp_path / "x.jsonl"
    src.write_text('{"a": 1}\n\n{oops\n  \n[1]\n{"b": 2}\n')
    items = list(read_jsonl(src))
    assert [n for n, _ in items] == [1, 3, 5, 6]
    assert items[0][1] == {"a": 1} and items[3][1] == {"b": 2}
    assert isinstance(items[1][1], InputError) and str(items[1][1]).startswith("line 3: invalid JSON")
    assert isinstance(items[2][1], InputError) and "object" in str(items[2][1])
    # a pretty-printed document is one record only for read_records
    src.write_text('{\n  "a": 1\n}\n')
    assert list(read_records(src)) == [(1, {"a": 1})]
    assert all(isinstance(item, InputError) for _, item in read_jsonl(src))


def test_open_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(InputError, match="missing.jsonl"):
        list(read_jsonl(missing))


def test_write_jsonl_round_trip(tmp_path):
    dst = tmp_path / "out.jsonl"
    assert write_jsonl([{"a": 1}, {"b": [1.5, float("nan")]}], dst) == 2
    assert [item for _, item in read_jsonl(dst)] == [{"a": 1}, {"b": [1.5, None]}]


# --------------------------------------------------------------------------- subprocesses
def test_import_loads_nothing_heavy():
    code = ("import sys, learnedperf.cli; "
            "print([m for m in ('torch', 'pandas', 'numpy', 'learnedperf.simulate') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).with_name("learnedperf")
    exe = str(script) if script.exists() else shutil.which("learnedperf")
    assert exe, "the learnedperf console script is not installed: run pip install -e ."
    proc = subprocess.run([exe, "simulate", "--input", "-"], input=jsonl(run_dict(), {"model": MODEL}),
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 1, proc.stderr
    good, bad = output_lines(proc.stdout)
    check_prediction(good)
    assert bad["line"] == 2 and bad["error"].startswith("line 2: hardware")
    assert "Traceback" not in proc.stderr


def test_the_table_says_what_widened_the_interval(capsys):
    # 64 B200s: a device and a scale the shipped checkpoint's measured runs never had (it has the lent H100's and
    # H200's steps since 2026-11-28)
    assert main(["predict", "--model", "gpt3-1.3b", "--cluster", "dgx-b200", "--num-devices", "64",
                 "--global-batch-size", "64"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("90 % interval"))
    assert line.endswith("(widened: unseen device, unseen scale)")
