"""HuggingFace ``config.json`` → the inline architecture dict of :class:`~learnedperf.specs.model.ModelSpec`.

One function, :func:`hf_config_to_arch`, maps the key names of each supported
``model_type`` onto the run format's architecture keys. It only reads the dict;
``ModelSpec`` validates the result. Supported families:

* decoders with learned or rotary positions: ``gpt2``, ``gptj``, ``gpt_neox``, ``opt`` → arch ``gpt``
* encoders: ``bert``, ``roberta`` → arch ``bert``
* gated decoders: ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``, ``gemma3`` (its
  ``text_config``) and ``gemma3_text`` → arch ``llama`` (an explicit ``head_dim`` that differs from
  hidden_size / heads, as Qwen3's and Gemma's, is kept; Gemma 2/3 beyond their ``sliding_window`` are
  refused, as are Mistral and Qwen beyond a ``sliding_window`` they use, and Gemma's extra post-norms are not
  counted)
* mixture of experts: ``mixtral``, ``qwen3_moe``, ``qwen2_moe`` (Qwen1.5-MoE, Qwen2-MoE), ``deepseek``
  (DeepSeek-MoE) and ``switch_transformers`` → arch ``moe``. The fine-grained ones have experts of
  ``moe_intermediate_size``; Qwen2-MoE's and DeepSeek-MoE's shared experts, DeepSeek-MoE's leading dense layers
  (``first_k_dense_replace``) and Qwen's dense layers between MoE layers (``decoder_sparse_step`` > 1) are
  read, the dense layers with the config's ``intermediate_size``. Dense layers at listed positions
  (``mlp_only_layers``) and DeepSeek's ``moe_layer_freq`` > 1 are refused. DeepSeek-V2/V3 (``deepseek_v2``,
  ``deepseek_v3``) add multi-head latent attention (``kv_lora_rank`` and the other MLA keys) and
  group-limited routing (``n_group``, ``topk_group`` unless ``topk_method`` is ``greedy``). Llama 4
  (``llama4``: its ``text_config``; ``llama4_text``) has a shared expert beside its routed ones and dense
  layers between MoE layers every ``interleave_moe_layer_step``; its chunked attention is refused beyond
  ``attention_chunk_size`` tokens

A run (:func:`~learnedperf.specs.model.resolve_model`) gives the sequence length next to the config, except for
learned position tables (GPT-2, OPT, BERT, RoBERTa), whose size is the context the model was trained at.

A config without ``model_type`` is recognised from its ``architectures`` list,
and failing that from the common key names (``hidden_size``/``n_embd``/``d_model``,
``num_hidden_layers``/``n_layer``/``num_layers``, ...).
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import SpecError

# model_type → (arch, family). The family selects the key names and conventions below.
_MODEL_TYPES: dict[str, tuple[str, str]] = {
    "gpt2": ("gpt", "gpt2"),
    "gptj": ("gpt", "gptj"),
    "gpt_neox": ("gpt", "gpt_neox"),
    "opt": ("gpt", "opt"),
    "bert": ("bert", "bert"),
    "roberta": ("bert", "roberta"),
    "llama": ("llama", "llama"),
    "mistral": ("llama", "llama"),
    "qwen2": ("llama", "llama"),
    "qwen3": ("llama", "llama"),
    "gemma": ("llama", "gemma"),
    # Gemma 2 and 3: Gemma's layers with sliding-window attention in some of them (Gemma 3's multimodal config
    # nests its language model as text_config)
    "gemma2": ("llama", "gemma"),
    "gemma3_text": ("llama", "gemma"),
    "gemma3": ("llama", "gemma"),
    "mixtral": ("moe", "mixtral"),
    "qwen3_moe": ("moe", "qwen3_moe"),
    "qwen2_moe": ("moe", "qwen2_moe"),
    "deepseek": ("moe", "deepseek"),  # DeepSeek-MoE's custom-code config (trust_remote_code)
    "deepseek_v2": ("moe", "deepseek_v2"),  # DeepSeek-V2 and V2-Lite: DeepSeek-MoE's layout, latent attention
    "deepseek_v3": ("moe", "deepseek_v3"),
    "switch_transformers": ("moe", "switch"),
    # Llama 4's text model (a multimodal config nests it as text_config): routed and shared experts, dense
    # layers between MoE layers
    "llama4_text": ("moe", "llama4"),
    "llama4": ("moe", "llama4"),
}

# HuggingFace class names (config["architectures"]) → model_type, for configs without model_type.
_ARCHITECTURE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("GPT2", "gpt2"), ("GPTJ", "gptj"), ("GPTNeoX", "gpt_neox"), ("OPT", "opt"), ("Bert", "bert"),
    ("Roberta", "roberta"), ("Llama4ForCausalLM", "llama4_text"), ("Llama4", "llama4"),
    ("Llama", "llama"), ("Mistral", "mistral"), ("Qwen2Moe", "qwen2_moe"),
    ("Qwen2", "qwen2"), ("Qwen3Moe", "qwen3_moe"), ("Qwen3", "qwen3"), ("GemmaFor", "gemma"),
    ("Gemma2For", "gemma2"), ("Gemma3ForCausalLM", "gemma3_text"), ("Gemma3For", "gemma3"),
    ("Mixtral", "mixtral"), ("SwitchTransformers", "switch_transformers"),
    ("DeepseekV2", "deepseek_v2"), ("DeepseekV3", "deepseek_v3"), ("DeepseekFor", "deepseek"),
)

# Synonyms of each architecture key, most specific first (the generic fallback uses all of them).
_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size"),
    "vocab_size": ("vocab_size", "padded_vocab_size", "n_vocab"),
    "seq_length": ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length"),
}

_GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate", "quick_gelu",
         "gelu_10", "gelu2"}
_RELU = {"relu", "relu2", "relu6"}
_GATED = {"silu", "swish", "swiglu", "silu_gated"}


def _get(config: dict, prefix: str, key: str, names: Optional[tuple[str, ...]] = None,
         required: bool = True) -> Any:
    """The first of ``names`` (synonyms of ``key``) present and not null in ``config``."""
    for name in names or _KEYS[key]:
        value = config.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"{prefix}.hf_config.{name}", f"expected an integer, got {value!r}")
            return value
    if required:
        candidates = names or _KEYS[key]
        raise SpecError(f"{prefix}.hf_config.{candidates[0]}",
                        f"required key is missing (looked for {', '.join(candidates)})")
    return None


def _flag(config: dict, prefix: str, key: str, default: bool) -> bool:
    """A boolean key (``tie_word_embeddings``, ``is_gated_act``); null means the default."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"{prefix}.hf_config.{key}", f"expected true or false, got {value!r}")
    return value


