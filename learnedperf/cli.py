"""The ``learnedperf`` command line.

Commands:

* ``learnedperf simulate`` — run the discrete-event simulator on one run or a batch;
* ``learnedperf predict`` — the same arguments, answered by a learned checkpoint
  (default ``checkpoints/default``; ``source`` names the checkpoint, its method and the
  tier: ``--tier fast``, the default, or ``--tier full``);
* ``learnedperf search`` — enumerate the valid strategies of a model on a cluster and print
  the fastest that fit in memory;
* ``learnedperf serve`` — the HTTP service (127.0.0.1 by default);
* ``learnedperf train`` — fit a method on a data set and write a checkpoint;
* ``learnedperf evaluate`` — compare the methods on the held-out splits of a data set;
* ``learnedperf measure`` — measure this machine (operators, collectives, training steps);
* ``learnedperf ingest`` — run logs, profiler traces and public data → records;
* ``learnedperf generate`` — sample, simulate and store a versioned data set of runs;
* ``learnedperf catalog [devices|clusters|models]`` — list the catalog names.

One run comes from ``--run FILE.json`` or from flags (``--model``, ``--cluster``,
``--num-devices``, ``--tp`` ...; flags override the fields of ``--run``). A batch
comes from ``--input FILE`` (JSON Lines, ``-`` for stdin): every input line gives
exactly one output line, in order, and a bad line gives ``{"error": "line N: ...",
"line": N}`` without stopping the batch.

Exit status: 0 when every run was predicted, 1 when any failed, 2 on a usage
error (bad flags, unreadable input file). Bad input never prints a traceback.

Importing this module loads nothing heavy: specs, the simulator and the models
are imported by the commands that use them.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
from typing import Any, Callable, Optional, TextIO

from . import __version__
from .errors import InputError, LearnedPerfError
from .io import dumps_line, open_input, open_output, read_records
from .predict import error_text as _error_text

SIMULATOR_SOURCE = "simulator"
"""``source`` of ``learnedperf simulate`` answers."""


_PROGRESS_EVERY = 1000
#: Lines a batch answers at once: large enough for the fast tier's vectorised path, small enough
#: that output streams and memory stays bounded on endless input.
_CHUNK_LINES = 2048

# flag dest -> key of the run format's "strategy" object
_STRATEGY_FLAGS = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep",
    "micro_batch_size": "micro_batch_size", "global_batch_size": "global_batch_size",
    "schedule": "pipeline_schedule", "virtual_stages": "virtual_pipeline_stages",
    "zero": "zero_stage", "fsdp": "fsdp", "dp_replicate": "dp_replicate", "recompute": "recompute",
    "sequence_parallel": "sequence_parallel", "precision": "precision",
    "mixed_precision": "mixed_precision", "flash_attention": "flash_attention", "optimizer": "optimizer",
    "forward_only": "forward_only", "moe_dispatcher": "moe_dispatcher", "overlap_moe_comm": "overlap_moe_comm",
    "moe_capacity_factor": "moe_capacity_factor", "moe_grouped_gemm": "moe_grouped_gemm",
    "fused_elementwise": "fused_elementwise", "checkpoint_impl": "checkpoint_impl",
    "optimizer_impl": "optimizer_impl", "persistent_grads": "persistent_grads",
}
# the run format's specs.strategy.PIPELINE_SCHEDULES, spelled out: the specs import pydantic, which this module
# leaves to the commands that build runs (tests/test_zb_v.py checks that the two agree)
_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "interleaved-zb")
# flag dest -> key of the run format's "hardware" object
_HARDWARE_FLAGS = {"device": "device", "cluster": "cluster", "num_devices": "num_devices",
                   "devices_per_node": "devices_per_node"}
_MODEL_FLAGS = ("model", "seq_length")
_RUN_FLAGS = (*_MODEL_FLAGS, *_HARDWARE_FLAGS, *_STRATEGY_FLAGS)


class UsageError(Exception):
    """Wrong use of the command line: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and never exit the process."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise :class:`UsageError` instead of printing the usage and exiting."""
        raise UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


