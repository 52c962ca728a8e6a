"""Findings of a user-level review: top-level names, the --run file errors, search's ZeRO candidates at dp·cp 1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import learnedperf
from learnedperf.cli import main

MODEL = "gpt3-1.3b"
ONE_A100 = {"cluster": "dgx-a100", "num_devices": 1}
A100_8 = {"cluster": "dgx-a100", "num_devices": 8}


# --------------------------------------------------------------------------- top-level names
def test_top_level_names_are_the_modules_and_load_on_first_use():
    # a fresh interpreter: importing the package loads no submodule; each name is the defining module's object
    code = """if True:
        import sys
        import learnedperf
        loaded = sorted(m for m in sys.modules if m.startswith("learnedperf."))
        from learnedperf import Predictor, load_checkpoint, RunSpec, Checkpoint, InputError
        import learnedperf.predict, learnedperf.checkpoint, learnedperf.specs.run, learnedperf.errors
        same = [Predictor is learnedperf.predict.Predictor, load_checkpoint is learnedperf.checkpoint.load_checkpoint,
                RunSpec is learnedperf.specs.run.RunSpec, Checkpoint is learnedperf.checkpoint.Checkpoint,
                InputError is learnedperf.errors.InputError]
        print(loaded, same)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] [True, True, True, True, True]"


def test_every_public_name_resolves_is_listed_and_documented():
    assert set(learnedperf.__all__) <= set(dir(learnedperf))
    for name in learnedperf.__all__:
        value = getattr(learnedperf, name)
        if name != "__version__":
            assert (value.__doc__ or "").strip(), name
    assert {"Predictor", "load_checkpoint", "RunSpec"} <= set(learnedperf.__all__)
    assert learnedperf.__getattr__.__doc__ and learnedperf.__dir__.__doc__


def test_an_unknown_name_raises_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="no_such_name"):
        learnedperf.no_such_name  # noqa: B018
    assert not hasattr(learnedperf, "no_such_name")


def test_the_simulate_subpackage_stays_a_subpackage():
    # learnedperf.simulate is the simulator's subpackage: a top-level function of that name would shadow it
    # (and break 'import learnedperf.simulate.simulator as m'); the entry point is learnedperf.simulate.simulate
    import learnedperf.simulate.simulator as sim

    learnedperf.SimResult  # noqa: B018 - imports the subpackage through the lazy names
    assert learnedperf.simulate.simulate is sim.simulate and learnedperf.SimResult is sim.SimResult