def _activation(config: dict, prefix: str, names: tuple[str, ...], default: str, gated: bool = False) -> str:
    """Map HF activation names onto gelu / gelu_new / relu / swiglu (gated SiLU)."""
    for name in names:
        act = config.get(name)
        if act is None:
            continue
        act = str(act).lower()
        if act.startswith("gated-"):  # T5 v1.1 style "gated-gelu"
            gated, act = True, act[len("gated-"):]
        if gated or act in _GATED:
            # ModelSpec has one gated activation; gated GELU (GeGLU) costs the same as SwiGLU.
            return "swiglu"
        if act == "gelu_new":
            # Hugging Face's NewGELUActivation: the tanh approximation as eight tensor operations (ModelSpec's
            # 'gelu_new'); the other written-out variants (gelu_fast, gelu_python, quick_gelu) are costed as
            # one kernel, their chains not logged
            return "gelu_new"
        if act in _GELU:
            return "gelu"
        if act in _RELU:
            return "relu"
        raise SpecError(f"{prefix}.hf_config.{name}", f"unsupported activation {act!r} (gelu, relu or silu)")
    return default


def _model_type(config: dict, prefix: str) -> Optional[str]:
    mt = config.get("model_type")
    if mt is not None:
        mt = str(mt).lower().replace("-", "_")
        if mt not in _MODEL_TYPES:
            raise SpecError(f"{prefix}.hf_config.model_type",
                            f"unsupported model_type {config['model_type']!r}; supported: "
                            f"{', '.join(sorted(_MODEL_TYPES))}")
        return mt
    classes = config.get("architectures") or []
    if isinstance(classes, str):
        classes = [classes]
    if not isinstance(classes, list):
        raise SpecError(f"{prefix}.hf_config.architectures",
                        f"expected a list of class names, got {type(classes).__name__}")
    for cls_name in classes:
        for start, mt in _ARCHITECTURE_PREFIXES:
            if isinstance(cls_name, str) and cls_name.startswith(start):
                return mt
    return None


