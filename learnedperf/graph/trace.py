"""Build an :class:`~learnedperf.graph.ops.OpGraph` from a real ``torch.nn.Module``.

:func:`from_module` traces the module with ``make_fx`` on *fake* tensors
(:class:`torch._subclasses.fake_tensor.FakeTensorMode`): parameters, buffers
and example inputs are replaced by fake tensors of the same shapes, strides and
dtypes, so tracing allocates no real memory (a module whose parameters live on
the ``meta`` device traces as well) and needs no GPU. The result is an
ATen-level FX graph whose nodes carry their output shapes; each meaningful node
becomes one forward :class:`Op`.

Mapping rules
-------------
* View-like nodes that move no data (``view``, ``reshape``, ``t``, ``transpose``,
  ``permute``, ``expand``, ``split``, ``getitem``, ``detach``, ...) and
  allocations (``empty*``) are dropped; dependencies through them are forwarded
  to the real producer. A ``contiguous()`` that copies shows up as ``clone`` and
  is kept as an element-wise copy, as are ``clone`` and dtype casts.
* Kinds: GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``linear``...) ->
  ``matmul``; fused attention kernels (``F.scaled_dot_product_attention``) ->
  ``attention``; ``convolution`` -> ``conv``; softmax / log-softmax ->
  ``softmax``; layer/group/batch norm -> ``layernorm``; the ops of a module whose
  class name ends with ``RMSNorm`` (e.g. ``nn.RMSNorm``, which ATen decomposes)
  are fused into one ``rmsnorm`` op (likewise a hand-written ``*LayerNorm``
  module -> one ``layernorm``); ``embedding``; ``log_softmax`` followed by
  ``nll_loss`` (what ``F.cross_entropy`` lowers to) -> one ``cross_entropy``;
  arithmetic, activations, dropout, copies, reductions, concatenation ->
  ``elementwise``; anything else -> ``other`` (FLOPs 0, bytes from tensor sizes).
* ``nn.MultiheadAttention`` with ``need_weights=True`` (its default) really runs
  as ``bmm`` + ``softmax`` + ``bmm`` and is traced as such; with
  ``need_weights=False`` it calls scaled-dot-product attention -> ``attention``.

FLOP conventions
----------------
* GEMM ``[m,k] x [k,n]`` (batched ``b`` times): ``2·b·m·n·k``. The bias of
  ``linear``/``addmm``/``baddbmm`` is **excluded** from FLOPs (it is a fused
  epilogue, the model-FLOPs convention) but its bytes are read.
* Convolution: ``2·N·Cout·prod(out_spatial)·(Cin/groups)·prod(kernel)`` (bias
  excluded); transposed convolution ``2·N·Cin·prod(in_spatial)·(Cout/groups)·prod(kernel)``.
* Attention: ``2·B·H·Sq·Skv·(D + Dv)`` (= ``4·B·H·Sq·Skv·D``), counted in full;
  a causal mask is recorded in ``Op.causal``.
* Memory-bound ops: FLOPs per element of the largest tensor involved: 1 for
  element-wise ops and reductions, 5 for softmax, norms and cross-entropy
  (as in :mod:`.transformer`), 0 for embedding and ``other``.

Bytes: every distinct tensor input read plus every output written, weights
included; floating-point tensors count ``dtype_bytes(dtype)`` per element
(the ``dtype`` argument, whatever the module's own dtype), integer / bool
tensors their real element size. Broadcast (stride-0) dimensions count once.
Exceptions: an embedding reads only the gathered rows (indices + output size),
not the whole table; ``nll_loss`` reads one element per row of its input.

Shapes: matmul ``(batch, m, n, k)``; attention ``(batch, heads, s_q, s_kv,
head_dim)``; conv is an implicit GEMM ``(groups, N·prod(out_spatial),
Cout/groups, (Cin/groups)·prod(kernel))`` (so ``flops == 2·prod(shape)``, like
a matmul); every other op ``(rows, cols)`` of its largest tensor, ``cols`` being
its last dimension.

Backward (``training=True``)
----------------------------
Appended after the forward ops, in reverse forward order, for every forward op
that is differentiable (some input derives from a parameter or from an example
input with ``requires_grad``; its output is floating point):

* matmul / conv: two ops of the forward FLOPs and bytes, one per operand:
  ``<name>.bwd_dgrad`` for an activation operand, ``<name>.bwd_wgrad`` for an
  operand derived from a parameter; a product of two activations gives
  ``<name>.bwd_dgrad`` and ``<name>.bwd_dgrad2``. The input gradient is emitted
  even when the activation needs none (the first layer's input), which matches
  the usual ``6·params·tokens`` convention; the weight gradient of a frozen
  parameter (``requires_grad=False``) is left out. Bias gradients are not
  counted.
* attention: one ``<name>.bwd`` op with 2x the forward FLOPs and bytes.
* memory-bound ops: one ``<name>.bwd`` op of the same kind with 2x the forward
  bytes (reads the output gradient and the saved input, writes the input
  gradient) and 2x the FLOPs.

Backward edges reverse the forward ones: the gradient op of a consumer (for a
GEMM, the op computing the gradient of the operand that producer made) -> every
backward op of the producer. Every backward op with no backward predecessor
depends on the last forward op.

Limitations: one trace for the given example inputs (shapes are static);
data-dependent Python control flow or data-dependent output shapes are
rejected; every tensor is faked on the CPU device, so code that hard-codes
another device fails; recomputation, optimizer and communication ops are not
produced; ops implemented in custom C++/Triton kernels without a fake/meta
implementation cannot be traced.

``torch`` is imported lazily inside :func:`from_module`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ..errors import SpecError
from ..units import PRECISIONS, dtype_bytes
from .ops import Op, OpGraph

__all__ = ["from_module"]

# ----------------------------------------------------------------- op tables
# Names are ATen overload-packet names with a trailing "_" (in-place) stripped.

#: Ops that move no data; dependencies are forwarded through them.
_VIEW_OPS = frozenset({
    "getitem", "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
    "expand_as", "squeeze", "unsqueeze", "slice", "select", "split", "split_with_sizes", "chunk", "unbind",
    "alias", "detach", "as_strided", "diagonal", "unflatten", "flatten", "view_as", "narrow", "movedim",
    "swapaxes", "swapdims", "numpy_T", "mT", "mH", "adjoint", "view_as_real", "view_as_complex", "unfold",
    "lift_fresh", "tensor_split", "hsplit", "vsplit", "dsplit", "real", "imag", "_conj", "_neg_view",
    "resolve_conj", "resolve_neg", "positive", "dropout_eval", "identity",
})
#: Allocations without initialisation: no data moved, no dependency.
_EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
#: Factory ops that write memory but depend on no input data.
_FACTORY_OPS = frozenset({
    "zeros", "ones", "full", "arange", "scalar_tensor", "zeros_like", "ones_like", "full_like", "rand", "randn",
    "randint", "rand_like", "randn_like", "randint_like", "randperm", "new_zeros", "new_ones", "new_full", "eye",
    "linspace", "logspace", "tensor",
})
_MATMUL_OPS = frozenset({"mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "matmul", "linear",
                         "mv", "addmv", "dot", "vdot", "_int_mm"})
_ATTENTION_OPS = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable",
})
_CONV_OPS = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                       "conv_transpose2d", "conv_transpose3d", "cudnn_convolution", "mkldnn_convolution",
                       "convolution_overrideable", "_convolution_mode", "cudnn_convolution_transpose"})
_SOFTMAX_OPS = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"})
_LAYERNORM_OPS = frozenset({
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "batch_norm", "native_batch_norm",
    "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "cudnn_batch_norm", "miopen_batch_norm", "_batch_norm_with_update", "_batch_norm_with_update_functional",
    "_batch_norm_no_update", "instance_norm",
})
_RMSNORM_OPS = frozenset({"rms_norm", "_fused_rms_norm"})
_EMBEDDING_OPS = frozenset({"embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"})
_NLL_OPS = frozenset({"nll_loss", "nll_loss_forward", "nll_loss2d", "nll_loss2d_forward", "nll_loss_nd",
                      "cross_entropy_loss"})
_ELEMENTWISE_OPS = frozenset({
    # arithmetic
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "neg", "abs",
    "reciprocal", "sqrt", "rsqrt", "square", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
    "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "atan2", "sigmoid", "logit", "erf", "erfc", "erfinv",
    "sign", "sgn", "floor", "ceil", "round", "trunc", "frac", "lerp", "addcmul", "addcdiv", "xlogy", "hypot",
    "clamp", "clamp_min", "clamp_max", "clip", "maximum", "minimum", "fmax", "fmin", "where", "masked_fill",
    "nan_to_num", "isnan", "isinf", "isfinite",
    # comparisons and logic
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor",
    # activations
    "relu", "relu6", "leaky_relu", "gelu", "silu", "mish", "elu", "selu", "celu", "hardtanh", "hardswish",
    "hardsigmoid", "softplus", "softshrink", "hardshrink", "threshold", "glu", "prelu", "_prelu_kernel",
    "log_sigmoid", "log_sigmoid_forward",
    # dropout and random masks
    "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "bernoulli", "uniform", "normal",
    # copies and layout changes that copy
    "clone", "copy", "_to_copy", "to", "contiguous", "lift_fresh_copy", "fill", "zero", "cat", "concat",
    "concatenate", "stack", "hstack", "vstack", "constant_pad_nd", "pad", "repeat", "repeat_interleave", "roll",
    "flip", "tril", "triu", "masked_scatter", "_unsafe_index",
    # reductions and scans
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "norm",
    "linalg_vector_norm", "prod", "all", "any", "argmax", "argmin", "logsumexp", "cumsum", "cumprod",
    "count_nonzero",
    # pooling and resampling (memory-bound passes)
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "upsample_nearest1d",
    "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d", "upsample_linear1d", "upsample_bicubic2d",
    "_upsample_nearest_exact2d",
})

#: FLOPs per element of the largest tensor, per memory-bound kind (see module docstring).
_FLOPS_PER_ELEM = {"elementwise": 1.0, "softmax": 5.0, "layernorm": 5.0, "rmsnorm": 5.0, "cross_entropy": 5.0,
                   "embedding": 0.0, "other": 0.0}
_GEMM_KINDS = ("matmul", "conv")
#: Module class-name endings (lower case) whose ops are fused into one norm op.
_FUSED_MODULES = (("rmsnorm", "rmsnorm"), ("layernorm", "layernorm"))
_MODULE_ERROR_FIELD = "module"


class _Rec:
    """A forward op under construction (mutable; turned into an :class:`Op` at the end)."""

    __slots__ = ("name", "base", "kind", "flops", "bytes", "shape", "causal", "deps", "grad", "operands",
                 "group_key", "group_nodes", "group_reads", "numel")

    def __init__(self, name: str, base: str, kind: str):
        self.name, self.base, self.kind = name, base, kind
        self.flops = 0.0
        self.bytes = 0.0
        self.shape: tuple = ()
        self.causal = False
        self.deps: set[int] = set()
        self.grad = False
        # backward routing: (role, producer record indices) per operand that receives a gradient;
        # role "a:dgrad" / "b:wgrad"... (operand position and gradient type) for GEMMs, "grad" otherwise
        self.operands: list[tuple[str, frozenset[int]]] = []
        self.group_key: tuple | None = None
        self.group_nodes: set = set()
        self.group_reads: dict = {}
        self.numel = 0


# ----------------------------------------------------------------- entry point
def from_module(module: Any, example_inputs: Any, *, dtype: str = "fp32", training: bool = True) -> OpGraph:
    """Trace ``module`` called on ``example_inputs`` into an :class:`OpGraph`.

    Args:
        module: a ``torch.nn.Module``; its parameters may live on any device,
            ``meta`` included (nothing is allocated or computed).
        example_inputs: positional inputs (a tuple or list; a single tensor is
            accepted too) or keyword inputs (a dict). Tensors may be real, meta
            or fake; only their shapes, strides and dtypes are used.
        dtype: precision used for the byte counts of floating-point tensors and
            recorded in every op (``"fp32"``, ``"bf16"``, ``"fp16"``...).
        training: trace in training mode and append the backward ops;
            ``False`` traces in eval mode and returns forward ops only.

    Returns:
        An :class:`OpGraph` with ``repeat`` 1 for every op (see the module
        docstring for the conventions).

    Raises:
        SpecError: ``"module"`` when the module cannot be traced with the given
            inputs (data-dependent control flow, wrong inputs...), ``"dtype"``
            for an unknown precision.
    """
    if dtype not in PRECISIONS:
        raise SpecError("dtype", f"unknown precision {dtype!r}; expected one of {', '.join(PRECISIONS)}")
    import torch

    if not isinstance(module, torch.nn.Module):
        raise SpecError(_MODULE_ERROR_FIELD, f"expected a torch.nn.Module, got {type(module).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    elif isinstance(example_inputs, dict):
        if not all(isinstance(k, str) for k in example_inputs):
            raise SpecError(_MODULE_ERROR_FIELD, "example_inputs given as a dict must have str keys (keyword "
                            "arguments of forward)")
        args, kwargs = (), dict(example_inputs)
    else:
        raise SpecError(_MODULE_ERROR_FIELD, "example_inputs must be a tuple of positional inputs or a dict of "
                        f"keyword inputs, got {type(example_inputs).__name__}")

    gm, param_leaves, grad_leaves = _trace(torch, module, args, kwargs, training)
    try:
        return _build(torch, gm, param_leaves, grad_leaves, dtype, training)
    except SpecError:
        raise
    except Exception as exc:  # a bug or an unforeseen graph: still one clear line
        raise SpecError(_MODULE_ERROR_FIELD, f"could not convert the traced graph of {type(module).__name__}: "
                        f"{_describe(exc)}") from None


# ----------------------------------------------------------------- tracing
def _describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (shortened)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    msg = lines[0] if lines else ""
    if len(msg) > 300:
        msg = msg[:297] + "..."
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _is_data_dependent(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    markers = ("DataDependentOutputException", "GuardOnDataDependentSymNode", "DynamicOutputShapeException")
    if names & set(markers):
        return True
    text = str(exc)
    return "data-dependent" in text or "data dependent" in text or "_local_scalar_dense" in text


def _sdpa_mode(torch: Any) -> Any:
    """A TorchFunctionMode that keeps ``F.scaled_dot_product_attention`` one fused op.

    On the (fake) CPU device PyTorch lowers attention with dropout to the math
    path (bmm, softmax, dropout, bmm); GPUs run a fused kernel. This mode calls
    the fused CPU kernel directly (its meta implementation only computes
    shapes) and falls back to the normal path when that fails.
    """
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    class _SdpaMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                out = _fused_sdpa(*args, **kwargs)
                if out is not None:
                    return out
            return func(*args, **kwargs)

    def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
        if not dropout_p:
            return None  # the default CPU path already picks the fused kernel when it can
        try:
            if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.size(1) != key.size(1):
                return None
            return fused(query, key, value, float(dropout_p), bool(is_causal), attn_mask=attn_mask, scale=scale)[0]
        except Exception:  # noqa: BLE001 - unsupported case: let PyTorch choose
            return None

    return _SdpaMode


def _trace(torch: Any, module: Any, args: tuple, kwargs: dict, training: bool):
    """Trace ``module(*args, **kwargs)`` on fake tensors; return (graph module, param leaves, grad leaves)."""
    import torch.utils._pytree as pytree
    import torch.fx.config as fx_config
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        with fake_mode:
            f = torch.empty_strided(tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()),
                                    dtype=t.dtype, device="cpu")
        if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex):
            f.requires_grad_(True)
        return f

    try:
        params = {n: fake(p) for n, p in module.named_parameters()}
        buffers = {n: fake(b) for n, b in module.named_buffers() if n not in params}
        # plain tensor attributes (not registered as buffers) are swapped too, so that real or meta
        # constants never meet the fake tensors
        consts = {}
        for path, sub in module.named_modules():
            for key, value in vars(sub).items():
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                    name = f"{path}.{key}" if path else key
                    if name not in params and name not in buffers:
                        consts[name] = fake(value)
        fargs = pytree.tree_map(fake, args)
        fkwargs = pytree.tree_map(fake, kwargs)
    except Exception as exc:
        raise SpecError(_MODULE_ERROR_FIELD, f"could not convert the parameters or example inputs of "
                        f"{type(module).__name__} to fake tensors: {_describe(exc)}") from None
    state = {**params, **buffers, **consts}
    param_leaves = {id(t) for t in params.values()}
    grad_leaves = {id(t) for t in pytree.tree_leaves((state, fargs, fkwargs))
                   if isinstance(t, torch.Tensor) and t.requires_grad}
    sdpa_mode = _sdpa_mode(torch)

    def run(state_, args_, kwargs_):
        with sdpa_mode():
            return functional_call(module, state_, args_, kwargs_)

    run._orig_mod = module  # lets make_fx record the module path of every node

    flags = [(m, m.training) for m in module.modules()]
    module.train(training)
    # fake-tensor dispatch logs a full traceback at ERROR level before re-raising shape errors;
    # the error reaches the caller as one SpecError line instead
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    old_level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    # stack-trace recording (on by default with module stacks) would cost a third of the time
    old_no_traces = getattr(fx_config, "do_not_emit_stack_traces", False)
    fx_config.do_not_emit_stack_traces = True
    try:
        gm = None
        first_error: BaseException | None = None
        for record_stack in (True, False):
            try:
                with torch.enable_grad():
                    gm = make_fx(run, tracing_mode="fake", record_module_stack=record_stack,
                                 _allow_non_fake_inputs=True)(state, fargs, fkwargs)
                break
            except Exception as exc:  # noqa: BLE001 - reported below as a SpecError
                first_error = first_error or exc
                if _is_data_dependent(exc) or isinstance(exc, TypeError):
                    break  # a retry without module-stack recording cannot help
    finally:
        fx_config.do_not_emit_stack_traces = old_no_traces
        fake_log.setLevel(old_level)
        for m, flag in flags:
            m.training = flag
    if gm is None:
        exc = first_error
        cls = type(module).__name__
        if _is_data_dependent(exc):
            raise SpecError(_MODULE_ERROR_FIELD, f"cannot trace {cls}: its Python control flow or output shapes "
                            f"depend on tensor values (e.g. `if x.sum() > 0:`), which a shape-only trace cannot "
                            f"know ({_describe(exc)})") from None
        raise SpecError(_MODULE_ERROR_FIELD, f"tracing {cls} with the example inputs failed: "
                        f"{_describe(exc)}") from None

    # make_fx creates one placeholder per flattened leaf of (state, args, kwargs), in order
    leaves = pytree.tree_leaves((state, fargs, fkwargs))
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(leaves):  # should not happen; keep only the tensor leaves, in order
        leaves = [t for t in leaves if isinstance(t, torch.Tensor)]
        phs = [n for n in phs if isinstance(n.meta.get("val"), torch.Tensor)]
    ph_params, ph_grad = set(), set()
    for node, leaf in zip(phs, leaves):
        if id(leaf) in param_leaves:
            ph_params.add(node.name)
        if id(leaf) in grad_leaves:
            ph_grad.add(node.name)
    return gm, ph_params, ph_grad


# ----------------------------------------------------------------- graph building
def _op_name(target: Any) -> str:
    """ATen overload-packet name of a node target (in-place trailing ``_`` stripped)."""
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(target, "__name__", None) or str(target)
    name = name.split(".")[-1]
    if name.endswith("_") and not name.endswith("__") and len(name) > 1:
        name = name[:-1]
    return name


def _pretty(name: str) -> str:
    """A readable op base name (``_native_batch_norm_legit`` -> ``batch_norm_legit``)."""
    name = name.lstrip("_")
    if name.startswith("native_"):
        name = name[len("native_"):]
    return name or "op"


def _tensors(val: Any, torch: Any) -> list:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        out = []
        for v in val:
            out.extend(_tensors(v, torch))
        return out
    return []


def _numel(t: Any) -> int:
    """Elements actually stored (broadcast, stride-0 dimensions counted once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        size = int(size)
        if size == 0:
            return 0
        if int(stride) != 0:
            n *= size
    return n


def _rows_cols(t: Any) -> tuple[int, int]:
    if t.dim() == 0:
        return (1, 1)
    cols = max(1, int(t.shape[-1]))
    return (max(1, int(t.numel()) // cols), cols)


def _arg(node: Any, name: str, default: Any = None) -> Any:
    """Argument ``name`` of an ATen call node, by its schema."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return default
    pos = 0
    for a in schema.arguments:
        if a.kwarg_only:
            if a.name == name:
                return node.kwargs.get(name, default)
            continue
        if a.name == name:
            if pos < len(node.args):
                return node.args[pos]
            return node.kwargs.get(name, default)
        pos += 1
    return default


def _module_of(node: Any) -> tuple[str, str]:
    """(path, lower-case class name) of the innermost module that issued ``node``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, typ = list(stack.values())[-1][:2]
    typ = typ if isinstance(typ, str) else f"{getattr(typ, '__module__', '')}.{getattr(typ, '__qualname__', typ)}"
    return str(path), typ.split(".")[-1].lower()


def _build(torch: Any, gm: Any, ph_params: set, ph_grad: set, dtype: str, training: bool) -> OpGraph:
    e = dtype_bytes(dtype)

    def esize(t: Any) -> int:
        if t.dtype.is_floating_point:
            return e
        if t.dtype.is_complex:
            return 2 * e
        return int(t.dtype.itemsize)

    def nbytes(t: Any) -> float:
        return float(_numel(t) * esize(t))

    def val_of(n: Any) -> list:
        return _tensors(n.meta.get("val"), torch) if hasattr(n, "meta") else []

    src: dict[Any, frozenset[int]] = {}  # node -> producing record indices
    weight: dict[Any, bool] = {}  # node derives from a parameter through views / copies
    grad: dict[Any, bool] = {}  # node is differentiable
    recs: list[_Rec] = []
    rec_of_node: dict[Any, int] = {}
    name_count: dict[str, int] = {}

    def unique(name: str) -> str:
        k = name_count.get(name, 0)
        name_count[name] = k + 1
        return name if k == 0 else f"{name}_{k}"

    def real_users(n: Any) -> set:
        out = set()
        for u in n.users:
            if u.op == "call_function" and _op_name(u.target) in _VIEW_OPS:
                out |= real_users(u)
            else:
                out.add(u)
        return out

    def origin(n: Any) -> Any:
        while n.op == "call_function" and _op_name(n.target) in _VIEW_OPS:
            ins = [i for i in n.all_input_nodes if val_of(i)]
            if len(ins) != 1:
                break
            n = ins[0]
        return n

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            src[node] = frozenset()
            weight[node] = node.name in ph_params
            grad[node] = node.name in ph_grad
            continue
        if node.op != "call_function":  # get_attr constants, output
            src[node] = frozenset()
            weight[node] = grad[node] = False
            continue
        name = _op_name(node.target)
        ins = [i for i in node.all_input_nodes if val_of(i)]
        in_src = frozenset().union(*(src.get(i, frozenset()) for i in ins)) if ins else frozenset()
        any_grad = any(grad.get(i, False) for i in ins)
        outs = val_of(node)
        if name in _VIEW_OPS:
            src[node] = in_src
            weight[node] = bool(ins) and all(weight.get(i, False) for i in ins)
            grad[node] = any_grad
            continue
        if name in _EMPTY_OPS or not outs:
            src[node] = frozenset()
            weight[node] = grad[node] = False
            continue

        kind = _classify(name)
        factory = name in _FACTORY_OPS
        out_float = any(t.dtype.is_floating_point or t.dtype.is_complex for t in outs)
        is_grad = (not factory) and any_grad and out_float
        path, mtype = _module_of(node)

        # --- cross-entropy: fuse log_softmax -> nll_loss
        if kind == "cross_entropy":
            inp = _arg(node, "self")
            o = origin(inp) if inp is not None and hasattr(inp, "op") else None
            ri = rec_of_node.get(o) if o is not None else None
            if ri is not None and recs[ri].base == "log_softmax" and real_users(o) == {node}:
                r = recs[ri]
                r.kind, r.base = "cross_entropy", "cross_entropy"
                r.name = unique(f"{r.name.rsplit('.', 1)[0]}.cross_entropy" if "." in r.name else "cross_entropy")
                r.bytes += _nll_bytes(node, ins, val_of, nbytes, esize)
                r.flops = _FLOPS_PER_ELEM["cross_entropy"] * r.numel
                r.grad = r.grad or is_grad
                extra = frozenset(x for i in ins if i is not inp for x in src.get(i, frozenset())) - {ri}
                r.deps |= extra
                r.operands = [("grad", frozenset(r.deps))]
                src[node] = frozenset({ri})
                rec_of_node[node] = ri
                weight[node], grad[node] = False, is_grad
                continue

        # --- fused norm modules (nn.RMSNorm and friends decompose into element-wise ATen ops)
        group_kind = None
        if kind not in ("matmul", "conv", "attention") and mtype:
            for frag, gk in _FUSED_MODULES:
                if mtype.endswith(frag):
                    group_kind = gk
                    break
        if group_kind is not None and recs and recs[-1].group_key == (path, mtype):
            r = recs[-1]
            ri = len(recs) - 1
            # a fused kernel reads what flows in from outside the module and writes its final output
            r.group_nodes.add(node)
            for i in ins:
                if i not in r.group_nodes and i not in r.group_reads:
                    r.group_reads[i] = sum(nbytes(t) for t in val_of(i))
            r.bytes = sum(r.group_reads.values()) + sum(nbytes(t) for t in outs)
            big = max([*outs, *(t for i in ins for t in val_of(i))], key=lambda t: t.numel())
            if big.numel() > r.numel:
                r.numel = int(big.numel())
                r.shape = _rows_cols(big)
            r.flops = _FLOPS_PER_ELEM[group_kind] * r.numel
            r.deps |= in_src - {ri}
            r.operands = [("grad", frozenset(r.deps))]
            r.grad = r.grad or is_grad
            src[node] = frozenset({ri})
            rec_of_node[node] = ri
            weight[node], grad[node] = False, is_grad or r.grad
            continue

        base = _pretty(name)
        if group_kind is not None:
            kind, base = group_kind, ("rms_norm" if group_kind == "rmsnorm" else "layer_norm")
        elif kind == "attention":
            base = "attention"
        full = unique(f"{path}.{base}" if path else base)
        r = _Rec(full, "log_softmax" if name in ("log_softmax", "_log_softmax") else base, kind)
        r.grad = is_grad
        ri = len(recs)
        if not factory:
            r.deps = set(in_src)
        in_vals = [t for i in ins for t in val_of(i)]
        reads = 0.0 if factory else sum(nbytes(t) for t in in_vals)
        writes = sum(nbytes(t) for t in outs)
        big = max([*outs, *in_vals], key=lambda t: t.numel())
        r.numel = int(big.numel())

        if kind == "matmul":
            dims, a, b = _matmul_dims(node, name)
            r.shape = dims
            r.flops = 2.0 * math.prod(dims)
            r.bytes = reads + writes
            r.operands = _gemm_operands(a, b, src, weight, grad)
        elif kind == "conv":
            dims, a, b = _conv_dims(node)
            r.shape = dims
            r.flops = 2.0 * math.prod(dims)
            r.bytes = reads + writes
            r.operands = _gemm_operands(a, b, src, weight, grad)
        elif kind == "attention":
            q, k, v = (val_of(_arg(node, n_))[0] for n_ in ("query", "key", "value"))
            sq, d = int(q.shape[-2]), int(q.shape[-1])
            skv, dv = int(k.shape[-2]), int(v.shape[-1])
            lead = [int(s) for s in q.shape[:-2]]
            bsz = lead[0] if len(lead) >= 2 else 1
            heads = math.prod(lead) // max(1, bsz) if lead else 1
            r.shape = (bsz, heads, sq, skv, d)
            r.flops = 2.0 * bsz * heads * sq * skv * (d + dv)
            r.bytes = reads + writes
            r.causal = bool(_arg(node, "is_causal", False))
            r.operands = [("grad", frozenset(r.deps))]
        else:
            if kind == "embedding":
                idx = [t for t in in_vals if not (t.dtype.is_floating_point or t.dtype.is_complex)]
                reads = sum(nbytes(t) for t in idx) + writes  # indices + the gathered rows
            elif kind == "cross_entropy":
                reads = _nll_bytes(node, ins, val_of, nbytes, esize) - writes
            r.shape = _rows_cols(outs[0] if kind == "embedding" else big)
            r.flops = _FLOPS_PER_ELEM[kind] * r.numel
            r.bytes = reads + writes
            r.operands = [("grad", frozenset(r.deps))]
        if group_kind is not None:
            r.group_key = (path, mtype)
            r.group_nodes = {node}
            r.group_reads = {i: sum(nbytes(t) for t in val_of(i)) for i in ins}
            r.bytes = sum(r.group_reads.values()) + writes
            r.flops = _FLOPS_PER_ELEM[kind] * r.numel
        recs.append(r)
        rec_of_node[node] = ri
        src[node] = frozenset({ri})
        weight[node] = name in ("clone", "_to_copy", "to", "contiguous", "copy") and bool(ins) \
            and all(weight.get(i, False) for i in ins)
        grad[node] = is_grad

    return _assemble(recs, dtype, training)


def _classify(name: str) -> str:
    if name in _MATMUL_OPS:
        return "matmul"
    if name in _ATTENTION_OPS:
        return "attention"
    if name in _CONV_OPS:
        return "conv"
    if name in _SOFTMAX_OPS:
        return "softmax"
    if name in _LAYERNORM_OPS:
        return "layernorm"
    if name in _RMSNORM_OPS:
        return "rmsnorm"
    if name in _EMBEDDING_OPS:
        return "embedding"
    if name in _NLL_OPS:
        return "cross_entropy"
    if name in _ELEMENTWISE_OPS or name in _FACTORY_OPS:
        return "elementwise"
    return "other"


def _nll_bytes(node: Any, ins: list, val_of: Any, nbytes: Any, esize: Any) -> float:
    """Bytes of an ``nll_loss``: one element per row of its input, the targets, weights, outputs."""
    inp = _arg(node, "self")
    total = 0.0
    for i in ins:
        for t in val_of(i):
            if i is inp:
                rows = int(t.numel()) // max(1, int(t.shape[1]) if t.dim() >= 2 else int(t.numel()))
                total += rows * esize(t)
            else:
                total += nbytes(t)
    return total + sum(nbytes(t) for t in val_of(node))


def _shape_of(n: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in n.meta["val"].shape)


def _matmul_dims(node: Any, name: str) -> tuple[tuple[int, int, int, int], Any, Any]:
    """((batch, m, n, k), operand a, operand b) of a GEMM node."""
    if name in ("mm", "_int_mm"):
        a, b = _arg(node, "self"), _arg(node, "mat2")
    elif name in ("addmm", "_addmm_activation"):
        a, b = _arg(node, "mat1"), _arg(node, "mat2")
    elif name == "bmm":
        a, b = _arg(node, "self"), _arg(node, "mat2")
    elif name in ("baddbmm", "addbmm"):
        a, b = _arg(node, "batch1"), _arg(node, "batch2")
    elif name == "linear":
        a, b = _arg(node, "input"), _arg(node, "weight")
        sa, sb = _shape_of(a), _shape_of(b)
        k = sb[-1]
        n = sb[0] if len(sb) == 2 else 1
        return (1, math.prod(sa) // max(1, k), n, k), a, b
    elif name == "mv":
        a, b = _arg(node, "self"), _arg(node, "vec")
    elif name == "addmv":
        a, b = _arg(node, "mat"), _arg(node, "vec")
    elif name in ("dot", "vdot"):
        a, b = _arg(node, "self"), _arg(node, "tensor")
    else:  # matmul: broadcasting batched product
        a, b = _arg(node, "self"), _arg(node, "other")
    sa, sb = _shape_of(a), _shape_of(b)
    if len(sa) == 1:
        sa = (1, sa[0])
    if len(sb) == 1:
        sb = (sb[0], 1)
    m, k, n = sa[-2], sa[-1], sb[-1]
    batch = max(math.prod(sa[:-2]), math.prod(sb[:-2])) if name != "addbmm" else sa[0]
    return (max(1, batch), m, n, k), a, b


def _conv_dims(node: Any) -> tuple[tuple[int, int, int, int], Any, Any]:
    """Implicit-GEMM dims (groups, m, n, k) of a convolution node, with its input and weight."""
    inp, w = _arg(node, "input"), _arg(node, "weight")
    si, sw, so = _shape_of(inp), _shape_of(w), _shape_of(node)
    groups = int(_arg(node, "groups", 1) or 1)
    transposed = bool(_arg(node, "transposed", False))
    kernel = math.prod(sw[2:])
    batch = si[0]
    if transposed:  # weight [Cin, Cout/groups, *k]
        cin, cout_g = sw[0], sw[1]
        return (groups, batch * math.prod(si[2:]), cout_g * kernel, cin // groups), inp, w
    cout, cin_g = sw[0], sw[1]  # weight [Cout, Cin/groups, *k]
    return (groups, batch * math.prod(so[2:]), cout // groups, cin_g * kernel), inp, w


def _gemm_operands(a: Any, b: Any, src: dict, weight: dict, grad: dict) -> list[tuple[str, frozenset[int]]]:
    """Backward roles of the two GEMM operands: ``wgrad`` for parameters, ``dgrad`` for activations.

    Role ``"a:..."``/``"b:..."`` prefixes keep the operand position (it fixes the backward GEMM's shape).
    A frozen parameter (no ``requires_grad``) gets no weight gradient; an activation always gets its
    input gradient (the 6·params·tokens convention counts it even for the first layer).
    """
    out = []
    for pos, x in zip("ab", (a, b)):
        if weight.get(x, False):
            if grad.get(x, False):
                out.append((f"{pos}:wgrad", src.get(x, frozenset())))
        else:
            out.append((f"{pos}:dgrad", src.get(x, frozenset())))
    return out


def _assemble(recs: list[_Rec], dtype: str, training: bool) -> OpGraph:
    g = OpGraph()
    for i, r in enumerate(recs):
        g.add(Op(r.name, r.kind, "fwd", float(r.flops), float(r.bytes), dtype, tuple(int(x) for x in r.shape),
                 None, r.causal), sorted(d for d in r.deps if d < i))
    if not training or not recs:
        return g
    n_fwd = len(recs)
    bwd_of: dict[int, list[int]] = {}  # forward record -> its backward op indices
    role_of: dict[int, list[tuple[int, frozenset[int]]]] = {}  # forward record -> (bwd op, producers it feeds)
    for i in reversed(range(n_fwd)):
        r = recs[i]
        if not r.grad:
            continue
        ops_i: list[int] = []
        routes: list[tuple[int, frozenset[int]]] = []
        if r.kind in _GEMM_KINDS:
            b, m, n, k = r.shape
            seen: dict[str, int] = {}
            for tagged, producers in r.operands:
                pos, role = tagged.split(":")
                seen[role] = seen.get(role, 0) + 1
                suffix = f"bwd_{role}" + ("" if seen[role] == 1 else str(seen[role]))
                # gradient of operand a: [m,n]x[n,k]; of operand b: [k,m]x[m,n]; same FLOPs and traffic
                shape = (b, m, k, n) if pos == "a" else (b, k, n, m)
                idx = g.add(Op(f"{r.name}.{suffix}", r.kind, "bwd", float(r.flops), float(r.bytes), dtype, shape))
                ops_i.append(idx)
                routes.append((idx, producers))
        else:
            factor = 2.0
            idx = g.add(Op(f"{r.name}.bwd", r.kind, "bwd", factor * r.flops, factor * r.bytes, dtype,
                           tuple(int(x) for x in r.shape), None, r.causal))
            ops_i.append(idx)
            routes.append((idx, frozenset(r.deps)))
        bwd_of[i] = ops_i
        role_of[i] = routes
    edges: set[tuple[int, int]] = set()
    for i, routes in role_of.items():
        for idx, producers in routes:
            for p in producers:
                if p != i:
                    for q in bwd_of.get(p, ()):
                        edges.add((idx, q))
    has_pred = {c for _, c in edges}
    last_fwd = n_fwd - 1
    for ops_i in bwd_of.values():
        for idx in ops_i:
            if idx not in has_pred:
                edges.add((last_fwd, idx))
    g.edges.extend(sorted(edges))
    return g
