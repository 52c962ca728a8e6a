"""Tests of the HTTP service (``learnedperf.service``).

A real uvicorn server runs on 127.0.0.1 on an ephemeral port, in a background thread,
for the whole module; the clients are the standard library's ``http.client``. One test
runs :func:`~learnedperf.service.serve` in a subprocess, as ``learnedperf serve`` does.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Optional
from urllib.parse import urlsplit

import pytest
from test_cli import check_prediction

import learnedperf
from learnedperf.predict import Predictor
from learnedperf.service import create_app, is_loopback, running, serve

MODEL, CLUSTER = "gpt3-1.3b", "dgx-a100"


def run_dict(num_devices: int = 8, **strategy: Any) -> dict:
    """A valid run of gpt3-1.3b on DGX A100s; ``strategy`` defaults to tp=2."""
    return {"model": MODEL, "hardware": {"cluster": CLUSTER, "num_devices": num_devices},
            "strategy": {"tp": 2, **strategy}}


class Client:
    """A persistent HTTP/1.1 connection to the service; answers are ``(status, parsed JSON body)``."""

    def __init__(self, url: str, timeout_s: float = 60.0):
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)

    def request(self, method: str, path: str, body: Any = None, headers: Optional[dict] = None,
                **kwargs: Any) -> tuple[int, Any]:
        """Send ``body`` (an object is JSON-encoded; str / bytes / iterables go as they are)."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        sent = {"Content-Type": "application/json"} if body is not None else {}
        sent.update(headers or {})
        self.conn.request(method, path, body=body, headers=sent, **kwargs)
        response = self.conn.getresponse()
        text = response.read().decode("utf-8")
        assert "Traceback" not in text
        return response.status, json.loads(text)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def assert_error(status: int, body: Any, expected_status: int, *fragments: str) -> None:
    """An error answer: the status, ``{"error": text}`` and each fragment in the text."""
    assert status == expected_status, body
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    for fragment in fragments:
        assert fragment in body["error"], body


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    """The shipped checkpoint, loaded once for the module."""
    return Predictor.load()


@pytest.fixture(scope="module")
def url(predictor: Predictor):
    """Base URL of a live service on 127.0.0.1 (ephemeral port), stopped after the module."""
    with running(create_app(predictor)) as base:
        yield base


@pytest.fixture
def client(url: str):
    """A connection to the module's service."""
    c = Client(url)
    yield c
    c.close()


# --------------------------------------------------------------------------- answers
def test_health(client):
    status, body = client.request("GET", "/health")
    assert status == 200
    assert body["status"] == "ok" and body["version"] == learnedperf.__version__
    assert body["checkpoint"].startswith("checkpoint:default:")


@pytest.mark.parametrize("tier", ["fast", "full"])
def test_predict_one(client, tier):
    status, pred = client.request("POST", f"/predict?tier={tier}", {**run_dict(), "id": "one"})
    assert status == 200, pred
    check_prediction(pred)
    lo, hi = pred["interval_ms"]
    assert 0 < lo <= pred["iteration_time_ms"] <= hi
    assert pred["id"] == "one" and pred["source"].startswith("checkpoint:default:")


def test_predict_default_tier_is_fast(client, predictor):
    status, pred = client.request("POST", "/predict", run_dict(pp=2))
    assert status == 200
    assert pred == json.loads(json.dumps(predictor.predict(run_dict(pp=2), tier="fast")))


def test_batch_keeps_order_and_names_the_fields(client):
    runs = [{**run_dict(), "id": "a"},
            {**run_dict(tp=3), "id": "bad-tp"},                        # 3 does not divide 8 devices
            {**run_dict(micro_batch_size=2), "id": "c"},
            "not a run",
            {"hardware": {"cluster": CLUSTER, "num_devices": 8}},       # no model
            {**run_dict(global_batch_size=3), "id": "bad-batch"}]            # 3 is not a multiple of dp=4
    status, body = client.request("POST", "/predict/batch", {"runs": runs})
    assert status == 200, body
    preds = body["predictions"]
    assert len(preds) == len(runs) and body["failed"] == 4
    assert [p.get("id") for p in preds] == ["a", "bad-tp", "c", None, None, "bad-batch"]
    check_prediction(preds[0])
    check_prediction(preds[2])
    for index, field in ((1, "strategy.tp"), (3, "JSON object"), (4, "model"), (5, "global_batch_size")):
        assert preds[index]["index"] == index and field in preds[index]["error"], preds[index]


def test_batch_indexes_count_across_chunks(client):
    """A batch larger than one predict_many chunk numbers its bad runs from the start of the batch."""
    runs = [run_dict(micro_batch_size=1 + i % 4) for i in range(600)]
    runs[3] = runs[517] = run_dict(tp=5)
    status, body = client.request("POST", "/predict/batch", {"runs": runs, "tier": "fast"})
    assert status == 200 and body["failed"] == 2
    assert [p["index"] for p in body["predictions"] if "error" in p] == [3, 517]
    assert all(p["iteration_time_ms"] > 0 for p in body["predictions"] if "error" not in p)


