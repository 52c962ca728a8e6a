"""Loaders that map the public measurements in ``shared/data`` to runs.

* vTrain (VIA-Research/vTrain, MIT): 1,440 measured Megatron-DeepSpeed GPT
  iterations on one node of 2-8 A100s (``vtrain/ground_truth_single_node.csv``).
* Megatron-LM SC21 Table 1 (Narayanan et al. 2021): 10 GPT runs on 32-3072
  A100-80GB of Selene (``published/megatron_sc21_table1.csv``).
* NeuSight (sitar-lab/NeuSight, MIT): ~267k fp32 single-kernel latencies on 5 GPUs
  (``neusight_ops.parquet``, :func:`load_neusight_ops`), the end-to-end times of whole
  HuggingFace models on one GPU (``neusight_step_times.csv``, :func:`load_neusight_steps`) and
  the torch.fx node tables of those models with per-node latencies
  (``neusight_graph_nodes.parquet``, :func:`load_neusight_graph_nodes`; operator records of their
  nodes: :func:`neusight_graph_ops`).

:func:`vtrain_step_records`, :func:`load_neusight_steps` and :func:`load_neusight_ops` give the
record schemas of :mod:`.records` (step and operator records) for training.

Settings the files do not state come from the sources' own descriptions and
are written into each run (see the constants below and ``shared/data/README.md``).
"""

from __future__ import annotations

