"""The CUDA paths of the measurement harness, checked without a GPU.

No GPU has run ``learnedperf measure --device cuda`` yet, and a session that gets one has minutes of it: what
can be checked on a CPU is checked here. torch's CUDA calls are stood in for by fakes that behave as CUDA does
where it matters (an event's elapsed time is readable only once the event has completed; a device's properties
carry only some attributes, depending on the torch version), and the model code's CUDA-only branch is forced
on CPU tensors, where its result must equal the branch CPU runs.
"""

from __future__ import annotations

import math
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from learnedperf.measure import bench, ops, steps
from learnedperf.measure import models as M
from learnedperf.specs import DeviceSpec
from learnedperf.units import GiB, MiB


# ----------------------------------------------------------------------------- fakes
class _FakeEvent:
    """A CUDA event: records on a stream; its elapsed time needs both events completed (synchronized), as
    cudaEventElapsedTime fails with cudaErrorNotReady otherwise."""

    def __init__(self, log: list, enable_timing: bool = False, elapsed_ms: float = 2.5):
        assert enable_timing, "elapsed_time needs enable_timing=True"
        self.log, self.stream, self.done, self.elapsed_ms = log, None, False, elapsed_ms

    def record(self, stream=None):
        self.stream = stream
        self.log.append(("record", stream))

    def synchronize(self):
        self.done = True
        self.log.append(("event_sync",))

    def elapsed_time(self, end: "_FakeEvent") -> float:
        if self.stream is None or end.stream is None:
            raise RuntimeError("event not recorded")
        if not end.done:
            raise RuntimeError("CUDA error: device not ready")
        return self.elapsed_ms


def _fake_cuda_torch(log: list, elapsed_ms: float = 2.5) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(
        Event=lambda enable_timing=False: _FakeEvent(log, enable_timing, elapsed_ms),
        current_stream=lambda device=None: log.append(("current_stream", device)) or f"stream-of-{device}",
        synchronize=lambda device=None: log.append(("synchronize", device)),
    )
    return types.SimpleNamespace(cuda=cuda)


# ----------------------------------------------------------------------------- operator timer
def test_the_cuda_timer_brackets_the_call_with_events_on_the_cases_device():
    log: list = []
    timer = ops._Timer("cuda:1")
    assert timer.cuda and timer.name == "cuda_event"
    timer._torch = _fake_cuda_torch(log)
    ms = timer.time_ms(lambda: log.append(("call",)))
    assert ms == 2.5
    # both events on cuda:1's current stream, around the call, the end event waited for before reading
    assert log == [("current_stream", "cuda:1"), ("record", "stream-of-cuda:1"), ("call",),
                   ("record", "stream-of-cuda:1"), ("event_sync",)]
    log.clear()
    timer.sync()
    assert log == [("synchronize", "cuda:1")]


def test_the_repeat_loop_drains_the_device_before_every_timed_call():
    log: list = []
    timer = ops._Timer("cuda")
    timer._torch = _fake_cuda_torch(log)
    times, calls = ops._repeat(timer, lambda: log.append(("call",)), lambda: None, warmup=2, repeats=3,
                               min_repeats=1, budget_s=100.0)
    # a 2.5 ms call spans more than GPU_MIN_SPAN_MS alone: one call per sample
    assert times == [2.5, 2.5, 2.5] and calls == 1
    # two untimed calls, one synchronize; then the probe and each timed call: a synchronize and the bracketing events
    kinds = [e[0] for e in log]
    assert kinds[:3] == ["call", "call", "synchronize"]
    timed = kinds[3:]
    assert timed == ["synchronize", "current_stream", "record", "call", "record", "event_sync"] * 4


def test_a_short_gpu_call_is_timed_back_to_back_and_divided():
    # a 0.02 ms call: 25 back-to-back calls reach the 0.5 ms span; the events bracket all 25, and the span
    # the fake reports (0.02 ms, whatever it brackets) is divided by them
    log: list = []
    timer = ops._Timer("cuda")
    timer._torch = _fake_cuda_torch(log, elapsed_ms=0.02)
    assert ops.gpu_calls(0.02) == 25 and ops.gpu_calls(2.5) == 1 and ops.gpu_calls(0.0) == ops.GPU_MAX_CALLS
    assert ops.gpu_calls(1e-4) == ops.GPU_MAX_CALLS
    times, calls = ops._repeat(timer, lambda: log.append(("call",)), lambda: log.append(("prepare",)), warmup=0,
                               repeats=2, min_repeats=1, budget_s=100.0)
    assert calls == 25 and times == [pytest.approx(0.02 / 25)] * 2
    # the last sample: prepare, sync, stream, record, the calls, record, wait
    sample = [e[0] for e in log][-(4 + 25 + 24 + 2):]
    assert sample[:4] == ["prepare", "synchronize", "current_stream", "record"]
    assert sample[-2:] == ["record", "event_sync"]
    # each call after the first runs after its prepare (a backward's gradients reset), all inside the events
    body = sample[4:-2]
    assert body == ["call"] + ["prepare", "call"] * 24


