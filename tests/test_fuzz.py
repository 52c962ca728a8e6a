"""Property-based tests (hypothesis): malformed runs never give a traceback or a 500.

* The batch command line (``learnedperf predict --input -``), in-process, one invocation
  per generated batch of lines: every output line is a prediction or an
  ``{"error": "line N: ...", "line": N}`` object, in order; the exit status is 0 or 1.
* The HTTP service on 127.0.0.1: every answer is below 500 and JSON; an error answer is
  ``{"error": "..."}``.
* The issue's batch: 200 malformed runs mixed with 50 valid ones through the command line.

Generated input: random JSON values, raw text, valid runs with fields replaced by values of
the wrong type or range (negative, zero, huge integers, NaN, Infinity), deleted or unknown
fields, and well-typed strategies that do not fit their model and cluster.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import sys
from typing import Any
from unittest import mock
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import check_prediction
from test_service import Client, predictor, url  # noqa: F401 - module-scoped fixtures: the checkpoint, a live service

from learnedperf.cli import main
from learnedperf.predict import Predictor

SMALL_MODELS = ["gpt3-125m", "gpt3-1.3b", "llama-2-7b", "mixtral-8x7b", "bert-base"]
BASE_RUNS = [
    {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8}, "strategy": {"tp": 2}},
    {"model": "llama-2-7b", "hardware": {"device": "H100-SXM5-80GB", "num_devices": 16, "devices_per_node": 8},
     "strategy": {"tp": 4, "pp": 2, "micro_batch_size": 1, "global_batch_size": 64, "recompute": "selective"}},
    {"model": {"arch": "gpt", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
               "vocab_size": 32000, "seq_length": 512},
     "hardware": {"cluster": "dgx-h100", "num_devices": 4}, "strategy": {"tp": 2, "zero_stage": 1}},
]
FIELDS = [("model",), ("model", "num_layers"), ("model", "hidden_size"), ("model", "num_attention_heads"),
          ("model", "seq_length"), ("hardware",), ("hardware", "num_devices"), ("hardware", "cluster"),
          ("hardware", "device"), ("hardware", "devices_per_node"), ("hardware", "inter_node_bandwidth_GBps"),
          ("strategy",), ("strategy", "tp"), ("strategy", "pp"), ("strategy", "dp"), ("strategy", "cp"),
          ("strategy", "ep"), ("strategy", "micro_batch_size"), ("strategy", "global_batch_size"),
          ("strategy", "pipeline_schedule"), ("strategy", "virtual_pipeline_stages"), ("strategy", "zero_stage"),
          ("strategy", "recompute"), ("strategy", "precision"), ("strategy", "sequence_parallel"), ("id",),
          ("meta",)]
ODD_VALUES = [0, -1, -8, 3, 7, 10 ** 6, 10 ** 30, 2 ** 63, 2 ** 64 + 1, -(2 ** 70), 1.5, 1e300, -0.0,
              float("nan"), float("inf"), float("-inf"), "8", "", True, False, None, [], {}, [8], {"tp": 2}]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@st.composite
def mutated_runs(draw) -> dict:
    """A valid run with 1-3 fields replaced by odd values, deleted, or joined by an unknown field."""
    run = copy.deepcopy(draw(st.sampled_from(BASE_RUNS)))
    for _ in range(draw(st.integers(1, 3))):
        *parents, key = draw(st.sampled_from(FIELDS))
        node = run
        for name in parents:
            if not isinstance(node.get(name), dict):
                node[name] = {}
            node = node[name]
        action = draw(st.sampled_from(["odd", "json", "delete", "unknown"]))
        if action == "odd":
            # a copy: ODD_VALUES holds mutable {} and [] that a later mutation may write into (a shared
            # object would leak state between examples, or end up inside itself)
            node[key] = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
        elif action == "json":
            node[key] = draw(json_values)
        elif action == "delete":
            node.pop(key, None)
        else:
            node[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    return run


@st.composite
def inconsistent_runs(draw) -> dict:
    """Well-typed runs whose strategy may not fit the model and cluster (tp vs heads, pp vs layers, ...)."""
    knobs = draw(st.dictionaries(
        st.sampled_from(["tp", "pp", "dp", "cp", "ep", "micro_batch_size", "global_batch_size",
                         "virtual_pipeline_stages"]), st.integers(-2, 64), max_size=5))
    knobs.update(draw(st.fixed_dictionaries({}, optional={
        "pipeline_schedule": st.sampled_from(["gpipe", "1f1b", "interleaved", "zigzag"]),
        "recompute": st.sampled_from(["none", "selective", "full", "some"]),
        "zero_stage": st.integers(-1, 4), "precision": st.sampled_from(["fp32", "bf16", "fp8", "int4"])})))
    return {"model": draw(st.sampled_from(SMALL_MODELS)),
            "hardware": {"cluster": draw(st.sampled_from(["dgx-a100", "dgx-h100", "dgx-v100"])),
                         "num_devices": draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 64]))},
            "strategy": knobs}


runs = mutated_runs() | inconsistent_runs()
# one input line: a JSON value (NaN / Infinity spelt as Python's json writes them), or raw text
lines = runs.map(json.dumps) | (runs | json_values).map(json.dumps) | st.text(min_size=1, max_size=60).filter(
    lambda s: s.strip() and "\n" not in s and "\r" not in s)

FIRST = json.dumps({**BASE_RUNS[0], "id": "first"})  # a valid first line: the input is read as JSON Lines


def cli_batch(text: str, predictor: Any = None) -> tuple[int, list[dict], str]:
    """``learnedperf predict --input - --output -`` on ``text``: (status, output objects, stderr).

    ``predictor`` replaces the checkpoint loading (one load serves every generated batch).
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(sys, "stdin", io.StringIO(text)))
        if predictor is not None:
            stack.enter_context(mock.patch.object(Predictor, "load", lambda path=None: predictor))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        status = main(["predict", "--input", "-", "--output", "-"])
    return status, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def assert_error_line(obj: dict, line_no: int) -> None:
    """A batch error object for input line ``line_no``."""
    assert obj.get("line") == line_no, obj
    assert isinstance(obj.get("error"), str) and obj["error"].startswith(f"line {line_no}: "), obj
    assert "internal error" not in obj["error"], obj  # the input was not validated before use


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.lists(lines, min_size=1, max_size=30))
def test_cli_batch_answers_every_line(predictor, body):
    text = "\n".join([FIRST, *body]) + "\n"
    status, out, err = cli_batch(text, predictor)
    assert status in (0, 1) and "Traceback" not in err
    assert len(out) == len(body) + 1
    for line_no, obj in enumerate(out, start=1):
        if "error" in obj:
            assert_error_line(obj, line_no)
        else:
            assert obj["iteration_time_ms"] > 0 and obj["source"], obj
    assert out[0].get("id") == "first" and (status == 1) == any("error" in o for o in out)