def _seq_length(config: dict, seq_length: Optional[int], prefix: str, family: str, may_default: bool = True) -> int:
    """The training sequence length: ``seq_length`` when given, else (where ``may_default``) the config's maximum
    position count; SpecError naming ``{prefix}.seq_length`` otherwise."""
    if seq_length is not None:
        if isinstance(seq_length, bool) or not isinstance(seq_length, int) or seq_length < 1:
            raise SpecError(f"{prefix}.seq_length", f"expected a positive integer, got {seq_length!r}")
        return seq_length
    value = _get(config, prefix, "seq_length", required=False)
    if value is None:
        raise SpecError(f"{prefix}.seq_length",
                        "not given and the config has none of max_position_embeddings, n_positions, n_ctx; "
                        "pass seq_length next to hf_config")
    if not may_default:
        key = next(k for k in _KEYS["seq_length"] if config.get(k) is not None)
        raise SpecError(f"{prefix}.seq_length", _NO_DEFAULT_SEQ.format(key=key, value=value))
    if family == "roberta" and value > 2:
        # RoBERTa's position table has padding_idx + 1 = 2 extra rows (514 for 512 tokens).
        pad = config.get("pad_token_id")
        value -= (pad if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < value - 1 else 1) + 1
    return value


#: Why a run must give the sequence length of a config whose positions are not a learned table (the message of
#: the SpecError, quoting the config's key and value)
_NO_DEFAULT_SEQ = ("not given, and the config's {key}={value} is the longest context its positions are set up for, "
                   "not the length the model trains at; pass the training sequence length (--seq-length N, or "
                   "seq_length next to hf_config)")