# ---------------------------------------------------------------- parser
def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum``, or one message naming the value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _add_placement_arguments(g: Any) -> None:
    """The model and hardware flags (``_MODEL_FLAGS`` and ``_HARDWARE_FLAGS``) on parser or group ``g``."""
    g.add_argument("--model", metavar="NAME", help="catalog model (see 'learnedperf catalog models')")
    g.add_argument("--seq-length", type=_positive_int, metavar="N", help="override the model's sequence length")
    g.add_argument("--device", metavar="NAME", help="catalog device (default: the cluster's)")
    g.add_argument("--cluster", metavar="NAME", help="catalog cluster, e.g. dgx-a100")
    g.add_argument("--num-devices", type=_positive_int, metavar="N")
    g.add_argument("--devices-per-node", type=_positive_int, metavar="N")


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments shared by ``simulate`` and ``predict``."""
    files = p.add_argument_group("input and output")
    files.add_argument("--input", "-i", metavar="FILE",
                    help="batch of runs: JSON Lines, one run per line ('-' = stdin); "
                         "a file holding one (pretty-printed) JSON object is one run")
    files.add_argument("--output", "-o", metavar="FILE", default="-",
                    help="where predictions go (default '-' = stdout)")
    files.add_argument("--run", metavar="FILE.json", help="one run from a JSON file (flags override its fields)")
    files.add_argument("--format", choices=("json", "table"),
                    help="'table' (default for one run written to stdout) or 'json' "
                         "(default for --input and --output FILE)")
    files.add_argument("--trace", metavar="FILE",
                    help="write the Chrome/Perfetto trace (JSON) of the run's iteration (one run only)")

    m = p.add_argument_group("one run from flags")
    _add_placement_arguments(m)
    for flag, what in (("tp", "tensor"), ("pp", "pipeline"), ("dp", "data (default: derived)"),
                       ("cp", "context"), ("ep", "expert")):
        m.add_argument(f"--{flag}", type=_positive_int, metavar="N", help=f"{what}-parallel size")
    m.add_argument("--micro-batch-size", type=_positive_int, metavar="N")
    m.add_argument("--global-batch-size", type=_positive_int, metavar="N")
    m.add_argument("--schedule", choices=_SCHEDULES,
                   help="pipeline schedule (zero bubble: the backward split into input and weight gradients, "
                        "pp >= 2; zb-h1 one model chunk per rank, zb-v two in a V, with --virtual-stages 2, "
                        "interleaved-zb the interleaved placement of --virtual-stages N >= 2)")
    m.add_argument("--virtual-stages", type=_positive_int, metavar="N",
                   help="model chunks per pipeline rank (interleaved and interleaved-zb; 2 for zb-v)")
    m.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage")
    m.add_argument("--fsdp", action="store_const", const=True,
                   help="PyTorch FSDP: full sharding, or SHARD_GRAD_OP with --zero 2")
    m.add_argument("--dp-replicate", type=_positive_int, metavar="N",
                   help="hybrid sharding (HSDP): N copies of the ZeRO/FSDP states, each sharded over dp·cp/N ranks")
    m.add_argument("--recompute", choices=("none", "selective", "full"), help="activation recomputation")
    m.add_argument("--checkpoint-impl", choices=("reentrant", "non_reentrant"),
                   help="how recomputation runs: reentrant (default: Megatron-LM, use_reentrant=True) or "
                        "non_reentrant (torch.utils.checkpoint with use_reentrant=False: more host work)")
    m.add_argument("--sequence-parallel", action="store_const", const=True)
    m.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16", "fp8"))
    m.add_argument("--mixed-precision", choices=("master_weights", "autocast"),
                   help="bf16/fp16 weights with fp32 master copies (default, Megatron/DeepSpeed) or fp32 "
                        "weights cast at every GEMM (torch.autocast)")
    m.add_argument("--no-flash-attention", dest="flash_attention", action="store_const", const=False,
                   help="unfused attention (the s x s scores are materialised)")
    m.add_argument("--optimizer", choices=("adam", "sgd", "none"),
                   help="optimizer step of the iteration (default adam; none: forward and backward only)")
    m.add_argument("--optimizer-impl", choices=("fused", "foreach", "for_loop"),
                   help="how the optimizer step runs: fused (default: Megatron's and DeepSpeed's FusedAdam), "
                        "foreach (torch.optim's default on GPUs) or for_loop (torch.optim's default on CPUs)")
    m.add_argument("--no-persistent-grads", dest="persistent_grads", action="store_const", const=False,
                   help="gradients freed after each optimizer step, as torch's zero_grad(set_to_none=True) "
                        "does; default: kept in buffers across iterations (Megatron, DeepSpeed)")
    m.add_argument("--forward-only", action="store_const", const=True,
                   help="forward passes only (inference or evaluation step); implies --optimizer none")
    m.add_argument("--moe-dispatcher", choices=("alltoall", "deepep"),
                   help="expert token dispatch: every copy to its expert's rank (alltoall, default) or once per "
                        "rank and, across nodes, once per node (deepep)")
    m.add_argument("--overlap-moe-comm", action="store_const", const=True,
                   help="expert all-to-alls run beside another micro-batch's computation (DualPipe, Megatron-Core's "
                        "overlap_moe_expert_parallel_comm)")
    m.add_argument("--moe-capacity-factor", type=float, metavar="F",
                   help="expert capacity factor: each expert processes F times its balanced share of tokens, "
                        "padded (Megatron-Core's moe_expert_capacity_factor with padding; for a dropless router, "
                        "its max/mean expert load)")
    m.add_argument("--eager", dest="fused_elementwise", action="store_const", const=False,
                   help="eager PyTorch: RoPE, SwiGLU, gelu_new and (without flash attention) attention's "
                        "scaling, mask and softmax one kernel per tensor operation (Hugging Face Transformers, "
                        "learnedperf measure); default: one fused kernel each (Megatron-Core)")
    m.add_argument("--no-moe-grouped-gemm", dest="moe_grouped_gemm", action="store_const", const=False,
                   help="experts run one at a time, each expert operation launched once per local expert "
                        "(Megatron-Core's SequentialMLP, Hugging Face's expert loops); default: grouped GEMMs")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``learnedperf`` (errors raise :class:`UsageError`)."""
    parser = _Parser(prog="learnedperf",
                     description="Predict iteration time, throughput and memory of distributed "
                                 "deep-learning training before it runs.")
    parser.add_argument("--version", action="version", version=f"learnedperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for name, handler, text in (
        ("simulate", _cmd_simulate, "simulate runs with the discrete-event simulator"),
        ("predict", _cmd_predict, "predict runs with the best available model"),
    ):
        p = sub.add_parser(name, help=text, description=text + ". Give --input, --run or flags for one run.")
        _add_run_arguments(p)
        if name == "predict":
            p.add_argument("--checkpoint", metavar="DIR",
                           help="checkpoint directory (default: checkpoints/default of the repository)")
            p.add_argument("--tier", choices=("fast", "full"),
                           help="fast: the checkpoint's surrogate (default); full: the simulator and the learned "
                                "model (default with --trace)")
        p.set_defaults(handler=handler)

    p = sub.add_parser("search", help="rank the valid strategies of a model on a cluster",
                       description="Enumerate every valid strategy (tp, pp, dp, cp, ep, micro-batch, schedule, "
                                   "recompute, ZeRO, sequence parallelism) of a model on a cluster, keep those "
                                   "that fit in memory, screen them with the fast tier, re-score the best with the "
                                   "full tier and print them ranked with intervals.")
    m = p.add_argument_group("what to place")
    _add_placement_arguments(m)
    m.add_argument("--run", metavar="FILE.json", help="model and hardware from a run file (its strategy is ignored)")
    c = p.add_argument_group("constraints")
    c.add_argument("--global-batch-size", type=_positive_int, metavar="N", help="sequences per iteration (required)")
    c.add_argument("--constraints", metavar="JSON", help="more constraints as a JSON object, e.g. "
                                                          "'{\"max_tp\": 8, \"recompute\": [\"none\"]}'")
    c.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16", "fp8"), help="default bf16")
    o = p.add_argument_group("output")
    o.add_argument("--top", type=_positive_int, default=10, metavar="N", help="strategies to print (default 10)")
    o.add_argument("--format", choices=("table", "json"), default="table")
    o.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (default: checkpoints/default)")
    p.set_defaults(handler=_cmd_search)

    p = sub.add_parser("serve", help="serve predictions over HTTP (FastAPI)",
                       description="Serve /predict, /predict/batch, /search and /health over HTTP with the "
                                   "checkpoint; the OpenAPI schema is at /openapi.json.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (default: checkpoints/default)")
    p.add_argument("--max-batch", type=_positive_int, default=10000, metavar="N", help="runs per batch request")
    p.add_argument("--max-body-bytes", type=_positive_int, default=8 * 1024 * 1024, metavar="N",
                   help="largest request body (default 8 MiB)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (the service has no authentication)")
    p.set_defaults(handler=_cmd_serve)

    p = sub.add_parser("train", help="fit a method on a data set and write a checkpoint",
                       description="Fit one method (or the one an evaluation report favours) on every usable run "
                                   "of a data set written by 'learnedperf generate', calibrate its 90 % interval "
                                   "on measured runs it did not fit on, and write a verified checkpoint.")
    p.add_argument("--data", required=True, metavar="DIR", help="data set directory (learnedperf generate)")
    p.add_argument("--out", required=True, metavar="DIR", help="checkpoint directory to write")
    p.add_argument("--method", default="auto", metavar="NAME",
                   help="method to ship, or 'auto': the lowest mean MAPE over the unseen criteria (device, scale, "
                        "family, strategy) of --evaluation; of methods within one standard error of their "
                        "split differences of it, the lowest worst split")
    p.add_argument("--evaluation", metavar="REPORT.json", help="report of 'learnedperf evaluate': picks --method auto, "
                                                                "calibrates intervals of novel runs, and its tables "
                                                                "are copied into the manifest")
    p.add_argument("--surrogate-runs", type=_non_negative_int, default=20000, metavar="N",
                   help="sampled runs labelled by the trained model to distil the fast tier's surrogate "
                        "(default 20000; 0: no surrogate, the checkpoint answers tier 'full' only)")
    p.add_argument("--surrogate-near-runs", type=_non_negative_int, default=5000, metavar="N",
                   help="runs near the data set's measured runs (their model and hardware, strategies of their "
                        "own) also labelled for the surrogate, so that fast answers follow the full tier on the "
                        "hardware it was trained on (default 5000; 0: none)")
    _add_model_arguments(p)
    p.set_defaults(handler=_cmd_train)

    p = sub.add_parser("evaluate", help="compare the methods on held-out splits of a data set",
                       description="Train every method on the training side of each held-out split and score it on "
                                   "the measured test runs: MAPE, Kendall tau and top-1 regret over strategies, "
                                   "coverage of the 90 % interval.")
    p.add_argument("--data", required=True, metavar="DIR", help="data set directory (learnedperf generate)")
    p.add_argument("--out", metavar="REPORT.json", help="write the full report (with every prediction) here")
    p.add_argument("--methods", metavar="LIST", help="comma-separated methods (default: all)")
    p.add_argument("--splits", metavar="LIST", help="comma-separated splits (default: all)")
    p.add_argument("--device-kernels", type=_non_negative_int, default=0, metavar="K",
                   help="a GPU split's held-out device keeps K of its own operator records (drawn with --seed) in "
                        "the operator regressor's training: how its runs are predicted once K of its kernels are "
                        "measured (default 0: the device unseen)")
    _add_model_arguments(p)
    p.set_defaults(handler=_cmd_evaluate)

    p = sub.add_parser("measure", help="measure this machine: operators, collectives, training steps",
                       description="Measure the local device (CPU, or CUDA when asked) with the project's own "
                                   "benchmarks and store the records as a data set with a manifest.")
    p.add_argument("--quick", action="store_true", help="small grids: a smoke test under a minute")
    p.add_argument("--out", metavar="DIR", help="data set directory (default datasets/measured/<host>, or "
                                                "datasets/measured-quick/<host> with --quick)")
    p.add_argument("--host", metavar="NAME", help="name of this machine in the default directory (default: hostname)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=_positive_int, default=1, metavar="N", help="torch threads per process")
    p.add_argument("--parts", default="collectives,ops,steps", metavar="LIST",
                   help="comma-separated parts to measure: collectives, ops, steps (default: all)")
    p.add_argument("--device-spec", metavar="NAME|FILE.json",
                   help="with --device cuda: the data sheet the records describe the GPU by, as a prediction for it "
                        "is asked (a catalog device, or a DeviceSpec JSON file); default: the catalog entry of the "
                        "name the driver reports")
    p.add_argument("--time-budget-s", type=_positive_int, metavar="S",
                   help="start no operator case or step after S seconds; those not run are listed in the manifest")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.set_defaults(handler=_cmd_measure)

    p = sub.add_parser("ingest", help="turn measured runs and profiler traces into records",
                       description="Read run logs (CSV, Parquet, JSON Lines; schema in docs/ingest.md), PyTorch "
                                   "profiler Chrome traces, published-runs tables (the layout of "
                                   "shared/data/published/*.csv) or a public data set, validate every row and "
                                   "write step / operator records with a manifest. A bad row is reported with its "
                                   "file, line and field.")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="run logs (.csv .parquet .jsonl .json), traces or published-runs tables (.csv)")
    p.add_argument("--out", required=True, metavar="DIR", help="data set directory to write")
    p.add_argument("--kind", choices=("auto", "runs", "trace", "published"), default="auto",
                   help="what the files are (auto: a JSON object with traceEvents is a trace, a CSV with "
                        "gpu_type and num_gpus columns a published-runs table)")
    p.add_argument("--public", action="append", default=[], metavar="NAME",
                   choices=("vtrain", "neusight-ops", "neusight-steps"),
                   help="also ingest a public data set from ../shared/data (repeatable)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="write the valid rows and report every bad one (default: a bad row rejects its file)")
    p.add_argument("--ignore-columns", default="", metavar="LIST",
                   help="comma-separated extra columns of the run logs to ignore on purpose")
    p.add_argument("--device", metavar="NAME", help="catalog device the profiled ops ran on (traces)")
    p.set_defaults(handler=_cmd_ingest)

    p = sub.add_parser("generate", help="generate a data set of simulated and measured runs",
                       description="Sample valid runs (model x hardware x strategy), simulate them, join every "
                                   "measured run available, and store one versioned data set (Parquet shards, "
                                   "graph store, manifest with splits). An interrupted generation resumes.")
    p.add_argument("--n", type=_positive_int, required=True, metavar="N", help="simulated runs to generate")
    p.add_argument("--out", required=True, metavar="DIR", help="data set directory")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0)")
    p.add_argument("--workers", type=_positive_int, metavar="K", help="local processes (default: CPU count)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address (tcp://host:port)")
    p.add_argument("--keep-oom", action="store_true",
                   help="keep runs that do not fit in memory (fits_in_memory=false) instead of skipping them")
    p.add_argument("--no-measured", dest="measured", action="store_false",
                   help="do not join the measured runs (datasets/measured, public data)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(handler=_cmd_generate)

    p = sub.add_parser("catalog", help="list catalog names", description="List the names in the catalog.")
    p.add_argument("kind", nargs="?", choices=("devices", "clusters", "models"),
                   help="one kind (default: all three)")
    p.set_defaults(handler=_cmd_catalog)
    return parser


# ---------------------------------------------------------------- building one run
def _given(args: argparse.Namespace, names) -> dict[str, Any]:
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments shared by ``train`` and ``evaluate``."""
    p.add_argument("--gnn", action="append", default=[], metavar="KEY=VALUE",
                   help="GNN hyperparameter (repeatable), e.g. --gnn pretrain_epochs=5 --gnn hidden=32; "
                        "--gnn ensemble=K trains K networks from different seeds and averages their log times")
    p.add_argument("--limit-simulated", type=_positive_int, metavar="N", help="use at most N simulated runs")
    p.add_argument("--folds", type=_folds, default=0, metavar="K",
                   help="calibrate the interval cross-fitted over K folds of the measured runs' strategy groups: "
                        "the GNN is K networks, each trained without one fold, and every measured run is "
                        "calibrated on the network that did not see it (default 0: hold 20 %% of them back)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="Dask scheduler (tcp://host:port): train the operator regressor through lightgbm.dask")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress output")


#: run flags not spelled after their ``dest`` (switches that turn a default off)
_FLAG_SPELLING = {"flash_attention": "--no-flash-attention", "moe_grouped_gemm": "--no-moe-grouped-gemm",
                  "fused_elementwise": "--eager", "persistent_grads": "--no-persistent-grads"}


def _flag(dest: str) -> str:
    """The command-line spelling of a run flag's ``dest``."""
    return _FLAG_SPELLING.get(dest) or "--" + dest.replace("_", "-")


def _load_run_file(path: str, prog: str) -> dict:
    """The run (a JSON object) of a ``--run`` file of command ``prog``.

    Raises:
        UsageError: the file is missing or unreadable (one line like ``--input``'s: ``prog: error: PATH: ...``).
        InputError: the file is not JSON, or not a JSON object (the message names the path).
    """
    try:
        stream = open_input(path)
    except InputError as exc:
        raise UsageError(f"{prog}: error: {exc}") from None
    try:
        with stream:
            text = stream.read()
    except UnicodeDecodeError as exc:
        raise UsageError(f"{prog}: error: {path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise UsageError(f"{prog}: error: {path}: cannot read: {exc.strerror or exc}") from None
    try:
        # stdin ('-') is opened without io's 'utf-8-sig': a byte-order mark some editors write is dropped here
        run = json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(run, dict):
        raise InputError(f"{path}: a run must be a JSON object")
    return run


def _run_from_args(args: argparse.Namespace, prog: str) -> dict:
    """The run-format dict described by ``--run`` and/or the run flags."""
    run = _load_run_file(args.run, prog) if args.run else {}
    if not args.run:
        missing = [flag for flag, ok in (("--model", args.model),
                                         ("--cluster or --device", args.cluster or args.device),
                                         ("--num-devices", args.num_devices)) if not ok]
        if missing:
            raise UsageError(f"{prog}: error: give --input FILE, --run FILE.json, or one run with "
                             f"--model, --cluster/--device and --num-devices (missing: {', '.join(missing)})")

    if args.model is not None:
        run["model"] = args.model
    if args.seq_length is not None:
        run["model"] = _with_seq_length(run.get("model"), args.seq_length)

    for key, flags, mapping in (("hardware", _HARDWARE_FLAGS, _HARDWARE_FLAGS),
                                ("strategy", _STRATEGY_FLAGS, _STRATEGY_FLAGS)):
        given = _given(args, flags)
        if given:
            section = run.get(key)
            section = dict(section) if isinstance(section, dict) else {}
            section.update({mapping[k]: v for k, v in given.items()})
            if key == "strategy" and given.get("forward_only") and "optimizer" not in given:
                section["optimizer"] = "none"  # a forward-only step has no optimizer step: say it once
            run[key] = section
    return run


# ---------------------------------------------------------------- answering
Answer = Callable[[Any, bool], tuple[dict, Any, Any]]
Batch = Callable[[list], list]


def _tier(args: argparse.Namespace) -> str:
    """The tier of ``learnedperf predict``: --tier, else full with --trace (it needs the simulation), else fast."""
    tier = getattr(args, "tier", None)
    if tier is None:
        return "full" if getattr(args, "trace", None) else "fast"
    if tier == "fast" and getattr(args, "trace", None):
        raise UsageError("learnedperf predict: error: --trace needs --tier full (the fast tier does not simulate)")
    return tier


def _answerer(command: str, checkpoint: Optional[str] = None, tier: str = "full") -> tuple[Answer, Batch]:
    """How ``command`` answers one run — ``(prediction, RunSpec, SimResult or None)`` — and a batch
    of ``(line number, decoded item or InputError)`` pairs — ``[(output object, ok)]``.

    ``simulate`` answers with the simulator; ``predict`` with the checkpoint (default
    ``checkpoints/default``), loaded and verified once, in ``tier``.
    """
    if command == "predict":
        from .predict import Predictor

        predictor = Predictor.load(checkpoint)
        # the loaded models live as long as the process: keep the cyclic collector from re-scanning
        # them (torch's heap) on every collection while a batch decodes and answers many lines
        gc.freeze()

        def answer(run: Any, trace: bool = False) -> tuple[dict, Any, Any]:
            if tier == "full":
                pred, result = predictor.predict_with_result(run, trace)
                return pred, result.run, result
            from .specs import RunSpec

            spec = RunSpec.from_dict(run)
            return predictor.predict(spec, tier="fast"), spec, None

        def batch(items: list) -> list:
            good = [(k, item) for k, (_n, item) in enumerate(items) if not isinstance(item, InputError)]
            preds = predictor.predict_many([item for _k, item in good], tier=tier, errors="return")
            out: list = [None] * len(items)
            for (k, _item), pred in zip(good, preds):
                out[k] = pred
            return [_line_output(line_no, item, out[k]) for k, (line_no, item) in enumerate(items)]

        return answer, batch

    from .simulate import simulate
    from .specs import RunSpec

    def answer(run: Any, trace: bool = False) -> tuple[dict, Any, Any]:
        result = simulate(RunSpec.from_dict(run), trace=trace)
        return result.to_prediction(source=SIMULATOR_SOURCE), result.run, result

    def batch(items: list) -> list:
        return [_answer_line(answer, line_no, item) for line_no, item in items]

    return answer, batch


def _line_output(line_no: int, item: Any, pred: Optional[dict]) -> tuple[dict, bool]:
    """The output object of batch line ``line_no`` from predict_many's answer (errors name the line)."""
    if isinstance(item, InputError):
        return {"error": str(item), "line": line_no}, False
    if pred is None or "error" not in pred:
        return pred, True
    out: dict[str, Any] = {"error": f"line {line_no}: {pred['error']}", "line": line_no}
    if "id" in pred:
        out["id"] = pred["id"]
    return out, False


def _answer_line(answer: Answer, line_no: int, item: Any) -> tuple[dict, bool]:
    """Simulate one batch line; return ``(output object, ok)``. Never raises for bad input."""
    if isinstance(item, InputError):
        return {"error": str(item), "line": line_no}, False
    try:
        return answer(item, False)[0], True
    except Exception as exc:  # noqa: BLE001 - every failure of one line is that line's error
        from .specs.run import echoed_id

        return {"error": f"line {line_no}: {_error_text(exc)}", "line": line_no, **echoed_id(item)}, False


# ---------------------------------------------------------------- table
def _ms(value: float) -> str:
    return f"{value:,.1f} ms" if abs(value) >= 10 else f"{value:.3f} ms"


def _table(pred: dict, run: Any) -> str:
    """A readable rendering of one prediction of the RunSpec ``run`` (plain ASCII)."""
    s, hw = run.strategy, run.hardware
    where = f" ({hw.cluster})" if hw.cluster else ""
    knobs = [f"tp {s.tp}", f"pp {s.pp}", f"dp {s.dp}"]
    knobs += [f"{k} {v}" for k, v in (("cp", s.cp), ("ep", s.ep)) if v > 1]
    if s.moe_dispatcher != "alltoall":
        knobs.append(f"{s.moe_dispatcher} dispatch")
    if s.overlap_moe_comm:
        knobs.append("all-to-alls overlapped")
    if s.moe_capacity_factor is not None:
        knobs.append(f"expert capacity x{s.moe_capacity_factor:g}")
    if not s.moe_grouped_gemm:
        knobs.append("experts one at a time")
    if not s.fused_elementwise:
        knobs.append("eager element-wise kernels")
    knobs += [f"micro-batch {s.micro_batch_size}", f"global batch {s.global_batch_size}"]
    if s.pp > 1:
        knobs.append(s.pipeline_schedule + (f" x{s.virtual_pipeline_stages}" if s.virtual_pipeline_stages > 1 else ""))
    if s.effective_zero_stage:
        knobs.append(("FSDP SHARD_GRAD_OP" if s.effective_zero_stage == 2 else "FSDP") if s.fsdp
                     else f"ZeRO-{s.zero_stage}")
        if s.dp_replicate > 1:
            knobs.append(f"hybrid: {s.dp_replicate} copies of {s.shard_size} shards")
    if s.recompute != "none":
        knobs.append(f"recompute {s.recompute}" + (" (non-reentrant)" if s.checkpoint_impl == "non_reentrant"
                                                   else ""))
    if s.sequence_parallel:
        knobs.append("sequence parallel")
    if not s.flash_attention:
        knobs.append("no flash attention")
    if s.forward_only:
        knobs.append("forward only")
    else:
        if s.optimizer != "adam":
            knobs.append(f"optimizer {s.optimizer}")
        if s.optimizer_impl != "fused":
            knobs.append(f"{s.optimizer_impl} optimizer")
        if not s.persistent_grads:
            knobs.append("gradients freed each step")
    knobs.append(s.precision + (" autocast" if s.autocast else ""))

    mem = pred["peak_memory_GiB"]
    fits = "fits" if pred["fits_in_memory"] else "does NOT fit"
    rows: list[tuple[str, str]] = []
    if "id" in pred:
        rows.append(("id", str(pred["id"])))
    rows += [
        ("run", f"{run.model.name} (seq {run.model.seq_length}) on {hw.num_devices} x {hw.device.name}{where}"),
        ("strategy", ", ".join(knobs)),
        ("iteration time", _ms(pred["iteration_time_ms"])),
        ("90 % interval", " - ".join(_ms(v) for v in pred["interval_ms"])
         + (f" (widened: {', '.join(c.replace('_', ' ') for c in pred['novelty'])})" if pred.get("novelty") else "")),
        ("throughput", f"{pred['tokens_per_second']:,.0f} tokens/s, {pred['samples_per_second']:,.2f} samples/s"),
        ("TFLOP/s per device", f"{pred['tflops_per_device']:,.1f} (MFU {100 * pred['mfu']:.1f} %)"),
        ("peak memory", f"{mem:,.2f} GiB of {hw.device.memory_GiB:,.2f} GiB per device: {fits}"
         + (" (at the optimizer step)" if pred.get("peak_memory_phase") == "optimizer_step" else "")),
    ]
    rows += [(f"  {k.replace('_', ' ')}", f"{v:,.2f} GiB") for k, v in pred.get("memory_GiB", {}).items()]
    rows.append(("breakdown", ""))
    order = ("compute", "forward", "backward", "recompute", "exposed_communication", "pipeline_bubble", "optimizer")
    bd = pred.get("breakdown_ms", {})
    for k in sorted(bd, key=lambda k: (order.index(k) if k in order else len(order), k)):
        rows.append((f"  {k.replace('_', ' ')}", _ms(bd[k])))
    rows.append(("source", str(pred["source"])))
    if pred.get("shape_runs"):
        rows.append(("shape memory", f"corrected by {pred['shape_runs']} measured run(s) of these layer shapes"))
    rows += [("note", str(n)) for n in pred.get("notes", [])]
    width = max(len(label) for label, _ in rows) + 2
    return "".join(f"{label:<{width}}{value}".rstrip() + "\n" for label, value in rows)


# ---------------------------------------------------------------- commands
def _cmd_simulate(args: argparse.Namespace) -> int:
    """``learnedperf simulate``."""
    return _run_command(args, "simulate")


def _cmd_predict(args: argparse.Namespace) -> int:
    """``learnedperf predict``."""
    return _run_command(args, "predict")


def _run_command(args: argparse.Namespace, command: str) -> int:
    prog = f"learnedperf {command}"
    if args.input is not None:
        clash = ["--run"] * bool(args.run) + [_flag(n) for n in _given(args, _RUN_FLAGS)]
        if clash:
            raise UsageError(f"{prog}: error: --input cannot be combined with {', '.join(clash)} "
                             "(put the fields in the input lines)")
        if args.trace:
            raise UsageError(f"{prog}: error: --trace needs one run (--run FILE.json or flags), not --input")
        return _batch(args, command, prog)
    return _single(args, command, prog)


def _open_output(path: str) -> TextIO:
    try:
        return open_output(path)
    except InputError as exc:
        raise UsageError(str(exc)) from None


def _single(args: argparse.Namespace, command: str, prog: str) -> int:
    """One run from --run / flags."""
    try:
        run = _run_from_args(args, prog)
        answer, _ = _answerer(command, getattr(args, "checkpoint", None), _tier(args))
        pred, spec, result = answer(run, bool(args.trace))
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        print(f"{prog}: error: {_error_text(exc)}", file=sys.stderr)
        return 1
    if args.trace:
        trace_out = _open_output(args.trace)
        with trace_out:
            json.dump(result.trace, trace_out)
    fmt = args.format or ("table" if args.output == "-" else "json")
    out = _open_output(args.output)
    try:
        out.write(_table(pred, spec) if fmt == "table" else dumps_line(pred))
        out.flush()
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _batch(args: argparse.Namespace, command: str, prog: str) -> int:
    """Every line of --input gives one line of --output, in order."""
    if args.format == "table":
        raise UsageError(f"{prog}: error: --format table is for one run; a batch writes JSON Lines")
    if args.input != "-" and args.output != "-" and os.path.exists(args.output) \
            and os.path.samefile(args.input, args.output):
        raise UsageError(f"{prog}: error: --output would overwrite --input {args.input}")
    try:
        stream = open_input(args.input)
    except InputError as exc:
        raise UsageError(f"{prog}: error: {exc}") from None
    try:
        _, batch = _answerer(command, getattr(args, "checkpoint", None), _tier(args))
    except LearnedPerfError as exc:
        if stream is not sys.stdin:
            stream.close()
        print(f"{prog}: error: {_error_text(exc)}", file=sys.stderr)
        return 1
    progress = sys.stderr.isatty()
    total = failed = 0
    out = _open_output(args.output)
    try:
        chunk: list = []
        records = read_records(stream)
        while True:
            item = next(records, None)
            if item is not None:
                chunk.append(item)
            if chunk and (item is None or len(chunk) >= _CHUNK_LINES):
                for record, ok in batch(chunk):
                    out.write(dumps_line(record))
                    failed += not ok
                total += len(chunk)
                chunk = []
                if progress:
                    print(f"\r{prog}: {total:,} runs ({failed:,} failed)", end="", file=sys.stderr, flush=True)
            if item is None:
                break
        out.flush()
    except UnicodeDecodeError as exc:
        raise UsageError(f"{prog}: error: {args.input}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        raise UsageError(f"{prog}: error: {exc}") from None
    finally:
        if stream is not sys.stdin:
            stream.close()
        if out is not sys.stdout:
            out.close()
    if progress and total >= _PROGRESS_EVERY:
        print(file=sys.stderr)
    if failed:
        print(f"{prog}: {failed} of {total} runs failed (see the \"error\" lines)", file=sys.stderr)
    return 1 if failed else 0


def _cmd_measure(args: argparse.Namespace) -> int:
    """``learnedperf measure``: run the local benchmarks and write a data set."""
    from .measure.collect import PARTS, collect, default_out

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise UsageError(f"learnedperf measure: error: --parts: unknown part(s) {bad or parts} "
                         f"(choose from {', '.join(PARTS)})")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("learnedperf measure: error: --device cuda: no CUDA device is available", file=sys.stderr)
            return 1
    if args.device_spec is not None and args.device != "cuda":
        raise UsageError("learnedperf measure: error: --device-spec describes a GPU (--device cuda); a CPU's records "
                         "carry its measured descriptor")
    out = args.out or default_out(args.quick, args.host)
    command = "learnedperf measure " + " ".join(_measure_argv(args))
    try:
        spec = args.device_spec
        if spec is not None and spec.lower().endswith(".json"):
            from .io import load_json_file

            spec = load_json_file(spec)
        manifest = collect(out, quick=args.quick, parts=parts, device=args.device, threads=args.threads,
                           command=command, progress=args.progress, device_spec=spec,
                           time_budget_s=args.time_budget_s)
    except LearnedPerfError as exc:
        print(f"learnedperf measure: error: {_error_text(exc)}", file=sys.stderr)
        return 1
    rows = ", ".join(f"{name} ({info['rows']} rows)" for name, info in manifest["files"].items())
    print(f"wrote {out}: {rows}; manifest.json")
    return 0


def _measure_argv(args: argparse.Namespace) -> list[str]:
    """The flags of a ``measure`` call (defaults spelt out), as the manifest records the command."""
    out = ["--quick"] * args.quick + [f"--device {args.device}", f"--threads {args.threads}",
                                      f"--parts {args.parts}"]
    return (out + ([f"--out {args.out}"] if args.out else []) + ([f"--host {args.host}"] if args.host else [])
            + ([f"--device-spec {args.device_spec}"] if args.device_spec else [])
            + ([f"--time-budget-s {args.time_budget_s}"] if args.time_budget_s else []))


def _cmd_ingest(args: argparse.Namespace) -> int:
    """``learnedperf ingest``: validate logs / traces / public data and write records."""
    from pathlib import Path

    from .measure import ingest as ing
    from .measure.records import OP_COLUMNS, STEP_COLUMNS, host_name, write_manifest, write_parquet

    if not args.files and not args.public:
        raise UsageError("learnedperf ingest: error: give run logs / traces, or --public NAME")
    ignore = [c.strip() for c in args.ignore_columns.split(",") if c.strip()]
    steps: list[dict] = []
    ops: list[dict] = []
    rejected = 0
    sources: list[dict] = []
    for path in args.files:
        kind = args.kind if args.kind != "auto" else (
            "trace" if _looks_like_trace(path) else "published" if _looks_like_published(path) else "runs")
        try:
            if kind == "published":
                from .measure.published import load_published

                got = load_published(path, strict=not args.skip_bad_rows)
                for where, why in got.skipped:
                    print(f"learnedperf ingest: rejected: {path}: {where}: {why}", file=sys.stderr)
                for where, text in got.warnings:
                    print(f"learnedperf ingest: warning: {path}: {where}: {text}", file=sys.stderr)
                rejected += len(got.skipped)
                got_steps = [ing.step_record(m.run, m.iteration_time_ms, source=m.source) for m in got.runs]
                steps += got_steps
                sources.append({"file": path, "kind": "published", "step_records": len(got_steps),
                                "skipped_rows": len(got.skipped), "filled_in": dict(got.assumptions)})
                print(f"{path}: {len(got_steps)} step records from a published table"
                      + (f"; filled in: {dict(got.assumptions)}" if got.assumptions else ""), file=sys.stderr)
                continue
            if kind == "trace":
                got = ing.ingest_trace(path, device=args.device)
                ops += got.ops
                sources.append({"file": path, "kind": "trace", "op_records": len(got.ops),
                                "step_times_ms": [st["time_ms"] for st in got.steps],
                                "unmapped_ops": len(got.unmapped)})
                print(f"{path}: {len(got.ops)} operator records ({len(got.unmapped)} unknown op kinds not "
                      "turned into records)", file=sys.stderr)
                continue
            if args.skip_bad_rows:
                res = ing.read_run_log(path, errors="collect", ignore_columns=ignore)
                for err in res.errors:
                    print(f"learnedperf ingest: rejected: {err}", file=sys.stderr)
                rejected += res.rejected
                got_steps = res.records
            else:
                got_steps = ing.read_run_log(path, ignore_columns=ignore)
        except LearnedPerfError as exc:
            print(f"learnedperf ingest: error: {_error_text(exc)}", file=sys.stderr)
            return 1
        steps += got_steps
        sources.append({"file": path, "kind": "runs", "step_records": len(got_steps)})
        print(f"{path}: {len(got_steps)} step records", file=sys.stderr)
    for name in args.public:
        from .measure import public

        try:
            if name == "vtrain":
                got = public.vtrain_step_records()
                steps += got
                sources.append({"public": name, "step_records": len(got)})
            elif name == "neusight-steps":
                loaded = public.load_neusight_steps()
                steps += loaded.records
                sources.append({"public": name, "step_records": len(loaded.records), "skipped": loaded.skipped})
            else:
                frame = public.load_neusight_ops()
                ops += frame.to_dict("records")
                sources.append({"public": name, "op_records": len(frame)})
        except LearnedPerfError as exc:
            print(f"learnedperf ingest: error: --public {name}: {_error_text(exc)}", file=sys.stderr)
            return 1
        print(f"--public {name}: {sources[-1]}", file=sys.stderr)
    out = Path(args.out)
    written = []
    try:
        if steps:
            written.append(write_parquet(steps, out / "steps_ingested.parquet", STEP_COLUMNS, "step").name)
        if ops:
            written.append(write_parquet(ops, out / "ops_ingested.parquet", OP_COLUMNS, "operator").name)
        write_manifest(out, command="learnedperf ingest " + " ".join(_ingest_argv(args)),
                       host={"name": host_name()}, extra={"sources": sources, "rejected_rows": rejected})
    except (LearnedPerfError, OSError) as exc:
        print(f"learnedperf ingest: error: {_error_text(exc) if isinstance(exc, LearnedPerfError) else exc}",
              file=sys.stderr)
        return 1
    print(f"wrote {out}: {len(steps)} step records, {len(ops)} operator records"
          + (f"; {rejected} rows rejected (listed above)" if rejected else ""))
    return 1 if rejected else 0


def _ingest_argv(args: argparse.Namespace) -> list[str]:
    out = list(args.files) + [f"--out {args.out}"] + [f"--public {p}" for p in args.public]
    out += ["--skip-bad-rows"] * args.skip_bad_rows + ([f"--kind {args.kind}"] if args.kind != "auto" else [])
    return out + ([f"--ignore-columns {args.ignore_columns}"] if args.ignore_columns else []) + (
        [f"--device {args.device}"] if args.device else [])


def _looks_like_published(path: str) -> bool:
    """A CSV file whose header has ``gpu_type`` and ``num_gpus``: a published-runs table."""
    if not path.endswith(".csv"):
        return False
    try:
        with open(path, encoding="utf-8-sig") as fh:
            header = fh.readline()
    except (OSError, UnicodeDecodeError):
        return False  # the run-log reader reports the unreadable file with its reason
    names = {c.strip().strip('"') for c in header.split(",")}
    return {"gpu_type", "num_gpus"} <= names


def _looks_like_trace(path: str) -> bool:
    """A JSON (or .json.gz) file whose top-level object has ``traceEvents``: a profiler trace."""
    if not (path.endswith(".json") or path.endswith(".json.gz")):
        return False
    import gzip

    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            head = fh.read(4096)
    except (OSError, UnicodeDecodeError):
        return False  # the run-log reader reports the unreadable file with its reason
    return '"traceEvents"' in head or '"schemaVersion"' in head


def _cmd_generate(args: argparse.Namespace) -> int:
    """``learnedperf generate``: sample, simulate and store a versioned data set."""
    from .data.generate import run_generate

    try:
        manifest = run_generate(args.n, args.out, args.seed, workers=args.workers, scheduler=args.scheduler,
                                keep_oom=args.keep_oom, progress=args.progress, measured=args.measured)
    except LearnedPerfError as exc:
        print(f"learnedperf generate: error: {_error_text(exc)}", file=sys.stderr)
        return 1
    counts = manifest.get("counts", {})
    by_source = ", ".join(f"{v} {k}" for k, v in counts.get("by_source", {}).items())
    print(f"wrote {args.out}: {counts.get('records', 0)} records ({by_source}); manifest.json")
    return 0


def _folds(text: str) -> int:
    """``--folds``: 0 or an integer >= 2."""
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 0 or k == 1:
        raise argparse.ArgumentTypeError(f"expected 0 or an integer >= 2, got {text!r}")
    return k


def _gnn_params(args: argparse.Namespace, prog: str) -> dict:
    """``--gnn KEY=VALUE`` pairs as a dict (:func:`~learnedperf.models.iteration.parse_gnn_params`)."""
    from .models.iteration import check_gnn_params, parse_gnn_params

    try:
        out = parse_gnn_params(args.gnn)
    except InputError as exc:
        raise UsageError(f"{prog}: error: --gnn {exc}") from None
    if out:
        # before any data is loaded: a misspelt key or a bad value must not cost minutes first

        try:
            check_gnn_params(out)
        except InputError as exc:
            raise UsageError(f"{prog}: error: --gnn: {exc}") from None
    if args.folds and out.get("ensemble", args.folds) != args.folds:
        raise UsageError(f"{prog}: error: --folds {args.folds} trains one network per fold; --gnn ensemble="
                         f"{out['ensemble']} differs (leave it out)")
    return out


def _dask_client(args: argparse.Namespace, prog: str):
    """A ``dask.distributed.Client`` on ``--scheduler``, or None."""
    if not args.scheduler:
        return None
    from dask.distributed import Client

    try:
        return Client(args.scheduler, timeout="20s")
    except (OSError, TimeoutError) as exc:
        raise UsageError(f"{prog}: error: --scheduler {args.scheduler}: cannot connect: {exc}") from None


def _split_list(text: Optional[str]) -> Optional[tuple[str, ...]]:
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None


def _cmd_evaluate(args: argparse.Namespace) -> int:
    """``learnedperf evaluate``: every method on every held-out split; tables on stdout, report to --out."""
    from .models.evaluate import EVAL_SPLITS, format_table
    from .models.iteration import METHODS
    from .models.pipeline import run_evaluation

    prog = "learnedperf evaluate"
    methods = _split_list(args.methods) or METHODS
    splits = _split_list(args.splits)
    bad = [m for m in methods if m not in METHODS] + [x for x in splits or () if x not in EVAL_SPLITS]
    if bad:
        raise UsageError(f"{prog}: error: unknown method or split {bad} (methods: {', '.join(METHODS)}; splits: "
                         f"{', '.join(EVAL_SPLITS)})")
    gnn = _gnn_params(args, prog)
    client = _dask_client(args, prog)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.progress else (lambda m: None)
    try:
        report = run_evaluation(args.data, methods=methods, splits=splits, gnn_params=gnn, client=client,
                                limit_simulated=args.limit_simulated, seed=args.seed, progress=args.progress,
                                log=log, folds=args.folds, device_kernels=args.device_kernels)
    except LearnedPerfError as exc:
        print(f"{prog}: error: {_error_text(exc)}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
    for metric, title in (("mape", "MAPE of iteration time (%)"), ("kendall_tau", "Kendall tau over strategies"),
                          ("top1_regret", "top-1 regret"), ("coverage", "90 % interval coverage")):
        print(f"\n{title}\n\n{format_table(report, metric)}")
    if args.out:
        with _open_output(args.out) as out:
            json.dump(report, out, indent=1)
        print(f"\nwrote {args.out}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    """``learnedperf train``: fit a method on a data set and write a verified checkpoint."""
    from .checkpoint import load_checkpoint, save_checkpoint
    from .io import load_json_file
    from .models.evaluate import format_table, require_unseen_devices
    from .models.iteration import METHODS
    from .models.pipeline import choose_method, fit_model, measured_runs

    prog = "learnedperf train"
    report = None
    if args.evaluation:
        try:
            report = load_json_file(args.evaluation)
        except InputError as exc:
            raise UsageError(f"{prog}: error: --evaluation: {exc}") from None
        try:
            require_unseen_devices(report)
        except InputError as exc:
            raise UsageError(f"{prog}: error: --evaluation {args.evaluation}: {exc}") from None
    method = args.method
    chosen_by = "--method"
    means = None
    if method == "auto":
        if report is None:
            raise UsageError(f"{prog}: error: --method auto needs --evaluation REPORT.json "
                             "(or name a method: " + ", ".join(METHODS) + ")")
        try:
            method, means, why = choose_method(report)
        except (InputError, KeyError, TypeError) as exc:
            raise UsageError(f"{prog}: error: --evaluation {args.evaluation}: {exc}") from None
        chosen_by = f"{why} of {os.path.basename(args.evaluation)}"
    elif method not in METHODS:
        raise UsageError(f"{prog}: error: unknown --method {method!r} (choose from auto, {', '.join(METHODS)})")
    gnn = _gnn_params(args, prog)
    client = _dask_client(args, prog)
    try:
        model, data = fit_model(args.data, method, gnn_params=gnn, client=client, limit_simulated=args.limit_simulated,
                                seed=args.seed, progress=args.progress, evaluation=report, folds=args.folds)
        metrics: dict[str, Any] = {"chosen_by": chosen_by}
        if means is not None:
            metrics["mean_unseen_mape_by_method"] = means
        if hasattr(model, "shapes_"):
            # the memory's base and the held-out MAPE of each candidate on the calibration runs that chose it
            metrics["shapes_over"] = model.shapes_.over
            metrics["shapes_choice_mape"] = {k: round(v, 3) for k, v in model.shape_choice_.items()
                                             if math.isfinite(v)}
            print(f"shape memory over the {model.shapes_.over} ("
                  + ", ".join(f"{k} {v:.2f} %" for k, v in metrics["shapes_choice_mape"].items())
                  + " held out on its corrected calibration runs)", file=sys.stderr)
        if report is not None:
            metrics["evaluation"] = {k: v for k, v in report.items() if k != "predictions"}
            metrics["tables"] = {m: format_table(report, m) for m in ("mape", "kendall_tau", "top1_regret",
                                                                       "coverage")}
        save_checkpoint(args.out, model, data, metrics)
        load_checkpoint(args.out)  # what was written must verify
        if args.surrogate_runs > 0:
            from .checkpoint import add_surrogate
            from .predict import Predictor, distil_surrogate

            anchors = measured_runs(args.data) if args.surrogate_near_runs > 0 else []
            if args.surrogate_near_runs > 0 and not anchors:
                print(f"{prog}: {args.data} has no measured runs: the surrogate is distilled on sampled runs only",
                      file=sys.stderr)
            surrogate, fidelity = distil_surrogate(Predictor.load(args.out), n=args.surrogate_runs, seed=args.seed,
                                                   progress=args.progress and sys.stderr.isatty(),
                                                   log=lambda line: print(line, file=sys.stderr), anchors=anchors,
                                                   n_near=args.surrogate_near_runs if anchors else 0)
            add_surrogate(args.out, surrogate, fidelity)
            load_checkpoint(args.out)
    except LearnedPerfError as exc:
        print(f"{prog}: error: {_error_text(exc)}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
    per_group = ", ".join(f"{g}: n={v['n']}" for g, v in model.interval_.to_dict()["quantiles"].items())
    novel = ", ".join(f"{c}: n={v['n']}" for c, v in model.interval_.novelty_.items()) or "none"
    print(f"wrote checkpoint {args.out}: method {method} ({chosen_by}); {model.n_train_} training runs "
          f"({model.n_train_measured_} measured); interval calibrated on {model.interval_.n_calibration_} measured "
          f"runs ({per_group}); novel runs on leave-domain-out residuals ({novel})")
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    """``learnedperf search``: the fastest valid strategies that fit, as a ranked table or JSON."""
    prog = "learnedperf search"
    try:
        base = _load_run_file(args.run, prog) if args.run else {}
    except InputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    model = args.model or base.get("model")
    hardware = dict(base.get("hardware") or {})
    hardware.update({key: getattr(args, dest) for dest, key in _HARDWARE_FLAGS.items()
                     if getattr(args, dest) is not None})
    if model is None or not hardware:
        raise UsageError(f"{prog}: error: give --model and --cluster/--device with --num-devices (or --run FILE.json)")
    constraints: dict[str, Any] = {}
    if args.constraints:
        try:
            constraints = json.loads(args.constraints)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{prog}: error: --constraints: invalid JSON ({exc.msg})") from None
        if not isinstance(constraints, dict):
            raise UsageError(f"{prog}: error: --constraints must be a JSON object")
    if args.global_batch_size:
        constraints["global_batch_size"] = args.global_batch_size
    if args.precision:
        constraints["precision"] = args.precision
    try:
        from .predict import Predictor

        if args.seq_length:
            model = _with_seq_length(model, args.seq_length)
        result = Predictor.load(args.checkpoint).search(model, hardware, constraints, top=args.top)
    except LearnedPerfError as exc:
        print(f"{prog}: error: {_error_text(exc)}", file=sys.stderr)
        return 1
    if args.format == "json":
        sys.stdout.write(dumps_line(result))
        return 0
    print(f"{result['model']} on {result['num_devices']} x {result['device']}: {result['candidates']:,} candidate "
          f"strategies, {result['valid']:,} valid, {result['fit_in_memory']:,} fit in memory; best "
          f"{result['rescored']} re-scored with the full model ({result['elapsed_ms'] / 1e3:.1f} s)")
    if not result["results"]:
        if not result["valid"]:
            # every candidate was refused by the run validation: say by which fields, and the commonest's reason
            counts = sorted(result["invalid_by_field"].items(), key=lambda kv: -kv[1])
            why = "; ".join(f"{n:,} by {field}" for field, n in counts)
            example = f"; e.g. {result['invalid_example'][counts[0][0]]}" if counts else ""
            print("no valid strategy under these constraints" + (f" (invalid: {why}{example})" if why else ""))
        else:
            print("no strategy fits in memory under these constraints")
        return 1
    head = ("#", "tp", "pp", "dp", "cp", "ep", "mbs", "schedule", "recompute", "zero", "sp", "time ms",
            "90% interval ms", "mem GiB", "MFU", "P(fastest)")
    # the expert dispatch gets a column when a result departs from the default (alltoall, blocking)
    dispatch = any(k in r["strategy"] for r in result["results"] for k in ("moe_dispatcher", "overlap_moe_comm"))
    if dispatch:
        head = head[:6] + ("dispatch",) + head[6:]
    rows = []
    for r in result["results"]:
        s = r["strategy"]
        sched = s["pipeline_schedule"] + (f"x{s['virtual_pipeline_stages']}" if s["virtual_pipeline_stages"] > 1
                                          else "") if s["pp"] > 1 else "-"
        lo, hi = r["interval_ms"]
        rows.append((str(r["rank"]), str(s["tp"]), str(s["pp"]), str(s["dp"]), str(s["cp"]), str(s["ep"]),
                     str(s["micro_batch_size"]), sched, s["recompute"],
                     str(s["zero_stage"]) + (f"/x{s['dp_replicate']}" if s.get("dp_replicate", 1) > 1 else ""),
                     "y" if s["sequence_parallel"] else "n", f"{r['iteration_time_ms']:,.1f}",
                     f"{lo:,.1f}-{hi:,.1f}", f"{r['peak_memory_GiB']:.1f}", f"{100 * r['mfu']:.1f}%",
                     f"{r['p_fastest']:.2f}"))
        if dispatch:
            d = s.get("moe_dispatcher", "alltoall") + (", overlapped" if s.get("overlap_moe_comm") else "")
            rows[-1] = rows[-1][:6] + (d if s["ep"] > 1 else "-",) + rows[-1][6:]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    for row in (head, *rows):
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)).rstrip())
    print(f"source: {result['source']}; P(fastest): {result['confidence_note']}")
    # what was assumed rather than given (the hardware's network): every candidate shares it, so say it once
    for note in dict.fromkeys(n for r in result["results"] for n in r["prediction"].get("notes", [])):
        print(f"note: {note}")
    return 0


def _with_seq_length(model: Any, seq_length: int) -> Any:
    """``model`` (a catalog name or inline dict) with another sequence length; anything else unchanged
    (run validation reports it)."""
    if isinstance(model, str):
        from .catalog import get_model

        model = get_model(model)
    return {**model, "seq_length": seq_length} if isinstance(model, dict) else model


def _cmd_serve(args: argparse.Namespace) -> int:
    """``learnedperf serve``: the HTTP service (blocks until interrupted)."""
    from .service import serve

    return serve(host=args.host, port=args.port, checkpoint=args.checkpoint, max_batch=args.max_batch,
                 max_body_bytes=args.max_body_bytes, allow_remote=args.allow_remote)


def _cmd_catalog(args: argparse.Namespace) -> int:
    """``learnedperf catalog [KIND]``: names one per line (indented under a heading for all kinds)."""
    from .catalog import names

    if args.kind:
        print("\n".join(names(args.kind)))
        return 0
    for kind in ("devices", "clusters", "models"):
        print(f"{kind}:")
        print("\n".join(f"  {n}" for n in names(kind)))
    return 0


# ---------------------------------------------------------------- entry point
def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("learnedperf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (e.g. piped into head): not an error of ours
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
