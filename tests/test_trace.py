"""Tests of learnedperf.graph.trace.from_module (tracing real torch modules on fake tensors)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from collections import deque

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from learnedperf.errors import SpecError  # noqa: E402
from learnedperf.graph.ops import COMPUTE_KINDS, OpGraph  # noqa: E402
from learnedperf.graph.trace import from_module  # noqa: E402


# ----------------------------------------------------------------- helpers
def topo_order(g: OpGraph) -> list[int]:
    """Kahn's algorithm; fails the test if the edges contain a cycle or a bad index."""
    n = len(g.ops)
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for a, b in g.edges:
        assert 0 <= a < n and 0 <= b < n and a != b, (a, b)
        succ[a].append(b)
        indeg[b] += 1
    queue = deque(i for i in range(n) if indeg[i] == 0)
    order = []
    while queue:
        i = queue.popleft()
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                queue.append(j)
    assert len(order) == n, "edges contain a cycle"
    return order


def fwd(g: OpGraph, kind: str | None = None) -> list:
    return [o for o in g.ops if o.phase == "fwd" and (kind is None or o.kind == kind)]


def bwd(g: OpGraph, kind: str | None = None) -> list:
    return [o for o in g.ops if o.phase == "bwd" and (kind is None or o.kind == kind)]


def check_well_formed(g: OpGraph, dtype: str = "fp32") -> None:
    assert len(g.repeat) == len(g.ops) and all(r == 1 for r in g.repeat)
    topo_order(g)
    for o in g.ops:
        assert o.kind in COMPUTE_KINDS and o.kind != "optimizer", o
        assert o.phase in ("fwd", "bwd")
        assert o.dtype == dtype
        assert o.flops >= 0 and o.bytes >= 0
        if o.kind in ("matmul", "conv"):
            assert len(o.shape) == 4
            b, m, n, k = o.shape
            assert o.flops == pytest.approx(2.0 * b * m * n * k)
        elif o.kind == "attention":
            assert len(o.shape) == 5
        else:
            assert len(o.shape) == 2
    names = [o.name for o in g.ops]
    assert len(names) == len(set(names)), "op names must be unique"
    # all forward ops precede the backward ops
    phases = [o.phase for o in g.ops]
    assert phases == sorted(phases, key=lambda p: p != "fwd")


def path_exists(g: OpGraph, a: int, b: int) -> bool:
    succ: dict[int, list[int]] = {}
    for x, y in g.edges:
        succ.setdefault(x, []).append(y)
    stack, seen = [a], {a}
    while stack:
        i = stack.pop()
        if i == b:
            return True
        for j in succ.get(i, ()):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return False


def index_of(g: OpGraph, name: str) -> int:
    return [o.name for o in g.ops].index(name)


# ----------------------------------------------------------------- MLP
def mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))


def test_mlp_forward_flops_bytes_and_edges():
    g = from_module(mlp(), (torch.randn(8, 64),))
    check_well_formed(g)
    mms = fwd(g, "matmul")
    assert len(mms) == 2
    # bias excluded from FLOPs (documented convention): 2·M·N·K per linear
    assert [o.flops for o in mms] == [2.0 * 8 * 64 * 256] * 2
    assert mms[0].shape == (1, 8, 256, 64) and mms[1].shape == (1, 8, 64, 256)
    # bytes: input + weight + bias read, output written (fp32)
    assert mms[0].bytes == 4.0 * (8 * 64 + 256 * 64 + 256 + 8 * 256)
    assert mms[1].bytes == 4.0 * (8 * 256 + 64 * 256 + 64 + 8 * 64)
    gelu = fwd(g, "elementwise")
    assert len(gelu) == 1 and gelu[0].flops == 8 * 256 and gelu[0].shape == (8, 256)
    assert len(fwd(g)) == 3
    # closed form of the forward pass: two GEMMs + one FLOP per GELU output element
    assert g.total_flops("fwd") == 2 * (2.0 * 8 * 64 * 256) + 8 * 256
    # first linear -> GELU -> second linear
    i0, i1, i2 = (index_of(g, o.name) for o in fwd(g))
    assert g.ops[i1] is gelu[0]
    assert (i0, i1) in g.edges and (i1, i2) in g.edges and (i0, i2) not in g.edges
    assert path_exists(g, i0, i2)


