"""Micro-benchmarks that describe the local hardware.

* :func:`describe_device` — a :class:`~learnedperf.specs.DeviceSpec` dict of the local
  device, its throughput and memory bandwidth measured here (achieved, not data-sheet);
* :func:`host_descriptor` — the machine around it (host, CPU, memory, software);
* :func:`bench_collectives` — collectives timed over ``world_size`` local processes,
  as operator records (:data:`~learnedperf.measure.records.OP_COLUMNS`);
* :func:`bench_in_stream` — what one all-reduce adds to a stream of computation (the cost a
  training step pays), per message size;
* :func:`fit_link` — the α-β link parameters fitted to all-reduce records
  (:func:`fit_link_in_stream`: to the in-stream costs).

Everything runs on this machine only: helper processes are started with the
``spawn`` method, meet through a file store in a private temporary directory (the
TCP store of ``torch.distributed`` listens on every interface) and talk over the
loopback interface (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``). They are always
joined, terminated or killed before a function returns, error or not.

torch is imported inside the functions that need it, never at module import.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
import time
import traceback
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..errors import InputError, LearnedPerfError
from ..units import GiB, MiB
from .records import OP_COLUMNS, canonical_json, host_name, now_utc


class MeasureError(LearnedPerfError):
    """A benchmark could not run (a helper process failed or timed out); the message says which and why."""


#: Square GEMM sizes tried per device kind (largest first cut by the time limit).
_GEMM_SIZES = {"cpu": (256, 512, 1024, 2048, 4096), "cuda": (1024, 2048, 4096, 8192)}
#: Seconds one GEMM call may take before larger sizes are skipped (quick, full).
_GEMM_CALL_LIMIT_S = (0.02, 0.15)


# ------------------------------------------------------------ static facts
def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _cpuinfo() -> dict[str, str]:
    """First processor block of /proc/cpuinfo (empty on systems without it)."""
    out: dict[str, str] = {}
    for line in _read("/proc/cpuinfo").splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def _cpu_model() -> str:
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine() or "unknown"


def _slug(text: str) -> str:
    """``Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz`` -> ``intel-xeon-platinum-8480+``."""
    text = re.sub(r"\((R|TM|r|tm)\)", "", text)
    text = re.sub(r"@.*$", "", text)
    text = re.sub(r"\b(CPU|Processor|processor|with.*Graphics)\b", "", text)
    return re.sub(r"[^a-z0-9+]+", "-", text.lower()).strip("-") or "unknown"


def _cpu_vendor() -> str:
    vid = _cpuinfo().get("vendor_id", "")
    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vid, vid.lower() or platform.machine() or "unknown")


def _cache_KiB(level: int) -> float:
    """Size in KiB of the level-``level`` data/unified cache of cpu0 (0 when unknown)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        if _read(str(idx / "level")).strip() == str(level) and _read(str(idx / "type")).strip() in ("Data",
                                                                                                     "Unified"):
            size = _read(str(idx / "size")).strip()
            m = re.fullmatch(r"(\d+)([KMG]?)", size)
            if m:
                return float(m.group(1)) * {"": 1 / 1024, "K": 1, "M": 1024, "G": 1024**2}[m.group(2)]
    return 0.0


def _cpu_clock_MHz() -> tuple[float, str]:
    """Maximum clock from cpufreq when exposed, else the nominal ``cpu MHz`` of /proc/cpuinfo."""
    khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    if khz.isdigit():
        return float(khz) / 1000.0, "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
    mhz = _cpuinfo().get("cpu MHz", "")
    try:
        return float(mhz), "/proc/cpuinfo 'cpu MHz'"
    except ValueError:
        return 0.0, "not exposed by this system (0 = unknown)"


