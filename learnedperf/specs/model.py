"""Model specifications: decoder transformers (GPT; Llama with GQA and SwiGLU),
encoders (BERT) and mixture-of-experts transformers.

A :class:`ModelSpec` comes from a catalog name, an inline architecture dict, or a
HuggingFace ``config.json`` (:meth:`ModelSpec.from_hf_config`).
"""

from __future__ import annotations

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
    ffn_hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    num_experts: int = Field(default=1, ge=1)
    moe_top_k: int = Field(default=1, ge=1)
    moe_layer_frequency: int = Field(default=1, ge=1, description="every k-th layer is a MoE layer")
    activation: Literal["gelu", "swiglu", "relu"]
    norm: Literal["layernorm", "rmsnorm"]
    causal: bool
    tie_embeddings: bool
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
        if "ffn_hidden_size" not in out and isinstance(h, int):
            out["ffn_hidden_size"] = _llama_ffn(h) if out.get("activation") == "swiglu" else 4 * h
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
        return self

    def to_dict(self) -> dict:
        """JSON-compatible dict; ``head_dim`` only where it is not ``hidden_size / heads``, so that a run
        written before the field existed serialises (and hashes) as it did."""
        out = super().to_dict()
        if out.get("head_dim") == self.hidden_size // self.num_attention_heads:
            del out["head_dim"]
        return out

    # ------------------------------------------------------------------ derived
    @property
    def attention_width(self) -> int:
        """Width of the attention's query and output projections: heads × head_dim (``hidden_size`` unless
        ``head_dim`` is set apart)."""
        return self.num_attention_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        """True when some layers route tokens to experts."""
        return self.num_experts > 1

    @property
    def num_moe_layers(self) -> int:
        """Number of layers whose MLP is a mixture of experts."""
        return self.num_layers // self.moe_layer_frequency if self.is_moe else 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (expert): 3 with a gated activation, else 2."""
        return 3 if self.activation == "swiglu" else 2

    @property
    def mlp_params(self) -> int:
        """Parameters of one MLP (one expert of a MoE layer), without biases."""
        return self.mlp_matrices * self.hidden_size * self.ffn_hidden_size

    def layer_params(self, moe: bool = False) -> int:
        """Parameters of one transformer layer (dense, or MoE when ``moe``)."""
        h, f, hd = self.hidden_size, self.ffn_hidden_size, self.head_dim
        qkv = h * (self.num_attention_heads + 2 * self.num_kv_heads) * hd
        attn = qkv + self.attention_width * h
        mlp = self.mlp_params
        norm = (2 if self.norm == "layernorm" else 1) * h * 2
        bias = 0
        if self.arch in ("gpt", "bert"):
            bias = (self.num_attention_heads + 2 * self.num_kv_heads) * hd + h + f + h
        if moe:
            return attn + norm + bias + self.num_experts * mlp + h * self.num_experts
        return attn + mlp + norm + bias

    def embedding_params(self) -> int:
        """Parameters of the input embedding (and learned positions)."""
        pos = self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def num_params(self) -> int:
        """Total parameter count (embedding, layers, final norm, untied LM head)."""
        moe_layers = self.num_moe_layers
        dense_layers = self.num_layers - moe_layers
        total = self.embedding_params()
        total += dense_layers * self.layer_params(False) + moe_layers * self.layer_params(True)
        total += (2 if self.norm == "layernorm" else 1) * self.hidden_size
        if not self.tie_embeddings:
            total += self.vocab_size * self.hidden_size
        return total

    def num_active_params(self) -> int:
        """Parameters touched by one token (top-k experts instead of all)."""
        if not self.is_moe:
            return self.num_params()
        return self.num_params() - self.num_moe_layers * (self.num_experts - self.moe_top_k) * self.mlp_params

    # ---------------------------------------------------------------- builders
    @classmethod
    def from_hf_config(cls, config: dict, seq_length: Optional[int] = None, prefix: str = "model") -> "ModelSpec":
        """Build a spec from a HuggingFace ``config.json`` dict.

        Supports GPT-2, GPT-J/NeoX, OPT, BERT/RoBERTa, Llama/Mistral/Qwen2 and
        Mixtral/Switch-style MoE configs. ``seq_length`` defaults to the config's
        maximum position count.
        """
        from .hf import hf_config_to_arch  # local: keeps the mapping table out of import time

        arch = hf_config_to_arch(config, seq_length, prefix)
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
            spec = ModelSpec.from_hf_config(cfg, value.get("seq_length"), prefix)
            if "name" in value:
                spec = spec.model_copy(update={"name": str(value["name"])})
            return spec
        return ModelSpec.parse(value, prefix)
    raise SpecError(prefix, f"expected a catalog name or a JSON object, got {type(value).__name__}")