def test_mlp_backward():
    g = from_module(mlp(), (torch.randn(8, 64),))
    fwd_mm = sum(o.flops for o in fwd(g, "matmul"))
    bwd_mm = bwd(g, "matmul")
    assert len(bwd_mm) == 4
    assert sum(o.flops for o in bwd_mm) == 2 * fwd_mm
    names = {o.name for o in g.ops}
    for lin in fwd(g, "matmul"):
        assert f"{lin.name}.bwd_dgrad" in names and f"{lin.name}.bwd_wgrad" in names
        d = g.ops[index_of(g, f"{lin.name}.bwd_dgrad")]
        w = g.ops[index_of(g, f"{lin.name}.bwd_wgrad")]
        assert d.flops == w.flops == lin.flops
    gelu_b = bwd(g, "elementwise")
    assert len(gelu_b) == 1 and gelu_b[0].name == fwd(g, "elementwise")[0].name + ".bwd"
    assert gelu_b[0].bytes == pytest.approx(2 * fwd(g, "elementwise")[0].bytes)
    # backward edges reverse the forward ones, and the last forward op starts the backward pass
    last_fwd = len(fwd(g)) - 1
    first_bwd = len(fwd(g))
    assert (last_fwd, first_bwd) in g.edges
    second, first = (o.name for o in reversed(fwd(g, "matmul")))
    i_d2 = index_of(g, f"{second}.bwd_dgrad")
    i_gb = index_of(g, gelu_b[0].name)
    assert (i_d2, i_gb) in g.edges
    assert (i_gb, index_of(g, f"{first}.bwd_dgrad")) in g.edges
    assert (i_gb, index_of(g, f"{first}.bwd_wgrad")) in g.edges
    # a weight gradient feeds no other gradient
    assert not any(a == index_of(g, f"{second}.bwd_wgrad") for a, _ in g.edges)
    check_well_formed(g)


def test_inference_dtype_and_module_state_untouched():
    m = mlp()
    m.eval()
    g = from_module(m, (torch.randn(8, 64),), dtype="bf16", training=False)
    check_well_formed(g, "bf16")
    assert not bwd(g)
    assert fwd(g, "matmul")[0].bytes == 2.0 * (8 * 64 + 256 * 64 + 256 + 8 * 256)
    assert not m.training  # restored
    m.train()
    from_module(m, (torch.randn(8, 64),), training=False)
    assert all(sub.training for sub in m.modules())
    assert m[0].weight.device.type == "cpu"  # the module itself is left alone


def test_keyword_inputs_and_single_tensor():
    g1 = from_module(nn.Linear(4, 3), {"input": torch.randn(2, 4)})
    g2 = from_module(nn.Linear(4, 3), torch.randn(2, 4))
    assert [o.flops for o in fwd(g1)] == [o.flops for o in fwd(g2)] == [2.0 * 2 * 3 * 4]


# ----------------------------------------------------------------- transformer block
class TinyLM(nn.Module):
    """Embedding, pre-norm causal self-attention (SDPA), GELU MLP, final norm, LM head, cross-entropy."""

    def __init__(self, vocab=96, d=32, heads=4, seq=16, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        d = x.shape[-1]
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.proj(y))
        x = x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_transformer_block():
    B, T, V, D, H = 2, 16, 96, 32, 4
    idx = torch.randint(0, V, (B, T))
    g = from_module(TinyLM(V, D, H, T), (idx, idx))
    check_well_formed(g)
    kinds = {o.kind for o in fwd(g)}
    assert {"embedding", "layernorm", "attention", "matmul", "cross_entropy", "elementwise"} <= kinds
    # closed form of the GEMMs: qkv, proj, fc1, fc2, lm head (bias excluded)
    tokens = B * T
    expected_mm = 2.0 * tokens * (D * 3 * D + D * D + D * 4 * D + 4 * D * D + D * V)
    assert sum(o.flops for o in fwd(g, "matmul")) == expected_mm
    assert len(fwd(g, "matmul")) == 5
    (att,) = fwd(g, "attention")
    hd = D // H
    assert att.shape == (B, H, T, T, hd)
    assert att.flops == 4.0 * B * H * T * T * hd
    assert att.causal
    assert len(fwd(g, "embedding")) == 2 and len(fwd(g, "layernorm")) == 3
    (ce,) = fwd(g, "cross_entropy")  # log_softmax + nll_loss fused into one op
    assert ce.shape == (tokens, V)
    assert not fwd(g, "softmax")
    # the causal-attention op is reached from the token embedding and reaches the loss
    i_emb, i_att, i_ce = (index_of(g, o.name) for o in (fwd(g, "embedding")[0], att, ce))
    assert path_exists(g, i_emb, i_att) and path_exists(g, i_att, i_ce)
    # backward
    assert sum(o.flops for o in bwd(g, "matmul")) == 2 * expected_mm
    (att_b,) = bwd(g, "attention")
    assert att_b.flops == 2 * att.flops and att_b.causal
    assert path_exists(g, i_ce, index_of(g, att_b.name))
    # view-like ops (split, view, transpose, getitem) never become ops
    assert not any(o.name.split(".")[-1].startswith(("view", "transpose", "split", "getitem")) for o in g.ops)
    # dropout runs in training mode only
    assert any("drop" in o.name for o in fwd(g))
    g_eval = from_module(TinyLM(V, D, H, T), (idx, idx), training=False)
    assert not any("drop" in o.name for o in g_eval.ops) and not bwd(g_eval)
    assert sum(o.flops for o in fwd(g_eval, "matmul")) == expected_mm


