"""A run: model × hardware × strategy, validated as a whole."""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import Field

from ..errors import SpecError
from ._base import Spec, key_text
from .hardware import HardwareSpec, resolve_hardware
from .model import ModelSpec, resolve_model
from .strategy import EXPERT_DISPATCH_DEFAULTS, Strategy

_TOP_LEVEL = {"model", "hardware", "strategy", "id", "run_id", "name", "meta"}


def run_id_text(value: Any) -> Optional[str]:
    """A run's ``id`` as the text it is echoed with: a string as it is, a whole number as its decimal
    digits (its JSON text), None when absent.

    Raises:
        SpecError: any other value (an object, a list, a fraction, a boolean), named under ``id``: its
            ``str()`` would be a Python repr the client never sent.
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise SpecError("id", f"must be a string (or a whole number), got {type(value).__name__}")


def echoed_id(run: Any) -> dict:
    """``{"id": text}`` of a run (a run-format dict or a :class:`RunSpec`) whose id is valid (:func:`run_id_text`),
    else ``{}``: what an error entry for the run echoes. A Python repr of an invalid id is never echoed (the
    client never sent it); the entry's index or line still says which run failed."""
    raw = run.get("id", run.get("run_id")) if isinstance(run, dict) else getattr(run, "id", None)
    try:
        text = run_id_text(raw)
    except SpecError:
        return {}
    return {} if text is None else {"id": text}


class RunSpec(Spec):
    """One training run in the DESIGN.md run format, fully resolved.

    Build it with :meth:`from_dict` (accepts catalog names, inline specs and
    HuggingFace configs); ``to_dict`` writes everything inline so that the
    result re-parses to an equal spec.
    """

    model: ModelSpec
    hardware: HardwareSpec
    strategy: Strategy
    id: Optional[str] = None
    meta: dict[str, Any] = Field(default_factory=dict)

    # ------------------------------------------------------------- building
    @classmethod
    def from_dict(cls, data: Any, cache: Optional["SpecCache"] = None) -> "RunSpec":
        """Validate a run-format dict; every inconsistency raises one SpecError naming the field.

        ``cache`` (a :class:`SpecCache`) resolves each distinct model and hardware value once
        across many calls, which is most of the cost when a batch repeats them.
        """
        if isinstance(data, RunSpec):
            return data
        if not isinstance(data, dict):
            raise SpecError("", f"a run must be a JSON object, got {type(data).__name__}")
        for key in data:
            if key not in _TOP_LEVEL:
                raise SpecError(key_text(key), "unknown field (a run has model, hardware, strategy, id, meta)")
        for key in ("model", "hardware"):
            if key not in data:
                raise SpecError(key, "required field is missing")
        if cache is None:
            model, hardware = resolve_model(data["model"]), resolve_hardware(data["hardware"])
        else:
            model, hardware = cache.model(data["model"]), cache.hardware(data["hardware"])
        raw_strategy = data.get("strategy", {})
        if raw_strategy is None:
            raw_strategy = {}
        strategy = Strategy.parse(raw_strategy, "strategy")
        strategy = _complete_strategy(model, hardware, strategy)
        meta = data.get("meta", {}) or {}
        if not isinstance(meta, dict):
            raise SpecError("meta", "expected a JSON object")
        run_id = run_id_text(data.get("id", data.get("run_id")))
        return cls.model_construct(model=model, hardware=hardware, strategy=strategy, id=run_id, meta=meta)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        """Parse one run from JSON text."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError("", f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        """Inline, JSON-compatible form of the run (the model's and the strategy's keys as their ``to_dict`` write
        them)."""
        out = super().to_dict()
        out["model"] = self.model.to_dict()
        out["strategy"] = self.strategy.to_dict()
        if not out.get("meta"):
            out.pop("meta", None)
        return out

    # -------------------------------------------------------------- derived
    @property
    def num_microbatches(self) -> int:
        """Micro-batches each pipeline processes per iteration (gradient accumulation steps)."""
        s = self.strategy
        return s.global_batch_size // (s.micro_batch_size * s.dp)

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens consumed by one iteration."""
        return self.strategy.global_batch_size * self.model.seq_length


