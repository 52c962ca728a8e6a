"""Parallelisation strategy: how a run splits work over devices and time."""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal, Optional, get_args

from pydantic import Field, model_validator

from ._base import FieldValueError, Spec

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "interleaved-zb"]
#: Every ``pipeline_schedule`` the run format accepts.
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)

#: The expert-dispatch keys and their defaults (Megatron-Core's alltoall dispatcher, blocking): a run that
#: departs from them needs expert parallelism.
EXPERT_DISPATCH_DEFAULTS = MappingProxyType({"moe_dispatcher": "alltoall", "overlap_moe_comm": False})
#: :meth:`Strategy.omitted_defaults`, built once (read at every ``to_dict``, run ids included).
_OMITTED_DEFAULTS = MappingProxyType({**EXPERT_DISPATCH_DEFAULTS, "moe_grouped_gemm": True,
                                      "fused_elementwise": True, "checkpoint_impl": "reentrant",
                                      "optimizer_impl": "fused", "persistent_grads": True})

#: Largest parallel size or micro-batch accepted: no run has more devices (``hardware.MAX_DEVICES``), and
#: a bound turns absurd input into an error naming the field instead of a prediction.
_MAX = 1 << 20

#: Pipeline schedules that split the backward into input-gradient (B) and weight-gradient (W) passes.
ZERO_BUBBLE_SCHEDULES = ("zb-h1", "zb-v", "interleaved-zb")
#: Pipeline schedules that place rank r's two model chunks at virtual stages r and 2p-1-r.
V_SHAPE_SCHEDULES = ("zb-v",)
#: Pipeline schedules that run ``virtual_pipeline_stages >= 2`` model chunks per rank in Megatron's placement (rank r
#: holds virtual stages r, r+p, ...).
INTERLEAVED_SCHEDULES = ("interleaved", "interleaved-zb")


