"""The shipped catalog: every entry validates, every number has a source, parameter counts
match the published ones, names and aliases resolve, and HuggingFace configs map onto ModelSpec."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from learnedperf.catalog import _norm, get_cluster, get_device, get_model, names, source
from learnedperf.errors import CatalogError, SpecError
from learnedperf.specs.hardware import DeviceSpec, resolve_hardware
from learnedperf.specs.model import ModelSpec

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DATA_DIR = Path(__file__).resolve().parents[1] / "learnedperf" / "catalog" / "data"

REQUIRED_DEVICES = [
    "V100-SXM2-32GB", "V100-PCIE-32GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIE-40GB", "A100-PCIE-80GB",
    "H100-SXM5-80GB", "H100-PCIE-80GB", "H200-SXM-141GB", "B200", "GB200", "L4", "L40S", "T4", "P100-PCIE-16GB",
    "P4", "MI100", "MI210", "MI250X", "MI300X",
    # parts published runs name: export variants, 16 GB and DGX-2 V100s, workstation and consumer cards, dies
    "A800-SXM4-80GB", "H800-SXM5-80GB", "V100-SXM2-16GB", "V100-PCIE-16GB", "V100-SXM3-32GB", "P100-SXM2-16GB",
    "A10", "A40", "L40", "RTX-A6000", "RTX-3090", "RTX-4090", "MI250X-GCD", "MI250-GCD", "MI325X", "GH200-96GB",
]
REQUIRED_CLUSTERS = ["dgx-v100", "dgx-a100", "dgx-a100-40gb", "selene", "dgx-h100", "dgx-h200", "dgx-b200",
                     "gb200-nvl72", "hgx-mi300x", "dgx-2", "frontier", "perlmutter", "aws-p4d", "aws-p4de", "aws-p5",
                     "alps", "jupiter"]
REQUIRED_MODELS = (
    [f"gpt3-{s}" for s in ("125m", "350m", "760m", "1.3b", "2.7b", "6.7b", "13b", "175b")]
    + [f"megatron-{s}" for s in ("1.7b", "3.6b", "7.5b", "18.4b", "39.1b", "76.1b", "145.6b", "310.1b", "529.6b", "1t")]
    + ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3-405b",
       "bert-base", "bert-large", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl",
       "mixtral-8x7b", "mixtral-8x22b"]
)


def _raw(kind: str) -> dict:
    return {k: v for k, v in json.loads((DATA_DIR / f"{kind}.json").read_text()).items() if not k.startswith("_")}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ------------------------------------------------------------------ devices
@pytest.mark.parametrize("name", REQUIRED_DEVICES)
def test_required_device_present(name):
    assert name in names("devices")


@pytest.mark.parametrize("name", names("devices"))
def test_device_parses_and_every_number_has_a_source(name):
    entry = get_device(name)
    spec = DeviceSpec.parse(entry)
    assert spec.name == name
    assert "name" not in _raw("devices")[name], "the key is the name; do not repeat it"
    # the numbers, and the compute capability (a data-sheet value written as text, "9.0")
    numeric = {k for k, v in entry.items() if _is_number(v)} | {"peak_tflops"} | ({"compute_capability"} & set(entry))
    missing = numeric - set(spec.sources)
    assert not missing, f"{name}: no source for {sorted(missing)}"
    stray = set(spec.sources) - numeric
    assert not stray, f"{name}: sources for fields not set: {sorted(stray)}"
    assert all(isinstance(s, str) and len(s) > 10 for s in spec.sources.values())
    # per-device link fields only; network and latency belong to clusters
    for key in ("inter_node_bandwidth_GBps", "intra_node_latency_us", "inter_node_latency_us"):
        assert key not in entry, f"{name}: {key} belongs in clusters.json"
    assert spec.vendor in ("NVIDIA", "AMD")
    assert spec.peak_tflops.fp32 > 0


def test_device_peaks_are_plausible():
    """Dense tensor peaks exceed fp32 and come in the usual ratios (catches sparse values left in)."""
    for name in names("devices"):
        p = DeviceSpec.parse(get_device(name)).peak_tflops
        if p.bf16 is not None and p.fp16 is not None:
            assert p.bf16 == p.fp16 or name == "MI100", name  # MI100: bf16 is half the fp16 rate
        if p.tf32 is not None:
            assert math.isclose(p.bf16 / p.tf32, 2, rel_tol=0.02), name
        if p.fp8 is not None:
            assert math.isclose(p.fp8 / p.bf16, 2, rel_tol=0.02), name


def test_device_known_values():
    a100 = DeviceSpec.parse(get_device("A100-SXM4-80GB"))
    assert a100.peak_tflops.bf16 == 312 and a100.peak_tflops.tf32 == 156 and a100.peak_tflops.fp8 is None
    assert a100.intra_node_bandwidth_GBps == 300 and a100.memory_bandwidth_GBps == 2039
    v100 = DeviceSpec.parse(get_device("V100-SXM2-32GB"))
    assert v100.peak_tflops.fp16 == 125 and v100.peak_tflops.bf16 is None and v100.peak_tflops.tf32 is None
    assert v100.intra_node_bandwidth_GBps == 150
    h100 = DeviceSpec.parse(get_device("H100-SXM5-80GB"))
    assert h100.intra_node_bandwidth_GBps == 450 and math.isclose(h100.peak_tflops.bf16, 989.5)
    assert DeviceSpec.parse(get_device("B200")).intra_node_bandwidth_GBps == 900
    assert DeviceSpec.parse(get_device("GB200")).devices_per_node is None  # the cluster defines it
    with pytest.raises(SpecError):
        v100.peak_flops("bf16")


@pytest.mark.parametrize("package", ["MI250X", "MI250"])
def test_a_die_is_half_its_package(package):
    # an MI250X/MI250 is two graphics compute dies on one package: each has half of its compute units,
    # HBM stacks (capacity and bandwidth) and peak rates, at the same clock
    whole, die = get_device(package), get_device(f"{package}-GCD")
    for key in ("memory_GiB", "memory_bandwidth_GBps", "num_sms"):
        assert die[key] * 2 == pytest.approx(whole[key]), key
    for dtype, peak in whole["peak_tflops"].items():
        assert (die["peak_tflops"][dtype] is None) if peak is None else die["peak_tflops"][dtype] * 2 == \
            pytest.approx(peak, rel=1e-3), dtype
    assert die["clock_MHz"] == whole["clock_MHz"]


@pytest.mark.parametrize("variant, base, link", [("A800-SXM4-80GB", "A100-SXM4-80GB", 200),
                                                 ("H800-SXM5-80GB", "H100-SXM5-80GB", 200)])
def test_export_variants_differ_from_their_base_only_in_nvlink(variant, base, link):
    # the A800/H800 are the A100/H100 with NVLink cut to 400 GB/s (both directions); every rate else is equal
    a, b = get_device(variant), get_device(base)
    assert a["intra_node_bandwidth_GBps"] == link
    assert {k: v for k, v in a.items() if k not in ("name", "intra_node_bandwidth_GBps", "sources")} == \
        {k: v for k, v in b.items() if k not in ("name", "intra_node_bandwidth_GBps", "sources")}


def test_the_gh200_gpu_is_an_h100_sxm_with_more_and_faster_memory():
    # the GH200 data sheet prints the H100 SXM's peaks; its GPU differs in HBM (96 GB at 4 TB/s) and in having
    # no per-GPU TDP or node size of its own
    gh, h = get_device("GH200-96GB"), get_device("H100-SXM5-80GB")
    differ = {"name", "sources", "aliases", "notes", "memory_GiB", "memory_bandwidth_GBps", "tdp_W", "devices_per_node"}
    assert {k: v for k, v in gh.items() if k not in differ} == {k: v for k, v in h.items() if k not in differ}
    assert (gh["memory_GiB"], gh["memory_bandwidth_GBps"]) == (96, 4000)


@pytest.mark.parametrize("alias, key", [
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
    ("Tesla T4", "T4"),
    ("Tesla V100-PCIE-32GB", "V100-PCIE-32GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("a100_sxm4_80gb", "A100-SXM4-80GB"),
    ("AMD Instinct MI300X", "MI300X"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA GH200 480GB", "GH200-96GB"),  # what nvidia-smi calls the 96 GB HBM3 GH200
])
def test_device_aliases(alias, key):
    assert get_device(alias)["name"] == key


def test_neusight_device_names_resolve():
    path = SHARED_DATA / "neusight_devices.csv"
    if not path.exists():
        pytest.skip("shared data not available")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert rows
    for row in rows:
        entry = get_device(row["Device"])
        assert int(float(row["Dev_Mem"])) <= entry["memory_GiB"] or row["Device"] == "AMD Instinct MI250", row


@pytest.mark.parametrize("kind", ["devices", "clusters", "models"])
def test_aliases_are_unambiguous(kind):
    """No alias (after case/punctuation folding) points at two entries of one kind."""
    seen: dict[str, str] = {}
    for key, entry in _raw(kind).items():
        for alias in {key, *entry.get("aliases", [])}:
            n = _norm(alias)
            assert seen.setdefault(n, key) == key, f"{alias!r} names both {seen[n]} and {key}"


@pytest.mark.parametrize("getter, kind", [(get_device, "device"), (get_cluster, "cluster"), (get_model, "model")])
def test_unknown_name_suggests(getter, kind):
    with pytest.raises(CatalogError) as info:
        getter({"device": "A100-SXM4-80G", "cluster": "dgx-a10", "model": "gpt3-175"}[kind])
    assert "did you mean" in str(info.value)
    with pytest.raises(CatalogError) as info:
        getter("zzzz-no-such-thing")
    assert info.value.field and "unknown" in info.value.message


# ----------------------------------------------------------------- clusters
@pytest.mark.parametrize("name", REQUIRED_CLUSTERS)
def test_required_cluster_present(name):
    assert name in names("clusters")


@pytest.mark.parametrize("name", names("clusters"))
def test_cluster_is_consistent(name):
    cluster = get_cluster(name)
    device = DeviceSpec.parse(get_device(cluster["device"]))
    assert "latency" not in " ".join(cluster)
    for key in ("devices_per_node", "intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps"):
        assert _is_number(cluster[key]) and cluster[key] > 0
        assert key in cluster["sources"], f"{name}: no source for {key}"
    assert cluster["inter_node_bandwidth_GBps"] < cluster["intra_node_bandwidth_GBps"]
    hw = resolve_hardware({"cluster": name, "num_devices": 2 * cluster["devices_per_node"]})
    assert hw.device.name == device.name and hw.num_nodes == 2
    assert hw.intra_node_bandwidth_GBps == cluster["intra_node_bandwidth_GBps"]


def test_dgx_a100_network_share():
    assert get_cluster("dgx-a100")["inter_node_bandwidth_GBps"] == 25  # 8x 200 Gb/s HDR for 8 GPUs
    assert get_cluster("selene")["device"] == "A100-SXM4-80GB"
    assert get_cluster("gb200-nvl72")["devices_per_node"] == 72


# ------------------------------------------------------------------- models
@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_required_model_present(name):
    assert name in names("models")


@pytest.mark.parametrize("name", names("models"))
def test_model_parses(name):
    spec = ModelSpec.parse(get_model(name))
    assert spec.name == name
    assert spec.hidden_size % spec.num_attention_heads == 0
    assert source("models", name).get("source"), f"{name}: no source"
    assert ModelSpec.parse(spec.to_dict()) == spec


PUBLISHED_PARAMS = {
    "gpt3-125m": 125e6, "gpt3-350m": 350e6, "gpt3-760m": 760e6, "gpt3-1.3b": 1.3e9, "gpt3-2.7b": 2.7e9,
    "gpt3-6.7b": 6.7e9, "gpt3-13b": 13.0e9, "gpt3-175b": 175e9,
    "llama-2-7b": 6.74e9, "llama-2-13b": 13.02e9, "llama-2-70b": 68.98e9,
    "llama-3-8b": 8.03e9, "llama-3-70b": 70.6e9, "llama-3-405b": 405e9,
    "gpt2-small": 124e6, "gpt2-medium": 355e6, "gpt2-large": 774e6, "gpt2-xl": 1.558e9,
    "mixtral-8x7b": 46.7e9, "mixtral-8x22b": 141e9, "deepspeed-moe-1.3b-128e": 52e9,
}


@pytest.mark.parametrize("name, published", sorted(PUBLISHED_PARAMS.items()))
def test_param_counts_match_published(name, published):
    count = ModelSpec.parse(get_model(name)).num_params()
    assert count == pytest.approx(published, rel=0.03), f"{name}: {count / 1e9:.3f}B vs {published / 1e9:.3f}B"


def test_bert_param_counts():
    # No pooler in ModelSpec: within 5 % of the published 335M / 110M.
    assert ModelSpec.parse(get_model("bert-large")).num_params() == pytest.approx(335e6, rel=0.05)
    assert ModelSpec.parse(get_model("bert-base")).num_params() == pytest.approx(110e6, rel=0.05)


def test_moe_active_params():
    mixtral = ModelSpec.parse(get_model("mixtral-8x7b"))
    assert mixtral.num_active_params() == pytest.approx(12.9e9, rel=0.03)  # Jiang et al. 2024: 13B active
    assert ModelSpec.parse(get_model("mixtral-8x22b")).num_active_params() == pytest.approx(39e9, rel=0.03)


def test_megatron_sc21_rows():
    path = SHARED_DATA / "published" / "megatron_sc21_table1.csv"
    if not path.exists():
        pytest.skip("shared data not available")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 10
    for row in rows:
        spec = ModelSpec.parse(get_model(row["model"]))  # the CSV's model column is an alias
        assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (
            int(row["num_layers"]), int(row["hidden_size"]), int(row["num_heads"]))
        assert (spec.vocab_size, spec.seq_length) == (int(row["vocab_size"]), int(row["seq_len"]))
        published = float(row["params_published"].rstrip("B")) * 1e9
        assert spec.num_params() == pytest.approx(published, rel=0.03), row["model"]


@pytest.mark.parametrize("alias, key", [
    ("llama-3.1-8b", "llama-3-8b"), ("Meta-Llama-3.1-70B", "llama-3-70b"), ("llama-3.1-405b", "llama-3-405b"),
    ("gpt3-xl", "gpt3-1.3b"), ("GPT-3 175B", "gpt3-175b"), ("bert-large-uncased", "bert-large"),
    ("gpt2", "gpt2-small"), ("megatron-1008b", "megatron-1t"),
])
def test_model_aliases(alias, key):
    assert get_model(alias)["name"] == key


# ------------------------------------------------------------- HF configs
def _neusight_configs() -> list[Path]:
    folder = SHARED_DATA / "neusight_model_configs"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


@pytest.mark.parametrize("path", _neusight_configs(), ids=lambda p: p.stem)
def test_neusight_hf_configs_parse(path):
    config = json.loads(path.read_text())
    has_positions = any(k in config for k in ("max_position_embeddings", "n_positions", "n_ctx"))
    if has_positions:
        spec = ModelSpec.from_hf_config(config)
    else:  # Switch/T5: relative positions, so the run must give the sequence length
        with pytest.raises(SpecError) as info:
            ModelSpec.from_hf_config(config)
        assert info.value.field == "model.seq_length"
        spec = ModelSpec.from_hf_config(config, seq_length=512)
    assert spec.num_params() > 1e6
    assert ModelSpec.parse(spec.to_dict()) == spec


def test_neusight_configs_present():
    if not (SHARED_DATA / "neusight_model_configs").is_dir():
        pytest.skip("shared data not available")
    assert len(_neusight_configs()) >= 10


def test_hf_gpt2_config_matches_catalog():
    config = {"model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_layer": 48, "n_positions": 1024,
              "vocab_size": 50257, "activation_function": "gelu_new"}
    spec = ModelSpec.from_hf_config(config)
    assert spec.num_params() == ModelSpec.parse(get_model("gpt2-xl")).num_params()


def test_hf_llama_and_mixtral_configs():
    llama = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
             "vocab_size": 128256, "hidden_act": "silu", "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    spec = ModelSpec.from_hf_config(llama, seq_length=8192)
    assert spec.arch == "llama" and spec.num_kv_heads == 8 and spec.seq_length == 8192
    assert spec.num_params() == ModelSpec.parse(get_model("llama-3-8b")).num_params()
    assert ModelSpec.from_hf_config(llama).seq_length == 131072
    mixtral = dict(llama, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                   max_position_embeddings=32768)
    spec = ModelSpec.from_hf_config(mixtral)
    assert (spec.arch, spec.num_experts, spec.moe_top_k) == ("moe", 8, 2)
    assert spec.num_params() == ModelSpec.parse(get_model("mixtral-8x7b")).num_params()
    # Mistral / Qwen2 read like Llama
    for mt in ("mistral", "qwen2"):
        assert ModelSpec.from_hf_config(dict(llama, model_type=mt)).arch == "llama"


def test_hf_other_families():
    bert = {"model_type": "roberta", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072, "max_position_embeddings": 514, "vocab_size": 50265, "pad_token_id": 1,
            "hidden_act": "gelu"}
    spec = ModelSpec.from_hf_config(bert)
    assert spec.arch == "bert" and not spec.causal and spec.seq_length == 512
    neox = {"model_type": "gpt_neox", "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 10240, "max_position_embeddings": 2048, "vocab_size": 50432, "hidden_act": "gelu"}
    spec = ModelSpec.from_hf_config(neox)
    assert spec.position_embedding == "rope" and not spec.tie_embeddings
    gptj = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "n_positions": 2048,
            "vocab_size": 50400, "activation_function": "gelu_new", "n_inner": None}
    spec = ModelSpec.from_hf_config(gptj)
    assert spec.ffn_hidden_size == 4 * 4096 and spec.position_embedding == "rope"
    # no model_type: recognised from architectures, then from common key names
    arch_only = {"architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_head": 12, "n_layer": 12,
                 "n_positions": 1024, "vocab_size": 50257}
    assert ModelSpec.from_hf_config(arch_only).num_params() == ModelSpec.parse(get_model("gpt2-small")).num_params()
    generic = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
               "intermediate_size": 2816, "max_position_embeddings": 4096, "vocab_size": 32000}
    assert ModelSpec.from_hf_config(generic).arch == "llama"


def test_hf_switch_config():
    config = {"model_type": "switch_transformers", "d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12,
              "num_layers": 12, "num_decoder_layers": 12, "num_experts": 8, "encoder_sparse_step": 2,
              "decoder_sparse_step": 2, "vocab_size": 32128, "dense_act_fn": "relu", "is_gated_act": False}
    spec = ModelSpec.from_hf_config(config, seq_length=512)
    assert (spec.arch, spec.num_layers, spec.num_experts, spec.moe_top_k) == ("moe", 24, 8, 1)
    assert spec.num_moe_layers == 12 and spec.activation == "relu"


@pytest.mark.parametrize("config, field", [
    ({"model_type": "t5", "d_model": 512}, "model.hf_config.model_type"),
    ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 11008,
      "vocab_size": 32000, "max_position_embeddings": 4096}, "model.hf_config.num_hidden_layers"),
    ({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257}, "model.seq_length"),
    ({"model_type": "gpt2", "n_embd": "768", "n_head": 12, "n_layer": 12, "vocab_size": 50257, "n_positions": 1024},
     "model.hf_config.n_embd"),
    ({"vocab_size": 10}, "model.hf_config.model_type"),
])
def test_hf_config_errors_name_the_key(config, field):
    with pytest.raises(SpecError) as info:
        ModelSpec.from_hf_config(config)
    assert info.value.field == field


def test_hf_config_via_run_format():
    from learnedperf.specs.model import resolve_model

    config = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
              "vocab_size": 50257}
    spec = resolve_model({"hf_config": config, "seq_length": 512, "name": "mine"})
    assert spec.seq_length == 512 and spec.name == "mine"