def test_the_cpu_timer_touches_no_cuda_api(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("CPU timing synchronised CUDA"))
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: pytest.fail("CPU timing made a CUDA event"))
    timer = ops._Timer("cpu")
    timer.sync()
    assert timer.name == "perf_counter" and timer.time_ms(lambda: None) >= 0.0


# ----------------------------------------------------------------------------- device description
def _per_proc():
    return [{"tflops": {"fp32": 50.0, "tf32": 300.0, "bf16": 700.0, "fp16": 710.0},
             "gemm_n": {"fp32": 8192, "tf32": 8192, "bf16": 8192, "fp16": 8192},
             "stream_GBps": {"copy": 2800.0, "add": 2900.0}}]


_PLAN = {"device": "cuda", "threads": 1, "gemm_sizes": {}, "gemm_skipped": {}, "stream_bytes": GiB, "reps": 5}

#: What an H100 SXM reports (torch.cuda.get_device_properties): 132 SMs, 50 MiB of L2, 79.65 GiB.
_H100 = dict(name="NVIDIA H100 80GB HBM3", total_memory=int(79.65 * GiB), multi_processor_count=132,
             L2_cache_size=50 * MiB)


@pytest.mark.parametrize("clock_kHz", [None, 1_980_000])
def test_the_gpu_descriptor_reads_the_properties_this_torch_has(monkeypatch, clock_kHz):
    # recent torch has no clock_rate in the device properties: the descriptor says 0 = unknown, never crashes
    props = types.SimpleNamespace(**_H100, **({"clock_rate": clock_kHz} if clock_kHz else {}))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda idx: props)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    d = bench._descriptor("cuda", 1, 1, False, _PLAN, _per_proc())
    assert d["name"] == "nvidia-h100-80gb-hbm3-1t" and d["vendor"] == "nvidia"
    assert d["num_sms"] == 132 and d["l2_cache_MiB"] == 50.0 and d["memory_GiB"] == 79.65
    assert d["peak_tflops"] == {"fp32": 50.0, "tf32": 300.0, "bf16": 700.0, "fp16": 710.0}
    assert d["memory_bandwidth_GBps"] == 2900.0  # the better of copy and add
    if clock_kHz is None:
        assert d["clock_MHz"] == 0.0 and d["sources"]["clock_MHz"].startswith("not exposed by torch")
    else:
        assert d["clock_MHz"] == 1980.0 and d["sources"]["clock_MHz"].startswith("torch.cuda.get_device_properties")
    DeviceSpec.parse(d)  # a valid DeviceSpec either way


def test_a_torch_without_the_l2_attribute_gives_an_unknown_l2(monkeypatch):
    props = types.SimpleNamespace(**{k: v for k, v in _H100.items() if k != "L2_cache_size"})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda idx: props)
    d = bench._descriptor("cuda", 1, 1, False, _PLAN, _per_proc())
    assert d["l2_cache_MiB"] == 0.0 and d["num_sms"] == 132
    DeviceSpec.parse(d)


def test_bench_synchronises_the_device_it_measures():
    log: list = []
    fake = _fake_cuda_torch(log)
    bench._sync(fake, "cuda:1")
    bench._sync(fake, "cpu")
    assert log == [("synchronize", "cuda:1")]


def test_a_concurrent_benchmark_rank_makes_its_gpu_the_current_device(monkeypatch):
    # rank 1 of 2 on a 2-GPU machine measures cuda:1; calls without a device (synchronize) must act there
    events: list = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: events.append(("set_device", d)))
    monkeypatch.setattr(bench, "_measure", lambda plan, sync: events.append(("measure", plan["device"])) or {"x": 1})
    queue = types.SimpleNamespace(items=[], put=lambda item: queue.items.append(item))
    barrier = types.SimpleNamespace(wait=lambda t: None, abort=lambda: pytest.fail("the rank failed"))
    bench._device_worker(1, dict(_PLAN), barrier, 10.0, queue)
    assert events == [("set_device", "cuda:1"), ("measure", "cuda:1")]
    assert queue.items == [(1, "ok", {"x": 1})]


