"""Loaders that map the public measurements in ``shared/data`` to runs.

* vTrain (VIA-Research/vTrain, MIT): 1,440 measured Megatron-DeepSpeed GPT
  iterations on one node of 2-8 A100s (``vtrain/ground_truth_single_node.csv``).
* Megatron-LM SC21 Table 1 (Narayanan et al. 2021): 10 GPT runs on 32-3072
  A100-80GB of Selene (``published/megatron_sc21_table1.csv``).

Settings the files do not state come from the sources' own descriptions and
are written into each run (see the constants below and ``shared/data/README.md``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

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
