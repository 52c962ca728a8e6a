"""Seeded, stratified sampling of valid runs over model × hardware × strategy.

The ``i``-th run of a seed depends only on ``(seed, i)``: each index has its own
random stream (seeded from the sha256 of ``"seed:index"``) and draws candidates
from it until one is valid (``RunSpec.from_dict`` accepts it) and, unless
``keep_oom``, fits in device memory. Generation can therefore be split into
shards, spread over processes or Dask workers, killed and resumed, and always
give the same runs.

What is covered, and how:

* **model family** — stratified exactly: index ``i`` has family
  ``FAMILIES[i % 4]`` (gpt, llama, bert, moe);
* **model size** — half catalog models of that family, half inline
  architectures of a random size (log-uniform parameter count between what
  the cluster makes sensible and what it can hold), so that shapes no catalog
  has appear;
* **device** — uniform over every catalog device; a share as a named catalog
  cluster, a share as an inline, perturbed copy (``synthetic-<base>-<k>``: other
  peak, bandwidth and memory) so that unseen devices exist; node size and link
  bandwidths drawn where the catalog has none;
* **cluster size** — ``2^k`` devices with ``k`` uniform in 0..14 (1 to 16,384),
  some ``3·2^k`` (as the 3,072-GPU SC21 runs);
* **strategy** — tp, pp (gpipe / 1f1b / interleaved / zero bubble H1, ZB-V and interleaved), dp, cp, ep (MoE; with
  DeepEP's dispatch or all-to-alls overlapped, a third of the time each; experts padded to a capacity factor of 1-2 in
  30 % of MoE runs), ZeRO 0-3,
  FSDP, hybrid sharding (a third of the sharded runs whose data-parallel group leaves a node: mostly
  one copy of the states per node, as FSDP's HYBRID_SHARD, else any valid copy count), recompute
  none / selective / full, sequence parallelism, every precision the device supports
  (bf16/fp16 a quarter of the time as torch.autocast over fp32 weights, else with fp32
  master weights), micro-batch size and number of micro-batches; a share as forward-only
  (inference / evaluation) steps, the kind of NeuSight's measured inference runs.

Choices that keep generation fast and the simulator on safe ground, on purpose:
pipelines of 16 / 32 / 64 stages are drawn rarely (about 1.5 %, 0.15 %, 0.1 % of
the runs of seed 0: simulating one costs ~pp² units, 30-400 ms, against ~3 ms for
a typical run); ZeRO-3 / FSDP only with pp <= 4 (as in practice: DeepSpeed refuses
ZeRO-3 with pipelines); unoverlapped gradient reduction never with ZeRO-3/FSDP
(the simulator of version 0.1.0 deadlocks on it).

A candidate that does not fit is redrawn with less memory-hungry settings (higher
ZeRO stage, full recompute, smaller micro-batch) up to three times, then from
scratch. Memory is checked exactly (the simulator's ``peak_memory`` of the
compiled run, on schedules shortened to the warm-up that sets the peak: see
:func:`learnedperf.simulate.memory.memory_microbatches`), after a cheap lower bound has
rejected hopeless candidates without compiling them (:func:`states_lower_bound_GiB`).

Each sampled run carries ``"id": "gen-<seed>-<index>"``, so run ids (the hash of the
run) are unique across indices and seeds by construction; ``config_id`` (the hash
without the id) identifies the configuration itself.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from ..errors import InputError, LearnedPerfError, SpecError

SAMPLER_VERSION = "13"
"""Version of the sampling distribution; a change gives other runs for the same seed."""

FAMILIES = ("gpt", "llama", "bert", "moe")
"""Model families, in the order of the index stratification (``FAMILIES[i % 4]``)."""

MAX_DEVICES = 16384
"""Largest cluster the sampler draws."""

MAX_ATTEMPTS = 2000
"""Candidates drawn for one index before giving up (a sampler bug, never expected)."""

#: Sequence lengths and vocabularies of inline architectures, per family.
_SEQ = {"gpt": (1024, 2048, 2048, 4096, 8192), "llama": (2048, 4096, 4096, 8192), "bert": (128, 256, 512, 512),
        "moe": (1024, 2048, 4096, 4096, 8192)}
_VOCAB = {"gpt": (50257, 50304, 51200), "llama": (32000, 32000, 128256), "bert": (30522,),
          "moe": (32000, 50257, 128256)}
_PP_WEIGHTS = {1: 4.0, 2: 3.0, 4: 3.0, 8: 2.0, 16: 0.4, 32: 0.08, 64: 0.03}
_MAX_PP_ZERO3 = 4
_PRECISION_WEIGHTS = {"bf16": 0.45, "fp16": 0.2, "fp8": 0.12, "tf32": 0.1, "fp32": 0.13}
#: share of bf16/fp16 runs drawn as torch.autocast (PyTorch AMP, FSDP and HuggingFace users) rather than
#: Megatron/DeepSpeed master weights: a sampling choice for coverage, not a measured share
_AUTOCAST_SHARE = 0.25
#: share of interleaved draws kept to chunk counts that divide the layers, where one does: a sampling
#: choice for coverage (the rest train the uneven layout), not a measured share
_EVEN_INTERLEAVING_SHARE = 0.6
#: share of sharded runs spanning nodes drawn with hybrid sharding, and of those the share sharded within a
#: node (FSDP HYBRID_SHARD's default): sampling choices for coverage, not measured shares
_HYBRID_SHARE = 0.3
_HYBRID_NODE_SHARE = 0.6
#: share of runs drawn as forward-only (inference / evaluation) steps: a sampling choice so that the
#: simulated pre-training covers the structure of the measured inference runs, not a measured share
_FORWARD_ONLY_SHARE = 0.08
#: shares of expert-parallel runs drawn with DeepEP's dispatch and with all-to-alls overlapped: sampling
#: choices so that both appear in training, not measured shares
_DEEPEP_SHARE = 0.3
_OVERLAP_MOE_SHARE = 0.3
#: share of MoE runs drawn with padded expert capacity, and the factors drawn (GShard's 2.0, Switch's 1.0-1.25,
#: Megatron-Core's moe_expert_capacity_factor): sampling choices so that capacity appears in training, not
#: measured shares
_CAPACITY_SHARE = 0.3
_CAPACITY_FACTORS = (1.0, 1.25, 1.5, 2.0)
#: share of 1F1B pipelines (without layer-by-layer gathers) drawn as zero bubble H1 instead: a sampling choice
#: so that the split backward appears in training, not a measured share
_ZB_H1_SHARE = 0.3
#: share of interleaved pipelines of two chunks per rank (without layer-by-layer gathers) drawn as ZB-V instead:
#: a sampling choice so that the V placement appears in training, not a measured share
_ZB_V_SHARE = 0.5
#: share of the other interleaved pipelines (without layer-by-layer gathers) drawn as interleaved zero bubble
#: instead: a sampling choice so that the split backward over interleaved chunks appears in training
_INTERLEAVED_ZB_SHARE = 0.3
#: share of runs with RoPE, a gated or written-out activation or attention without a fused kernel drawn in eager
#: PyTorch (``fused_elementwise`` false: Hugging Face and learnedperf measure's models), trained as PyTorch's own loop
#: trains them (torch.optim's default implementation, gradients set to None after each step): a sampling choice so
#: that eager chains appear in training
_EAGER_SHARE = 0.2
#: share of runs with recomputation drawn with the non-reentrant checkpoint (``checkpoint_impl``: PyTorch's
#: checkpoint_wrapper and learnedperf measure's models): a sampling choice so that its host cost appears in training
_NON_REENTRANT_SHARE = 0.3
_BYTES_PER_PARAM = 18.0  # bf16 weights 2 + fp32 grads 4 + fp32 master 4 + two Adam moments 8 (ZeRO paper §3.1)


@dataclass
class Sample:
    """One sampled run: its index, the run-format dict and what was needed to find it.

    Attributes:
        index: the sample index.
        run: run-format dict (``model``, ``hardware``, ``strategy``, ``id``).
        spec: the validated :class:`~learnedperf.specs.RunSpec`.
        graph: the compiled :class:`~learnedperf.graph.execution.ExecutionGraph` (reused by the
            generator for the graph store), compiled with
            :func:`learnedperf.simulate.memory.memory_microbatches` micro-batches: its schedules are
            shortened, everything else is the run's.
        fits_in_memory: whether the peak memory fits the device.
        attempts: candidates drawn for this index (1 = the first was taken).
        rejections: reason → number of candidates rejected before this one.
    """

    index: int
    run: dict
    spec: Any
    graph: Any
    fits_in_memory: bool
    attempts: int
    rejections: dict[str, int] = field(default_factory=dict)


def index_rng(seed: int, index: int) -> random.Random:
    """The random stream of one sample index (independent of every other index)."""
    digest = hashlib.sha256(f"learnedperf-sampler-{SAMPLER_VERSION}:{seed}:{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as a non-negative int, or InputError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"{name}: expected a non-negative integer, got {seed!r}")
    return seed


# ---------------------------------------------------------------- catalog views
_CATALOG: dict[str, Any] = {}


def _catalog() -> dict[str, Any]:
    """Catalog models by family (with parameter counts), devices and clusters by device (cached)."""
    if _CATALOG:
        return _CATALOG
    from ..catalog import get_cluster, get_device, get_model, names
    from ..specs import ModelSpec

    models: dict[str, list[tuple[str, int]]] = {f: [] for f in FAMILIES}
    for name in names("models"):
        spec = ModelSpec.parse(get_model(name), "model")
        models[spec.arch].append((name, spec.num_params()))
    devices = {name: get_device(name) for name in names("devices")}
    clusters: dict[str, list[str]] = {}
    for name in names("clusters"):
        clusters.setdefault(get_cluster(name)["device"], []).append(name)
    _CATALOG.update(models=models, devices=devices, device_names=sorted(devices), clusters=clusters)
    return _CATALOG


def _weighted(rng: random.Random, options: dict) -> Any:
    keys = list(options)
    return rng.choices(keys, weights=[options[k] for k in keys])[0]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------- hardware
def _draw_hardware(rng: random.Random) -> tuple[dict, dict, str]:
    """(run-format hardware dict without num_devices, device descriptor, device type)."""
    cat = _catalog()
    base = rng.choice(cat["device_names"])
    device = dict(cat["devices"][base])
    clusters = cat["clusters"].get(base, [])
    r = rng.random()
    if clusters and r < 0.4:
        return {"cluster": rng.choice(clusters)}, device, base
    if r > 0.88:
        # an unseen device: the base device's descriptor with other throughput, bandwidth and memory
        k = rng.randrange(1_000_000)
        f_peak = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
        f_bw = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
        peaks = {p: (None if v is None else round(v * f_peak, 3)) for p, v in device["peak_tflops"].items()}
        device = {key: value for key, value in device.items() if key not in ("sources", "name")}
        device.update(name=f"synthetic-{base}-{k:06d}", peak_tflops={p: v for p, v in peaks.items() if v is not None},
                      memory_bandwidth_GBps=round(device["memory_bandwidth_GBps"] * f_bw, 1),
                      memory_GiB=float(rng.choice((16, 24, 32, 48, 64, 80, 96, 128, 141, 192))))
        hw: dict[str, Any] = {"device": device}
    else:
        hw = {"device": base}
    dpn = device.get("devices_per_node") or rng.choice((4, 8, 72))
    if rng.random() < 0.2:
        dpn = rng.choice((1, 2, 4, 8, 16))
    hw["devices_per_node"] = dpn
    # the catalog gives no network bandwidth for bare devices (and a few lack a node link): draw one
    if device.get("intra_node_bandwidth_GBps") is None or rng.random() < 0.15:
        hw["intra_node_bandwidth_GBps"] = rng.choice((32.0, 64.0, 100.0, 200.0, 300.0, 450.0, 900.0))
    hw["inter_node_bandwidth_GBps"] = rng.choice((6.25, 12.5, 25.0, 50.0, 100.0))
    return hw, device, base


def _draw_num_devices(rng: random.Random, dpn: int) -> int:
    n = 2 ** rng.randrange(15)
    if n >= 4 and rng.random() < 0.12:
        n = 3 * n // 4  # 3·2^k (e.g. 3072 = 3·1024)
    if n > dpn and n % dpn:
        n = dpn * max(1, n // dpn)
    return n


# ---------------------------------------------------------------------- model
def _draw_model(rng: random.Random, family: str, num_devices: int, memory_GiB: float) -> Any:
    """A catalog name or an inline architecture of ``family`` sized for ``num_devices`` devices."""
    cat = _catalog()
    # at most what fully sharded states could hold (leaving room for activations); at least a model
    # that gives each device some work (large clusters with tiny models are rare in practice)
    hi = max(2e7, min(1.2e12, 0.4 * num_devices * memory_GiB * 2**30 / _BYTES_PER_PARAM))
    lo = min(max(5e6, 3e6 * num_devices ** 0.8), hi / 4)
    fitting = [name for name, p in cat["models"][family] if lo / 4 <= p <= hi]
    if fitting and rng.random() < 0.5:
        return rng.choice(fitting)
    target = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return _inline_model(rng, family, target)


def _inline_model(rng: random.Random, family: str, params: float) -> dict:
    """An inline architecture of about ``params`` parameters."""
    head_dim = rng.choice((64, 64, 128, 128, 96)) if family != "bert" else 64
    moe = family == "moe"
    experts = rng.choice((4, 8, 8, 16, 32, 64, 128)) if moe else 1
    freq = rng.choice((1, 1, 2)) if moe else 1
    # parameters per layer ≈ c·h²: 12 (dense 4h MLP), ~12 for llama's 8/3·h SwiGLU, + experts for MoE
    per_layer = 12.0 + (experts * 8.0 / freq if moe else 0.0)
    aspect = math.exp(rng.uniform(math.log(24), math.log(200)))  # hidden / layers
    h = (params * aspect / per_layer) ** (1 / 3)
    h = max(head_dim * 2, int(round(h / head_dim)) * head_dim)
    layers = max(2, min(160, int(round(params / (per_layer * h * h)))))
    if moe and freq == 2 and layers % 2:
        layers += 1
    heads = h // head_dim
    model: dict[str, Any] = {"name": f"syn-{family}-{layers}x{h}", "arch": family, "num_layers": layers,
                             "hidden_size": h, "num_attention_heads": heads,
                             "vocab_size": rng.choice(_VOCAB[family]), "seq_length": rng.choice(_SEQ[family])}
    if family in ("llama", "moe"):
        kv = rng.choice([k for k in (heads, 8, 8, 4, 2, 1) if heads % k == 0])
        model["num_kv_heads"] = kv
    if rng.random() < 0.3:
        # other MLP widths than the family rule (multiples of 256 keep tp splits possible)
        ratio = rng.uniform(2.5, 4.5) if family in ("llama", "moe") else rng.uniform(3.0, 5.0)
        model["ffn_hidden_size"] = max(256, int(round(h * ratio / 256)) * 256)
    if moe:
        model.update(num_experts=experts, moe_top_k=min(experts, rng.choice((1, 2, 2))), moe_layer_frequency=freq)
    return model


# ------------------------------------------------------------------- strategy
def _draw_strategy(rng: random.Random, spec_model: Any, device: dict, num_devices: int, dpn: int) -> dict:
    """Strategy keys for a resolved model on ``num_devices`` devices (most draws are valid)."""
    m = spec_model
    n = num_devices
    heads, kv, ffn = m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size

    def tp_ok(t: int) -> bool:
        # the run format's rule (specs.run): tp divides the heads and the key/value heads (Megatron-Core
        # splits both, replicating neither)
        return heads % t == 0 and kv % t == 0 and ffn % t == 0

    tps = [t for t in (1, 2, 4, 8, 16) if n % t == 0 and tp_ok(t) and (t <= max(dpn, 2) or t <= 8)]
    tp = rng.choices(tps, weights=[{1: 3, 2: 2, 4: 2, 8: 2, 16: 0.3}[t] for t in tps])[0]
    cp = 1
    if rng.random() < 0.15:
        cps = [c for c in (2, 4, 8) if tp * c <= n and n % (tp * c) == 0 and m.seq_length % (2 * c) == 0]
        if cps:
            cp = rng.choice(cps)
    rest = n // (tp * cp)
    pps = [p for p in (1, 2, 4, 8, 16, 32, 64) if rest % p == 0 and p <= m.num_layers]
    # deep pipelines are drawn rarely: simulating one costs ~pp² units (the steady state is extrapolated
    # from pp and 2·pp micro-batches), 100-400 ms at pp = 64 against ~3 ms for a typical run
    pp = rng.choices(pps, weights=[_PP_WEIGHTS[p] for p in pps])[0]
    dp = rest // pp
    s: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp}
    if cp > 1:
        s["cp"] = cp
    v = 1
    if pp > 1:
        sched = _weighted(rng, {"1f1b": 0.5, "gpipe": 0.2, "interleaved": 0.3})
        if sched == "interleaved":
            # every chunk needs a layer; layers that do not divide over pp·v are laid out as Llama 3 405B's
            # (graph.execution.layers_per_vstage), but most published interleaved runs divide them evenly
            vs = [x for x in (2, 3, 4) if m.num_layers >= pp * x]
            even = [x for x in vs if m.num_layers % (pp * x) == 0]
            if even and rng.random() < _EVEN_INTERLEAVING_SHARE:
                vs = even
            if vs:
                v = rng.choice(vs)
                s["virtual_pipeline_stages"] = v
            else:
                sched = "1f1b"
        s["pipeline_schedule"] = sched
    mbs = rng.choice((1, 1, 2, 4) if m.arch != "bert" else (4, 8, 16, 32))
    if pp > 1:
        if pp >= 16:  # fewer micro-batches per stage on deep pipelines: simulation cost ~ pp·min(m, 3·pp)
            mult = rng.choice((1, 2, 4)) if v > 1 else rng.choice((0.5, 1, 2, 4))
        else:
            mult = rng.choice((1, 2, 4, 8, 16)) if v > 1 else rng.choice((0.5, 1, 2, 4, 8, 16))
        micro = max(1, int(pp * mult))
    else:
        micro = rng.choice((1, 1, 2, 4, 8, 16))
    s["micro_batch_size"] = mbs
    s["global_batch_size"] = mbs * dp * micro
    # fully sharded states with a pipeline are rare in practice (DeepSpeed refuses ZeRO-3 with pipeline
    # parallelism, Megatron has no ZeRO-3) and triple the simulated events: kept to shallow pipelines
    sharded_ok = pp <= _MAX_PP_ZERO3
    if rng.random() < 0.1 and sharded_ok:
        s["fsdp"] = True
        if rng.random() < 0.3:
            s["zero_stage"] = 2  # FSDP's SHARD_GRAD_OP (FSDP2: reshard_after_forward=False)
    else:
        zero = _weighted(rng, {0: 0.4, 1: 0.25, 2: 0.17, 3: 0.18})
        if zero == 3 and not sharded_ok:
            zero = 2
        if zero:
            s["zero_stage"] = zero
    s["recompute"] = _weighted(rng, {"none": 0.4, "selective": 0.3, "full": 0.3})
    if tp > 1 and rng.random() < 0.5 and m.seq_length % (tp * cp) == 0:
        s["sequence_parallel"] = True
    if m.is_moe:
        eps = [e for e in _divisors(m.num_experts) if e > 1 and (dp * cp) % e == 0]
        if eps and rng.random() < 0.7:
            s["ep"] = rng.choice(eps)
            # DeepEP's per-rank and per-node dispatch, and all-to-alls hidden behind another micro-batch
            if rng.random() < _DEEPEP_SHARE:
                s["moe_dispatcher"] = "deepep"
            if rng.random() < _OVERLAP_MOE_SHARE:
                s["overlap_moe_comm"] = True
        if rng.random() < _CAPACITY_SHARE:
            s["moe_capacity_factor"] = rng.choice(_CAPACITY_FACTORS)
    sharded = s.get("fsdp") or s.get("zero_stage", 0) > 0
    if sharded and tp * cp * dp > dpn and rng.random() < _HYBRID_SHARE:
        replicas = _replica_options(dp, cp, s.get("ep", 1))
        if replicas:
            # a copy of the states per node: the dp·cp ranks inside one node (stride tp) shard it
            node = dp * cp // max(1, dpn // tp) if tp <= dpn else 0
            s["dp_replicate"] = (node if node in replicas and rng.random() < _HYBRID_NODE_SHARE
                                 else rng.choice(replicas))
    precisions = {p: w for p, w in _PRECISION_WEIGHTS.items() if device["peak_tflops"].get(p) is not None}
    s["precision"] = _weighted(rng, precisions)
    if s["precision"] in ("bf16", "fp16") and rng.random() < _AUTOCAST_SHARE:
        s["mixed_precision"] = "autocast"
    if rng.random() < 0.1:
        s["flash_attention"] = False
    if rng.random() < 0.15 and not s.get("fsdp") and s.get("zero_stage", 0) < 3:
        # (with ZeRO-3/FSDP the simulator of SIMULATOR_VERSION 0.1.0 deadlocks on unoverlapped reduction)
        s["overlap_grad_reduce"] = False
    if pp > 1 and rng.random() < 0.2:
        s["overlap_p2p"] = True
    if rng.random() < 0.1:
        s["optimizer"] = "sgd"
    if rng.random() < _FORWARD_ONLY_SHARE:
        _forward_only(s)
    elif _per_layer_sharding(s):
        pass  # zero-bubble schedules are not modelled with layer-by-layer gathers (nor without a backward)
    elif s.get("pipeline_schedule") == "1f1b" and rng.random() < _ZB_H1_SHARE:
        s["pipeline_schedule"] = "zb-h1"
    elif s.get("pipeline_schedule") == "interleaved":
        if s.get("virtual_pipeline_stages") == 2 and rng.random() < _ZB_V_SHARE:
            s["pipeline_schedule"] = "zb-v"
        elif rng.random() < _INTERLEAVED_ZB_SHARE:
            s["pipeline_schedule"] = "interleaved-zb"
    eager_differs = (m.position_embedding == "rope" or m.activation in ("swiglu", "gelu_new")
                     or not s.get("flash_attention", True))  # eager attention: scaling, mask and softmax apart
    if eager_differs and rng.random() < _EAGER_SHARE:
        s["fused_elementwise"] = False
        if s.get("optimizer", "adam") != "none":
            # torch.optim's default over GPU tensors (the sampler draws catalog GPUs and copies of them);
            # zero_grad(set_to_none=True)
            s["optimizer_impl"] = "foreach"
            s["persistent_grads"] = False
    if s.get("recompute", "none") != "none" and rng.random() < _NON_REENTRANT_SHARE:
        s["checkpoint_impl"] = "non_reentrant"
    return s


def _no_zero_bubble(s: dict) -> None:
    """Turn a zero-bubble schedule of strategy ``s`` into the one it was drawn from: ZB-H1 into 1F1B, ZB-V and
    interleaved zero bubble into Megatron's interleaving of the same chunks per rank (the draw kept its
    micro-batches a multiple of pp)."""
    back = {"zb-h1": "1f1b", "zb-v": "interleaved", "interleaved-zb": "interleaved"}.get(s.get("pipeline_schedule"))
    if back:
        s["pipeline_schedule"] = back


def _per_layer_sharding(s: dict) -> bool:
    """Whether strategy ``s`` gathers its parameters layer by layer (ZeRO-3 or FSDP)."""
    return bool(s.get("fsdp")) or s.get("zero_stage", 0) == 3


def _forward_only(s: dict) -> None:
    """Make strategy ``s`` a forward-only step: no optimizer, recomputation or gradient reduction; ZeRO-1/2
    (which shard only optimizer states and gradients) become plain data parallelism, ZeRO-3/FSDP keep
    gathering the weights."""
    s.update(forward_only=True, optimizer="none", recompute="none")
    s.pop("checkpoint_impl", None)  # nothing is recomputed
    for key in ("overlap_grad_reduce", "grad_reduce_precision"):
        s.pop(key, None)
    if not s.get("fsdp") and s.get("zero_stage", 0) in (1, 2):
        s.pop("zero_stage")
        s.pop("dp_replicate", None)  # hybrid sharding needs sharded states


def _replica_options(dp: int, cp: int, ep: int) -> list[int]:
    """Valid ``dp_replicate`` > 1: dividing dp and the expert data-parallel size dp·cp/ep, below dp·cp."""
    return [r for r in _divisors(dp) if 1 < r < dp * cp and (dp * cp // ep) % r == 0]


def _memory_relief(rng: random.Random, s: dict) -> dict:
    """A variant of strategy ``s`` that needs less memory (retried before a full redraw)."""
    s = dict(s)
    top = 3 if s["pp"] <= _MAX_PP_ZERO3 else 2
    zero, shardable = s.get("zero_stage", 0), not s.get("fsdp") and s["dp"] * s.get("cp", 1) > 1
    if s.get("forward_only"):
        # no optimizer states or gradients to shard (ZeRO-1/2 are refused) and nothing to recompute: only
        # sharding the weights (ZeRO-3) or a smaller micro-batch helps
        if shardable and top == 3 and zero < 3:
            s["zero_stage"] = 3
        else:
            _halve_micro_batch(s)
    elif shardable and zero < top:
        s["zero_stage"] = rng.choice((zero + 1, top)) if zero < top - 1 else top
        if s["zero_stage"] == 3:
            s.pop("overlap_grad_reduce", None)  # see _draw_strategy
            _no_zero_bubble(s)  # see _draw_strategy
    elif s.get("recompute") != "full":
        s["recompute"] = "full"
    else:
        _halve_micro_batch(s)
    return s


def _halve_micro_batch(s: dict) -> None:
    """Halve the micro-batch of strategy ``s`` (keeping its number of micro-batches), if above 1."""
    if s["micro_batch_size"] > 1:
        mb = s["micro_batch_size"] // 2
        s["global_batch_size"] = s["global_batch_size"] // s["micro_batch_size"] * mb
        s["micro_batch_size"] = mb


# ----------------------------------------------------------------------- draw
_MODEL_SPECS: dict[str, Any] = {}


def _model_spec(model: Any) -> Any:
    """The ModelSpec of a catalog name (cached: specs are frozen) or of an inline dict."""
    from ..specs.model import resolve_model

    if isinstance(model, str):
        spec = _MODEL_SPECS.get(model)
        if spec is None:
            spec = _MODEL_SPECS[model] = resolve_model(model)
        return spec
    return resolve_model(model)


_HW_SPECS: dict[str, Any] = {}


def _hardware_spec(hw: dict) -> Any:
    """The HardwareSpec of a run-format hardware dict (cached by its canonical JSON; specs are frozen)."""
    from ..measure.records import canonical_json
    from ..specs import resolve_hardware

    key = canonical_json(hw)
    spec = _HW_SPECS.get(key)
    if spec is None:
        if len(_HW_SPECS) > 4096:
            _HW_SPECS.clear()
        spec = _HW_SPECS[key] = resolve_hardware(hw)
    return spec


def states_lower_bound_GiB(spec: Any) -> float:
    """A lower bound of the peak memory per device: the model states of an average pipeline stage.

    Weights, gradients and optimizer states of the layers and the embedding (the head and the final
    norm left out) split over ``tp·pp`` (experts also over ``ep``) and sharded by ZeRO as
    :func:`learnedperf.simulate.memory.peak_memory` does; activations left out. The busiest stage
    holds at least the average, so a run above this bound cannot fit and is rejected without
    compiling it (the exact check decides every other run).
    """
    from ..graph.execution import layer_param_split, sharded_state_bytes  # what chunk_layout, peak_memory use

    m, s = spec.model, spec.strategy
    dense, moe_dense, experts = layer_param_split(m, s.ep)
    moe_layers = m.num_moe_layers
    dense_params = ((m.num_layers - moe_layers) * dense + moe_layers * moe_dense + m.embedding_params()) / s.tp / s.pp
    expert_params = moe_layers * experts / s.tp / s.pp
    return sum(sharded_state_bytes(s, dense_params, expert_params)) / 2**30


@dataclass
class _Tries:
    """Candidates drawn for one index so far, acceptable ones still to pass over, and rejections by reason."""

    skip: int = 0
    attempts: int = 0
    rejections: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejections[reason] = self.rejections.get(reason, 0) + 1


def _place(rng: random.Random, index: int, run_id: str, model: Any, mspec: Any, hw: dict, strategy: dict,
           keep_oom: bool, tries: _Tries) -> Optional[Sample]:
    """The run of ``strategy`` (or of up to three less memory-hungry variants of it) on a drawn model and
    hardware if it is valid and fits (or ``keep_oom``), else None; every candidate is counted in ``tries``."""
    from ..graph.execution import compile_run
    from ..simulate.memory import memory_microbatches, peak_memory
    from ..specs import RunSpec
    from ..units import GiB

    for _relief in range(4):  # the same model and hardware with less memory-hungry settings
        tries.attempts += 1
        run = {"model": model, "hardware": hw, "strategy": strategy, "id": run_id}
        try:
            # resolved model and hardware specs stand in for their JSON (same checks, no second parse)
            spec = RunSpec.from_dict({**run, "model": mspec, "hardware": _hardware_spec(hw)})
        except SpecError as exc:
            tries.reject(f"invalid: {exc.field or 'run'}")
            return None
        mem_GiB = spec.hardware.device.memory_GiB
        if keep_oom or states_lower_bound_GiB(spec) <= mem_GiB:
            eg = compile_run(spec, memory_microbatches(spec))
            fits = peak_memory(eg).total / GiB <= mem_GiB
        else:
            eg, fits = None, False
        if (fits or keep_oom) and tries.skip > 0:
            tries.skip -= 1
            return None
        if fits or keep_oom:
            return Sample(index, run, spec, eg, fits, tries.attempts, tries.rejections)
        tries.reject("does not fit in memory")
        relieved = _memory_relief(rng, strategy)
        if relieved == strategy:
            return None
        strategy = relieved
    return None


def draw(seed: int, index: int, keep_oom: bool = False, skip: int = 0) -> Sample:
    """The ``index``-th run of ``seed`` (see the module docstring).

    ``skip`` passes over that many acceptable candidates first: the generator uses it, should the
    simulator fail on a candidate, to take the next one of the same index (deterministically).

    Raises:
        LearnedPerfError: no acceptable candidate in :data:`MAX_ATTEMPTS` draws (a sampler bug).
    """
    rng = index_rng(seed, index)
    family = FAMILIES[index % len(FAMILIES)]
    tries = _Tries(skip=skip)
    while tries.attempts < MAX_ATTEMPTS:
        hw, device, _base = _draw_hardware(rng)
        dpn = hw.get("devices_per_node")
        if dpn is None:  # a named cluster
            from ..catalog import get_cluster

            dpn = get_cluster(hw["cluster"])["devices_per_node"]
        n = _draw_num_devices(rng, dpn)
        hw["num_devices"] = n
        model = _draw_model(rng, family, n, float(device["memory_GiB"]))
        try:
            mspec = _model_spec(model)
        except SpecError as exc:
            tries.attempts += 1
            tries.reject(f"invalid: {exc.field or 'model'}")
            continue
        strategy = _draw_strategy(rng, mspec, device, n, dpn)
        sample = _place(rng, index, f"gen-{seed}-{index}", model, mspec, hw, strategy, keep_oom, tries)
        if sample is not None:
            return sample
    raise LearnedPerfError(f"sampler: no valid run for seed {seed} index {index} in {MAX_ATTEMPTS} draws")


#: Strategy keys that say how a framework runs a step rather than how the devices are laid out: a run near a
#: measured one takes them from it half the time (``_NEAR_STYLE_SHARE``), so that runs near the measured ones
#: keep their framework's habits (vTrain's fp16 without fused attention or overlapped reduction, say)
NEAR_STYLE_KEYS = ("precision", "mixed_precision", "flash_attention", "overlap_grad_reduce", "grad_reduce_precision",
                   "recompute", "checkpoint_impl", "optimizer", "forward_only", "fused_elementwise", "optimizer_impl",
                   "persistent_grads")
#: share of near runs that keep their anchor's style keys: a sampling choice (half keep them, half explore the
#: sampler's), not a measured share
_NEAR_STYLE_SHARE = 0.5


def anchor_groups(anchors: Any) -> list[list[dict]]:
    """Anchor runs grouped by their (model, hardware), in a deterministic order.

    Args:
        anchors: run-format dicts (measured runs, say); each must be a valid run.

    Raises:
        InputError: no anchors, or an anchor that is not a valid run (naming its position and field).
    """
    from ..measure.records import canonical_json
    from ..specs import RunSpec

    if isinstance(anchors, (str, bytes, dict)) or not hasattr(anchors, "__iter__"):
        raise InputError(f"anchors: expected a list of runs, got {type(anchors).__name__}")
    groups: dict[str, list[dict]] = {}
    for i, run in enumerate(anchors):
        if not isinstance(run, dict):
            raise InputError(f"anchors[{i}]: expected a run object, got {type(run).__name__}")
        try:
            RunSpec.from_dict(run)
        except SpecError as exc:
            raise InputError(f"anchors[{i}]: not a valid run: {exc}") from None
        key = canonical_json([run["model"], run["hardware"]])
        groups.setdefault(key, []).append(run)
    if not groups:
        raise InputError("anchors: no runs to draw near")
    return [sorted(groups[k], key=canonical_json) for k in sorted(groups)]


def _take_style(s: dict, anchor: dict) -> None:
    """Give strategy ``s`` the anchor strategy's :data:`NEAR_STYLE_KEYS` (its defaults where it leaves them
    out), then undo what they make invalid, as the sampler's own draws avoid it."""
    for key in NEAR_STYLE_KEYS:
        s.pop(key, None)
        if key in anchor:
            s[key] = anchor[key]
    if s.get("forward_only"):
        _forward_only(s)
        _no_zero_bubble(s)  # no backward to split
    elif s.get("optimizer") == "none" and not s.get("fsdp") and s.get("zero_stage", 0) in (1, 2):
        s.pop("zero_stage")  # ZeRO-1/2 shard only optimizer states and gradients
        s.pop("dp_replicate", None)
    if s.get("overlap_grad_reduce") is False and _per_layer_sharding(s):
        s.pop("overlap_grad_reduce")  # see _draw_strategy