import csv
import json
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
    """SC21 Table 1 as runs (ids ``sc21-<row>``), read by :func:`.published.load_published`.

    The table reports TFLOP/s per GPU counted with the paper's formula
    ``96·B·s·l·h²·(1 + s/6h + V/16lh)`` (recompute included; the row's notes say so), so the
    implied iteration time is that many FLOPs / (TFLOP/s · GPUs). Micro-batch size and
    the interleaving depth are not in the table: micro-batch 1 is used and the
    schedule is plain 1F1B unless ``virtual_stages`` > 1 (where the layers and the
    micro-batches per replica divide over it).
    """
    from .published import load_published

    path = (data_dir or default_shared_data()) / "published" / "megatron_sc21_table1.csv"
    out = []
    for m in load_published(path, strict=True).runs:
        s = dict(m.run["strategy"])
        layers, v = m.run["model"]["num_layers"], virtual_stages
        if s["pp"] > 1 and v > 1 and layers % (s["pp"] * v) == 0 and (s["global_batch_size"] // s["dp"]) % s["pp"] == 0:
            s.update(pipeline_schedule="interleaved", virtual_pipeline_stages=v)
        run = {**m.run, "strategy": s, "id": f"sc21-{m.row - 1}"}
        out.append(MeasuredRun(run, m.iteration_time_ms, "megatron-sc21", m.row))
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
    are GiB); ``num_sms`` = ``Num_Sm``; ``clock_MHz`` = ``Freq``; ``l2_cache_MiB`` = ``L2Cache``;
    ``tdp_W``, which the table lacks, from the catalog's entry of that name (its data sheet), where there
    is one: the cost model derates a card powered by its slot alone (``cost.params.slot_powered``).
    No link values: NeuSight's runs use one device.
    """
    from ..catalog import device_by_reported_name, get_device, source
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
        key = device_by_reported_name(name)
        tdp = get_device(key).get("tdp_W") if key else None
        if tdp is not None:
            cited = (source("devices", key).get("sources") or {}).get("tdp_W", "")
            desc["tdp_W"] = tdp
            desc["sources"]["tdp_W"] = f"the catalog's {key}: {cited}".rstrip(": ")
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
    """NeuSight's measured runs (``neusight_step_times.csv``) as step records.

    Runs are ``<model>-<inf|train>-<seq>-<batch>``; each becomes one run — the HF config
    ``neusight_model_configs/<model>.json`` through ``ModelSpec.from_hf_config`` at that sequence
    length, one device of :func:`neusight_devices`, micro = global batch, fp32, no flash attention, eager
    PyTorch (``fused_elementwise`` false), no optimizer step (``optimizer: "none"``); BERT's inference runs
    with a classification head (``lm_head`` false: the head NeuSight's traced graphs end in) — with
    ``iteration_time_ms`` = ``e2e_latency``: forward +
    backward as NeuSight times them for ``train``, the forward alone for ``inf``
    (``forward_only: true``). The parts are kept in ``run.meta``. Encoder-decoder models (Switch/T5)
    are skipped, counted in ``skipped["encoder-decoder"]``: ModelSpec has one stack, and the run name
    does not give the decoder's input length.

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
        device_name = (row.get("device_dir") or "").replace("_", " ").strip()
        if device_name not in descs:
            raise InputError(f"{path}: line {i}: field 'device_dir': {row.get('device_dir')!r} is not in "
                             "neusight_devices.csv")
        cfg_path = base / "neusight_model_configs" / f"{model_name}.json"
        config = load_json_file(cfg_path)
        if config.get("is_encoder_decoder"):
            skipped["encoder-decoder"] = skipped.get("encoder-decoder", 0) + 1
            continue
        if mode == "inf" and config.get("model_type") == "bert":
            # NeuSight's BERT inference graphs end in a pooler and a two-label classifier
            # (neusight_graph_nodes.parquet: nodes bert_pooler_dense and classifier, output [batch, 2]), not in
            # the masked-LM head its config names: a sequence-classification model
            config = {**config, "architectures": ["BertForSequenceClassification"]}
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
               # NeuSight times forward and backward (e2e = fw + bwall), or the forward alone: no optimizer step
               # HF Transformers models in eager PyTorch: one kernel per tensor operation (GPT-2's written-out
               # GELU, attention's scaling, mask and softmax apart)
               "strategy": {"micro_batch_size": batch, "global_batch_size": batch, "precision": "fp32",
                            "flash_attention": False, "fused_elementwise": False, "optimizer": "none",
                            "forward_only": mode == "inf"},
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


# ============================================================== NeuSight whole-model graphs
#: Columns of ``neusight_graph_nodes.parquet`` the graph loader reads.
_GRAPH_SOURCE_COLUMNS = ["op", "target", "_input_nodes", "users", "input_shapes", "output_shape", "dtype", "Name",
                         "latency", "fw_latency", "bw_latency", "acc_latency", "meta", "device_dir", "run",
                         "node_index"]
#: Columns of :func:`load_neusight_graph_nodes`, in order.
GRAPH_NODE_COLUMNS = ("run", "device", "model", "mode", "seq", "batch", "node_index", "node_op", "target",
                      "target_op", "name", "module_type", "in_layer", "inputs", "users", "input_shapes",
                      "output_shape", "dtype", "latency_ms", "fw_latency_ms", "bw_latency_ms", "acc_latency_ms")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_BUILTIN = re.compile(r"^<built-in (?:function|method) (\w+)(?: of type object)?>$")
_FUNCTION = re.compile(r"^<function (\w+)>$")
_CLASS = re.compile(r"^<class '([\w.]+)'>$")
_NODE_NAMES = re.compile(r"([A-Za-z_]\w*)\s*:\s*None")
_MODULE_STACK = re.compile(r"\('([^']*)', <class '([^']*)'>\)")
#: A module path of the first repeated block of a HuggingFace model (``transformer.h.0``,
#: ``bert.encoder.layer.0``, ``model.decoder.layers.0``): NeuSight traces one block and scales it.
_BLOCK0 = re.compile(r"\.(?:h|layer|layers|blocks)\.0(?:\.|$)")
_TORCH_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                 "torch.int64": "int64", "torch.int32": "int32", "torch.bool": "bool"}