def test_search(client):
    request = {"model": MODEL, "hardware": {"cluster": CLUSTER, "num_devices": 16},
               "constraints": {"global_batch_size": 64}, "top": 3}
    status, body = client.request("POST", "/search", request)
    assert status == 200, body
    assert 1 <= len(body["results"]) <= 3
    status, body = client.request("POST", "/search", {**request, "constraints": {"no_such_knob": 1}})
    assert_error(status, body, 422, "no_such_knob")


class BlockingSearch:
    """A stand-in predictor whose search waits until the test releases it."""

    source = "stand-in"

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def search(self, model: Any, hardware: Any, constraints: Optional[dict] = None, top: int = 10) -> dict:
        """Block until released; no results."""
        self.started.set()
        self.release.wait(30)
        return {"results": []}


def _while_searching(predictor: Any, searcher: BlockingSearch, method: str, path: str, body: Any = None):
    """Start a /search that blocks in ``searcher``, make one other request meanwhile, then release the
    search; return that request's answer (the search must still end 200)."""
    answers: list = []
    with running(create_app(predictor)) as base:
        thread = threading.Thread(target=lambda: answers.append(
            Client(base).request("POST", "/search", {"model": MODEL, "hardware": {}})))
        thread.start()
        try:
            assert searcher.started.wait(30)
            answer = Client(base, timeout_s=10).request(method, path, body)
            assert not searcher.release.is_set()  # answered while the search still blocked
        finally:
            searcher.release.set()
            thread.join(30)
    assert answers == [(200, {"results": []})]
    return answer


def test_health_answers_while_a_search_runs():
    """A search runs in the worker thread: meanwhile the event loop still answers."""
    stand_in = BlockingSearch()
    status, body = _while_searching(stand_in, stand_in, "GET", "/health")
    assert status == 200 and body["checkpoint"] == "stand-in"


class ForkingStandIn:
    """A stand-in predictor that answers fast batches at once and forks into a blocking searcher."""

    source = "stand-in"

    def __init__(self) -> None:
        self.searcher = BlockingSearch()

    def fork(self) -> BlockingSearch:
        return self.searcher

    def predict_many(self, runs: list, tier: str = "fast", errors: str = "raise") -> list:
        return [{"iteration_time_ms": 1.0, "interval_ms": [1.0, 1.0]} for _ in runs]


def test_fast_predictions_go_on_while_a_search_runs():
    """The search holds the forked predictor in the worker thread, not the fast lane's lock."""
    stand_in = ForkingStandIn()
    status, body = _while_searching(stand_in, stand_in.searcher, "POST", "/predict", run_dict())
    assert status == 200 and body["iteration_time_ms"] == 1.0


def test_openapi_lists_the_endpoints(client):
    status, schema = client.request("GET", "/openapi.json")
    assert status == 200
    paths = schema["paths"]
    for path, method in (("/predict", "post"), ("/predict/batch", "post"), ("/search", "post"),
                         ("/health", "get")):
        op = paths[path][method]
        assert op["summary"] and ("description" in op or method == "get")
        if method == "post":
            assert "application/json" in op["requestBody"]["content"]
            assert {"400", "413", "422"} <= op["responses"].keys()


# --------------------------------------------------------------------------- bad requests
TOO_DEEP = '{"model": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}"


@pytest.mark.parametrize("method, path, body, headers, status, fragment", [
    ("POST", "/predict", '{"model": "gpt3-1.3b", ', None, 400, "invalid JSON"),
    ("POST", "/predict", "", None, 400, "empty body"),
    ("POST", "/predict", "[1, 2]", None, 400, "expected a JSON object, got an array"),
    ("POST", "/predict", '{"model": NaN}', None, 400, "NaN"),
    ("POST", "/predict", '{"model": 1e999}', None, 400, "out of range"),
    ("POST", "/predict", '{"model": ' + "9" * 5000 + "}", None, 400, "digits"),
    ("POST", "/predict", "[" * 100_000, None, 400, "nested"),
    ("POST", "/predict", TOO_DEEP, None, 400, "nested"),
    ("POST", "/predict", b"\xff\xfe\x00", None, 400, "invalid JSON"),
    ("POST", "/predict", json.dumps(run_dict()), {"Content-Type": "text/plain"}, 415, "application/json"),
    ("POST", "/predict", json.dumps(run_dict(tp=3)), None, 422, "strategy.tp"),
    ("POST", "/predict", json.dumps({**run_dict(), "modle": "x"}), None, 422, "modle"),
    ("POST", "/predict", json.dumps({**run_dict(), "hardware": {"device": "Z9000", "num_devices": 8}}), None,
     422, "hardware.device"),
    ("POST", "/predict", json.dumps({**run_dict(), "hardware": {"cluster": CLUSTER, "num_devices": 10 ** 40}}),
     None, 422, "hardware.num_devices"),
    ("POST", "/predict?tier=turbo", json.dumps(run_dict()), None, 422, "tier"),
    ("POST", "/predict/batch", json.dumps({"runs": 5}), None, 400, "runs"),
    ("POST", "/predict/batch", json.dumps({"runs": [], "tier": 1}), None, 400, "tier"),
    ("POST", "/predict/batch", json.dumps({"runz": []}), None, 400, "runz"),
    ("POST", "/predict/batch", json.dumps({"tier": "fast"}), None, 422, "runs"),
    ("POST", "/predict/batch", json.dumps({"runs": [{}] * 10_001}), None, 413, "max_batch"),
    ("POST", "/search", json.dumps({"model": MODEL}), None, 422, "hardware"),
    ("POST", "/search", json.dumps({"model": MODEL, "hardware": {}, "top": True}), None, 400, "top"),
    ("POST", "/search", json.dumps({"model": MODEL, "hardware": {}, "top": 0}), None, 422, "top"),
    ("GET", "/predict", None, None, 405, "GET"),
    ("GET", "/nowhere", None, None, 404, "/nowhere"),
])
def test_bad_requests_are_clear_4xx(client, method, path, body, headers, status, fragment):
    assert_error(*client.request(method, path, body, headers), status, fragment)


