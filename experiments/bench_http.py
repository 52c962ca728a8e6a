"""Latency and throughput of the HTTP service (``learnedperf serve``) on this machine.

Starts the service in a subprocess on 127.0.0.1 (an ephemeral port) with the shipped
checkpoint, warms it up, then sends ``--requests`` requests from ``--clients`` client
threads, each on its own persistent ``http.client`` connection, and prints what it
measured: requests/s, p50 / p90 / p99 / max latency in ms, and failed requests (a
connection error, a status other than 200, or an ``error`` in the answer). The clients
run in this process, on the same machine as the server: they share its CPUs.

Usage::

    python experiments/bench_http.py                    # POST /predict, 2000 requests, 32 clients
    python experiments/bench_http.py --batch 100        # POST /predict/batch, 100 runs per request
    python experiments/bench_http.py --tier full --requests 500
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import numpy as np

# valid runs with different strategies, so that the requests are not all the same run
RUNS = [{"model": model, "hardware": {"cluster": "dgx-a100", "num_devices": devices},
         "strategy": {"tp": tp, "pp": pp, "micro_batch_size": mbs}}
        for model in ("gpt3-1.3b", "gpt3-350m") for devices in (8, 16, 64)
        for tp in (1, 2, 4, 8) for pp in (1, 2) for mbs in (1, 2) if tp * pp <= devices]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str, list[str]]:
    """``serve(port=0)`` in a subprocess: the process, its base URL, and a list collecting its log."""
    call = (f"serve(port=0, checkpoint={args.checkpoint!r}, access_log={args.access_log}, "
            f"max_batch={max(args.batch, 1)})")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; from learnedperf.service import serve; "
                                                   f"sys.exit({call})"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)  # bounds the wait for the first line
    watchdog.start()
    first = proc.stderr.readline()
    watchdog.cancel()
    url = next((word for word in first.split() if word.startswith("http://")), None)
    if url is None:
        proc.kill()
        sys.exit(f"the server did not start: {first}{proc.stderr.read()}")
    log = [first]
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()  # keep the pipe drained
    return proc, url, log


def client_loop(url: str, path: str, bodies: list[bytes], take, latencies: list, failures: list) -> None:
    """Send requests until ``take()`` says none are left; record each latency (s) and failure."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    while (i := take()) is not None:
        start = time.perf_counter()
        try:
            conn.request("POST", path, body=bodies[i % len(bodies)], headers=headers)
            response = conn.getresponse()
            data = response.read()
            ok = response.status == 200 and b'"error"' not in data
            if not ok:
                failures.append(f"{response.status}: {data[:200]!r}")
        except (OSError, http.client.HTTPException) as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        latencies.append(time.perf_counter() - start)
    conn.close()


def run_load(url: str, path: str, bodies: list[bytes], n: int, clients: int) -> tuple[list, list, float]:
    """``n`` requests from ``clients`` threads: (latencies in s, failures, wall time in s)."""
    lock = threading.Lock()
    counter = iter(range(n))

    def take():
        with lock:
            return next(counter, None)

    latencies: list[float] = []
    failures: list[str] = []
    threads = [threading.Thread(target=client_loop, args=(url, path, bodies, take, latencies, failures))
               for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, failures, time.perf_counter() - start


def main() -> None:
    """Parse the arguments, run the benchmark, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="measured requests (default 2000)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent client threads (default 32)")
    parser.add_argument("--warmup", type=int, default=200, help="requests before measuring (default 200)")
    parser.add_argument("--batch", type=int, default=0, help="runs per POST /predict/batch request "
                                                             "(default 0: POST /predict, one run each)")
    parser.add_argument("--tier", choices=("fast", "full"), default="fast")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: the shipped one)")
    parser.add_argument("--access-log", action="store_true", help="log every request, as uvicorn does by default")
    args = parser.parse_args()

    if args.batch:
        path = "/predict/batch"
        bodies = [json.dumps({"runs": [RUNS[(i + j) % len(RUNS)] for j in range(args.batch)],
                              "tier": args.tier}).encode() for i in range(len(RUNS))]
    else:
        path = f"/predict?tier={args.tier}"
        bodies = [json.dumps(run).encode() for run in RUNS]

    proc, url, log = start_server(args)
    try:
        _, warm_fail, _ = run_load(url, path, bodies, args.warmup, min(args.clients, 4))
        lat, failures, wall = run_load(url, path, bodies, args.requests, args.clients)
    finally:
        proc.terminate()
        proc.wait(30)

    ms = np.asarray(lat) * 1e3
    http_impl = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    import uvicorn

    print(f"host: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
          f"Python {platform.python_version()}, {platform.system()} {platform.release()}")
    print(f"server: {log[0].strip()}")
    print(f"server stack: uvicorn {uvicorn.__version__} (http {http_impl}, loop {loop}), "
          f"access log {'on' if args.access_log else 'off'}, one process; clients in this process")
    print(f"load: POST {path}" + (f" ({args.batch} runs per request)" if args.batch else "")
          + f", {args.requests} requests from {args.clients} concurrent clients on persistent connections "
          f"(after {args.warmup} warm-up requests, {len(warm_fail)} failed)")
    print(f"requests/s: {args.requests / wall:,.0f}" + (f"  (predictions/s: {args.requests * args.batch / wall:,.0f})"
                                                        if args.batch else ""))
    print(f"latency ms: p50 {np.percentile(ms, 50):.2f}  p90 {np.percentile(ms, 90):.2f}  "
          f"p99 {np.percentile(ms, 99):.2f}  max {ms.max():.2f}")
    print(f"failed requests: {len(failures)} of {args.requests}")
    for text in failures[:5]:
        print(f"  {text}")


if __name__ == "__main__":
    main()
