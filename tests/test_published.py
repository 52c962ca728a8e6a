"""Published-runs tables: the loader maps rows to runs and implied iteration times, or says why not.

Expected values are independent of the loader: SC21's iteration times from the paper's own FLOPs
formula, the others from the throughput a row states (time = tokens per iteration / tokens per
second) or from a hand count of the matmuls.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from learnedperf.errors import InputError
from learnedperf.measure.public import default_shared_data
from learnedperf.measure.published import PUBLISHED_COLUMNS, load_published, megatron_flops
from learnedperf.specs import ModelSpec, RunSpec

DATA = Path(__file__).resolve().parent / "data" / "published_runs.csv"
SC21 = default_shared_data() / "published" / "megatron_sc21_table1.csv"


def _rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def loaded():
    return load_published(DATA)


def _by_row(loaded) -> dict:
    return {m.run["id"].rsplit("-", 1)[1]: m for m in loaded.runs}


@pytest.mark.skipif(not SC21.exists(), reason="shared data not present")
def test_sc21_times_follow_the_papers_formula():
    got = load_published(SC21)
    assert not got.skipped and not got.warnings
    rows = _rows(SC21)
    assert len(got.runs) == len(rows) == 10
    for m, row in zip(got.runs, rows):
        B, s, l, h, V = (int(float(row[k])) for k in ("global_batch_size_seqs", "seq_len", "num_layers",
                                                       "hidden_size", "vocab_size"))
        n, tflops = int(row["num_gpus"]), float(row["tflops_per_gpu"])
        # Narayanan et al. SC21, Appendix: F = 96·B·s·l·h²·(1 + s/6h + V/16lh), recompute counted
        expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)) / (tflops * 1e12 * n) * 1e3
        assert m.iteration_time_ms == pytest.approx(expected, rel=1e-12)
        assert m.run["hardware"] == {"cluster": "selene", "num_devices": n}  # "Selene" is in the row's text
        st = m.run["strategy"]
        assert (st["tp"], st["pp"], st["dp"]) == tuple(int(float(row[k])) for k in ("tp", "pp", "dp"))
        assert st["recompute"] == "full" and st["precision"] == "fp16"
        assert st["flash_attention"] is False  # a 2021 framework: FlashAttention is from 2022
        assert st.get("pipeline_schedule", "1f1b") == "1f1b"  # interleaved, depth not in the table
        assert "micro_batch_size 1 (blank)" in m.run["meta"]["assumed"]


def test_megatron_flops_is_the_papers_closed_form_for_gpt_and_a_matmul_count_for_gqa():
    B, s, l, h, V = 4, 2048, 24, 2304, 51200
    gpt = ModelSpec.parse({"arch": "gpt", "num_layers": l, "hidden_size": h, "num_attention_heads": 24,
                           "vocab_size": V, "seq_length": s})
    assert megatron_flops(gpt, B, True) == pytest.approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)))
    # without recompute the layers make three passes, the LM head three as before: 72·(1 + s/6h + V/12lh)
    assert megatron_flops(gpt, B, False) == pytest.approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)))
    # Llama 3 8B (GQA 32/8 heads, SwiGLU): per token and layer Q,O 2·h², K,V 2·h·1024, three MLP matrices,
    # attention 4·s·h; head 2·h·V; ×3 passes
    m = ModelSpec.parse({"arch": "llama", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                         "num_kv_heads": 8, "ffn_hidden_size": 14336, "vocab_size": 128256, "seq_length": 8192})
    per_layer = 2 * 4096 * 4096 * 2 + 2 * 4096 * 1024 * 2 + 3 * 2 * 4096 * 14336 + 4 * 8192 * 4096
    assert megatron_flops(m, 1, False) == pytest.approx(3 * (32 * per_layer + 2 * 4096 * 128256) * 8192)


def test_rows_become_runs_with_the_time_their_throughput_implies(loaded):
    runs = _by_row(loaded)
    assert sorted(runs, key=int) == ["1", "2", "3", "5", "7", "8"]
    for m in loaded.runs:
        RunSpec.from_dict(m.run)  # every kept run is a valid run as stored
    # 1: a catalog model, FSDP on H100s, time stated in seconds
    r1 = runs["1"]
    assert r1.iteration_time_ms == pytest.approx(3500.0)
    assert r1.run["hardware"] == {"cluster": "dgx-h100", "num_devices": 64}  # 8 x 400 Gb/s = the catalog's 50 GB/s
    assert r1.run["strategy"]["fsdp"] is True and r1.run["strategy"]["flash_attention"] is True
    assert r1.run["model"]["num_kv_heads"] == 8 and r1.run["model"]["arch"] == "llama"
    assert r1.run["meta"]["target_from"] == "iteration_time_s" and r1.run["meta"]["framework"].startswith("torchtitan")
    # 2: tokens/s per GPU x 32 GPUs; 4 x 200 Gb/s NICs per node of 8 = 12.5 GB/s per GPU, not the catalog's 25
    r2 = runs["2"]
    assert r2.iteration_time_ms == pytest.approx(2048 * 256 / (3000 * 32) * 1e3)
    assert r2.run["hardware"]["inter_node_bandwidth_GBps"] == pytest.approx(4 * 200 / 8 / 8)
    st = r2.run["strategy"]
    assert (st["pipeline_schedule"], st["virtual_pipeline_stages"], st["zero_stage"], st["dp"]) == \
        ("interleaved", 2, 1, 8)
    assert st["global_batch_size"] == 256 and st["recompute"] == "selective" and st["precision"] == "bf16"
    assert "vocab_size 51200 (gpt family's tokenizer)" in r2.run["meta"]["assumed"]
    # 3: MFU of the data-sheet peak; micro-batch from the gradient accumulation (64 / (8 x 4))
    r3 = runs["3"]
    spec = RunSpec.from_dict(r3.run)
    assert spec.strategy.micro_batch_size == 2 and spec.model.arch == "llama"
    flops = megatron_flops(spec.model, 64, False)
    assert r3.iteration_time_ms == pytest.approx(flops / (0.40 * spec.hardware.device.peak_flops("bf16") * 8) * 1e3)
    assert r3.run["meta"]["target_from"] == "mfu_pct"
    # 5: "HSDP" of unstated shard size on 16 H100s (dgx-h100, 8 per node), tp 1: shard within a node = 8 ranks,
    # replicated over 16 / 8 = 2 nodes; the filled-in size is an assumption
    st5 = runs["5"].run["strategy"]
    assert st5["fsdp"] is True and st5["dp_replicate"] == 2 and "zero_stage" not in st5
    assert any(a.startswith("dp_replicate 2 for 'HSDP'") for a in runs["5"].run["meta"]["assumed"])
    # 7: a GPU named by chip and memory only takes the SXM part, and says so
    assert runs["7"].run["hardware"]["cluster"] == "dgx-h100"
    assert any("H100-SXM5-80GB" in a and "SXM" in a for a in runs["7"].run["meta"]["assumed"])
    # 8: two throughputs 20 % apart: the stated time wins, with a warning
    assert runs["8"].iteration_time_ms == pytest.approx(500.0)
    assert [w for w in loaded.warnings if "row_id 8" in w[0] and "samples_per_sec implies 600 ms" in w[1]]
    assert runs["8"].run["hardware"]["cluster"] == "dgx-v100"
    assert sum(loaded.assumptions.values()) == sum(len(m.run["meta"]["assumed"]) for m in loaded.runs)


def test_rows_that_cannot_become_runs_are_skipped_with_their_reason(loaded):
    reasons = {where.split("row_id ")[1].rstrip(")"): why for where, why in loaded.skipped}
    assert sorted(reasons, key=int) == ["4", "6", "9", "10"]
    assert "'Gaudi2' is not a catalog device" in reasons["4"]
    assert "encoder-decoder" in reasons["6"]  # Switch-XXL is a T5
    assert "no iteration time or throughput" in reasons["9"]
    assert reasons["10"].startswith("strategy.tp:")
    assert len(loaded.runs) + len(loaded.skipped) == len(_rows(DATA))  # nothing dropped silently


def test_strict_loading_stops_at_the_first_bad_row():
    with pytest.raises(InputError, match=r"line 5 \(row_id 4\): gpu_type 'Gaudi2'"):
        load_published(DATA, strict=True)


def test_a_table_of_the_wrong_shape_gets_one_error(tmp_path):
    rows = _rows(DATA)
    bad = tmp_path / "misspelt.csv"
    with open(bad, "w", newline="") as fh:
        cols = ["tensor_parallel" if c == "tp" else c for c in PUBLISHED_COLUMNS]
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerow({("tensor_parallel" if k == "tp" else k): v for k, v in rows[0].items()})
    with pytest.raises(InputError, match="unknown column.*'tensor_parallel'"):
        load_published(bad)
    short = tmp_path / "short.csv"
    short.write_text("model,num_layers\nGPT,24\n")
    with pytest.raises(InputError, match="missing column.*hidden_size"):
        load_published(short)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InputError, match="empty file"):
        load_published(empty)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 50)
    with pytest.raises(InputError, match="binary.csv"):
        load_published(binary)
    with pytest.raises(InputError, match="cannot read"):
        load_published(tmp_path / "absent.csv")


def test_a_row_with_more_cells_than_columns_is_reported(tmp_path):
    text = DATA.read_text().splitlines()
    (tmp_path / "t.csv").write_text("\n".join([text[0], text[1] + ",extra"]) + "\n")
    got = load_published(tmp_path / "t.csv")
    assert not got.runs and got.skipped == [("line 2 (row_id 1)", "1 cell(s) more than the header's 40 columns")]


def test_ingest_turns_a_published_table_into_step_records(tmp_path, capsys):
    import json

    import pandas as pd

    from learnedperf.cli import main
    from learnedperf.measure.records import STEP_COLUMNS, verify_manifest

    # strict (the default): the first row that cannot become a run rejects the file, nothing is written
    assert main(["ingest", str(DATA), "--out", str(tmp_path / "strict")]) == 1
    err = capsys.readouterr().err
    assert "line 5 (row_id 4): gpu_type 'Gaudi2'" in err and "Traceback" not in err
    assert not (tmp_path / "strict" / "steps_ingested.parquet").exists()
    # with --skip-bad-rows every good row is written and every bad one reported (the table is recognised
    # by its header: no --kind needed)
    out = tmp_path / "ds"
    assert main(["ingest", str(DATA), "--skip-bad-rows", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    rejected = [line for line in err.splitlines() if line.startswith("learnedperf ingest: rejected:")]
    steps = pd.read_parquet(out / "steps_ingested.parquet")
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert len(rejected) + len(steps) == len(_rows(DATA))
    expected = {m.run["id"]: m.iteration_time_ms for m in load_published(DATA).runs}
    got = {json.loads(r)["id"]: t for r, t in zip(steps["run"], steps["iteration_time_ms"])}
    assert got == pytest.approx(expected)
    assert set(steps["source"]) == {"published:published_runs.csv"}
    manifest = verify_manifest(out)
    assert manifest["rejected_rows"] == len(rejected)
    assert manifest["sources"][0]["kind"] == "published"


def test_numbers_may_carry_thousands_separators_and_a_percent_sign(tmp_path):
    rows = _rows(DATA)
    row = dict(next(r for r in rows if r["row_id"] == "3"))
    plain = load_published(DATA).runs
    row.update(mfu_pct="40%", global_batch_size_seqs="64")
    other = dict(next(r for r in rows if r["row_id"] == "2"), tokens_per_sec_per_gpu="3,000")
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([row, other])
    got = load_published(path)
    assert not got.skipped
    want = {m.run["id"].rsplit("-", 1)[1]: m.iteration_time_ms for m in plain}
    assert [m.iteration_time_ms for m in got.runs] == pytest.approx([want["3"], want["2"]])


@pytest.mark.parametrize("column, text, expected", [
    ("activation_recompute", "full (per paper)", "full"),
    ("activation_recompute", "activation checkpointing", "full"),
    ("activation_recompute", "no activation checkpointing", "none"),
    ("activation_recompute", "selective", "selective"),
    ("zero_or_fsdp", "none (DDP)", {}),
    ("zero_or_fsdp", "ZeRO-3 (DeepSpeed)", {"zero_stage": 3}),
    ("zero_or_fsdp", "distributed optimizer", {"zero_stage": 1}),
    ("zero_or_fsdp", "FSDP SHARD_GRAD_OP", {"fsdp": True, "zero_stage": 2}),
    ("precision", "AMP (bf16)", "bf16"),
    ("precision", "fp16 mixed", "fp16"),
    ("sp", "yes (with TP)", True),
    ("vpp_or_schedule", "interleaved, 4 chunks", {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": 4}),
    ("vpp_or_schedule", "GPipe", {"pipeline_schedule": "gpipe"}),
    ("vpp_or_schedule", "VP=4", {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": 4}),
    ("vpp_or_schedule", "v=3", {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": 3}),
    ("zero_or_fsdp", "DP", {}),
    ("zero_or_fsdp", "plain data parallelism", {}),
    ("vpp_or_schedule", "non-interleaved", {"pipeline_schedule": "1f1b"}),
    ("vpp_or_schedule", "interleaved (2 model chunks)",
     {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": 2}),
])
def test_the_words_of_a_table_map_to_the_run_format(column, text, expected):
    from learnedperf.measure import published as P

    row = {column: text}
    read = {"activation_recompute": lambda: P._recompute(row, []), "zero_or_fsdp": lambda: P._sharding(row),
            "precision": lambda: P._precision(row, []), "sp": lambda: P._flag(row, "sp"),
            "vpp_or_schedule": lambda: P._schedule(row, 4, [])}[column]
    assert read() == expected


# ------------------------------------------------------------------ hybrid sharding (HSDP, MiCS)
# A GPT 1B row on H100 SXM5 (the catalog's dgx-h100: 8 GPUs a node) with everything else stated, so that
# only the sharding is read; the expected sizes follow from the rules: a stated shard group S of dp·cp ranks
# gives dp_replicate = dp·cp / S, stated replicas are dp_replicate, and an unstated size is one node's
# data-parallel ranks, 8 / (tp·cp), i.e. dp_replicate = dp / (8 / (tp·cp)).
_NODE = 8


def _hybrid_table(tmp_path: Path, *rows: dict) -> Path:
    base = {"model": "GPT 1B", "num_layers": "24", "hidden_size": "2048", "num_heads": "16", "seq_len": "2048",
            "vocab_size": "51200", "gpu_type": "H100 SXM5 80GB", "interconnect": "8x 400Gb/s per node",
            "micro_batch_size": "1", "activation_recompute": "none", "precision": "bf16",
            "framework": "torchtitan, FlashAttention", "iteration_time_s": "1.0"}
    path = tmp_path / "hybrid.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=PUBLISHED_COLUMNS)
        w.writeheader()
        for i, row in enumerate(rows, start=1):
            full = {"row_id": f"h{i}", **base, **row}
            full.setdefault("global_batch_size_seqs", full["num_gpus"])
            w.writerow(full)
    return path


def _hsdp_assumed(m) -> list:
    return [a for a in m.run["meta"]["assumed"] if a.startswith("dp_replicate")]


@pytest.mark.parametrize("text, fsdp, zero_stage, dp_replicate, assumed", [
    # unstated size on 64 GPUs, tp 1: a node's 8 ranks shard, 64 / 8 = 8 replicas (assumed)
    ("HSDP", True, 3, 64 // _NODE, True),
    ("hybrid shard", True, 3, 64 // _NODE, True),
    ("HYBRID_SHARD", True, 3, 64 // _NODE, True),
    ("FSDP hybrid", True, 3, 64 // _NODE, True),
    ("_HYBRID_SHARD_ZERO2", True, 2, 64 // _NODE, True),  # SHARD_GRAD_OP within the shard group
    ("DeepSpeed MiCS", False, 3, 64 // _NODE, True),  # MiCS is ZeRO-3 within the group
    # stated sizes
    ("HSDP, shard 16", True, 3, 64 // 16, False),
    ("FSDP HYBRID_SHARD, shard size 32", True, 3, 64 // 32, False),
    ("hybrid shard, 16-way shard", True, 3, 64 // 16, False),
    ("HSDP (shard group of 32)", True, 3, 64 // 32, False),
    ("HSDP, replicate 4", True, 3, 4, False),
    ("HSDP, 2 replicas", True, 3, 2, False),
    ("HSDP shard 8 replicate 8", True, 3, 8, False),
    ("torchtitan dp_shard=16 (HSDP)", True, 3, 64 // 16, False),
    ("DeepSpeed MiCS, mics_shard_size=16", False, 3, 64 // 16, False),
    ("ZeRO-2 hybrid, shard 8", False, 2, 64 // 8, False),
    ("distributed optimizer, 2 instances", False, 1, 2, False),  # Megatron's num_distributed_optimizer_instances
])
def test_hybrid_sharding_words_map_to_fsdp_or_zero_plus_dp_replicate(tmp_path, text, fsdp, zero_stage,
                                                                     dp_replicate, assumed):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "64", "zero_or_fsdp": text}))
    assert not got.skipped, got.skipped
    (m,) = got.runs
    spec = RunSpec.from_dict(m.run)
    s = spec.strategy
    assert (s.fsdp, s.effective_zero_stage, s.dp_replicate) == (fsdp, zero_stage, dp_replicate)
    assert s.shard_size == 64 // dp_replicate
    assert bool(_hsdp_assumed(m)) is assumed
    assert sum(got.assumptions.values()) == len(m.run["meta"]["assumed"])


@pytest.mark.parametrize("layout, dp_replicate, shard", [
    # tp 2: a node holds 8 / 2 = 4 data-parallel ranks of dp = 32, so 32 / 4 = 8 replicas of 4 ranks
    ({"tp": "2"}, 8, 4),
    # cp 2: 8 / (1·2) = 4 data-parallel ranks a node, dp = 32, 8 replicas; a shard group is dp·cp / 8 = 8 ranks,
    # the node's
    ({"cp": "2"}, 8, 8),
    # pp 2: dp = 32 over 32 / 8 = 4 nodes a stage
    ({"pp": "2"}, 4, 8),
])
def test_an_unstated_shard_group_is_one_node_and_says_so(tmp_path, layout, dp_replicate, shard):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "64", "zero_or_fsdp": "HSDP", **layout}))
    assert not got.skipped, got.skipped
    (m,) = got.runs
    s = RunSpec.from_dict(m.run).strategy
    assert (s.fsdp, s.dp_replicate, s.shard_size) == (True, dp_replicate, shard)
    (note,) = _hsdp_assumed(m)
    assert note.startswith(f"dp_replicate {dp_replicate} for 'HSDP'") and f"one node of {_NODE}" in note
    assert got.assumptions[note] == 1


@pytest.mark.parametrize("num_gpus, pp", [(8, "1"), (4, "1"), (16, "2")])
def test_hybrid_sharding_within_one_node_is_full_sharding(tmp_path, num_gpus, pp):
    # all data-parallel ranks share a node (8 GPUs; half a node; pp 2 over 16 GPUs, dp 8 a stage): the node-sized
    # shard group holds every rank, so HSDP is plain FSDP, dp_replicate 1, and the assumption says so
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": str(num_gpus), "pp": pp, "zero_or_fsdp": "HSDP"}))
    (m,) = got.runs
    s = RunSpec.from_dict(m.run).strategy
    assert (s.fsdp, s.effective_zero_stage, s.dp_replicate) == (True, 3, 1)
    (note,) = _hsdp_assumed(m)
    assert note.startswith("dp_replicate 1 for 'HSDP': full sharding")


def test_a_stated_shard_size_that_contradicts_dp_is_skipped(tmp_path):
    path = _hybrid_table(tmp_path, *({"num_gpus": "64", "zero_or_fsdp": t} for t in (
        "HSDP shard 3", "HSDP, 3 replicas", "HSDP shard 8 replicate 4", "HSDP shard 128")))
    got = load_published(path)
    assert not got.runs
    assert got.skipped == [
        ("line 2 (row_id h1)", "zero_or_fsdp 'HSDP shard 3': a shard group of 3 ranks does not divide dp·cp = 64"),
        ("line 3 (row_id h2)", "zero_or_fsdp 'HSDP, 3 replicas': 3 replicas do not divide dp·cp = 64"),
        ("line 4 (row_id h3)", "zero_or_fsdp 'HSDP shard 8 replicate 4': shard 8 × 4 replicas ≠ dp·cp = 64"),
        ("line 5 (row_id h4)", "zero_or_fsdp 'HSDP shard 128': a shard group of 128 ranks does not divide "
                               "dp·cp = 64"),
    ]
    with pytest.raises(InputError, match=r"hybrid\.csv: line 2 \(row_id h1\): zero_or_fsdp 'HSDP shard 3': "
                                         r"a shard group of 3 ranks does not divide dp·cp = 64$"):
        load_published(path, strict=True)


@pytest.mark.parametrize("text", ["ZeRO++", "ZeRO-3 + hpZ", "ZeRO++ (hpZ, zero_hpz_partition_size=8)"])
def test_zero_plus_plus_is_not_hybrid_sharding(tmp_path, text):
    # hpZ keeps a secondary parameter copy within a node but the states stay sharded over all ranks, and its
    # quantized traffic is not ZeRO-3's: skipped with that reason, never read as HSDP or plain ZeRO-3
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "64", "zero_or_fsdp": text}))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert "ZeRO++" in reason and "not hybrid sharding" in reason


# ------------------------------------------------------------------ which device a gpu_type names
# The expected part follows from the words alone: a stated memory size or form factor picks the part that
# has it, an unstated form is the SXM one (flagged as assumed), and the dies of an MI250X/MI250 are the GPUs
# ROCm exposes unless the row says it counts packages (flagged as assumed too).
@pytest.mark.parametrize("gpu_type, device, assumed", [
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB", False),
    ("A100 40GB", "A100-SXM4-40GB", True),
    ("V100 16GB", "V100-SXM2-16GB", True),
    ("V100-PCIE-16GB", "V100-PCIE-16GB", False),
    ("V100 32GB", "V100-SXM2-32GB", True),
    ("Tesla V100-SXM3-32GB", "V100-SXM3-32GB", False),
    ("Tesla P100-SXM2-16GB", "P100-SXM2-16GB", False),
    ("A800 80GB", "A800-SXM4-80GB", False),
    ("NVIDIA H800", "H800-SXM5-80GB", False),
    ("GeForce RTX 4090", "RTX-4090", False),
    ("NVIDIA RTX A6000", "RTX-A6000", False),
    ("AMD Instinct MI250X", "MI250X-GCD", True),
    ("MI250X GCD", "MI250X-GCD", False),
    ("MI250X OAM", "MI250X", False),
    ("AMD Instinct MI250X (128GB)", "MI250X", False),
    ("MI300X 192GB", "MI300X", False),
    ("A100-80G", "A100-SXM4-80GB", True),      # "80G": a memory size without the B
    ("A100 80G SXM", "A100-SXM4-80GB", False),
    # vendor and brand words before the alias 'A100', which names one of four parts: as filled in as an SXM form
    ("Nvidia Tesla A100", "A100-SXM4-80GB", True),
    ("H100", "H100-SXM5-80GB", True),                 # the catalog's alias, but an H100 PCIe exists
    ("A100-80GB", "A100-SXM4-80GB", True),            # an A100 80GB PCIe exists
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", False),  # nvidia-smi's name of the SXM part
    ("NVIDIA GH200", "GH200-96GB", False),
    ("GH200 96GB", "GH200-96GB", False),
])
def test_a_gpu_type_names_the_part_it_states(gpu_type, device, assumed):
    from learnedperf.measure.published import _device_name

    notes: list = []
    assert _device_name(gpu_type, notes) == device
    assert bool(notes) == assumed, notes


@pytest.mark.parametrize("gpu_type, reason", [
    ("H100 96GB", "states 96 GB, which no catalog H100 has"),
    ("A100 SXM2", "states sxm2, a form no catalog A100 has"),
    ("A10G", "'A10G' is not a catalog device"),
    ("H100 NVL", "states nvl, a form no catalog H100 has"),  # the 94 GB NVL board, not the SXM part
    ("GH200 144GB", "states 144 GB, which no catalog GH200 has"),  # the HBM3e configuration
])
def test_a_stated_part_the_catalog_lacks_is_skipped_not_replaced(gpu_type, reason):
    from learnedperf.measure.published import _device_name, _Skip

    with pytest.raises(_Skip, match=reason):
        _device_name(gpu_type, [])


@pytest.mark.parametrize("gpu_type, interconnect, cluster, inter_GBps", [
    # no cluster named: the vendor's reference system (DGX), not a cloud instance listed after it
    ("A100 SXM4 40GB", "", "dgx-a100-40gb", None),
    ("A100 SXM4 40GB", "AWS p4d.24xlarge, 400 Gbps EFA", "aws-p4d", None),
    ("A100 SXM4 40GB", "Perlmutter, 4x 200Gb/s Slingshot-11 per node", "perlmutter", None),
    # Frontier: 4 Slingshot NICs of 200 Gb/s for 8 GCDs, as the catalog has it (12.5 GB/s each)
    ("AMD Instinct MI250X", "Frontier, 4x 200Gb/s Slingshot per node", "frontier", None),
    # a stated NIC rate that differs from the catalog's overrides it: 8 x 200 Gb/s / 8 GPUs = 25 GB/s
    ("A100 SXM4 40GB", "AWS p4d.24xlarge, 8x 200Gb/s", "aws-p4d", 25.0),
    # rates written without "b/s": 4 x 200 Gb/s / 8 GPUs = 12.5 GB/s; 8 x 100 Gb/s Ethernet / 8 = 12.5 GB/s
    ("A100 SXM4 40GB", "4x200G RoCE", "dgx-a100-40gb", 12.5),
    ("H100 SXM5 80GB", "8x 100GbE", "dgx-h100", 12.5),
    # GH200 systems: the first in catalog order, or the one the text names; 4 x 200 Gb/s per node of 4 = 25 GB/s
    ("GH200", "", "alps", None),
    ("GH200", "JUPITER Booster, 4x NDR200 InfiniBand 200Gb/s", "jupiter", None),
])
def test_a_row_runs_on_the_cluster_its_text_names(tmp_path, gpu_type, interconnect, cluster, inter_GBps):
    path = _hybrid_table(tmp_path, {"num_gpus": "64", "gpu_type": gpu_type, "interconnect": interconnect,
                                    "zero_or_fsdp": "FSDP"})
    (m,) = load_published(path).runs
    hw = m.run["hardware"]
    assert hw["cluster"] == cluster
    assert hw.get("inter_node_bandwidth_GBps") == inter_GBps


@pytest.mark.parametrize("text", ["ZeRO-Offload", "ZeRO-3 Offload", "ZeRO-Infinity (NVMe)", "FSDP + CPU offload",
                                  "NO_SHARD, CPUOffload"])
def test_offloaded_states_are_skipped_not_read_as_on_device_sharding(tmp_path, text):
    # the optimizer step on the host and the PCIe traffic of offloading are not simulated: read as ZeRO-3 or
    # FSDP on the device, the row would be predicted far too fast, so it is skipped with that reason
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "16", "zero_or_fsdp": text}))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert reason.startswith(f"zero_or_fsdp {text!r}: offloading to host memory or NVMe")


@pytest.mark.parametrize("name, vocab, tokenizer", [
    ("Llama 3.2 3B", 128256, "Llama 3"),     # Llama 3's 128K tokenizer, not Llama 1/2's 32,000
    ("Gemma 2B", 256000, "Gemma"),
    ("Llama 2 7B (our run)", 32000, "llama family"),
])
def test_a_blank_vocabulary_is_the_named_familys_tokenizer(tmp_path, name, vocab, tokenizer):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name, "vocab_size": ""}))
    (m,) = got.runs
    assert m.run["model"]["vocab_size"] == vocab
    assert f"vocab_size {vocab} ({tokenizer}'s tokenizer)" in m.run["meta"]["assumed"]


@pytest.mark.parametrize("name", ["T5-11B", "Flan-T5 XXL", "mT5-XXL", "BART-large", "UL2 20B"])
def test_encoder_decoder_models_are_skipped(tmp_path, name):
    # one stack of layers cannot hold an encoder and a decoder whose split the table does not give
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name}))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert "is an encoder-decoder" in reason


@pytest.mark.parametrize("text, fsdp, zero_stage", [
    # PyTorch FSDP's ShardingStrategy names, as LLM Foundry's tables print them: FULL_SHARD shards parameters,
    # gradients and optimizer states (ZeRO-3), SHARD_GRAD_OP keeps parameters gathered between forward and
    # backward (ZeRO-2), NO_SHARD holds everything on every rank (DDP)
    ("FULL_SHARD", True, 3),
    ("ShardingStrategy.FULL_SHARD", True, 3),
    ("full shard", True, 3),
    ("SHARD_GRAD_OP", True, 2),
    ("NO_SHARD", False, 0),
])
def test_fsdp_sharding_strategy_names_are_read(tmp_path, text, fsdp, zero_stage):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "16", "zero_or_fsdp": text}))
    assert not got.skipped, got.skipped
    (m,) = got.runs
    s = RunSpec.from_dict(m.run).strategy
    assert (s.fsdp, s.effective_zero_stage, s.dp_replicate) == (fsdp, zero_stage, 1)


@pytest.mark.parametrize("text, precision, assumed", [
    ("amp_bf16", "bf16", False),  # LLM Foundry's names
    ("amp_fp8", "fp8", False),
    ("AMP", "fp16", True),        # torch.autocast on CUDA and Apex AMP cast to float16 by default
    ("mixed precision", "fp16", True),
    ("Apex O2", "fp16", True),
])
def test_mixed_precision_without_a_type_is_fp16_and_says_so(tmp_path, text, precision, assumed):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "precision": text}))
    (m,) = got.runs
    assert m.run["strategy"]["precision"] == precision
    note = f"precision fp16 for {text!r} (AMP's default half type)"
    assert (note in m.run["meta"]["assumed"]) is assumed


def test_a_precision_naming_no_type_is_skipped(tmp_path):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "precision": "low"}))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert reason.startswith("field 'precision': 'low' names no precision")


@pytest.mark.parametrize("name", ["Mamba2-Hybrid 8B", "Jamba 1.5 Large", "Nemotron-H 56B", "RecurrentGemma 9B"])
def test_state_space_and_recurrent_models_are_skipped(tmp_path, name):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name}))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert "has state-space or recurrent layers" in reason


@pytest.mark.parametrize("name", ["MPT-7B", "mpt-70b", "MosaicML MPT 30B", "Nemotron-4 15B"])
def test_gpt_style_families_are_named_not_assumed(tmp_path, name):
    # MPT (LayerNorm, GELU 4h MLP) and Nemotron-4 (LayerNorm, squared-ReLU 4h MLP) have ungated GPT-style blocks
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name}))
    (m,) = got.runs
    assert m.run["model"]["arch"] == "gpt"
    assert not any(a.startswith("arch ") for a in m.run["meta"]["assumed"])


@pytest.mark.parametrize("text", ["ZB-H2", "zero bubble", "DualPipe"])
def test_zero_bubble_schedules_are_skipped_not_read_as_interleaved(tmp_path, text):
    # the zero-bubble schedules other than ZB-H1 and ZB-V (tests/test_zero_bubble_frontends.py); "ZB-V" was read as
    # an interleaved 1F1B once, then skipped, and is now the run format's zb-v (tests/test_zb_v.py)
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "16", "pp": "4", "vpp_or_schedule": text}))
    assert not got.runs
    ((_, reason),) = got.skipped
    assert "zero-bubble schedules" in reason


def test_a_family_word_inside_another_word_names_no_family(tmp_path):
    # "mpt" inside "attempt" is not MPT: the name names no family, so the arch is assumed and says so
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": "our attempt 1B"}))
    (m,) = got.runs
    assert "arch gpt (model name names no known family)" in m.run["meta"]["assumed"]


# ------------------------------------------------------------ mixtures of experts and fp8
def test_a_moe_row_states_its_experts_in_notes_and_keeps_its_gpt_block(tmp_path):
    got = load_published(_hybrid_table(tmp_path, {
        "num_gpus": "16", "ep": "8", "model": "GPT 1.3B MoE", "vocab_size": "",
        "notes": "64 experts, top-1 gating, MoE every other layer"}))
    (m,) = got.runs
    spec = RunSpec.from_dict(m.run)
    assert (spec.model.arch, spec.model.num_experts, spec.model.moe_top_k, spec.model.moe_layer_frequency) == \
        ("moe", 64, 1, 2)
    # a GPT-named MoE keeps GPT's block and tokenizer, not Mixtral's
    assert (spec.model.activation, spec.model.norm, spec.model.position_embedding) == ("gelu", "layernorm", "learned")
    assert spec.model.vocab_size == 51200
    assert spec.strategy.ep == 8
    assert not [a for a in m.run["meta"]["assumed"] if "moe" in a or "experts" in a]


def test_a_dense_named_row_whose_notes_state_experts_is_a_moe(tmp_path):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": "GPT 1B",
                                                  "notes": "num_experts=16, moe_router_topk=2"}))
    (m,) = got.runs
    assert (m.run["model"]["arch"], m.run["model"]["num_experts"], m.run["model"]["moe_top_k"]) == ("moe", 16, 2)
    assert "experts in every layer (not stated; Mixtral's layout)" in m.run["meta"]["assumed"]


def test_mixtral_style_expert_count_in_the_name_and_unstated_top_k_is_assumed(tmp_path):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": "MyMoE 8x1B"}))
    (m,) = got.runs
    assert (m.run["model"]["num_experts"], m.run["model"]["moe_top_k"]) == (8, 2)
    assert "moe_top_k 2 (not stated; GShard's and Mixtral's routing)" in m.run["meta"]["assumed"]
    # not in notes: "1e-4" is a learning rate, not an expert count
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": "GPT 1B", "notes": "lr 1e-4"}))
    assert got.runs[0].run["model"]["arch"] == "gpt"


@pytest.mark.parametrize("name, notes, factor", [
    ("GPT 1.3B MoE", "64 experts, top-1, capacity factor 1.25", 1.25),
    ("Mixtral-8x7B", "Megatron-Core, moe_expert_capacity_factor=2, padded to capacity", 2.0),
    ("Mixtral-8x7B", "dropless", None),
    ("GPT 1.3B", "dense baseline of the capacity factor 2.0 runs", None),  # a dense model has no experts to size
])
def test_a_stated_capacity_factor_sizes_the_experts(tmp_path, name, notes, factor):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name, "notes": notes}))
    (m,) = got.runs
    assert m.run["strategy"].get("moe_capacity_factor") == factor
    assert RunSpec.from_dict(m.run).strategy.moe_capacity_factor == factor


@pytest.mark.parametrize("name, notes, grouped", [
    ("Mixtral-8x7B", "Megatron-Core, SequentialMLP", False),
    ("Mixtral-8x7B", "no grouped GEMM", False),
    ("Mixtral-8x7B", "moe_grouped_gemm=False", False),
    ("Mixtral-8x7B", "Megatron-Core, --moe-grouped-gemm", True),
    ("Mixtral-8x7B", "", True),
    ("GPT 1.3B", "SequentialMLP ablation of the MoE runs", True),  # a dense model has no experts to loop over
])
def test_a_stated_expert_loop_runs_the_experts_one_at_a_time(tmp_path, name, notes, grouped):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name, "notes": notes}))
    (m,) = got.runs
    assert RunSpec.from_dict(m.run).strategy.moe_grouped_gemm is grouped
    assert ("moe_grouped_gemm" in m.run["strategy"]) == (not grouped)


@pytest.mark.parametrize("name, notes, reason", [
    ("Some MoE 2B", "", "states no expert count"),
    ("DeepSeek-V3.2-Exp", "", "shared experts"),  # not the catalog's DeepSeek-V3: sparse attention besides
    ("Qwen2-MoE 7B", "60 experts, top-4", "shared experts"),  # not the catalog's Qwen1.5-MoE-A2.7B: read
    ("GPT MoE 1B", "8 experts + 2 shared experts", "shared experts"),
    ("Switch-XXL", "", "encoder-decoder"),  # the Switch Transformers are T5s
])
def test_moe_rows_the_run_format_cannot_describe_are_skipped(tmp_path, name, notes, reason):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name, "notes": notes}))
    assert not got.runs
    ((_, why),) = got.skipped
    assert reason in why


@pytest.mark.parametrize("text", ["Float8", "float8 (tensorwise)", "bf16 + float8 linear", "FP8 e4m3", "MXFP8"])
def test_float8_wordings_are_fp8(tmp_path, text):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "precision": text}))
    (m,) = got.runs
    assert m.run["strategy"]["precision"] == "fp8"


@pytest.mark.parametrize("framework, notes, peak_of, assumed", [
    ("torchtitan", "", "bf16", False),            # torchtitan's get_peak_flops is the bf16 dense peak
    ("LLM Foundry", "", "fp8", False),            # Composer's GPU_AVAILABLE_FLOPS['amp_fp8'] is the fp8 peak
    ("Megatron-LM", "MFU against bf16 peak", "bf16", False),
    ("Megatron-LM", "", "fp8", True),             # not stated: the run's own dtype's peak, counted
])
def test_the_mfu_of_an_fp8_run_is_read_against_the_peak_its_framework_uses(tmp_path, framework, notes, peak_of,
                                                                         assumed):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "precision": "fp8", "framework": framework,
                                                  "notes": notes, "iteration_time_s": "", "mfu_pct": "40"}))
    (m,) = got.runs
    spec = RunSpec.from_dict(m.run)
    peak = spec.hardware.device.peak_flops(peak_of)
    flops = megatron_flops(spec.model, 8, False)
    assert m.iteration_time_ms == pytest.approx(flops / (0.40 * peak * 8) * 1e3)
    note = "MFU of an fp8 run counted against the fp8 peak (the row does not say which peak)"
    assert (note in m.run["meta"]["assumed"]) is assumed


@pytest.mark.parametrize("text, recompute", [("uniform (1 layer)", "full"), ("full, uniform", "full"),
                                             ("block (4 layers)", None), ("full, block 2", None)])
def test_megatron_recompute_methods(tmp_path, text, recompute):
    # uniform recomputes every layer (in groups of N); block only N layers of each stage, not in the run format
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "activation_recompute": text}))
    if recompute is None:
        assert not got.runs
        ((_, reason),) = got.skipped
        assert "block method" in reason
    else:
        assert got.runs[0].run["strategy"]["recompute"] == recompute


@pytest.mark.parametrize("name, notes, experts, top_k", [
    ("Qwen3-30B-A3B", "128 experts, top-8", 128, 8),     # "-A3B": 3B active of 30B, a MoE
    ("Qwen3-30B-A3B", "", None, None),                   # a MoE whose expert count the row does not state
    ("Llama 4 Scout 17B-16E", "16 experts, top-1", None, None),  # a shared expert and chunked attention
    ("gpt-oss-120b", "128 experts, top-4", None, None),  # sliding-window attention layers
    ("Llama 3.1 405B", "", 1, None),                     # dense: "4" of "405B" is not Llama 4
])
def test_moe_names_the_family_words_miss(tmp_path, name, notes, experts, top_k):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name, "notes": notes,
                                                  "num_kv_heads": "4"}))
    if experts is None:
        assert not got.runs
        ((_, why),) = got.skipped
        assert "mixture of experts" in why
        return
    (m,) = got.runs
    spec = RunSpec.from_dict(m.run)
    assert spec.model.num_experts == experts
    if top_k is not None:
        assert spec.model.moe_top_k == top_k and spec.model.arch == "moe"


@pytest.mark.parametrize("gpu_type, device", [("8xH100", "H100-SXM5-80GB"), ("8 x A100 80GB", "A100-SXM4-80GB"),
                                              ("8×H100 SXM", "H100-SXM5-80GB")])
def test_a_count_before_the_gpu_name_is_not_part_of_it(tmp_path, gpu_type, device):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "gpu_type": gpu_type}))
    (m,) = got.runs
    assert RunSpec.from_dict(m.run).hardware.device.name == device


def test_top_k_experts_is_not_the_expert_count(tmp_path):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": "GPT MoE 1B",
                                                  "notes": "routing to the top-2 experts of 16 experts"}))
    (m,) = got.runs
    assert (m.run["model"]["num_experts"], m.run["model"]["moe_top_k"]) == (16, 2)
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": "BERT-MoE large",
                                                  "notes": "16 experts"}))
    ((_, why),) = got.skipped
    assert "BERT-style (bidirectional) mixture of experts" in why


@pytest.mark.parametrize("gpu_type, interconnect, inter_GBps", [
    # "24xlarge" is an instance type, not 24 NICs: the catalog's p4d figure stays (its 4 x 100 Gb/s EFA)
    ("A100 SXM4 40GB", "AWS p4d.24xlarge 400 Gbps EFA", None),
    # the rate first: 4 NICs of 200 Gb/s for 8 GPUs = 12.5 GB/s each
    ("H100 SXM5 80GB", "200 Gb/s x 4 per node", 12.5),
])
def test_nic_counts_are_numbers_of_their_own(tmp_path, gpu_type, interconnect, inter_GBps):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "64", "gpu_type": gpu_type,
                                                  "interconnect": interconnect}))
    (m,) = got.runs
    assert m.run["hardware"].get("inter_node_bandwidth_GBps") == inter_GBps


def test_a_node_total_rate_sets_the_inter_node_bandwidth(tmp_path):
    # the L40S has no catalog cluster: 400 Gb/s per node of 8 GPUs is 6.25 GB/s each
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "16", "gpu_type": "L40S",
                                                  "interconnect": "400 Gb/s per node"}))
    (m,) = got.runs
    assert m.run["hardware"]["inter_node_bandwidth_GBps"] == pytest.approx(400 * 0.125 / 8)


@pytest.mark.parametrize("num_gpus, tokens", [("16 (2 nodes)", "~4,000"), ("16", "≈ 4000"),
                                              ("16 ", "4000 (measured)")])
def test_numbers_with_a_remark_or_approximate_are_read(tmp_path, num_gpus, tokens):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": num_gpus, "iteration_time_s": "",
                                                  "tokens_per_sec_per_gpu": tokens}))
    (m,) = got.runs
    assert m.run["hardware"]["num_devices"] == 16
    assert m.iteration_time_ms == pytest.approx(16 * 2048 / (4000 * 16) * 1e3)  # 16 sequences of 2,048 tokens


def test_a_field_that_is_no_number_still_names_itself(tmp_path):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "sixteen"}))
    ((_, why),) = got.skipped
    assert why == "field 'num_gpus': 'sixteen' is not a number"


@pytest.mark.parametrize("name, catalog", [("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
                                           ("Llama-2-7b-chat-hf", "llama-2-7b")])
def test_a_release_of_a_catalog_model_has_its_architecture(tmp_path, name, catalog):
    from learnedperf.catalog import get_model

    ref = get_model(catalog)
    got = load_published(_hybrid_table(tmp_path, {
        "num_gpus": "8", "model": name, "num_layers": str(ref["num_layers"]), "hidden_size": str(ref["hidden_size"]),
        "num_heads": str(ref["num_attention_heads"]), "vocab_size": ""}))
    (m,) = got.runs
    model = m.run["model"]
    # the FFN, KV heads, experts and vocabulary the row leaves out are the catalog's, not a family default
    for key in ("ffn_hidden_size", "num_kv_heads", "num_experts", "vocab_size"):
        assert model.get(key, 1) == ref.get(key, 1), key
    assert not [a for a in m.run["meta"]["assumed"] if "vocab" in a or "moe" in a or "experts" in a]


def test_an_unknown_models_filled_in_ffn_and_kv_heads_are_counted(tmp_path):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": "Llama-like 7B", "num_layers": "32",
                                                  "hidden_size": "4096", "num_heads": "32"}))
    (m,) = got.runs
    assumed = m.run["meta"]["assumed"]
    # Llama's rule (Touvron et al. 2023): 2/3 of 4·4096, rounded up to a multiple of 256 = 11,008
    assert "ffn_hidden_size 11008 (SwiGLU: 2/3 of 4h, a multiple of 256: the row states none)" in assumed
    assert "num_kv_heads 32 (one per attention head: the row states none)" in assumed
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "ffn_hidden_size": "8192", "num_kv_heads": "16"}))
    assert not [a for a in got.runs[0].run["meta"]["assumed"] if a.startswith(("ffn_hidden_size", "num_kv_heads"))]


def test_megatron_flops_count_the_attention_width_of_heads_set_apart():
    # Gemma 7B: 16 heads of 256 (4,096 wide) over hidden 3,072; every matmul 2·m·n·k per token, forward ×3
    m = ModelSpec.parse({"arch": "llama", "num_layers": 28, "hidden_size": 3072, "num_attention_heads": 16,
                         "num_kv_heads": 16, "head_dim": 256, "ffn_hidden_size": 24576, "vocab_size": 256000,
                         "seq_length": 8192, "tie_embeddings": True})
    h, q, s, l, f, V = 3072, 4096, 8192, 28, 24576, 256000
    per_token_layer = 2 * h * 3 * q + 2 * q * h + 4 * s * q + 2 * 3 * h * f
    assert megatron_flops(m, 1, False) == pytest.approx(3 * (l * per_token_layer + 2 * h * V) * s)


# ------------------------------------------------------------ MoEs with shared experts
@pytest.mark.parametrize("name, layers, hidden, heads, kv_heads, shared", [
    ("DeepSeek-MoE-16B", 28, 2048, 16, 16, 2 * 1408),
    ("Qwen1.5-MoE-A2.7B", 24, 2048, 16, 16, 5632),
    ("Qwen2-57B-A14B", 28, 3584, 28, 4, 20480),
    ("deepseek-moe-16b-chat", 28, 2048, 16, 16, 2 * 1408),  # a release: its HF repo's name
])
def test_a_row_naming_a_catalog_moe_with_shared_experts_is_read(tmp_path, name, layers, hidden, heads, kv_heads,
                                                               shared):
    # the catalog entry brings the shared experts' width, which a row's columns cannot state
    got = load_published(_hybrid_table(tmp_path, {
        "num_gpus": "8", "model": name, "num_layers": str(layers), "hidden_size": str(hidden), "num_heads": str(heads),
        "num_kv_heads": str(kv_heads), "vocab_size": "", "notes": "shared experts and routed experts"}))
    assert not got.skipped and not got.warnings
    (m,) = got.runs
    model = RunSpec.from_dict(m.run).model
    assert (model.arch, model.moe_shared_ffn_hidden_size) == ("moe", shared)
    assert model.num_experts > 2 and model.moe_top_k > 2
    assert not [a for a in m.run["meta"]["assumed"] if "moe" in a or "experts" in a]


@pytest.mark.parametrize("name, notes, reasons", [
    ("DeepSeek-V3.2-Exp", "", ("shared experts, whose width a row cannot state", "latent attention (MLA)")),
    ("DeepSeek-V2-Small", "64 experts, top-6", ("shared experts", "latent attention (MLA)")),
    ("Foo-MoE 3B", "2 shared experts, 64 experts, top-6", ("shared experts, whose width a row cannot state",)),
    ("DeepSeek-MoE 145B", "128 experts, top-12", ("shared experts, whose width a row cannot state",)),
])
def test_a_row_of_a_shared_expert_moe_the_catalog_lacks_says_why_it_is_skipped(tmp_path, name, notes, reasons):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name, "notes": notes}))
    assert not got.runs
    ((_, why),) = got.skipped
    assert all(r in why for r in reasons), why
    # the message names the catalog models that have shared experts, which a row can name instead
    assert "deepseek-moe-16b" in why and "qwen2-57b-a14b" in why
    assert ("latent attention" in why) == ("latent attention (MLA)" in reasons)


@pytest.mark.parametrize("name, layers, hidden, heads", [
    ("DeepSeek-R1-Distill-Llama-8B", 32, 4096, 32),  # R1 distilled into dense Llama and Qwen models
    ("DeepSeek-R1-Distill-Qwen-7B", 28, 3584, 28),
    ("DeepSeek-LLM-67B", 95, 8192, 64),  # DeepSeek's dense models
])
def test_dense_deepseek_models_are_not_read_as_moes(tmp_path, name, layers, hidden, heads):
    got = load_published(_hybrid_table(tmp_path, {"num_gpus": "8", "model": name, "num_layers": str(layers),
                                                  "hidden_size": str(hidden), "num_heads": str(heads)}))
    assert not got.skipped, got.skipped
    model = RunSpec.from_dict(got.runs[0].run).model
    assert (model.arch, model.is_moe, model.is_mla) == ("llama", False, False)


@pytest.mark.parametrize("notes, ep, expected", [
    ("Megatron-Core, DeepEP, EP A2A overlap", "8", {"moe_dispatcher": "deepep", "overlap_moe_comm": True}),
    ("flex dispatcher", "8", {"moe_dispatcher": "deepep"}),
    ("--overlap-moe-expert-parallel-comm", "8", {"overlap_moe_comm": True}),
    ("TP comm overlap", "8", {}),  # tensor-parallel overlap says nothing about the expert all-to-alls
    ("DeepEP, A2A overlap", "1", {}),  # nothing to dispatch without expert parallelism
])
def test_expert_dispatch_words_map_to_the_run_format(tmp_path, notes, ep, expected):
    path = tmp_path / "moe.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=PUBLISHED_COLUMNS)
        w.writeheader()
        w.writerow({"row_id": "m1", "model": "Mixtral 8x7B", "num_layers": "32", "hidden_size": "4096",
                    "num_heads": "32", "seq_len": "4096", "gpu_type": "H100 SXM5 80GB", "num_gpus": "64",
                    "tp": "2", "pp": "1", "ep": ep, "micro_batch_size": "1", "global_batch_size_seqs": "256",
                    "activation_recompute": "none", "precision": "bf16", "framework": "Megatron-Core 2025",
                    "notes": notes, "iteration_time_s": "1.0"})
    got = load_published(path)
    assert not got.skipped, got.skipped
    (m,) = got.runs
    strategy = RunSpec.from_dict(m.run).strategy
    assert {k: getattr(strategy, k) for k in expected} == expected
    defaults = {"moe_dispatcher": "alltoall", "overlap_moe_comm": False}
    assert {k: getattr(strategy, k) for k in defaults if k not in expected} == {
        k: v for k, v in defaults.items() if k not in expected}
