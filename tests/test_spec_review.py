"""Findings of a user-level review of the run format, each a bad input that was accepted silently:

1. tensor parallelism that does not divide the key/value heads (Megatron-Core's
   ``divide(num_query_groups, tp)`` asserts it: no key/value head is replicated);
2. a catalog cluster beside a device it is not built of;
3. a HuggingFace config without a sequence length taking ``max_position_embeddings`` (Qwen2-7B: 131,072 tokens),
   a limit of its rotary positions rather than a length anyone trains at;
4. Mistral's sliding window (and Qwen2's, where ``use_sliding_window`` is on) beyond the window, where Gemma 2's
   was already refused.

Each now gives one SpecError naming the field. Inline devices and models except where the catalog is the point.
"""

from __future__ import annotations

import json
import random

import pytest
from conftest import A100_LIKE

from learnedperf import cli
from learnedperf.errors import SpecError
from learnedperf.specs import ModelSpec, RunSpec

DEVICE = dict(A100_LIKE, name="review-gpu")

LLAMA3_8B = {"name": "llama3-8b-inline", "arch": "llama", "num_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336, "vocab_size": 128256,
             "seq_length": 8192}

# config.json of Qwen/Qwen2-7B (the keys that shape the model): 131,072 positions, a window it does not use
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
            "vocab_size": 152064, "max_position_embeddings": 131072, "sliding_window": 131072,
            "use_sliding_window": False, "max_window_layers": 28, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False}
# config.json of mistralai/Mistral-7B-v0.1: every layer attends to the last 4,096 tokens
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
              "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 32768,
              "sliding_window": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}


def run(model, num_devices: int = 8, hardware: dict | None = None, **strategy) -> dict:
    hw = hardware or {"device": dict(DEVICE), "num_devices": num_devices, "devices_per_node": 8}
    return {"model": model, "hardware": hw, "strategy": strategy}


def refused(data: dict) -> SpecError:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict(data)
    assert "\n" not in str(info.value)
    return info.value


# ----------------------------------------------------------------- 1. tp and the key/value heads
def test_tp_beyond_the_key_value_heads_is_refused():
    # 8 key/value heads over 16 ranks: half a head each, which Megatron-Core's divide() refuses
    err = refused(run(LLAMA3_8B, num_devices=16, tp=16))
    assert err.field == "strategy.tp"
    assert err.message == "tp=16 does not divide num_kv_heads=8 of llama3-8b-inline"


@pytest.mark.parametrize("kv, tp", [(1, 2), (2, 4), (4, 8)])
def test_tp_not_dividing_fewer_key_value_heads_is_refused(kv, tp):
    err = refused(run(dict(LLAMA3_8B, num_kv_heads=kv), tp=tp))
    assert err.field == "strategy.tp" and f"num_kv_heads={kv}" in err.message


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_dividing_the_key_value_heads_is_accepted(tp):
    assert RunSpec.from_dict(run(LLAMA3_8B, tp=tp)).strategy.tp == tp


def test_latent_attention_needs_only_the_heads_divided():
    # MLA up-projects keys and values for every head: the spec holds num_kv_heads = heads (16 here), tp 8 divides
    mla = {"name": "mla", "arch": "llama", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
           "head_dim": 192, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": 0, "qk_rope_head_dim": 64,
           "ffn_hidden_size": 5632, "vocab_size": 32000, "seq_length": 4096}
    spec = RunSpec.from_dict(run(mla, tp=8))
    assert spec.model.num_kv_heads == 16 and spec.strategy.tp == 8


def test_sampler_draws_only_tp_dividing_the_key_value_heads():
    from learnedperf.data.sampler import _draw_strategy

    model = ModelSpec.parse(dict(LLAMA3_8B, num_kv_heads=2))
    tps = {_draw_strategy(random.Random(i), model, A100_LIKE, 16, 8)["tp"] for i in range(300)}
    assert tps == {1, 2}  # tp 4, 8, 16 divide the 32 heads but not the 2 key/value heads


