"""Measured training steps: whole iterations of real models under real strategies.

A :class:`StepConfig` names a model (run-format dict), a number of processes and
a strategy in the run format's keys; :func:`measure_step` runs it and returns one
step record (exactly :data:`learnedperf.measure.records.STEP_COLUMNS`), whose
``run`` column is the run-format JSON of what ran.

Strategies, on CPU with ``torch.distributed`` over gloo (``tcp://127.0.0.1``),
one process per rank started by :func:`torch.multiprocessing.start_processes`
(``forkserver`` start method, torch preloaded; see :func:`_preload_forkserver`):

* ``single`` — one process, no process group;
* ``dp`` — :class:`torch.nn.parallel.DistributedDataParallel`, ``bucket_cap_mb =
  grad_bucket_size_MiB``, gradient accumulation under ``no_sync``;
* ``tp`` — Megatron-style tensor parallelism written in
  :mod:`learnedperf.measure.models` (column/row-parallel layers, vocabulary-parallel
  embedding, head and cross entropy); with ``dp`` the TP model is wrapped in DDP
  over the data-parallel group;
* ``pp`` — pipeline stages exchanging activations and gradients with
  ``torch.distributed`` send/recv, GPipe (all forwards, then all backwards),
  1F1B (Narayanan et al. 2021, non-interleaved), interleaved 1F1B (Megatron's:
  ``virtual_pipeline_stages`` ``v >= 2`` model chunks per rank, rank ``r`` holding
  virtual stages ``r, r+p, ...``), ZB-H1 (1F1B whose backward leaves the weight
  gradients to later ``W`` passes), ZB-V (two model chunks per rank in a V,
  ``virtual_pipeline_stages`` 2, PyTorch's ``ScheduleZBVZeroBubble`` order) or
  interleaved zero bubble (``interleaved-zb``: interleaving's chunks, PyTorch's
  ``ScheduleInterleavedZeroBubble`` order); ``global_batch_size / (dp·micro_batch_size)``
  micro-batches (a multiple of ``pp`` for the interleaved schedules); tied
  embeddings kept equal by an all-reduce between first and last stage (under ZB-V
  rank 0 holds both, as one table); with ``dp`` gradients are all-reduced in
  ``grad_bucket_size_MiB`` buckets after the pipeline flush;
* ``zero`` — ZeRO stage 1 with :class:`torch.distributed.optim.ZeroRedundancyOptimizer`
  over DDP;
* ``fsdp`` — FSDP2 ``fully_shard`` per layer and at the root: FULL_SHARD (ZeRO-3),
  or with ``zero_stage`` 2 ``reshard_after_forward=False`` (SHARD_GRAD_OP). ZeRO-2
  and ZeRO-3 are always measured on FSDP2, and their records say ``fsdp: true``.
  With ``dp_replicate`` > 1, hybrid sharding (HSDP, FSDP's HYBRID_SHARD): FSDP2 on a
  2-D device mesh ``(replicate, shard) = (dp_replicate, dp / dp_replicate)``, each
  group of ``dp / dp_replicate`` consecutive ranks sharding one copy of the states;
  gradients are reduce-scattered in the shard group every micro-batch and each shard
  all-reduced over the replicas after the last one (``set_requires_all_reduce``).
  Its records' ``strategy_kind`` stays ``'fsdp'`` (as
  :func:`learnedperf.measure.ingest.strategy_kind` names it) and their run says
  ``dp_replicate``.

Mixture-of-experts models (``arch`` ``moe``, :class:`learnedperf.measure.models.MoEFeedForward`) run with
every expert on every rank (``tp = 1``, ``ep = 1``), dropless or padded to the expert capacity of the strategy's
``moe_capacity_factor``, under any of the data-parallel and pipeline strategies above but the zero-bubble ones.

On a GPU (``StepConfig.device = "cuda"``) a step runs in one process on ``cuda:0``: weights and
micro-batches are moved there before timing, bf16 runs under CUDA's autocast, the timer waits for
the GPU (``torch.cuda.synchronize`` before and after the iteration) and peak memory is the caching
allocator's. Multi-process steps are CPU-only: their groups and meshes are built for gloo.

Timing: a barrier, then ``time.perf_counter`` around one whole iteration (every
micro-batch's forward and backward, the gradient communication and the optimizer
step); ``warmup`` untimed iterations, then ``repeats`` timed ones. The time of an
iteration is the maximum over ranks; the record keeps its median, 10th and 90th
percentile. Peak memory is the largest peak RSS over ranks.

Importing this module does not import torch.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import InputError, LearnedPerfError, SpecError
from ..specs.strategy import INTERLEAVED_SCHEDULES, V_SHAPE_SCHEDULES, ZERO_BUBBLE_SCHEDULES
from .quiet import Window, foreign_share
from .records import STEP_COLUMNS, canonical_json, host_name, now_utc, run_id

#: Architectures built as transformers from :class:`learnedperf.specs.ModelSpec` (``moe``: mixture of experts,
#: :class:`learnedperf.measure.models.MoEFeedForward`).
TRANSFORMER_ARCHS = ("gpt", "llama", "bert", "moe")

#: Architectures that are not ModelSpec archs (the simulator skips their runs).
OTHER_ARCHS = ("mlp", "cnn")

#: Defaults of the MLP's run-format model dict.
MLP_DEFAULTS = {"name": "mlp", "input_size": 1024, "hidden_size": 1024, "num_layers": 4, "num_classes": 1000}

#: Defaults of the CNN's (small ResNet) run-format model dict.
CNN_DEFAULTS = {"name": "cnn", "image_size": 32, "in_channels": 3, "base_channels": 32, "num_stages": 3,
                "blocks_per_stage": 2, "num_classes": 100}

#: Strategy keys a measured step understands, with their defaults (run-format names).
STRATEGY_DEFAULTS: dict[str, Any] = {
    "tp": 1, "pp": 1, "dp": None, "micro_batch_size": 1, "global_batch_size": None,
    "pipeline_schedule": "1f1b", "zero_stage": 0, "fsdp": False, "grad_bucket_size_MiB": 25.0,
    "precision": "fp32", "recompute": "none", "optimizer": "adam", "dp_replicate": 1,
    # a MoE model's expert capacity (None: dropless); ep is accepted at the run format's 1 only, so that a
    # config asking for expert parallelism is refused by name rather than as an unknown key
    "moe_capacity_factor": None, "ep": 1,
    # model chunks per pipeline rank: 2 for ZB-V's V, >= 2 for the interleaved schedules, 1 for the others
    "virtual_pipeline_stages": 1,
}

#: Pipeline schedules a measured step runs (:func:`chunked_schedule`): every one of the run format's. Of them, the
#: run format's ZERO_BUBBLE_SCHEDULES leave the weight gradients to ``W`` passes (``measure.models.WeightGradStore``),
#: its V_SHAPE_SCHEDULES hold two model chunks per rank in a V and its INTERLEAVED_SCHEDULES ``v >= 2`` chunks per
#: rank in Megatron's placement.
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "interleaved-zb")


# --------------------------------------------------------------------------- model dicts
def _positive_int(value: Any, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{field_name}: expected a positive integer, got {value!r}")
    return value


def complete_model_dict(model: Any) -> dict:
    """The complete run-format model dict of a measured model (defaults filled in).

    Transformers (``gpt``, ``llama``, ``bert``, ``moe``) are completed by
    :class:`~learnedperf.specs.ModelSpec`; ``mlp`` and ``cnn`` by
    :data:`MLP_DEFAULTS` / :data:`CNN_DEFAULTS`.

    Raises:
        InputError: naming the offending ``model.<field>``.
    """
    if not isinstance(model, dict):
        raise InputError(f"model: expected a run-format model dict, got {type(model).__name__}")
    arch = model.get("arch")
    if arch in TRANSFORMER_ARCHS:
        from ..specs import ModelSpec

        try:
            spec = ModelSpec.parse(model, "model")
        except SpecError as exc:
            raise InputError(str(exc)) from None
        if not spec.lm_head:
            # the harness's models end in an LM head and its loss (measure.models.TransformerLM)
            raise InputError("model.lm_head: measured steps train language models; a classification head "
                             "(lm_head false) is not built by the harness")
        return spec.to_dict()
    if arch in OTHER_ARCHS:
        defaults = MLP_DEFAULTS if arch == "mlp" else CNN_DEFAULTS
        out: dict[str, Any] = {"arch": arch, **defaults}
        for key, value in model.items():
            if key == "arch":
                continue
            if key not in defaults:
                raise InputError(f"model.{key}: unknown field of arch {arch!r} (known: {sorted(defaults)})")
            out[key] = value
        for key in defaults:
            if key == "name":
                if not isinstance(out["name"], str):
                    raise InputError("model.name: expected a string")
            else:
                _positive_int(out[key], f"model.{key}")
        return out
    raise InputError(f"model.arch: measured steps build {list(TRANSFORMER_ARCHS + OTHER_ARCHS)}, got {arch!r}")


# --------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class StepConfig:
    """One measured step: model × processes × strategy, and how to time it.

    Attributes:
        model: run-format model dict (``arch`` gpt / llama / bert / moe / mlp / cnn).
        world_size: processes (ranks).
        strategy: run-format strategy keys (see :data:`STRATEGY_DEFAULTS`): ``tp``,
            ``pp``, ``dp``, ``micro_batch_size``, ``global_batch_size``,
            ``pipeline_schedule`` ('gpipe' | '1f1b' | 'interleaved' | 'zb-h1' | 'zb-v' | 'interleaved-zb'),
            ``virtual_pipeline_stages`` (model chunks per pipeline rank: 2 for 'zb-v', >= 2 for 'interleaved' and
            'interleaved-zb', 1 otherwise), ``zero_stage`` (0-3), ``fsdp``,
            ``grad_bucket_size_MiB``, ``precision`` ('fp32' | 'bf16'), ``recompute``
            ('none' | 'full'), ``optimizer`` ('adam' | 'sgd'), ``dp_replicate`` (HSDP replicas of
            the FSDP2 states, dividing ``dp``; 1 = sharded over all of ``dp``),
            ``moe_capacity_factor`` (arch moe: expert capacity over the balanced share; None =
            dropless), ``ep`` (1 only: expert parallelism is not measured).
        warmup: untimed iterations before timing.
        repeats: timed iterations.
        threads: torch intra-op threads per process.
        seed: seed of weights and data.
        profile: also profile one extra iteration on rank 0 with torch.profiler (``per_op`` column).
        timeout_s: wall-clock limit of the whole measurement (processes are killed past it).
        learning_rate: of the optimizer; it does not change the time of a step (correctness
            checks raise it so that a wrong gradient visibly changes the next loss).
        device: ``"cpu"`` or ``"cuda"`` (one process on ``cuda:0``: multi-process steps run on CPU
            over gloo only).
    """

    model: dict
    world_size: int = 1
    strategy: dict = field(default_factory=dict)
    warmup: int = 2
    repeats: int = 5
    threads: int = 1
    seed: int = 0
    profile: bool = False
    timeout_s: float = 300.0
    learning_rate: float = 1e-4
    device: str = "cpu"

    def label(self) -> str:
        """Short human-readable description, used in progress lines and error messages."""
        name = self.model.get("name", self.model.get("arch", "?")) if isinstance(self.model, dict) else "?"
        s = self.strategy or {}
        keys = [f"{k}={s[k]}" for k in sorted(s)]
        if self.threads != 1:
            keys.append(f"threads={self.threads}")
        if self.device != "cpu":  # CPU labels (and the manifests that quote them) stay as they were
            keys.append(f"device={self.device}")
        return f"{name} world={self.world_size} " + (" ".join(keys) if keys else "default strategy")


@dataclass(frozen=True)
class StepPlan:
    """A validated :class:`StepConfig` with everything derived (what the ranks execute).

    Attributes:
        model: complete model dict.
        strategy: complete strategy (every key of :data:`STRATEGY_DEFAULTS`, ``dp`` and
            ``global_batch_size`` resolved).
        world_size, tp, pp, dp: process counts.
        num_microbatches: micro-batches per data-parallel rank per iteration.
        kind: strategy kind ('single', 'dp', 'tp', 'pp', 'zero', 'fsdp', 'tp+dp', ...).
        warmup, repeats, threads, seed, profile, timeout_s, learning_rate, device: from the config.
        label: the config's label.
    """

    model: dict
    strategy: dict
    world_size: int
    tp: int
    pp: int
    dp: int
    num_microbatches: int
    kind: str
    warmup: int
    repeats: int
    threads: int
    seed: int
    profile: bool
    timeout_s: float
    learning_rate: float
    label: str
    device: str = "cpu"

    @property
    def cuda(self) -> bool:
        """True when the step runs on the GPU."""
        return self.device == "cuda"

    @property
    def is_transformer(self) -> bool:
        """True for gpt / llama / bert / moe."""
        return self.model["arch"] in TRANSFORMER_ARCHS

    @property
    def sharded_dp(self) -> Optional[str]:
        """'zero1', 'zero2' (FSDP2 SHARD_GRAD_OP) or 'fsdp' (FULL_SHARD) when the data-parallel ranks shard
        state, else None."""
        s = self.strategy
        if s["zero_stage"] in (1, 2):
            return {1: "zero1", 2: "zero2"}[s["zero_stage"]]
        return "fsdp" if s["fsdp"] or s["zero_stage"] == 3 else None

    @property
    def dp_replicate(self) -> int:
        """Replicas of the sharded states (HSDP; 1 = sharded over all ``dp`` ranks)."""
        return self.strategy.get("dp_replicate", 1)


def plan_step(config: StepConfig) -> StepPlan:
    """Validate a config and derive what to run, before any process starts.

    Raises:
        InputError: one message naming the field (``strategy.tp``, ``strategy.dp``,
            ``strategy.pp``, ``strategy.global_batch_size``, ``model.<field>`` ...) and the config.
    """
    if not isinstance(config, StepConfig):
        raise InputError(f"expected a StepConfig, got {type(config).__name__}")
    label = config.label()

    def bad(field_name: str, message: str) -> InputError:
        return InputError(f"{field_name}: {message} (step config: {label})")

    try:
        model = complete_model_dict(config.model)
    except InputError as exc:
        raise InputError(f"{exc} (step config: {label})") from None
    world = config.world_size
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise bad("world_size", f"expected a positive integer, got {world!r}")
    if config.device not in ("cpu", "cuda"):
        raise bad("device", f"expected 'cpu' or 'cuda', got {config.device!r}")
    if config.device == "cuda" and world > 1:
        # ranks would need NCCL and one GPU each, and the strategies' groups and meshes are built for gloo
        raise bad("device", "steps on several processes are measured on CPU only (gloo); on CUDA, world_size "
                            "must be 1")
    if not isinstance(config.learning_rate, (int, float)) or not config.learning_rate > 0:
        raise bad("learning_rate", f"expected a positive number, got {config.learning_rate!r}")
    if not isinstance(config.timeout_s, (int, float)) or not config.timeout_s > 0:
        raise bad("timeout_s", f"expected a positive number, got {config.timeout_s!r}")
    for name in ("warmup", "repeats", "threads", "seed"):
        value, least = getattr(config, name), (1 if name in ("repeats", "threads") else 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise bad(name, f"expected an integer >= {least}, got {value!r}")
    if not isinstance(config.strategy, dict):
        raise bad("strategy", "expected a dict of run-format strategy keys")
    for key in config.strategy:
        if key not in STRATEGY_DEFAULTS:
            raise bad(f"strategy.{key}", f"not supported by measured steps (known: {sorted(STRATEGY_DEFAULTS)})")
    s = {**STRATEGY_DEFAULTS, **{k: v for k, v in config.strategy.items() if v is not None}}
    for key in ("tp", "pp", "micro_batch_size"):
        if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < 1:
            raise bad(f"strategy.{key}", f"expected a positive integer, got {s[key]!r}")
    tp, pp, mbs = s["tp"], s["pp"], s["micro_batch_size"]
    if world % (tp * pp):
        raise bad("strategy.tp" if world % tp else "strategy.pp",
                  f"tp·pp = {tp}·{pp} = {tp * pp} does not divide world_size = {world}")
    dp = s["dp"] if s["dp"] is not None else world // (tp * pp)
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise bad("strategy.dp", f"expected a positive integer, got {dp!r}")
    if tp * pp * dp != world:
        raise bad("strategy.dp", f"tp·pp·dp = {tp}·{pp}·{dp} = {tp * pp * dp} but world_size = {world}")
    gbs = s["global_batch_size"] if s["global_batch_size"] is not None else mbs * dp
    if isinstance(gbs, bool) or not isinstance(gbs, int) or gbs < 1:
        raise bad("strategy.global_batch_size", f"expected a positive integer, got {gbs!r}")
    if gbs % (mbs * dp):
        raise bad("strategy.global_batch_size",
                  f"{gbs} is not divisible by micro_batch_size·dp = {mbs}·{dp} = {mbs * dp}")
    sched = s["pipeline_schedule"]
    if sched not in PIPELINE_SCHEDULES:
        raise bad("strategy.pipeline_schedule", f"expected one of {list(PIPELINE_SCHEDULES)}, got {sched!r}")
    if (sched in ZERO_BUBBLE_SCHEDULES or sched in INTERLEAVED_SCHEDULES) and pp < 2:
        raise bad("strategy.pipeline_schedule", f"{sched!r} needs pp >= 2")
    if sched in ZERO_BUBBLE_SCHEDULES and s["precision"] != "fp32":
        # the deferred weight-gradient GEMMs (measure.models.WeightGradStore) are written without autocast
        raise bad("strategy.pipeline_schedule", f"{sched!r} is measured in fp32, not {s['precision']!r}")
    chunks = s["virtual_pipeline_stages"]
    problem = _chunk_count_problem(sched, chunks)
    if problem:
        raise bad("strategy.virtual_pipeline_stages", problem)
    m = gbs // (mbs * dp)
    if sched in INTERLEAVED_SCHEDULES and m % pp:
        # the run format's rule (Megatron's): interleaving runs each chunk's micro-batches in groups of pp
        raise bad("strategy.global_batch_size",
                  f"pipeline_schedule {sched!r} needs the number of micro-batches, global_batch_size / "
                  f"(micro_batch_size·dp) = {gbs} / ({mbs}·{dp}) = {m}, to be a multiple of pp={pp}")
    if s["zero_stage"] not in (0, 1, 2, 3) or isinstance(s["zero_stage"], bool):
        raise bad("strategy.zero_stage", f"expected 0, 1, 2 or 3, got {s['zero_stage']!r}")
    if not isinstance(s["fsdp"], bool):
        raise bad("strategy.fsdp", f"expected true or false, got {s['fsdp']!r}")
    if s["fsdp"] and s["zero_stage"] == 1:
        raise bad("strategy.fsdp", "FSDP has no ZeRO-1 mode (zero_stage 2: SHARD_GRAD_OP, 3: FULL_SHARD)")
    bucket = s["grad_bucket_size_MiB"]
    if isinstance(bucket, bool) or not isinstance(bucket, (int, float)) or not bucket > 0:
        raise bad("strategy.grad_bucket_size_MiB", f"expected a positive number, got {bucket!r}")
    s["grad_bucket_size_MiB"] = float(bucket)
    if s["precision"] not in ("fp32", "bf16"):
        raise bad("strategy.precision", f"measured steps run 'fp32' or 'bf16' (autocast), got {s['precision']!r}")
    if s["recompute"] not in ("none", "full"):
        raise bad("strategy.recompute", f"expected 'none' or 'full', got {s['recompute']!r}")
    if s["optimizer"] not in ("adam", "sgd"):
        raise bad("strategy.optimizer", f"expected 'adam' or 'sgd', got {s['optimizer']!r}")
    if isinstance(s["ep"], bool) or not isinstance(s["ep"], int) or s["ep"] != 1:
        raise bad("strategy.ep", f"expert parallelism is not measured (every data-parallel rank holds all experts): "
                                 f"ep must be 1, got {s['ep']!r}")
    arch = model["arch"]
    capacity = s["moe_capacity_factor"]
    if capacity is not None:
        if arch != "moe":
            raise bad("strategy.moe_capacity_factor", f"sizes the experts' inputs: it needs arch 'moe', not {arch!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, (int, float)) or not math.isfinite(capacity) \
                or not capacity > 0:
            raise bad("strategy.moe_capacity_factor", f"expected a positive finite number, got {capacity!r}")
        s["moe_capacity_factor"] = float(capacity)
    if arch in TRANSFORMER_ARCHS:
        if model.get("kv_lora_rank"):
            # the harness builds ordinary (grouped-query) attention; timing it as MLA would mislabel the record
            raise bad("model.kv_lora_rank", "measured steps do not build latent attention (MLA)")
        if arch == "moe" and tp > 1:
            # the experts are whole on every rank (measure.models.MoEFeedForward); the simulator would split them
            raise bad("strategy.tp", f"expert tensor parallelism is not measured: arch 'moe' needs tp = 1, got {tp}")
        if model.get("moe_router_num_groups", 1) > 1:
            # the router picks the top k of all experts; DeepSeek's group-limited routing is not built
            raise bad("model.moe_router_num_groups", "measured steps do not build group-limited routing: "
                                                     f"expected 1, got {model['moe_router_num_groups']}")
        if arch == "moe" and sched in ZERO_BUBBLE_SCHEDULES:
            # the experts' stacked-weight GEMMs compute their weight gradients in the backward: no W pass to defer
            raise bad("strategy.pipeline_schedule", f"{sched!r} is not measured for arch 'moe' (the experts' weight "
                                                    "gradients are not deferred to W passes)")
        heads, kv = model["num_attention_heads"], model["num_kv_heads"]
        if heads % tp:
            raise bad("strategy.tp", f"tp={tp} does not divide num_attention_heads={heads}")
        if kv % tp:
            # as the run format (specs.run): Megatron-Core splits the k/v head groups over the TP ranks
            raise bad("strategy.tp", f"tp={tp} does not divide num_kv_heads={kv}")
        if model["ffn_hidden_size"] % tp:
            raise bad("strategy.tp", f"tp={tp} does not divide ffn_hidden_size={model['ffn_hidden_size']}")
        if model["vocab_size"] % tp:
            raise bad("strategy.tp", f"tp={tp} does not divide vocab_size={model['vocab_size']} "
                                     "(the embedding and head are vocabulary-parallel)")
        head_dim = model.get("head_dim", model["hidden_size"] // heads)  # to_dict leaves the default out
        if model["position_embedding"] == "rope" and head_dim % 2:
            raise bad("model.head_dim" if "head_dim" in model else "model.hidden_size",
                      f"rotary embeddings need an even head_dim, got {head_dim}")
        if model["num_layers"] < pp * chunks:
            # every virtual stage (pp of them, pp·virtual_pipeline_stages with several chunks) holds at least one
            # layer
            raise bad("strategy.pp", f"pp={pp} exceeds num_layers={model['num_layers']}" if chunks == 1 else
                      f"pp·virtual_pipeline_stages = {pp}·{chunks} = {pp * chunks} exceeds "
                      f"num_layers={model['num_layers']}")
    else:
        if tp > 1:
            dense = [a for a in TRANSFORMER_ARCHS if a != "moe"]  # moe is measured at tp = 1 only
            raise bad("strategy.tp", f"tensor parallelism is implemented for {dense} only")
        if pp > 1:
            raise bad("strategy.pp", f"pipeline parallelism is implemented for {list(TRANSFORMER_ARCHS)} only")
        if s["recompute"] != "none":
            raise bad("strategy.recompute", f"recomputation is implemented for {list(TRANSFORMER_ARCHS)} only")
    sharded = s["fsdp"] or s["zero_stage"] > 0
    if sharded and (tp > 1 or pp > 1):
        raise bad("strategy.fsdp" if s["fsdp"] else "strategy.zero_stage",
                  "ZeRO / FSDP are measured with pure data parallelism (tp = pp = 1)")
    if sharded and dp < 2:
        raise bad("strategy.fsdp" if s["fsdp"] else "strategy.zero_stage", "needs dp >= 2 (nothing to shard)")
    replicas = s["dp_replicate"]
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise bad("strategy.dp_replicate", f"expected a positive integer, got {replicas!r}")
    if replicas > 1:
        if not (s["fsdp"] or s["zero_stage"] >= 2):
            # ZeRO-1 runs on ZeroRedundancyOptimizer, which shards over the whole group it is given
            raise bad("strategy.dp_replicate", "hybrid sharding is measured on FSDP2: it needs fsdp or "
                                               f"zero_stage 2 or 3, got zero_stage {s['zero_stage']}")
        if dp % replicas:
            raise bad("strategy.dp_replicate", f"dp_replicate={replicas} does not divide dp={dp}")
        if replicas >= dp:
            raise bad("strategy.dp_replicate", f"dp_replicate={replicas} must be less than dp={dp} (one rank per "
                                               "copy of the states is plain data parallelism)")
    s.update(dp=dp, global_batch_size=gbs)
    if world == 1:
        kind = "single"
    elif s["fsdp"] or s["zero_stage"] >= 2:
        kind = "fsdp"
    elif s["zero_stage"] > 0:
        kind = "zero"
    else:
        kind = "+".join(k for k, n in (("tp", tp), ("pp", pp), ("dp", dp)) if n > 1)
    return StepPlan(model=model, strategy=s, world_size=world, tp=tp, pp=pp, dp=dp,
                    num_microbatches=m, kind=kind, warmup=config.warmup, repeats=config.repeats,
                    threads=config.threads, seed=config.seed, profile=bool(config.profile),
                    timeout_s=float(config.timeout_s), learning_rate=float(config.learning_rate), label=label,
                    device=config.device)


def run_dict(config: StepConfig, hardware: dict) -> dict:
    """The run-format dict of a config on ``hardware`` (``num_devices`` set to the world size).

    The strategy states everything that shaped the step: parallel sizes, batch,
    pipeline schedule (with its ``virtual_pipeline_stages``, model chunks per rank: ZB-V's 2, the
    interleaved schedules' ``v``; left out at 1),
    precision, fused attention (SDPA), recomputation, ZeRO / FSDP, the gradient
    bucket, whether gradient reduction overlapped backward and a MoE model's expert
    capacity factor (left out when dropless), when dropless ``moe_grouped_gemm`` false (the
    experts run one at a time), ``fused_elementwise`` false (the models run in eager PyTorch), torch.optim's
    default ``optimizer_impl`` (foreach on a GPU, the for-loop on a CPU) with ``persistent_grads`` false (the
    gradients set to None after each step) and, with recomputation, ``checkpoint_impl`` 'non_reentrant'.
    """
    plan = plan_step(config)
    return _run_dict(plan, hardware)


def _run_dict(plan: StepPlan, hardware: dict) -> dict:
    if not isinstance(hardware, dict):
        raise InputError(f"hardware: expected a run-format hardware dict, got {type(hardware).__name__}")
    hw = dict(hardware)
    hw["num_devices"] = plan.world_size
    hw.setdefault("devices_per_node", plan.world_size)
    s = plan.strategy
    sharded = plan.sharded_dp
    # DDP (also under ZeRO-1) reduces buckets while backward runs; FSDP2 reduce-scatters per layer in
    # backward. The pipeline's data-parallel all-reduce runs after the flush, and one replica reduces nothing.
    overlap_grad = plan.dp > 1 and plan.pp == 1
    strategy = {
        "tp": plan.tp, "pp": plan.pp, "dp": plan.dp,
        "micro_batch_size": s["micro_batch_size"], "global_batch_size": s["global_batch_size"],
        "pipeline_schedule": s["pipeline_schedule"],
        # left out at 1 (the run format's default), so that runs of single-chunk schedules keep their run ids
        **({"virtual_pipeline_stages": s["virtual_pipeline_stages"]} if s["virtual_pipeline_stages"] > 1 else {}),
        "zero_stage": 3 if sharded == "fsdp" else s["zero_stage"],
        # ZeRO-2 and -3 run on FSDP2 (per-layer gathers and reduce-scatters), whatever the config said
        "fsdp": sharded in ("zero2", "fsdp"), "recompute": s["recompute"], "precision": s["precision"],
        # measure.models recomputes a layer with torch.utils.checkpoint(use_reentrant=False)
        **({"checkpoint_impl": "non_reentrant"} if s["recompute"] != "none" else {}),
        # bf16 steps run the fp32 model under torch.autocast (no bf16 weights, no master copy)
        **({"mixed_precision": "autocast"} if s["precision"] == "bf16" else {}),
        "flash_attention": True, "grad_bucket_size_MiB": s["grad_bucket_size_MiB"],
        # eager PyTorch (measure.models): RoPE and SwiGLU run one kernel per tensor operation
        "fused_elementwise": False,
        "overlap_grad_reduce": overlap_grad,
        # FSDP2 issues each all-gather in the layer's pre-forward hook and waits for it there (no
        # explicit prefetch is configured, and CPU has no side streams), so gathers are not overlapped.
        "overlap_param_gather": False if sharded in ("zero2", "fsdp") else True,
        "optimizer": s["optimizer"],
        # torch.optim's own choice of implementation (make_optimizer passes neither foreach nor fused): foreach
        # over CUDA tensors, a for-loop over CPU ones; every step ends with zero_grad(set_to_none=True)
        "optimizer_impl": "foreach" if plan.cuda else "for_loop", "persistent_grads": False,
        # left out at 1 (the run format's default): runs without hybrid sharding, and their run ids, stay as they were
        **({"dp_replicate": plan.dp_replicate} if plan.dp_replicate > 1 else {}),
        # left out when dropless (the run format's None), as the run format writes it
        **({"moe_capacity_factor": s["moe_capacity_factor"]} if s["moe_capacity_factor"] is not None else {}),
        # a dropless MoE runs its experts one at a time (MoEFeedForward._dropless); padded to capacity they run
        # as batched GEMMs, one kernel each (the run format's default, left out)
        **({"moe_grouped_gemm": False} if plan.model.get("arch") == "moe" and s["moe_capacity_factor"] is None
           else {}),
    }
    return {"model": dict(plan.model), "hardware": hw, "strategy": strategy}


# --------------------------------------------------------------------------- rank layout
def rank_coords(rank: int, tp: int, dp: int, pp: int) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of a global rank: tp varies fastest, then dp, then pp (Megatron's order)."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def global_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    """Global rank of (tp_rank, dp_rank, pp_rank); inverse of :func:`rank_coords`."""
    return tp_rank + tp * (dp_rank + dp * pp_rank)


def _chunk_count_problem(kind: str, num_chunks: Any) -> Optional[str]:
    """Why ``num_chunks`` model chunks per rank (``virtual_pipeline_stages``) do not fit schedule ``kind``, or None:
    the run format's rule, 2 in ZB-V's V, at least 2 for the interleaved schedules, 1 for the others."""
    if kind in INTERLEAVED_SCHEDULES:
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 2:
            return (f"pipeline_schedule {kind!r} places v >= 2 model chunks on each rank (virtual stages r, r+p, ...): "
                    f"expected an integer >= 2, got {num_chunks!r}")
        return None
    want = 2 if kind in V_SHAPE_SCHEDULES else 1
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks != want:
        what = "places two model chunks on each rank in a V" if want == 2 else "runs one model chunk per rank"
        return f"pipeline_schedule {kind!r} {what}: expected {want}, got {num_chunks!r}"
    return None


def chunked_schedule(kind: str, stage: int, num_stages: int, num_chunks: int,
                     num_microbatches: int) -> list[tuple[str, int, int]]:
    """The order in which one pipeline rank runs its units, as ``(op, chunk, micro-batch)``: the simulator's
    (:func:`learnedperf.graph.execution.pipeline_order`), so that what is measured is what is simulated.

    ``op`` is 'F' (forward), 'B' (backward; under a zero-bubble schedule the input gradients only) or 'W'
    (the weight gradients a zero-bubble 'B' left). ``chunk`` indexes the ``num_chunks`` model chunks of rank
    ``stage`` (``virtual_pipeline_stages``: 1 but under ZB-V and the interleaved schedules): under ZB-V chunk 0 is
    virtual stage ``stage`` and chunk 1 virtual stage ``2·num_stages - 1 - stage``; interleaved, chunk ``c`` is
    virtual stage ``c·num_stages + stage`` (:func:`learnedperf.graph.execution.rank_vstages`).

    Raises:
        InputError: an unknown schedule, or a number of chunks it does not run.
    """
    from ..graph.execution import pipeline_order

    if kind not in PIPELINE_SCHEDULES:
        raise InputError(f"strategy.pipeline_schedule: unknown schedule {kind!r}")
    problem = _chunk_count_problem(kind, num_chunks)
    if problem:
        raise InputError(f"strategy.virtual_pipeline_stages: {problem}")
    return pipeline_order(kind, num_stages, num_chunks, num_microbatches, stage)


def schedule(kind: str, stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """The order in which one pipeline stage of a single-chunk schedule runs forward ('F') and backward ('B')
    micro-batches, as ``(op, micro-batch)`` (:func:`chunked_schedule` without the chunk).

    GPipe: every forward, then every backward. 1F1B: ``num_stages - stage - 1``
    warm-up forwards, then alternate one forward and one backward, then the
    remaining backwards (at most ``num_stages - stage`` micro-batches in flight).
    ZB-H1: 1F1B whose backwards ('B') leave their weight gradients to 'W' passes.

    Raises:
        InputError: for ZB-V and the interleaved schedules, whose units need their chunk (use
            :func:`chunked_schedule`).
    """
    if kind in V_SHAPE_SCHEDULES or kind in INTERLEAVED_SCHEDULES:
        many = "two" if kind in V_SHAPE_SCHEDULES else "several"
        raise InputError(f"strategy.pipeline_schedule: {kind!r} runs {many} model chunks per rank; its order is "
                         "chunked_schedule's")
    return [(op, i) for op, _chunk, i in chunked_schedule(kind, stage, num_stages, 1, num_microbatches)]


# --------------------------------------------------------------------------- one rank
def _cuda_sync() -> Callable[[], None]:
    """``torch.cuda.synchronize`` (the step's timer waits for the GPU's queue to drain)."""
    import torch

    return torch.cuda.synchronize


def _peak_cuda_MiB() -> float:
    """Largest memory the caching allocator handed out on the GPU since the process started (MiB)."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**20


def _peak_rss_MiB() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _bucketed_all_reduce(grads: list, bucket_MiB: float, group, divide_by: int) -> None:
    """All-reduce gradients in flat buckets of at most ``bucket_MiB`` (reverse order, as DDP fills them)."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    limit = bucket_MiB * 2 ** 20
    buckets, current, size = [], [], 0
    for g in reversed(grads):
        current.append(g)
        size += g.numel() * g.element_size()
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    works = []
    for bucket in buckets:
        flat = _flatten_dense_tensors(bucket)
        works.append((dist.all_reduce(flat, group=group, async_op=True), flat, bucket))
    for work, flat, bucket in works:
        work.wait()
        flat.div_(divide_by)
        for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            g.copy_(synced)


def _new_groups(plan: StepPlan, rank: int) -> dict:
    """Create the tp, dp and tied-embedding groups (every rank creates every group, in the same order)."""
    import torch.distributed as dist

    tp, dp, pp = plan.tp, plan.dp, plan.pp
    groups: dict[str, Any] = {"tp": None, "dp": None, "embed": None}
    if tp > 1:
        for p in range(pp):
            for d in range(dp):
                ranks = [global_rank(t, d, p, tp, dp) for t in range(tp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    groups["tp"] = g
    if dp > 1:
        for p in range(pp):
            for t in range(tp):
                ranks = [global_rank(t, d, p, tp, dp) for d in range(dp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    groups["dp"] = g
    # under ZB-V the embedding and the head are both on rank 0 (one table): nothing to keep equal between ranks
    v_shape = plan.strategy["pipeline_schedule"] in V_SHAPE_SCHEDULES
    if pp > 1 and plan.is_transformer and plan.model.get("tie_embeddings") and not v_shape:
        for d in range(dp):
            for t in range(tp):
                ranks = [global_rank(t, d, 0, tp, dp), global_rank(t, d, pp - 1, tp, dp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    groups["embed"] = g
    return groups


def _build_step(plan: StepPlan, rank: int) -> tuple[Callable[[], Any], int]:
    """Build this rank's model, optimizer and data; return ``step()`` running one iteration and the
    number of parameter elements this rank holds (its shard under FSDP2).

    ``step()`` returns the iteration's mean loss (a detached tensor) on ranks that
    compute the loss (the last pipeline stage, which holds the last virtual stage when
    interleaved; under ZB-V the first, which holds it in its V), None elsewhere.
    """
    import contextlib

    import torch

    from . import models as M

    s = plan.strategy
    tp_rank, dp_rank, pp_rank = rank_coords(rank, plan.tp, plan.dp, plan.pp)
    world = plan.world_size
    groups = _new_groups(plan, rank) if world > 1 else {"tp": None, "dp": None, "embed": None}
    zero_bubble = s["pipeline_schedule"] in ZERO_BUBBLE_SCHEDULES
    num_chunks = s["virtual_pipeline_stages"]
    v_shape = s["pipeline_schedule"] in V_SHAPE_SCHEDULES
    from ..graph.execution import layers_per_vstage, rank_vstages

    counts = None
    if plan.pp > 1 and plan.is_transformer:
        # the simulator's cut: layers that do not divide go where graph.execution puts them, not to the first stages
        counts = tuple(layers_per_vstage(plan.model["num_layers"], plan.pp, num_chunks, v_shape))
    ctx = M.ParallelContext(tp_size=plan.tp, tp_rank=tp_rank, tp_group=groups["tp"], stage=pp_rank,
                            num_stages=plan.pp, weight_grads=M.WeightGradStore() if zero_bubble else None,
                            layer_counts=counts)
    if num_chunks > 1:
        # every chunk of this rank in one ModuleList (its parameters() lists a table two chunks share once)
        vstages = rank_vstages(pp_rank, plan.pp, num_chunks, v_shape)
        net = M.build_chunks(plan.model, ctx, vstages, s["recompute"], plan.seed, s["moe_capacity_factor"])
        chunks = list(net)
    else:
        net = M.build_model(plan.model, ctx, s["recompute"], plan.seed, s["moe_capacity_factor"])
        chunks = [net]
    m = plan.num_microbatches
    mbs = s["micro_batch_size"]
    # Data is a function of (seed, data-parallel rank, micro-batch): tp ranks and pipeline stages of one
    # replica see the same batch, and a run with the same global batch on one process sees the same data.
    batches = [M.make_batch(plan.model, mbs, plan.seed, dp_rank * m + i) for i in range(m)]
    if plan.cuda:
        # weights and every micro-batch live on the GPU before timing: the step moves no data from the host
        net = net.to("cuda")
        batches = [tuple(t.to("cuda") for t in batch) for batch in batches]
    bf16 = s["precision"] == "bf16"

    def autocast():
        return torch.autocast(plan.device, dtype=torch.bfloat16, enabled=bf16)

    # plain SGD, no momentum: the run format's 'sgd' keeps no optimizer state (optimizer_bytes_per_param), and the
    # operator grid times the same update; a momentum buffer would be 4 bytes a parameter the record does not say
    def make_optimizer(params):
        if s["optimizer"] == "sgd":
            return torch.optim.SGD(params, lr=plan.learning_rate)
        return torch.optim.Adam(params, lr=plan.learning_rate)

    sharded = plan.sharded_dp
    model: Any = net
    no_sync = None
    all_reduce_on = None
    if plan.dp > 1 and sharded in ("zero2", "fsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        replicas = plan.dp_replicate
        if replicas > 1:
            # FSDP2's HSDP: parameters Shard(0) over the "shard" dim, Replicate() over the "replicate" dim
            mesh = init_device_mesh("cpu", (replicas, plan.dp // replicas), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (plan.dp,))
        reshard = sharded == "fsdp"  # zero2 keeps the gathered parameters from forward to backward
        for unit in net.shard_units():
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
        optimizer = make_optimizer(net.parameters())
        if replicas > 1 and m > 1:
            # reduce-scatter every micro-batch but all-reduce the accumulated shards over the replicas once,
            # after the last one (as the simulator's hybrid sharding does); FSDP2 would all-reduce each time
            all_reduce_on = net.set_requires_all_reduce
    elif plan.dp > 1 and plan.pp == 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(net, process_group=groups["dp"], bucket_cap_mb=s["grad_bucket_size_MiB"],
                    broadcast_buffers=plan.model["arch"] == "cnn")  # only BatchNorm has buffers worth syncing
        no_sync = model.no_sync
        if sharded == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt_class = torch.optim.SGD if s["optimizer"] == "sgd" else torch.optim.Adam
            optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=opt_class, lr=plan.learning_rate,
                                                process_group=groups["dp"])
        else:
            optimizer = make_optimizer(net.parameters())
    else:
        optimizer = make_optimizer(net.parameters())

    if plan.pp == 1:
        def step():
            total = None
            for i, (x, t) in enumerate(batches):
                sync = no_sync is None or i == m - 1
                if all_reduce_on is not None:
                    all_reduce_on(i == m - 1)
                with (contextlib.nullcontext() if sync else no_sync()):
                    with autocast():
                        loss = model(x, t)
                    (loss / m).backward()
                total = loss.detach() if total is None else total + loss.detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return total / m
        return step, _local_numel(net)

    return (_pipeline_step(plan, chunks, optimizer, batches, groups, (tp_rank, dp_rank, pp_rank), autocast),
            _local_numel(net))


def _local_numel(net) -> int:
    """Parameter elements held by this rank: the local shard of FSDP2's DTensor parameters."""
    return sum(int(p.to_local().numel()) if hasattr(p, "to_local") else int(p.numel()) for p in net.parameters())


def _pipeline_step(plan: StepPlan, chunks: list, optimizer, batches, groups, coords, autocast) -> Callable[[], Any]:
    """One pipeline rank's iteration under any of :data:`PIPELINE_SCHEDULES`, with blocking receives.

    ``chunks`` are the rank's model chunks in chunk order: one stage, under ZB-V the virtual stages ``r``
    and ``2p-1-r`` of ``2p``, interleaved the virtual stages ``r, r+p, ...`` of ``p·v``
    (:func:`learnedperf.graph.execution.rank_vstages`). A chunk's input comes from the
    batch (virtual stage 0), from the rank holding the previous virtual stage, or, when this rank holds that
    one too (ZB-V's rank ``p-1``), from its own other chunk without communication; gradients go back the same
    way. Under a zero-bubble schedule a backward ('B') leaves its linear layers' weight gradients in the
    chunks' shared :class:`~learnedperf.measure.models.WeightGradStore`, and that (chunk, micro-batch)'s
    ``W`` computes them.

    Sends are posted with ``isend`` and completed before the iteration ends:
    gloo's send is a rendezvous (it waits for the matching receive), so a
    blocking send would deadlock 1F1B, where both neighbours send at once.
    A message's tag names what it carries, ``(2·chunk + backward)·m + micro-batch`` of the sending chunk
    (F chunk 0 ``i``, B chunk 0 ``m+i``, F chunk 1 ``2m+i``, B chunk 1 ``3m+i``, ...), so that two messages
    between the same ranks never match each other's receive.
    """
    import torch
    import torch.distributed as dist

    from ..graph.execution import rank_vstages, stage_of

    tp_rank, dp_rank, pp_rank = coords
    s = plan.strategy
    m, pp = plan.num_microbatches, plan.pp
    v_shape = s["pipeline_schedule"] in V_SHAPE_SCHEDULES
    last_vstage = pp * len(chunks) - 1
    vstages = rank_vstages(pp_rank, pp, len(chunks), v_shape)
    act_dtype = torch.bfloat16 if s["precision"] == "bf16" else torch.float32
    shape = (s["micro_batch_size"], plan.model["seq_length"], plan.model["hidden_size"])
    order = chunked_schedule(s["pipeline_schedule"], pp_rank, pp, len(chunks), m)
    # one list of the chunks' parameters, a table two chunks hold (ZB-V's tied embedding) once
    params = list({id(p): p for c in chunks for p in c.parameters() if p.requires_grad}.values())
    # a tied head on another rank than the embedding (the last stage; interleaved, chunk v-1 of rank p-1, the
    # embedding being in chunk 0 of rank 0) is a copy whose gradient is summed with the embedding's over the
    # "embed" group; ZB-V's rank 0 holds both as one table (measure.models.build_chunks) and has no such group
    tied = next((t for c in chunks if (t := c.tied_parameter()) is not None), None)
    store = chunks[0].ctx.weight_grads

    def peer(vstage: int) -> tuple[Optional[int], int]:
        """Global rank holding ``vstage`` (None: this one) and its chunk there: ``vstage // pp``, interleaved or
        in a V."""
        r = stage_of(vstage, pp, v_shape)
        return (None if r == pp_rank else global_rank(tp_rank, dp_rank, r, plan.tp, plan.dp)), vstage // pp

    # per chunk: where its input comes from and where its output goes (None at the ends of the model)
    prev = [peer(vs - 1) if vs > 0 else None for vs in vstages]
    nxt = [peer(vs + 1) if vs < last_vstage else None for vs in vstages]

    def tag(backward: bool, chunk: int, i: int) -> int:
        return (2 * chunk + int(backward)) * m + i

    def take(side, local: dict, key: tuple[int, int], backward: bool, i: int) -> Any:
        """What the rank and chunk ``side`` hand this rank for micro-batch ``i``: this rank's own other chunk
        leaves it in ``local[key]``, another rank sends it."""
        src, src_chunk = side
        if src is None:
            return local.pop(key)
        buf = torch.empty(shape, dtype=act_dtype)
        dist.recv(buf, src=src, tag=tag(backward, src_chunk, i))
        return buf

    def give(side, local: dict, key: tuple[int, int], tensor: Any, backward: bool, c: int, i: int,
             sends: list) -> None:
        """Hand ``tensor`` of chunk ``c``, micro-batch ``i``, to the rank and chunk ``side``: in ``local[key]`` when
        that is this rank's own other chunk, else with an ``isend`` completed before the iteration ends."""
        dst, _ = side
        if dst is None:
            local[key] = tensor
        else:
            sends.append((dist.isend(tensor, dst=dst, tag=tag(backward, c, i)), tensor))

    def step():
        inputs: dict[tuple[int, int], Any] = {}
        outputs: dict[tuple[int, int], Any] = {}
        # hand-overs between this rank's own chunks: activations forward, gradients back
        local_acts: dict[tuple[int, int], Any] = {}
        local_grads: dict[tuple[int, int], Any] = {}
        deferred: dict[tuple[int, int], list] = {}
        sends = []
        total = None
        for op, c, i in order:
            x, t = batches[i]
            vs = vstages[c]
            if op == "W":
                store.run(deferred.pop((c, i)))
            elif op == "F":
                if prev[c] is not None:
                    # a leaf of this chunk's graph, whose gradient goes back to the previous virtual stage
                    x = inputs[(c, i)] = take(prev[c], local_acts, (vs, i), False, i).requires_grad_(True)
                with autocast():
                    out = chunks[c](x, t if vs == last_vstage else None)
                if vs == last_vstage:
                    outputs[(c, i)] = out / m
                    total = out.detach() if total is None else total + out.detach()
                else:
                    out = out.to(act_dtype)  # what travels is what the next stage receives
                    outputs[(c, i)] = out
                    give(nxt[c], local_acts, (vs + 1, i), out.detach().contiguous(), False, c, i, sends)
            else:
                if vs == last_vstage:
                    outputs.pop((c, i)).backward()
                else:
                    outputs.pop((c, i)).backward(take(nxt[c], local_grads, (vs, i), True, i))
                if store is not None:
                    deferred[(c, i)] = store.take()
                if prev[c] is not None:
                    give(prev[c], local_grads, (vs - 1, i), inputs.pop((c, i)).grad.contiguous(), True, c, i, sends)
        for work, _ in sends:
            work.wait()
        if tied is not None and groups["embed"] is not None:
            dist.all_reduce(tied.grad, group=groups["embed"])
        if plan.dp > 1:
            _bucketed_all_reduce([p.grad for p in params if p.grad is not None], s["grad_bucket_size_MiB"],
                                 groups["dp"], plan.dp)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return None if total is None else total / m

    return step


def _self_time_us(evt, cuda: bool) -> float:
    """An event's self time (µs): the device's for a CUDA step, else the host's.

    Recent torch (2.4 on) names it ``self_device_time_total`` and keeps ``self_cuda_time_total`` as a deprecated
    alias, which may go; an older torch has only the old name. The new name is read first, the old one otherwise,
    so that profiling works on whichever torch the GPU machine has.
    """
    if not cuda:
        return evt.self_cpu_time_total
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(evt, name, None)
        if value is not None:
            return value
    raise AttributeError(f"profiler event {getattr(evt, 'key', evt)!r} has no self device time "
                         "(self_device_time_total / self_cuda_time_total)")


def _profile_rows(prof, iterations: int, cuda: bool = False) -> list[dict]:
    """Per-op rows of a profile: self time per iteration, the GPU's for a CUDA step (its host time is the
    launches only)."""
    rows = []
    for evt in prof.key_averages():
        total_us = _self_time_us(evt, cuda)
        self_ms = total_us / 1000.0 / iterations
        if self_ms > 0:
            rows.append({"name": evt.key, "calls": int(round(evt.count / iterations)),
                         "self_time_ms": round(self_ms, 6)})
    rows.sort(key=lambda r: -r["self_time_ms"])
    return rows


def _run_rank(plan: StepPlan, rank: int, iterations: Optional[int] = None) -> dict:
    """Build, warm up and time the step on one rank; return its local results.

    ``iterations`` (loss mode) runs that many iterations without warm-up and
    reports every loss; otherwise ``warmup`` + ``repeats`` with the timed ones kept.
    ``local_params`` is the number of parameter elements the rank holds (its shard under FSDP2).
    """
    world = plan.world_size
    dist = None
    if world > 1:
        import torch.distributed as dist
    step, local_params = _build_step(plan, rank)
    warmup = 0 if iterations is not None else plan.warmup
    count = iterations if iterations is not None else plan.repeats
    times_s, losses = [], []
    window = Window()
    sync = _cuda_sync() if plan.cuda else (lambda: None)
    for it in range(warmup + count):
        if dist is not None:
            dist.barrier()  # every rank starts the iteration together, so max over ranks is the iteration
        if it == warmup:
            # the timed iterations are the window of the quiet-machine check (measure.quiet)
            window = Window()
        # on the GPU the host only queues kernels: the iteration ends when the device has run them
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        t1 = time.perf_counter()
        if it >= warmup:
            times_s.append(t1 - t0)
            losses.append(loss)
    timed = window.elapsed()
    # before profiling, whose bookkeeping is not part of the step
    peak_MiB = _peak_cuda_MiB() if plan.cuda else _peak_rss_MiB()
    per_op: list[dict] = []
    if plan.profile and iterations is None:
        if dist is not None:
            dist.barrier()
        if rank == 0:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.cuda else [])
            try:
                with profile(activities=activities) as prof:
                    step()
                    sync()
                per_op = _profile_rows(prof, 1, plan.cuda)
            except (RuntimeError, AttributeError, OSError) as exc:
                if world > 1:
                    raise  # the other ranks wait on this iteration's collectives: the run fails as a whole
                # one process: the timed iterations are done and measured; a profiler the machine cannot run
                # (no CUPTI in a VM, say) costs the per_op column, said on stderr (a lent GPU's log), not the record
                print(f"learnedperf measure: profiling {plan.label} failed ({type(exc).__name__}: {exc}); "
                      "its record is kept without per_op", file=sys.stderr)
                per_op = []
        else:
            step()  # the other ranks must take part in the profiled iteration's communication
    return {"rank": rank, "times_s": times_s, "peak_memory_MiB": peak_MiB, "timed": timed,
            "local_params": local_params,
            "losses": None if losses and losses[0] is None else [float(v) for v in losses],
            "per_op": per_op}