def hf_config_to_arch(config: dict, seq_length: Optional[int], prefix: str, default_seq_length: bool = True) -> dict:
    """Map a HuggingFace ``config.json`` dict to an inline ModelSpec architecture dict.

    Args:
        config: the parsed ``config.json``.
        seq_length: training sequence length; ``None`` takes the config's maximum
            position count (``max_position_embeddings`` / ``n_positions`` / ``n_ctx``), where
            ``default_seq_length`` allows it.
        prefix: dotted path of the model in the run, used to name fields in errors.
        default_seq_length: whether a missing ``seq_length`` may be taken from every config. False (the run
            format's reading, :func:`~learnedperf.specs.model.resolve_model`) takes it only from a learned
            position table (GPT-2, OPT, BERT, RoBERTa: the context the model was trained at, which it cannot
            exceed); rotary and relative positions' maximum (Qwen2-7B's 131,072, Llama 3.1's 131,072) is a
            limit of the context, not a length anyone trains at, so a run of such a config must give it.

    Returns:
        A dict with ``name``, ``arch``, ``num_layers``, ``hidden_size``, ``num_attention_heads``,
        ``num_kv_heads``, ``ffn_hidden_size``, ``vocab_size``, ``seq_length``, ``num_experts``,
        ``moe_top_k``, ``moe_layer_frequency``, ``activation``, ``norm``, ``causal``,
        ``tie_embeddings`` and ``position_embedding``; for a fine-grained MoE also
        ``moe_first_dense_layers``, ``moe_shared_ffn_hidden_size`` and ``dense_ffn_hidden_size`` where
        the config has leading dense layers, shared experts or dense layers.

    Raises:
        SpecError: ``{prefix}.hf_config.<key>`` for an unsupported ``model_type`` or a missing or
            malformed essential key; ``{prefix}.seq_length`` when no sequence length is known (or may not be
            taken from the config); ``{prefix}.hf_config.sliding_window`` (``attention_chunk_size``) for a
            sequence longer than the local attention's span, which the run format does not model.
    """
    if not isinstance(config, dict):
        raise SpecError(f"{prefix}.hf_config", f"expected a JSON object, got {type(config).__name__}")
    mt = _model_type(config, prefix)
    if mt is None:
        return _generic(config, seq_length, prefix, default_seq_length)
    arch, family = _MODEL_TYPES[mt]
    name = str(config.get("_name_or_path") or config.get("name_or_path") or f"hf-{mt}")
    if mt in ("llama4", "gemma3"):
        # the multimodal config: its language model is text_config (the vision encoder is not modelled); an
        # error names the key where it is, under text_config
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise SpecError(f"{prefix}.hf_config.text_config", f"a {mt} config holds its language model in "
                                                               "text_config, a JSON object; it is missing")
        try:
            return hf_config_to_arch({**text, "model_type": f"{mt}_text", "_name_or_path": name}, seq_length,
                                     prefix, default_seq_length)
        except SpecError as exc:
            top = f"{prefix}.hf_config."
            field = exc.field.replace(top, top + "text_config.", 1) if exc.field.startswith(top) else exc.field
            raise SpecError(field, exc.message) from None

    if family == "switch":
        return _switch(config, seq_length, prefix, name, default_seq_length)

    h = _get(config, prefix, "hidden_size")
    heads = _get(config, prefix, "num_attention_heads")
    out: dict[str, Any] = {
        "name": name,
        "arch": arch,
        "num_layers": _get(config, prefix, "num_layers"),
        "hidden_size": h,
        "num_attention_heads": heads,
        "vocab_size": _get(config, prefix, "vocab_size"),
    }
    ffn = _get(config, prefix, "ffn_hidden_size", required=False)

    if family in ("gpt2", "gptj", "gpt_neox", "opt"):
        out["ffn_hidden_size"] = ffn or 4 * h  # GPT-2/GPT-J: n_inner null means 4h
        out["num_kv_heads"] = heads
        out["activation"] = _activation(config, prefix, ("activation_function", "hidden_act"), "gelu")
        out["norm"] = "layernorm"
        out["causal"] = True
        if family in ("gptj", "gpt_neox"):
            # Rotary positions, untied LM head; the attention/MLP run in parallel (GPT-J, NeoX's
            # use_parallel_residual): same operators and parameters, counted here as sequential.
            out["position_embedding"] = "rope"
            out["tie_embeddings"] = _flag(config, prefix, "tie_word_embeddings", False)
        else:
            # OPT-350m projects 1024 -> word_embed_proj_dim=512 around the stack; that small
            # projection is ignored, as is OPT's 2-row position offset.
            out["position_embedding"] = "learned"
            out["tie_embeddings"] = _flag(config, prefix, "tie_word_embeddings", True)
    elif family in ("bert", "roberta"):
        out["ffn_hidden_size"] = ffn or 4 * h
        out["num_kv_heads"] = heads
        out["activation"] = _activation(config, prefix, ("hidden_act",), "gelu")
        out["norm"] = "layernorm"
        out["causal"] = False
        out["position_embedding"] = "learned"
        out["tie_embeddings"] = _flag(config, prefix, "tie_word_embeddings", True)
    else:  # llama, mistral, qwen2, qwen3, gemma, mixtral, qwen3_moe, qwen2_moe, deepseek
        moe: dict[str, Any] = {}
        if family in ("qwen3_moe", "qwen2_moe", "deepseek", "deepseek_v2", "deepseek_v3"):
            moe = _fine_grained_moe(config, prefix, family)
            ffn = moe.pop("ffn_hidden_size")
        elif family == "llama4":
            moe = _llama4_moe(config, prefix)
            ffn = moe.pop("ffn_hidden_size")
        if ffn is None:
            raise SpecError(f"{prefix}.hf_config.intermediate_size", "required key is missing")
        out["ffn_hidden_size"] = ffn
        out["num_kv_heads"] = _get(config, prefix, "num_kv_heads", required=False) or heads
        head_dim = _get(config, prefix, "head_dim", ("head_dim",), required=False)
        if head_dim is not None:
            out["head_dim"] = head_dim
        if family in ("deepseek_v2", "deepseek_v3"):
            out.update(_latent_attention(config, prefix))
            out["num_kv_heads"] = heads  # keys and values are up-projected for every head
        # These families always gate their MLP (act(W1 x) * W3 x): SiLU, or GELU in Gemma (GeGLU, the
        # same cost).
        out["activation"] = _activation(config, prefix, ("hidden_act", "hidden_activation"), "swiglu", gated=True)
        out["norm"] = "rmsnorm"
        out["causal"] = True
        out["position_embedding"] = "rope"
        # Gemma ties its LM head to the embedding
        out["tie_embeddings"] = _flag(config, prefix, "tie_word_embeddings", family == "gemma")
        if family == "mixtral":
            out["num_experts"] = _get(config, prefix, "num_experts",
                                      ("num_local_experts", "num_experts"))
            out["moe_top_k"] = _get(config, prefix, "moe_top_k",
                                    ("num_experts_per_tok", "num_experts_per_token", "moe_top_k"))
            out["moe_layer_frequency"] = 1
        out.update(moe)
    # read last, so that an error in the config's own keys is reported first
    out["seq_length"] = _seq_length(config, seq_length, prefix, family,
                                    default_seq_length or out["position_embedding"] == "learned")
    _refuse_local_attention_beyond(config, prefix, mt, out["seq_length"])
    out.setdefault("num_experts", 1)
    out.setdefault("moe_top_k", 1)
    out.setdefault("moe_layer_frequency", 1)
    return out