# ----------------------------------------------------------------------------- profiler rows
def test_profiler_self_time_is_read_under_either_torch_name():
    new = types.SimpleNamespace(key="aten::mm", count=4, self_device_time_total=1500.0, self_cpu_time_total=20.0)
    old = types.SimpleNamespace(key="aten::add", count=2, self_cuda_time_total=700.0, self_cpu_time_total=10.0)
    none = types.SimpleNamespace(key="x", count=1, self_cpu_time_total=1.0)
    assert steps._self_time_us(new, True) == 1500.0 and steps._self_time_us(new, False) == 20.0
    assert steps._self_time_us(old, True) == 700.0 and steps._self_time_us(old, False) == 10.0
    with pytest.raises(AttributeError, match="no self device time"):
        steps._self_time_us(none, True)
    prof = types.SimpleNamespace(key_averages=lambda: [old, new])
    # per iteration of 2: 1500 µs -> 0.75 ms in 2 calls, 700 µs -> 0.35 ms in 1 call; slowest first
    assert steps._profile_rows(prof, 2, cuda=True) == [
        {"name": "aten::mm", "calls": 2, "self_time_ms": 0.75}, {"name": "aten::add", "calls": 1, "self_time_ms": 0.35}]


# ----------------------------------------------------------------------------- grouped-query attention
def test_flash_only_dtypes_keep_enable_gqa_and_fp32_on_cuda_repeats_the_heads():
    # FlashAttention (the one CUDA kernel that takes enable_gqa) runs fp16 and bf16 only
    def fake(device_type, dtype):
        return types.SimpleNamespace(device=types.SimpleNamespace(type=device_type), dtype=dtype)

    assert M.gqa_needs_expanded_kv(fake("cuda", torch.float32))
    assert not M.gqa_needs_expanded_kv(fake("cuda", torch.bfloat16))
    assert not M.gqa_needs_expanded_kv(fake("cuda", torch.float16))
    assert not M.gqa_needs_expanded_kv(torch.zeros(1))  # CPU: unchanged
    assert not M.gqa_needs_expanded_kv(torch.zeros(1, dtype=torch.bfloat16))


def _llama_attention():
    from learnedperf.specs import ModelSpec

    spec = ModelSpec.parse({"arch": "llama", "num_layers": 1, "hidden_size": 64, "num_attention_heads": 8,
                            "num_kv_heads": 2, "vocab_size": 128, "seq_length": 16}, "model")
    attn = M.Attention(spec, M.ParallelContext())
    M.init_parameters(attn, seed=3)
    return attn, M.rope_tables(16, spec.head_dim)


def test_repeated_kv_heads_compute_what_enable_gqa_computes(monkeypatch):
    # the branch CUDA fp32 takes, forced on CPU: same output and gradients as torch's own enable_gqa
    attn, rope = _llama_attention()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0))
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[1], k.shape[1], v.shape[1], kw.get("enable_gqa", False)))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    results = []
    for expand in (False, True):
        monkeypatch.setattr(M, "gqa_needs_expanded_kv", lambda q, e=expand: e)
        xi = x.clone().requires_grad_(True)
        attn.zero_grad(set_to_none=True)
        out = attn(xi, rope)
        out.square().sum().backward()
        results.append((out.detach(), xi.grad, attn.qkv.weight.grad.clone()))
    # enable_gqa with 8 query and 2 kv heads, then all 8 heads repeated and no enable_gqa
    assert calls == [(8, 2, 2, True), (8, 8, 8, False)]
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- processes
def test_the_step_processes_are_never_forked_from_a_cuda_parent(monkeypatch):
    # CUDA cannot be used in a child forked from a process that initialised it: the ranks start from a fork
    # server (or are spawned), whatever the device
    import torch.multiprocessing as mp

    seen = {}

    def fake_start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        seen["start_method"] = start_method
        return types.SimpleNamespace(join=lambda timeout=None: True, processes=[])

    monkeypatch.setattr(mp, "start_processes", fake_start_processes)
    plan = steps.plan_step(steps.StepConfig(steps.grid_model("gpt-tiny"), 1, device="cuda"))
    with pytest.raises(steps.LearnedPerfError, match="without results"):
        steps._execute(plan)
    assert seen["start_method"] in ("forkserver", "spawn")


_PRELOAD_PROBE = r"""
import torch
calls = []
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_properties",
             "mem_get_info", "synchronize"):
    original = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _o=original, **k: calls.append(_n) or _o(*a, **k))
import importlib
from learnedperf.measure.steps import FORKSERVER_PRELOAD
for module in FORKSERVER_PRELOAD:
    importlib.import_module(module)
print(sorted(set(calls)))
"""


