"""Ingestion of run logs and profiler traces, and the public data sets as records.

Fixtures are in ``tests/data/ingest`` (written by ``make_fixtures.py`` there, whose comments give the
expected values); the tests recompute every expected number by hand from the fixture's inputs.
Tests that read ``../shared/data`` skip when it is absent.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from learnedperf.errors import InputError
from learnedperf.measure.ingest import (IngestResult, RowError, aten_kind, ingest_trace, read_chrome_trace,
                                        read_run_log, strategy_kind, trace_op_records, trace_step_times)
from learnedperf.measure.public import default_shared_data
from learnedperf.measure.records import OP_COLUMNS, STEP_COLUMNS, run_id, write_parquet
from learnedperf.specs import DeviceSpec, RunSpec

DATA = Path(__file__).resolve().parent / "data" / "ingest"
SHARED = default_shared_data()


# ============================================================================ run logs
def test_csv_log_maps_every_column():
    recs = read_run_log(DATA / "runs_valid.csv")
    assert len(recs) == 4
    assert all(set(r) == set(STEP_COLUMNS) for r in recs)
    assert {r["source"] for r in recs} == {"ingested:runs_valid.csv"}

    a = recs[0]  # gpt3-1.3b on a DGX A100 node, tp 2 dp 4, every optional column given
    run = json.loads(a["run"])
    assert run["hardware"] == {"cluster": "dgx-a100", "num_devices": 8}
    assert run["strategy"]["sequence_parallel"] is True and run["strategy"]["recompute"] == "full"
    assert run["meta"] == {"framework": "megatron"}
    assert a["run_id"] == run_id(run)
    assert (a["model_name"], a["arch"], a["strategy_kind"], a["world_size"]) == ("gpt3-1.3b", "gpt", "tp+dp", 8)
    assert (a["iteration_time_ms"], a["iteration_p10_ms"], a["iteration_p90_ms"]) == (1234.5, 1200.0, 1300.0)
    assert (a["repeats"], a["peak_memory_MiB"], a["host"]) == (10, 40000.0, "node-a")
    assert a["measured_at"] == "2024-05-01T12:00:00+00:00"
    assert a["device_name"] == "A100-SXM4-80GB"
    assert DeviceSpec.parse(json.loads(a["device"])).name == "A100-SXM4-80GB"

    # tokens/s: 1000 · global batch 32 · seq 2048 / 65,536 tokens/s = 1000 ms
    b = recs[1]
    assert b["iteration_time_ms"] == pytest.approx(1000.0 * 32 * 2048 / 65536)
    assert b["strategy_kind"] == "pp+dp"
    # documented defaults of what the log does not say
    assert (b["iteration_p10_ms"], b["iteration_p90_ms"], b["peak_memory_MiB"], b["measured_at"]) == (None,) * 4
    assert (b["repeats"], b["warmup"], b["threads"], b["backend"], b["host"], b["per_op"]) == \
        (0, 0, 0, "unknown", "unknown", "[]")

    # samples/s with an inline model: 1000 · 4 / 8 = 500 ms
    c = recs[2]
    assert (c["model_name"], c["strategy_kind"], c["world_size"]) == ("tiny", "single", 1)
    assert c["iteration_time_ms"] == pytest.approx(500.0)

    # seq_length overrides the catalog model's: 1000 · 8 · 1024 / 8192 = 1000 ms; naive time taken as UTC
    d = recs[3]
    assert RunSpec.from_dict(json.loads(d["run"])).model.seq_length == 1024
    assert d["iteration_time_ms"] == pytest.approx(1000.0 * 8 * 1024 / 8192)
    assert d["measured_at"] == "2024-05-02T08:30:00+00:00"


def test_jsonl_log_with_run_objects_and_typed_values():
    recs = read_run_log(DATA / "runs_valid.jsonl")
    assert len(recs) == 2
    a, b = recs
    run = json.loads(a["run"])
    assert run["model"] == "gpt3-125m" and run["meta"] == {"framework": "deepspeed"}
    assert (a["iteration_time_ms"], a["repeats"], a["strategy_kind"], a["world_size"]) == (250.0, 20, "dp", 4)
    # iteration_time_ms wins; tokens/s (1000·32·4096/100000 = 1310.72 ms) agrees within 1 %
    assert b["iteration_time_ms"] == 1311.0
    assert (b["model_name"], b["strategy_kind"], b["device_name"]) == ("llama-2-7b", "tp+zero", "H100-SXM5-80GB")
    assert b["measured_at"] == "2024-06-01T08:00:00+00:00"


def test_parquet_log_coerces_nullable_integers():
    recs = read_run_log(DATA / "runs_valid.parquet")
    assert [r["source"] for r in recs] == ["ingested:runs_valid.parquet"] * 2
    a, b = recs
    # 16 devices, tp 2, pp 2 → dp 4 derived; 1000 · 64 / 32 samples/s = 2000 ms
    assert json.loads(a["run"])["strategy"] == {"tp": 2, "pp": 2, "fsdp": False, "global_batch_size": 64}
    assert (a["strategy_kind"], a["iteration_time_ms"], a["host"]) == ("tp+pp+dp", 2000.0, "node-b")
    assert (b["strategy_kind"], b["iteration_time_ms"], b["host"]) == ("fsdp", 800.0, "unknown")


def test_ingested_records_write_with_the_record_schema(tmp_path):
    import pandas as pd

    recs = read_run_log(DATA / "runs_valid.csv")
    path = write_parquet(recs, tmp_path / "steps.parquet", STEP_COLUMNS, "step")
    back = pd.read_parquet(path)
    assert list(back.columns) == list(STEP_COLUMNS) and len(back) == 4


# --------------------------------------------------------------- malformed logs
BAD_CSV_ERRORS = [("line 3", "num_devices"), ("line 4", "tp"), ("line 5", "strategy.dp"),
                  ("line 8", "iteration_time_ms")]


def _check(err: InputError, file: str, location: str, field: str) -> None:
    text = str(err)
    assert file in text and f"{location}:" in text and field in text, text


def test_strict_mode_raises_on_the_first_bad_row():
    with pytest.raises(RowError) as exc:
        read_run_log(DATA / "runs_bad.csv")
    _check(exc.value, "runs_bad.csv", "line 3", "num_devices")
    assert (exc.value.location, exc.value.field) == ("line 3", "num_devices")
    assert isinstance(exc.value, InputError)


def test_collect_mode_keeps_good_rows_and_reports_every_bad_one():
    result = read_run_log(DATA / "runs_bad.csv", errors="collect")
    assert isinstance(result, IngestResult)
    assert len(result.records) == 2 and result.rejected == 4
    assert [(e.location, e.field) for e in result.errors] == BAD_CSV_ERRORS
    for err, (location, field) in zip(result.errors, BAD_CSV_ERRORS):
        _check(err, "runs_bad.csv", location, field)
    assert "'two'" in str(result.errors[1]) and "16 but hardware.num_devices = 8" in str(result.errors[2])
    # the good row after the quoted two-line cell: line numbers count physical lines
    assert result.records[1]["model_name"] == "custom" and result.records[1]["iteration_time_ms"] == 50.0


def test_jsonl_truncated_line_and_impossible_strategy():
    with pytest.raises(RowError) as exc:
        read_run_log(DATA / "runs_bad.jsonl")
    _check(exc.value, "runs_bad.jsonl", "line 2", "invalid JSON")
    result = read_run_log(DATA / "runs_bad.jsonl", errors="collect")
    assert [r["iteration_time_ms"] for r in result.records] == [250.0, 260.0]
    assert [(e.location, e.field) for e in result.errors] == [("line 2", ""), ("line 3", "strategy.dp")]
    _check(result.errors[1], "runs_bad.jsonl", "line 3", "strategy.dp")


def test_parquet_unknown_device_and_missing_target():
    with pytest.raises(RowError) as exc:
        read_run_log(DATA / "runs_bad.parquet")
    _check(exc.value, "runs_bad.parquet", "row 1", "hardware.device")
    assert "Z100-NOPE" in str(exc.value)
    result = read_run_log(DATA / "runs_bad.parquet", errors="collect")
    assert len(result.records) == 1
    assert [(e.location, e.field) for e in result.errors] == [("row 1", "hardware.device"),
                                                              ("row 2", "iteration_time_ms")]


def test_csv_unknown_device():
    with pytest.raises(InputError) as exc:
        read_run_log(DATA / "runs_bad_device.csv")
    _check(exc.value, "runs_bad_device.csv", "line 3", "hardware.device")


def test_unknown_column_fails_the_file_unless_ignored():
    for mode in ("raise", "collect"):
        with pytest.raises(InputError) as exc:
            read_run_log(DATA / "runs_unknown_column.csv", errors=mode)
        assert "runs_unknown_column.csv" in str(exc.value) and "'t_p'" in str(exc.value)
    recs = read_run_log(DATA / "runs_unknown_column.csv", ignore_columns=["t_p", "notes"])
    assert len(recs) == 1 and json.loads(recs[0]["run"])["strategy"] == {}


GOOD = {"model": "gpt3-1.3b", "cluster": "dgx-a100", "num_devices": "8", "tp": "2",
        "global_batch_size": "64", "iteration_time_ms": "1000"}


@pytest.mark.parametrize("change, field, words", [
    ({"tokens_per_second": "50000"}, "tokens_per_second", "more than 1 % apart"),  # 2621.44 ms vs 1000
    ({"iteration_p10_ms": "1100"}, "iteration_p10_ms", "exceeds the median"),
    ({"iteration_p90_ms": "900"}, "iteration_p90_ms", "below the median"),
    ({"iteration_time_ms": "-3"}, "iteration_time_ms", "must be > 0"),
    ({"model": None}, "model", "required column is missing"),
    ({"cluster": None}, "device", "give device or cluster"),
    ({"tp": "3"}, "strategy.tp", "does not divide"),
    ({"precision": "fp4"}, "strategy.precision", "fp4"),
    ({"fsdp": "maybe"}, "fsdp", "true or false"),
    ({"measured_at": "yesterday"}, "measured_at", "ISO-8601"),
    ({"run": "{}"}, "model", "a row gives either"),
    ({"model": "{\"arch\": \"gpt\""}, "model", "invalid JSON"),
    ({"collective_busbw_ratio": "{\"allgather\": 0.5"}, "collective_busbw_ratio", "invalid JSON"),
    ({"collective_busbw_ratio": "{\"gather\": 0.5}"}, "hardware.collective_busbw_ratio.gather", "unknown collective"),
])
def test_each_bad_value_names_its_field(tmp_path, change, field, words):
    row = {**GOOD, **change}
    cols = [k for k in row if row[k] is not None]
    path = tmp_path / "log.csv"
    import csv

    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerow([row[c] for c in cols])
    with pytest.raises(RowError) as exc:
        read_run_log(path)
    _check(exc.value, "log.csv", "line 2", field)
    assert words in str(exc.value)


def test_collective_busbw_ratio_column_reaches_the_run(tmp_path):
    import csv

    row = {**GOOD, "collective_busbw_ratio": json.dumps({"reducescatter": 0.3})}
    with open(tmp_path / "log.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(list(row))
        w.writerow(list(row.values()))
    (rec,) = read_run_log(tmp_path / "log.csv")
    assert json.loads(rec["run"])["hardware"]["collective_busbw_ratio"] == {"reducescatter": 0.3}


def test_run_column_in_csv_and_json_array(tmp_path):
    run = {"model": "gpt3-125m", "hardware": {"device": "A100-SXM4-80GB", "num_devices": 2},
           "strategy": {"global_batch_size": 4}}
    (tmp_path / "a.json").write_text(json.dumps([{"run": run, "samples_per_second": 16}, {"run": run}]))
    result = read_run_log(tmp_path / "a.json", errors="collect")
    assert result.records[0]["iteration_time_ms"] == pytest.approx(250.0)  # 1000 · 4 / 16
    assert [(e.location, e.field) for e in result.errors] == [("item 1", "iteration_time_ms")]


def test_file_level_errors(tmp_path):
    with pytest.raises(InputError, match="unsupported file type"):
        read_run_log(tmp_path / "runs.xlsx")
    with pytest.raises(InputError, match="no such file"):
        read_run_log(tmp_path / "missing.csv")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="broken.parquet"):
        read_run_log(tmp_path / "broken.parquet", errors="collect")
    with pytest.raises(ValueError):
        read_run_log(DATA / "runs_valid.csv", errors="ignore")


def test_strategy_kind_names():
    def kind(**s):
        return strategy_kind(RunSpec.from_dict({"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100",
                                                                                  "num_devices": 8},
                                                "strategy": s}).strategy)
    assert kind(tp=8) == "tp"
    assert kind(tp=2, pp=2) == "tp+pp+dp"
    assert kind(zero_stage=2) == "zero"
    assert kind(fsdp=True, tp=2) == "tp+fsdp"
    assert strategy_kind(RunSpec.from_dict({"model": "gpt3-125m", "hardware": {"device": "A100-SXM4-80GB",
                                                                              "num_devices": 1}}).strategy) == \
        "single"


# ============================================================================ traces
def _op(records, op, direction="fwd", **match):
    found = [r for r in records if r["op"] == op and r["direction"] == direction
             and all(json.loads(r[k]) == v if k in ("shape", "params") else r[k] == v for k, v in match.items())]
    assert len(found) == 1, (op, direction, match, [(r["op"], r["direction"], r["shape"]) for r in records])
    return found[0]


def test_real_cpu_trace_of_torch_profiler():
    path = DATA / "kineto_cpu_small.json"
    assert path.stat().st_size < 300_000
    result = ingest_trace(path)
    ops = result.ops
    assert ops and all(set(r) == set(OP_COLUMNS) for r in ops)
    assert {r["timer"] for r in ops} == {"torch.profiler"}
    assert {r["source"] for r in ops} == {"ingested:kineto_cpu_small.json"}
    assert {(r["backend"], r["device_name"]) for r in ops} == {("cpu", "cpu")}

    # fc1: x [16, 64] · W[128, 64]^T + b: 2·16·128·64 FLOPs; reads x, W, b, writes [16, 128], fp32
    fc1 = _op(ops, "aten::linear", shape=[1, 16, 128, 64])
    assert (fc1["kind"], fc1["dtype"], fc1["flops"]) == ("matmul", "fp32", 2.0 * 16 * 128 * 64)
    assert fc1["bytes"] == 4.0 * (16 * 64 + 128 * 64 + 128 + 16 * 128)
    assert fc1["repeats"] == 2  # two active steps, one call each
    assert 0 < fc1["time_p10_ms"] <= fc1["time_ms"] <= fc1["time_p90_ms"]
    fc2 = _op(ops, "aten::linear", shape=[1, 16, 32, 128])
    assert fc2["flops"] == 2.0 * 16 * 32 * 128
    ln = _op(ops, "aten::layer_norm", shape=[16, 128])
    assert (ln["kind"], ln["flops"], ln["bytes"]) == ("layernorm", 5.0 * 16 * 128, 4.0 * (2 * 16 * 128 + 2 * 128))
    sm = _op(ops, "aten::softmax", shape=[16, 32])
    assert (sm["kind"], sm["bytes"]) == ("softmax", 4.0 * 2 * 16 * 32)
    # backward GEMMs of the linears and the optimizer's in-place updates
    bwd = {(r["op"], r["shape"]) for r in ops if r["direction"] == "bwd"}
    assert ("aten::mm", "[1,16,128,32]") in bwd and ("aten::native_layer_norm_backward", "[16,128]") in bwd
    assert {r["op"] for r in ops if r["direction"] == "opt"} == {"aten::add_"}
    assert all(r["op"].startswith("aten::") for r in ops)
    assert isinstance(result.unmapped, dict) and result.unattributed == {}

    times = trace_step_times(path)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert [s["step"] for s in result.steps] == [2, 3]
    assert [s["time_ms"] for s in result.steps] == times
    assert all(0 < s["op_time_ms"] < s["time_ms"] for s in result.steps)


def test_gpu_style_trace_uses_kernel_times():
    result = ingest_trace(DATA / "kineto_gpu_small.json")
    ops = result.ops
    assert result.occurrences == 14 and len(ops) == 7

    lin = _op(ops, "aten::linear")
    # x [4, 512, 1024] · W[4096, 1024]^T + b in bf16: m = 2048 rows
    assert json.loads(lin["shape"]) == [1, 2048, 4096, 1024]
    assert lin["flops"] == 2.0 * 2048 * 4096 * 1024
    assert lin["bytes"] == 2.0 * (2048 * 1024 + 4096 * 1024 + 4096 + 2048 * 4096)
    assert (lin["dtype"], lin["backend"], lin["repeats"]) == ("bf16", "cuda", 2)
    # kernel durations 120 and 130 us
    assert (lin["time_ms"], lin["time_p10_ms"], lin["time_p90_ms"]) == pytest.approx((0.125, 0.121, 0.129))
    assert lin["device_name"] == "A100-SXM4-80GB"  # deviceProperties name found in the catalog
    assert lin["host"] == "gpu-node-0" and lin["measured_at"] == "2024-05-01T10:40:00+00:00"

    attn = _op(ops, "aten::_scaled_dot_product_flash_attention")
    assert json.loads(attn["shape"]) == [4, 16, 512, 512, 64] and json.loads(attn["params"]) == {"causal": True}
    assert attn["flops"] == 2.0 * 4 * 16 * 512 * 512 * (64 + 64)
    assert attn["bytes"] == 2.0 * (3 * 4 * 16 * 512 * 64 + 4 * 16 * 512 * 64)
    assert attn["time_ms"] == pytest.approx(0.085)

    ln = _op(ops, "aten::layer_norm")
    assert ln["kind"] == "layernorm" and ln["time_ms"] == pytest.approx(0.011)
    gelu = _op(ops, "aten::gelu")
    assert (gelu["kind"], gelu["bytes"]) == ("elementwise", 2.0 * 2 * 4 * 512 * 4096)

    mm = _op(ops, "aten::mm", "bwd")
    assert json.loads(mm["shape"]) == [1, 4096, 1024, 2048] and mm["time_ms"] == pytest.approx(0.105)

    ar = _op(ops, "c10d::allreduce_", "comm")
    assert (ar["kind"], ar["bytes"], ar["world_size"], ar["backend"]) == ("allreduce", 2.0 * 1024 * 1024, 8, "nccl")
    assert json.loads(ar["shape"]) == [2 * 1024 * 1024] and ar["dtype"] == "bf16"
    assert ar["time_ms"] == pytest.approx(0.32)

    host = _op(ops, "aten::add_")  # ran on the host: CPU time, CPU device
    assert (host["backend"], host["device_name"], host["time_ms"]) == ("cpu", "cpu", pytest.approx(0.008))

    # nothing hidden: the op of unknown kind and the kernel launched outside any op are reported
    assert result.unmapped == {"aten::nonzero": {"count": 2, "time_ms": pytest.approx(0.010),
                                                 "reason": "unknown ATen op kind"}}
    assert result.unattributed == {"my_custom_kernel": {"count": 2, "time_ms": pytest.approx(0.014)}}
    assert trace_step_times(DATA / "kineto_gpu_small.json") == pytest.approx([2.0, 2.1])
    s1 = result.steps[0]
    assert s1["kernel_time_ms"] == pytest.approx((120 + 80 + 10 + 20 + 5 + 100 + 300 + 7) / 1e3)
    assert s1["comm_time_ms"] == pytest.approx(0.3) and s1["num_ops"] == 7


def test_trace_device_argument_and_dict_input():
    trace = json.loads((DATA / "kineto_gpu_small.json").read_text())
    ops = trace_op_records(trace, device="H100-SXM5-80GB", host="h", threads=4)
    gpu = [r for r in ops if r["backend"] != "cpu"]
    assert {r["device_name"] for r in gpu} == {"H100-SXM5-80GB"}
    assert {r["host"] for r in ops} == {"h"} and {r["threads"] for r in ops} == {4}
    assert {r["source"] for r in ops} == {"ingested:<trace>"}


def _ev(name, ts, dur, dims, types, concrete=None):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete or [""] * len(dims)}}


def test_trace_conv_embedding_cross_entropy_attention_shapes():
    events = [
        # conv2d: [1, 3, 8, 8] * [4, 3, 3, 3], stride 2, padding 1 → out 4x4; implicit GEMM (1, 16, 4, 27)
        _ev("aten::conv2d", 0, 10, [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []],
            ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]),
        _ev("aten::embedding", 20, 5, [[10, 4], [1, 2], [], [], []], ["float", "long int", "Scalar", "Scalar", "Scalar"]),
        _ev("aten::cross_entropy_loss", 30, 5, [[4, 10], [4], [], [], [], []],
            ["float", "long int", "", "Scalar", "Scalar", "Scalar"], ["", "", "", "1", "-100", "0."]),
        _ev("aten::scaled_dot_product_attention", 40, 5, [[1, 2, 8, 4]] * 3 + [[], [], [], [], []],
            ["float"] * 3 + ["", "Scalar", "Scalar", "", "Scalar"], ["", "", "", "", "0.", "True", "", "False"]),
        _ev("aten::sum", 50, 2, [[6, 5], [], [], []], ["float", "ScalarList", "Scalar", ""], ["", "[1]", "False", ""]),
    ]
    ops = {r["op"]: r for r in ingest_trace({"traceEvents": events}).ops}
    conv = ops["aten::conv2d"]
    assert json.loads(conv["shape"]) == [1, 16, 4, 27] and conv["flops"] == 2.0 * 16 * 4 * 27
    assert json.loads(conv["params"])["stride"] == [2, 2]
    assert conv["bytes"] == 4.0 * (3 * 64 + 4 * 27 + 4 * 16)
    emb = ops["aten::embedding"]
    assert (emb["kind"], json.loads(emb["shape"]), emb["bytes"]) == ("embedding", [2, 4], 2 * 8 + 2.0 * 2 * 4 * 4)
    ce = ops["aten::cross_entropy_loss"]
    # log_softmax reads and writes the logits, nll reads a row each, the targets, writes one loss
    assert (ce["kind"], ce["flops"]) == ("cross_entropy", 5.0 * 40)
    assert ce["bytes"] == 4.0 * (2 * 40 + 4 + 1) + 8 * 4
    attn = ops["aten::scaled_dot_product_attention"]
    assert json.loads(attn["shape"]) == [1, 2, 8, 8, 4] and json.loads(attn["params"]) == {"causal": True}
    red = ops["aten::sum"]
    assert red["bytes"] == 4.0 * (30 + 6)  # reads [6, 5], writes one value per row


@pytest.mark.parametrize("name, kind, backward", [
    ("aten::addmm", "matmul", False), ("aten::linear", "matmul", False), ("aten::bmm", "matmul", False),
    ("aten::_scaled_dot_product_efficient_attention", "attention", False),
    ("aten::_scaled_dot_product_flash_attention_backward", "attention", True),
    ("aten::native_layer_norm_backward", "layernorm", True), ("aten::softmax", "softmax", False),
    ("aten::gelu", "elementwise", False), ("aten::add_", "elementwise", False),
    ("aten::embedding_dense_backward", "embedding", True), ("aten::convolution", "conv", False),
    ("aten::nll_loss_forward", "cross_entropy", False), ("aten::cross_entropy_loss", "cross_entropy", False),
    ("aten::_foreach_mul_", "elementwise", False), ("aten::view", None, False), ("aten::nonzero", "other", False),
])
def test_aten_kinds(name, kind, backward):
    assert aten_kind(name) == (kind, backward)


def test_malformed_traces_name_file_and_event():
    with pytest.raises(InputError) as exc:
        ingest_trace(DATA / "trace_missing_dur.json")
    text = str(exc.value)
    assert "trace_missing_dur.json" in text and "traceEvents[3]" in text and "'dur'" in text
    with pytest.raises(InputError) as exc:
        trace_step_times(DATA / "trace_truncated.json")
    assert "trace_truncated.json" in str(exc.value) and "not a JSON trace" in str(exc.value)


def test_trace_structure_errors(tmp_path):
    cases = {"no_events.json": ({"schemaVersion": 1}, "no 'traceEvents'"),
             "bad_event.json": ({"traceEvents": [1]}, "traceEvents[0]"),
             "bad_ts.json": ({"traceEvents": [{"ph": "X", "name": "a", "ts": "x", "dur": 1}]}, "field 'ts'")}
    for name, (data, words) in cases.items():
        (tmp_path / name).write_text(json.dumps(data))
        with pytest.raises(InputError) as exc:
            read_chrome_trace(tmp_path / name)
        assert name in str(exc.value) and words in str(exc.value)
    with pytest.raises(InputError, match="cannot read"):
        read_chrome_trace(tmp_path / "missing.json")


def test_shapes_missing_go_to_unmapped():
    ev = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 3, "args": {}}
    result = ingest_trace({"traceEvents": [ev]})
    assert result.ops == [] and result.unmapped["aten::mm"]["count"] == 1
    assert "record_shapes" in result.unmapped["aten::mm"]["reason"]


# ============================================================================ public data sets
def _need(*names):
    missing = [n for n in names if not (SHARED / n).exists()]
    if missing:
        pytest.skip(f"public data not available: {', '.join(str(SHARED / n) for n in missing)}")


def test_neusight_ops_subset():
    _need("neusight_ops.parquet", "neusight_devices.csv")
    import pandas as pd

    from learnedperf.measure.public import load_neusight_ops

    df = load_neusight_ops(devices=["T4"], ops=["linear", "ln", "conv", "addu"])
    assert list(df.columns) == list(OP_COLUMNS)
    raw = pd.read_parquet(SHARED / "neusight_ops.parquet",
                          columns=["op", "device", "latency_ms", "B", "H", "M", "N", "K", "Input_Channel",
                                   "Output_Channel", "Input_Size"],
                          filters=[("device", "==", "Tesla T4"), ("op", "in", ["linear", "ln", "conv", "addu"])])
    assert len(df) == len(raw)
    assert set(df["device_name"]) == {"T4"} and set(df["source"]) == {"neusight"}
    dev = DeviceSpec.parse(json.loads(df["device"].iloc[0]))
    assert dev.peak_tflops.fp32 == pytest.approx(8.141) and dev.memory_bandwidth_GBps == 320
    assert (df["time_ms"].to_numpy() == raw["latency_ms"].to_numpy()).all()

    i = int((raw["op"] == "linear").to_numpy().argmax())
    r, row = df.iloc[i], raw.iloc[i]
    b, m, n, k = (int(row[c]) for c in ("B", "M", "N", "K"))
    # NeuSight: [B, M, N] x [B, N, K] -> [B, M, K]; our (batch, m, n, k) has the reduction last
    assert (r["kind"], json.loads(r["shape"])) == ("matmul", [b, m, k, n])
    assert r["flops"] == 2.0 * b * m * n * k and r["bytes"] == 4.0 * b * (m * n + n * k + m * k)
    assert json.loads(r["params"])["neusight_op"] == "linear" and r["dtype"] == "fp32"

    i = int((raw["op"] == "ln").to_numpy().argmax())
    r, row = df.iloc[i], raw.iloc[i]
    rows, cols = int(row["B"]), int(row["H"])
    assert (r["kind"], r["flops"], r["bytes"]) == ("layernorm", 5.0 * rows * cols, 4.0 * (2 * rows * cols + 2 * cols))

    i = int((raw["op"] == "addu").to_numpy().argmax())
    assert df.iloc[i]["bytes"] == 4.0 * 2 * raw.iloc[i]["B"] * raw.iloc[i]["H"]

    i = int((raw["op"] == "conv").to_numpy().argmax())
    r, row = df.iloc[i], raw.iloc[i]
    size, cin, cout, bsz = (int(row[c]) for c in ("Input_Size", "Input_Channel", "Output_Channel", "B"))
    out = size  # kernel 3, stride 1, padding 1 keep the size
    assert json.loads(r["shape"]) == [1, bsz * out * out, cout, cin * 9]
    assert r["flops"] == 2.0 * bsz * out * out * cout * cin * 9


def test_neusight_steps_keep_forward_only_runs_and_skip_encoder_decoders_explicitly():
    _need("neusight_step_times.csv", "neusight_model_configs", "neusight_devices.csv")
    from learnedperf.measure.public import load_neusight_steps

    loaded = load_neusight_steps()
    # 40 rows: 6 Switch (encoder-decoder) inference runs skipped, 31 inference and 3 training runs kept
    assert loaded.skipped == {"encoder-decoder": 6} and len(loaded.records) == 34
    assert all(set(r) == set(STEP_COLUMNS) for r in loaded.records)
    specs = {r["run_id"]: RunSpec.from_dict(json.loads(r["run"])) for r in loaded.records}
    assert sum(s.strategy.forward_only for s in specs.values()) == 31
    assert Counter(r["device_name"] for r in loaded.records) == {"A100-PCIE-40GB": 10, "V100-PCIE-32GB": 11,
                                                                  "P100-PCIE-16GB": 5, "T4": 5, "P4": 3}
    inf = next(r for r in loaded.records if r["run_id"] and "bert_large-inf-512-8" in json.loads(r["run"])["id"]
               and r["device_name"] == "T4")
    assert inf["iteration_time_ms"] == pytest.approx(694.4645385742188)  # e2e = the forward alone
    s = specs[inf["run_id"]].strategy
    assert (s.forward_only, s.optimizer, s.global_batch_size) == (True, "none", 8)
    rec = min((r for r in loaded.records if not specs[r["run_id"]].strategy.forward_only),
              key=lambda r: r["iteration_time_ms"])  # bert_large-train-512-2 on the V100
    assert rec["iteration_time_ms"] == pytest.approx(234.25801696777344)
    spec = RunSpec.from_dict(json.loads(rec["run"]))
    assert (spec.model.name, spec.model.arch, spec.model.seq_length, spec.model.num_layers) == \
        ("bert_large", "bert", 512, 24)
    assert (spec.strategy.global_batch_size, spec.strategy.precision, spec.strategy.flash_attention,
            spec.strategy.optimizer) == (2, "fp32", False, "none")
    assert (rec["world_size"], rec["device_name"], rec["source"]) == (1, "V100-PCIE-32GB", "neusight")


def test_vtrain_step_records():
    _need("vtrain/ground_truth_single_node.csv")
    from learnedperf.measure.public import load_vtrain, vtrain_step_records

    recs = vtrain_step_records()
    runs = load_vtrain()
    assert len(recs) == len(runs) == 1440
    assert all(set(r) == set(STEP_COLUMNS) for r in recs[:10])
    assert [r["iteration_time_ms"] for r in recs] == [m.iteration_time_ms for m in runs]
    assert {r["source"] for r in recs} == {"vtrain"} and {r["device_name"] for r in recs} == {"A100-SXM4-80GB"}
    assert recs[0]["run_id"] == run_id(runs[0].run) and not math.isnan(recs[0]["iteration_time_ms"])