# --------------------------------------------------------------------------- the service
def _check_answer(status: int, body: Any, path: str) -> None:
    assert status < 500, body
    if status >= 400:
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
        assert "internal error" not in body["error"], body
    elif path.startswith("/predict/batch"):
        assert isinstance(body["predictions"], list)
        for pred in body["predictions"]:
            assert "internal error" not in pred.get("error", ""), pred
    elif path.startswith("/predict"):
        assert body["iteration_time_ms"] > 0
    else:
        assert isinstance(body["results"], list)


content_types = st.sampled_from([None, None, None, "application/json", "application/json; charset=utf-8",
                                 "application/problem+json", "text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=x", ""])
search_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(SMALL_MODELS) | json_values,
     "hardware": st.sampled_from([r["hardware"] for r in BASE_RUNS]) | json_values},
    optional={"constraints": st.dictionaries(st.sampled_from(["global_batch_size", "tp", "max_pp", "x"]),
                                             json_values | st.integers(-4, 4096), max_size=2),
              "top": st.integers(-2, 50) | json_values})
batch_bodies = st.fixed_dictionaries({"runs": st.lists(runs | json_values, max_size=4)},
                                     optional={"tier": st.sampled_from(["fast", "full"]) | json_values})
requests = st.one_of(
    st.tuples(st.sampled_from(["/predict", "/predict?tier=full", "/predict?tier=" + quote("\u00e9\x00")]),
              (runs | json_values).map(json.dumps)),
    st.tuples(st.just("/predict/batch"), batch_bodies.map(json.dumps)),
    st.tuples(st.just("/search"), search_bodies.map(json.dumps)),
    st.tuples(st.sampled_from(["/predict", "/predict/batch", "/search"]), json_values.map(json.dumps)),
    st.tuples(st.sampled_from(["/predict", "/predict/batch", "/search"]), st.binary(max_size=64)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests, content_type=content_types)
def test_service_never_answers_500(url, request, content_type):
    path, body = request
    headers = {} if content_type is None else {"Content-Type": content_type}
    client = Client(url, timeout_s=60)
    try:
        status, answer = client.request("POST", path, body, headers)
    finally:
        client.close()
    _check_answer(status, answer, path)


# --------------------------------------------------------------------------- the issue's batch
def malformed_lines() -> list[str]:
    """200 lines, each invalid in one of 20 ways (10 variants each); objects carry an id."""
    base = BASE_RUNS[0]
    hw, strategy = base["hardware"], base["strategy"]

    def run(k: int, **parts: Any) -> str:
        obj = {**copy.deepcopy(base), "id": f"bad-{k}", **parts}
        return json.dumps(obj)

    kinds = [
        lambda k: '{"model": "gpt3-1.3b", "hardware": ' + "{" * k,                    # invalid JSON
        lambda k: json.dumps([base] * k),                                              # an array
        lambda k: json.dumps(f"run {k}") if k % 2 else str(k),                         # a string / number
        lambda k: json.dumps({"hardware": hw, "strategy": strategy, "id": f"bad-{k}"}),     # no model
        lambda k: json.dumps({"model": "gpt3-1.3b", "id": f"bad-{k}"}),                # no hardware
        lambda k: run(k, model=f"gpt-{k}-zillion"),                                    # unknown model
        lambda k: run(k, hardware={"device": f"Z{k}000", "num_devices": 8}),           # unknown device
        lambda k: run(k, hardware={"cluster": f"dgx-{k}00x", "num_devices": 8}),      # unknown cluster
        lambda k: run(k, hardware={"cluster": "dgx-a100", "num_devices": 6 * (k + 1)},
                      strategy={"tp": 3}),                                             # 3 does not divide 16 heads
        lambda k: run(k, hardware={"cluster": "dgx-a100", "num_devices": -k - 1}),     # negative size
        lambda k: run(k, strategy={"tp": 2, "micro_batch_size": -k}),                  # micro-batch <= 0
        lambda k: run(k, strategy={"tp": 2, "dp": 3 + 2 * k}),                         # tp*dp != devices
        lambda k: run(k, hardware={"cluster": "dgx-a100", "num_devices": 32},
                      strategy={"pp": 32}),                                            # 24 layers < pp
        lambda k: run(k, strategy={"tp": 2, "global_batch_size": 4 * k + 1}),          # not a multiple of dp
        lambda k: run(k, hardware={"cluster": "dgx-a100", "num_devices": float("nan")}),  # NaN
        lambda k: run(k, hardware={"cluster": "dgx-a100", "num_devices": 10 ** (30 + k)}),  # huge integer
        lambda k: run(k, strategy={"tp": ["two", "2x", 2.5, None, -2, {}, [], "", "x", 1e9][k]}),  # wrong type
        lambda k: run(k, **{f"unknown_{k}": 1}),                                       # unknown field
        lambda k: run(k, strategy={"tp": 2, "pipeline_schedule": f"zigzag{k}"}),       # unknown schedule
        lambda k: run(k, strategy={"tp": 2, "precision": f"int{k + 2}"}),             # unknown precision
    ]
    return [kind(k) for kind in kinds for k in range(10)]


def valid_runs() -> list[dict]:
    """50 valid runs of two small models on 8-64 A100s, each with an id."""
    out = []
    for i in range(50):
        devices = (8, 16, 32, 64)[i % 4]
        tp, pp = (1, 2, 4, 8)[i % 4 if i % 3 else 1], (1, 2)[i % 2]
        out.append({"model": ("gpt3-1.3b", "gpt3-350m")[i % 2],
                    "hardware": {"cluster": "dgx-a100", "num_devices": devices},
                    "strategy": {"tp": tp, "pp": pp, "micro_batch_size": 1 + i % 3}, "id": f"ok-{i}"})
    return out


def test_issue_batch_200_malformed_50_valid():
    good = [json.dumps(r) for r in valid_runs()]
    bad = malformed_lines()
    assert len(good) == 50 and len(bad) == 200
    mixed = [(line, True) for line in good] + [(line, False) for line in bad]
    random.Random(6).shuffle(mixed)
    status, out, err = cli_batch("".join(line + "\n" for line, _ in mixed))
    assert status == 1 and "200 of 250 runs failed" in err and "Traceback" not in err
    assert len(out) == 250
    for line_no, ((line, ok), obj) in enumerate(zip(mixed, out), start=1):
        if ok:
            assert "error" not in obj, (line, obj)
            check_prediction(obj)
            assert obj["id"] == json.loads(line)["id"]
        else:
            assert_error_line(obj, line_no)