class Strategy(Spec):
    """Data, tensor, pipeline, context and expert parallelism plus the knobs around them.

    ``dp`` and ``global_batch_size`` may be left out: :func:`~learnedperf.specs.run.RunSpec`
    derives ``dp = num_devices / (tp·pp·cp)`` and ``global_batch_size =
    micro_batch_size · dp`` (one micro-batch per iteration).
    """

    tp: int = Field(default=1, ge=1, le=_MAX, description="tensor-parallel size")
    pp: int = Field(default=1, ge=1, le=_MAX, description="pipeline-parallel size")
    dp: Optional[int] = Field(default=None, ge=1, le=_MAX, description="data-parallel size")
    cp: int = Field(default=1, ge=1, le=_MAX, description="context-parallel size (sequence split across ranks)")
    ep: int = Field(default=1, ge=1, le=_MAX, description="expert-parallel size (carved out of dp·cp)")
    micro_batch_size: int = Field(default=1, ge=1, le=_MAX)
    global_batch_size: Optional[int] = Field(default=None, ge=1, le=1 << 30)
    pipeline_schedule: PipelineSchedule = Field(
        default="1f1b",
        description="order of the forward and backward passes on each pipeline rank: 'gpipe' (all forwards, "
                    "then all backwards), '1f1b' (PipeDream-Flush), 'interleaved' (Megatron's, with "
                    "virtual_pipeline_stages chunks per rank), or a zero-bubble schedule (Qi et al., ICLR 2024), "
                    "whose backward is split into the input gradients, on the critical path, and the weight "
                    "gradients, which fill the bubbles: 'zb-h1' (1F1B's micro-batches in flight), 'zb-v' (two "
                    "model chunks per rank in a V, the first and the last on rank 0, virtual_pipeline_stages 2: "
                    "PyTorch's ScheduleZBVZeroBubble, torchtitan's ZBVZeroBubble) or 'interleaved-zb' "
                    "(virtual_pipeline_stages chunks per rank placed as 'interleaved' places them: PyTorch's "
                    "ScheduleInterleavedZeroBubble, torchtitan's InterleavedZeroBubble)")
    virtual_pipeline_stages: int = Field(default=1, ge=1, le=_MAX, description="model chunks per pipeline rank")
    zero_stage: Literal[0, 1, 2, 3] = 0
    fsdp: bool = Field(
        default=False,
        description="PyTorch FSDP: parameters gathered and gradients reduce-scattered layer by layer, through "
                    "flat copy-in/copy-out buffers; full sharding (FULL_SHARD, ZeRO-3 traffic) unless "
                    "zero_stage is 2 (SHARD_GRAD_OP: parameters kept gathered from forward to backward)")
    dp_replicate: int = Field(
        default=1, ge=1, le=_MAX,
        description="hybrid sharding (HSDP): ZeRO/FSDP states are sharded over dp·cp/dp_replicate ranks and "
                    "replicated over dp_replicate such groups, whose sharded gradients are all-reduced once an "
                    "iteration (FSDP HYBRID_SHARD, torchtitan's data_parallel_replicate_degree, Megatron's "
                    "num_distributed_optimizer_instances, DeepSpeed MiCS); 1 = states sharded over all dp·cp "
                    "ranks")
    recompute: Literal["none", "selective", "full"] = "none"
    checkpoint_impl: Literal["reentrant", "non_reentrant"] = Field(
        default="reentrant",
        description="how recomputation re-runs a forward, which sets what it costs the host: 'reentrant' = the "
                    "checkpointed forward runs without autograd and is run again inside backward (Megatron-LM's "
                    "CheckpointFunction, torch.utils.checkpoint with use_reentrant=True); 'non_reentrant' = "
                    "torch.utils.checkpoint with use_reentrant=False (saved-tensor hooks on every tensor the "
                    "forward saves: learnedperf measure, PyTorch's checkpoint_wrapper). Needs recompute "
                    "'selective' or 'full'")
    sequence_parallel: bool = False
    precision: Precision = "bf16"
    mixed_precision: Literal["master_weights", "autocast"] = Field(
        default="master_weights",
        description="how a bf16/fp16 run keeps its weights: 'master_weights' = weights, activations and "
                    "gradients in `precision` with fp32 master weights in the optimizer (Megatron, DeepSpeed); "
                    "'autocast' = fp32 weights cast to `precision` at every GEMM, norms, softmax and loss in "
                    "fp32 (torch.autocast / PyTorch AMP)")
    flash_attention: bool = Field(default=True, description="fused attention kernel (no s² tensor in memory)")
    fused_elementwise: bool = Field(
        default=True,
        description="rotary position embeddings, a gated activation (SwiGLU), a written-out GELU (gelu_new) "
                    "and, without flash_attention, attention's scaling, mask and softmax run as one fused kernel "
                    "each (Megatron-Core's apply_rope_fusion, bias_swiglu_fusion, fused scale-mask-softmax); "
                    "false: eager PyTorch, one kernel per tensor operation (Hugging Face Transformers, "
                    "learnedperf measure): RoPE five kernels per rotated tensor, SwiGLU two, gelu_new eight, "
                    "the scores three to five, each reading and writing its own tensors, and what their "
                    "backward needs saved. Models with flash_attention and without RoPE, a gated activation or "
                    "gelu_new run the same either way")
    grad_bucket_size_MiB: float = Field(default=25.0, gt=0, description="DDP gradient bucket (PyTorch default 25 MiB)")
    overlap_grad_reduce: bool = Field(default=True, description="reduce gradients while backward runs")
    overlap_param_gather: bool = Field(default=True, description="prefetch ZeRO-3/FSDP parameters")
    overlap_p2p: bool = Field(default=False, description="pipeline send/recv off the critical path")
    moe_dispatcher: Literal["alltoall", "deepep"] = Field(
        default="alltoall",
        description="how a mixture of experts moves tokens to their experts' ranks: 'alltoall' sends every "
                    "(token, expert) copy to its expert's rank (Megatron-Core's alltoall dispatcher); 'deepep' "
                    "sends a token once to each rank holding any of its experts, and across the network once "
                    "to each node, forwarding it to that node's ranks over NVLink (DeepEP, DeepSeek-AI 2024, "
                    "arXiv 2412.19437, section 3.2.2; Megatron-Core's flex dispatcher)")
    overlap_moe_comm: bool = Field(
        default=False,
        description="expert all-to-alls run beside another micro-batch's computation (DeepSeek-V3's "
                    "DualPipe, Megatron-Core's overlap_moe_expert_parallel_comm): each forward or backward "
                    "part takes the longer of its kernels and its all-to-alls, its kernels slowed by the SMs "
                    "the communication holds")
    moe_grouped_gemm: bool = Field(
        default=True,
        description="a rank's local experts run their GEMMs together, one grouped kernel per expert operation "
                    "(Megatron-Core's GroupedMLP, moe_grouped_gemm); false: one expert at a time, every expert "
                    "operation launched once per local expert (Megatron-Core's SequentialMLP, Hugging Face's "
                    "expert loops), which costs the host as many launches")
    moe_capacity_factor: Optional[float] = Field(
        default=None, gt=0, le=1024, allow_inf_nan=False,
        description="rows each expert processes over the balanced share T·k/E of a rank's tokens (Megatron-Core's "
                    "moe_expert_capacity_factor with moe_pad_expert_input_to_capacity, GShard's and Switch's "
                    "capacity factor: tokens over capacity are dropped, experts padded up to it); for a dropless "
                    "router, its measured max/mean expert load. The busiest expert sets the pace of a layer: its "
                    "GEMMs, activations and all-to-all volumes scale by this factor, the model FLOPs do not. "
                    "Unset: dropless with balanced routing")
    grad_reduce_precision: Optional[Precision] = Field(
        default=None, description="precision of gradient reduction; default fp32 for bf16/fp8 "
                                  "(Megatron accumulates and reduces in fp32), else the run precision")
    optimizer: Literal["adam", "sgd", "none"] = Field(
        default="adam",
        description="optimizer step of the iteration; 'none' = forward and backward only, as single-GPU "
                    "profilers and NeuSight time a step (no optimizer states in memory either)")
    optimizer_impl: Literal["fused", "foreach", "for_loop"] = Field(
        default="fused",
        description="how the optimizer step runs: 'fused' = one pass over each parameter's weight, gradient and "
                    "states (Apex/Transformer Engine FusedAdam in Megatron, DeepSpeed's FusedAdam, "
                    "torch.optim's fused=True); 'foreach' = torch.optim's default on GPUs, one multi-tensor kernel "
                    "per tensor operation of the update over all parameters, each reading and writing its own "
                    "tensors, with sqrt of Adam's second moment made as a new list, an fp32 copy of the "
                    "parameters; 'for_loop' = torch.optim's default on CPUs, the same operations one parameter at "
                    "a time (the temporaries are one parameter's)")
    persistent_grads: bool = Field(
        default=True,
        description="gradients live in buffers kept across iterations (Megatron-Core's gradient buffer, "
                    "DeepSpeed's gradient partitions); false: freed after each optimizer step and made again by "
                    "the backward, as torch's zero_grad(set_to_none=True) does (its default since torch 2.0), so "
                    "that a step of one micro-batch holds its activations and its gradients at different times")
    forward_only: bool = Field(
        default=False,
        description="forward passes only, as an inference or evaluation step runs them (Megatron's "
                    "forward_only schedules, a model under torch.no_grad): no backward, no gradient "
                    "reduction, no saved activations; needs optimizer 'none' and recompute 'none'")

    @model_validator(mode="after")
    def _check(self) -> "Strategy":
        if self.mixed_precision == "autocast" and self.precision not in ("bf16", "fp16"):
            raise FieldValueError("mixed_precision",
                                  f"'autocast' casts fp32 weights to bf16 or fp16, not to precision {self.precision!r}")
        if self.fsdp and self.zero_stage == 1:
            raise FieldValueError("fsdp", "FSDP shards parameters (zero_stage 3, FULL_SHARD) or gradients and "
                                          "optimizer state (zero_stage 2, SHARD_GRAD_OP); it has no ZeRO-1 mode")
        if self.optimizer == "none" and self.zero_stage in (1, 2) and not self.fsdp:
            raise FieldValueError("optimizer", f"zero_stage {self.zero_stage} shards the optimizer step's states and "
                                               "gathers its updated weights; a run without an optimizer step has none "
                                               "(use zero_stage 0, 3 or fsdp)")
        if self.forward_only and self.optimizer != "none":
            raise FieldValueError("forward_only", f"a forward-only step has no optimizer step, but optimizer is "
                                                  f"{self.optimizer!r} (set optimizer 'none')")
        if self.forward_only and self.recompute != "none":
            raise FieldValueError("forward_only", f"recomputation re-runs forwards for a backward; a forward-only "
                                                  f"step has none (recompute is {self.recompute!r})")
        if self.optimizer == "none" and self.optimizer_impl != "fused":
            raise FieldValueError("optimizer_impl", f"optimizer_impl {self.optimizer_impl!r} says how an optimizer "
                                                    "step runs; optimizer is 'none'")
        if self.checkpoint_impl != "reentrant" and self.recompute == "none":
            raise FieldValueError("checkpoint_impl", f"checkpoint_impl {self.checkpoint_impl!r} says how a "
                                                     "recomputation runs; recompute is 'none'")
        if self.dp_replicate > 1 and self.effective_zero_stage == 0:
            raise FieldValueError("dp_replicate", "hybrid sharding replicates sharded states: it needs zero_stage "
                                                  ">= 1 or fsdp (without sharding every rank holds a replica)")
        if self.interleaved and self.virtual_pipeline_stages < 2:
            raise FieldValueError("virtual_pipeline_stages",
                                  f"pipeline_schedule {self.pipeline_schedule!r} needs virtual_pipeline_stages >= 2")
        if self.v_shape and self.virtual_pipeline_stages != 2:
            raise FieldValueError("virtual_pipeline_stages",
                                  f"pipeline_schedule {self.pipeline_schedule!r} places two model chunks on each rank "
                                  f"in a V: set virtual_pipeline_stages 2, not {self.virtual_pipeline_stages}")
        if self.virtual_pipeline_stages > 1 and not (self.interleaved or self.v_shape):
            raise FieldValueError("pipeline_schedule", "virtual_pipeline_stages > 1 needs pipeline_schedule "
                                                       "'interleaved', 'interleaved-zb' or 'zb-v'")
        name = self.pipeline_schedule
        if self.zero_bubble and self.forward_only:
            raise FieldValueError("pipeline_schedule", f"{name!r} splits the backward pass; a forward-only step has "
                                                       "none (use '1f1b')")
        if self.zero_bubble and self.per_layer_sharding:
            raise FieldValueError("pipeline_schedule", f"{name!r} with parameters gathered layer by layer (zero_stage "
                                                       "3 or fsdp) is not modelled: the weight-gradient passes would "
                                                       "need their layers gathered again")
        return self

    def omitted_defaults(self) -> dict:
        """The expert-dispatch keys at their defaults (:data:`EXPERT_DISPATCH_DEFAULTS`), ``moe_grouped_gemm``,
        ``fused_elementwise`` and ``persistent_grads`` at true, ``checkpoint_impl`` 'reentrant', ``optimizer_impl``
        'fused': runs written before these keys existed keep their JSON and run id."""
        return _OMITTED_DEFAULTS

    @property
    def effective_zero_stage(self) -> int:
        """ZeRO stage: FSDP counts as stage 3 (FULL_SHARD) unless zero_stage says 2 (SHARD_GRAD_OP)."""
        return 3 if self.fsdp and self.zero_stage != 2 else self.zero_stage

    @property
    def shard_size(self) -> int:
        """Ranks that shard one copy of the ZeRO/FSDP states: dp·cp / dp_replicate (needs ``dp``, which
        :class:`~learnedperf.specs.run.RunSpec` derives). Without sharding (ZeRO 0) it is still the size of the
        group that reduces gradients."""
        if self.dp is None:
            raise ValueError("shard_size needs dp (derived by RunSpec)")
        return self.dp * self.cp // self.dp_replicate

    @property
    def expert_shard_size(self) -> int:
        """Ranks that shard one copy of the expert parameters' states: dp·cp / (ep·dp_replicate)."""
        return self.shard_size // self.ep

    @property
    def per_layer_sharding(self) -> bool:
        """True when sharded parameters are gathered layer by layer (ZeRO-3, either FSDP mode)."""
        return self.fsdp or self.zero_stage == 3

    @property
    def zero_bubble(self) -> bool:
        """True for a schedule that splits the backward into input-gradient (B) and weight-gradient (W) passes."""
        return self.pipeline_schedule in ZERO_BUBBLE_SCHEDULES

    @property
    def v_shape(self) -> bool:
        """True when each rank holds two model chunks in a V: virtual stages ``r`` and ``2p-1-r`` on rank ``r``."""
        return self.pipeline_schedule in V_SHAPE_SCHEDULES

    @property
    def interleaved(self) -> bool:
        """True when each rank holds ``virtual_pipeline_stages`` chunks in Megatron's placement: virtual stages
        ``r, r+p, ...`` on rank ``r``."""
        return self.pipeline_schedule in INTERLEAVED_SCHEDULES

    @property
    def expert_load(self) -> float:
        """The busiest expert's rows over the balanced share: ``moe_capacity_factor``, 1.0 when unset."""
        return 1.0 if self.moe_capacity_factor is None else self.moe_capacity_factor

    @property
    def autocast(self) -> bool:
        """True when fp32 weights are cast to the run precision at every GEMM (torch.autocast)."""
        return self.mixed_precision == "autocast"

    @property
    def weight_precision(self) -> str:
        """Precision of the stored weights: fp32 under autocast, else the run precision."""
        return "fp32" if self.autocast else self.precision

    @property
    def reduce_precision(self) -> str:
        """Precision in which gradients travel in data-parallel reduction (autocast: the fp32 ``.grad``)."""
        if self.grad_reduce_precision is not None:
            return self.grad_reduce_precision
        if self.autocast:
            return "fp32"
        return "fp32" if self.precision in ("bf16", "fp8", "fp32", "tf32") else self.precision