def test_multihead_attention_module():
    B, T, D, H = 2, 8, 32, 4

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(D, H, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)[0]

    g = from_module(M(), (torch.randn(B, T, D),))
    check_well_formed(g)
    hd = D // H
    # in-projection, QK^T and PV batched GEMMs (need_weights=True runs the explicit path), out-projection
    expected = 2.0 * B * T * D * 3 * D + 2 * (2.0 * B * H * T * T * hd) + 2.0 * B * T * D * D
    assert sum(o.flops for o in fwd(g, "matmul")) == expected
    assert len(fwd(g, "softmax")) == 1
    assert any(o.shape[0] == B * H for o in fwd(g, "matmul"))  # the bmm's batch dimension


def test_sdpa_with_dropout_stays_one_attention_op():
    q = torch.randn(2, 4, 16, 8, requires_grad=True)

    class A(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)

    g = from_module(A(), (q, q, q))
    (att,) = fwd(g, "attention")
    assert att.flops == 4.0 * 2 * 4 * 16 * 16 * 8 and not att.causal
    assert len(g.ops) == 2 and bwd(g, "attention")[0].flops == 2 * att.flops


def test_rmsnorm_module_is_one_op():
    g = from_module(nn.Sequential(nn.Linear(16, 16), nn.RMSNorm(16)), (torch.randn(4, 16),))
    (rms,) = fwd(g, "rmsnorm")
    assert rms.shape == (4, 16)
    assert len(fwd(g)) == 2
    # fused kernel: reads input and weight, writes the output
    assert rms.bytes == 4.0 * (4 * 16 + 16 + 4 * 16)