def _physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def _loopback_ifname() -> str:
    """Name of the interface that carries 127.0.0.1 (``lo`` on Linux)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(getattr(a, "address", None) == "127.0.0.1" for a in addrs):
            return name
    return "lo"


def host_descriptor() -> dict:
    """The machine the measurements ran on: host, CPU, cores, memory, software, GPU if any.

    Kept apart from :func:`describe_device` because DeviceSpec rejects unknown keys.
    """
    import psutil
    import torch

    cuda = torch.cuda.is_available()
    return {
        "host": host_name(),
        "cpu_model": _cpu_model(),
        "cpu_vendor": _cpu_vendor(),
        "logical_cores": os.cpu_count() or 0,
        "physical_cores": _physical_cores(),
        "memory_GiB": round(psutil.virtual_memory().total / GiB, 2),
        "l2_cache_per_core_KiB": _cache_KiB(2),
        "l3_cache_KiB": _cache_KiB(3),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
        "cuda_device_count": torch.cuda.device_count() if cuda else 0,
    }


# ------------------------------------------------------------ measurement
def _sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        # the device the work ran on ("cuda:N"), not whichever is current
        torch.cuda.synchronize(device)


def other_machine(manifest: dict) -> str:
    """What differs between this machine and the one a data set's ``manifest`` was measured on (CPU model,
    logical cores, CUDA device: :func:`host_descriptor`), as ``"cpu_model 'X', here 'Y'"``; empty on the
    same machine. New measurements join a data set only where its others were made."""
    here, there = host_descriptor(), manifest.get("host", {})
    return "; ".join(f"{key} {there.get(key)!r}, here {here.get(key)!r}"
                     for key in ("cpu_model", "logical_cores", "cuda_device") if here.get(key) != there.get(key))


def _median_time_s(torch, device: str, fn: Callable[[], Any], reps: int) -> float:
    """Median seconds of ``reps`` calls of ``fn`` after one untimed call."""
    import statistics

    fn()
    _sync(torch, device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _plan(device: str, threads: int, quick: bool, concurrent: int) -> dict:
    """What each (possibly concurrent) benchmark process runs, decided once so that all
    processes take the same steps (they meet at a barrier before each).

    GEMM sizes per dtype: a 256 (CUDA: 1024) probe, then larger squares while the n³ extrapolated
    call time stays under the limit, which keeps a slow dtype (fp16 without CPU kernels) from running
    for minutes. Bandwidth arrays: 64 MiB quick, 512 MiB otherwise (CUDA: 1 GiB, quick or not), at most
    1/8 of the available memory per process (three arrays each).
    """
    import psutil
    import torch

    kind = "cuda" if device.startswith("cuda") else "cpu"
    limit = _GEMM_CALL_LIMIT_S[0 if quick else 1]
    sizes_all = _GEMM_SIZES[kind][:3] if quick else _GEMM_SIZES[kind]
    dtypes = ["fp32", "bf16", "fp16"] + (["tf32"] if kind == "cuda" else [])
    gemm: dict[str, list[int]] = {}
    skipped: dict[str, str] = {}
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name in dtypes:
            dt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
            n0 = sizes_all[0]
            try:
                with _tf32(torch, name == "tf32"):
                    a = torch.randn(n0, n0, device=device).to(dt)
                    t = _median_time_s(torch, device, lambda: a @ a, 2)
            except (RuntimeError, NotImplementedError) as exc:
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                continue
            # concurrent processes share the machine: leave room for the slowdown
            gemm[name] = [n for n in sizes_all if t * (n / n0) ** 3 * concurrent <= limit] or [n0]
    finally:
        torch.set_num_threads(prev)
    avail = psutil.virtual_memory().available if kind == "cpu" else torch.cuda.mem_get_info(device)[0]
    # a GPU's arrays are 1 GiB even when quick: 64 MiB is about an H100's or H200's L2 (50 MiB; B200: 126 MB), and
    # a 64 MiB copy takes ~40 µs there, of the order of the host's synchronize round trip the timer includes
    nbytes = (64 * MiB if kind == "cpu" else GiB) if quick else (512 * MiB if kind == "cpu" else GiB)
    nbytes = int(max(16 * MiB, min(nbytes, avail / (8 * 3 * max(1, concurrent if kind == "cpu" else 1)))))
    return {"device": device, "threads": threads, "gemm_sizes": gemm, "gemm_skipped": skipped,
            "stream_bytes": nbytes, "reps": 3 if quick else 5}


class _tf32:
    """Context: allow (or forbid) TF32 matmuls on CUDA, restoring the previous setting."""

    def __init__(self, torch, on: bool):
        self.torch, self.on = torch, on

    def __enter__(self):
        self.prev = self.torch.backends.cuda.matmul.allow_tf32
        self.torch.backends.cuda.matmul.allow_tf32 = self.on
        return self

    def __exit__(self, *exc):
        self.torch.backends.cuda.matmul.allow_tf32 = self.prev
        return False


def _measure(plan: dict, sync: Callable[[], None]) -> dict:
    """Run ``plan`` in this process; ``sync()`` is called before every timed phase (a barrier
    when several processes run at once). Returns TFLOP/s per dtype and STREAM GB/s per kernel."""
    import torch

    device, reps = plan["device"], plan["reps"]
    prev = torch.get_num_threads()
    torch.set_num_threads(plan["threads"])
    out: dict[str, Any] = {"tflops": {}, "gemm_n": {}, "stream_GBps": {}}
    try:
        for name, sizes in plan["gemm_sizes"].items():
            dt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
            best, best_n = 0.0, 0
            for n in sizes:
                with _tf32(torch, name == "tf32"):
                    a = torch.randn(n, n, device=device).to(dt)
                    b = torch.randn(n, n, device=device).to(dt)
                    sync()
                    t = _median_time_s(torch, device, lambda: a @ b, reps)
                rate = 2.0 * n**3 / t / 1e12
                if rate > best:
                    best, best_n = rate, n
                del a, b
            out["tflops"][name] = best
            out["gemm_n"][name] = best_n
        numel = plan["stream_bytes"] // 4
        a = torch.ones(numel, device=device)
        b = torch.ones(numel, device=device)
        c = torch.empty(numel, device=device)
        c.fill_(0.0)  # first touch outside the timed region
        sync()
        t_copy = _median_time_s(torch, device, lambda: c.copy_(a), reps)
        sync()
        t_add = _median_time_s(torch, device, lambda: torch.add(a, b, out=c), reps)
        # STREAM convention: bytes read + bytes written (no write-allocate traffic)
        out["stream_GBps"] = {"copy": 2 * 4 * numel / t_copy / 1e9, "add": 3 * 4 * numel / t_add / 1e9}
        del a, b, c
    finally:
        torch.set_num_threads(prev)
        if device.startswith("cuda"):
            # hand the GEMM and STREAM buffers (several GiB) back to the driver: this process stays alive
            # while the measured steps run in child processes that need the GPU's memory
            torch.cuda.empty_cache()
    return out


def _device_worker(rank: int, plan: dict, barrier, timeout_s: float, queue) -> None:
    """Entry of one concurrent benchmark process (module level so ``spawn`` can import it)."""
    try:
        plan = dict(plan)
        if plan["device"].startswith("cuda"):
            import torch

            plan["device"] = f"cuda:{rank % max(1, torch.cuda.device_count())}"
            # make it the current device too: CUDA calls that take no device (synchronize, the current
            # stream) must act on the GPU this rank measures, not on cuda:0
            torch.cuda.set_device(plan["device"])
        result = _measure(plan, lambda: barrier.wait(timeout_s))
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        barrier.abort()  # release the siblings waiting at the barrier
        queue.put((rank, "error", traceback.format_exc(limit=5)))


def _run_workers(target: Callable, args_of: Callable[[int, Any], tuple], n: int, timeout_s: float, what: str,
                 barrier: bool = False) -> dict:
    """Start ``n`` spawned processes ``target(*args_of(rank, shared_barrier), queue)`` that each put
    one ``(rank, status, payload)`` on the queue; collect the payloads, and always tear the
    processes down. ``shared_barrier`` is one ``Barrier(n)`` for all of them when ``barrier`` is
    true, else None. Raises MeasureError on error or timeout."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = []
    shared = ctx.Barrier(n) if barrier else None
    results: dict[int, Any] = {}
    try:
        for rank in range(n):
            p = ctx.Process(target=target, args=(*args_of(rank, shared), q), daemon=True,
                            name=f"learnedperf-{what}-{rank}")
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout_s
        while len(results) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeasureError(f"{what}: timed out after {timeout_s:.0f} s with {len(results)} of {n} "
                                   "processes done")
            try:
                rank, status, payload = q.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and q.empty():
                    time.sleep(0.5)  # a last message may still be in flight
                    if q.empty():
                        raise MeasureError(f"{what}: process {dead[0].name} died with exit code "
                                           f"{dead[0].exitcode}") from None
                continue
            if status != "ok":
                # fail fast: the other ranks may be blocked in a collective with the failed one;
                # the finally clause below terminates them
                raise MeasureError(f"{what} failed on rank {rank}: {payload.strip().splitlines()[-1]}\n{payload}")
            results[rank] = payload
        return results
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        q.close()
        q.join_thread()


