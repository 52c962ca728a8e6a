"""Amend measured step records written before the run format could say what they ran.

Each amendment changes the ``run`` of some step records (and recomputes their ``run_id``, the
hash of the run), leaves every measured value as it is, rewrites the parquet file, updates the
manifest's checksums and records itself (date, command, rows changed) under ``amendments``.
Running one again changes nothing.

* ``autocast`` — ``learnedperf measure`` runs bf16 steps as the fp32 model under
  ``torch.autocast`` (:mod:`learnedperf.measure.steps`); records written before
  ``strategy.mixed_precision`` existed describe them as plain ``"precision": "bf16"``, which the
  simulator reads as Megatron-style bf16 weights with fp32 master copies. Adds
  ``"mixed_precision": "autocast"`` to every bf16 step.
* ``busbw`` — records written before ``hardware.collective_busbw_ratio`` existed carry the
  all-reduce fit of their ranks' links only, which the cost model then applies to every
  collective. Fits each collective's bus bandwidth ratio to all-reduce on the same collection's
  collective records (:func:`learnedperf.measure.bench.fit_busbw_ratios`, as ``learnedperf
  measure`` now does), stores it next to the links in the manifest and adds it to the hardware
  of every multi-process step of that collection.
* ``fsdp`` — ``learnedperf measure`` runs ZeRO-2 as FSDP2 ``fully_shard(reshard_after_forward=False)``
  (per-layer gathers and reduce-scatters); records written before ``strategy.fsdp`` could say
  SHARD_GRAD_OP describe them as ``zero_stage: 2`` alone, which the simulator reads as DeepSpeed's
  bucketed ZeRO-2. Sets ``fsdp: true`` on those steps and their ``strategy_kind`` to ``'fsdp'``.
* ``moe_loop`` — ``learnedperf measure`` runs a dropless mixture of experts one expert at a time
  (``MoEFeedForward._dropless``: every expert's gather, MLP and scatter-add launched once per expert);
  records written before ``strategy.moe_grouped_gemm`` existed read as the default, one grouped kernel per
  expert operation. Adds ``"moe_grouped_gemm": false`` to every dropless MoE step (no
  ``moe_capacity_factor``); padded steps run batched GEMMs and keep the default.
* ``eager`` — ``learnedperf measure`` runs its models in eager PyTorch (``measure.models``: RoPE as
  ``x·cos + rotate_half(x)·sin``, SwiGLU as ``silu(gate) * up``, one kernel per tensor operation); records
  written before ``strategy.fused_elementwise`` existed read as the default, fused kernels. Adds
  ``"fused_elementwise": false`` to every step that does not state it.
* ``checkpoint`` — ``learnedperf measure`` recomputes a layer with ``torch.utils.checkpoint(use_reentrant=False)``;
  records written before ``strategy.checkpoint_impl`` existed read as the default, the reentrant checkpoint
  (Megatron-LM's). Adds ``"checkpoint_impl": "non_reentrant"`` to every step with recomputation that does not
  state it.

* ``optimizer`` — ``learnedperf measure`` builds its optimizers with torch.optim's default implementation (foreach
  over CUDA tensors, a for-loop over CPU ones) and ends every step with ``zero_grad(set_to_none=True)``; records
  written before ``strategy.optimizer_impl`` and ``strategy.persistent_grads`` existed read as the defaults, a fused
  optimizer and gradient buffers kept across steps. Adds ``"optimizer_impl"`` (``"foreach"`` where the data set's
  collections ran on CUDA, ``"for_loop"`` on a CPU) and ``"persistent_grads": false`` to every step with an optimizer
  that states neither.

* ``capability`` — the catalog's devices gained ``compute_capability`` (NVIDIA's CUDA compute capability, which
  sizes PyTorch's cuBLAS workspaces); step records written before carry their device's data sheet without it.
  Adds the catalog entry's value to every step whose device is named after a catalog entry that has one.

Usage: ``python experiments/amend_records.py {autocast,busbw,fsdp,moe_loop,eager,checkpoint,optimizer,capability}
DATASET_DIR ...``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def amend_steps(directory: Path, change: Callable[[dict], None], command: str, what: str,
                manifest: dict | None = None, kind: Callable[[dict, str], str] | None = None) -> int:
    """Apply ``change`` (edits a run dict in place; a run whose id stays the same is unchanged) to the run of every
    step record of ``directory`` through :func:`learnedperf.measure.records.amend_steps`, which rewrites
    the changed files and the manifest (``manifest``: an already edited manifest to write, default the
    verified one on disk; ``kind``: the new ``strategy_kind`` of a run and its old one); an amendment that
    changes nothing writes nothing. Returns the rows changed."""
    from learnedperf.measure.records import amend_steps as amend, verify_manifest

    def transform(run: dict) -> dict:
        change(run)
        return run

    n = amend(directory, transform, command=command, what=what, manifest=manifest, record_unchanged=False,
              kind=kind)
    if n:
        verify_manifest(directory)
    return n


def mark_autocast(run: dict) -> None:
    """Add ``mixed_precision: autocast`` to a bf16 step that does not say how it ran."""
    s = run.get("strategy", {})
    if s.get("precision") == "bf16" and "mixed_precision" not in s:
        s["mixed_precision"] = "autocast"


def amend_autocast(directory: Path, command: str) -> int:
    """The ``autocast`` amendment of ``directory``."""
    return amend_steps(directory, mark_autocast, command,
                       "bf16 steps ran under torch.autocast: added strategy.mixed_precision = 'autocast' to "
                       "their run and recomputed run_id; measured values unchanged")


def amend_busbw(directory: Path, command: str) -> int:
    """The ``busbw`` amendment of ``directory`` (see the module docstring)."""
    import pandas as pd

    from learnedperf.measure.bench import fit_busbw_ratios
    from learnedperf.measure.records import verify_manifest

    manifest = verify_manifest(directory)
    comm = [r for f in sorted(directory.glob("ops*.parquet")) for r in pd.read_parquet(f).to_dict("records")
            if r["direction"] == "comm"]
    # the link figures of each world size, as the steps carry them: (bandwidth, latency) -> ratios
    by_link: dict[tuple, dict] = {}
    for c in manifest.get("collections", []):
        for w, link in c.get("links", {}).items():
            device = c["devices"][f"{w}x{c['threads']}"]["name"]  # w processes of the collection's threads
            recs = [r for r in comm if int(r["world_size"]) == int(w) and r["device_name"] == device]
            ratios = fit_busbw_ratios(recs, link, int(w))
            if ratios:
                link["collective_busbw_ratio"] = ratios
                by_link[(link["intra_node_bandwidth_GBps"], link["intra_node_latency_us"])] = ratios
                print(f"{directory.name}: {w} processes ({device}): {ratios}")

    def add_ratios(run: dict) -> None:
        hw = run.get("hardware", {})
        ratios = by_link.get((hw.get("intra_node_bandwidth_GBps"), hw.get("intra_node_latency_us")))
        if hw.get("num_devices", 1) > 1 and ratios and "collective_busbw_ratio" not in hw:
            hw["collective_busbw_ratio"] = ratios

    return amend_steps(directory, add_ratios, command,
                       "multi-process steps: added hardware.collective_busbw_ratio, fitted on the collection's "
                       "collective records by learnedperf.measure.bench.fit_busbw_ratios (also stored with the "
                       "links), and recomputed run_id; measured values unchanged", manifest)


def mark_fsdp(run: dict) -> None:
    """Add ``fsdp: true`` to a ZeRO-2 step that does not say it ran on FSDP."""
    s = run.get("strategy", {})
    if s.get("zero_stage") == 2 and not s.get("fsdp"):
        s["fsdp"] = True


def amend_fsdp(directory: Path, command: str) -> int:
    """The ``fsdp`` amendment of ``directory`` (see the module docstring)."""
    return amend_steps(directory, mark_fsdp, command,
                       "ZeRO-2 steps ran on FSDP2 (SHARD_GRAD_OP): added strategy.fsdp = true to their run, "
                       "set strategy_kind to 'fsdp' and recomputed run_id; measured values unchanged",
                       kind=lambda run, old: "fsdp" if run["strategy"].get("fsdp") else old)


def mark_moe_loop(run: dict) -> None:
    """Add ``moe_grouped_gemm: false`` to a dropless MoE step that does not say how its experts ran."""
    s = run.get("strategy", {})
    if run.get("model", {}).get("arch") == "moe" and s.get("moe_capacity_factor") is None \
            and "moe_grouped_gemm" not in s:
        s["moe_grouped_gemm"] = False


def amend_moe_loop(directory: Path, command: str) -> int:
    """The ``moe_loop`` amendment of ``directory`` (see the module docstring)."""
    return amend_steps(directory, mark_moe_loop, command,
                       "dropless MoE steps ran their experts one at a time (MoEFeedForward._dropless): added "
                       "strategy.moe_grouped_gemm = false to their run and recomputed run_id; measured values "
                       "unchanged")


def mark_eager(run: dict) -> None:
    """Add ``fused_elementwise: false`` to a step that does not say how its element-wise chains ran."""
    s = run.setdefault("strategy", {})
    if "fused_elementwise" not in s:
        s["fused_elementwise"] = False


def amend_eager(directory: Path, command: str) -> int:
    """The ``eager`` amendment of ``directory`` (see the module docstring)."""
    return amend_steps(directory, mark_eager, command,
                       "steps ran in eager PyTorch (learnedperf.measure.models: RoPE and SwiGLU one kernel per "
                       "tensor operation): added strategy.fused_elementwise = false to their run and recomputed "
                       "run_id; measured values unchanged")


def mark_checkpoint(run: dict) -> None:
    """Add ``checkpoint_impl: 'non_reentrant'`` to a step with recomputation that does not say how it recomputed."""
    s = run.setdefault("strategy", {})
    if s.get("recompute", "none") != "none" and "checkpoint_impl" not in s:
        s["checkpoint_impl"] = "non_reentrant"


def amend_checkpoint(directory: Path, command: str) -> int:
    """The ``checkpoint`` amendment of ``directory`` (see the module docstring)."""
    return amend_steps(directory, mark_checkpoint, command,
                       "steps recomputed with torch.utils.checkpoint(use_reentrant=False) "
                       "(learnedperf.measure.models): added strategy.checkpoint_impl = 'non_reentrant' to the runs "
                       "with recomputation and recomputed run_id; measured values unchanged")


def optimizer_marker(impl: str) -> Callable[[dict], None]:
    """A change that adds ``optimizer_impl: impl`` and ``persistent_grads: false`` to a step with an optimizer
    that states neither."""
    def mark(run: dict) -> None:
        s = run.setdefault("strategy", {})
        if s.get("optimizer", "adam") != "none" and "optimizer_impl" not in s and "persistent_grads" not in s:
            s["optimizer_impl"] = impl
            s["persistent_grads"] = False

    return mark


def amend_optimizer(directory: Path, command: str) -> int:
    """The ``optimizer`` amendment of ``directory`` (see the module docstring): the implementation torch.optim
    chose on the device its collections ran on (the manifest's ``collections[].device``)."""
    from learnedperf.errors import InputError
    from learnedperf.measure.records import verify_manifest

    devices = {c.get("device") for c in verify_manifest(directory).get("collections", [])}
    if len(devices) != 1 or not devices <= {"cuda", "cpu"}:
        raise InputError(f"{directory}: manifest.json collections ran on {sorted(map(str, devices))}; the optimizer "
                         "amendment needs one device kind, 'cuda' or 'cpu'")
    impl = "foreach" if devices == {"cuda"} else "for_loop"
    return amend_steps(directory, optimizer_marker(impl), command,
                       f"steps ran torch.optim's default implementation on {devices.pop()} ({impl}) and set their "
                       "gradients to None after each step (zero_grad(set_to_none=True)): added strategy."
                       f"optimizer_impl = '{impl}' and strategy.persistent_grads = false to the runs with an "
                       "optimizer and recomputed run_id; measured values unchanged")


def mark_capability(run: dict) -> None:
    """Add the catalog entry's ``compute_capability`` to a step's inline device named after it that has none."""
    from learnedperf.catalog import get_device
    from learnedperf.errors import CatalogError

    device = run.get("hardware", {}).get("device")
    if not isinstance(device, dict) or "compute_capability" in device:
        return
    try:
        capability = get_device(str(device.get("name", ""))).get("compute_capability")
    except CatalogError:
        return
    if capability is not None:
        device["compute_capability"] = capability


def amend_capability(directory: Path, command: str) -> int:
    """The ``capability`` amendment of ``directory`` (see the module docstring)."""
    return amend_steps(directory, mark_capability, command,
                       "the catalog's devices gained compute_capability (it sizes PyTorch's cuBLAS workspaces): added "
                       "the catalog entry's value to each step's device and recomputed run_id; measured values "
                       "unchanged")


AMENDMENTS = {"autocast": amend_autocast, "busbw": amend_busbw, "fsdp": amend_fsdp, "moe_loop": amend_moe_loop,
              "eager": amend_eager, "checkpoint": amend_checkpoint, "optimizer": amend_optimizer,
              "capability": amend_capability}


def main(argv: list[str]) -> int:
    """Apply one amendment to every directory named on the command line."""
    from learnedperf.errors import LearnedPerfError

    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    if len(argv) < 2 or argv[0] not in AMENDMENTS:
        print(__doc__[__doc__.index("Usage:"):].strip(), file=sys.stderr)
        return 2
    for d in argv[1:]:
        if not Path(d).is_dir():
            print(f"{d}: not a data set directory", file=sys.stderr)
            return 2
        try:
            n = AMENDMENTS[argv[0]](Path(d), f"python experiments/amend_records.py {argv[0]} {Path(d).as_posix()}")
        except LearnedPerfError as exc:
            print(f"amend_records: error: {exc}", file=sys.stderr)
            return 1
        print(f"{d}: {n} rows changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
