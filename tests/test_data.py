"""The dataset generator: sampler, records, graph store, shards and manifest, splits, resume, Dask.

Expected values are recomputed independently (the simulator on the stored run, the sampler on the
same seed, a full compile for memory) rather than written down.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from learnedperf.cost import RooflineCost
from learnedperf.data import load_graph, load_records, run_generate, sample_runs, split_mask, verify
from learnedperf.data.graphs import EDGE_TYPES, KINDS, PHASES, graph_of
from learnedperf.data.records import RECORD_COLUMNS
from learnedperf.data.generate import generate_shard
from learnedperf.data.sampler import (FAMILIES, NEAR_STYLE_KEYS, anchor_groups, draw, sample_near_runs,
                                      states_lower_bound_GiB)
from learnedperf.data.splits import SPLITS
from learnedperf.errors import InputError
from learnedperf.graph.execution import compile_run
from learnedperf.measure.records import STEP_COLUMNS, run_id, write_parquet
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import peak_memory
from learnedperf.specs import RunSpec
from learnedperf.units import GiB

SEED = 7
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    """40 generated runs, 10 per shard, in this process, without measured runs."""
    out = tmp_path_factory.mktemp("gen") / "set"
    manifest = run_generate(40, out, seed=SEED, workers=1, progress=False, measured=False, shard_size=10)
    return out, manifest


# =================================================================== sampler
def test_sampler_is_deterministic_and_index_local():
    a = list(sample_runs(24, seed=SEED))
    assert a == list(sample_runs(24, seed=SEED))
    assert [i for i, _ in a] == list(range(24))
    # the i-th run depends on (seed, i) only: a later slice equals the tail of the longer sequence
    assert list(sample_runs(4, seed=SEED, start=20)) == a[20:]
    other = list(sample_runs(24, seed=SEED + 1))
    assert sum(r1 != r2 for (_, r1), (_, r2) in zip(a, other)) >= 20
    ids = [run_id(r) for _, r in a]
    assert len(set(ids)) == len(ids)
    assert not set(ids) & {run_id(r) for _, r in other}


def test_every_sampled_run_is_valid_and_fits_unless_asked():
    for _i, run in sample_runs(40, seed=SEED):
        spec = RunSpec.from_dict(json.loads(json.dumps(run)))  # the JSON form, as stored
        # the sampler checks memory on shortened schedules: the full compile must agree
        assert peak_memory(compile_run(spec)).total / GiB <= spec.hardware.device.memory_GiB
    kept = [draw(SEED, i, keep_oom=True) for i in range(40)]
    for s in kept:
        spec = RunSpec.from_dict(json.loads(json.dumps(s.run)))
        peak = peak_memory(compile_run(spec)).total / GiB
        assert (peak <= spec.hardware.device.memory_GiB) == s.fits_in_memory
        # the cheap bound the sampler rejects with before compiling never exceeds the real peak
        assert states_lower_bound_GiB(spec) <= peak
    assert any(not s.fits_in_memory for s in kept)


def test_interleaved_draws_include_layers_that_do_not_divide_over_the_chunks():
    # Llama 3 405B's layout (126 layers on 16 ranks x 2 chunks) is valid, so the training set must hold
    # such runs; every chunk still needs at least one layer
    even = uneven = 0
    for _i, run in sample_runs(400, seed=SEED):
        s = run["strategy"]
        v = s.get("virtual_pipeline_stages", 1)
        if v == 1:
            continue
        layers = RunSpec.from_dict(run).model.num_layers
        assert layers >= s["pp"] * v
        if layers % (s["pp"] * v):
            uneven += 1
        else:
            even += 1
    assert even > 0 and uneven > 0


def test_a_simulator_failure_takes_the_next_candidate_of_the_same_index(tmp_path, monkeypatch):
    import learnedperf.simulate as sim_pkg

    real = sim_pkg.simulate
    failed = []

    def flaky(spec, **kw):
        if spec.id == f"gen-{SEED}-2" and not failed:
            failed.append(spec)
            raise RuntimeError("boom")
        return real(spec, **kw)

    monkeypatch.setattr(sim_pkg, "simulate", flaky)
    entry = generate_shard({"out": str(tmp_path), "shard": 0, "start": 0, "stop": 4, "seed": SEED, "keep_oom": False})
    assert entry["rejections"].get("simulator error: RuntimeError") == 1
    df = load_records(tmp_path)
    runs = dict(zip(df["sample_index"], df["run"]))
    assert json.loads(runs[2]) == draw(SEED, 2, skip=1).run != draw(SEED, 2).run
    assert RunSpec.from_dict(draw(SEED, 2).run) == failed[0]
    assert json.loads(runs[1]) == draw(SEED, 1).run


def test_sample_covers_families_devices_scales_and_strategies():
    samples = [draw(SEED, i) for i in range(400)]
    specs = [s.spec for s in samples]
    fam = Counter(s.model.arch for s in specs)
    assert fam == {f: 100 for f in FAMILIES}  # stratified exactly
    st = [s.strategy for s in specs]
    assert {x.pipeline_schedule for x in st if x.pp > 1} == {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v",
                                                             "interleaved-zb"}
    assert {x.zero_stage for x in st} == {0, 1, 2, 3}
    assert any(x.fsdp for x in st)
    assert {x.recompute for x in st} == {"none", "selective", "full"}
    assert any(x.sequence_parallel for x in st)
    assert any(x.cp > 1 for x in st) and any(x.ep > 1 for x in st) and any(x.tp >= 8 for x in st)
    assert len({x.precision for x in st}) >= 4
    # expert capacity on MoE runs only, dropless on most, each of the sampler's factors drawn
    capacity = Counter(x.moe_capacity_factor for sp, x in zip(specs, st) if sp.model.is_moe)
    assert capacity[None] > 100 // 2 and set(capacity) - {None} == {1.0, 1.25, 1.5, 2.0}
    assert all(x.moe_capacity_factor is None for sp, x in zip(specs, st) if not sp.model.is_moe)
    # forward-only (inference) steps, with and without pipelines and sharded weights, and training steps
    fwd = [x for x in st if x.forward_only]
    assert 0 < len(fwd) < len(st) // 4
    assert any(x.pp > 1 for x in fwd) and any(x.effective_zero_stage == 3 for x in fwd)
    n = [s.hardware.num_devices for s in specs]
    assert min(n) == 1 and max(n) >= 8192 and any(v % 3 == 0 for v in n)
    runs = [s.run for s in samples]
    assert any(isinstance(r["model"], str) for r in runs) and any(isinstance(r["model"], dict) for r in runs)
    assert any("cluster" in r["hardware"] for r in runs)
    assert any(isinstance(r["hardware"].get("device"), dict) for r in runs)  # synthetic devices
    assert len({s.hardware.device.name for s in specs if not s.hardware.device.name.startswith("synthetic")}) >= 15


#: measured-looking anchors: vTrain's habits on a DGX A100 node, and a forward-only fp32 step on one V100
_VTRAIN_ANCHOR = {"model": {"arch": "gpt", "name": "vtrain-gpt", "num_layers": 16, "hidden_size": 2048,
                            "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 50257},
                  "hardware": {"cluster": "dgx-a100", "num_devices": 8},
                  "strategy": {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 2, "global_batch_size": 32,
                               "precision": "fp16", "recompute": "full", "flash_attention": False,
                               "overlap_grad_reduce": False}}
_INFER_ANCHOR = {"model": "gpt2-medium", "hardware": {"device": "V100-PCIE-32GB", "num_devices": 1},
                 "strategy": {"micro_batch_size": 4, "global_batch_size": 4, "precision": "fp32",
                              "forward_only": True, "optimizer": "none"}}


def _pair(run: dict) -> str:
    return json.dumps([run["model"], run["hardware"]], sort_keys=True)


def test_near_runs_keep_an_anchors_model_and_hardware_and_draw_their_own_strategies():
    anchors = [_VTRAIN_ANCHOR, {**_VTRAIN_ANCHOR, "strategy": {**_VTRAIN_ANCHOR["strategy"], "tp": 4, "pp": 1}},
               _INFER_ANCHOR]
    assert len(anchor_groups(anchors)) == 2  # two (model, hardware) pairs
    near = list(sample_near_runs(40, anchors, seed=3))
    assert near == list(sample_near_runs(40, anchors, seed=3))
    assert list(sample_near_runs(5, anchors, seed=3, start=35)) == near[35:]
    assert [r["id"] for _, r in near] == [f"near-3-{i}" for i in range(40)]
    assert not {run_id(r) for _, r in near} & {run_id(r) for _, r in sample_runs(40, seed=3)}
    by_pair: dict = {}
    for _i, run in near:
        spec = RunSpec.from_dict(json.loads(json.dumps(run)))
        assert peak_memory(compile_run(spec)).total / GiB <= spec.hardware.device.memory_GiB
        by_pair.setdefault(_pair(run), []).append(run["strategy"])
    assert set(by_pair) == {_pair(_VTRAIN_ANCHOR), _pair(_INFER_ANCHOR)}
    # strategies of their own: other layouts than the anchors' ...
    vt = by_pair[_pair(_VTRAIN_ANCHOR)]
    assert len({(s["tp"], s["pp"], s["dp"]) for s in vt}) >= 3
    # ... half of them in the anchor's own style (fp16, full recompute, no fused attention, no overlap)
    style = {k: v for k, v in _VTRAIN_ANCHOR["strategy"].items() if k in NEAR_STYLE_KEYS}
    kept = [s for s in vt if all(s.get(k) == v for k, v in style.items())]
    assert 0 < len(kept) < len(vt)
    # the forward-only anchor's style makes forward-only steps, valid with whatever layout was drawn
    infer = by_pair[_pair(_INFER_ANCHOR)]
    assert any(s.get("forward_only") for s in infer) and any(not s.get("forward_only") for s in infer)


@pytest.mark.parametrize("anchors, match", [([], "no runs"), ("runs.jsonl", "expected a list"),
                                             ([_INFER_ANCHOR, 3], r"anchors\[1\]: expected a run object"),
                                             ([{**_INFER_ANCHOR, "model": "gpt-9"}], r"anchors\[0\]: not a valid run")])
def test_bad_anchors_are_refused_by_name(anchors, match):
    with pytest.raises(InputError, match=match):
        list(sample_near_runs(2, anchors))


# ================================================================ generation
def test_generation_writes_n_unique_records_equal_to_the_simulator(small_set):
    out, manifest = small_set
    df = load_records(out)
    assert list(df.columns) == list(RECORD_COLUMNS)
    assert len(df) == 40 and df["run_id"].is_unique
    assert set(df["run_id"]) == {run_id(r) for _, r in sample_runs(40, seed=SEED)}
    assert (df["source"] == "simulated").all() and (df["origin"] == "generator").all()
    assert sorted(df["sample_index"]) == list(range(40))
    for _, row in df.iloc[::13].iterrows():
        run = json.loads(row["run"])
        assert run_id(run) == row["run_id"]
        pred = simulate(RunSpec.from_dict(run)).to_prediction()
        assert row["iteration_time_ms"] == pytest.approx(pred["iteration_time_ms"], rel=1e-12)
        assert row["peak_memory_GiB"] == pytest.approx(pred["peak_memory_GiB"], rel=1e-12)
        assert row["pipeline_bubble_ms"] == pytest.approx(pred["breakdown_ms"]["pipeline_bubble"], rel=1e-9, abs=1e-9)
        assert bool(row["fits_in_memory"]) == pred["fits_in_memory"]
    # the top level holds exactly the n generated runs: a plain glob of *.parquet sees n run ids
    import pandas as pd

    top = pd.concat([pd.read_parquet(f, columns=["run_id"]) for f in sorted(out.glob("*.parquet"))])
    assert len(top) == 40 and top["run_id"].nunique() == 40
    assert manifest["counts"]["by_source"] == {"simulated": 40}
    assert sum(manifest["counts"]["simulated_by_family"].values()) == 40
    assert manifest["sampler"]["attempts"] >= 40
    assert verify(out)["files"] == manifest["files"]
    assert len(manifest["files"]) == 2 * 4  # records and graphs of 4 shards


def test_graph_store_round_trip(small_set):
    out, _ = small_set
    df = load_records(out)
    for _, row in df.iloc[::17].iterrows():
        g = load_graph(out, row["run_id"])
        assert g["num_nodes"] == row["graph_num_nodes"] and g["edge_index"].shape == (2, row["graph_num_edges"])
        assert g["edge_index"].max() < g["num_nodes"] and g["edge_type"].max() < len(EDGE_TYPES)
        # the stored graph equals one rebuilt from the stored run
        spec = RunSpec.from_dict(json.loads(row["run"]))
        ref = graph_of(compile_run(spec), RooflineCost(spec.hardware))
        for key in ("kind", "phase", "flops", "bytes", "repeat", "per_iteration", "stage", "shape", "edge_index"):
            assert (g[key] == ref[key]).all(), key
        fwd = g["phase"] == PHASES.index("fwd")
        assert set(g["per_iteration"][fwd & ~g["is_comm"]].tolist()) == {spec.num_microbatches}
        assert (load_graph(out, row["run_id"], shard=row["graph_shard"])["flops"] == g["flops"]).all()
    with pytest.raises(InputError, match="no graph"):
        load_graph(out, "0000000000000000")


def test_graph_of_a_large_run_stays_small():
    # Megatron SC21's largest run: 1T parameters on 3072 A100s, tp 8, pp 64, dp 6
    run = {"model": "megatron-1t", "hardware": {"cluster": "selene", "num_devices": 3072},
           "strategy": {"tp": 8, "pp": 64, "dp": 6, "micro_batch_size": 1, "global_batch_size": 3072,
                        "recompute": "full", "precision": "fp16"}}
    spec = RunSpec.from_dict(run)
    g = graph_of(compile_run(spec, 3 * 64), RooflineCost(spec.hardware))
    assert g["num_nodes"] <= 2000
    # identical middle stages are one group standing for the 62 of them
    assert g["stage_repeat"].max() == 62 and set(g["stage"].tolist()) == {0, 1, 63}
    kinds = {KINDS[k] for k in g["kind"]}
    assert {"matmul", "allreduce", "p2p", "optimizer"} <= kinds
    assert (g["edge_type"] == EDGE_TYPES.index("pipeline")).any()


def test_split_masks_are_consistent(small_set):
    out, manifest = small_set
    df = load_records(out)
    for name in SPLITS:
        test = split_mask(df, name)
        assert manifest["splits"][name]["counts"] == {"train": int((~test).sum()), "test": int(test.sum())}
    fam = split_mask(df, "unseen_family")
    assert set(df.loc[fam, "arch"]) <= {"llama"} and "llama" not in set(df.loc[~fam, "arch"])
    scale = split_mask(df, "unseen_scale")
    assert scale.any() and (~scale).any()
    assert df.loc[scale, "num_devices"].min() > df.loc[~scale, "num_devices"].max()
    dev = split_mask(df, "unseen_device")
    assert not set(df.loc[dev, "device_type"]) & set(df.loc[~dev, "device_type"])
    with pytest.raises(InputError, match="unknown split"):
        split_mask(df, "nope")


def test_manifest_detects_a_corrupted_shard(small_set, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(small_set[0], out)
    verify(out)
    shard = out / "records-00001.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"records-00001\.parquet.*corrupted"):
        verify(out)
    shard.unlink()
    with pytest.raises(InputError, match=r"records-00001\.parquet.*missing"):
        verify(out)
    # a resume regenerates exactly the broken shard
    manifest = run_generate(40, out, seed=SEED, workers=1, progress=False, measured=False, shard_size=10)
    assert manifest["files"] == small_set[1]["files"]


def test_other_arguments_in_an_existing_directory_are_refused(small_set, tmp_path):
    out, manifest = small_set
    with pytest.raises(InputError, match="n: 40 there, 41 now"):
        run_generate(41, out, seed=SEED, workers=1, progress=False, measured=False, shard_size=10)
    with pytest.raises(InputError, match="seed"):
        run_generate(40, out, seed=SEED + 1, workers=1, progress=False, measured=False, shard_size=10)
    again = run_generate(40, out, seed=SEED, workers=1, progress=False, measured=False, shard_size=10)
    assert again["files"] == manifest["files"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty"):
        run_generate(5, other, seed=0, workers=1, progress=False, measured=False)
    for bad in ({"n": 0}, {"n": "5"}, {"seed": -1}, {"workers": 0}, {"shard_size": 0}):
        args = {"n": 5, "seed": 0, "workers": 1, "shard_size": None, **bad}
        with pytest.raises(InputError, match=next(iter(bad))):
            run_generate(args["n"], tmp_path / "bad", seed=args["seed"], workers=args["workers"], progress=False,
                         measured=False, shard_size=args["shard_size"])
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        run_generate(5, tmp_path / "afile", seed=0, workers=1, progress=False, measured=False)


def test_resume_after_sigkill(tmp_path):
    out = tmp_path / "killed"
    n, size = 120, 5
    cmd = [sys.executable, "-m", "learnedperf.data.generate", "--n", str(n), "--out", str(out), "--seed", "3",
           "--workers", "1", "--shard-size", str(size), "--no-measured", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    deadline = time.monotonic() + 60
    while not (out / "records-00000.parquet").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists(), "the generation finished before the kill: make n larger"
    finished = len(list(out.glob("records-*.parquet")))
    assert 0 < finished < n // size
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    df = load_records(out)
    assert len(df) == n and df["run_id"].nunique() == n
    assert set(df["run_id"]) == {run_id(r) for _, r in sample_runs(n, seed=3)}
    manifest = verify(out)
    assert manifest["counts"]["by_source"] == {"simulated": n}
    assert len(manifest["files"]) == 2 * (n // size)
    assert not list(out.rglob(".*.tmp-*"))


def test_dask_local_cluster_gives_the_same_records(small_set, tmp_path):
    distributed = pytest.importorskip("distributed")
    # worker processes: the tasks travel pickled by reference to learnedperf.data.generate, as on a real cluster
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        manifest = run_generate(12, tmp_path / "dask", seed=SEED, scheduler=cluster.scheduler_address,
                                progress=False, measured=False, shard_size=4)
    assert manifest["counts"]["by_source"] == {"simulated": 12}
    df = load_records(tmp_path / "dask").set_index("run_id")
    ref = load_records(small_set[0]).set_index("run_id")
    # the first 12 sample indices of the same seed: the same runs and the same targets as the local path
    assert set(df.index) <= set(ref.index)
    assert (df["iteration_time_ms"] == ref.loc[df.index, "iteration_time_ms"]).all()


def _step(run: dict, t_ms: float, arch: str | None = None) -> dict:
    from learnedperf.measure.ingest import step_record

    if arch is None:
        return step_record(run, t_ms, source="measured", iteration_p10_ms=0.9 * t_ms, iteration_p90_ms=1.2 * t_ms,
                           repeats=5, peak_memory_MiB=512.0, backend="none", host="host-x",
                           measured_at="2026-01-01T00:00:00+00:00")
    rec = step_record(run, t_ms, source="measured")
    rec.update(arch=arch, run=json.dumps({**run, "model": {"arch": arch, "name": arch}}), run_id="x" * 16)
    return rec


def test_measured_rows_join_the_records(tmp_path):
    device = {"name": "test-cpu", "peak_tflops": {"fp32": 1.0}, "memory_bandwidth_GBps": 20.0, "memory_GiB": 16.0}
    run = {"model": {"arch": "gpt", "name": "gpt-tiny", "num_layers": 2, "hidden_size": 128,
                     "num_attention_heads": 4, "vocab_size": 1000, "seq_length": 64},
           "hardware": {"device": device, "num_devices": 1},
           "strategy": {"micro_batch_size": 2, "global_batch_size": 4, "precision": "fp32"}}
    steps = [_step(run, 12.5), _step(run, 13.0), _step(run, 20.0, arch="mlp")]
    write_parquet(steps, tmp_path / "measured" / "host-x" / "steps.parquet", STEP_COLUMNS, "step")
    out = tmp_path / "set"
    manifest = run_generate(8, out, seed=SEED, workers=1, progress=False, measured=True,
                            measured_paths=[tmp_path / "measured"], vtrain=False, neusight=False)
    df = load_records(out)
    meas = df[df["source"] == "measured"]
    assert len(meas) == 1 and len(df) == 9
    row = meas.iloc[0]
    assert row["run_id"] == run_id(run) and row["iteration_time_ms"] == 12.5
    assert row["iteration_p10_ms"] == pytest.approx(0.9 * 12.5) and row["host"] == "host-x"
    assert row["peak_memory_GiB"] == pytest.approx(0.5)
    pred = simulate(RunSpec.from_dict(run)).to_prediction()
    assert row["sim_iteration_time_ms"] == pytest.approx(pred["iteration_time_ms"], rel=1e-12)
    assert row["origin"].endswith("host-x") and row["sample_index"] == -1
    assert load_graph(out, row["run_id"])["num_nodes"] == row["graph_num_nodes"]
    skipped = manifest["skipped"]["measured"]
    assert sum(skipped.values()) == 2
    assert any("'mlp'" in k for k in skipped) and any("duplicate" in k for k in skipped)
    assert manifest["counts"]["by_source"] == {"measured": 1, "simulated": 8}
    assert len(load_records(out, sources=["simulated"])) == 8


def test_neusight_runs_become_measured_records_of_five_devices():
    from learnedperf.data.generate import measured_rows
    from learnedperf.measure.public import default_shared_data, load_neusight_steps
    from learnedperf.models.evaluate import test_mask

    if not (default_shared_data() / "neusight_step_times.csv").exists():
        pytest.skip("../shared/data/neusight_step_times.csv not available")
    steps = load_neusight_steps().records
    skipped, no_pred, graphs, ids = Counter(), Counter(), [], []
    recs = measured_rows(steps, "neusight", set(), skipped, no_pred, "_graphs/measured-00000.parquet", graphs, ids)
    assert len(recs) == 34 and not skipped and not no_pred and len(graphs) == 34
    for rec, step in zip(recs, steps):
        assert rec["origin"] == "neusight"
        run = json.loads(step["run"])
        # NeuSight's e2e time is forward + backward (backward 0 for inference): no optimizer step
        assert run["strategy"]["optimizer"] == "none"
        assert run["strategy"]["forward_only"] == (run["meta"]["bwall_latency_ms"] == 0)
        assert rec["iteration_time_ms"] == pytest.approx(run["meta"]["fw_latency_ms"] + run["meta"]["bwall_latency_ms"])
        pred = simulate(RunSpec.from_dict(run)).to_prediction()
        assert rec["sim_iteration_time_ms"] == pytest.approx(pred["iteration_time_ms"], rel=1e-12)
    import pandas as pd

    df = pd.DataFrame(recs)
    # each device is the test side of its own split only
    for split, device in (("unseen_device:V100", "V100-PCIE-32GB"), ("unseen_device:A100", "A100-PCIE-40GB"),
                          ("unseen_device:T4", "T4"), ("unseen_device:P100", "P100-PCIE-16GB"),
                          ("unseen_device:P4", "P4")):
        assert (test_mask(df, split) == (df["device_type"] == device)).all(), split


def test_each_measured_cpu_is_its_own_device_split():
    import pandas as pd

    from learnedperf.models.evaluate import OP_DEVICE_HOLDOUT, test_mask

    names = ["cpu-intel-xeon-1t", "cpu-intel-xeon-1t-x4", "cpu-amd-epyc-2t", "A100-SXM4-80GB", "cpu-arm-neoverse-1t"]
    df = pd.DataFrame({"device_type": names})
    # one CPU held out, the other trained on; a CPU the project never measured is in neither
    assert test_mask(df, "unseen_device:Xeon").tolist() == [True, True, False, False, False]
    assert test_mask(df, "unseen_device:EPYC").tolist() == [False, False, True, False, False]
    # no CPU operator record trains the regressor (test_gbdt), so the CPU splits hold none out of it and share
    # the unexcluded regressor; a GPU split leaves out that GPU's records
    assert "unseen_device:EPYC" not in OP_DEVICE_HOLDOUT and "unseen_device:Xeon" not in OP_DEVICE_HOLDOUT
    assert OP_DEVICE_HOLDOUT["unseen_device:V100"]("V100-PCIE-32GB")


def test_vtrain_rows_become_measured_records():
    from learnedperf.data.generate import measured_rows
    from learnedperf.measure.public import default_shared_data, vtrain_step_records

    if not (default_shared_data() / "vtrain" / "ground_truth_single_node.csv").exists():
        pytest.skip("../shared/data/vtrain not available")
    steps = vtrain_step_records()[:6]
    skipped, no_pred, graphs, ids = Counter(), Counter(), [], []
    recs = measured_rows(steps, "vtrain", set(), skipped, no_pred, "_graphs/measured-00000.parquet", graphs, ids)
    assert len(recs) == 6 and not skipped and not no_pred and len(graphs) == 6
    for rec, step in zip(recs, steps):
        assert rec["source"] == "measured" and rec["origin"] == "vtrain"
        assert rec["run_id"] == step["run_id"] and rec["iteration_time_ms"] == step["iteration_time_ms"]
        pred = simulate(RunSpec.from_dict(json.loads(step["run"]))).to_prediction()
        assert rec["sim_iteration_time_ms"] == pytest.approx(pred["iteration_time_ms"], rel=1e-12)


def test_the_lent_gpus_chip_is_one_device_split():
    # the device tool lends an H100 or an H200: one chip (GH100), so a split holds all its parts out together,
    # runs and kernels, and no other part (an A100, an H20 no catalog lists, an 'H1000' by prefix) falls in it
    import pandas as pd

    from learnedperf.models.evaluate import OP_DEVICE_HOLDOUT, test_mask

    names = ["H100-SXM5-80GB", "H100-PCIE-80GB", "H200-SXM-141GB", "H800-SXM5-80GB", "GH200-96GB",
             "A100-SXM4-80GB", "H20", "H1000-x", "cpu-intel-xeon-1t"]
    df = pd.DataFrame({"device_type": names})
    assert test_mask(df, "unseen_device:Hopper").tolist() == [True] * 5 + [False] * 4
    assert [OP_DEVICE_HOLDOUT["unseen_device:Hopper"](n) for n in names] == [True] * 5 + [False] * 4