def describe_device(device: str = "cpu", threads: int = 1, concurrent: int = 1, quick: bool = False) -> dict:
    """Measure the local device and return a DeviceSpec-compatible dict.

    ``peak_tflops`` holds the *achieved* dense GEMM TFLOP/s per dtype (best square size up to a
    per-call time limit; fp32 always, bf16 / fp16 when they run, tf32 on CUDA);
    ``memory_bandwidth_GBps`` the better of a STREAM-style copy and add over arrays much larger
    than the caches allow (bytes read + written); ``memory_GiB`` the machine's (or GPU's) memory
    divided among ``concurrent`` processes; ``num_sms`` the SM count on CUDA and 0 (unknown) on
    CPU, which turns off the cost model's wave quantisation there; ``l2_cache_MiB`` the L2 of
    the ``threads`` cores a process runs on (per-core L2 × threads) or the GPU's L2; ``clock_MHz``
    from cpufreq or /proc/cpuinfo (0 when unknown). ``sources`` says where each value came from
    and when.

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads of one process.
        concurrent: processes that run the benchmarks at the same time (spawned); the figures are
            the median per process, i.e. what one rank of a ``concurrent``-process run gets.
        quick: smaller sizes (about a second on CPU), for tests; less precise.

    Raises:
        InputError: bad arguments. MeasureError: a helper process failed.
    """
    import torch

    if not isinstance(threads, int) or threads < 1:
        raise InputError(f"threads: must be a positive integer, got {threads!r}")
    if not isinstance(concurrent, int) or concurrent < 1:
        raise InputError(f"concurrent: must be a positive integer, got {concurrent!r}")
    if device in ("gpu", "cuda"):
        device = "cuda"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError("device: 'cuda' asked but torch.cuda.is_available() is False")
    elif device != "cpu":
        raise InputError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    plan = _plan(device, threads, quick, concurrent)
    if not plan["gemm_sizes"].get("fp32"):
        raise MeasureError(f"fp32 matmul does not run on {device}: {plan['gemm_skipped'].get('fp32')}")
    if concurrent == 1:
        per_proc = [_measure(plan, lambda: None)]
    else:
        timeout_s = 600.0
        results = _run_workers(_device_worker, lambda rank, bar: (rank, plan, bar, timeout_s), concurrent,
                               timeout_s, "describe_device", barrier=True)
        per_proc = [results[r] for r in sorted(results)]
    return _descriptor(device, threads, concurrent, quick, plan, per_proc)


def _descriptor(device: str, threads: int, concurrent: int, quick: bool, plan: dict, per_proc: list[dict]) -> dict:
    import statistics

    import psutil
    import torch

    date = now_utc()
    who = (f"measured by learnedperf.measure.bench.describe_device on {date} (threads={threads}, "
           f"concurrent={concurrent}, quick={quick}")
    tflops = {}
    for name in ("fp32", "tf32", "bf16", "fp16"):
        vals = [p["tflops"][name] for p in per_proc if p["tflops"].get(name)]
        if vals:
            tflops[name] = round(statistics.median(vals), 6)
    stream = {k: statistics.median(p["stream_GBps"][k] for p in per_proc) for k in ("copy", "add")}
    bw = max(stream.values())
    gemm_n = {k: v for k, v in per_proc[0]["gemm_n"].items() if k in tflops}
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        base = _slug(props.name)
        vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
        mem_GiB = props.total_memory / GiB / concurrent
        sms = int(getattr(props, "multi_processor_count", 0))
        l2_MiB = float(getattr(props, "L2_cache_size", 0) or 0) / MiB
        clock = float(getattr(props, "clock_rate", 0) or 0) / 1000.0  # kHz when torch exposes it
        src_static = "torch.cuda.get_device_properties"
        src_clock = src_static if clock else "not exposed by torch (0 = unknown)"
        src_sms = src_static
        src_mem = f"{src_static} total_memory / {concurrent} process(es)"
    else:
        base = "cpu-" + _slug(_cpu_model())
        vendor = _cpu_vendor()
        mem_GiB = psutil.virtual_memory().total / GiB / concurrent
        sms = 0
        l2_MiB = _cache_KiB(2) / 1024.0 * min(threads, _physical_cores())
        clock, src_clock = _cpu_clock_MHz()
        src_sms = "0 = unknown on CPU (no wave quantisation)"
        src_mem = f"psutil total memory / {concurrent} process(es)"
        src_static = "/sys/devices/system/cpu/cpu0/cache: per-core L2 x threads"
    name = f"{base}-{threads}t" + (f"-x{concurrent}" if concurrent > 1 else "")
    detail = ", ".join(f"{k} {v:.4g} at n={gemm_n.get(k)}" for k, v in tflops.items())
    skipped = "; ".join(f"{k} not run: {v}" for k, v in plan["gemm_skipped"].items())
    return {
        "name": name,
        "vendor": vendor,
        "peak_tflops": tflops,
        "memory_bandwidth_GBps": round(bw, 4),
        "memory_GiB": round(mem_GiB, 3),
        "num_sms": sms,
        "l2_cache_MiB": round(l2_MiB, 4),
        "clock_MHz": round(clock, 1),
        "sources": {
            "peak_tflops": f"{who}): achieved dense square GEMM TFLOP/s, median per process ({detail})"
                           + (f"; {skipped}" if skipped else ""),
            "memory_bandwidth_GBps": f"{who}): STREAM-style best of copy {stream['copy']:.4g} GB/s and add "
                                     f"{stream['add']:.4g} GB/s over {plan['stream_bytes'] // MiB} MiB arrays, "
                                     "bytes read + written, median per process",
            "memory_GiB": f"{src_mem}, read on {date}",
            "num_sms": src_sms,
            "l2_cache_MiB": (src_static if device.startswith("cuda") else
                             "/sys/devices/system/cpu/cpu0/cache: per-core L2 x threads") + f", read on {date}",
            "clock_MHz": f"{src_clock}, read on {date}",
        },
    }