def _target_op(node_op: str, target: str, module_type: str | None) -> str:
    """A short, address-free name of what a node calls (the key of the mapping and of unmapped counts).

    ``<built-in function add>`` → ``add`` (Python operator), ``<built-in method addmm of type object>``
    → ``torch.addmm``, ``<function softmax>`` → ``softmax``, ``<class 'torch.finfo'>`` → ``torch.finfo``,
    a method → ``.view``, a module → its class name (``Linear``), other node kinds → the node kind.
    """
    if node_op == "call_function":
        m = _BUILTIN.match(target)
        if m:
            return ("torch." if "of type object" in target else "") + m.group(1)
        m = _FUNCTION.match(target) or _CLASS.match(target)
        return m.group(1) if m else target
    if node_op == "call_method":
        return "." + target
    if node_op == "call_module":
        return (module_type or "?").rsplit(".", 1)[-1]
    return node_op


def load_neusight_graph_nodes(path: Path | str | None = None):
    """NeuSight's torch.fx node tables of whole HuggingFace models, one row per node (a pandas DataFrame).

    The file (``neusight_graph_nodes.parquet``) stores every field as text; this loader parses them.
    NeuSight traces **one** transformer block (``transformer.h.0``, ``bert.encoder.layer.0``...) plus
    the embeddings and the head; ``in_layer`` marks the nodes of that block, which stand for
    ``num_layer`` identical blocks of the real model (``neusight_step_times.csv``).

    Columns (:data:`GRAPH_NODE_COLUMNS`):

    * ``run`` (``<model>-<inf|train>-<seq>-<batch>``) and its parts ``model``, ``mode`` (``'inf'`` or
      ``'train'``), ``seq``, ``batch``; ``device``: the NeuSight device name (``'Tesla T4'``, a key of
      :func:`neusight_devices`); ``node_index``: position in the graph;
    * ``node_op``: the fx node kind (``placeholder``, ``get_attr``, ``call_function``, ``call_method``,
      ``call_module``, ``output``); ``target``: the fx target with memory addresses removed;
      ``target_op``: its short name (see :func:`_target_op`: ``torch.addmm``, ``add``, ``.view``,
      ``Linear``...); ``name``: the node name; ``module_type``: the class of a called module
      (``torch.nn.modules.linear.Linear``), else None; ``in_layer``: inside the traced block;
    * ``inputs`` and ``users``: lists of node names (the graph's edges); ``input_shapes``: list of
      shapes of the arguments (Python scalars appear as ``[1]``); ``output_shape``: a list;
      ``dtype``: ``'fp32'``, ``'fp16'``, ``'bf16'``, ``'int64'``, ``'int32'``, ``'bool'`` or None for
      non-tensor outputs (sizes, scalars);
    * ``latency_ms`` (= fw + bw + gradient accumulation), ``fw_latency_ms``, ``bw_latency_ms``,
      ``acc_latency_ms`` (accumulation of parameter gradients): milliseconds, medians as NeuSight
      measured them on one GPU, fp32. Inference runs have zero backward and accumulation.

    Args:
        path: the parquet file (default ``neusight_graph_nodes.parquet`` of :func:`default_shared_data`).

    Raises:
        InputError: the file is missing or unreadable, a column is missing, or a field cannot be
            parsed (naming the file, the row and the field).
    """
    import ast

    import numpy as np
    import pandas as pd

    path = Path(path) if path is not None else default_shared_data() / "neusight_graph_nodes.parquet"
    if not path.is_file():
        raise InputError(f"{path}: cannot read: no such file")
    try:
        raw = pd.read_parquet(path)
    except Exception as exc:  # pyarrow: corrupt or truncated file
        raise InputError(f"{path}: cannot read: {exc}") from None
    missing = [c for c in _GRAPH_SOURCE_COLUMNS if c not in raw.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}")

    def parse(i: int, field: str, text, how):
        try:
            return how(text)
        except (ValueError, SyntaxError, TypeError):
            raise InputError(f"{path}: row {i}: field {field!r}: cannot parse {text!r}") from None

    out = []
    for i, r in enumerate(raw[_GRAPH_SOURCE_COLUMNS].itertuples(index=False)):
        (node_op, target, inputs, users, in_shapes, out_shape, dtype, name, lat, fw, bw, acc, meta,
         device_dir, run, node_index) = r
        parts = str(run).rsplit("-", 3)
        if len(parts) != 4 or parts[1] not in ("inf", "train") or not parts[2].isdigit() or not parts[3].isdigit():
            raise InputError(f"{path}: row {i}: field 'run': expected <model>-<inf|train>-<seq>-<batch>, got {run!r}")
        stack = _MODULE_STACK.findall(meta or "")
        target = _ADDRESS.sub("", str(target))
        module_type = None
        if node_op == "call_module":
            module_type = next((cls for key, cls in stack if key == target), None)
            if module_type is None:
                raise InputError(f"{path}: row {i}: field 'meta': no nn_module_stack entry for module {target!r}")
        in_layer = any(_BLOCK0.search(key) for key, _ in stack) or (
            node_op in ("call_module", "get_attr") and bool(_BLOCK0.search(target)))
        if isinstance(dtype, str):
            if dtype not in _TORCH_DTYPES:
                raise InputError(f"{path}: row {i}: field 'dtype': unknown dtype {dtype!r}")
            dt = _TORCH_DTYPES[dtype]
        else:
            dt = None  # a non-tensor output (size, scalar): the tracer records no dtype
        shapes = parse(i, "input_shapes", in_shapes, json.loads)
        oshape = parse(i, "output_shape", out_shape, ast.literal_eval)
        if isinstance(oshape, int):
            oshape = (oshape,)
        if not isinstance(shapes, list) or not isinstance(oshape, tuple):
            raise InputError(f"{path}: row {i}: fields 'input_shapes'/'output_shape': expected lists of dimensions")
        times = [parse(i, f, v, float) for f, v in (("latency", lat), ("fw_latency", fw), ("bw_latency", bw),
                                                    ("acc_latency", acc))]
        if not all(np.isfinite(t) and t >= 0 for t in times):
            raise InputError(f"{path}: row {i}: a latency field is negative or not finite: {times}")
        out.append((run, str(device_dir).replace("_", " ").strip(), parts[0], parts[1], int(parts[2]),
                    int(parts[3]), int(node_index), node_op, target, _target_op(node_op, target, module_type),
                    name, module_type, bool(in_layer), _NODE_NAMES.findall(inputs or ""),
                    _NODE_NAMES.findall(users or ""), shapes, list(oshape), dt, *times))
    df = pd.DataFrame(out, columns=list(GRAPH_NODE_COLUMNS))
    for col in ("dtype", "module_type"):
        # object columns keep None (pandas would otherwise infer a string column and store NaN)
        df[col] = pd.Series([row[GRAPH_NODE_COLUMNS.index(col)] for row in out], dtype=object, index=df.index)
    return df


