"""Loaders that map the public measurements in ``shared/data`` to runs.

* vTrain (VIA-Research/vTrain, MIT): 1,440 measured Megatron-DeepSpeed GPT
  iterations on one node of 2-8 A100s (``vtrain/ground_truth_single_node.csv``).
* Megatron-LM SC21 Table 1 (Narayanan et al. 2021): 10 GPT runs on 32-3072
  A100-80GB of Selene (``published/megatron_sc21_table1.csv``).
* NeuSight (sitar-lab/NeuSight, MIT): ~267k fp32 single-kernel latencies on 5 GPUs
  (``neusight_ops.parquet``, :func:`load_neusight_ops`) and the end-to-end times of whole
  HuggingFace models on one GPU (``neusight_step_times.csv``, :func:`load_neusight_steps`).

:func:`vtrain_step_records`, :func:`load_neusight_steps` and :func:`load_neusight_ops` give the
record schemas of :mod:`.records` (step and operator records) for training.

Settings the files do not state come from the sources' own descriptions and
are written into each run (see the constants below and ``shared/data/README.md``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import InputError, SpecError
from ..io import load_json_file
from .records import canonical_json

#: GPT-2 BPE vocabulary used by both Megatron setups (Radford et al. 2019; Megatron's gpt2 tokenizer).
GPT2_VOCAB = 50257


@dataclass(frozen=True)
class MeasuredRun:
    """A run in the run format with its measured iteration time (ms) and where it came from."""

    run: dict
    iteration_time_ms: float
    source: str
    row: int


def default_shared_data() -> Path:
    """``../shared/data`` next to the repository (the layout of this project's machines)."""
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _num(row: dict, key: str, path: Path, line: int) -> float:
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{path}: line {line}: field {key!r} is missing or not a number") from None


def load_vtrain(data_dir: Path | None = None) -> list[MeasuredRun]:
    """vTrain's single-node runs: Megatron-DeepSpeed, fp16, full recompute, 1F1B, no gradient bucketing."""
    path = (data_dir or default_shared_data()) / "vtrain" / "ground_truth_single_node.csv"
    out = []
    for i, row in enumerate(_read_csv(path), start=2):
        n = int(_num(row, "# GPUs", path, i))
        run = {
            "model": {"arch": "gpt", "name": "vtrain-gpt", "num_layers": int(_num(row, "# layers", path, i)),
                      "hidden_size": int(_num(row, "hidden size", path, i)),
                      "num_attention_heads": int(_num(row, "attention heads", path, i)),
                      "vocab_size": GPT2_VOCAB, "seq_length": int(_num(row, "sequence length", path, i))},
            "hardware": {"cluster": "dgx-a100", "num_devices": n},
            "strategy": {"tp": int(_num(row, "tensor parallelism", path, i)),
                         "pp": int(_num(row, "pipeline parallelism", path, i)),
                         "dp": int(_num(row, "data parallelism", path, i)),
                         "micro_batch_size": int(_num(row, "micro batch", path, i)),
                         "global_batch_size": int(_num(row, "global batch", path, i)),
                         "pipeline_schedule": "1f1b", "recompute": "full", "precision": "fp16",
                         # Megatron-DeepSpeed of 2023: no fused flash attention, reduction after backward
                         "flash_attention": False, "overlap_grad_reduce": False},
            "id": f"vtrain-{i}",
        }
        out.append(MeasuredRun(run, _num(row, "iteration time (ms)", path, i), "vtrain", i))
    return out


def load_sc21(data_dir: Path | None = None, virtual_stages: int = 1) -> list[MeasuredRun]:
    """SC21 Table 1 as runs; the iteration time is derived from the published TFLOP/s.

    The table reports TFLOP/s per GPU counted with the paper's formula
    ``96·B·s·l·h²·(1 + s/6h + V/16lh)`` (recompute included), so the implied
    iteration time is that many FLOPs / (TFLOP/s · GPUs). Micro-batch size and
    the interleaving depth are not in the table: micro-batch 1 is used and the
    schedule is plain 1F1B unless ``virtual_stages`` > 1.
    """
    path = (data_dir or default_shared_data()) / "published" / "megatron_sc21_table1.csv"
    out = []
    for i, row in enumerate(_read_csv(path), start=2):
        l = int(_num(row, "num_layers", path, i))
        h = int(_num(row, "hidden_size", path, i))
        s = int(_num(row, "seq_len", path, i))
        V = int(_num(row, "vocab_size", path, i))
        B = int(_num(row, "global_batch_size_seqs", path, i))
        n = int(_num(row, "num_gpus", path, i))
        tp, pp, dp = (int(_num(row, k, path, i)) for k in ("tp", "pp", "dp"))
        tflops = _num(row, "tflops_per_gpu", path, i)
        flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        t_ms = flops / (tflops * 1e12 * n) * 1e3
        strategy = {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": 1, "global_batch_size": B,
                    "recompute": "full", "precision": "fp16", "flash_attention": False,
                    "pipeline_schedule": "1f1b"}
        v = virtual_stages
        if pp > 1 and v > 1 and l % (pp * v) == 0 and (B // dp) % pp == 0:
            strategy.update(pipeline_schedule="interleaved", virtual_pipeline_stages=v)
        run = {"model": {"arch": "gpt", "name": row.get("model", "gpt"), "num_layers": l, "hidden_size": h,
                         "num_attention_heads": int(_num(row, "num_heads", path, i)), "vocab_size": V,
                         "seq_length": s},
               "hardware": {"cluster": "selene", "num_devices": n},
               "strategy": strategy, "id": f"sc21-{i - 1}"}
        out.append(MeasuredRun(run, t_ms, "megatron-sc21", i))
    return out


# ============================================================== records for training
class LoadedSteps(NamedTuple):
    """Step records of a public data set and the rows left out: reason → count (nothing is dropped silently)."""

    records: list
    skipped: dict


def vtrain_step_records(data_dir: Path | None = None) -> list[dict]:
    """vTrain's 1,440 runs as step records (exactly ``STEP_COLUMNS``, ``source`` ``'vtrain'``).

    The file gives one median time per run: spread, repeat count, memory, host and date are unknown
    (null / 0 / ``'unknown'``); ``backend`` is ``'nccl'`` (Megatron-DeepSpeed on A100s).
    """
    from ..specs import RunSpec
    from .ingest import step_record

    out = []
    for m in load_vtrain(data_dir):
        try:
            spec = RunSpec.from_dict(m.run)
        except SpecError as exc:
            raise InputError(f"vtrain/ground_truth_single_node.csv: line {m.row}: {exc}") from None
        out.append(step_record(m.run, m.iteration_time_ms, source=m.source, spec=spec, backend="nccl"))
    return out


_VENDOR_PREFIX = re.compile(r"^(NVIDIA|Tesla|AMD Instinct|AMD)\s+")


def neusight_devices(data_dir: Path | None = None) -> dict[str, dict]:
    """NeuSight's device table as DeviceSpec dicts, keyed by the name NeuSight uses (``'Tesla T4'``).

    Mapping: ``name`` = the NeuSight name without the vendor word (``'T4'``, ``'A100-PCIE-40GB'``, which
    are also catalog names); ``peak_tflops.fp32`` = ``SingleFLOPs`` / 1000 (GFLOP/s → TFLOP/s; for the
    AMD rows, which have none, ``SingleFLOPsMM``, the FP32 matrix peak, as the catalog does);
    ``memory_bandwidth_GBps`` = ``Mem_Bw``; ``memory_GiB`` = ``Dev_Mem`` (data sheets' "GB" of HBM/GDDR
    are GiB); ``num_sms`` = ``Num_Sm``; ``clock_MHz`` = ``Freq``; ``l2_cache_MiB`` = ``L2Cache``.
    No link values: NeuSight's runs use one device.
    """
    from ..specs import DeviceSpec

    path = (data_dir or default_shared_data()) / "neusight_devices.csv"
    out = {}
    for i, row in enumerate(_read_csv(path), start=2):
        name = (row.get("Device") or "").strip()
        if not name:
            raise InputError(f"{path}: line {i}: field 'Device' is empty")
        flops_field = "SingleFLOPs" if (row.get("SingleFLOPs") or "").strip() else "SingleFLOPsMM"
        desc = {
            "name": _VENDOR_PREFIX.sub("", name),
            "vendor": "AMD" if name.startswith("AMD") else "NVIDIA",
            "peak_tflops": {"fp32": _num(row, flops_field, path, i) / 1000.0},
            "memory_bandwidth_GBps": _num(row, "Mem_Bw", path, i),
            "memory_GiB": _num(row, "Dev_Mem", path, i),
            "num_sms": int(_num(row, "Num_Sm", path, i)),
            "l2_cache_MiB": _num(row, "L2Cache", path, i),
            "clock_MHz": _num(row, "Freq", path, i),
            "sources": {"all": f"NeuSight neusight_devices.csv ({flops_field}, Mem_Bw, Dev_Mem, Num_Sm, Freq, "
                               "L2Cache)"},
        }
        try:
            out[name] = DeviceSpec.parse(desc, "device").to_dict()
        except SpecError as exc:
            raise InputError(f"{path}: line {i}: {exc}") from None
    return out


#: NeuSight op → (learnedperf kind, tensors of B·H elements read, written) for the (B, H) ops.
_NEUSIGHT_VECTOR_OPS = {
    "ln": ("layernorm", 1, 1), "softmax": ("softmax", 1, 1),
    "add": ("elementwise", 2, 1), "mul": ("elementwise", 2, 1), "div": ("elementwise", 2, 1),
    "pow": ("elementwise", 2, 1),
    # the "u" variants take a scalar second operand: one tensor in, one out
    "addu": ("elementwise", 1, 1), "mulu": ("elementwise", 1, 1), "divu": ("elementwise", 1, 1),
    "powu": ("elementwise", 1, 1), "relu": ("elementwise", 1, 1), "gelu": ("elementwise", 1, 1),
    "tanh": ("elementwise", 1, 1),
}
_NEUSIGHT_COLUMNS = ["op", "latency_ms", "device", "B", "H", "M", "N", "K", "Input_Channel", "Output_Channel",
                     "Kernel_Size", "Input_Size", "Stride", "Padding", "split", "large"]
#: FLOPs per element of the memory-bound kinds (graph.trace's convention).
_FLOPS_PER_ELEM = {"layernorm": 5.0, "softmax": 5.0, "elementwise": 1.0}
_FP32_BYTES = 4


def load_neusight_ops(data_dir: Path | None = None, devices=None, ops=None):
    """NeuSight's ~267k fp32 kernel latencies as operator records (a pandas DataFrame, ``OP_COLUMNS`` order).

    Mapping (checked against the kernels' grid sizes: NeuSight's ``linear``/``bmm`` multiply
    ``[B, M, N] × [B, N, K] → [B, M, K]``, i.e. ``N`` is the reduction dimension):

    * ``linear`` (B = 1) and ``bmm`` → ``matmul``, shape ``(B, M, K, N)`` in the ``(batch, m, n, k)``
      convention, FLOPs ``2·B·M·N·K``, bytes ``4·B·(M·N + N·K + M·K)`` (a linear's bias, if any, is
      not counted: the data do not say);
    * ``ln`` → ``layernorm`` (5 FLOPs/element, reads x and the 2·H affine parameters, writes y),
      ``softmax`` → ``softmax`` (5 FLOPs/element), ``add/mul/div/pow`` → ``elementwise`` reading two
      tensors, their scalar ``*u`` variants and ``relu/gelu/tanh`` → ``elementwise`` reading one;
      shape ``(B, H)``, 1 FLOP/element;
    * ``conv`` (2-D, square) → ``conv`` with graph.trace's implicit-GEMM shape
      ``(1, B·out², Cout, Cin·k²)``, ``out = (in + 2·padding − k) / stride + 1``, FLOPs ``2·prod(shape)``,
      bytes ``4·(B·Cin·in² + Cout·Cin·k² + B·Cout·out²)``.

    Every row: ``dtype`` fp32, ``direction`` fwd, ``world_size`` 1, ``time_ms`` = ``latency_ms``
    (NeuSight's median), p10/p90 null and ``repeats`` 0 (not published), ``timer`` ``'unknown'``,
    ``backend`` ``'cuda'``, ``source`` ``'neusight'``; ``device`` is the descriptor of
    :func:`neusight_devices`; ``params`` keeps ``neusight_op``, ``split`` (train_dims / test_dims),
    ``large`` when set, and the convolution's stride, padding and kernel size.

    Args:
        data_dir: the ``shared/data`` directory (default :func:`default_shared_data`).
        devices: keep only these devices (NeuSight names such as ``'Tesla T4'`` or short names such
            as ``'T4'``); default all.
        ops: keep only these NeuSight op names (``'linear'``, ``'ln'``...); default all.

    Raises:
        InputError: the file is missing, a device or op name is unknown, or a row lacks a dimension.
    """
    import numpy as np
    import pandas as pd

    from .records import OP_COLUMNS

    base = data_dir or default_shared_data()
    path = base / "neusight_ops.parquet"
    if not path.is_file():
        raise InputError(f"{path}: cannot read: no such file")
    descs = neusight_devices(base)
    filters = []
    if devices is not None:
        short = {_VENDOR_PREFIX.sub("", k): k for k in descs}
        wanted = []
        for d in devices:
            full = d if d in descs else short.get(d)
            if full is None:
                raise InputError(f"devices: unknown NeuSight device {d!r}; known: {', '.join(sorted(descs))}")
            wanted.append(full)
        filters.append(("device", "in", wanted))
    known_ops = {"linear", "bmm", "conv", *_NEUSIGHT_VECTOR_OPS}
    if ops is not None:
        bad = sorted(set(ops) - known_ops)
        if bad:
            raise InputError(f"ops: unknown NeuSight op(s) {bad}; known: {', '.join(sorted(known_ops))}")
        filters.append(("op", "in", list(ops)))
    try:
        df = pd.read_parquet(path, columns=_NEUSIGHT_COLUMNS, filters=filters or None)
    except Exception as exc:  # pyarrow: missing column, corrupt file
        raise InputError(f"{path}: cannot read: {exc}") from None
    unknown = sorted(set(df["op"].unique()) - known_ops)
    if unknown:
        raise InputError(f"{path}: op(s) {unknown} have no mapping to learnedperf kinds")
    unknown_dev = sorted(set(df["device"].unique()) - set(descs))
    if unknown_dev:
        raise InputError(f"{path}: device(s) {unknown_dev} are not in neusight_devices.csv")

    n = len(df)
    shape = pd.Series("", index=df.index, dtype=object)
    kind = pd.Series("", index=df.index, dtype=object)
    flops = np.zeros(n)
    nbytes = np.zeros(n)
    params = pd.Series("", index=df.index, dtype=object)
    op = df["op"].astype(str)
    large = df["large"].fillna(False).astype(bool)
    split = df["split"].astype(str)

    def need(mask, cols):
        missing = df.loc[mask, cols].isna().any(axis=1)
        if missing.any():
            i = missing.idxmax()
            raise InputError(f"{path}: row {i} ({df.at[i, 'op']}): a dimension of {cols} is missing")
        return df.loc[mask, cols].astype(np.int64)

    def ints(s):
        return s.astype(np.int64).astype(str)

    mm = op.isin(["linear", "bmm"]).to_numpy()
    if mm.any():
        d = need(mm, ["B", "M", "N", "K"])
        b, m, k_red, n_out = (d[c].to_numpy(dtype=np.float64) for c in ("B", "M", "N", "K"))
        kind[mm] = "matmul"
        shape[mm] = "[" + ints(d["B"]) + "," + ints(d["M"]) + "," + ints(d["K"]) + "," + ints(d["N"]) + "]"
        flops[mm] = 2.0 * b * m * k_red * n_out
        nbytes[mm] = _FP32_BYTES * b * (m * k_red + k_red * n_out + m * n_out)
    vec = op.isin(list(_NEUSIGHT_VECTOR_OPS)).to_numpy()
    if vec.any():
        d = need(vec, ["B", "H"])
        rows, cols = d["B"].to_numpy(dtype=np.float64), d["H"].to_numpy(dtype=np.float64)
        numel = rows * cols
        table = op[vec].map(_NEUSIGHT_VECTOR_OPS)
        k = table.map(lambda t: t[0])
        reads = table.map(lambda t: t[1]).to_numpy(dtype=np.float64)
        writes = table.map(lambda t: t[2]).to_numpy(dtype=np.float64)
        kind[vec] = k
        shape[vec] = "[" + ints(d["B"]) + "," + ints(d["H"]) + "]"
        flops[vec] = k.map(_FLOPS_PER_ELEM).to_numpy(dtype=np.float64) * numel
        affine = np.where(k.to_numpy() == "layernorm", 2.0 * cols, 0.0)  # LayerNorm weight and bias
        nbytes[vec] = _FP32_BYTES * (numel * (reads + writes) + affine)
    conv = (op == "conv").to_numpy()
    if conv.any():
        cc = ["B", "Input_Channel", "Output_Channel", "Kernel_Size", "Input_Size", "Stride", "Padding"]
        d = need(conv, cc)
        bsz, cin, cout, ks, size, stride, pad = (d[c].to_numpy(dtype=np.int64) for c in cc)
        out = (size + 2 * pad - ks) // stride + 1
        if (out < 1).any():
            i = d.index[np.argmax(out < 1)]
            raise InputError(f"{path}: row {i} (conv): output size < 1")
        gm, gn, gk = bsz * out * out, cout, cin * ks * ks
        kind[conv] = "conv"
        shape[conv] = ("[1," + pd.Series(gm, index=d.index).astype(str) + "," + ints(d["Output_Channel"]) + ","
                       + pd.Series(gk, index=d.index).astype(str) + "]")
        flops[conv] = 2.0 * gm.astype(np.float64) * gn * gk
        nbytes[conv] = _FP32_BYTES * (bsz * cin * size * size + cout * cin * ks * ks
                                      + bsz * cout * out * out).astype(np.float64)
        params[conv] = ('{"kernel_size":' + ints(d["Kernel_Size"]) + ',"neusight_op":"conv","padding":'
                        + ints(d["Padding"]) + ',"split":"' + split[conv] + '","stride":' + ints(d["Stride"]) + "}")
    plain = ~conv
    # shape and params are canonical JSON (compact, sorted keys) as records.canonical_json writes them,
    # built column-wise for speed
    params[plain] = np.where(large[plain], '{"large":true,"neusight_op":"' + op[plain] + '","split":"'
                             + split[plain] + '"}', '{"neusight_op":"' + op[plain] + '","split":"' + split[plain] + '"}')
    if conv.any() and large[conv].any():
        params[conv & large.to_numpy()] = params[conv & large.to_numpy()].str.replace('{', '{"large":true,', n=1)

    dev = df["device"].astype(str)
    dev_json = {k: canonical_json(v) for k, v in descs.items()}
    frame = pd.DataFrame({
        "op": op, "kind": kind, "direction": "fwd", "shape": shape, "params": params, "dtype": "fp32",
        "flops": flops, "bytes": nbytes, "world_size": 1, "time_ms": df["latency_ms"].astype(np.float64),
        "time_p10_ms": np.nan, "time_p90_ms": np.nan, "repeats": 0, "warmup": 0, "timer": "unknown",
        "device_name": dev.map({k: v["name"] for k, v in descs.items()}), "device": dev.map(dev_json),
        "backend": "cuda", "threads": 0, "host": "unknown", "source": "neusight", "measured_at": None,
    }, columns=list(OP_COLUMNS))
    return frame.reset_index(drop=True)


def load_neusight_steps(data_dir: Path | None = None) -> LoadedSteps:
    """NeuSight's measured training runs (``neusight_step_times.csv``) as step records.

    Runs are ``<model>-<inf|train>-<seq>-<batch>``: training runs become one run each — the HF config
    ``neusight_model_configs/<model>.json`` through ``ModelSpec.from_hf_config`` at that sequence
    length, one device of :func:`neusight_devices`, micro = global batch, fp32, no flash attention —
    with ``iteration_time_ms`` = ``e2e_latency`` (forward + backward as NeuSight times them; no
    optimizer step), the parts kept in ``run.meta``. Inference runs are not training iterations and are
    skipped, counted in ``skipped["inference"]``.

    Raises:
        InputError: a file is missing or malformed, a model config is missing, or its layer count
            differs from the CSV's ``num_layer``.
    """
    from ..specs import ModelSpec, RunSpec
    from .ingest import step_record

    base = data_dir or default_shared_data()
    path = base / "neusight_step_times.csv"
    descs = neusight_devices(base)
    records, skipped = [], {}
    for i, row in enumerate(_read_csv(path), start=2):
        name = (row.get("run") or "").strip()
        parts = name.rsplit("-", 3)
        if len(parts) != 4 or parts[1] not in ("inf", "train") or not parts[2].isdigit() or not parts[3].isdigit():
            raise InputError(f"{path}: line {i}: field 'run': expected <model>-<inf|train>-<seq>-<batch>, "
                             f"got {name!r}")
        model_name, mode, seq, batch = parts[0], parts[1], int(parts[2]), int(parts[3])
        if mode == "inf":
            skipped["inference"] = skipped.get("inference", 0) + 1
            continue
        device_name = (row.get("device_dir") or "").replace("_", " ").strip()
        if device_name not in descs:
            raise InputError(f"{path}: line {i}: field 'device_dir': {row.get('device_dir')!r} is not in "
                             "neusight_devices.csv")
        cfg_path = base / "neusight_model_configs" / f"{model_name}.json"
        config = load_json_file(cfg_path)
        try:
            model = ModelSpec.from_hf_config(config, seq_length=seq).model_copy(update={"name": model_name})
        except SpecError as exc:
            raise InputError(f"{cfg_path}: {exc}") from None
        layers = (row.get("num_layer") or "").strip()
        if layers and float(layers) > 0 and int(float(layers)) != model.num_layers:
            raise InputError(f"{path}: line {i}: num_layer = {layers} but {cfg_path.name} has "
                             f"{model.num_layers} layers")
        run = {"model": model.to_dict(),
               "hardware": {"device": descs[device_name], "num_devices": 1},
               "strategy": {"micro_batch_size": batch, "global_batch_size": batch, "precision": "fp32",
                            "flash_attention": False},
               "id": f"neusight-{device_name.replace(' ', '_')}-{name}",
               "meta": {"fw_latency_ms": _num(row, "fw_latency", path, i),
                        "bwall_latency_ms": _num(row, "bwall_latency", path, i),
                        "optimizer_step_included": False}}
        try:
            spec = RunSpec.from_dict(run)
        except SpecError as exc:
            raise InputError(f"{path}: line {i}: {exc}") from None
        records.append(step_record(run, _num(row, "e2e_latency", path, i), source="neusight", spec=spec,
                                   backend="none"))
    return LoadedSteps(records, skipped)