def draw_near(seed: int, index: int, groups: list[list[dict]], keep_oom: bool = False) -> Sample:
    """The ``index``-th run of ``seed`` near the anchors (:func:`anchor_groups`): the model and hardware of
    one anchor, a (model, hardware) pair chosen uniformly, with a strategy drawn as :func:`draw` draws one
    (tp, pp, dp, cp, ep, schedule, ZeRO/FSDP, micro-batching, ...), half the time with the anchor's own
    :data:`NEAR_STYLE_KEYS`. It has a random stream of its own, independent of :func:`draw`'s, and the id
    ``near-<seed>-<index>``.

    Raises:
        LearnedPerfError: no acceptable candidate in :data:`MAX_ATTEMPTS` draws.
    """
    from ..units import PRECISIONS

    digest = hashlib.sha256(f"learnedperf-sampler-near-{SAMPLER_VERSION}:{seed}:{index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:16], "big"))
    tries = _Tries()
    while tries.attempts < MAX_ATTEMPTS:
        group = groups[rng.randrange(len(groups))]
        anchor = group[rng.randrange(len(group))]
        model, hw = anchor["model"], dict(anchor["hardware"])
        hspec, mspec = _hardware_spec(hw), _model_spec(model)
        device = {"peak_tflops": {p: hspec.device.peak_tflops.get(p) for p in PRECISIONS}}
        strategy = _draw_strategy(rng, mspec, device, hspec.num_devices, hspec.node_size)
        if rng.random() < _NEAR_STYLE_SHARE:
            _take_style(strategy, anchor.get("strategy") or {})
        sample = _place(rng, index, f"near-{seed}-{index}", model, mspec, hw, strategy, keep_oom, tries)
        if sample is not None:
            return sample
    raise LearnedPerfError(f"sampler: no valid run near the anchors for seed {seed} index {index} in "
                           f"{MAX_ATTEMPTS} draws")


def sample_near_runs(n: int, anchors: Any, seed: int = 0, keep_oom: bool = False,
                     start: int = 0) -> Iterator[tuple[int, dict]]:
    """Yield ``(index, run_dict)`` of :func:`draw_near` for indices ``start .. start+n-1`` near ``anchors``.

    As :func:`sample_runs`: the ``i``-th run depends only on ``(seed, i)`` and the anchors; each run is valid,
    fits unless ``keep_oom``, and carries the id ``near-<seed>-<index>``.
    """
    n = check_count(n, "n", minimum=0)
    seed = check_seed(seed)
    groups = anchor_groups(anchors)
    for i in range(start, start + n):
        yield i, draw_near(seed, i, groups, keep_oom).run


def sample_runs(n: int, seed: int = 0, keep_oom: bool = False, start: int = 0) -> Iterator[tuple[int, dict]]:
    """Yield ``(index, run_dict)`` for indices ``start .. start+n-1`` of ``seed``.

    The same arguments give the same runs in the same order; the ``i``-th run depends
    only on ``(seed, i)`` (and ``keep_oom``), so any sub-range equals the matching slice
    of a longer sequence. Every run is valid (``RunSpec.from_dict`` accepts it) and, unless
    ``keep_oom``, fits in its devices' memory. Run ids are unique: each run carries the id
    ``gen-<seed>-<index>``.
    """
    n = check_count(n, "n", minimum=0)
    seed = check_seed(seed)
    for i in range(start, start + n):
        yield i, draw(seed, i, keep_oom).run


def check_count(value: Any, name: str, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` or InputError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def config_id(run: dict) -> str:
    """Id of a run's configuration: the run id of ``run`` without its ``id`` and ``meta``."""
    from ..measure.records import run_id

    return run_id({k: v for k, v in run.items() if k not in ("id", "run_id", "meta", "name")})


def device_type(run_device: Any) -> str:
    """The catalog device a run's device is (or was derived from): ``synthetic-<base>-<k>`` → ``<base>``."""
    name = run_device if isinstance(run_device, str) else str(run_device)
    if name.startswith("synthetic-"):
        return name[len("synthetic-"):].rsplit("-", 1)[0]
    return name


def family_of(index: int) -> str:
    """The model family the stratification assigns to sample ``index``."""
    return FAMILIES[index % len(FAMILIES)]


__all__ = ["FAMILIES", "MAX_DEVICES", "SAMPLER_VERSION", "Sample", "check_count", "check_seed", "config_id",
           "device_type", "draw", "family_of", "index_rng", "sample_runs"]
