"""``learnedperf measure`` and ``learnedperf ingest`` end to end, and the data set manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from learnedperf.cli import main
from learnedperf.errors import InputError
from learnedperf.measure.bench import fit_link, fit_link_in_stream
from learnedperf.measure.records import OP_COLUMNS, STEP_COLUMNS, verify_manifest, write_manifest, write_parquet

FIXTURES = Path(__file__).parent / "data" / "ingest"


def _steps(directory: Path) -> pd.DataFrame:
    return pd.read_parquet(directory / "steps_ingested.parquet")


def test_ingest_valid_logs_writes_every_row_with_a_verified_manifest(tmp_path, capsys):
    out = tmp_path / "ds"
    code = main(["ingest", str(FIXTURES / "runs_valid.csv"), str(FIXTURES / "runs_valid.jsonl"), "--out", str(out)])
    assert code == 0
    csv_rows = len(pd.read_csv(FIXTURES / "runs_valid.csv"))
    jsonl_rows = sum(1 for line in (FIXTURES / "runs_valid.jsonl").read_text().splitlines() if line.strip())
    steps = _steps(out)
    assert len(steps) == csv_rows + jsonl_rows
    assert list(steps.columns) == list(STEP_COLUMNS)
    manifest = verify_manifest(out)
    assert manifest["files"]["steps_ingested.parquet"]["rows"] == len(steps)
    assert manifest["rejected_rows"] == 0


def test_ingest_rejects_a_bad_file_naming_file_line_and_field(tmp_path, capsys):
    code = main(["ingest", str(FIXTURES / "runs_bad.csv"), "--out", str(tmp_path / "ds")])
    err = capsys.readouterr().err
    assert code == 1
    assert "runs_bad.csv: line 3: num_devices" in err
    assert "Traceback" not in err
    assert not (tmp_path / "ds" / "steps_ingested.parquet").exists()  # strict: nothing half-written


def test_ingest_skip_bad_rows_keeps_good_rows_and_reports_each_bad_one(tmp_path, capsys):
    out = tmp_path / "ds"
    code = main(["ingest", str(FIXTURES / "runs_bad.csv"), "--skip-bad-rows", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1  # some rows were rejected
    rejected = [line for line in err.splitlines() if line.startswith("learnedperf ingest: rejected:")]
    total = len(pd.read_csv(FIXTURES / "runs_bad.csv", dtype=str))
    assert len(rejected) + len(_steps(out)) == total  # nothing dropped silently
    assert json.loads((out / "manifest.json").read_text())["rejected_rows"] == len(rejected)


def test_ingest_trace_writes_operator_records(tmp_path):
    out = tmp_path / "ds"
    assert main(["ingest", str(FIXTURES / "kineto_cpu_small.json"), "--out", str(out)]) == 0
    ops = pd.read_parquet(out / "ops_ingested.parquet")
    assert list(ops.columns) == list(OP_COLUMNS)
    assert {"matmul", "layernorm", "softmax"} <= set(ops.kind)
    assert (ops.time_ms > 0).all()


def test_ingest_truncated_trace_is_one_clear_error(tmp_path, capsys):
    code = main(["ingest", str(FIXTURES / "trace_truncated.json"), "--out", str(tmp_path / "ds")])
    err = capsys.readouterr().err
    assert code == 1 and "trace_truncated.json" in err and "Traceback" not in err


def test_manifest_detects_a_changed_file(tmp_path):
    rec = {k: 0 for k in STEP_COLUMNS}
    write_parquet([rec], tmp_path / "steps_x.parquet", STEP_COLUMNS, "step")
    write_manifest(tmp_path, command="test", host={"name": "test"})
    verify_manifest(tmp_path)
    with open(tmp_path / "steps_x.parquet", "ab") as fh:
        fh.write(b"tampered")
    with pytest.raises(InputError, match="steps_x.parquet: sha256 differs"):
        verify_manifest(tmp_path)


def test_manifest_counts_rows_from_the_parquet_footer(tmp_path, monkeypatch):
    """On a lent H200's image (pandas 3.0.6, pyarrow 25) ``read_parquet(f, columns=[])`` gave 0 rows,
    and both of its manifests said 0 rows for 6,997 operator and 46 step records."""
    rec = {k: 0 for k in STEP_COLUMNS}
    write_parquet([rec] * 3, tmp_path / "steps_x.parquet", STEP_COLUMNS, "step")
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: pd.DataFrame())  # that image's answer
    write_manifest(tmp_path, command="test", host={"name": "test"})
    assert verify_manifest(tmp_path)["files"]["steps_x.parquet"]["rows"] == 3


def test_write_parquet_refuses_records_off_schema(tmp_path):
    rec = {k: 0 for k in STEP_COLUMNS}
    del rec["run"]
    with pytest.raises(InputError, match=r"step record 0: missing column\(s\) \['run'\]"):
        write_parquet([rec], tmp_path / "s.parquet", STEP_COLUMNS, "step")


def test_measure_quick_end_to_end_with_two_processes(tmp_path, capsys):
    """A real (tiny) measurement: device descriptors, gloo collectives on 2 processes, 4 training steps."""
    out = tmp_path / "m"
    code = main(["measure", "--quick", "--out", str(out), "--parts", "collectives,steps", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    manifest = verify_manifest(out)
    steps = pd.read_parquet(out / "steps_cpu_quick.parquet")
    comm = pd.read_parquet(out / "ops_cpu_quick_collectives.parquet")
    assert (steps.world_size > 1).sum() >= 1
    assert (steps.iteration_p10_ms <= steps.iteration_time_ms).all()
    assert (steps.iteration_time_ms <= steps.iteration_p90_ms).all()
    assert set(comm.world_size) == {2} and (comm.time_ms > 0).all()
    link = manifest["collections"][-1]["links"]["2"]
    assert link["intra_node_bandwidth_GBps"] > 0 and link["intra_node_latency_us"] >= 0
    # the link is the in-stream fit of the manifest's in-stream points; the barrier fit is kept beside it
    fits = manifest["collections"][-1]["link_fits"]["2"]
    refit = fit_link_in_stream(fits["in_stream_points"], 2)
    assert link["intra_node_latency_us"] == pytest.approx(refit["intra_node_latency_us"])
    assert link["intra_node_bandwidth_GBps"] == pytest.approx(refit["intra_node_bandwidth_GBps"])
    assert fits["barrier_median"]["intra_node_latency_us"] == pytest.approx(
        fit_link(comm.to_dict("records"), 2)["intra_node_latency_us"])
    # the 2-process step's run carries the fitted link of 2 processes
    run = json.loads(steps[steps.world_size == 2].iloc[0].run)
    assert run["hardware"]["intra_node_bandwidth_GBps"] == pytest.approx(link["intra_node_bandwidth_GBps"])
    # and the overlap its benchmark measured (kept beside the link fits)
    assert run["hardware"]["comm_overlap"] == link["comm_overlap"] == round(fits["overlap"]["overlap"], 4)
    assert "learnedperf measure --quick" in manifest["command"]


def test_measure_rejects_unknown_part(capsys):
    assert main(["measure", "--parts", "ops,gpus"]) == 2
    assert "unknown part" in capsys.readouterr().err