class GraphOps(NamedTuple):
    """Operator records of graph nodes and what gave no record; unpacks as ``(ops, unmapped)``.

    Attributes:
        ops: pandas DataFrame, ``OP_COLUMNS`` then :data:`GRAPH_OP_EXTRA_COLUMNS`.
        unmapped: pandas DataFrame with columns ``device``, ``run``, ``target_op``, ``reason``,
            ``nodes`` (count) and the latencies those nodes carry (``fw_latency_ms``,
            ``bw_latency_ms``, ``acc_latency_ms``, summed), one row per (device, run, target_op,
            reason); sum ``nodes`` over runs for totals per target.
    """

    ops: "object"
    unmapped: "object"


#: Columns that :func:`neusight_graph_ops` adds after ``OP_COLUMNS``: where each record comes from.
GRAPH_OP_EXTRA_COLUMNS = ("run", "model", "mode", "seq", "batch", "node_index", "node_name", "target_op",
                          "in_layer")
#: GEMM nodes: target_op → the measured-operator name whose conventions give FLOPs and bytes
#: (:func:`learnedperf.measure.ops.as_op`).
_GRAPH_GEMMS = {"Linear": "linear", "torch.addmm": "linear", "torch.matmul": "bmm", "torch.bmm": "bmm",
                "torch.mm": "bmm"}