def _refuse_local_attention_beyond(config: dict, prefix: str, mt: Optional[str], seq_length: int) -> None:
    """Refuse ``seq_length`` beyond the span of the config's local attention (:func:`_refuse_beyond_local_attention`):
    Gemma 2/3's local layers, Llama 4's chunked layers, and a ``sliding_window`` that any layer uses (Mistral's
    and Mixtral's in every layer where set; Qwen's only with ``use_sliding_window``: :func:`_slides`)."""
    if mt in ("gemma2", "gemma3_text"):
        # Gemma 2 alternates local and global attention, Gemma 3 has five local layers to a global one: a
        # local layer attends to the last sliding_window tokens only, which the run format's attention
        # (every earlier key of the sequence) describes up to that length
        _refuse_beyond_local_attention(config, prefix, "sliding_window", seq_length,
                                       f"{mt}'s local attention layers see only the last sliding_window tokens")
    elif mt == "llama4_text":
        _refuse_beyond_local_attention(config, prefix, "attention_chunk_size", seq_length,
                                       "Llama 4's chunked attention layers attend within chunks")
    elif _slides(config, prefix, mt):
        _refuse_beyond_local_attention(config, prefix, "sliding_window", seq_length,
                                       f"{mt or 'the config'}'s sliding-window attention sees only the last "
                                       "sliding_window tokens")


def _slides(config: dict, prefix: str, mt: Optional[str]) -> bool:
    """Whether a layer of the config attends within its ``sliding_window`` only.

    Mistral and Mixtral (``MistralAttention``) use a non-null ``sliding_window`` in every layer. Qwen2/3 and their
    MoEs carry one always but use it only with ``use_sliding_window`` (false by default, as in Qwen2-7B), in the
    layers from ``max_window_layers`` on; a ``layer_types`` list, where a config writes one, says it per layer.
    """
    if config.get("sliding_window") is None:
        return False
    qwen = bool(mt) and mt.startswith("qwen")
    use = _flag(config, prefix, "use_sliding_window", not qwen)
    if not use:
        return False
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        return "sliding_attention" in types
    if qwen:
        first = config.get("max_window_layers")
        layers = _get(config, prefix, "num_layers", required=False)
        if isinstance(first, int) and not isinstance(first, bool) and layers is not None and first >= layers:
            return False
    return True


def _refuse_beyond_local_attention(config: dict, prefix: str, key: str, seq_length: int, what: str) -> None:
    """Raise a SpecError naming ``key`` when ``seq_length`` exceeds the config's local-attention span ``key``
    (a sliding window, a chunk): up to it such layers attend as the run format's attention does, beyond it
    they do not (``what`` says how)."""
    span = _get(config, prefix, key, (key,), required=False)
    if span is not None and seq_length > span:
        raise SpecError(f"{prefix}.hf_config.{key}",
                        f"seq_length {seq_length} exceeds {key} {span}: {what}, which the run format does not "
                        f"model; give seq_length <= {span} next to hf_config")