# ----------------------------------------------------------------- 2. cluster and device
def test_a_device_other_than_the_clusters_is_refused_naming_both():
    err = refused(run("gpt3-1.3b", hardware={"cluster": "dgx-a100", "device": "H100-SXM5-80GB", "num_devices": 8}))
    assert err.field == "hardware.device"
    assert "'H100-SXM5-80GB'" in err.message and "'dgx-a100'" in err.message and "'A100-SXM4-80GB'" in err.message


def test_an_inline_device_other_than_the_clusters_is_refused():
    err = refused(run("gpt3-1.3b", hardware={"cluster": "dgx-a100", "device": dict(DEVICE), "num_devices": 8}))
    assert err.field == "hardware.device" and "'review-gpu'" in err.message


@pytest.mark.parametrize("device", ["A100-SXM4-80GB", "a100 sxm4 80gb"])
def test_the_clusters_own_device_is_accepted(device):
    spec = RunSpec.from_dict(run("gpt3-1.3b", hardware={"cluster": "dgx-a100", "device": device, "num_devices": 8}))
    assert (spec.hardware.cluster, spec.hardware.device.name) == ("dgx-a100", "A100-SXM4-80GB")
    # to_dict writes the cluster beside its device inline: it reads back equal
    assert RunSpec.from_dict(spec.to_dict()) == spec


# ----------------------------------------------------------------- 3. HF configs' sequence length
def test_a_rotary_config_without_seq_length_is_refused_quoting_its_positions():
    err = refused(run({"hf_config": QWEN2_7B}, tp=4))
    assert err.field == "model.seq_length"
    assert "max_position_embeddings=131072" in err.message and "--seq-length" in err.message


def test_a_rotary_config_with_seq_length_is_read():
    assert RunSpec.from_dict(run({"hf_config": QWEN2_7B, "seq_length": 4096}, tp=4)).model.seq_length == 4096


def test_a_learned_position_table_still_gives_the_length():
    # GPT-2's 1,024 learned positions are the context it was trained at and cannot exceed
    assert RunSpec.from_dict(run({"hf_config": GPT2})).model.seq_length == 1024


def test_cli_seq_length_reaches_an_hf_config(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run({"hf_config": QWEN2_7B}, tp=4)))
    assert cli.main(["simulate", "--run", str(path)]) == 1
    assert "model.seq_length" in capsys.readouterr().err
    assert cli.main(["simulate", "--run", str(path), "--seq-length", "2048", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens_per_second"] > 0


# ----------------------------------------------------------------- 4. sliding windows
def test_mistral_beyond_its_sliding_window_is_refused():
    err = refused(run({"hf_config": MISTRAL_7B, "seq_length": 8192}))
    assert err.field == "model.hf_config.sliding_window"
    assert "seq_length 8192 exceeds sliding_window 4096" in err.message


def test_mistral_within_its_sliding_window_is_accepted():
    assert RunSpec.from_dict(run({"hf_config": MISTRAL_7B, "seq_length": 4096})).model.seq_length == 4096


@pytest.mark.parametrize("config", [
    dict(MISTRAL_7B, sliding_window=None),  # Mistral-7B-v0.2 on, Mixtral: no window
    dict(QWEN2_7B, sliding_window=4096),  # carried, not used (use_sliding_window false)
    dict(QWEN2_7B, sliding_window=4096, use_sliding_window=True),  # used from layer max_window_layers = 28 on: none
])
def test_a_window_no_layer_uses_is_no_limit(config):
    assert RunSpec.from_dict(run({"hf_config": config, "seq_length": 8192}, tp=4)).model.seq_length == 8192


@pytest.mark.parametrize("config", [
    dict(QWEN2_7B, sliding_window=4096, use_sliding_window=True, max_window_layers=14),
    dict(QWEN2_7B, sliding_window=4096, use_sliding_window=True, max_window_layers=28,
         layer_types=["full_attention"] * 27 + ["sliding_attention"]),
])
def test_qwen2_with_its_sliding_window_used_is_refused_beyond_it(config):
    err = refused(run({"hf_config": config, "seq_length": 8192}, tp=4))
    assert err.field == "model.hf_config.sliding_window"