def _worker(rank: int, plan: StepPlan, port: int, out_path: str, iterations: Optional[int]) -> None:
    """Entry point of one spawned rank: process group, measurement, results to ``out_path`` (rank 0)."""
    import warnings

    # torch.distributed's deprecation warnings (all_gather_into_tensor, ...) would flood every progress line.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(plan.threads)
    world = plan.world_size
    try:
        if world > 1:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=max(30.0, plan.timeout_s)))
        local = _run_rank(plan, rank, iterations)
        if world > 1:
            gathered: list = [None] * world
            dist.all_gather_object(gathered, local)
        else:
            gathered = [local]
        if rank == 0:
            tmp = out_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(gathered, fh)
            os.replace(tmp, out_path)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(text)


#: Modules the fork server imports once, so that every rank starts in milliseconds with them loaded.
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "torch.distributed", "torch.nn.parallel",
                      "torch.distributed.optim", "torch.distributed.fsdp", "torch.distributed.device_mesh",
                      "torch.utils.checkpoint", "torch.profiler", "learnedperf.measure.models"]

_preloaded = False


def _preload_forkserver() -> None:
    """Ask multiprocessing's fork server to import torch before it forks any rank.

    Ranks start with :func:`torch.multiprocessing.start_processes` and the
    ``forkserver`` method: like ``spawn`` they share nothing with this process (no
    thread pools, no process group), but they are forked from a server that has
    imported torch once, so a rank starts in tens of milliseconds instead of the
    seconds two concurrent ``import torch`` take on a small CPU. Has no effect if
    the fork server already runs (then ranks import torch themselves).
    """
    global _preloaded
    if not _preloaded:
        import multiprocessing

        multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
        _preloaded = True