def _llama4_moe(config: dict, prefix: str) -> dict:
    """The MoE keys of a Llama 4 text config (``llama4_text``).

    Experts are ``intermediate_size`` wide, ``num_local_experts`` of them, ``num_experts_per_tok`` a token,
    beside one shared expert of the same width in every MoE layer; layer i (0-based) is a MoE layer when
    ``(i + 1) % interleave_moe_layer_step == 0`` (``moe_layer_frequency``'s rule), the others are dense MLPs of
    ``intermediate_size_mlp``. A ``moe_layers`` list placing them otherwise is refused (and
    :func:`_refuse_local_attention_beyond` refuses a sequence longer than ``attention_chunk_size``: three of four
    Llama 4 layers attend only within chunks of that length, which the run format's attention, every key of the
    sequence, does not describe).
    """
    ffn = _get(config, prefix, "ffn_hidden_size", ("intermediate_size",))
    step = _get(config, prefix, "moe_layer_frequency", ("interleave_moe_layer_step",), required=False) or 1
    if step < 1:
        raise SpecError(f"{prefix}.hf_config.interleave_moe_layer_step", f"expected a positive integer, got {step}")
    layers = _get(config, prefix, "num_layers")
    listed = config.get("moe_layers")
    if listed is not None and list(listed) != [i for i in range(layers) if (i + 1) % step == 0]:
        raise SpecError(f"{prefix}.hf_config.moe_layers",
                        f"MoE layers at {listed!r} are not every interleave_moe_layer_step={step}-th layer, the "
                        "only placement of dense layers between MoE layers the run format has")
    out = {"ffn_hidden_size": ffn,
           "num_experts": _get(config, prefix, "num_experts", ("num_local_experts",)),
           "moe_top_k": _get(config, prefix, "moe_top_k", ("num_experts_per_tok",)),
           "moe_layer_frequency": step,
           # one shared expert of the routed experts' width in every MoE layer (Llama4TextMoe.shared_expert)
           "moe_shared_ffn_hidden_size": ffn}
    if step > 1:
        out["dense_ffn_hidden_size"] = _get(config, prefix, "dense_ffn_hidden_size", ("intermediate_size_mlp",))
    return out


def _latent_attention(config: dict, prefix: str) -> dict:
    """The multi-head latent attention keys of a DeepSeek-V2/V3 config: a query/key head of
    ``qk_nope_head_dim + qk_rope_head_dim`` (``head_dim``), values of ``v_head_dim``, latents of ``kv_lora_rank``
    and ``q_lora_rank`` (null in V2-Lite: queries come from the hidden state). V3's multi-token-prediction
    module (``num_nextn_predict_layers``), which HuggingFace's model does not build either, is not counted."""
    out: dict[str, Any] = {}
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        out[key] = _get(config, prefix, key, (key,))
    out["q_lora_rank"] = _get(config, prefix, "q_lora_rank", ("q_lora_rank",), required=False) or 0
    out["head_dim"] = out.pop("qk_nope_head_dim") + out["qk_rope_head_dim"]
    return out