class SpecCache:
    """Resolved models and hardware by their input value, for parsing many runs.

    Keys are the input itself (a catalog name) or its canonical JSON; only successful
    resolutions are kept (a bad value raises every time, with the same message). At most
    ``max_entries`` of each are kept, the oldest dropped first, so that a long-running
    service does not grow without bound.
    """

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self._models: dict[str, ModelSpec] = {}
        self._hardware: dict[str, HardwareSpec] = {}

    @staticmethod
    def _key(value: Any) -> Optional[str]:
        if isinstance(value, str):
            return "s:" + value
        if isinstance(value, dict):
            # the repr of a decoded JSON object names every key and value (as does a spec object's)
            # and costs a tenth of json.dumps; equal dicts in another key order only cost one more
            # resolution
            return "r:" + repr(value)
        return None  # anything else is resolved without caching (and reported by the resolver)

    def _get(self, store: dict, value: Any, resolve: Any) -> Any:
        key = self._key(value)
        if key is None:
            return resolve(value)
        hit = store.get(key)
        if hit is None:
            hit = resolve(value)
            if len(store) >= self.max_entries:
                store.pop(next(iter(store)))
            store[key] = hit
        return hit

    def model(self, value: Any) -> ModelSpec:
        """``resolve_model(value)``, once per distinct value."""
        return self._get(self._models, value, resolve_model)

    def hardware(self, value: Any) -> HardwareSpec:
        """``resolve_hardware(value)``, once per distinct value."""
        return self._get(self._hardware, value, resolve_hardware)