#: Memory-bound nodes: target_op → (kind, op name). FLOPs per element come from
#: measure.ops.ELEMENTWISE_TRAFFIC when the op name is there, else 1 (graph.trace's convention for
#: element-wise ops, reductions and copies).
_GRAPH_MEMORY_BOUND = {
    "LayerNorm": ("layernorm", "layer_norm"), "layer_norm": ("layernorm", "layer_norm"),
    "softmax": ("softmax", "softmax"), "torch.softmax": ("softmax", "softmax"), ".softmax": ("softmax", "softmax"),
    "gelu": ("elementwise", "gelu"), "GELU": ("elementwise", "gelu"),
    "add": ("elementwise", "add"), "torch.add": ("elementwise", "add"), ".add": ("elementwise", "add"),
    "iadd": ("elementwise", "add"),
    "mul": ("elementwise", "mul"), "torch.mul": ("elementwise", "mul"), ".mul": ("elementwise", "mul"),
    "Dropout": ("elementwise", "dropout"), "dropout": ("elementwise", "dropout"),
    "sub": ("elementwise", "sub"), "truediv": ("elementwise", "div"), "torch.div": ("elementwise", "div"),
    "pow": ("elementwise", "pow"), "torch.pow": ("elementwise", "pow"),
    "torch.tanh": ("elementwise", "tanh"), "Tanh": ("elementwise", "tanh"),
    "ReLU": ("elementwise", "relu"), "relu": ("elementwise", "relu"), "torch.relu": ("elementwise", "relu"),
    "torch.where": ("elementwise", "where"), ".masked_fill": ("elementwise", "masked_fill"),
    ".masked_fill_": ("elementwise", "masked_fill"), "torch.max": ("elementwise", "max"),
    # HuggingFace calls contiguous() right after a permute: a real copy
    ".contiguous": ("elementwise", "contiguous"),
}
_GRAPH_EMBEDDINGS = {"Embedding", "embedding"}
#: Nodes that launch no kernel: views, shape queries, Python values.
_GRAPH_NO_KERNEL = {".view", ".reshape", ".permute", ".transpose", ".expand", ".unsqueeze", ".squeeze", ".split",
                    "getitem", ".size", ".dim", "getattr", "torch.finfo"}