def test_the_fork_server_preload_does_not_touch_cuda():
    # the fork server imports these once and forks every rank from itself: a CUDA call there (even
    # is_available, which initialises the driver) would leave every rank unable to use the GPU
    out = subprocess.run([sys.executable, "-c", _PRELOAD_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_gpu_plan_sizes_gemms_by_the_probe_and_streams_arrays_beyond_l2(monkeypatch):
    # _plan's CUDA branch with the GPU stood in for: tensors made on the CPU, a fixed probe time per call
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, **kw: randn(*shape, **kw))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * GiB, 80 * GiB))
    tf32_during_probe = []

    def probe(torch_, device, fn, reps):
        assert device == "cuda"
        tf32_during_probe.append(torch_.backends.cuda.matmul.allow_tf32)
        return 1e-3  # a 1024³ GEMM in 1 ms: 4096³ takes 64 ms (under the 150 ms limit), 8192³ 512 ms (over)

    monkeypatch.setattr(bench, "_median_time_s", probe)
    before = torch.backends.cuda.matmul.allow_tf32
    full = bench._plan("cuda", 1, False, 1)
    assert full["gemm_sizes"] == {name: [1024, 2048, 4096] for name in ("fp32", "bf16", "fp16", "tf32")}
    # TF32 on for the tf32 probe only, and the setting restored afterwards
    assert tf32_during_probe == [False, False, False, True]
    assert torch.backends.cuda.matmul.allow_tf32 == before
    assert full["stream_bytes"] == GiB and full["reps"] == 5
    # quick: the 20 ms limit keeps 1024 (1 ms) and 2048 (8 ms); the arrays stay 1 GiB, far beyond a GPU's L2
    quick = bench._plan("cuda", 1, True, 1)
    assert quick["gemm_sizes"]["fp32"] == [1024, 2048] and quick["stream_bytes"] == GiB


# ----------------------------------------------------------------------------- the GPU's operator grid
def test_the_gpu_grid_reaches_the_sizes_training_runs():
    from learnedperf.measure.ops import flops_bytes, op_grid

    def most_flops(cases, kinds):
        return max(flops_bytes(c, "fwd")[0] for c in cases if c.op in kinds)

    def most_elements(cases, kinds):
        return max(math.prod(c.shape) for c in cases if c.op in kinds)

    cpu, gpu = op_grid(device="cpu", dtypes=("fp32",)), op_grid(device="cuda")
    # the caps of ops._SIZE_LIMITS: 2^32 FLOPs on a core (~40 ms), 2^41 on a GPU (an 8192 x 8192 x 16384 GEMM)
    assert 2**31 < most_flops(cpu, ("linear", "bmm")) <= 2**32
    assert 2**40 < most_flops(gpu, ("linear", "bmm")) <= 2**41
    assert most_elements(cpu, ("add", "gelu", "layer_norm")) <= 2**24
    assert 2**27 < most_elements(gpu, ("add", "gelu", "layer_norm")) <= 2**28
    # a GPU times bf16 first, then fp32, fp16 last: a spent time budget cuts fp16 first
    order = [c.dtype for c in gpu if c.kind != "optimizer"]
    assert order.index("fp32") > max(i for i, d in enumerate(order) if d == "bf16")
    assert order.index("fp16") > max(i for i, d in enumerate(order) if d == "fp32")


def test_fp32_cases_on_a_gpu_run_without_tf32_and_the_flags_come_back(monkeypatch):
    # cuDNN runs fp32 convolutions in TF32 by default on Ampere and later: an "fp32" record must be FP32 math
    seen = []

    def build(case, device):
        def forward():
            seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
            return x * 2.0

        x = torch.ones(4, requires_grad=True)
        return ops._Built(forward, [x])

    class CpuTimer(ops._Timer):  # the case runs on the CPU; only the device name says cuda
        def __init__(self, device):
            super().__init__("cpu")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ops, "_build", build)
    monkeypatch.setattr(ops, "_Timer", CpuTimer)
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:  # torch's flag objects do not take monkeypatch's undo: set and restored here
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        case = ops.OpCase("gelu", "elementwise", (2, 2), {}, "fp32")
        records = ops.profile_op(case, "cuda", warmup=1, repeats=2, min_repeats=1,
                                 descriptor={"name": "H100-SXM5-80GB"})
        assert len(records) == 2 and seen and set(seen) == {(False, False)}
        assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
