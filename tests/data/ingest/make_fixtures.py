"""Write the fixtures of tests/test_ingest.py (run from the repository root).

    python tests/data/ingest/make_fixtures.py            # run logs, GPU-style trace, malformed traces
    python tests/data/ingest/make_fixtures.py --kineto   # also re-record kineto_cpu_small.json (needs torch)

Every expected value in the tests is computed by hand from the numbers written here; change both
together. ``kineto_cpu_small.json`` is a real trace of torch.profiler on the CPU: re-recording it
changes its timings (the tests check structure and shapes, not times).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ------------------------------------------------------------------------------- run logs
VALID_CSV = '''model,device,cluster,num_devices,seq_length,tp,pp,dp,micro_batch_size,global_batch_size,precision,recompute,sequence_parallel,iteration_time_ms,tokens_per_second,samples_per_second,iteration_p10_ms,iteration_p90_ms,repeats,peak_memory_MiB,host,measured_at,framework
gpt3-1.3b,,dgx-a100,8,,2,1,4,4,64,bf16,full,true,1234.5,,,1200,1300,10,40000,node-a,2024-05-01T12:00:00Z,megatron
gpt3-1.3b,A100-SXM4-80GB,,8,,1,2,4,2,32,bf16,,,,65536,,,,,,,,
"{""arch"": ""gpt"", ""name"": ""tiny"", ""num_layers"": 4, ""hidden_size"": 256, ""num_attention_heads"": 8, ""vocab_size"": 1000, ""seq_length"": 128}",A100-SXM4-80GB,,1,,,,,,4,fp32,,,,,8,,,,,,,
gpt3-125m,A100-SXM4-80GB,,1,1024,,,,,8,bf16,,,,8192,,,,,,,2024-05-02 08:30:00,
'''

BAD_CSV = '''model,cluster,num_devices,tp,pp,dp,global_batch_size,iteration_time_ms
gpt3-1.3b,dgx-a100,8,2,1,4,64,1000
gpt3-1.3b,dgx-a100,,2,1,4,64,1000
gpt3-1.3b,dgx-a100,8,two,1,4,64,1000
gpt3-1.3b,dgx-a100,8,2,2,4,64,1000
"{""arch"": ""gpt"", ""num_layers"": 2,
""hidden_size"": 64, ""num_attention_heads"": 4, ""vocab_size"": 100, ""seq_length"": 32}",dgx-a100,8,1,1,8,8,50
gpt3-1.3b,dgx-a100,8,1,1,8,8,abc
'''
# lines: 2 good; 3 missing num_devices; 4 tp 'two'; 5 tp·pp·dp = 16 != 8; 6-7 good (a quoted cell over two
# lines); 8 iteration_time_ms 'abc'

BAD_DEVICE_CSV = '''model,device,num_devices,iteration_time_ms
gpt3-125m,A100-SXM4-80GB,1,100
gpt3-125m,Z100-NOPE,1,100
'''

UNKNOWN_COLUMN_CSV = '''model,cluster,num_devices,t_p,iteration_time_ms,notes
gpt3-1.3b,dgx-a100,8,2,1000,first try
'''

RUN_OBJECT = {"model": "gpt3-125m",
              "hardware": {"device": "A100-SXM4-80GB", "num_devices": 4, "devices_per_node": 4},
              "strategy": {"dp": 4, "micro_batch_size": 2, "global_batch_size": 16, "precision": "bf16"}}

VALID_JSONL_LINES = [
    json.dumps({"run": RUN_OBJECT, "iteration_time_ms": 250.0, "framework": "deepspeed", "repeats": 20}),
    "",
    json.dumps({"model": "llama-2-7b", "cluster": "dgx-h100", "num_devices": 16, "tp": 8, "micro_batch_size": 1,
                "global_batch_size": 32, "zero_stage": 1, "tokens_per_second": 100000, "iteration_time_ms": 1311.0,
                "flash_attention": True, "measured_at": "2024-06-01T10:00:00+02:00"}),
]

BAD_JSONL_LINES = [
    json.dumps({"run": RUN_OBJECT, "iteration_time_ms": 250.0}),
    '{"model": "gpt3-1.3b", "cluster": "dgx-a100", "num_devices": 8, "tp": 2',
    json.dumps({"model": "gpt3-1.3b", "cluster": "dgx-a100", "num_devices": 8, "tp": 2, "pp": 2, "dp": 4,
                "iteration_time_ms": 900}),
    json.dumps({"run": RUN_OBJECT, "iteration_time_ms": 260.0}),
]
# lines: 1 good; 2 truncated JSON; 3 tp·pp·dp = 16 != 8 (strategy.dp); 4 good


def parquet_rows() -> tuple[list[dict], list[dict]]:
    """(valid rows, bad rows) of the Parquet fixtures; ints with nulls become floats in Parquet on purpose."""
    valid = [
        {"model": "gpt3-1.3b", "cluster": "dgx-a100", "num_devices": 16, "tp": 2.0, "pp": 2.0, "dp": None,
         "fsdp": False, "global_batch_size": 64.0, "samples_per_second": 32.0, "host": "node-b"},
        {"model": "gpt3-1.3b", "cluster": "dgx-a100", "num_devices": 8, "tp": None, "pp": None, "dp": 8.0,
         "fsdp": True, "global_batch_size": 16.0, "samples_per_second": 20.0, "host": None},
    ]
    bad = [
        {"model": "gpt3-125m", "device": "A100-SXM4-80GB", "num_devices": 1, "iteration_time_ms": 100.0},
        {"model": "gpt3-125m", "device": "Z100-NOPE", "num_devices": 1, "iteration_time_ms": 100.0},
        {"model": "gpt3-125m", "device": "A100-SXM4-80GB", "num_devices": 1, "iteration_time_ms": None},
    ]
    return valid, bad
# valid: row 0: dp = 16/4 = 4, gbs 64 → 1000·64/32 = 2000 ms; row 1: 1000·16/20 = 800 ms
# bad: row 0 good; row 1 unknown device (hardware.device); row 2 no target (iteration_time_ms)


def write_logs() -> None:
    import pandas as pd

    (HERE / "runs_valid.csv").write_text(VALID_CSV, encoding="utf-8")
    (HERE / "runs_bad.csv").write_text(BAD_CSV, encoding="utf-8")
    (HERE / "runs_bad_device.csv").write_text(BAD_DEVICE_CSV, encoding="utf-8")
    (HERE / "runs_unknown_column.csv").write_text(UNKNOWN_COLUMN_CSV, encoding="utf-8")
    (HERE / "runs_valid.jsonl").write_text("\n".join(VALID_JSONL_LINES) + "\n", encoding="utf-8")
    (HERE / "runs_bad.jsonl").write_text("\n".join(BAD_JSONL_LINES) + "\n", encoding="utf-8")
    valid, bad = parquet_rows()
    pd.DataFrame(valid).to_parquet(HERE / "runs_valid.parquet", index=False)
    pd.DataFrame(bad).to_parquet(HERE / "runs_bad.parquet", index=False)


# ------------------------------------------------------------------------------- traces
HOST_PID, HOST_TID, GPU_PID, STREAM, NCCL_STREAM = 1000, 1000, 0, 7, 20


def _cpu(name, ts, dur, dims=None, types=None, concrete=None, cat="cpu_op", **args):
    ev = {"ph": "X", "cat": cat, "name": name, "pid": HOST_PID, "tid": HOST_TID, "ts": ts, "dur": dur,
          "args": dict(args)}
    if dims is not None:
        ev["args"].update({"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete or [""] * len(dims)})
    return ev


def _launch(ts, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": HOST_PID, "tid": HOST_TID,
            "ts": ts, "dur": 4, "args": {"correlation": corr, "cbid": 211}}


def _kernel(name, ts, dur, corr, stream=STREAM):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": GPU_PID, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, "grid": [1, 1, 1], "block": [128, 1, 1]}}


def gpu_trace() -> dict:
    """A hand-written trace in the shape torch.profiler writes on a GPU (bf16, one NCCL all-reduce per step)."""
    bf = "c10::BFloat16"
    events = [
        {"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": "python"}},
    ]
    # per step: durations (us) of gemm, attention, layer_norm, gelu, backward mm, all-reduce kernels
    steps = [(1, 0, (120, 80, 10, 20, 100, 300)), (2, 3000, (130, 90, 12, 22, 110, 340))]
    corr = 1
    for step, t0, (t_gemm, t_attn, t_ln, t_gelu, t_mm, t_ar) in steps:
        t = t0 + 10000.0
        step_dur = 2000.0 + 100.0 * (step - 1)
        events.append(_cpu(f"ProfilerStep#{step}", t, step_dur, cat="user_annotation"))
        # linear: x [4, 512, 1024] · W[4096, 1024]^T + b
        events.append(_cpu("aten::linear", t + 10, 60, [[4, 512, 1024], [4096, 1024], [4096]], [bf, bf, bf]))
        events.append(_cpu("aten::addmm", t + 20, 40, [[4096], [2048, 1024], [1024, 4096], [], []],
                           [bf, bf, bf, "Scalar", "Scalar"], ["", "", "", "1", "1"]))
        events.append(_launch(t + 30, corr))
        events.append(_kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", t + 200, t_gemm, corr))
        corr += 1
        # causal flash attention [4, 16, 512, 64]
        q = [4, 16, 512, 64]
        events.append(_cpu("aten::_scaled_dot_product_flash_attention", t + 100, 50, [q, q, q, [], [], [], []],
                           [bf, bf, bf, "Scalar", "Scalar", "Scalar", ""], ["", "", "", "0.", "True", "False", ""]))
        events.append(_launch(t + 110, corr))
        events.append(_kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>",
                              t + 400, t_attn, corr))
        corr += 1
        # layer_norm over 1024 (aten::layer_norm calls native_layer_norm)
        events.append(_cpu("aten::layer_norm", t + 200, 40, [[4, 512, 1024], [], [1024], [1024], [], []],
                           [bf, "ScalarList", bf, bf, "Scalar", "Scalar"], ["", "[1024]", "", "", "1e-05", "True"]))
        events.append(_cpu("aten::native_layer_norm", t + 205, 30, [[4, 512, 1024], [], [1024], [1024], []],
                           [bf, "ScalarList", bf, bf, "Scalar"]))
        events.append(_launch(t + 210, corr))
        events.append(_kernel("void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float>", t + 500,
                              t_ln, corr))
        corr += 1
        # gelu [4, 512, 4096]
        events.append(_cpu("aten::gelu", t + 300, 20, [[4, 512, 4096], []], [bf, "Scalar"], ["", "none"]))
        events.append(_launch(t + 305, corr))
        events.append(_kernel("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", t + 520,
                              t_gelu, corr))
        corr += 1
        # an op of unknown kind, with a kernel: reported in unmapped, not made into a record
        events.append(_cpu("aten::nonzero", t + 350, 30, [[4, 512]], ["bool"]))
        events.append(_launch(t + 355, corr))
        events.append(_kernel("void at::native::nonzero_kernel", t + 545, 5, corr))
        corr += 1
        # backward: the weight-gradient GEMM of the linear layer
        events.append(_cpu("autograd::engine::evaluate_function: MmBackward0", t + 400, 100))
        events.append(_cpu("MmBackward0", t + 405, 90, [[2048, 4096]], [bf]))
        events.append(_cpu("aten::mm", t + 410, 60, [[4096, 2048], [2048, 1024]], [bf, bf]))
        events.append(_launch(t + 420, corr))
        events.append(_kernel("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_nn", t + 600, t_mm, corr))
        corr += 1
        # gradient all-reduce of 1024·1024 bf16 elements over 8 ranks
        events.append(_cpu("c10d::allreduce_", t + 600, 80, [[[1024, 1024]], [], [], [], []],
                           ["TensorList", "Object", "Object", "Object", "Scalar"]))
        events.append(_cpu("record_param_comms", t + 610, 60, **{
            "Collective name": "allreduce", "In msg nelems": 1048576, "Out msg nelems": 1048576,
            "dtype": "BFloat16", "Group size": 8, "Process Group Name": "0",
            "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]", "Rank": 0}))
        events.append(_launch(t + 620, corr))
        events.append(_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                              t + 800, t_ar, corr, stream=NCCL_STREAM))
        corr += 1
        # a scalar update on the host: no kernel, CPU time
        events.append(_cpu("aten::add_", t + 700, 8, [[], [], []], ["float", "float", "Scalar"], ["", "", "1"]))
        # a kernel launched outside any op (e.g. by a custom extension): unattributed
        events.append(_launch(t + 720, corr))
        events.append(_kernel("my_custom_kernel", t + 1200, 7, corr))
        corr += 1
    return {"schemaVersion": 1, "deviceProperties": [{
        "id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85097971712, "computeMajor": 8,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 108}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
        "record_shapes": 1, "host_name": "gpu-node-0", "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1714560000000000000, "traceEvents": events}


def bad_traces() -> None:
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 10.0,
         "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 20.0,
         "args": {"Input Dims": [[2, 4]], "Input type": ["float"]}},
    ]
    (HERE / "trace_missing_dur.json").write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    text = json.dumps({"traceEvents": events[:3]})
    (HERE / "trace_truncated.json").write_text(text[: len(text) // 2], encoding="utf-8")


def kineto_cpu() -> None:
    """Record a real torch.profiler trace of a tiny model on the CPU (2 steps after wait and warmup)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 128)
            self.ln = torch.nn.LayerNorm(128)
            self.fc2 = torch.nn.Linear(128, 32)

        def forward(self, x):
            return torch.softmax(self.fc2(self.ln(self.fc1(x))), dim=-1)

    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 32)
    out = HERE / "kineto_cpu_small.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for _ in range(4):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(str(out))
    # Kineto records the absolute output path as traceName: keep the fixture free of this machine's paths
    text = out.read_text(encoding="utf-8").replace(json.dumps(str(out))[1:-1], out.name)
    out.write_text(text, encoding="utf-8")
    print(f"{out}: {out.stat().st_size} bytes")


def main(argv: list[str]) -> None:
    write_logs()
    (HERE / "kineto_gpu_small.json").write_text(json.dumps(gpu_trace(), indent=1) + "\n", encoding="utf-8")
    bad_traces()
    if "--kineto" in argv:
        kineto_cpu()


if __name__ == "__main__":
    main(sys.argv[1:])