def _fine_grained_moe(config: dict, prefix: str, family: str) -> dict:
    """The MoE keys of Qwen3-MoE, Qwen1.5/2-MoE (``qwen2_moe``) and DeepSeek-MoE (``deepseek``) configs.

    Their experts are ``moe_intermediate_size`` wide (``ffn_hidden_size``, one routed expert); their dense
    layers, where they have any, ``intermediate_size`` (``dense_ffn_hidden_size``). Qwen makes layer i
    (0-based) a MoE layer when ``(i + 1) % decoder_sparse_step == 0``, which is ``moe_layer_frequency``'s
    rule; DeepSeek-MoE the layers from ``first_k_dense_replace`` on (``moe_first_dense_layers``).
    """
    out: dict[str, Any] = {"ffn_hidden_size": _get(config, prefix, "ffn_hidden_size", ("moe_intermediate_size",)),
                           "moe_top_k": _get(config, prefix, "moe_top_k", ("num_experts_per_tok",))}
    if family.startswith("deepseek"):
        out["num_experts"] = _get(config, prefix, "num_experts", ("n_routed_experts",))
        freq = _get(config, prefix, "moe_layer_frequency", ("moe_layer_freq",), required=False)
        if freq is not None and freq != 1:
            # DeepSeek's MoE layers are those i >= first_k_dense_replace with i % moe_layer_freq == 0; the run
            # format's are the last of each group of moe_layer_frequency after the leading dense layers
            raise SpecError(f"{prefix}.hf_config.moe_layer_freq",
                            f"moe_layer_freq={freq} is not read: DeepSeek makes layer i a MoE layer when "
                            "i % moe_layer_freq == 0, the run format the last of every moe_layer_frequency layers "
                            "after the leading dense ones; only moe_layer_freq 1 places them alike")
        out["moe_layer_frequency"] = 1
        first_dense = _get(config, prefix, "moe_first_dense_layers", ("first_k_dense_replace",), required=False)
        if first_dense is not None and first_dense < 0:
            raise SpecError(f"{prefix}.hf_config.first_k_dense_replace",
                            f"expected a non-negative integer, got {first_dense!r}")
        out["moe_first_dense_layers"] = first_dense or 0
        shared = _get(config, prefix, "n_shared_experts", ("n_shared_experts",), required=False) or 0
        if shared < 0:
            raise SpecError(f"{prefix}.hf_config.n_shared_experts", f"expected a non-negative integer, got {shared}")
        # the shared experts are one SwiGLU MLP of their total width
        out["moe_shared_ffn_hidden_size"] = shared * out["ffn_hidden_size"]
        # group-limited routing (V2's device-limited, V3's node-limited): topk_method "greedy" ignores the groups
        if config.get("topk_method") != "greedy":
            groups = _get(config, prefix, "moe_router_num_groups", ("n_group",), required=False)
            group_topk = _get(config, prefix, "moe_router_group_topk", ("topk_group",), required=False)
            if groups is not None:
                out["moe_router_num_groups"] = groups
                out["moe_router_group_topk"] = groups if group_topk is None else group_topk
    else:  # qwen3_moe, qwen2_moe
        out["num_experts"] = _get(config, prefix, "num_experts", ("num_experts",))
        only = config.get("mlp_only_layers")
        if only:
            raise SpecError(f"{prefix}.hf_config.mlp_only_layers",
                            f"dense layers at listed positions ({only!r}) are not in the run format: it places "
                            "dense layers only first or between MoE layers every decoder_sparse_step-th layer")
        step = _get(config, prefix, "moe_layer_frequency", ("decoder_sparse_step",), required=False)
        if step is not None and step < 1:
            raise SpecError(f"{prefix}.hf_config.decoder_sparse_step", f"expected a positive integer, got {step}")
        out["moe_layer_frequency"] = step or 1
        if family == "qwen2_moe":
            # the shared expert, one SwiGLU MLP of shared_expert_intermediate_size; its sigmoid gate (a linear
            # layer h -> 1, h parameters per layer) is not counted: negligible
            out["moe_shared_ffn_hidden_size"] = _get(config, prefix, "moe_shared_ffn_hidden_size",
                                                     ("shared_expert_intermediate_size",))
    if out.get("moe_first_dense_layers") or out["moe_layer_frequency"] > 1:
        # dense layers: intermediate_size wide (a config with only MoE layers leaves it unused, and so unread)
        out["dense_ffn_hidden_size"] = _get(config, prefix, "ffn_hidden_size", ("intermediate_size",))
    return out