@lru_cache(maxsize=None)
def cached_descriptor_json(device: str = "cpu", threads: int = 1) -> str:
    """Canonical JSON of :func:`describe_device` (full) for ``device`` and ``threads``, measured
    once per process; the default ``device`` column of measured records."""
    return canonical_json(describe_device(device, threads=threads))


# ------------------------------------------------------------ collectives
#: Collective name -> cost-model kind. A (pipelined) broadcast moves the buffer once per rank
#: over n-1 steps, which is the cost model's ``p2p`` term (S bytes, n-1 latencies).
COLLECTIVE_KINDS = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reducescatter",
                    "broadcast": "p2p", "alltoall": "alltoall", "sendrecv": "p2p"}


def _run_group(worker: Callable, world_size: int, backend: str, extra: tuple, timeout_s: float, what: str) -> dict:
    """Run ``worker(rank, world_size, store, backend, *extra, timeout_s, queue)`` on ``world_size``
    spawned ranks that meet through a file store in a fresh temporary directory; their payloads
    by rank (:func:`_run_workers`)."""
    with tempfile.TemporaryDirectory(prefix=f"learnedperf-{what}-") as tmp:
        store = os.path.join(tmp, "store")
        return _run_workers(worker, lambda rank, _bar: (rank, world_size, store, backend, *extra, timeout_s),
                            world_size, timeout_s + 30.0, what)