# ----------------------------------------------------------------- convolution
def test_conv2d_flops():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, groups=2),
    )
    g = from_module(model, (torch.randn(4, 3, 32, 32),))
    check_well_formed(g)
    c1, c2 = fwd(g, "conv")
    # 2 · N · Cout · Hout · Wout · (Cin / groups) · kh · kw
    assert c1.flops == 2.0 * 4 * 16 * 32 * 32 * 3 * 3 * 3
    assert c2.flops == 2.0 * 4 * 32 * 15 * 15 * (16 // 2) * 3 * 3
    assert c2.shape == (2, 4 * 15 * 15, 16, 8 * 9)  # implicit GEMM (groups, N·Ho·Wo, Cout/g, Cin/g·kh·kw)
    assert c1.bytes >= 4.0 * (4 * 3 * 32 * 32 + 16 * 3 * 9 + 4 * 16 * 32 * 32)
    assert sum(o.flops for o in bwd(g, "conv")) == 2 * (c1.flops + c2.flops)
    assert len(bwd(g, "conv")) == 4


# ----------------------------------------------------------------- other ops and edges
def test_unknown_op_is_other_and_copies_are_kept():
    class M(nn.Module):
        def forward(self, x):
            vals = torch.topk(x, 3).values  # no rule for topk -> "other"
            return vals.t().contiguous() + x.contiguous()[:, :3].t()

    g = from_module(M(), (torch.randn(5, 7),))
    check_well_formed(g)
    (other,) = [o for o in fwd(g) if o.kind == "other"]
    assert other.flops == 0
    assert other.bytes == 4 * 5 * 7 + 4 * 5 * 3 + 8 * 5 * 3  # input, values, int64 indices
    # the copying contiguous() (a clone) is an element-wise op; the no-op contiguous() and views vanish
    ew = fwd(g, "elementwise")
    assert sorted(o.name for o in ew) == ["add", "clone"]
    i_other, i_clone, i_add = index_of(g, other.name), index_of(g, "clone"), index_of(g, "add")
    assert (i_other, i_clone) in g.edges and (i_clone, i_add) in g.edges


def test_batched_matmul_of_activations_has_two_dgrads():
    class M(nn.Module):
        def forward(self, a, b):
            return a @ b

    g = from_module(M(), (torch.randn(3, 4, 5, requires_grad=True), torch.randn(3, 5, 6, requires_grad=True)))
    (mm,) = fwd(g, "matmul")
    assert mm.flops == 2.0 * 3 * 4 * 6 * 5 and mm.shape == (3, 4, 6, 5)
    assert sorted(o.name for o in bwd(g)) == [f"{mm.name}.bwd_dgrad", f"{mm.name}.bwd_dgrad2"]


def test_huge_meta_module_allocates_nothing(monkeypatch):
    def no_cuda(*_a, **_k):
        raise AssertionError("tracing must not touch CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda)
    with torch.device("meta"):
        huge = nn.Sequential(nn.Linear(50000, 50000), nn.ReLU(), nn.Linear(50000, 50000))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    t0 = time.perf_counter()
    g = from_module(huge, (torch.randn(4, 50000),))  # a real input is only looked at
    elapsed = time.perf_counter() - t0
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert elapsed < 30  # generous: includes the one-off import of torch._dynamo on a cold process
    assert rss_after - rss_before < 1_000_000  # far below the 20 GB of the two weights
    mm = fwd(g, "matmul")
    assert [o.flops for o in mm] == [2.0 * 4 * 50000 * 50000] * 2
    assert all(o.bytes > 4.0 * 50000 * 50000 for o in mm)
    assert huge[0].weight.device.type == "meta"


def test_tied_weights_and_non_tensor_inputs():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.head = nn.Linear(8, 50, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx, scale: float):
            return self.head(self.emb(idx)) * scale

    g = from_module(M(), (torch.randint(0, 50, (2, 3)), 0.5))
    (emb,) = fwd(g, "embedding")
    assert emb.shape == (6, 8)
    # the embedding reads its indices and the gathered rows only, not the whole table
    assert emb.bytes == 8 * 6 + 2 * 4 * 6 * 8
    (mm,) = fwd(g, "matmul")
    assert mm.flops == 2.0 * 6 * 50 * 8
    assert {o.name for o in bwd(g, "matmul")} == {f"{mm.name}.bwd_dgrad", f"{mm.name}.bwd_wgrad"}


# ----------------------------------------------------------------- errors
def test_data_dependent_control_flow_raises_spec_error():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            if x.sum() > 0:
                return self.lin(x)
            return x

    with pytest.raises(SpecError) as info:
        from_module(M(), (torch.randn(2, 4),))
    assert info.value.field == "module"
    assert "depend on tensor values" in info.value.message


def test_data_dependent_shape_raises_spec_error():
    class M(nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(SpecError) as info:
        from_module(M(), (torch.randn(5),))
    assert info.value.field == "module"


@pytest.mark.parametrize("inputs", [(torch.randn(2, 5),), (torch.randn(2, 4), torch.randn(2)), {"bogus": 1}])
def test_wrong_example_inputs_raise_spec_error(inputs):
    with pytest.raises(SpecError) as info:
        from_module(nn.Linear(4, 4), inputs)
    assert info.value.field == "module"
    assert "\n" not in str(info.value)


def test_bad_arguments_raise_spec_error():
    with pytest.raises(SpecError) as info:
        from_module(lambda x: x, (torch.randn(2),))
    assert info.value.field == "module"
    with pytest.raises(SpecError) as info:
        from_module(nn.Linear(2, 2), 3)
    assert info.value.field == "module"
    with pytest.raises(SpecError) as info:
        from_module(nn.Linear(2, 2), (torch.randn(2, 2),), dtype="int4")
    assert info.value.field == "dtype"


def test_importing_trace_does_not_import_torch():
    code = "import sys, learnedperf.graph.trace; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_frozen_weights_get_no_weight_gradient():
    model = mlp()
    model[2].requires_grad_(False)
    g = from_module(model, (torch.randn(8, 64),))
    first, second = (o.name for o in fwd(g, "matmul"))
    names = {o.name for o in bwd(g, "matmul")}
    assert names == {f"{second}.bwd_dgrad", f"{first}.bwd_dgrad", f"{first}.bwd_wgrad"}
    # a frozen first layer fed by data needs no backward at all
    model = mlp()
    model[0].requires_grad_(False)
    g = from_module(model, (torch.randn(8, 64),))
    first, second = (o.name for o in fwd(g, "matmul"))
    assert {o.name for o in bwd(g, "matmul")} == {f"{second}.bwd_dgrad", f"{second}.bwd_wgrad"}
    # nothing trainable at all: no backward pass
    assert not bwd(from_module(mlp().requires_grad_(False), (torch.randn(8, 64),)))