# --------------------------------------------------------------------------- --run file errors
def _err(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    return rc, captured.err


@pytest.mark.parametrize("command", ["predict", "simulate", "search"])
def test_a_missing_run_file_is_a_usage_error_with_the_command_prefix(command, tmp_path, capsys):
    missing = tmp_path / "missing.json"
    rc, err = _err([command, "--run", str(missing)], capsys)
    assert rc == 2
    assert err.startswith(f"learnedperf {command}: error: {missing}: cannot read: ")


@pytest.mark.parametrize("make", ["missing", "directory", "not_utf8"])
def test_an_unreadable_run_file_reads_like_the_same_input_file(make, tmp_path, capsys):
    # --input names the same file in the same one line, with the same exit status (2, a usage error)
    path = tmp_path / "runs.json"
    if make == "directory":
        path.mkdir()
    elif make == "not_utf8":
        path.write_bytes(b"\xff\xfe{}")
    as_run = _err(["simulate", "--run", str(path)], capsys)
    as_input = _err(["simulate", "--input", str(path)], capsys)
    assert as_run == as_input
    assert as_run[0] == 2 and as_run[1].startswith(f"learnedperf simulate: error: {path}: ")


def test_a_run_file_that_is_not_an_object_fails_alike_in_predict_and_search(tmp_path, capsys):
    # like invalid JSON (exit 1 in both), a well-formed file holding no run is bad input, not bad flags
    path = tmp_path / "list.json"
    path.write_text(json.dumps([1]))
    for command in ("predict", "search"):
        rc, err = _err([command, "--run", str(path)], capsys)
        assert (rc, err) == (1, f"learnedperf {command}: error: {path}: a run must be a JSON object\n")


# --------------------------------------------------------------------------- search: ZeRO at dp·cp 1
def _space(hardware: dict, constraints: dict) -> list[dict]:
    from learnedperf.predict import enumerate_strategies
    from learnedperf.specs.run import SpecCache

    specs = SpecCache()
    return enumerate_strategies(specs.model(MODEL), specs.hardware(hardware), constraints)[1]


def test_one_rank_to_shard_over_leaves_zero_0_and_3():
    # one device: micro-batches 1, 2, 4, 8 (all divide 16) x 3 recompute policies x ZeRO {0, 3}; ZeRO 1 and 2
    # shard nothing over one rank (48 candidates before: every one of them twice or more)
    cands = _space(ONE_A100, {"global_batch_size": 16})
    assert len(cands) == 4 * 3 * 2
    assert sorted({s["zero_stage"] for s in cands}) == [0, 3]
    keys = [json.dumps({k: v for k, v in s.items() if k != "zero_stage"}, sort_keys=True) for s in cands]
    assert all(keys.count(k) == 2 for k in keys)
    # the lowest listed unsharded stage stands for them; a shard group of 2 (cp 2 at dp 1) keeps every stage
    assert {s["zero_stage"] for s in _space(ONE_A100, {"global_batch_size": 16, "zero_stages": [2, 1]})} == {1}
    cp2 = _space(A100_8, {"global_batch_size": 16, "tp": [4], "cp": [2], "pp": [1]})
    assert {s["dp"] for s in cp2} == {1} and {s["zero_stage"] for s in cp2} == {0, 1, 2, 3}
    # fsdp fixed: the stages are FSDP modes, 0 and 3 both FULL_SHARD (3 stands for both), 1 invalid
    fsdp = _space(ONE_A100, {"global_batch_size": 16, "fixed": {"fsdp": True}})
    assert {s["zero_stage"] for s in fsdp} == {1, 2, 3}
    assert {s["zero_stage"] for s in _space(ONE_A100, {"global_batch_size": 16, "fixed": {"fsdp": True},
                                                      "zero_stages": [0, 2]})} == {0, 2}


def test_with_fsdp_fixed_zero_0_and_3_are_one_candidate():
    # the simulator is the reason: with fsdp, ZeRO 0 and 3 are the same FULL_SHARD run (time and memory) at any
    # data-parallel size, ZeRO 2 (SHARD_GRAD_OP) another; the search lists the valid candidates once each
    from learnedperf.errors import SpecError
    from learnedperf.simulate import simulate

    base = {"tp": 2, "micro_batch_size": 2, "global_batch_size": 16, "fsdp": True}
    outcomes = {}
    for z in (0, 2, 3):
        r = simulate({"model": MODEL, "hardware": A100_8, "strategy": {**base, "zero_stage": z}})
        outcomes[z] = (r.iteration_time_s, r.memory.total)
    assert outcomes[0] == outcomes[3] != outcomes[2]
    with pytest.raises(SpecError, match="no ZeRO-1 mode"):
        simulate({"model": MODEL, "hardware": A100_8, "strategy": {**base, "zero_stage": 1}})
    cands = _space(A100_8, {"global_batch_size": 16, "tp": [2], "pp": [1], "cp": [1], "micro_batch_size": [2],
                            "recompute": ["none"], "sequence_parallel": [False], "hybrid_sharding": [False],
                            "fixed": {"fsdp": True}})
    assert sorted(s["zero_stage"] for s in cands) == [1, 2, 3]  # 1 is counted invalid by the search


def test_the_candidates_left_are_the_distinct_simulated_runs():
    # the simulator is the reason: at dp 1 ZeRO 0, 1 and 2 give the same time and memory, ZeRO 3 more memory
    # (its gathered-weights buffer); the search keeps one candidate per distinct outcome
    from learnedperf.simulate import simulate

    base = {"global_batch_size": 16, "tp": [8], "micro_batch_size": [2], "recompute": ["none"],
            "sequence_parallel": [True]}
    outcomes = {}
    for z in (0, 1, 2, 3):
        strategy = {"tp": 8, "micro_batch_size": 2, "global_batch_size": 16, "sequence_parallel": True, "zero_stage": z}
        r = simulate({"model": MODEL, "hardware": A100_8, "strategy": strategy})
        outcomes[z] = (r.iteration_time_s, r.memory.total)
    assert outcomes[0] == outcomes[1] == outcomes[2] != outcomes[3]
    cands = _space(A100_8, base)
    assert len(cands) == len(set(outcomes.values())) == 2


def test_search_counts_and_prints_the_distinct_candidates(capsys):
    argv = ["search", "--model", MODEL, "--cluster", "dgx-a100", "--num-devices", "1", "--global-batch-size", "16",
            "--top", "1"]
    assert main([*argv, "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["candidates"] == 24
    assert result["valid"] + sum(result["invalid_by_field"].values()) == 24
    assert main(argv) == 0
    assert "24 candidate strategies" in capsys.readouterr().out