#: Views whose result is strided, so that a contiguous() of it copies.
_GRAPH_STRIDED_VIEWS = {".transpose", ".permute", ".expand", "getitem", ".split"}
#: Casts: a copy kernel only when the dtype changes.
_GRAPH_CASTS = {".to", ".type", ".type_as", ".float", ".half", ".bfloat16", ".bool", ".long", ".int"}
_FLOAT_DTYPES = ("fp32", "fp16", "bf16")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _graph_node_op(node, e: int):
    """(measured-op name, forward Op, why-not) of one graph node; the Op is None when it cannot be mapped."""
    from ..graph.ops import Op, elementwise
    from .ops import ELEMENTWISE_TRAFFIC, OpCase, as_op

    t, shapes, out = node.target_op, node.input_shapes, [int(d) for d in node.output_shape]
    tensors = [s for s in shapes if _numel(s) > 1]  # Python scalars appear as [1]
    if t in _GRAPH_GEMMS:
        try:
            if t == "Linear":
                k, n = int(shapes[0][-1]), out[-1]
                b, m = 1, _numel(out) // n
                if _numel(shapes[0]) != m * k:
                    return None, None, f"{t}: input {shapes[0]} and output {out} disagree"
            elif t == "torch.addmm":  # addmm(bias, [m, k], [k, n])
                (m, k), (k2, n), b = shapes[1], shapes[2], 1
                if k2 != k:
                    return None, None, f"{t}: operands {shapes[1]} x {shapes[2]} do not chain"
            else:
                a, w = shapes[0], shapes[1]
                if len(a) < 2 or len(w) < 2:
                    return None, None, f"{t}: a 1-D operand has no GEMM shape"
                m, k, k2, n = int(a[-2]), int(a[-1]), int(w[-2]), int(w[-1])
                if k2 != k:
                    return None, None, f"{t}: operands {a} x {w} do not chain"
                b = _numel(out) // (m * n)
        except (IndexError, TypeError, ValueError):
            return None, None, f"{t}: input shapes {shapes} are not a GEMM's"
        name = _GRAPH_GEMMS[t]
        # the measured-operator conventions (2·b·m·n·k FLOPs, both operands read, output written; bias
        # not counted), so these records and this project's own op records mean the same thing
        return name, as_op(OpCase(name, "matmul", (int(b), int(m), int(n), int(k)), dtype=node.dtype)), None
    if t in _GRAPH_EMBEDDINGS:
        h = out[-1]
        tokens = _numel(out) // h
        # measure.ops.as_op's embedding: the gathered rows written plus the int64 indices read
        return "embedding", Op("embedding", "embedding", "fwd", 0.0, float(tokens * h * e + tokens * 8),
                               node.dtype, (tokens, h)), None
    if t in _GRAPH_MEMORY_BOUND or t in _GRAPH_CASTS:
        kind, name = _GRAPH_MEMORY_BOUND.get(t, ("elementwise", "cast"))
        numel = _numel(out)
        # reads from the node's real operands (a broadcast mask is read once, a scalar not at all);
        # without broadcasting this is exactly ELEMENTWISE_TRAFFIC's count
        reads = 1.0 if kind in ("layernorm", "softmax") else sum(_numel(s) for s in tensors) / numel
        fpe = ELEMENTWISE_TRAFFIC.get(name, (0, 0, 1.0))[2]
        return name, elementwise(name, kind, "fwd", numel, reads, 1, e, node.dtype, fpe, out[-1] if out else 1), None
    return None, None, f"no learnedperf kind for {t!r}"


def _backward_total(fwd):
    """The backward of forward op ``fwd`` as one Op (summed FLOPs and bytes, forward shape), as
    :func:`learnedperf.measure.ops.as_op` returns a measured operator's backward."""
    from ..graph.ops import Op
    from ..graph.transformer import backward_of

    bwd = backward_of([fwd])
    return Op(fwd.name, fwd.kind, "bwd", sum(o.flops for o in bwd), sum(o.bytes for o in bwd), fwd.dtype,
              fwd.shape, None, fwd.causal)