def _execute(plan: StepPlan, iterations: Optional[int] = None) -> list[dict]:
    """Run the plan in ``world_size`` spawned processes; return every rank's results (rank order).

    Raises:
        LearnedPerfError: a rank failed (its error's last line and the config are named) or the
            run passed ``timeout_s`` (every process is killed first).
    """
    import torch.multiprocessing as mp

    _preload_forkserver()
    with tempfile.TemporaryDirectory(prefix="learnedperf-step-") as tmp:
        out_path = os.path.join(tmp, "result.json")
        pctx = mp.start_processes(_worker, args=(plan, _free_port(), out_path, iterations), nprocs=plan.world_size,
                                  join=False, start_method="forkserver")
        deadline = time.monotonic() + plan.timeout_s
        try:
            while not pctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise LearnedPerfError(f"measured step timed out after {plan.timeout_s:.0f} s "
                                           f"(step config: {plan.label}); all {plan.world_size} processes killed")
        except mp.ProcessRaisedException as exc:
            raise LearnedPerfError(f"measured step failed on rank {exc.error_index} (step config: {plan.label}): "
                                   f"{_last_line(exc.msg)}") from None
        except mp.ProcessExitedException as exc:
            raise LearnedPerfError(f"measured step: rank {exc.error_index} exited with code {exc.exit_code} "
                                   f"(step config: {plan.label})") from None
        finally:
            for p in pctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(timeout=10)
        try:
            with open(out_path, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, json.JSONDecodeError):
            raise LearnedPerfError(f"measured step finished without results (step config: {plan.label})") from None