def test_body_too_large(client):
    from learnedperf.service import DEFAULT_MAX_BODY_BYTES

    big = " " * DEFAULT_MAX_BODY_BYTES + json.dumps(run_dict())  # valid JSON: the size alone is refused
    assert_error(*client.request("POST", "/predict", big), 413, "max_body_bytes")
    # a chunked body declares no length: the bytes read are counted
    chunks = (b" " * 65_536 for _ in range(DEFAULT_MAX_BODY_BYTES // 65_536 + 4))
    assert_error(*client.request("POST", "/predict", chunks, encode_chunked=True), 413, "max_body_bytes")
    status, _ = client.request("GET", "/health")  # the connection is still usable
    assert status == 200


def test_declared_length_is_refused_before_the_body_is_sent(url):
    """A Content-Length over the limit is answered at once: the server does not wait for the body."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n{")
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert_error(response.status, json.loads(response.read()), 413, "max_body_bytes")


def test_missing_checkpoint_is_503_with_the_reason(tmp_path):
    with running(create_app(checkpoint=str(tmp_path / "none"))) as base:
        c = Client(base)
        assert_error(*c.request("GET", "/health"), 503, "no checkpoint manifest")
        assert_error(*c.request("POST", "/predict", run_dict()), 503, "no checkpoint manifest")
        c.close()


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_batch"):
        create_app(max_batch=0)


# --------------------------------------------------------------------------- load
def test_concurrent_clients_get_their_own_answers(url, predictor):
    """8 clients x 25 requests at once: every request answered, each with the answer of its own run.

    Concurrent fast predictions are answered together by one predict_many call: every fifth
    request is invalid, and only that request gets the error.
    """
    runs = [{**run_dict(num_devices=8 * (1 + i % 4), micro_batch_size=1 + i % 3), "id": f"c{i}"} for i in range(8)]
    expected = [predictor.predict(r)["iteration_time_ms"] for r in runs]
    failures: list[str] = []

    def worker(i: int) -> None:
        c = Client(url, timeout_s=30)
        try:
            for k in range(25):
                if (k + i) % 5 == 0:
                    status, body = c.request("POST", "/predict", {**run_dict(tp=3), "id": f"bad{i}"})
                    ok = status == 422 and "strategy.tp" in body.get("error", "")
                else:
                    status, body = c.request("POST", "/predict", runs[i])
                    ok = status == 200 and body.get("id") == f"c{i}" and \
                        body["iteration_time_ms"] == pytest.approx(expected[i], rel=1e-9)
                if not ok:
                    failures.append(f"client {i}: {status} {body}")
        except Exception as exc:  # noqa: BLE001 - every failure is counted
            failures.append(f"client {i}: {type(exc).__name__}: {exc}")
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


# --------------------------------------------------------------------------- serve()
def test_serve_refuses_a_remote_host(capsys):
    assert serve(host="0.0.0.0", port=0) == 2
    err = capsys.readouterr().err
    assert "0.0.0.0" in err and "loopback" in err and "Traceback" not in err
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")


def test_serve_logs_its_url_and_stops_on_ctrl_c():
    code = "import sys; from learnedperf.service import serve; sys.exit(serve(port=0))"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    watchdog = threading.Timer(90, proc.kill)  # bounds the blocking reads below
    watchdog.start()
    try:
        line = proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert match, line
        # the socket listens before the line is written: the request waits in the backlog if need be
        status, body = Client(match.group(0), timeout_s=30).request("GET", "/health")
        assert status == 200 and body["checkpoint"] in line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        rest = proc.stderr.read()
        assert "stopped" in rest and "Traceback" not in rest
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_import_loads_no_torch():
    code = "import sys, learnedperf.service; print([m for m in ('torch', 'numpy') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