def neusight_graph_ops(nodes, data_dir: Path | None = None, modes=("train",)) -> GraphOps:
    """Operator records (``OP_COLUMNS``) of the nodes of NeuSight graphs, and every node that gave none.

    Args:
        nodes: the DataFrame of :func:`load_neusight_graph_nodes`.
        data_dir: the ``shared/data`` directory, for the device descriptors (default
            :func:`default_shared_data`).
        modes: the run modes to map (``'train'``, ``'inf'``); nodes of other runs are left out
            (a filter, not a loss: they appear in neither output).

    Mapping (kinds of :data:`learnedperf.features.ops.KINDS`; FLOPs and bytes in the conventions of
    :func:`learnedperf.measure.ops.as_op`, the project's measured-operator records):

    * ``Linear`` (input ``[..., k]``, output ``[..., n]``), ``torch.addmm(bias, [m,k], [k,n])`` →
      ``matmul`` shape ``(1, m, n, k)``; ``torch.matmul`` / ``torch.bmm`` (``[..., m, k] × [..., k, n]``)
      → ``matmul`` ``(batch, m, n, k)``, batch the product of the output's leading dimensions. ``k``
      is the reduction dimension; FLOPs ``2·batch·m·n·k``, bytes ``e·batch·(m·k + k·n + m·n)``.
    * ``LayerNorm`` → ``layernorm``, ``softmax`` → ``softmax``; ``add``, ``sub``, ``mul``, ``truediv``,
      ``pow``, ``gelu``, ``tanh``, ``ReLU``, ``Dropout``/``dropout``, ``where``, ``masked_fill``,
      ``max``, ``contiguous`` of a transposed/permuted/expanded/sliced view and dtype-changing
      casts → ``elementwise``: shape ``(rows, last dim)`` of the output, bytes = operands with more
      than one element read + output written, FLOPs per output element from
      ``measure.ops.ELEMENTWISE_TRAFFIC`` (gelu 8, dropout 2, norms 5...) or 1.
    * ``Embedding`` / ``embedding`` → ``embedding`` ``(tokens, hidden)``, bytes ``e·tokens·hidden + 8·tokens``.
    * Backward (training runs): one ``bwd`` record per node with ``bw_latency_ms`` — a GEMM's two
      gradient GEMMs summed (2× forward FLOPs and bytes), memory-bound ops and embeddings 2× forward
      (``graph.transformer.backward_of``), shape as forward.

    Every record: ``time_ms`` = the node's ``fw_latency_ms`` or ``bw_latency_ms``; ``dtype`` the
    node's (fp32 in NeuSight's data); ``device`` the descriptor of :func:`neusight_devices`;
    ``source`` ``'neusight_graphs'``; p10/p90 null, ``repeats`` 0, ``timer``/``host`` ``'unknown'``,
    ``backend`` ``'cuda'``; ``params`` names the node (``neusight_graph_node``, ``neusight_target``).
    The extra columns (:data:`GRAPH_OP_EXTRA_COLUMNS`) say which run and node a record comes from.

    Not mapped, each counted in ``unmapped`` with its reason: graph inputs, parameters and the
    output; nodes without a kernel (views, shape queries, Python scalars — NeuSight still times
    them, ~0.01 ms each — dropout in inference runs, and ``contiguous()`` of a tensor that is not
    a strided view, which returns it as is); casts to the same dtype; integer/bool outputs (no
    learnedperf dtype); tensor creation and other calls with no kind (``torch.ones``, ``torch.full``, ``torch.arange``...);
    a direction whose latency is 0 (``bwd`` of a node autograd does not differentiate, e.g. the
    attention-mask arithmetic); and the parameter-gradient accumulation ``acc_latency_ms``, which
    belongs to no node's kernel.

    Raises:
        InputError: ``modes`` names an unknown mode, a column is missing, or a device is not in
            ``neusight_devices.csv``.
    """
    import pandas as pd

    from ..units import dtype_bytes
    from .records import OP_COLUMNS

    bad = sorted(set(modes) - {"train", "inf"})
    if bad:
        raise InputError(f"modes: unknown mode(s) {bad}; known: inf, train")
    missing = [c for c in GRAPH_NODE_COLUMNS if c not in nodes.columns]
    if missing:
        raise InputError(f"graph nodes: missing column(s) {missing} (expected load_neusight_graph_nodes output)")
    descs = neusight_devices(data_dir)
    unknown = sorted(set(nodes["device"]) - set(descs))
    if unknown:
        raise InputError(f"graph nodes: device(s) {unknown} are not in neusight_devices.csv")
    dev_json = {k: canonical_json(v) for k, v in descs.items()}
    graph_of = nodes["run"] + "|" + nodes["device"]
    dtype_of = dict(zip(zip(graph_of, nodes["name"]), nodes["dtype"]))
    target_of = dict(zip(zip(graph_of, nodes["name"]), nodes["target_op"]))

    def key_of(node):
        """(graph, name of the node's first input): where the node's main operand comes from."""
        return (node.run + "|" + node.device, node.inputs[0]) if node.inputs else None

    records, lost = [], {}

    def count(node, reason: str, fw: float, bw: float, acc: float) -> None:
        key = (node.device, node.run, node.target_op, reason)
        c = lost.setdefault(key, [0, 0.0, 0.0, 0.0])
        c[0] += 1
        c[1] += fw
        c[2] += bw
        c[3] += acc

    for node in nodes[nodes["mode"].isin(list(modes))].itertuples(index=False):
        fw, bw, acc = node.fw_latency_ms, node.bw_latency_ms, node.acc_latency_ms
        t = node.target_op
        if node.node_op in ("placeholder", "get_attr", "output"):
            count(node, "graph input, parameter or output (no kernel)", fw, bw, acc)
            continue
        if node.dtype is None or t in _GRAPH_NO_KERNEL:
            count(node, "no kernel (view, shape query or Python value)", fw, bw, acc)
            continue
        if t == ".contiguous" and target_of.get(key_of(node)) not in _GRAPH_STRIDED_VIEWS:
            # contiguous() copies only a strided view; a freshly written tensor is returned as is
            count(node, "contiguous() of a contiguous tensor (no kernel)", fw, bw, acc)
            continue
        if node.mode == "inf" and t in ("Dropout", "dropout"):
            # eval-mode dropout returns its input: NeuSight times ~0.01 ms whatever the size
            count(node, "no kernel (dropout in inference is the identity)", fw, bw, acc)
            continue
        if t in _GRAPH_CASTS:
            src = dtype_of.get(key_of(node))
            if src == node.dtype:
                count(node, "cast to the same dtype (no kernel)", fw, bw, acc)
                continue
        if node.dtype not in _FLOAT_DTYPES:
            count(node, f"{node.dtype} output (no learnedperf dtype)", fw, bw, acc)
            continue
        name, fwd, why = _graph_node_op(node, dtype_bytes(node.dtype))
        if fwd is None:
            count(node, why, fw, bw, acc)
            continue
        directions = [("fwd", fw, fwd)]
        if node.mode == "train":
            directions.append(("bwd", bw, _backward_total(fwd)))
        for direction, time_ms, op in directions:
            if time_ms <= 0:
                count(node, f"{direction} not timed ({direction[:2]}_latency 0)", 0.0, 0.0, 0.0)
                continue
            records.append({
                "op": name, "kind": op.kind, "direction": direction, "shape": canonical_json(list(op.shape)),
                "params": canonical_json({"neusight_graph_node": node.name, "neusight_target": t}),
                "dtype": node.dtype, "flops": float(op.flops), "bytes": float(op.bytes), "world_size": 1,
                "time_ms": float(time_ms), "time_p10_ms": float("nan"), "time_p90_ms": float("nan"),
                "repeats": 0, "warmup": 0, "timer": "unknown", "device_name": descs[node.device]["name"],
                "device": dev_json[node.device], "backend": "cuda", "threads": 0, "host": "unknown",
                "source": "neusight_graphs", "measured_at": None,
                "run": node.run, "model": node.model, "mode": node.mode, "seq": node.seq, "batch": node.batch,
                "node_index": node.node_index, "node_name": node.name, "target_op": t, "in_layer": node.in_layer})
        if acc > 0:
            count(node, "parameter-gradient accumulation (acc_latency, no op record)", 0.0, 0.0, acc)
    ops = pd.DataFrame(records, columns=list(OP_COLUMNS) + list(GRAPH_OP_EXTRA_COLUMNS))
    unmapped = pd.DataFrame([(*k, *v) for k, v in lost.items()],
                            columns=["device", "run", "target_op", "reason", "nodes", "fw_latency_ms",
                                     "bw_latency_ms", "acc_latency_ms"])
    return GraphOps(ops, unmapped)