def _run_in_process(plan: StepPlan, iterations: Optional[int]) -> list[dict]:
    """One rank in this process (world size 1), restoring torch's thread count afterwards."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(plan.threads)
    try:
        return [_run_rank(plan, 0, iterations)]
    finally:
        torch.set_num_threads(saved)


# --------------------------------------------------------------------------- public API
def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (``q`` in 0..100) of a non-empty list (numpy's default method)."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _device_of(hardware: dict) -> tuple[str, dict]:
    device = hardware.get("device")
    if isinstance(device, dict):
        return str(device.get("name", "unknown")), device
    if isinstance(device, str):
        from ..specs import resolve_hardware

        try:
            spec = resolve_hardware({**hardware, "num_devices": hardware.get("num_devices", 1)})
        except SpecError as exc:
            raise InputError(str(exc)) from None
        return spec.device.name, spec.device.to_dict()
    raise InputError("hardware.device: required (a DeviceSpec dict or a catalog name)")


def measure_step(config: StepConfig, hardware: dict, progress: Optional[Callable[[str], None]] = None,
                 quiet: Optional[dict] = None) -> dict:
    """Run one configuration and return its step record (exactly the STEP_COLUMNS keys).

    Args:
        config: what to run and how to time it.
        hardware: run-format hardware dict of the machine (``device`` descriptor,
            ``devices_per_node``, link figures); ``num_devices`` is set to the world size.
        progress: called with a one-line message when the step starts and ends.
        quiet: when given, updated with the quiet-machine check of the timed iterations
            (:func:`learnedperf.measure.quiet.foreign_share`: the share of the machine's CPUs
            that other processes used meanwhile, and whether that makes the record contended).

    Raises:
        InputError: an invalid config or a run that does not validate (before anything starts).
        LearnedPerfError: a rank failed or the measurement timed out.
    """
    plan = plan_step(config)
    run = _run_dict(plan, hardware)
    from ..specs import RunSpec, resolve_hardware

    try:
        if plan.is_transformer:
            RunSpec.from_dict(run)
        else:  # the simulator's specs have no MLP / CNN: check the hardware part only
            resolve_hardware(run["hardware"])
    except SpecError as exc:
        raise InputError(f"{exc} (step config: {plan.label})") from None
    device_name, device = _device_of(hardware)
    if progress:
        progress(f"measuring {plan.label} [{plan.kind}]")
    t_start = time.perf_counter()
    ranks = _execute(plan)
    # An iteration lasts until its slowest rank finishes.
    per_iter_ms = [max(r["times_s"][i] for r in ranks) * 1e3 for i in range(plan.repeats)]
    per_op = next((r["per_op"] for r in ranks if r["rank"] == 0), [])
    if quiet is not None:
        rank0 = next(r for r in ranks if r["rank"] == 0)["timed"]  # /proc/stat is machine-wide: one rank's read
        quiet.update(foreign_share(rank0["busy_s"], sum(r["timed"]["cpu_s"] for r in ranks), rank0["wall_s"]))
    record = {
        "run_id": run_id(run),
        "run": canonical_json(run),
        "model_name": str(plan.model.get("name", plan.model["arch"])),
        "arch": plan.model["arch"],
        "strategy_kind": plan.kind,
        "world_size": plan.world_size,
        "iteration_time_ms": statistics.median(per_iter_ms),
        "iteration_p10_ms": percentile(per_iter_ms, 10),
        "iteration_p90_ms": percentile(per_iter_ms, 90),
        "repeats": plan.repeats,
        "warmup": plan.warmup,
        "peak_memory_MiB": max(r["peak_memory_MiB"] for r in ranks),
        "per_op": json.dumps(per_op),
        "device_name": device_name,
        "device": canonical_json(device),
        "backend": "gloo" if plan.world_size > 1 else "none",
        "threads": plan.threads,
        "host": host_name(),
        "source": "measured",
        "measured_at": now_utc(),
    }
    assert set(record) == set(STEP_COLUMNS)
    if progress:
        progress(f"done {plan.label}: {record['iteration_time_ms']:.1f} ms/iter "
                 f"({time.perf_counter() - t_start:.1f} s wall)")
    return record


def train_losses(config: StepConfig, iterations: int = 2, in_process: bool = True) -> list[float]:
    """Losses of ``iterations`` training iterations of a config (mean over micro-batches and replicas).

    For correctness checks: the same model, seed and global batch give the same
    losses under every strategy (up to float rounding). World size 1 runs in this
    process when ``in_process``; larger worlds spawn processes as
    :func:`measure_step` does.
    """
    plan = plan_step(config)
    if iterations < 1:
        raise InputError(f"iterations: expected >= 1, got {iterations}")
    ranks = _run_in_process(plan, iterations) if (plan.world_size == 1 and in_process) else _execute(plan, iterations)
    with_loss = [r["losses"] for r in ranks if r["losses"] is not None]
    if not with_loss:
        raise LearnedPerfError(f"no rank reported a loss (step config: {plan.label})")
    return [sum(ls[i] for ls in with_loss) / len(with_loss) for i in range(iterations)]


# --------------------------------------------------------------------------- the grid
#: Models of the measurement grid: three families at four sizes (≈1.5M to ≈50M parameters, seq 64-512),
#: a small mixture of experts (Llama-like layers whose MLPs route each token to 2 of 8 experts of width 512,
#: ≈18M parameters, ≈8M active), an MLP and a small ResNet at two sizes each. Heads, kv heads, ffn and
#: vocabularies divide by 4 so that tp = 2 and 4 are valid (the MoE model is measured at tp = 1).
GRID_MODELS: dict[str, dict] = {
    "gpt-tiny": {"arch": "gpt", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                 "vocab_size": 8192, "seq_length": 64},
    "gpt-small": {"arch": "gpt", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                  "vocab_size": 8192, "seq_length": 128},
    "gpt-medium": {"arch": "gpt", "num_layers": 6, "hidden_size": 384, "num_attention_heads": 8,
                   "vocab_size": 16384, "seq_length": 256},
    "gpt-large": {"arch": "gpt", "num_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
                  "vocab_size": 32000, "seq_length": 256},
    "llama-tiny": {"arch": "llama", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                   "num_kv_heads": 2, "vocab_size": 8192, "seq_length": 64},
    "llama-small": {"arch": "llama", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                    "num_kv_heads": 4, "vocab_size": 8192, "seq_length": 128},
    "llama-medium": {"arch": "llama", "num_layers": 6, "hidden_size": 384, "num_attention_heads": 8,
                     "num_kv_heads": 4, "vocab_size": 16384, "seq_length": 256},
    "llama-large": {"arch": "llama", "num_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
                    "num_kv_heads": 4, "vocab_size": 24576, "seq_length": 256},
    "bert-tiny": {"arch": "bert", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                  "vocab_size": 8192, "seq_length": 128},
    "bert-small": {"arch": "bert", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                   "vocab_size": 8192, "seq_length": 256},
    "bert-medium": {"arch": "bert", "num_layers": 6, "hidden_size": 384, "num_attention_heads": 8,
                    "vocab_size": 16384, "seq_length": 512},
    "bert-large": {"arch": "bert", "num_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
                   "vocab_size": 16384, "seq_length": 512},
    "moe-small": {"arch": "moe", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4,
                  "num_experts": 8, "moe_top_k": 2, "ffn_hidden_size": 512, "vocab_size": 8192, "seq_length": 256},
    "mlp-small": {"arch": "mlp", "input_size": 512, "hidden_size": 1024, "num_layers": 4, "num_classes": 1000},
    "mlp-large": {"arch": "mlp", "input_size": 1024, "hidden_size": 2048, "num_layers": 6, "num_classes": 1000},
    "cnn-small": {"arch": "cnn", "image_size": 32, "in_channels": 3, "base_channels": 16, "num_stages": 3,
                  "blocks_per_stage": 2, "num_classes": 100},
    "cnn-medium": {"arch": "cnn", "image_size": 64, "in_channels": 3, "base_channels": 32, "num_stages": 3,
                   "blocks_per_stage": 2, "num_classes": 100},
}


def grid_model(name: str) -> dict:
    """The run-format model dict of a grid model (its ``name`` included)."""
    if name not in GRID_MODELS:
        raise InputError(f"model: unknown grid model {name!r} (known: {sorted(GRID_MODELS)})")
    return {"name": name, **GRID_MODELS[name]}


def _timing_for(name: str) -> dict:
    # Iterations of large models take seconds on a small CPU: fewer of them keeps a config to a few seconds.
    size = name.split("-")[1]
    return {"large": {"warmup": 1, "repeats": 3}, "medium": {"warmup": 1, "repeats": 4}}.get(
        size, {"warmup": 2, "repeats": 5})


#: GPU-sized models of the CUDA grid, shaped like published models so that their steps are ones the
#: predictor is asked about: GPT-2 medium (Radford et al. 2019: 24 layers, d 1024, 16 heads, 1,024 tokens;
#: vocabulary padded to 50,304 as nanoGPT pads it), BERT-large (Devlin et al. 2019: 24 layers, d 1024, 16 heads,
#: 512 tokens, 30,522 word pieces) and TinyLlama-1.1B (its config.json: 22 layers, d 2048, 32 heads, 4 KV
#: heads, FFN 5,632, 32,000 tokens; 2,048 positions). The first four layers of Llama 3 8B (its config.json: d 4096,
#: 32 heads, 8 KV heads, FFN 14,336, 128,256 tokens; 4,096 of its 8,192 positions) put the GEMMs, fused attention
#: and vocabulary of today's models in a step, at the sizes a large model's layers have: 1.92B parameters.
GPU_GRID_MODELS: dict[str, dict] = {
    "gpt2-medium-like": {"arch": "gpt", "num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                         "vocab_size": 50304, "seq_length": 1024},
    "bert-large-like": {"arch": "bert", "num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                        "vocab_size": 30522, "seq_length": 512},
    "tinyllama-1.1b-like": {"arch": "llama", "num_layers": 22, "hidden_size": 2048, "num_attention_heads": 32,
                            "num_kv_heads": 4, "ffn_hidden_size": 5632, "vocab_size": 32000, "seq_length": 2048},
    "llama-3-8b-4-layers-like": {"arch": "llama", "num_layers": 4, "hidden_size": 4096, "num_attention_heads": 32,
                                 "num_kv_heads": 8, "ffn_hidden_size": 14336, "vocab_size": 128256,
                                 "seq_length": 4096},
}

#: GPU-sized models measured in bf16 alone, at the front of the grid: the steps a lent GPU's minutes are
#: spent on first. Their fp32 weights, gradients and Adam states alone take 1.92B × 16 bytes = 31 GB: on a GPU
#: without room for them a step fails in its own process, is listed in the manifest, and the grid goes on
_GPU_GRID_FIRST = ("llama-3-8b-4-layers-like",)


def gpu_step_grid(quick: bool = False) -> list[StepConfig]:
    """The configurations measured on one GPU (``device="cuda"``, one process each).

    ``quick=False``: the CPU grid's single-process transformers in fp32 and bf16 (small, launch-bound
    steps), its MoE model in bf16 (dropless) and the GPU-sized :data:`GPU_GRID_MODELS` at micro-batches 1-8
    in fp32 and bf16, with full recompute and with gradient accumulation, after the large layers of
    ``_GPU_GRID_FIRST`` in bf16 at micro-batches 1 and 2 and with full recompute: 49 configs; the GPU-sized
    models' micro-batch-4 steps in fp32 and bf16 (6) are profiled too (``per_op``). ``quick=True``: two
    small configs.
    """
    def cfg(name: str, profile: bool = False, **strategy) -> StepConfig:
        if name in GPU_GRID_MODELS:
            return StepConfig({"name": name, **GPU_GRID_MODELS[name]}, 1, strategy, warmup=2, repeats=5,
                              device="cuda", profile=profile)
        return StepConfig(grid_model(name), 1, strategy, warmup=3, repeats=10, device="cuda")

    if quick:
        return [cfg("gpt-tiny"), cfg("llama-small", precision="bf16")]
    small = [cfg(f"{fam}-{size}", precision=p) for fam in ("gpt", "llama", "bert")
             for size in ("tiny", "small", "medium", "large") for p in ("fp32", "bf16")]
    small.append(cfg("moe-small", precision="bf16"))  # the CPU grid's MoE model, dropless
    first = [cfg(name, precision="bf16", **extra) for name in _GPU_GRID_FIRST
             for extra in ({"micro_batch_size": 1}, {"micro_batch_size": 2},
                           {"micro_batch_size": 2, "recompute": "full"})]
    sized = []
    for name in GPU_GRID_MODELS:
        if name in _GPU_GRID_FIRST:
            continue
        for p in ("fp32", "bf16"):
            for mbs in (1, 4):
                # micro-batch 4 also profiles one more iteration (the per_op column: each kernel's device time),
                # so that a step's miss can be laid on its kernels (one iteration: a second or less each)
                sized.append(cfg(name, profile=mbs == 4, precision=p, micro_batch_size=mbs))
        sized.append(cfg(name, precision="bf16", micro_batch_size=8))
        sized.append(cfg(name, precision="bf16", micro_batch_size=4, recompute="full"))
        sized.append(cfg(name, precision="bf16", micro_batch_size=2, global_batch_size=4))
    # taken in turns, so that a time budget that runs out (a lent GPU's minutes) leaves some of each: the
    # GPU-sized steps (compute-bound, what training runs) and the small ones (launch-bound: the kernel floor)
    out = first + [c for pair in itertools.zip_longest(sized, small) for c in pair if c is not None]
    return out


def step_grid(quick: bool = False, device: str = "cpu") -> list[StepConfig]:
    """The configurations measured for the project's data set (``device="cuda"``: :func:`gpu_step_grid`).

    ``quick=False``: 166 configs (110 on several processes) — single-process (fp32, bf16, full recompute,
    larger micro-batches, gradient accumulation, 2 threads; the MoE model dropless and with expert capacity
    factors 1 and 2), DDP with several bucket sizes (and of the dropless MoE model), tensor, pipeline (GPipe,
    1F1B, interleaved, ZB-H1, ZB-V and interleaved zero bubble), ZeRO-1/2 and FSDP on 2 processes, and
    dp / tp / pp / tp+dp / pp+dp / tp+pp / FSDP on 4 processes (which oversubscribe
    a 2-core machine; ``threads`` records 1 per process), among them 4 hybrid-sharded
    (HSDP, ``dp_replicate`` 2: FULL_SHARD and ZeRO-2, one with gradient accumulation). ZB-V: 5 configs on
    2 processes (the models ZB-H1 runs there) and 2 on 4 (GPT- and Llama-large, whose 8 layers fill its 8
    virtual stages). Interleaved 1F1B and its interleaved-zero-bubble twin, fp32, one layer per virtual stage:
    GPT- and Llama-small at pp 2, v 2 and GPT-medium at pp 2, v 3 (4 micro-batches), Llama-large at pp 4, v 2
    (8 micro-batches).
    ``quick=True``: four small configs, one of them on 2 processes, for a smoke test.
    """
    if device == "cuda":
        return gpu_step_grid(quick)
    if device != "cpu":
        raise InputError(f"device: expected 'cpu' or 'cuda', got {device!r}")

    def cfg(name: str, world: int = 1, threads: int = 1, **strategy) -> StepConfig:
        return StepConfig(grid_model(name), world, strategy, threads=threads, **_timing_for(name))

    if quick:
        return [cfg("gpt-tiny"), cfg("llama-tiny", precision="bf16"), cfg("gpt-tiny", 2, grad_bucket_size_MiB=1.0),
                cfg("mlp-small", micro_batch_size=32)]
    families = ("gpt", "llama", "bert")
    sizes = ("tiny", "small", "medium", "large")
    out: list[StepConfig] = []
    # --- one process
    for fam in families:
        for size in sizes:
            out.append(cfg(f"{fam}-{size}"))
            out.append(cfg(f"{fam}-{size}", precision="bf16"))
        for size in sizes[:3]:
            out.append(cfg(f"{fam}-{size}", recompute="full"))
        out.append(cfg(f"{fam}-tiny", micro_batch_size=4))
        out.append(cfg(f"{fam}-small", micro_batch_size=2))
        out.append(cfg(f"{fam}-small", global_batch_size=4))
        out.append(cfg(f"{fam}-small", threads=2))
    for name in ("mlp-small", "mlp-large", "cnn-small", "cnn-medium"):
        mbs = 64 if name.startswith("mlp") else 16
        out.append(cfg(name, micro_batch_size=mbs))
        out.append(cfg(name, micro_batch_size=mbs, precision="bf16"))
    # a mixture of experts: dropless, and every expert padded to 1x and 2x its balanced share of the tokens
    out.append(cfg("moe-small"))
    for capacity in (1.0, 2.0):
        out.append(cfg("moe-small", moe_capacity_factor=capacity))
    # --- two processes
    for fam in families:
        for size in sizes[:3]:
            for bucket in (1.0, 25.0):
                out.append(cfg(f"{fam}-{size}", 2, grad_bucket_size_MiB=bucket))
            out.append(cfg(f"{fam}-{size}", 2, tp=2))
        out.append(cfg(f"{fam}-small", 2, grad_bucket_size_MiB=5.0))
        out.append(cfg(f"{fam}-large", 2, tp=2))
        out.append(cfg(f"{fam}-small", 2, tp=2, precision="bf16"))
        # BERT-medium's 512-token pipeline would take half a minute per config; its small size stands in.
        for size in ("small",) if fam == "bert" else ("small", "medium"):
            for sched in ("gpipe", "1f1b", "zb-h1"):
                out.append(cfg(f"{fam}-{size}", 2, pp=2, global_batch_size=4, pipeline_schedule=sched))
            # ZB-V's 4 virtual stages: 1 layer each of the small models, 2-2-1-1 of the medium ones
            out.append(cfg(f"{fam}-{size}", 2, pp=2, global_batch_size=4, pipeline_schedule="zb-v",
                           virtual_pipeline_stages=2))
        out.append(cfg(f"{fam}-tiny", 2, pp=2, global_batch_size=8, pipeline_schedule="1f1b"))
        if fam != "bert":
            # interleaving's 2·2 virtual stages, one layer each, and its zero-bubble twin (4 micro-batches: a
            # multiple of pp)
            for sched in INTERLEAVED_SCHEDULES:
                out.append(cfg(f"{fam}-small", 2, pp=2, global_batch_size=4, pipeline_schedule=sched,
                               virtual_pipeline_stages=2))
        out.append(cfg(f"{fam}-small", 2, zero_stage=1, grad_bucket_size_MiB=25.0))
        out.append(cfg(f"{fam}-small", 2, zero_stage=2, fsdp=True))
        out.append(cfg(f"{fam}-small", 2, fsdp=True))
    for sched in INTERLEAVED_SCHEDULES:
        # three chunks per rank: GPT-medium's 6 layers over 2·3 virtual stages
        out.append(cfg("gpt-medium", 2, pp=2, global_batch_size=4, pipeline_schedule=sched,
                       virtual_pipeline_stages=3))
    out.append(cfg("gpt-medium", 2, zero_stage=1))
    out.append(cfg("gpt-medium", 2, fsdp=True))
    out.append(cfg("llama-small", 2, fsdp=True, precision="bf16", recompute="full"))
    out.append(cfg("gpt-large", 2, grad_bucket_size_MiB=25.0))
    for name in ("mlp-small", "mlp-large", "cnn-small", "cnn-medium"):
        mbs = 64 if name.startswith("mlp") else 16
        out.append(cfg(name, 2, micro_batch_size=mbs))
    out.append(cfg("mlp-large", 2, micro_batch_size=64, fsdp=True))
    out.append(cfg("cnn-small", 2, micro_batch_size=16, zero_stage=1))
    out.append(cfg("moe-small", 2))  # DDP of a dropless MoE: each rank routes its own micro-batch
    # --- four processes (oversubscribing two cores)
    for fam in ("gpt", "llama"):
        out.append(cfg(f"{fam}-small", 4))
        out.append(cfg(f"{fam}-small", 4, tp=4))
        out.append(cfg(f"{fam}-small", 4, pp=4, global_batch_size=4, pipeline_schedule="1f1b"))
        out.append(cfg(f"{fam}-small", 4, pp=4, global_batch_size=4, pipeline_schedule="zb-h1"))
        # ZB-V over 4 ranks has 8 virtual stages, one layer each of the large models (the small ones have 4);
        # 8 micro-batches reach its steady state, which needs 2·pp - 1 = 7
        out.append(cfg(f"{fam}-large", 4, pp=4, global_batch_size=8, pipeline_schedule="zb-v",
                       virtual_pipeline_stages=2))
        out.append(cfg(f"{fam}-small", 4, tp=2))
        out.append(cfg(f"{fam}-small", 4, pp=2, global_batch_size=8,
                       pipeline_schedule="1f1b" if fam == "gpt" else "gpipe"))
    out.append(cfg("gpt-small", 4, pp=4, global_batch_size=4, pipeline_schedule="gpipe"))
    for sched in INTERLEAVED_SCHEDULES:
        # Llama-large's 8 layers over 4·2 virtual stages, 8 micro-batches (two groups of pp per chunk)
        out.append(cfg("llama-large", 4, pp=4, global_batch_size=8, pipeline_schedule=sched,
                       virtual_pipeline_stages=2))
    out.append(cfg("gpt-small", 4, tp=2, pp=2, global_batch_size=4))
    out.append(cfg("llama-medium", 4, tp=2, pp=2, global_batch_size=4, pipeline_schedule="gpipe"))
    out.append(cfg("bert-small", 4, tp=4))
    out.append(cfg("gpt-small", 4, fsdp=True))
    # hybrid sharding (HSDP): two replicas of the states, each sharded over two ranks; the last one accumulates
    # two micro-batches (reduce-scatter each, one all-reduce over the replicas)
    out.append(cfg("gpt-small", 4, fsdp=True, dp_replicate=2))
    out.append(cfg("gpt-small", 4, zero_stage=2, fsdp=True, dp_replicate=2))
    out.append(cfg("llama-medium", 4, fsdp=True, dp_replicate=2))
    out.append(cfg("llama-small", 4, fsdp=True, dp_replicate=2, global_batch_size=8))
    return out


def measure_grid(configs: list[StepConfig], hardware: dict,
                 progress: Optional[Callable[[str], None]] = None) -> list[dict]:
    """Measure every config in order and return their records (stops at the first failure)."""
    out = []
    for i, config in enumerate(configs):
        def tagged(msg: str, i=i) -> None:
            if progress:
                progress(f"[{i + 1}/{len(configs)}] {msg}")
        out.append(measure_step(config, hardware, tagged))
    return out
