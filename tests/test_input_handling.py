"""Input mistakes that must give one clear error (or be accepted), never a traceback or a repr.

Each test is a regression test of one QA finding: a single run given to ``predict_many``, a JSON
array or a byte-order mark in an ``--input`` file, a non-string run ``id``, and an unknown tier in an
empty ``/predict/batch``. None of them loads a checkpoint: the checks under test come before any
model is used (the predictor is built without one, the service with a checkpoint that does not exist).
"""

from __future__ import annotations

import io
import json

import pytest
from test_service import Client, assert_error

from learnedperf.cli import main
from learnedperf.errors import InputError, SpecError
from learnedperf.io import load_json_file, read_records
from learnedperf.predict import Predictor
from learnedperf.service import create_app, running
from learnedperf.specs import RunSpec

RUN = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8},
       "strategy": {"tp": 2, "global_batch_size": 16}}
BAD_RUN = {**RUN, "strategy": {"tp": 3}}  # tp=3 does not divide 8 devices: refused before any model runs


@pytest.fixture
def no_checkpoint() -> Predictor:
    """A predictor without a checkpoint: enough for what is refused before a model is used."""
    return Predictor(None)


# ---------------------------------------------------------------- 1. predict_many's argument
@pytest.mark.parametrize("runs, fragment", [
    (RUN, "got a single run object: use predict(run)"),
    (None, "got None"),
    ("runs.jsonl", "got str"),
    (5, "got int"),
])
def test_predict_many_refuses_what_is_not_a_collection_of_runs(no_checkpoint, runs, fragment):
    with pytest.raises(InputError) as caught:
        no_checkpoint.predict_many(runs)
    assert str(caught.value).startswith("runs: predict_many takes a list (or another iterable) of runs")
    assert fragment in str(caught.value)


def test_predict_many_refuses_a_single_runspec(no_checkpoint):
    with pytest.raises(InputError, match="got a single run object"):
        no_checkpoint.predict_many(RunSpec.from_dict(RUN))


def test_predict_many_still_takes_any_iterable(no_checkpoint):
    answers = no_checkpoint.predict_many((run for run in [BAD_RUN, BAD_RUN]), errors="return")
    assert [a["index"] for a in answers] == [0, 1]
    assert all(a["error"].startswith("strategy.tp:") for a in answers)


# ---------------------------------------------------------------- 2. --input files
def _array_error(items: list) -> None:
    assert len(items) == 1, items
    line_no, error = items[0]
    assert line_no == 1 and isinstance(error, InputError)
    assert "line 1: the input is a JSON array (2 items), not JSON Lines" in str(error)
    assert "expected JSON Lines (one JSON object, e.g. one run, per line) or a single JSON object" in str(error)


@pytest.mark.parametrize("indent", [2, None], ids=["pretty-printed", "one-line"])
def test_a_json_array_is_one_error(indent):
    text = json.dumps([RUN, RUN], indent=indent) + "\n"
    _array_error(list(read_records(io.StringIO(text))))


def test_cli_answers_a_json_array_file_with_one_error_line(tmp_path, capsys):
    # simulate and predict read --input alike (cli._batch); simulate needs no checkpoint
    path, out = tmp_path / "runs.json", tmp_path / "out.jsonl"
    path.write_text(json.dumps([RUN, RUN], indent=2), encoding="utf-8")
    assert main(["simulate", "--input", str(path), "--output", str(out)]) == 1
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 1 and lines[0]["line"] == 1 and "is a JSON array" in lines[0]["error"]
    assert "1 of 1 runs failed" in capsys.readouterr().err


def test_a_byte_order_mark_is_accepted(tmp_path):
    lines = "".join(json.dumps({**RUN, "id": k}) + "\n" for k in ("a", "b"))
    path = tmp_path / "runs.jsonl"
    path.write_text(lines, encoding="utf-8-sig")  # writes the mark first
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    expected = [(1, {**RUN, "id": "a"}), (2, {**RUN, "id": "b"})]
    assert list(read_records(path)) == expected
    # a stream this module did not open (stdin, a caller's file) keeps the mark: it is dropped there too
    assert list(read_records(io.StringIO("\ufeff" + lines))) == expected
    pretty = tmp_path / "run.json"
    pretty.write_text(json.dumps(RUN, indent=2), encoding="utf-8-sig")
    assert list(read_records(pretty)) == [(1, RUN)]
    assert load_json_file(pretty) == RUN


def test_cli_reads_an_input_file_with_a_byte_order_mark(tmp_path):
    path, out = tmp_path / "runs.jsonl", tmp_path / "out.jsonl"
    path.write_text(json.dumps({**RUN, "id": "bom"}) + "\n", encoding="utf-8-sig")
    assert main(["simulate", "--input", str(path), "--output", str(out)]) == 0
    (line,) = out.read_text(encoding="utf-8").splitlines()
    pred = json.loads(line)
    assert "error" not in pred and pred["id"] == "bom" and pred["iteration_time_ms"] > 0


# ---------------------------------------------------------------- 3. a run's id
@pytest.mark.parametrize("run_id", [{"a": [1, 2]}, 1.5, ["x"]])
def test_an_error_entry_never_echoes_a_repr_of_the_id(no_checkpoint, run_id):
    # str() of a non-string id is a Python repr ("{'a': [1, 2]}") the client never sent
    (entry,) = no_checkpoint.predict_many([{**BAD_RUN, "id": run_id}], errors="return")
    assert entry["index"] == 0 and entry["error"].startswith("strategy.tp:")
    assert "id" not in entry


def test_an_error_entry_echoes_a_string_id(no_checkpoint):
    answers = no_checkpoint.predict_many([{**BAD_RUN, "id": "r1"}, {**BAD_RUN, "run_id": "r2"},
                                          {**BAD_RUN, "id": 7}], errors="return")
    assert [a.get("id") for a in answers] == ["r1", "r2", "7"]  # a whole number: its JSON text


@pytest.mark.parametrize("run_id", [{"a": [1, 2]}, ["x"], 1.5, True])
def test_a_non_string_id_is_refused_naming_it(run_id):
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict({**RUN, "id": run_id})
    assert caught.value.field == "id" and "string" in caught.value.message


def test_a_whole_number_id_is_its_decimal_text():
    assert RunSpec.from_dict({**RUN, "id": 5}).id == "5" and RunSpec.from_dict({**RUN, "id": "x"}).id == "x"


# ---------------------------------------------------------------- 4. /predict/batch's tier
def test_batch_tier_is_checked_before_the_empty_batch_shortcut(tmp_path):
    # the checkpoint does not exist: a request that reached the predictor would be a 503
    with running(create_app(None, checkpoint=str(tmp_path / "missing"))) as url:
        client = Client(url, timeout_s=10.0)
        try:
            for runs in ([], [RUN]):
                status, body = client.request("POST", "/predict/batch", {"runs": runs, "tier": "slow"})
                assert_error(status, body, 422, "tier: must be one of fast, full, got 'slow'")
            assert client.request("POST", "/predict/batch", {"runs": [], "tier": "full"}) == \
                (200, {"predictions": [], "failed": 0})
        finally:
            client.close()


def test_a_run_on_stdin_may_start_with_a_byte_order_mark(monkeypatch, capsys):
    import io as _io

    monkeypatch.setattr("sys.stdin", _io.StringIO("\ufeff" + json.dumps(RUN)))
    assert main(["simulate", "--run", "-", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_ms"] > 0
