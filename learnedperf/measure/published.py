"""Published training runs — tables transcribed from papers and reports — as measured runs.

A published table states a model, a cluster, a parallel strategy and a throughput, in the
words of its authors: "A100 SXM4 80GB", "ZeRO-1", "interleaved 1F1B", "fp16 mixed", TFLOP/s
per GPU counted with the paper's own formula. :func:`load_published` reads such a table in
the column layout of ``shared/data/published/*.csv`` (:data:`PUBLISHED_COLUMNS`, one row per
run) and maps each row to the run format with the iteration time it implies, so that any
number of published runs — other frameworks, devices and scales than the ones the predictor
learned from — can be predicted and scored (``experiments/published_runs.py``) or ingested as
training records (``learnedperf ingest --published FILE``).

Nothing is guessed silently. A row that cannot become a run (a GPU the catalog does not know,
a sharding the run format cannot express, no throughput at all) is skipped with its reason; a
value the row leaves out and the loader fills in (micro-batch 1, no recompute, the family's
vocabulary, the SXM form of a GPU named without one, an interleaving depth the paper does not
give, the shard group of hybrid sharding left unstated: a node, FSDP HYBRID_SHARD's default) is counted
in :attr:`LoadedPublished.assumptions` and written into the run's ``meta``.

The iteration time is taken, in this order, from ``iteration_time_s``, ``tokens_per_sec_total``,
``tokens_per_sec_per_gpu`` · GPUs, ``samples_per_sec``, and last from a FLOP rate
(``tflops_per_gpu``, ``aggregate_pflops``, ``mfu_pct`` or ``hfu_pct`` of the device's data-sheet
peak) divided into the FLOPs of one iteration counted as Megatron-LM counts them (Narayanan et
al., SC21, Appendix: every matmul 2·m·n·k, attention in full, one more forward of the layers
where the rate counts the recomputed one — the paper's ``96·B·s·l·h²·(1 + s/6h + V/16lh)``),
generalised to grouped-query attention, gated MLPs and mixture-of-experts by the same matmul
count (:func:`megatron_flops`). Which source the time came from is in ``meta["target_from"]``.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError, LearnedPerfError
from .public import MeasuredRun

#: Columns of a published-runs table, in the order of ``shared/data/published/*.csv``.
PUBLISHED_COLUMNS = (
    "row_id", "source", "source_locator", "model", "params_published", "num_layers", "hidden_size", "num_heads",
    "num_kv_heads", "ffn_hidden_size", "seq_len", "vocab_size", "gpu_type", "num_gpus", "interconnect", "tp", "pp",
    "dp", "cp", "sp", "ep", "vpp_or_schedule", "zero_or_fsdp", "micro_batch_size", "global_batch_size_seqs",
    "global_batch_tokens", "grad_accum", "activation_recompute", "precision", "framework", "tflops_per_gpu",
    "mfu_pct", "hfu_pct", "tokens_per_sec_per_gpu", "tokens_per_sec_total", "samples_per_sec",
    "iteration_time_s", "aggregate_pflops", "other_metric", "notes")

#: Columns a table must have (the others may be absent or blank).
REQUIRED_COLUMNS = ("model", "num_layers", "hidden_size", "num_heads", "seq_len", "gpu_type", "num_gpus")

#: Where the iteration time of a run came from, in the order the loader tries them.
TARGET_SOURCES = ("iteration_time_s", "tokens_per_sec_total", "tokens_per_sec_per_gpu", "samples_per_sec",
                  "tflops_per_gpu", "aggregate_pflops", "mfu_pct", "hfu_pct")

# Model-name keywords → run-format arch (checked in this order; the first hit wins). Families whose
# blocks are Llama's (RMSNorm, SwiGLU, RoPE, no tied head) are "llama"; GPT-2/3-style blocks (LayerNorm, an
# ungated 4h MLP: MPT's GELU, Nemotron-4's squared ReLU) are "gpt".
_ARCH_WORDS = (
    ("moe", ("mixtral", "moe", "switch", "glam", "expert", "deepseek-v2", "deepseek-v3", "deepseek v2",
             "deepseek v3", "dbrx", "grok", "arctic")),
    ("bert", ("bert", "roberta", "electra")),
    ("llama", ("llama", "mistral", "qwen", "yi-", "internlm", "baichuan", "deepseek", "olmo", "gemma")),
    ("gpt", ("gpt", "megatron", "bloom", "opt-", "opt ", "nlg", "turing", "gopher", "chinchilla", "palm",
             "falcon", "pythia", "neox", "jurassic", "codegen", "starcoder", " mpt-", " mpt ", "nemotron")),
)
# Vocabulary of a family when a row and the catalog give none (the family's reference tokenizer):
# GPT-2 BPE padded to a multiple of 128 as Megatron pads it (51200), Llama 1/2 (32000), BERT (30522).
_FAMILY_VOCAB = {"gpt": 51200, "llama": 32000, "moe": 32000, "bert": 30522}
# Later tokenizers of a family, by name, before the family's default: Llama 3's 128,256 (Llama Team 2024,
# arXiv 2407.21783: 128K tokens; the config.json of every Llama 3.x), Gemma's 256,000 (Gemma Team 2024,
# arXiv 2403.08295, §2)
_NAMED_VOCAB = ((re.compile(r"llama[\s_-]*3"), 128256, "Llama 3"), (re.compile(r"gemma"), 256000, "Gemma"))
# words after a model's name that name a release of the same architecture: tuned and chat releases,
# HuggingFace's "-hf" conversions, version tags (not "base": "BERT base" is a size, not a release)
_RELEASE_SUFFIX = re.compile(r"(?:[\s_-]+(?:instruct|chat|hf|it|sft|dpo|rlhf|v\d+(?:\.\d+)*))+$", re.IGNORECASE)
# encoder-decoder models: ModelSpec has one stack, and a table's num_layers does not say how they split (the
# Switch Transformers are T5s: Fedus et al. 2021, arXiv 2101.03961, §3)
_ENCODER_DECODER = re.compile(r"\b(?:m|flan-|byt)?t5\b|\bbart\b|\bul2\b|\bpegasus\b|encoder[\s-]decoder|\bnllb\b"
                              r"|\bswitch[\s-]*(?:base|large|xl|xxl|c|transformers?)\b")
# state-space and recurrent models, alone or mixed with attention (Mamba, Jamba, Nemotron-H, Zamba, RWKV,
# Griffin): their layers are not transformer blocks, and the run format has no other kind
_NOT_TRANSFORMER = re.compile(r"mamba|jamba|nemotron[\s-]*h\b|zamba|rwkv|griffin|recurrentgemma|hyena|\bssm\b")

_TRUE = {"yes", "y", "true", "1", "on", "sp"}
_FALSE = {"", "no", "n", "false", "0", "off", "none", "-", "n/a", "na"}

# "8x 200Gb/s", "8 × 400 Gbps", "4x HDR 200 Gb/s", "8x400G RoCE", "8x 200GbE": compute-fabric NICs per node
# and their rate (case-sensitive: "GB/s" is bytes, an NVLink figure, not a NIC rate); the count is a number of
# its own, not the "24" of an instance type "p4d.24xlarge". Or the rate first: "400Gb/s x 8".
_NICS = re.compile(r"(?<![\w.])(\d+)\s*[xX×](?![a-z])\s*(?:[A-Za-z-]+\s+)?(\d+(?:\.\d+)?)\s*G(?:b|bit)?(?:/s|ps|E)?\b")
_NICS_RATE_FIRST = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*G(?:b|bit)?(?:/s|ps|E)?\s*[xX×]\s*(\d+)\b")
# or a node's total: "3.2 Tbps per node", "3200 Gbps EFA" (AWS states an instance's EFA bandwidth so)
_NODE_RATE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([TG])(?:b|bit)(?:/s|ps)"
                        r"\s*(?:per\s+(?:node|instance)|/\s*node|efa)", re.IGNORECASE)


@dataclass(frozen=True)
class LoadedPublished:
    """What :func:`load_published` made of a table.

    Attributes:
        runs: one :class:`~learnedperf.measure.public.MeasuredRun` per usable row, ``source``
            ``"published:<file name>"``; ``run["meta"]`` holds the row's citation, framework,
            ``target_from`` and the values the loader filled in (``assumed``).
        skipped: ``(row label, reason)`` per row that could not become a run.
        assumptions: what was filled in → number of rows.
        warnings: ``(row label, text)`` for rows kept despite an inconsistency (two throughput
            columns that disagree, an architecture that differs from the catalog's).
    """

    runs: list
    skipped: list = field(default_factory=list)
    assumptions: Counter = field(default_factory=Counter)
    warnings: list = field(default_factory=list)


class _Skip(Exception):
    """A row that cannot become a run (the message is the reason)."""


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    return "" if value is None else str(value).strip()


def _number(row: dict, key: str) -> Optional[float]:
    """The number in ``key`` (None when blank); ``1,024`` and ``2.0`` are read as numbers, and so are a number
    followed by a remark in brackets (``512 (64 nodes)``) and an approximate one (``~3000``, ``≈ 40``)."""
    text = re.sub(r"\s*\([^()]*\)\s*$", "", _cell(row, key))  # "512 (64 nodes)": the remark is no number
    text = text.replace(",", "").replace("_", "").removesuffix("%").strip().lstrip("~≈").strip()
    if text.lower() in ("", "-", "n/a", "na", "none", "?"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise _Skip(f"field {key!r}: {_cell(row, key)!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise _Skip(f"field {key!r}: {_cell(row, key)!r} is not a finite non-negative number")
    return value


def _integer(row: dict, key: str) -> Optional[int]:
    value = _number(row, key)
    if value is None:
        return None
    if value != int(value):
        raise _Skip(f"field {key!r}: {_cell(row, key)!r} is not a whole number")
    return int(value)


def _required_int(row: dict, key: str) -> int:
    value = _integer(row, key)
    if value is None or value < 1:
        raise _Skip(f"field {key!r} is missing")
    return value


# ------------------------------------------------------------------ model
def _arch_of(name: str) -> Optional[str]:
    text = f" {name.lower()} "
    for arch, words in _ARCH_WORDS:
        if any(w in text for w in words):
            return arch
    return None


def _model(row: dict, assumed: list, warnings: list) -> dict:
    """The inline architecture of a row: the catalog's entry of its name where there is one, the row's
    columns over it (a published table states what was trained)."""
    from ..catalog import get_model
    from ..errors import CatalogError

    name = _cell(row, "model")
    columns = {"num_layers": _required_int(row, "num_layers"), "hidden_size": _required_int(row, "hidden_size"),
               "num_attention_heads": _required_int(row, "num_heads"), "seq_length": _required_int(row, "seq_len"),
               "num_kv_heads": _integer(row, "num_kv_heads"), "ffn_hidden_size": _integer(row, "ffn_hidden_size"),
               "vocab_size": _integer(row, "vocab_size")}
    base = None
    # a release of a catalog model ("Mixtral-8x7B-Instruct-v0.1", "Llama-2-7b-chat-hf") has its architecture
    for candidate in dict.fromkeys((name, _RELEASE_SUFFIX.sub("", name))) if name else ():
        try:
            base = get_model(candidate)
            break
        except CatalogError:
            continue
    if base is not None:
        model = {k: v for k, v in base.items() if k != "name"}
        differ = [k for k, v in columns.items()
                  if v is not None and k != "seq_length" and model.get(k) is not None and model[k] != v]
        if differ:
            warnings.append(f"architecture differs from the catalog's {base['name']!r} in "
                            f"{', '.join(differ)}: the row's values are used")
        model.update({k: v for k, v in columns.items() if v is not None})
        model["name"] = name
        return model
    if _ENCODER_DECODER.search(name.lower()):
        raise _Skip(f"model {name!r} is an encoder-decoder: the run format describes one stack of layers, and "
                    "the table does not say how its layers split between encoder and decoder")
    if _NOT_TRANSFORMER.search(name.lower()):
        raise _Skip(f"model {name!r} has state-space or recurrent layers: the run format describes transformer "
                    "blocks only")
    arch = _arch_of(name)
    if arch is None:
        arch = "gpt"
        assumed.append("arch gpt (model name names no known family)")
    model = {"arch": arch, "name": name or "published", **{k: v for k, v in columns.items() if v is not None}}
    experts = _moe(row, arch, assumed)
    if experts:
        model.update(experts)
        arch, family = "moe", "gpt" if experts.get("activation") == "gelu" else "moe"
        model["arch"] = arch
    else:
        family = arch
    if columns["vocab_size"] is None:
        named = next(((v, who) for pattern, v, who in _NAMED_VOCAB if pattern.search(name.lower())), None)
        model["vocab_size"], tokenizer = named or (_FAMILY_VOCAB[family], f"{family} family")
        assumed.append(f"vocab_size {model['vocab_size']} ({tokenizer}'s tokenizer)")
    # what ModelSpec fills in for a model the catalog does not know, said as filled in
    from ..specs import ModelSpec

    try:
        filled = ModelSpec.model_validate({k: v for k, v in model.items() if k != "name"})
    except (LearnedPerfError, ValueError):
        return model  # an inconsistent architecture: RunSpec.from_dict skips the row naming the field
    if columns["ffn_hidden_size"] is None:
        rule = "SwiGLU: 2/3 of 4h, a multiple of 256" if filled.activation == "swiglu" else "4h"
        assumed.append(f"ffn_hidden_size {filled.ffn_hidden_size} ({rule}: the row states none)")
    if columns["num_kv_heads"] is None:
        assumed.append(f"num_kv_heads {filled.num_kv_heads} (one per attention head: the row states none)")
    return model


# A mixture of experts' layout in a row's words. The expert count: "8 experts", "num_experts=64", "experts: 16"
# anywhere in the model name or notes; in the model name also Mixtral's "8x7B" (experts × the size of one expert
# model) and DeepSpeed-MoE's "MoE-128" / "-128E" (not in notes: "1e-4" is a learning rate). Not the 2 of
# "top-2 experts", which is the experts per token.
_EXPERTS_TEXT = re.compile(r"(?<![\w-])(?<!top )(\d+)\s*(?:routed\s+)?experts\b|num[\s_-]*experts\s*[=:]?\s*(\d+)"
                           r"|experts\s*[=:]\s*(\d+)")
_EXPERTS_NAME = re.compile(r"\b(\d+)\s*x\s*\d+(?:\.\d+)?\s*b\b|\bmoe[\s_-]*(\d+)\b|\b(\d+)e\b")
# experts per token: "top-2", "top2", "top-k=2", "topk 2", "2 active experts", "moe_router_topk=2"
_TOP_K = re.compile(r"top[\s_-]*k?\s*[=:]?\s*(\d+)|(\d+)\s*active\s+experts")
# "MoE every other layer", "every 2 layers", "moe_layer_freq=2"
_MOE_EVERY = re.compile(r"every\s+(?:other|second|2nd)\s+(?:ffn\s+|mlp\s+)?layer|every\s+(\d+)\s+layers"
                        r"|layer[\s_-]*freq\w*\s*[=:]?\s*(\d+)|expert[\s_-]*interval\s*[=:]?\s*(\d+)")
# MoE names the family words miss: the active parameters beside the total ("Qwen3-30B-A3B", "Qwen3-235B-A22B"),
# and families whose every release is a MoE: Llama 4 (Scout, Maverick), gpt-oss, DeepSeek-MoE, DeepSeek-V2/V3/R1
# (Coder-V2 too; not R1's distillations into dense Llama and Qwen models) and Qwen's "-MoE" releases
_MOE_NAMES = re.compile(r"\d(?:\.\d+)?\s*b[\s_-]*a\d+(?:\.\d+)?\s*b\b|llama[\s_-]*4(?!\d)|gpt[\s_-]*oss"
                        r"|deepseek[\w.-]*?[\s_-]?(?:v[23]|r1)(?!\d)(?![\w.\s-]*distill)|deepseek[\s_-]*moe"
                        r"|qwen[\d.]*[\s_-]*moe")
# MoE designs a row cannot describe, with the reason each is skipped. Shared (always-on) experts, as DeepSeek-MoE/
# V2/V3, Qwen1.5/2-MoE and Llama 4 have them, and DeepSeek-V2/V3's (and R1's) latent attention (MLA): the run format
# has their widths (moe_shared_ffn_hidden_size, kv_lora_rank, ...), a row's columns do not, so only a catalog entry
# brings them (rows naming one, "DeepSeek-V3", "Qwen2-57B-A14B", take its architecture before they get here).
# Llama 4's chunked and gpt-oss's sliding-window attention layers and Arctic's dense MLP beside its experts (a
# dense-MoE hybrid) are not in the run format.
_MOE_UNSUPPORTED = (
    (re.compile(r"shared[\s_-]*experts?|deepseek|qwen[\d.]*[\s_-]*moe|llama[\s_-]*4(?!\d)"),
     "shared experts, whose width a row cannot state (give the name of a catalog model that has them: {shared})"),
    (re.compile(r"deepseek[\w.-]*?[\s_-]?(?:v[23]|r1)(?!\d)|\bmla\b"),
     "latent attention (MLA), whose ranks a row cannot state (give the name of a catalog model that has it: {mla})"),
    (re.compile(r"llama[\s_-]*4(?!\d)|gpt[\s_-]*oss"),
     "chunked or sliding-window attention layers, which the run format does not describe"),
    (re.compile(r"arctic"), "a dense MLP beside its experts, which the run format does not describe"),
)
# families whose papers fix a MoE choice the row may leave out: Switch routing is top-1 (Fedus et al. 2021,
# arXiv 2101.03961, §2.1); GLaM and GShard put experts in every other layer (Du et al. 2022, arXiv 2112.06905,
# §3; Lepikhin et al. 2020, arXiv 2006.16668, §2.1)
_TOP1_FAMILIES = re.compile(r"switch")
_EVERY_OTHER_FAMILIES = re.compile(r"glam|gshard|switch")


def _moe(row: dict, arch: str, assumed: list) -> dict:
    """The MoE fields of a row the catalog does not know (``{}`` for a dense model): the expert count it
    states, its top-k and MoE-layer interval as stated, fixed by its family, or filled in (counted).
    A GPT-named MoE keeps GPT's block (GELU, LayerNorm, learned positions); others take Mixtral's."""
    name = _cell(row, "model").lower()
    text = " ".join([name] + [_cell(row, k).lower() for k in ("notes", "other_metric")])
    named_moe = arch == "moe" or bool(_MOE_NAMES.search(name))
    m = _EXPERTS_TEXT.search(text) or (_EXPERTS_NAME.search(name) if named_moe else None)
    if m is None and not named_moe:
        return {}
    reasons = [why for pattern, why in _MOE_UNSUPPORTED if pattern.search(text)]
    if reasons:
        raise _Skip(f"model {_cell(row, 'model')!r} is a mixture of experts with "
                    + ", and with ".join(reasons).format(shared=_catalog_models_with("moe_shared_ffn_hidden_size"),
                                                         mla=_catalog_models_with("kv_lora_rank")))
    if m is None:
        raise _Skip(f"model {_cell(row, 'model')!r} is a mixture of experts the catalog does not know, and the row "
                    "states no expert count (say 'N experts' in notes, or give the catalog name)")
    # the dense family the name gives besides "MoE": its block ("GPT-MoE" keeps GPT's)
    family = arch if arch != "moe" else _arch_of(name.replace("moe", ""))
    if family == "bert":
        raise _Skip(f"model {_cell(row, 'model')!r} is a BERT-style (bidirectional) mixture of experts: the run "
                    "format's MoE is a decoder")
    out: dict[str, Any] = {"num_experts": int(next(g for g in m.groups() if g is not None))}
    k = _TOP_K.search(text)
    if k:
        out["moe_top_k"] = int(next(g for g in k.groups() if g is not None))
    elif _TOP1_FAMILIES.search(name):
        out["moe_top_k"] = 1
    else:
        out["moe_top_k"] = 2
        assumed.append("moe_top_k 2 (not stated; GShard's and Mixtral's routing)")
    every = _MOE_EVERY.search(text)
    if every:
        out["moe_layer_frequency"] = int(next((g for g in every.groups() if g), "2"))
    elif _EVERY_OTHER_FAMILIES.search(name):
        out["moe_layer_frequency"] = 2
    else:
        assumed.append("experts in every layer (not stated; Mixtral's layout)")
    if family == "gpt":
        out.update(_GPT_BLOCK)
    return out


def _catalog_models_with(key: str) -> str:
    """The catalog's models that set ``key`` (shared experts, latent attention), for the reason a row of
    another such model is skipped."""
    from ..catalog import get_model, names

    return ", ".join(n for n in names("models") if get_model(n).get(key)) or "none yet"


# the GPT block, for a MoE whose name says GPT (ModelSpec's arch 'moe' defaults to Mixtral's block)
_GPT_BLOCK = {"activation": "gelu", "norm": "layernorm", "position_embedding": "learned", "tie_embeddings": True}


# --------------------------------------------------------------- hardware
def _tokens(text: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9.]+", text.lower()) if t]


# the form factor a name states ("sxm" agrees with "sxm4"; "nvl" is the H100 NVL board, not the SXM part), and a
# stated memory size ("80GB", "80 GB", "80G", "80 GiB")
_FORM = re.compile(r"^(sxm\d*|pcie|nvl)$")
_MEMORY = re.compile(r"(\d+)\s*g(?:i?b)?\b")
# words that say a row counts whole packages of a multi-die accelerator, not its dies
_PACKAGE = re.compile(r"\b(package|oam|module)\b")


def _forms(tokens) -> set[str]:
    return {t for t in tokens if _FORM.match(t)}


def _form_agrees(stated: set[str], tokens: list[str]) -> bool:
    """A device whose name has a form factor must carry each stated one ("sxm" is any SXM generation)."""
    own = _forms(tokens)
    return not own or all(any(o.startswith(f) for o in own) for f in stated)


def _die_or_package(package: str, die: str, gpu_type: str, assumed: list) -> str:
    """A multi-die package's catalog entry where the row says it counts packages, else one die's."""
    if _PACKAGE.search(gpu_type.lower()):
        return package
    assumed.append(f"device {die} for {gpu_type!r} (each die of the package counted as one GPU, as ROCm exposes it)")
    return die


def _other_parts_it_could_name(name: str, text: str) -> list[str]:
    """Catalog parts of ``name``'s chip other than ``name`` that agree with every memory size and form factor
    ``text`` (a lower-case GPU name) states; dies of a package are not other parts."""
    from ..catalog import get_device, names

    toks = _tokens(text)
    memory = {int(m) for m in _MEMORY.findall(text)}
    # the words of the row that the part's name has ("rtx" and "4090" of "RTX 4090"): another part must have
    # them all ("RTX 3090" has not)
    stated = set(toks) & set(_tokens(name))
    out = []
    for n in names("devices", sort=False):
        parts = _tokens(n)
        if n == name or not stated <= set(parts) or "gcd" in parts:
            continue
        if memory and get_device(n)["memory_GiB"] not in memory:
            continue
        if _form_agrees(_forms(toks), parts):
            out.append(n)
    return out


def _device_name(gpu_type: str, assumed: list) -> str:
    """The catalog device a row's ``gpu_type`` names: its exact name or alias, else the one entry whose
    name shares the chip and every stated detail (memory, form factor); SXM where only that is left open.

    A stated memory size or form factor that no entry of the chip has is a reason to skip the row, never
    to take the nearest part (a "V100 16GB" is not the 32 GB one; a "P100 SXM2" not the PCIe card). A
    multi-die package (MI250X, MI250) becomes one of its dies, the device ROCm and published runs count
    as a GPU, unless the row says it counts packages (a memory size of the package, "OAM")."""
    from ..catalog import get_device, names
    from ..errors import CatalogError

    if not gpu_type:
        raise _Skip("field 'gpu_type' is missing")
    # a count of GPUs before the name ("8xH100", "8 × A100") and vendor words are not the part
    stripped = re.sub(r"^\d+\s*[x×]\s*(?=[a-z])", "", gpu_type.strip(), flags=re.I)
    stripped = re.sub(r"^(?:(?:nvidia|amd instinct|amd|tesla|geforce|google)\s+)+", "", stripped, flags=re.I)
    text = stripped.lower()
    for form in (gpu_type, stripped, stripped.replace(" ", "-")):
        try:
            name = get_device(form)["name"]
        except CatalogError:
            continue
        die = f"{name}-GCD"
        if die in names("devices") and not _MEMORY.search(text):
            return _die_or_package(name, die, gpu_type, assumed)
        # a device-query name ("NVIDIA H100 80GB HBM3" of nvidia-smi, "AMD Instinct MI300X") is one part's own
        query_name = form == gpu_type and re.match(r"(?:nvidia|amd|tesla)\s", gpu_type, flags=re.I)
        other = [] if query_name else _other_parts_it_could_name(name, text)
        if other:
            # a catalog alias such as "H100" or "A100" picks one part of the chip: as filled in as the SXM
            # form that the token match below counts
            assumed.append(f"device {name} for {gpu_type!r} (the catalog's part of that name; it could also name "
                           f"{', '.join(other)})")
        return name
    want = set(_tokens(stripped))
    # in catalog order, so that of equals the reference part comes first (the V100 SXM2 before the SXM3)
    chips = {n: _tokens(n) for n in names("devices", sort=False)}
    # the chip is the first token of a catalog name (a100, h100, mi300x); the row must name it
    found = [n for n, toks in chips.items() if toks[0] in want]
    if not found:
        raise _Skip(f"gpu_type {gpu_type!r} is not a catalog device (see 'learnedperf catalog devices'); "
                    "add it to the catalog with its data-sheet values")
    chip = chips[found[0]][0].upper()
    memory = {int(m) for m in _MEMORY.findall(text)}
    if memory:
        found = [n for n in found if get_device(n)["memory_GiB"] in memory]
        if not found:
            raise _Skip(f"gpu_type {gpu_type!r} states {'/'.join(map(str, sorted(memory)))} GB, which no catalog "
                        f"{chip} has; add that part to the catalog with its data-sheet values")
    stated_forms = _forms(want)
    found = [n for n in found if _form_agrees(stated_forms, chips[n])]
    if not found:
        raise _Skip(f"gpu_type {gpu_type!r} states {'/'.join(sorted(stated_forms))}, a form no catalog {chip} "
                    "has; add that part to the catalog with its data-sheet values")
    # any other stated detail that tells the candidates apart must agree ("gcd"); one no candidate carries
    # ("hbm3", "gpu") says nothing
    details = [d for d in want - stated_forms
               if any(d in chips[n] for n in found) and d not in {chips[n][0] for n in found}]
    found = [n for n in found if all(d in chips[n] for d in details)]
    if len(found) > 1:
        dies = [n for n in found if "gcd" in chips[n]]
        if len(dies) == 1 and len(found) == 2:
            return _die_or_package(next(n for n in found if n != dies[0]), dies[0], gpu_type, assumed)
        sxm = [n for n in found if any(t.startswith("sxm") for t in chips[n])]
        if sxm:
            which = "SXM form" if len(sxm) == 1 else "first SXM form in the catalog"
            assumed.append(f"device {sxm[0]} for {gpu_type!r} (the {which} of the ones it could name)")
            return sxm[0]
    if len(found) == 1:
        return found[0]
    raise _Skip(f"gpu_type {gpu_type!r} could name {', '.join(found)}: state the memory or form factor")


def _hardware(row: dict, device: str, num_gpus: int, assumed: list) -> tuple[dict, int]:
    """Run-format hardware: the catalog cluster of the device (the one the row's text names, else the
    first in catalog order: the vendor's reference system), with the inter-node bandwidth the
    ``interconnect`` text states where it states one; and the devices of one of its nodes."""
    from ..catalog import get_cluster, get_device, names, source

    clusters = [c for c in names("clusters", sort=False) if get_cluster(c)["device"] == device]
    text = " ".join(_cell(row, k) for k in ("interconnect", "source", "notes")).lower()

    def named_in_text(c: str) -> bool:
        return any(re.search(rf"\b{re.escape(a.lower())}\b", text)
                   for a in [c, *source("clusters", c).get("aliases", [])])

    named = [c for c in clusters if named_in_text(c)]
    hw: dict[str, Any]
    if named or clusters:
        cluster = (named or clusters)[0]
        hw = {"cluster": cluster, "num_devices": num_gpus}
        entry = get_cluster(cluster)
        per_node, catalog_inter = entry["devices_per_node"], entry.get("inter_node_bandwidth_GBps")
        if not named:
            assumed.append(f"cluster {cluster} (the catalog's first with {device})")
    else:
        hw = {"device": device, "num_devices": num_gpus}
        entry = get_device(device)
        per_node, catalog_inter = entry.get("devices_per_node") or 1, entry.get("inter_node_bandwidth_GBps")
    text = _cell(row, "interconnect")
    m = _NICS.search(text)
    nics = (int(m.group(1)), float(m.group(2))) if m else None
    if nics is None and (m := _NICS_RATE_FIRST.search(text)):
        nics = (int(m.group(2)), float(m.group(1)))
    if nics is None and (m := _NODE_RATE.search(text)):
        nics = (1, float(m.group(1)) * (1000.0 if m.group(2).upper() == "T" else 1.0))
    if nics and num_gpus > per_node:
        stated = nics[0] * nics[1] * 0.125 / per_node  # 1 Gb/s = 0.125 GB/s
        if catalog_inter is None or abs(stated / catalog_inter - 1) > 0.01:
            hw["inter_node_bandwidth_GBps"] = round(stated, 4)
    elif num_gpus > per_node and catalog_inter is None:
        raise _Skip(f"{num_gpus} GPUs span nodes of {per_node} but neither the interconnect text "
                    "('N x R Gb/s', or 'R Gb/s per node') nor the catalog gives the inter-node bandwidth")
    return hw, per_node


# --------------------------------------------------------------- strategy
def _flag(row: dict, key: str) -> bool:
    words = _cell(row, key).lower().replace("(", " ").split()
    text = words[0] if words else ""  # "yes (with TP)" says yes
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _Skip(f"field {key!r}: {_cell(row, key)!r} is not yes/no")


def _recompute(row: dict, assumed: list) -> str:
    text = _cell(row, "activation_recompute").lower()
    if not text:
        assumed.append("activation_recompute none (blank)")
        return "none"
    if text.split(" ")[0] in _FALSE:  # "no activation checkpointing" is none, whatever follows
        return "none"
    if "selective" in text or "partial" in text:
        return "selective"
    if re.search(r"\bblock\b", text):
        # Megatron's --recompute-method block recomputes the first N layers of each stage only
        raise _Skip(f"activation_recompute {_cell(row, 'activation_recompute')!r}: Megatron's block method "
                    "recomputes some layers of each stage, which the run format (none/selective/full) does not "
                    "describe")
    # Megatron's --recompute-method uniform recomputes every layer, in groups of N: full recompute
    if text.startswith(("full", "yes", "true", "on", "uniform")) or "checkpoint" in text:
        return "full"
    raise _Skip(f"field 'activation_recompute': {_cell(row, 'activation_recompute')!r} is not full/selective/none")


# mixed precision named without its half type: "AMP", "mixed precision", Apex's opt levels O1/O2
_UNTYPED_MIXED = re.compile(r"\bamp\b|\bmixed\b|\bo[12]\b")


def _precision(row: dict, assumed: list) -> str:
    text = _cell(row, "precision").lower()
    # fp8 first: a row with fp8 GEMMs also names the bf16 it keeps elsewhere ("bf16 + float8 linear")
    for word, p in (("fp8", "fp8"), ("float8", "fp8"), ("e4m3", "fp8"), ("e5m2", "fp8"), ("bf16", "bf16"),
                    ("bfloat16", "bf16"), ("fp16", "fp16"), ("float16", "fp16"), ("half", "fp16"),
                    ("tf32", "tf32"), ("fp32", "fp32"), ("float32", "fp32")):
        if word in text:
            return p
    if _UNTYPED_MIXED.search(text):
        # torch.autocast on CUDA and Apex AMP cast to float16 unless told otherwise; a bf16 run says bf16
        assumed.append(f"precision fp16 for {_cell(row, 'precision')!r} (AMP's default half type)")
        return "fp16"
    raise _Skip(f"field 'precision': {_cell(row, 'precision')!r} names no precision (fp8/bf16/fp16/tf32/fp32)")


# ZeRO++ (Wang et al., arXiv 2306.10209): ZeRO-3 with a secondary parameter copy sharded within a node (hpZ)
# and quantized gathers and gradient reduction (qwZ, qgZ). Its states stay sharded over all ranks, so it is
# not hybrid sharding, and its traffic is not ZeRO-3's: the run format cannot express it.
_ZERO_PP = re.compile(r"zero\s*\+\+|zeropp|hpz|qwz|qgz")
# states, parameters or activations moved to host memory or NVMe: ZeRO-Offload/Infinity, FSDP's CPUOffload
_OFFLOAD = re.compile(r"offload|infinity|nvme")
# plain data parallelism in other words than DDP
_PLAIN_DP = re.compile(r"(?:plain |pure )?(?:dp|data[ -]parallel(?:ism)?)")
# hybrid sharding: FSDP's HYBRID_SHARD (and _HYBRID_SHARD_ZERO2), "HSDP", DeepSpeed's MiCS, "ZeRO-3 hybrid"
_HYBRID = re.compile(r"hsdp|hybrid|\bmics(?:\b|_)")
# words that name PyTorch FSDP rather than a ZeRO implementation: FSDP itself and its ShardingStrategy names
# (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD), which tables such as LLM Foundry's print alone
_FSDP_WORDS = re.compile(r"fsdp|hybrid[\s_-]*shard|shard[\s_-]*grad[\s_-]*op|full[\s_-]*shard")
# FSDP's NO_SHARD: every rank holds all states and all-reduces gradients, DDP's traffic and memory
_NO_SHARD = re.compile(r"\bno[\s_-]*shard\b")
# a stated shard group, in ranks that share one copy of the states (dp·cp / dp_replicate): "shard 8",
# "shard size 8", "shard group of 64", "mics_shard_size=8", "8-way shard", "8 GPUs per shard" (not "sharded
# over 2 nodes": a count of nodes is not one of ranks)
_NOT_RANKS = r"(?!\d|\s*(?:nodes?|hosts?|machines?|servers?)\b)"
_SHARD_SIZE = re.compile(rf"(\d+){_NOT_RANKS}[\s-]*way[\s-]*shard"
                         rf"|shard(?:ing|ed)?(?:[\s_-]*(?:group|size|degree))*\s*(?:of|=|:)?\s*(\d+){_NOT_RANKS}"
                         r"|(\d+)\s*(?:gpus|ranks|devices)\s*per\s*shard")
# torchtitan's dp_shard / data_parallel_shard_degree counts data-parallel ranks without cp (its FSDP mesh is
# dp_shard·cp), so it gives dp_replicate = dp / dp_shard
_DP_SHARD = re.compile(r"(?:dp_shard|data_parallel_shard_degree)\s*[=:]?\s*(\d+)")
# stated replicas: "replicate 4", "dp_replicate=4", "4 replicas", "4-way replication", Megatron's
# "2 instances" / "num_distributed_optimizer_instances=2" (not "8 replicate ...": in "shard 8 replicate 4"
# the 8 is the shard's)
_REPLICAS = re.compile(r"replica(?:te|tion|s)?(?:[\s_-]*(?:degree|size|groups?|count))*\s*(?:of|=|:)?\s*(\d+)"
                       r"|(\d+)[\s-]*way[\s-]*replicat\w*"
                       r"|(\d+)\s*(?:replicas|replica groups|copies|instances)\b"
                       r"|instances\s*[=:]\s*(\d+)")


def _first_number(pattern: re.Pattern, text: str) -> Optional[int]:
    m = pattern.search(text)
    return None if m is None else int(next(g for g in m.groups() if g is not None))


def _fsdp_mode(text: str) -> dict:
    """FULL_SHARD, or SHARD_GRAD_OP (zero_stage 2) where the text names that mode."""
    if re.search(r"grad[\s_-]*op", text) or "zero-2" in text or "zero2" in text or "no reshard" in text:
        return {"fsdp": True, "zero_stage": 2}
    return {"fsdp": True}


def _sharding(row: dict, tp: int = 1, cp: int = 1, dp: int = 1, per_node: int = 1,
              assumed: Optional[list] = None) -> dict:
    """The ZeRO/FSDP fields of a row's ``zero_or_fsdp``; hybrid sharding (HSDP, MiCS) adds ``dp_replicate``
    from the stated shard or replica count, else from the node (``tp``, ``cp``, ``dp`` and ``per_node``, the
    devices of one node, place the data-parallel ranks; the filled-in value goes to ``assumed``)."""
    raw = _cell(row, "zero_or_fsdp")
    text = raw.lower()
    if text.split(" ")[0] in _FALSE or text.startswith(("ddp", "none")) or _PLAIN_DP.fullmatch(text):
        return {}
    if _OFFLOAD.search(text):
        raise _Skip(f"zero_or_fsdp {raw!r}: offloading to host memory or NVMe (ZeRO-Offload/Infinity, FSDP "
                    "CPUOffload) is not in the run format; its host optimizer step and PCIe transfers are not "
                    "simulated, and reading the row as on-device sharding would predict it far too fast")
    if _NO_SHARD.search(text):  # after the offload check: NO_SHARD with CPUOffload still moves states to the host
        return {}
    if _ZERO_PP.search(text):
        raise _Skip(f"zero_or_fsdp {raw!r}: ZeRO++ (hpZ's secondary parameter partition within a node, "
                    "qwZ/qgZ quantized communication) is not in the run format; it is not hybrid sharding, "
                    "the states stay sharded over all ranks")
    stage = re.search(r"(?:zero|stage)[\s_-]*(\d)", text)
    dist_opt = "distributed optimizer" in text or "distopt" in text
    # Megatron's distributed optimizer is hybrid where it has several instances
    if _HYBRID.search(text) or (dist_opt and (_first_number(_REPLICAS, text) or 1) > 1):
        if _FSDP_WORDS.search(text):
            base = _fsdp_mode(text)
        elif stage:
            base = {"zero_stage": int(stage.group(1))}
        elif dist_opt:
            base = {"zero_stage": 1}
        elif "mics" in text:
            base = {"zero_stage": 3}  # DeepSpeed's MiCS is a ZeRO-3 variant (mics_shard_size is a stage-3 key)
        else:
            base = _fsdp_mode(text)  # "hybrid" alone: FSDP's HYBRID_SHARD, the usual meaning
        if base.get("zero_stage") == 0:
            raise _Skip(f"zero_or_fsdp {raw!r}: hybrid sharding of unsharded states (ZeRO-0) is plain data "
                        "parallelism; say DDP or name the stage")
        return _hybrid(raw, base, tp, cp, dp, per_node, [] if assumed is None else assumed)
    if _FSDP_WORDS.search(text):
        return _fsdp_mode(text)
    if stage and stage.group(1) in "0123":
        return {"zero_stage": int(stage.group(1))} if stage.group(1) != "0" else {}
    if dist_opt:
        return {"zero_stage": 1}  # Megatron's distributed optimizer shards the optimizer states: ZeRO-1
    raise _Skip(f"field 'zero_or_fsdp': {raw!r} is not none/DDP, ZeRO-1/2/3, FSDP, hybrid sharding (HSDP, "
                "MiCS) or distributed optimizer")


def _hybrid(raw: str, base: dict, tp: int, cp: int, dp: int, per_node: int, assumed: list) -> dict:
    """``base`` with the ``dp_replicate`` of a hybrid-sharding row (see :func:`_sharding`)."""
    text = raw.lower()
    ranks = dp * cp  # one copy of the states is sharded over dp·cp / dp_replicate of these
    dp_shard = _first_number(_DP_SHARD, text)
    shard = None if dp_shard is not None else _first_number(_SHARD_SIZE, text)
    replicas = _first_number(_REPLICAS, text)
    if dp_shard is not None:
        if dp_shard < 1 or dp % dp_shard:
            raise _Skip(f"zero_or_fsdp {raw!r}: dp_shard {dp_shard} does not divide dp = {dp}")
        shard = dp_shard * cp
    elif shard is not None and (shard < 1 or ranks % shard):
        raise _Skip(f"zero_or_fsdp {raw!r}: a shard group of {shard} ranks does not divide dp·cp = {ranks}")
    if replicas is not None:
        if replicas < 1 or ranks % replicas:
            raise _Skip(f"zero_or_fsdp {raw!r}: {replicas} replicas do not divide dp·cp = {ranks}")
        if shard is not None and shard * replicas != ranks:
            raise _Skip(f"zero_or_fsdp {raw!r}: shard {shard} × {replicas} replicas ≠ dp·cp = {ranks}")
    elif shard is not None:
        replicas = ranks // shard
    else:
        # PyTorch FSDP's HYBRID_SHARD default (the process group it builds): shard within a node, replicate
        # across nodes. A node holds per_node / (tp·cp) data-parallel ranks (tp and cp are the inner mesh
        # dimensions); where that covers the whole dp group, hybrid sharding is full sharding.
        if per_node % (tp * cp):
            raise _Skip(f"zero_or_fsdp {raw!r}: no shard size stated, and tp·cp = {tp * cp} does not divide the "
                        f"{per_node} devices of a node (the default shard group): state the shard size")
        local = per_node // (tp * cp)
        if local >= dp:
            assumed.append(f"dp_replicate 1 for {raw!r}: full sharding (shard group unstated, a node by FSDP "
                           f"HYBRID_SHARD's default, and all {dp} data-parallel ranks fit in one node of {per_node})")
            return base
        if dp % local:
            raise _Skip(f"zero_or_fsdp {raw!r}: no shard size stated, and the {local} data-parallel ranks of a "
                        f"{per_node}-device node do not divide dp = {dp}: state the shard size")
        replicas = dp // local
        note = (f"dp_replicate {replicas} for {raw!r}: shard group unstated, one node of {per_node} devices "
                f"({ranks // replicas} ranks), replicated across nodes (FSDP HYBRID_SHARD's default)")
        if replicas == ranks:  # a node holds one data-parallel rank: nothing left to shard
            assumed.append(note + "; one rank per copy of the states is plain data parallelism")
            return {}
        assumed.append(note)
        return {**base, "dp_replicate": replicas}
    if replicas == ranks:
        return {}  # a shard group of one rank holds every state: plain data parallelism
    if dp % replicas:
        # the run format's replicas are whole shard groups, each holding all cp ranks of its data-parallel ranks
        raise _Skip(f"zero_or_fsdp {raw!r}: {replicas} replicas do not divide dp = {dp} (each replica holds "
                    f"whole context-parallel groups)")
    return {**base, "dp_replicate": replicas} if replicas > 1 else base


# zero-bubble pipeline schedules (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism": ZB-H1, ZB-H2, ZB-V and
# the automatic ZB-1p/ZB-2p; torchtitan's InterleavedZeroBubble and ZBVZeroBubble; DeepSeek-V3's DualPipe/DualPipeV)
_ZERO_BUBBLE = re.compile(r"zero[\s_-]*bubble|\bzb[\s_-]*(?:h[\s_-]*[12]|[12][\s_-]*p|v|vpp)\b|\bzbv|dual[\s_-]*pipe")
# the kinds a row's words name → why each one is not modelled (None: ZB-H1, ZB-V and PyTorch's interleaved zero
# bubble, the run format's "zb-h1", "zb-v" and "interleaved-zb"), checked in this order
_ZB_KINDS = (
    ("ZB-VPP", re.compile(r"\bzb[\s_-]*vpp\b"),
     "ZB-VPP is the zero-bubble repository's interleaved variant, whose order this package does not have ("
     "'interleaved-zb' is PyTorch's InterleavedZeroBubble)"),
    ("interleaved zero bubble", re.compile(r"(?<!non)(?<!non[\s-])interleav"), None),
    ("ZB-V", re.compile(r"\bzb[\s_-]*v\b|\bzbv(?!pp)"), None),
    ("DualPipe", re.compile(r"dual[\s_-]*pipe"),
     "DualPipe feeds micro-batches into both ends of the pipeline, two model chunks on each rank (DualPipeV: "
     "the same in a V shape)"),
    ("ZB-H2", re.compile(r"\bzb[\s_-]*(?:h[\s_-]*2|2[\s_-]*p)\b|zero[\s_-]*bubble[\s_-]*\(?\s*h[\s_-]*2\b"),
     "ZB-H2 (and the automatic ZB-2p) holds more micro-batches in flight than 1F1B, about twice its activation "
     "memory, to fill the whole bubble"),
    ("ZB-H1", re.compile(r"\bzb[\s_-]*(?:h[\s_-]*1|1[\s_-]*p)\b|zero[\s_-]*bubble[\s_-]*\(?\s*h[\s_-]*1\b"),
     None),
)
# ZB-1p, the paper's automatic schedule within 1F1B's activation memory: ZB-H1's micro-batches in flight, its order
# searched on profiled times (counted as an assumption when read as ZB-H1)
_ZB_1P = re.compile(r"\bzb[\s_-]*1[\s_-]*p\b")
# a depth stated beside a zero-bubble name: "vpp=2", "v 2", "2 chunks", "virtual stages: 2"
_ZB_DEPTH = re.compile(r"\b(?:vpp|vp|v|chunks?|virtual[\w ]*?)\s*[=:]?\s*(\d+)"
                       r"|\b(\d+)\s*(?:model\s+)?(?:chunks|virtual)")


def _zero_bubble(raw: str, text: str, assumed: list) -> dict:
    """The schedule of a row whose ``vpp_or_schedule`` names a zero-bubble schedule: ZB-H1 → ``zb-h1`` (one model
    chunk per rank), ZB-V → ``zb-v`` (two in a V), an interleaved one (torchtitan's InterleavedZeroBubble,
    "interleaved ZB-H1") → ``interleaved-zb`` with the chunks per rank it states; any other kind, several kinds,
    none stated, or a depth the kind does not have is skipped with its reason."""
    named = [(kind, why) for kind, pattern, why in _ZB_KINDS if pattern.search(text)]
    head = f"vpp_or_schedule {raw!r}: of the zero-bubble schedules only ZB-H1, ZB-V and interleaved zero bubble are " \
           "modelled"
    if [kind for kind, _ in named][:1] == ["interleaved zero bubble"] and all(
            kind == "ZB-H1" for kind, _ in named[1:]):
        # "interleaved" qualifies ZB-H1 or ZB-1p named beside it: PyTorch's interleaved order is ZB-1p's
        named = named[:1]
    if len(named) > 1:
        raise _Skip(f"{head}; the row names several ({', '.join(kind for kind, _ in named)}): state the one it ran")
    if not named:
        raise _Skip(f"{head}; the row does not say which kind (ZB-H1, ZB-H2, ZB-V, interleaved, DualPipe): they "
                    "differ in the micro-batches in flight and the placement of model chunks")
    kind, why = named[0]
    if why is not None:
        raise _Skip(f"{head}; {why}")
    found = _ZB_DEPTH.search(text)
    stated = int(found.group(1) or found.group(2)) if found else None
    if kind == "interleaved zero bubble":
        if stated is None or stated < 2:
            raise _Skip(f"vpp_or_schedule {raw!r}: an interleaved zero-bubble schedule runs two or more model "
                        "chunks per rank, " + ("and the row does not state how many (say 'vpp=N' or 'N chunks')"
                                               if stated is None else f"but the row states {stated}"))
        if _ZB_1P.search(text):
            assumed.append("interleaved-zb for an interleaved ZB-1p (the paper's automatic schedule; PyTorch's "
                           "InterleavedZeroBubble is its fixed order)")
        return {"pipeline_schedule": "interleaved-zb", "virtual_pipeline_stages": stated}
    chunks = 2 if kind == "ZB-V" else 1
    depth = chunks if stated is None else stated
    if depth != chunks:
        placed = "two model chunks" if chunks == 2 else "one model chunk"
        raise _Skip(f"vpp_or_schedule {raw!r}: {kind} places {placed} on each rank, but the row states {depth} "
                    f"virtual stages; {kind.lower()} needs virtual_pipeline_stages {chunks}")
    if kind == "ZB-V":
        return {"pipeline_schedule": "zb-v", "virtual_pipeline_stages": 2}
    if _ZB_1P.search(text):
        assumed.append("zb-h1 for ZB-1p (the paper's automatic schedule within 1F1B's activation memory)")
    return {"pipeline_schedule": "zb-h1"}


def _schedule(row: dict, pp: int, assumed: list) -> dict:
    text = _cell(row, "vpp_or_schedule").lower()
    if pp == 1:
        return {}
    if text.isdigit():
        v = int(text)
        return {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": v} if v > 1 else \
            {"pipeline_schedule": "1f1b"}
    if _ZERO_BUBBLE.search(text):
        return _zero_bubble(_cell(row, "vpp_or_schedule"), text, assumed)
    if re.search(r"non[\s-]*interleav", text):
        return {"pipeline_schedule": "1f1b"}
    if "interleav" in text or re.search(r"\bv(?:pp?)?\b", text) or "virtual" in text:
        m = re.search(r"(?:vpp|vp|v|chunks?|virtual[\w ]*?)\s*[=:]?\s*(\d+)|(\d+)\s*(?:model\s+)?(?:chunks|virtual)",
                      text)
        if m:
            v = int(m.group(1) or m.group(2))
            if v > 1:
                return {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": v}
        assumed.append("1F1B for an interleaved schedule of unstated depth")
        return {"pipeline_schedule": "1f1b"}
    if "gpipe" in text or "fill-drain" in text or "fill drain" in text:
        return {"pipeline_schedule": "gpipe"}
    if not text or "1f1b" in text or "pipedream" in text:
        if not text:
            assumed.append("1F1B pipeline schedule (blank)")
        return {"pipeline_schedule": "1f1b"}
    raise _Skip(f"field 'vpp_or_schedule': {_cell(row, 'vpp_or_schedule')!r} is not 1F1B, GPipe, interleaved, ZB-H1, "
                "ZB-V or interleaved zero bubble")


def _strategy(row: dict, model: dict, num_gpus: int, per_node: int, assumed: list) -> dict:
    tp, pp, cp, ep = (_integer(row, k) or 1 for k in ("tp", "pp", "cp", "ep"))
    dp = _integer(row, "dp") or num_gpus // (tp * pp * cp)
    seq = model["seq_length"]
    gbs = _integer(row, "global_batch_size_seqs")
    tokens = _integer(row, "global_batch_tokens")
    if gbs is None and tokens is not None:
        if tokens % seq:
            raise _Skip(f"global_batch_tokens {tokens} is not a whole number of {seq}-token sequences")
        gbs = tokens // seq
    if gbs is None:
        raise _Skip("neither global_batch_size_seqs nor global_batch_tokens is given")
    mbs = _integer(row, "micro_batch_size")
    if mbs is None:
        ga = _integer(row, "grad_accum")
        if ga and gbs % (dp * ga) == 0:
            mbs = gbs // (dp * ga)
        else:
            mbs = 1
            assumed.append("micro_batch_size 1 (blank)")
    s: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": mbs, "global_batch_size": gbs,
                         "recompute": _recompute(row, assumed), "precision": _precision(row, assumed)}
    if cp > 1:
        s["cp"] = cp
    if ep > 1:
        s["ep"] = ep
        s.update(_expert_dispatch(row))
    if model.get("arch") == "moe":
        s.update(_capacity_factor(row))
        s.update(_expert_loop(row))
    if _flag(row, "sp"):
        s["sequence_parallel"] = True
    # a run on part of one node is that node: its data-parallel ranks all share it
    s.update(_sharding(row, tp, cp, dp, min(per_node, num_gpus), assumed))
    s.update(_schedule(row, pp, assumed))
    s["flash_attention"] = _flash_attention(row, assumed)
    return s


# DeepEP's kernels, or Megatron-Core's flex dispatcher that runs them; expert all-to-alls hidden behind another
# micro-batch's computation (Megatron-Core's overlap_moe_expert_parallel_comm, "EP A2A overlap")
_DEEPEP = re.compile(r"\bdeep[\s_-]?ep\b|\bflex\s+(?:token\s+)?dispatcher\b")
_A2A_OVERLAP = re.compile(r"overlap[\s_-]+moe[\s_-]+expert[\s_-]+parallel[\s_-]+comm"
                          r"|\b(?:ep|expert[\s_-]parallel|moe|a2a|all[\s_-]?to[\s_-]?all)\s+"
                          r"(?:a2a\s+|comm\w*\s+)?overlap"
                          r"|\boverlap(?:ped|ping)?\s+(?:the\s+)?(?:ep\s+|expert\s+|moe\s+)?"
                          r"(?:a2a|all[\s_-]?to[\s_-]?alls?)\b")


def _words(row: dict) -> str:
    """The row's free text in lower case: its framework, notes and other metric, where configs and papers name
    the dispatcher, the capacity factor and fused attention."""
    return " ".join(_cell(row, k) for k in ("framework", "notes", "other_metric")).lower()


def _expert_dispatch(row: dict) -> dict:
    """The expert-dispatch keys an expert-parallel row's words state: DeepEP (``moe_dispatcher``) and all-to-alls
    overlapped with computation (``overlap_moe_comm``); neither when the row does not say (Megatron-Core's
    defaults)."""
    text = _words(row)
    out: dict[str, Any] = {}
    if _DEEPEP.search(text):
        out["moe_dispatcher"] = "deepep"
    if _A2A_OVERLAP.search(text):
        out["overlap_moe_comm"] = True
    return out


# an expert capacity factor as configs and papers state it ("capacity factor 1.25", moe_expert_capacity_factor=2)
_CAPACITY = re.compile(r"capacity[\s_-]*factor\s*(?:of\s+|=\s*|:\s*)?(\d+(?:\.\d+)?)\b")


def _capacity_factor(row: dict) -> dict:
    """``moe_capacity_factor`` where a MoE row's words state one (GShard, Switch, Megatron-Core's
    moe_expert_capacity_factor); nothing where they do not: dropless, balanced routing."""
    hit = _CAPACITY.search(_words(row))
    return {"moe_capacity_factor": float(hit.group(1))} if hit else {}


# experts run one at a time: Megatron-Core's SequentialMLP (its default without --moe-grouped-gemm), or a stated
# "no grouped GEMM"; GroupedMLP, "grouped GEMM" and TE's grouped linear are the run format's default
_EXPERT_LOOP = re.compile(r"\bsequential[\s_-]?mlp\b|\b(?:no|without)\s+(?:the\s+)?grouped[\s_-]?gemms?\b"
                          r"|moe[\s_-]grouped[\s_-]gemm\s*[=:]\s*(?:false|0)\b")


def _expert_loop(row: dict) -> dict:
    """``moe_grouped_gemm`` false where a MoE row's words say its experts ran one at a time (SequentialMLP, no
    grouped GEMM); nothing where they do not (grouped experts, the run format's default)."""
    return {"moe_grouped_gemm": False} if _EXPERT_LOOP.search(_words(row)) else {}


def _flash_attention(row: dict, assumed: list) -> bool:
    """Whether attention was fused: as the row's text says, off for work from before FlashAttention
    (Dao et al., arXiv 2205.14135, May 2022: a year up to 2021 in the source or framework), else on."""
    text = _words(row)
    if re.search(r"\b(no|without|w/o|disabled?)\s+(flash|fused attention)", text):
        return False
    if "flash" in text or "fused attention" in text:
        return True
    years = [int(y) for y in re.findall(r"\b(?:19|20)\d\d\b", " ".join(_cell(row, k) for k in ("source", "framework")))]
    if years and max(years) <= 2021:
        return False
    assumed.append("flash_attention on (not stated)")
    return True


# ----------------------------------------------------------------- target
def megatron_flops(model: Any, global_batch_size: int, recompute_counted: bool) -> float:
    """FLOPs of one iteration as Megatron-LM counts them (Narayanan et al., SC21, Appendix).

    Every matmul is 2·m·n·k: per token and layer, twice the attention's projection weights
    (:attr:`ModelSpec.attention_params`: Q/K/V and output, 2·h·(q + 2·h_kv) + 2·q·h FLOPs with q =
    heads·head_dim, or latent attention's down and up projections), the MLP (2·h·ffn per weight matrix:
    2 matrices, 3 when gated; top-k experts plus the shared ones in a MoE layer, ``dense_ffn_hidden_size``
    in its dense layers) and attention's two s×s products in full (2·s·heads·(head_dim + v_head_dim),
    4·s·q for ordinary heads); the LM head 2·h·V per token. Backward is twice forward; a rate that counts
    the recomputed forward adds one forward of the layers (not of the head, which is not recomputed). For
    GPT-shaped models this is the paper's ``96·B·s·l·h²·(1 + s/6h + V/16lh)`` with recompute and
    ``72·B·s·l·h²·(1 + s/6h + V/12lh)`` without.

    Not :func:`~learnedperf.graph.transformer.model_flops_per_iteration`: that counts the operator
    graph (norms, activations, the embedding's table-sized backward; 1.6 % more on SC21's 1.7B row),
    while a published rate is to be converted with the convention it was counted in.

    Args:
        model: a :class:`~learnedperf.specs.ModelSpec`.
        global_batch_size: sequences per iteration.
        recompute_counted: whether the rate being converted counts the recomputed forward.
    """
    h, s, l = model.hidden_size, model.seq_length, model.num_layers
    a = model.num_attention_heads
    # a MoE layer runs top-k experts and the shared ones; its dense layers have their own width
    mlp = 2 * model.mlp_matrices * h * model.ffn_width_sum
    # the projections' weights twice; scores and context over each head's key and value widths (the paper's
    # 4·s·h with head_dim = v_head_dim = h / heads)
    layers_fwd = l * (2 * model.attention_params + 2 * s * a * (model.head_dim + model.v_head_dim)) + mlp
    head_fwd = 2 * h * model.vocab_size
    return ((4 if recompute_counted else 3) * layers_fwd + 3 * head_fwd) * s * global_batch_size


# The peak an fp8 run's MFU is a fraction of. torchtitan divides by the bf16 dense peak whatever the dtype
# (torchtitan/tools/utils.py, get_peak_flops); Composer, and so LLM Foundry, by the fp8 one (composer/callbacks/
# speed_monitor.py, GPU_AVAILABLE_FLOPS 'amp_fp8'). A row may say which: "MFU vs bf16 peak", "of fp8 peak".
_PEAK_OF = {p: re.compile(rf"{p}[\s-]*peak|peak[\s-]*(?:of\s+)?{p}|(?:against|relative to|vs\.?)\s+(?:the\s+)?{p}")
            for p in ("bf16", "fp8")}
_BF16_PEAK_FRAMEWORKS = re.compile(r"torchtitan")
_FP8_PEAK_FRAMEWORKS = re.compile(r"composer|llm[\s-]*foundry|mosaic")


def _mfu_peak_precision(row: dict, precision: str, assumed: list) -> str:
    """The precision whose data-sheet peak a row's MFU or HFU is counted against."""
    if precision != "fp8":
        return precision
    text = " ".join(_cell(row, k) for k in ("notes", "other_metric")).lower()
    for p in ("bf16", "fp8"):
        if _PEAK_OF[p].search(text):
            return p
    framework = _cell(row, "framework").lower()
    if _BF16_PEAK_FRAMEWORKS.search(framework):
        return "bf16"
    if _FP8_PEAK_FRAMEWORKS.search(framework):
        return "fp8"
    assumed.append("MFU of an fp8 run counted against the fp8 peak (the row does not say which peak)")
    return "fp8"


_RECOMPUTE_COUNTED = re.compile(r"recompute[ -]?flops|includ\w* recomput|hardware[ -]flops|\bhfu\b", re.I)


def _iteration_ms(row: dict, spec: Any, warnings: list, assumed: list) -> tuple[float, str]:
    """The measured iteration time a row implies and the column it came from (``assumed`` gets the peak an
    fp8 run's MFU was taken against where the row leaves it open)."""
    s, n = spec.strategy, spec.hardware.num_devices
    tokens = s.global_batch_size * spec.model.seq_length
    found: list[tuple[float, str]] = []
    it = _number(row, "iteration_time_s")
    if it:
        found.append((it * 1e3, "iteration_time_s"))
    for key, per in (("tokens_per_sec_total", 1), ("tokens_per_sec_per_gpu", n)):
        v = _number(row, key)
        if v:
            found.append((tokens / (v * per) * 1e3, key))
    v = _number(row, "samples_per_sec")
    if v:
        found.append((s.global_batch_size / v * 1e3, "samples_per_sec"))
    if not found:
        # the rate counts the recomputed forward where the notes say so or only an HFU is given
        counted = s.recompute == "full" and (bool(_RECOMPUTE_COUNTED.search(_cell(row, "notes"))) or (
            _number(row, "hfu_pct") is not None and _number(row, "mfu_pct") is None
            and _number(row, "tflops_per_gpu") is None))
        flops = megatron_flops(spec.model, s.global_batch_size, counted)
        label = " (recompute counted)" if counted else ""
        for key in ("tflops_per_gpu", "aggregate_pflops", "mfu_pct", "hfu_pct"):
            v = _number(row, key)
            if not v:
                continue
            if key == "tflops_per_gpu":
                rate = v * 1e12
            elif key == "aggregate_pflops":
                rate = v * 1e15 / n
            else:
                rate = v / 100 * spec.hardware.device.peak_flops(_mfu_peak_precision(row, s.precision, assumed))
            found.append((flops / (rate * n) * 1e3, key + label))
            break
    if not found:
        raise _Skip("no iteration time or throughput (iteration_time_s, tokens/s, samples/s, TFLOP/s, MFU)")
    ms, origin = found[0]
    for other, key in found[1:]:
        if abs(other / ms - 1) > 0.05:
            warnings.append(f"{key} implies {other:.0f} ms, {origin} {ms:.0f} ms: {origin} is used")
    return ms, origin


# ------------------------------------------------------------------- load
def _label(row: dict, line: int) -> str:
    rid = _cell(row, "row_id")
    return f"line {line}" + (f" (row_id {rid})" if rid else "")


def load_published(path: Path | str, strict: bool = False) -> LoadedPublished:
    """Read a published-runs table (CSV, :data:`PUBLISHED_COLUMNS`) into measured runs.

    Args:
        path: the CSV file.
        strict: raise on the first row that cannot become a run instead of skipping it.

    Raises:
        InputError: the file cannot be read, is not a CSV with a header, lacks a
            :data:`REQUIRED_COLUMNS` column, has a column of another name than :data:`PUBLISHED_COLUMNS`
            (a misspelt column would otherwise be ignored), or — with ``strict`` — has a bad row.
    """
    from ..specs import RunSpec

    path = Path(path)
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: cannot read as CSV ({getattr(exc, 'strerror', None) or exc})") from None
    if not header:
        raise InputError(f"{path}: empty file (expected a header of {', '.join(REQUIRED_COLUMNS)}, ...)")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    unknown = [c for c in header if c not in PUBLISHED_COLUMNS]
    if unknown:
        raise InputError(f"{path}: unknown column(s) {', '.join(map(repr, unknown))}; "
                         f"the columns are {', '.join(PUBLISHED_COLUMNS)}")
    out = LoadedPublished(runs=[])
    for line, row in enumerate(rows, start=2):
        if None in row:  # more cells than the header has columns
            reason = f"{len(row[None])} cell(s) more than the header's {len(header)} columns"
            if strict:
                raise InputError(f"{path}: {_label(row, line)}: {reason}")
            out.skipped.append((_label(row, line), reason))
            continue
        if not any(_cell(row, k) for k in header):
            continue  # a blank line between rows
        assumed: list[str] = []
        warnings: list[str] = []
        try:
            model = _model(row, assumed, warnings)
            num_gpus = _required_int(row, "num_gpus")
            device = _device_name(_cell(row, "gpu_type"), assumed)
            hardware, per_node = _hardware(row, device, num_gpus, assumed)
            strategy = _strategy(row, model, num_gpus, per_node, assumed)
            run = {"model": model, "hardware": hardware, "strategy": strategy,
                   "id": f"published-{path.stem}-{_cell(row, 'row_id') or line}"}
            try:
                spec = RunSpec.from_dict(run)
            except LearnedPerfError as exc:
                raise _Skip(str(exc)) from None
            ms, origin = _iteration_ms(row, spec, warnings, assumed)
        except _Skip as exc:
            if strict:
                raise InputError(f"{path}: {_label(row, line)}: {exc}") from None
            out.skipped.append((_label(row, line), str(exc)))
            continue
        run["meta"] = {"source": _cell(row, "source"), "source_locator": _cell(row, "source_locator"),
                       "framework": _cell(row, "framework"), "gpu_type": _cell(row, "gpu_type"),
                       "target_from": origin, "assumed": assumed}
        out.runs.append(MeasuredRun(run, ms, f"published:{path.name}", line))
        out.assumptions.update(assumed)
        out.warnings.extend((_label(row, line), w) for w in warnings)
    return out


__all__ = ["LoadedPublished", "PUBLISHED_COLUMNS", "REQUIRED_COLUMNS", "TARGET_SOURCES", "load_published",
           "megatron_flops"]