def _switch(config: dict, seq_length: Optional[int], prefix: str, name: str, default_seq_length: bool = True) -> dict:
    """Switch Transformer (encoder-decoder T5 with top-1 expert MLPs every ``*_sparse_step`` layers).

    Approximation: ModelSpec has one stack, so the encoder and decoder layers are counted as one
    stack of ``num_layers + num_decoder_layers`` layers, causal, without the decoder's
    cross-attention; positions are T5's relative bias ("none"); T5's norm has no bias or mean
    subtraction ("rmsnorm"); the attention width is taken as ``d_model`` (T5 allows
    ``num_heads * d_kv != d_model``). Switch routes each token to one expert.
    """
    enc = _get(config, prefix, "num_layers", ("num_layers",))
    dec = _get(config, prefix, "num_layers", ("num_decoder_layers",), required=False)
    if dec is None:
        dec = enc if config.get("is_encoder_decoder", True) else 0
    num_experts = _get(config, prefix, "num_experts", ("num_experts",))
    step = _get(config, prefix, "moe_layer_frequency", ("encoder_sparse_step", "decoder_sparse_step"),
                required=False) or 1
    gated = _flag(config, prefix, "is_gated_act", False)
    if seq_length is None:
        # T5 has no position table; n_positions appears in some configs and is honoured where a default is allowed
        keys = ("n_positions", "max_position_embeddings")
        seq_length = _get(config, prefix, "seq_length", keys, required=False)
        if seq_length is None:
            raise SpecError(f"{prefix}.seq_length",
                            "Switch/T5 configs have no maximum position count; pass seq_length next to hf_config")
        if not default_seq_length:
            key = next(k for k in keys if config.get(k) is not None)
            raise SpecError(f"{prefix}.seq_length", _NO_DEFAULT_SEQ.format(key=key, value=seq_length))
    heads = _get(config, prefix, "num_attention_heads", ("num_heads",))
    return {
        "name": name,
        "arch": "moe",
        "num_layers": enc + dec,
        "hidden_size": _get(config, prefix, "hidden_size", ("d_model",)),
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "ffn_hidden_size": _get(config, prefix, "ffn_hidden_size", ("d_ff",)),
        "vocab_size": _get(config, prefix, "vocab_size", ("vocab_size",)),
        "seq_length": _seq_length({}, seq_length, prefix, "switch"),
        "num_experts": num_experts,
        "moe_top_k": 1,
        "moe_layer_frequency": step,
        "activation": _activation(config, prefix, ("dense_act_fn", "feed_forward_proj"), "relu", gated=gated),
        "norm": "rmsnorm",
        "causal": True,
        "tie_embeddings": _flag(config, prefix, "tie_word_embeddings", True),
        "position_embedding": "none",
    }


def _generic(config: dict, seq_length: Optional[int], prefix: str, default_seq_length: bool = True) -> dict:
    """Config with no recognisable model_type: read the common key names.

    Llama-style (``arch`` ``llama``) when the config names key/value heads or an RMSNorm epsilon,
    GPT-style otherwise; MoE when it names experts.
    """
    if not any(k in config for k in _KEYS["hidden_size"]):
        raise SpecError(f"{prefix}.hf_config.model_type",
                        "required key is missing, and the config has no recognisable architecture keys")
    h = _get(config, prefix, "hidden_size")
    heads = _get(config, prefix, "num_attention_heads")
    llama_like = any(k in config for k in ("num_key_value_heads", "rms_norm_eps"))
    num_experts = _get(config, prefix, "num_experts", ("num_local_experts", "num_experts"), required=False) or 1
    out: dict[str, Any] = {
        "name": str(config.get("_name_or_path") or "hf-model"),
        "num_layers": _get(config, prefix, "num_layers"),
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_kv_heads": _get(config, prefix, "num_kv_heads", required=False) or heads,
        "vocab_size": _get(config, prefix, "vocab_size"),
        "num_experts": num_experts,
        "moe_top_k": 1,
        "moe_layer_frequency": 1,
        "causal": True,  # full HF dumps carry is_decoder=false even for GPT-2; do not trust it
    }
    ffn = _get(config, prefix, "ffn_hidden_size", required=False)
    if llama_like or num_experts > 1:
        out.update(arch="moe" if num_experts > 1 else "llama", norm="rmsnorm", position_embedding="rope",
                   tie_embeddings=_flag(config, prefix, "tie_word_embeddings", False),
                   activation=_activation(config, prefix, ("hidden_act", "activation_function"), "swiglu",
                                          gated=True))
        if num_experts > 1:
            out["moe_top_k"] = _get(config, prefix, "moe_top_k", ("num_experts_per_tok", "moe_top_k"),
                                    required=False) or 2
        if ffn is None:
            raise SpecError(f"{prefix}.hf_config.intermediate_size", "required key is missing")
        out["ffn_hidden_size"] = ffn
    else:
        out.update(arch="gpt", norm="layernorm", position_embedding="learned",
                   tie_embeddings=_flag(config, prefix, "tie_word_embeddings", True),
                   activation=_activation(config, prefix, ("activation_function", "hidden_act"), "gelu"))
        out["ffn_hidden_size"] = ffn or 4 * h
    out["seq_length"] = _seq_length(config, seq_length, prefix, "generic",
                                    default_seq_length or out["position_embedding"] == "learned")
    _refuse_local_attention_beyond(config, prefix, None, out["seq_length"])
    return out