def _collective_fn(dist, torch, op: str, nbytes: int, world_size: int, rank: int, device: str):
    """(callable, actual message bytes) of one collective over an fp32 buffer.

    Message bytes follow learnedperf.graph: the full buffer for all-reduce, broadcast and
    all-to-all; the gathered output (all-gather) or the scattered input (reduce-scatter), each rank
    holding 1/world_size of it; for send/recv the bytes sent from rank 0 to rank 1.
    """
    numel = max(world_size, nbytes // 4)
    if op in ("allgather", "reducescatter", "alltoall"):
        numel = max(world_size, numel // world_size * world_size)
    full = torch.ones(numel, device=device)
    if op == "allreduce":
        return (lambda: dist.all_reduce(full)), numel * 4
    if op == "broadcast":
        return (lambda: dist.broadcast(full, 0)), numel * 4
    if op == "allgather":
        shard = torch.ones(numel // world_size, device=device)
        # newer torch renames the flat-tensor collectives (*_single); older ones only have *_tensor
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return (lambda: gather(full, shard)), numel * 4
    if op == "reducescatter":
        shard = torch.empty(numel // world_size, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return (lambda: scatter(shard, full)), numel * 4
    if op == "alltoall":
        out = torch.empty_like(full)
        return (lambda: dist.all_to_all_single(out, full)), numel * 4
    if op == "sendrecv":
        if rank == 0:
            return (lambda: dist.send(full, 1)), numel * 4
        if rank == 1:
            return (lambda: dist.recv(full, 0)), numel * 4
        return (lambda: None), numel * 4
    raise InputError(f"ops: unknown collective {op!r} (known: {', '.join(COLLECTIVE_KINDS)})")


@contextmanager
def _process_group(rank: int, world_size: int, store_path: str, backend: str, threads: int, timeout_s: float):
    """``(torch, torch.distributed, device, sync)`` of one benchmark rank inside its process group.

    Sockets are bound to the loopback interface; the group meets through the file store at
    ``store_path``; the rank's device is ``cuda:<rank>`` with NCCL, else the CPU. The group is
    always destroyed on exit.
    """
    from datetime import timedelta

    ifname = _loopback_ifname()
    # bind gloo / NCCL sockets to the loopback interface only
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    os.environ["NCCL_SOCKET_IFNAME"] = ifname
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    device = "cpu"
    try:
        if backend == "nccl":
            device = f"cuda:{rank % torch.cuda.device_count()}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))

        def sync() -> None:
            if device != "cpu":
                torch.cuda.synchronize()

        yield torch, dist, device, sync
    finally:
        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - teardown must not mask the real error
                pass


def _collective_worker(rank: int, world_size: int, store_path: str, backend: str, ops: tuple, sizes: tuple,
                       warmup: int, repeats: int, threads: int, timeout_s: float, queue) -> None:
    """Entry of one collective-benchmark rank (module level so ``spawn`` can import it).

    Puts ``(rank, "ok", {(op, size): ("ok", bytes, [ms...]) | ("skip", reason)})`` or
    ``(rank, "error", traceback)`` on ``queue``; always destroys the process group.
    """
    try:
        with _process_group(rank, world_size, store_path, backend, threads, timeout_s) as (torch, dist, device, sync):
            out: dict = {}
            for op in ops:
                for size in sizes:
                    try:
                        fn, nbytes = _collective_fn(dist, torch, op, size, world_size, rank, device)
                        for _ in range(warmup):
                            fn()
                        sync()
                        times = []
                        for _ in range(repeats):
                            dist.barrier()
                            sync()
                            t0 = time.perf_counter()
                            fn()
                            sync()
                            times.append((time.perf_counter() - t0) * 1e3)
                        out[(op, size)] = ("ok", nbytes, times)
                    except (RuntimeError, NotImplementedError, ValueError) as exc:
                        # e.g. a backend without this collective: every rank raises before communicating
                        out[(op, size)] = ("skip", f"{backend} {op}: {type(exc).__name__}: "
                                                   f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
                    dist.barrier()
            queue.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, "error", traceback.format_exc(limit=5)))


def _check_world_and_sizes(world_size: int, sizes_bytes: Iterable[int]) -> tuple[int, ...]:
    """The message sizes as a tuple, after checking ``world_size`` (>= 2) and the sizes (> 0)."""
    sizes = tuple(int(s) for s in sizes_bytes)
    if not isinstance(world_size, int) or world_size < 2:
        raise InputError(f"world_size: must be an integer >= 2, got {world_size!r}")
    if not sizes or any(s <= 0 for s in sizes):
        raise InputError(f"sizes_bytes: need positive sizes, got {list(sizes)}")
    return sizes


def _resolve_backend(backend: Optional[str]) -> str:
    """``backend``, or NCCL when CUDA is available and gloo otherwise; checked against this machine."""
    import torch

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise InputError(f"backend: expected 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise InputError("backend: 'nccl' needs CUDA, which is not available")
    return backend


def bench_collectives(world_size: int, sizes_bytes: Iterable[int], backend: Optional[str] = None,
                      ops: Iterable[str] = ("allreduce", "allgather", "reducescatter", "broadcast"),
                      warmup: int = 3, repeats: int = 10, threads: int = 1, timeout_s: float = 300.0,
                      descriptor: Optional[dict] = None, skipped: Optional[list] = None) -> list[dict]:
    """Time collectives over ``world_size`` local processes: one OP_COLUMNS record per (op, size).

    Each rank runs, per message size, ``warmup`` untimed calls, then ``repeats`` calls each after a
    barrier; a repetition's time is the slowest rank's (the collective is done when every rank
    is), and the record holds the median, p10 and p90 over repetitions. Buffers are fp32.

    Args:
        world_size: processes (>= 2).
        sizes_bytes: message sizes in bytes (see :func:`_collective_fn` for what "message" means per op).
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (CUDA); default nccl when CUDA is available, else gloo.
        ops: among ``allreduce``, ``allgather``, ``reducescatter``, ``broadcast``, ``alltoall``, ``sendrecv``.
        warmup, repeats: untimed and timed calls per (op, size).
        threads: torch threads per process.
        timeout_s: limit for the whole run (and the process group's own timeout).
        descriptor: device descriptor stored in the records (default: the cached full
            :func:`describe_device` of this machine).
        skipped: when given, ``{"op", "bytes", "reason"}`` is appended for each (op, size) the backend
            cannot run; a warning is issued in any case, so no skip goes unnoticed.

    Raises:
        InputError: bad arguments. MeasureError: a process failed or the run timed out.
    """
    import warnings

    import numpy as np

    sizes = _check_world_and_sizes(world_size, sizes_bytes)
    ops = tuple(ops)
    for op in ops:
        if op not in COLLECTIVE_KINDS:
            raise InputError(f"ops: unknown collective {op!r} (known: {', '.join(COLLECTIVE_KINDS)})")
    if repeats < 1 or warmup < 0:
        raise InputError(f"repeats/warmup: need repeats >= 1 and warmup >= 0, got {repeats}/{warmup}")
    backend = _resolve_backend(backend)
    device = "cuda" if backend == "nccl" else "cpu"
    desc_json = canonical_json(descriptor) if descriptor is not None else cached_descriptor_json(device, threads)
    desc_name = json.loads(desc_json).get("name", "unknown")
    results = _run_group(_collective_worker, world_size, backend, (ops, sizes, warmup, repeats, threads), timeout_s,
                         "bench_collectives")
    records = []
    host, when = host_name(), now_utc()
    for op in ops:
        for size in sizes:
            per_rank = [results[r][(op, size)] for r in range(world_size)]
            skip = next((x for x in per_rank if x[0] == "skip"), None)
            if skip is not None:
                warnings.warn(f"bench_collectives: skipped {op} of {size} bytes: {skip[1]}", stacklevel=2)
                if skipped is not None:
                    skipped.append({"op": op, "bytes": size, "reason": skip[1]})
                continue
            nbytes = per_rank[0][1]
            slowest = np.max(np.array([x[2] for x in per_rank]), axis=0)
            params = {"timing": "max over ranks per repetition", "buffer_dtype": "fp32"}
            if op == "sendrecv":
                params.update(src=0, dst=1)
            elif op == "broadcast":
                params.update(src=0)
            elif op in ("allreduce", "reducescatter"):
                params.update(reduce_op="sum")
            records.append({k: {
                "op": op, "kind": COLLECTIVE_KINDS[op], "direction": "comm", "shape": canonical_json([nbytes]),
                "params": canonical_json(params), "dtype": "fp32", "flops": 0.0, "bytes": float(nbytes),
                "world_size": world_size, "time_ms": float(np.median(slowest)),
                "time_p10_ms": float(np.percentile(slowest, 10)), "time_p90_ms": float(np.percentile(slowest, 90)),
                "repeats": repeats, "warmup": warmup, "timer": "perf_counter", "device_name": desc_name,
                "device": desc_json, "backend": backend, "threads": threads, "host": host, "source": "measured",
                "measured_at": when,
            }[k] for k in OP_COLUMNS})  # exactly the schema's columns, in its order
    return records


#: the computation between two collectives of the in-stream benchmark: STREAM_MATMULS fp32 matmuls of
#: (128 × STREAM_HIDDEN) by (STREAM_HIDDEN × 2·STREAM_HIDDEN), the shape of a small tensor-parallel layer
STREAM_MATMULS, STREAM_HIDDEN = 3, 256


def _matmuls(torch, device: str) -> Callable[[int], None]:
    """``run(k)``: k fp32 matmuls of the in-stream benchmark's shape (the computation of the in-stream
    and overlap benchmarks)."""
    a = torch.randn(128, STREAM_HIDDEN, device=device)
    w = torch.randn(STREAM_HIDDEN, 2 * STREAM_HIDDEN, device=device)

    def run(k: int) -> None:
        for _ in range(k):
            a @ w
    return run


def _barrier_timed(dist, sync, fn: Callable[[], Any]) -> float:
    """Seconds of ``fn()`` started by every rank together after a barrier (device work included)."""
    dist.barrier()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def _slowest(per_rank: Iterable[list[float]]) -> list[float]:
    """Per loop, the slowest rank's time: ``per_rank`` holds each rank's times, loop by loop."""
    return [max(times) for times in zip(*per_rank)]


def _in_stream_worker(rank: int, world_size: int, store_path: str, backend: str, sizes: tuple, loops: int,
                      target_loop_s: float, threads: int, timeout_s: float, queue) -> None:
    """Entry of one in-stream benchmark rank: puts ``(rank, "ok", {size: (bytes, calls, [mix_s], [comp_s])})``.

    Per size and loop: after a barrier, ``calls`` × (compute; all-reduce) with no barrier between
    them (``mix_s``), then after another barrier ``calls`` × compute alone (``comp_s``).
    ``calls`` is the same on every rank (the slowest rank's estimate, agreed by an all-reduce).
    """
    try:
        with _process_group(rank, world_size, store_path, backend, threads, timeout_s) as (torch, dist, device, sync):
            matmuls = _matmuls(torch, device)

            def loop(calls: int, collective) -> float:
                """Seconds of ``calls`` × (compute; ``collective``), started together after a barrier."""
                def run() -> None:
                    for _ in range(calls):
                        matmuls(STREAM_MATMULS)
                        collective()
                return _barrier_timed(dist, sync, run)

            out: dict = {}
            for size in sizes:
                fn, nbytes = _collective_fn(dist, torch, "allreduce", size, world_size, rank, device)
                loop(3, fn)  # warm-up
                est = torch.tensor([loop(3, fn) / 3], dtype=torch.float64, device=device)
                dist.all_reduce(est, op=dist.ReduceOp.MAX)
                calls = int(min(200, max(5, target_loop_s / max(float(est.item()), 1e-6))))
                mix, comp = [], []
                for _ in range(loops):
                    mix.append(loop(calls, fn))
                    comp.append(loop(calls, lambda: None))
                out[size] = (nbytes, calls, mix, comp)
            queue.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, "error", traceback.format_exc(limit=5)))


def bench_in_stream(world_size: int, sizes_bytes: Iterable[int], backend: Optional[str] = None, loops: int = 5,
                    target_loop_s: float = 0.2, threads: int = 1, timeout_s: float = 300.0) -> list[dict]:
    """What one all-reduce adds to a stream of computation, per message size.

    :func:`bench_collectives` times each call after a barrier and keeps the median: the cost of
    one collective started by every rank at once. A training step issues its collectives back to
    back between computations and its time is their *sum*: each adds its mean cost, the skew
    between ranks and any latency tail included. Per size, each of ``loops`` loops times
    ``calls`` × (compute; all-reduce) without barriers and ``calls`` × compute alone; the added
    time of one all-reduce is ``(mix − compute) / calls`` with ``mix`` and ``compute`` the
    slowest rank's, and the result is the median over the loops. The compute is
    :data:`STREAM_MATMULS` small matmuls; ``calls`` is chosen so that a loop lasts about
    ``target_loop_s`` (5 to 200 calls).

    Returns:
        One dict per size: ``world_size``, ``bytes``, ``calls``, ``cost_ms`` (median over the
        loops), ``loop_costs_ms`` (every loop's) and ``compute_ms`` (the compute between two
        collectives, median).

    Raises:
        InputError: bad arguments. MeasureError: a process failed or the run timed out.
    """
    import statistics

    sizes = _check_world_and_sizes(world_size, sizes_bytes)
    if loops < 1 or target_loop_s <= 0:
        raise InputError(f"loops/target_loop_s: need loops >= 1 and target_loop_s > 0, got {loops}/{target_loop_s}")
    backend = _resolve_backend(backend)
    results = _run_group(_in_stream_worker, world_size, backend, (sizes, loops, target_loop_s, threads), timeout_s,
                         "bench_in_stream")
    out = []
    for size in sizes:
        nbytes, calls = results[0][size][0], results[0][size][1]
        mix = _slowest(results[r][size][2] for r in range(world_size))
        comp = _slowest(results[r][size][3] for r in range(world_size))
        costs = [(m - c) / calls * 1e3 for m, c in zip(mix, comp)]
        out.append({"world_size": world_size, "bytes": nbytes, "calls": calls,
                    "cost_ms": statistics.median(costs), "loop_costs_ms": [round(c, 6) for c in costs],
                    "compute_ms": statistics.median(comp) / calls * 1e3})
    return out


#: message of the overlap benchmark: a gradient bucket's size (bandwidth-bound on every link)
OVERLAP_BYTES = 16 * MiB


def _overlap_worker(rank: int, world_size: int, store_path: str, backend: str, nbytes: int, loops: int,
                    reps: int, threads: int, timeout_s: float, queue) -> None:
    """Entry of one overlap benchmark rank: puts ``(rank, "ok", {"comp": [s], "comm": [s], "both": [s],
    "matmuls": n})``: per loop, after a barrier each, ``reps`` × the compute alone, ``reps`` × the
    all-reduce alone, and ``reps`` × (the all-reduce started asynchronously, the compute, the wait),
    each as seconds per repetition."""
    try:
        with _process_group(rank, world_size, store_path, backend, threads, timeout_s) as (torch, dist, device, sync):
            matmuls = _matmuls(torch, device)
            buf = torch.ones(max(1, nbytes // 4), device=device)

            def timed(fn) -> float:
                return _barrier_timed(dist, sync, fn)

            def comm() -> None:
                dist.all_reduce(buf)

            timed(comm)  # warm-up
            matmuls(20)
            t_comm = torch.tensor([timed(comm)], dtype=torch.float64, device=device)
            t_mm = torch.tensor([timed(lambda: matmuls(50)) / 50], dtype=torch.float64, device=device)
            dist.all_reduce(t_comm, op=dist.ReduceOp.MAX)
            dist.all_reduce(t_mm, op=dist.ReduceOp.MAX)
            # as much compute as one all-reduce takes (every rank the same count)
            n = int(min(100000, max(1, float(t_comm.item()) / max(float(t_mm.item()), 1e-7))))

            def compute() -> None:
                matmuls(n)

            def both() -> None:
                work = dist.all_reduce(buf, async_op=True)
                compute()
                work.wait()

            def repeated(fn):
                def run() -> None:
                    for _ in range(reps):
                        fn()
                return run

            out = {"comp": [], "comm": [], "both": [], "matmuls": n}
            for _ in range(loops):
                out["comp"].append(timed(repeated(compute)) / reps)
                out["comm"].append(timed(repeated(comm)) / reps)
                out["both"].append(timed(repeated(both)) / reps)
            queue.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, "error", traceback.format_exc(limit=5)))


def bench_overlap(world_size: int, nbytes: int = OVERLAP_BYTES, backend: Optional[str] = None, loops: int = 7,
                  reps: int = 5, threads: int = 1, timeout_s: float = 300.0) -> dict:
    """How much of an all-reduce computation running at the same time hides.

    A step overlaps its gradient all-reduces with the backward pass. On a GPU, NCCL runs on its
    own engine and the overlap is nearly complete; on a CPU the collective's threads take cores
    from the computation. Per loop (each part after a barrier, times the slowest rank's): the
    compute alone (``comp``: small matmuls, as long as one all-reduce), one all-reduce of
    ``nbytes`` alone (``comm``), and the all-reduce started asynchronously, the compute, then
    the wait (``both``), each ``reps`` times in a row (a collective's time varies from call to
    call). The overlap is ``(comp + comm − both) / min(comp, comm)``, 1 when the
    shorter one hides entirely, 0 when they take as long as one after the other, clipped to
    [0, 1]; the result is its median over the loops.

    Returns:
        ``{"world_size", "bytes", "matmuls", "overlap", "loop_overlaps", "comp_ms", "comm_ms", "both_ms"}``
        (times: medians over the loops).

    Raises:
        InputError: bad arguments. MeasureError: a process failed or the run timed out.
    """
    import statistics

    _check_world_and_sizes(world_size, [nbytes])
    if loops < 1 or reps < 1:
        raise InputError(f"loops/reps: need at least 1 each, got {loops}/{reps}")
    backend = _resolve_backend(backend)
    results = _run_group(_overlap_worker, world_size, backend, (nbytes, loops, reps, threads), timeout_s,
                         "bench_overlap")
    slowest = {k: _slowest(results[r][k] for r in range(world_size)) for k in ("comp", "comm", "both")}
    overlaps = [min(1.0, max(0.0, (c + m - b) / min(c, m)))
                for c, m, b in zip(slowest["comp"], slowest["comm"], slowest["both"])]
    return {"world_size": world_size, "bytes": nbytes, "matmuls": results[0]["matmuls"],
            "overlap": statistics.median(overlaps), "loop_overlaps": [round(o, 4) for o in overlaps],
            **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in slowest.items()}}


def fit_link_in_stream(points: Iterable[dict], world_size: Optional[int] = None) -> dict:
    """:func:`fit_link` on :func:`bench_in_stream` results: the link as a step's stream of
    collectives sees it. Sizes whose added cost is not positive (the collective hid inside the
    compute's noise) cannot be fitted; they are listed under ``dropped`` (bytes), never ignored
    silently.

    Raises:
        InputError: fewer than two sizes left to fit.
    """
    points = [p for p in points if world_size is None or p["world_size"] == world_size]
    keep = [p for p in points if p["cost_ms"] > 0]
    dropped = [int(p["bytes"]) for p in points if p["cost_ms"] <= 0]
    fit = fit_link([{"kind": "allreduce", "world_size": p["world_size"], "bytes": p["bytes"], "time_ms": p["cost_ms"]}
                    for p in keep], world_size)
    fit["dropped"] = dropped
    return fit


# ------------------------------------------------------------------ α-β fit
def fit_link(records: Iterable[dict], world_size: Optional[int] = None) -> dict:
    """Fit the α-β ring model to all-reduce records.

    Model (ring all-reduce of ``S`` bytes over ``p`` ranks; Thakur et al. 2005, and the cost
    model's :mod:`learnedperf.cost.collective`)::

        time = 2(p-1)·α + 2(p-1)/p · S / B

    ``α`` is the per-step latency and ``B`` the per-direction link bandwidth of one rank. The fit
    is linear least squares in (α, 1/B), each point weighted by 1/time so that small (latency-bound)
    and large (bandwidth-bound) messages count alike in relative terms; α is constrained to be >= 0
    (refit of B alone when the free fit gives a negative latency).

    Args:
        records: operator records; those of kind ``allreduce`` (and of ``world_size`` when given) are used.
        world_size: restrict to one world size (default: all, which the model covers jointly).

    Returns:
        ``{"intra_node_latency_us": α, "intra_node_bandwidth_GBps": B}`` (the run-format link keys)
        plus ``residual_rel_rms`` and ``residual_rel_max`` (relative errors of the fit),
        ``n_points`` and ``world_sizes``.

    Raises:
        InputError: fewer than two distinct message sizes, or a non-positive time.
    """
    import numpy as np

    pts = []
    for r in records:
        if r.get("kind") != "allreduce":
            continue
        p = int(r["world_size"])
        if world_size is not None and p != world_size:
            continue
        t = float(r["time_ms"]) * 1e-3
        if p < 2 or t <= 0:
            raise InputError(f"records: all-reduce record with world_size={p}, time_ms={r['time_ms']} cannot be fitted")
        pts.append((p, float(r["bytes"]), t))
    if len({(p, s) for p, s, _ in pts}) < 2:
        raise InputError("records: need all-reduce records of at least two message sizes to fit latency and bandwidth")
    p_arr = np.array([x[0] for x in pts], dtype=float)
    s_arr = np.array([x[1] for x in pts], dtype=float)
    t_arr = np.array([x[2] for x in pts], dtype=float)
    A = np.column_stack([2 * (p_arr - 1), 2 * (p_arr - 1) / p_arr * s_arr])
    w = 1.0 / t_arr
    coef, *_ = np.linalg.lstsq(A * w[:, None], t_arr * w, rcond=None)
    alpha, inv_bw = float(coef[0]), float(coef[1])
    if alpha < 0:
        alpha = 0.0
        x = A[:, 1] * w
        inv_bw = float(np.dot(x, t_arr * w) / np.dot(x, x))
    if inv_bw <= 0:
        raise InputError("records: all-reduce times do not grow with message size; bandwidth cannot be fitted")
    pred = A @ np.array([alpha, inv_bw])
    rel = (pred - t_arr) / t_arr
    return {
        "intra_node_latency_us": alpha * 1e6,
        "intra_node_bandwidth_GBps": 1.0 / inv_bw / 1e9,
        "residual_rel_rms": float(np.sqrt(np.mean(rel**2))),
        "residual_rel_max": float(np.max(np.abs(rel))),
        "n_points": len(pts),
        "world_sizes": sorted({int(p) for p in p_arr}),
    }


#: Benchmark collectives whose bus bandwidth ratio to all-reduce is fitted, by ``collective_busbw_ratio``
#: key. Broadcast is left out: the simulator has no broadcast (a pipeline send is ``sendrecv``).
_RATIO_OPS = {"allgather": "allgather", "reducescatter": "reducescatter", "alltoall": "alltoall", "sendrecv": "p2p"}


def fit_busbw_ratios(records: Iterable[dict], link: dict, world_size: int) -> dict:
    """Fit each collective's bus bandwidth relative to all-reduce's on the same ranks.

    With the all-reduce fit ``link`` (:func:`fit_link`: per-step latency α, bandwidth B), the cost
    model (:func:`learnedperf.cost.collective.collective_cost`) splits a collective of ``S`` bytes
    into a latency ``L(S)`` and a volume ``V(S)`` moved at ``B``. The ratio ``r`` of a collective is
    the one number in ``time = L + V / (B·r)`` fitted to its bandwidth-bound records by least squares
    on relative error (each point weighted by 1/time, as in :func:`fit_link`). NCCL's rings give about 1
    (nccl-tests' busbw is the same for all three); gloo's all-gather and reduce-scatter much less.

    Args:
        records: collective records (``op``, ``world_size``, ``bytes``, ``time_ms``).
        link: ``{"intra_node_latency_us", "intra_node_bandwidth_GBps"}`` of the same ranks.
        world_size: the ranks the records ran on (one node).

    Returns:
        ``{kind: ratio}`` for each fitted collective (``hardware.collective_busbw_ratio`` keys), rounded
        to 3 significant digits, fitted on the bandwidth-bound messages (volume term at least the
        latency term); kinds without two such message sizes are left out.
    """
    import numpy as np

    from ..cost.collective import collective_cost
    from ..graph.ops import Group, comm

    alpha = float(link["intra_node_latency_us"]) * 1e-6
    bw = float(link["intra_node_bandwidth_GBps"]) * 1e9
    group = Group(world_size, world_size)
    out = {}
    for op_name, kind in _RATIO_OPS.items():
        pts = [(float(r["bytes"]), float(r["time_ms"]) * 1e-3) for r in records
               if r.get("op") == op_name and int(r["world_size"]) == world_size]
        if len({s for s, _ in pts}) < 2:
            continue
        lat, vol, t = [], [], []
        for size, secs in pts:
            if secs <= 0:
                raise InputError(f"records: {op_name} record with time_ms={secs * 1e3} cannot be fitted")
            c = collective_cost(comm("fit", kind, "fwd", size, group, "fp32"), alpha, alpha, bw, bw)
            lat.append(c.latency_s)
            vol.append(max(c.intra_bytes, c.inter_bytes) / bw)
            t.append(secs)
        lat, vol, t = np.array(lat), np.array(vol), np.array(t)
        # only bandwidth-bound messages (volume term >= latency term): the ratio is a bandwidth, and the
        # α-β latency of small messages is all-reduce's, which other collectives need not share
        keep = vol >= lat
        if keep.sum() < 2:
            continue
        lat, vol, t = lat[keep], vol[keep], t[keep]
        # least squares of (t - L)/t = (V/t)·x over x = 1/r
        x = float(np.dot(vol / t, (t - lat) / t) / np.dot(vol / t, vol / t))
        if x <= 0:
            raise InputError(f"records: {op_name} times do not grow with message size; its bus bandwidth "
                             "cannot be fitted")
        out[kind] = float(f"{1.0 / x:.3g}")
    return out
