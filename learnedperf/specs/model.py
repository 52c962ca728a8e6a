"""Model specifications: decoder transformers (GPT; Llama with GQA and SwiGLU),
encoders (BERT) and mixture-of-experts transformers.

A :class:`ModelSpec` comes from a catalog name, an inline architecture dict, or a
HuggingFace ``config.json`` (:meth:`ModelSpec.from_hf_config`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from ..errors import SpecError
from ._base import FieldValueError, Spec

Arch = Literal["gpt", "llama", "bert", "moe"]

# Architecture defaults: what each family uses unless the input says otherwise.
_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": {"activation": "gelu", "norm": "layernorm", "causal": True, "tie_embeddings": True,
            "position_embedding": "learned"},
    "bert": {"activation": "gelu", "norm": "layernorm", "causal": False, "tie_embeddings": True,
             "position_embedding": "learned"},
    "llama": {"activation": "swiglu", "norm": "rmsnorm", "causal": True, "tie_embeddings": False,
              "position_embedding": "rope"},
    "moe": {"activation": "swiglu", "norm": "rmsnorm", "causal": True, "tie_embeddings": False,
            "position_embedding": "rope"},
}


#: Keys only latent attention may set apart from their defaults (``kv_lora_rank`` > 0 switches it on), and
#: keys only a mixture of experts may set (:meth:`ModelSpec.omitted_defaults`), in the order errors name them.
_MLA_KEYS = ("q_lora_rank", "qk_rope_head_dim", "v_head_dim")
_MOE_LAYOUT_KEYS = ("moe_first_dense_layers", "moe_shared_ffn_hidden_size", "moe_router_num_groups",
                    "moe_router_group_topk", "dense_ffn_hidden_size")


def _llama_ffn(hidden: int, multiple_of: int = 256) -> int:
    # Llama's rule (Touvron et al. 2023, model.py): 2/3 of 4h, rounded up to a multiple of 256.
    ffn = int(2 * 4 * hidden / 3)
    return multiple_of * ((ffn + multiple_of - 1) // multiple_of)


class ModelSpec(Spec):
    """A transformer architecture and the sequence length it is trained at.

    Fields not given are filled from the family's conventions (``arch``), so a
    parsed spec is always complete and round-trips through JSON unchanged.
    """

    name: str = "custom"
    arch: Arch
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1, description="width of one attention head; default hidden_size / heads "
                                            "(Qwen3 and Gemma set it apart)")
    kv_lora_rank: int = Field(default=0, ge=0, description="width of the compressed key-value latent of multi-head "
                              "latent attention (MLA, DeepSeek-V2/V3); 0: ordinary attention")
    q_lora_rank: int = Field(default=0, ge=0, description="width of MLA's compressed query latent (0: queries are "
                             "projected from the hidden state directly)")
    qk_rope_head_dim: int = Field(default=0, ge=0, description="MLA: the rotary part of each query and key head, "
                                  "of head_dim; its key part is one per token, shared by the heads")
    v_head_dim: int = Field(ge=1, description="width of one value head; default head_dim (MLA sets it apart)")
    ffn_hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    num_experts: int = Field(default=1, ge=1)
    moe_top_k: int = Field(default=1, ge=1)
    moe_layer_frequency: int = Field(default=1, ge=1, description="every k-th layer is a MoE layer")
    moe_first_dense_layers: int = Field(default=0, ge=0, description="leading layers with a dense MLP before the "
                                        "first MoE layer (DeepSeek-MoE's first_k_dense_replace)")
    moe_shared_ffn_hidden_size: int = Field(default=0, ge=0, description="width of the shared experts every token "
                                            "of a MoE layer runs beside its routed ones, all shared experts "
                                            "together (0: none)")
    moe_router_num_groups: int = Field(default=1, ge=1, description="expert groups of group-limited routing "
                                       "(DeepSeek's n_group): contiguous, equal sets of experts")
    moe_router_group_topk: int = Field(ge=1, description="groups a token's experts may come from (DeepSeek's "
                                       "topk_group: node- or device-limited routing); default all groups")
    dense_ffn_hidden_size: int = Field(ge=1, description="FFN width of a MoE model's dense layers; default "
                                                         "ffn_hidden_size, the width of one expert")
    activation: Literal["gelu", "gelu_new", "swiglu", "relu"] = Field(
        description="the MLP's activation: 'gelu' (one kernel: PyTorch's F.gelu, exact or tanh), 'gelu_new' "
                    "(GELU's tanh approximation written as tensor operations, Hugging Face's NewGELUActivation: "
                    "GPT-2's; eight kernels under eager PyTorch, one fused), 'swiglu' (gated SiLU) or 'relu'")
    norm: Literal["layernorm", "rmsnorm"]
    causal: bool
    tie_embeddings: bool
    lm_head: bool = Field(default=True, description="the model ends in a projection onto the vocabulary and a "
                          "loss over it; false: in a sequence-classification head (Hugging Face's "
                          "*ForSequenceClassification: a pooler and a classifier over each sequence's first "
                          "token), so no logits GEMM, no vocabulary loss and no output matrix")
    position_embedding: Literal["learned", "rope", "none"]

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        arch = data.get("arch")
        if not isinstance(arch, str) or arch not in _ARCH_DEFAULTS:
            return data  # the Literal check reports it
        out = dict(_ARCH_DEFAULTS[arch])
        out.update({k: v for k, v in data.items() if v is not None})
        h = out.get("hidden_size")
        heads = out.get("num_attention_heads")
        if "num_kv_heads" not in out and heads is not None:
            out["num_kv_heads"] = heads
        if "head_dim" not in out and isinstance(h, int) and isinstance(heads, int) and heads > 0:
            out["head_dim"] = h // heads
        if "v_head_dim" not in out and "head_dim" in out:
            out["v_head_dim"] = out["head_dim"]
        if "ffn_hidden_size" not in out and isinstance(h, int):
            out["ffn_hidden_size"] = _llama_ffn(h) if out.get("activation") == "swiglu" else 4 * h
        if "moe_router_group_topk" not in out:
            out["moe_router_group_topk"] = out.get("moe_router_num_groups", 1)
        if "dense_ffn_hidden_size" not in out and "ffn_hidden_size" in out:
            out["dense_ffn_hidden_size"] = out["ffn_hidden_size"]
        if arch == "moe":
            out.setdefault("moe_top_k", 2)
        return out

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.hidden_size % self.num_attention_heads:
            raise FieldValueError("num_attention_heads",
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.num_kv_heads:
            raise FieldValueError("num_kv_heads",
                f"num_kv_heads={self.num_kv_heads} does not divide num_attention_heads={self.num_attention_heads}")
        if self.arch == "moe" and self.num_experts < 2:
            raise FieldValueError("num_experts", "arch 'moe' needs num_experts >= 2")
        if self.arch != "moe" and self.num_experts != 1:
            raise FieldValueError("num_experts", f"num_experts={self.num_experts} needs arch 'moe'")
        if self.moe_top_k > self.num_experts:
            raise FieldValueError("moe_top_k",
                                  f"moe_top_k={self.moe_top_k} exceeds num_experts={self.num_experts}")
        defaults = self.omitted_defaults()
        if self.kv_lora_rank:
            if self.num_kv_heads != self.num_attention_heads:
                raise FieldValueError("num_kv_heads", f"latent attention (kv_lora_rank={self.kv_lora_rank}) "
                                      f"up-projects keys and values for every head: num_kv_heads={self.num_kv_heads} "
                                      f"must equal num_attention_heads={self.num_attention_heads}")
            if self.qk_rope_head_dim >= self.head_dim:
                raise FieldValueError("qk_rope_head_dim", f"qk_rope_head_dim={self.qk_rope_head_dim} must be "
                                      f"below head_dim={self.head_dim} (the rotary part of a query/key head)")
        else:
            for key in _MLA_KEYS:
                if getattr(self, key) != defaults[key]:
                    raise FieldValueError(key, f"{key}={getattr(self, key)} needs latent attention (kv_lora_rank > 0)")
        groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
        if self.arch != "moe":
            for key in _MOE_LAYOUT_KEYS:
                if getattr(self, key) != defaults[key]:
                    raise FieldValueError(key, f"{key}={getattr(self, key)} needs arch 'moe'")
        elif self.num_moe_layers < 1:
            raise FieldValueError("moe_first_dense_layers",
                                  f"no MoE layer left: {self.moe_first_dense_layers} leading dense layers, then "
                                  f"every {self.moe_layer_frequency}-th of {self.num_layers} layers")
        elif self.num_experts % groups:
            raise FieldValueError("moe_router_num_groups", f"moe_router_num_groups={groups} does not divide "
                                                           f"num_experts={self.num_experts}")
        elif group_topk > groups:
            raise FieldValueError("moe_router_group_topk", f"moe_router_group_topk={group_topk} exceeds "
                                                           f"moe_router_num_groups={groups}")
        elif group_topk * (self.num_experts // groups) < self.moe_top_k:
            raise FieldValueError("moe_router_group_topk", f"{group_topk} groups of {self.num_experts // groups} "
                                                           f"experts cannot hold a token's moe_top_k={self.moe_top_k}")
        return self

    def omitted_defaults(self) -> dict:
        """The value each optional key takes when a model leaves it out: ``head_dim`` = hidden_size / heads,
        the latent-attention keys (:data:`_MLA_KEYS`, ``kv_lora_rank``) and the MoE layout and routing keys
        (:data:`_MOE_LAYOUT_KEYS`) their ordinary-model values; :meth:`to_dict` writes each only where it
        differs, and the validation refuses a set one where the model has no latent attention or experts;
        ``lm_head`` true (a model written before the key serialises, and hashes, as it did)."""
        return {"head_dim": self.hidden_size // self.num_attention_heads, "kv_lora_rank": 0, "q_lora_rank": 0,
                "qk_rope_head_dim": 0, "v_head_dim": self.head_dim, "moe_first_dense_layers": 0,
                "moe_shared_ffn_hidden_size": 0, "moe_router_num_groups": 1,
                "moe_router_group_topk": self.moe_router_num_groups, "dense_ffn_hidden_size": self.ffn_hidden_size,
                "lm_head": True}

    # ------------------------------------------------------------------ derived
    @property
    def tied_head(self) -> bool:
        """The LM head shares the input embedding's table (``tie_embeddings`` and an ``lm_head``): its weight
        gradient is added to the table's."""
        return self.tie_embeddings and self.lm_head

    @property
    def attention_width(self) -> int:
        """Width of the attention's queries: heads × head_dim (``hidden_size`` unless ``head_dim`` is set
        apart)."""
        return self.num_attention_heads * self.head_dim

    @property
    def value_width(self) -> int:
        """Width of the attention's values and of the output projection's input: heads × v_head_dim."""
        return self.num_attention_heads * self.v_head_dim

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

    @property
    def attention_params(self) -> int:
        """Weights of the attention's projections (no norms, no biases).

        Ordinary attention: Q, K, V and the output projection. MLA (DeepSeek-V2 report, arXiv 2405.04434,
        section 2.1): queries down to ``q_lora_rank`` and up to heads × head_dim (or straight from the hidden
        state), keys and values down to ``kv_lora_rank`` plus one shared rotary key of ``qk_rope_head_dim``,
        then up to every head's non-rotary key and its value, and the output projection from heads ×
        v_head_dim."""
        h, a = self.hidden_size, self.num_attention_heads
        out = self.value_width * h
        if not self.is_mla:
            return out + h * (a + 2 * self.num_kv_heads) * self.head_dim
        q_lora, kv_lora = self.q_lora_rank, self.kv_lora_rank
        q = q_lora * (h + self.attention_width) if q_lora else h * self.attention_width
        kv = h * (kv_lora + self.qk_rope_head_dim) + kv_lora * a * (self.head_dim - self.qk_rope_head_dim
                                                                    + self.v_head_dim)
        return q + kv + out

    @property
    def tp_replicated_layer_params(self) -> int:
        """Parameters of one layer that every tensor-parallel rank keeps whole: MLA's down projections and
        their norms (Megatron-Core duplicates them); 0 otherwise (norms are counted as split, a few KB)."""
        if not self.is_mla:
            return 0
        h, q_lora, kv_lora = self.hidden_size, self.q_lora_rank, self.kv_lora_rank
        return (h + 1) * q_lora + h * (kv_lora + self.qk_rope_head_dim) + kv_lora

    @property
    def is_moe(self) -> bool:
        """True when some layers route tokens to experts."""
        return self.num_experts > 1

    @property
    def num_moe_layers(self) -> int:
        """Number of layers whose MLP is a mixture of experts."""
        return self.moe_layers_in(0, self.num_layers)

    def moe_layers_in(self, first: int, count: int) -> int:
        """How many of the ``count`` layers from layer ``first`` (0-based) are MoE layers.

        After ``moe_first_dense_layers`` dense layers, every ``moe_layer_frequency``-th layer is one, the
        last of each group (GShard's and Switch's every other layer are layers 1, 3, 5, ...), as DeepSeek-MoE
        places its MoE layers after ``first_k_dense_replace`` dense ones.
        """
        if not self.is_moe:
            return 0
        k, freq = self.moe_first_dense_layers, self.moe_layer_frequency
        lo, hi = max(first, k), max(first + count, k)
        return (hi - k) // freq - (lo - k) // freq

    def expected_parts_per_token(self, parts: int) -> float:
        """Expected number of ``parts`` — contiguous, equal shares of the experts, as expert parallelism places
        them on ranks or nodes — that hold at least one of a token's ``moe_top_k`` experts.

        Routing is taken as uniform: a token picks ``moe_router_group_topk`` of the ``moe_router_num_groups``
        groups, then its experts among theirs, all choices equally likely (balanced routing, as the rest of
        the cost model assumes). A part untouched by a token has probability ``C(n - o, k) / C(n, k)`` given
        the chosen groups' ``n`` experts, ``o`` of them in the part; averaged over the chosen groups. Groups
        that neither nest in the parts nor split evenly over them are counted as one group (no limit), an
        upper bound.
        """
        E, k, G, M = self.num_experts, self.moe_top_k, self.moe_router_num_groups, self.moe_router_group_topk
        if parts <= 1 or E <= 1:
            return 1.0
        if G % parts and parts % G:
            G = M = 1
        n = M * E // G  # the experts a token chooses among
        if G % parts == 0:
            # each part holds G/parts whole groups; i of them chosen (hypergeometric)
            per = G // parts
            untouched = sum(math.comb(per, i) * math.comb(G - per, M - i) / math.comb(G, M)
                            * math.comb(n - i * E // G, k) / math.comb(n, k) for i in range(0, min(per, M) + 1))
        else:
            # each group spans parts/G parts; a part's group is chosen with probability M/G
            untouched = 1.0 - M / G + M / G * math.comb(n - E // parts, k) / math.comb(n, k)
        return parts * (1.0 - untouched)

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (expert): 3 with a gated activation, else 2."""
        return 3 if self.activation == "swiglu" else 2

    @property
    def mlp_params(self) -> int:
        """Parameters of one MLP (one expert of a MoE layer), without biases."""
        return self.mlp_matrices * self.hidden_size * self.ffn_hidden_size

    @property
    def ffn_width_sum(self) -> int:
        """The FFN width one token passes through, summed over the layers: top-k experts plus the shared ones
        in each MoE layer, ``dense_ffn_hidden_size`` in each dense one."""
        n_moe = self.num_moe_layers
        return (n_moe * (self.ffn_hidden_size * self.moe_top_k + self.moe_shared_ffn_hidden_size)
                + (self.num_layers - n_moe) * self.dense_ffn_hidden_size)

    @property
    def shared_mlp_params(self) -> int:
        """Parameters of a MoE layer's shared experts (0 without them); they are not sharded over experts."""
        return self.mlp_matrices * self.hidden_size * self.moe_shared_ffn_hidden_size

    def layer_params(self, moe: bool = False) -> int:
        """Parameters of one transformer layer (dense, or MoE when ``moe``)."""
        h, f, hd = self.hidden_size, self.dense_ffn_hidden_size, self.head_dim
        attn = self.attention_params
        norm = (2 if self.norm == "layernorm" else 1) * h * 2 + self.q_lora_rank + self.kv_lora_rank  # MLA's
        bias = 0
        if self.arch in ("gpt", "bert"):
            bias = (self.num_attention_heads + 2 * self.num_kv_heads) * hd + h + f + h
        if moe:
            # routed experts, the router (h x experts) and the shared experts
            return attn + norm + bias + self.num_experts * self.mlp_params + h * self.num_experts \
                + self.shared_mlp_params
        return attn + self.mlp_matrices * h * f + norm + bias

    def embedding_params(self) -> int:
        """Parameters of the input embedding (and learned positions)."""
        pos = self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def num_params(self) -> int:
        """Total parameter count (embedding, layers, final norm, untied LM head; a classification head's
        pooler, ``hidden_size``², and its classifier, a few rows, are left out)."""
        moe_layers = self.num_moe_layers
        dense_layers = self.num_layers - moe_layers
        total = self.embedding_params()
        total += dense_layers * self.layer_params(False) + moe_layers * self.layer_params(True)
        total += (2 if self.norm == "layernorm" else 1) * self.hidden_size
        if not self.tie_embeddings and self.lm_head:
            total += self.vocab_size * self.hidden_size
        return total

    def num_active_params(self) -> int:
        """Parameters touched by one token (top-k experts instead of all)."""
        if not self.is_moe:
            return self.num_params()
        return self.num_params() - self.num_moe_layers * (self.num_experts - self.moe_top_k) * self.mlp_params

    # ---------------------------------------------------------------- builders
    @classmethod
    def from_hf_config(cls, config: dict, seq_length: Optional[int] = None, prefix: str = "model",
                       default_seq_length: bool = True) -> "ModelSpec":
        """Build a spec from a HuggingFace ``config.json`` dict.

        Supports GPT-2, GPT-J/NeoX, OPT, BERT/RoBERTa, Llama/Mistral/Qwen2/Qwen3/Gemma 1-3, and Mixtral,
        Qwen3-MoE, Qwen1.5/2-MoE, DeepSeek-MoE (shared experts, leading dense layers), DeepSeek-V2/V3
        (latent attention), Llama 4 (its text model) and Switch-style MoE configs. ``seq_length`` defaults to
        the config's maximum position count; with ``default_seq_length`` False (the run format's reading) only
        where that is a learned position table (see :func:`~learnedperf.specs.hf.hf_config_to_arch`). A config
        whose ``architectures`` name a ``*ForSequenceClassification`` class has ``lm_head`` false.
        """
        from .hf import hf_config_to_arch  # local: keeps the mapping table out of import time

        arch = hf_config_to_arch(config, seq_length, prefix, default_seq_length)
        classes = config.get("architectures") if isinstance(config, dict) else None
        if isinstance(classes, list) and any(str(c).endswith("ForSequenceClassification") for c in classes):
            arch = {**arch, "lm_head": False}
        return cls.parse(arch, prefix)


def resolve_model(value: Any, prefix: str = "model") -> ModelSpec:
    """Resolve the run format's ``model`` value (name, inline dict or ``hf_config``)."""
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        from ..catalog import get_model

        return ModelSpec.parse(get_model(value, field=prefix), prefix)
    if isinstance(value, dict):
        if "hf_config" in value:
            extra = set(value) - {"hf_config", "seq_length", "name"}
            if extra:
                raise SpecError(f"{prefix}.{sorted(extra)[0]}", "unknown field next to hf_config")
            cfg = value["hf_config"]
            if not isinstance(cfg, dict):
                raise SpecError(f"{prefix}.hf_config", "expected the JSON object of a HuggingFace config.json")
            # a run gives the sequence length it trains at: a rotary config's max_position_embeddings is no default
            spec = ModelSpec.from_hf_config(cfg, value.get("seq_length"), prefix, default_seq_length=False)
            if "name" in value:
                spec = spec.model_copy(update={"name": str(value["name"])})
            return spec
        return ModelSpec.parse(value, prefix)
    raise SpecError(prefix, f"expected a catalog name or a JSON object, got {type(value).__name__}")