def _complete_strategy(model: ModelSpec, hw: HardwareSpec, s: Strategy) -> Strategy:
    """Derive dp / global batch and check every cross-field constraint."""
    n = hw.num_devices
    mp = s.tp * s.pp * s.cp
    dp = s.dp
    if dp is None:
        if n % mp:
            field = next((f"strategy.{k}" for k, v in (("tp", s.tp), ("pp", s.pp), ("cp", s.cp)) if n % v),
                         "strategy.dp")
            raise SpecError(field, f"tp·pp·cp = {s.tp}·{s.pp}·{s.cp} = {mp} does not divide "
                                           f"num_devices = {n}")
        dp = n // mp
    if mp * dp != n:
        raise SpecError("strategy.dp", f"tp·pp·dp·cp = {s.tp}·{s.pp}·{dp}·{s.cp} = {mp * dp} "
                                       f"but hardware.num_devices = {n}")
    gbs = s.global_batch_size if s.global_batch_size is not None else s.micro_batch_size * dp
    if gbs % (s.micro_batch_size * dp):
        raise SpecError("strategy.global_batch_size",
                        f"{gbs} is not divisible by micro_batch_size·dp = {s.micro_batch_size}·{dp}")
    m = gbs // (s.micro_batch_size * dp)
    heads, kv = model.num_attention_heads, model.num_kv_heads
    if heads % s.tp:
        raise SpecError("strategy.tp", f"tp={s.tp} does not divide num_attention_heads={heads} of {model.name}")
    for key in ("ffn_hidden_size", "dense_ffn_hidden_size", "moe_shared_ffn_hidden_size"):
        width = getattr(model, key)
        if width % s.tp:
            raise SpecError("strategy.tp", f"tp={s.tp} does not divide {key}={width}")
    # Megatron-Core splits the key/value head groups over the TP ranks as it does the heads
    # (num_query_groups_per_partition = divide(num_query_groups, tp), which asserts divisibility): none is
    # replicated. Latent attention (MLA) holds num_kv_heads = heads, so the heads' check covers it.
    if kv % s.tp:
        raise SpecError("strategy.tp", f"tp={s.tp} does not divide num_kv_heads={kv} of {model.name}")
    v = s.virtual_pipeline_stages
    if model.num_layers < s.pp * v:
        raise SpecError("strategy.pp", f"pp·virtual_pipeline_stages = {s.pp * v} exceeds "
                                       f"num_layers = {model.num_layers}")
    # layers that do not divide over pp·v go to the middle ranks (graph.execution.chunk_layout): the
    # first and last, which hold the embedding and the LM head, get fewer, as Llama 3 405B's 126 layers
    # over 16 stages did (Llama Team 2024, arXiv 2407.21783, section 3.3.2)
    if s.interleaved:
        # Megatron's rule; PyTorch's InterleavedZeroBubble also runs other counts, in rounds of more than pp
        # micro-batches each, which are not modelled
        if m % s.pp:
            raise SpecError("strategy.global_batch_size",
                            f"the {s.pipeline_schedule!r} schedule needs the number of micro-batches ({m}) "
                            f"to be a multiple of pp={s.pp}")
    if s.cp > 1 and model.seq_length % (2 * s.cp):
        raise SpecError("strategy.cp", f"seq_length={model.seq_length} is not divisible by 2·cp={2 * s.cp}")
    if s.sequence_parallel and model.seq_length % (s.tp * s.cp):
        raise SpecError("strategy.sequence_parallel",
                        f"seq_length={model.seq_length} is not divisible by tp·cp={s.tp * s.cp}")
    if s.moe_capacity_factor is not None and not model.is_moe:
        raise SpecError("strategy.moe_capacity_factor", f"moe_capacity_factor={s.moe_capacity_factor} sizes the "
                                                        f"experts' inputs; {model.name} has no experts")
    if not s.moe_grouped_gemm and not model.is_moe:
        raise SpecError("strategy.moe_grouped_gemm", f"moe_grouped_gemm=False runs experts one at a time; "
                                                     f"{model.name} has no experts")
    if s.ep > 1:
        if not model.is_moe:
            raise SpecError("strategy.ep", f"ep={s.ep} needs a mixture-of-experts model; {model.name} has none")
        if model.num_experts % s.ep:
            raise SpecError("strategy.ep", f"ep={s.ep} does not divide num_experts={model.num_experts}")
        if (dp * s.cp) % s.ep:
            raise SpecError("strategy.ep", f"ep={s.ep} must divide dp·cp={dp * s.cp}")
    else:
        for key, default in EXPERT_DISPATCH_DEFAULTS.items():
            value = getattr(s, key)
            if value != default:
                raise SpecError(f"strategy.{key}", f"{key}={value!r} moves tokens between expert-parallel ranks: "
                                                   "it needs ep > 1")
    if s.dp_replicate > 1:
        # the replicas are whole shard groups, each holding all cp ranks (torchtitan's mesh order:
        # replicate, shard, cp, tp) and, with experts, whole expert groups
        if dp % s.dp_replicate:
            raise SpecError("strategy.dp_replicate", f"dp_replicate={s.dp_replicate} does not divide dp={dp}")
        if s.dp_replicate == dp * s.cp:
            raise SpecError("strategy.dp_replicate", f"dp_replicate={s.dp_replicate} = dp·cp leaves one rank per "
                                                     "copy of the states: that is plain data parallelism "
                                                     "(zero_stage 0, dp_replicate 1)")
        if (dp * s.cp // s.ep) % s.dp_replicate:
            raise SpecError("strategy.dp_replicate", f"dp_replicate={s.dp_replicate} does not divide the expert "
                                                     f"data-parallel size dp·cp/ep = {dp * s.cp // s.ep}")
    if hw.device.peak_tflops.get(s.precision) is None:
        raise SpecError("strategy.precision", f"device {hw.device.name} has no {s.precision} math")
    if s.interleaved and s.pp < 2:
        raise SpecError("strategy.pipeline_schedule", "interleaving needs pp >= 2")
    if s.zero_bubble and s.pp < 2:
        raise SpecError("strategy.pipeline_schedule", "a zero-bubble schedule needs pp >= 2")
    return s.model_copy(update={"dp": dp, "global_batch_size": gbs})
