"""Tests of the run format: RunSpec / ModelSpec / HardwareSpec / Strategy parsing and validation.

Most tests use inline devices and models so that they do not depend on the catalog's
contents; the few that use catalog names skip when the catalog files are absent.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import A100_LIKE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import learnedperf
from learnedperf.errors import CatalogError, SpecError
from learnedperf.specs import DeviceSpec, HardwareSpec, ModelSpec, RunSpec, Strategy

# --------------------------------------------------------------------------- fixtures / helpers

CATALOG_DIR = Path(learnedperf.__file__).parent / "catalog" / "data"


def needs_catalog(*kinds: str):
    """Skip unless catalog/data/devices.json (and the other named catalog files) exist."""
    files = [CATALOG_DIR / f"{kind}.json" for kind in ("devices", *kinds)]
    missing = [f.name for f in files if not f.exists()]
    return pytest.mark.skipif(bool(missing), reason=f"catalog/data/{', '.join(missing)} not written yet")


# An A100-like device without fp8 math, and without link parameters.
DEVICE = {k: v for k, v in A100_LIKE.items() if "node" not in k} | {"name": "test-gpu"}

DEVICE_FP8 = dict(DEVICE, name="test-gpu-fp8", peak_tflops=dict(DEVICE["peak_tflops"], fp8=1979.0))

GPT_SMALL = {"arch": "gpt", "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 32,
             "vocab_size": 50257, "seq_length": 2048}

LLAMA_GQA = {"name": "llama-gqa", "arch": "llama", "num_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336,
             "vocab_size": 32000, "seq_length": 4096}

MOE = {"name": "moe-8x", "arch": "moe", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
       "num_kv_heads": 8, "ffn_hidden_size": 14336, "vocab_size": 32000, "seq_length": 4096,
       "num_experts": 8, "moe_top_k": 2}

GPT3_175B = {"name": "gpt3-175b-inline", "arch": "gpt", "num_layers": 96, "hidden_size": 12288,
             "num_attention_heads": 96, "vocab_size": 50257, "seq_length": 2048}

LLAMA2_7B = {"name": "llama2-7b-inline", "arch": "llama", "num_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "ffn_hidden_size": 11008, "vocab_size": 32000, "seq_length": 4096}


def hw(num_devices: int = 8, devices_per_node: int = 8, device: dict | None = None, **links) -> dict:
    return {"device": copy.deepcopy(device or DEVICE), "num_devices": num_devices,
            "devices_per_node": devices_per_node, **links}


def run(model=None, hardware=None, **strategy) -> dict:
    return {"model": copy.deepcopy(model if model is not None else GPT_SMALL),
            "hardware": hardware if hardware is not None else hw(),
            "strategy": strategy}


def assert_one_line_error(err: SpecError) -> None:
    text = str(err)
    assert "\n" not in text and "\r" not in text, text
    assert text.startswith(err.field), (err.field, text)
    assert err.message and err.message in text


def expect_spec_error(fn, *args, field: str | None = None, field_prefix: str | None = None) -> SpecError:
    """Call ``fn`` and check it raises a SpecError (and nothing else) naming ``field``."""
    try:
        fn(*args)
    except SpecError as exc:
        err = exc
    except BaseException as exc:  # noqa: BLE001 - the point is to catch anything else
        pytest.fail(f"expected SpecError, got {type(exc).__name__}: {exc}")
    else:
        pytest.fail("expected SpecError, nothing was raised")
    assert isinstance(err, SpecError)
    if field is not None:
        assert err.field == field, str(err)
    if field_prefix is not None:
        assert err.field == field_prefix or err.field.startswith(field_prefix + "."), str(err)
    assert_one_line_error(err)
    return err


def roundtrip(spec: RunSpec) -> RunSpec:
    return RunSpec.from_dict(json.loads(json.dumps(spec.to_dict())))


# --------------------------------------------------------------------------- valid runs

def test_valid_run_roundtrips_through_json():
    d = run(LLAMA_GQA, hw(64, 8), tp=8, pp=2, micro_batch_size=2, global_batch_size=64,
            recompute="selective", sequence_parallel=True, zero_stage=1)
    d["id"] = "run-1"
    d["meta"] = {"note": "x"}
    spec = RunSpec.from_dict(d)
    again = roundtrip(spec)
    assert again == spec
    assert again.to_dict() == spec.to_dict()
    assert spec.id == "run-1"
    assert spec.meta == {"note": "x"}
    # to_dict writes everything inline (no catalog names needed to re-parse)
    out = spec.to_dict()
    assert isinstance(out["model"], dict) and isinstance(out["hardware"]["device"], dict)
    assert set(out) <= {"model", "hardware", "strategy", "id", "meta"}


def test_roundtrip_of_from_json():
    spec = RunSpec.from_dict(run(MOE, hw(16, 8), tp=2, ep=4, micro_batch_size=1, global_batch_size=32))
    assert RunSpec.from_json(json.dumps(spec.to_dict())) == spec


def test_dp_derived_and_default_global_batch():
    spec = RunSpec.from_dict(run(LLAMA_GQA, hw(64, 8), tp=4, pp=2, cp=2, micro_batch_size=3))
    assert spec.strategy.dp == 64 // (4 * 2 * 2) == 4
    assert spec.strategy.global_batch_size == 3 * 4
    assert spec.num_microbatches == 1
    assert spec.tokens_per_iteration == 12 * 4096


def test_num_microbatches():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(32, 8), tp=2, pp=4, micro_batch_size=2, global_batch_size=64))
    assert spec.strategy.dp == 4
    assert spec.num_microbatches == 64 // (2 * 4) == 8


def test_explicit_consistent_dp_accepted():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(16, 8), tp=2, pp=2, dp=4))
    assert spec.strategy.dp == 4


def test_strategy_defaults():
    spec = RunSpec.from_dict({"model": GPT_SMALL, "hardware": hw(8, 8)})
    s = spec.strategy
    assert (s.tp, s.pp, s.cp, s.ep, s.dp, s.micro_batch_size, s.global_batch_size) == (1, 1, 1, 1, 8, 1, 8)
    assert s.pipeline_schedule == "1f1b" and s.virtual_pipeline_stages == 1
    assert s.sequence_parallel is False and s.precision == "bf16"


def test_null_strategy_means_defaults():
    spec = RunSpec.from_dict({"model": GPT_SMALL, "hardware": hw(8, 8), "strategy": None})
    assert spec.strategy.dp == 8


def test_interleaved_schedule_accepted_when_consistent():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(8, 8), pp=4, micro_batch_size=1, global_batch_size=8,
                                 pipeline_schedule="interleaved", virtual_pipeline_stages=3))
    assert spec.strategy.dp == 2 and spec.num_microbatches == 4
    assert roundtrip(spec) == spec


def test_interleaved_schedule_accepts_layers_that_do_not_divide():
    # Llama 3 405B's 126 layers were pipelined unevenly over 16 interleaved stages; where the spare
    # layers go is graph.execution's (tests/test_graph.py)
    spec = RunSpec.from_dict(run(dict(GPT_SMALL, num_layers=30), hw(8, 8), pp=2, global_batch_size=8,
                                 pipeline_schedule="interleaved", virtual_pipeline_stages=4))
    assert spec.model.num_layers == 30 and spec.strategy.virtual_pipeline_stages == 4
    assert roundtrip(spec) == spec


def test_inline_device_without_devices_per_node_is_one_per_node():
    spec = RunSpec.from_dict({"model": GPT_SMALL, "hardware": {"device": DEVICE, "num_devices": 6}})
    assert spec.hardware.devices_per_node == 1
    assert spec.hardware.num_nodes == 6


def test_single_partial_node_allowed():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(4, 8)))
    assert spec.hardware.num_nodes == 1 and spec.hardware.node_size == 4


def test_link_values_from_run_and_link_lookup():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(16, 8, intra_node_bandwidth_GBps=300.0,
                                                 inter_node_bandwidth_GBps=25.0)))
    assert spec.hardware.link("intra_node_bandwidth_GBps") == 300.0
    assert spec.hardware.link("inter_node_bandwidth_GBps") == 25.0
    assert roundtrip(spec) == spec


def test_link_values_from_inline_device():
    dev = dict(DEVICE, intra_node_bandwidth_GBps=300.0, inter_node_latency_us=5.0)
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(16, 8, device=dev)))
    assert spec.hardware.intra_node_bandwidth_GBps == 300.0
    assert spec.hardware.inter_node_latency_us == 5.0
    # the run's own value wins over the device's
    spec2 = RunSpec.from_dict(run(GPT_SMALL, hw(16, 8, device=dev, intra_node_bandwidth_GBps=150.0)))
    assert spec2.hardware.intra_node_bandwidth_GBps == 150.0


def test_link_missing_raises_spec_error():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(16, 8)))
    expect_spec_error(spec.hardware.link, "inter_node_bandwidth_GBps", field="hardware.inter_node_bandwidth_GBps")
    expect_spec_error(spec.hardware.link, "intra_node_latency_us", field="hardware.intra_node_latency_us")


DESIGN_EXAMPLE = {  # the run format's example in DESIGN.md, verbatim: a device name, 1,024 devices, no network
    "model": "gpt3-175b",
    "hardware": {"device": "A100-SXM4-80GB", "num_devices": 1024, "devices_per_node": 8},
    "strategy": {"tp": 8, "pp": 8, "dp": 16, "micro_batch_size": 1, "global_batch_size": 1536,
                 "pipeline_schedule": "1f1b", "virtual_pipeline_stages": 1, "zero_stage": 0,
                 "recompute": "full", "sequence_parallel": False, "cp": 1, "ep": 1, "precision": "bf16"}}


@needs_catalog("clusters", "models")
def test_a_device_named_run_across_nodes_takes_its_reference_systems_network():
    from learnedperf.catalog import get_cluster, reference_cluster
    from learnedperf.simulate import simulate

    assert reference_cluster("A100") == reference_cluster("A100-SXM4-80GB") == "dgx-a100"
    assert reference_cluster("H100-SXM5-80GB") == "dgx-h100"
    assert reference_cluster("A100-PCIE-40GB") is None and reference_cluster("no-such-gpu") is None
    spec = RunSpec.from_dict(DESIGN_EXAMPLE)
    hw_ = spec.hardware
    # DGX A100 data sheet: 8 x 200 Gb/s HDR InfiniBand for 8 GPUs -> 25 GB/s a GPU (catalog clusters.json)
    assert hw_.links_from == "dgx-a100" and hw_.inter_node_bandwidth_GBps == 25 == \
        get_cluster("dgx-a100")["inter_node_bandwidth_GBps"]
    assert hw_.cluster is None and roundtrip(spec) == spec
    # the same network as naming the cluster: the same simulated time, and the prediction says what was assumed
    named = dict(DESIGN_EXAMPLE, hardware={"cluster": "dgx-a100", "num_devices": 1024})
    a, b = simulate(DESIGN_EXAMPLE).to_prediction(), simulate(named).to_prediction()
    assert a["iteration_time_ms"] == b["iteration_time_ms"]
    assert "notes" not in b and any("dgx-a100" in n and "inter_node_bandwidth_GBps" in n for n in a["notes"])
    # nothing assumed where the run gives the network, names a cluster, stays in one node, or says where from
    given = RunSpec.from_dict(dict(DESIGN_EXAMPLE, hardware=dict(DESIGN_EXAMPLE["hardware"],
                                                                 inter_node_bandwidth_GBps=50.0)))
    assert given.hardware.links_from is None and given.hardware.inter_node_bandwidth_GBps == 50.0
    assert RunSpec.from_dict(named).hardware.links_from is None
    one_node = RunSpec.from_dict(dict(DESIGN_EXAMPLE, hardware={"device": "A100-SXM4-80GB", "num_devices": 8},
                                      strategy={"tp": 8, "global_batch_size": 16}))
    assert one_node.hardware.links_from is None and one_node.hardware.inter_node_bandwidth_GBps is None
    chosen = RunSpec.from_dict(dict(DESIGN_EXAMPLE, hardware=dict(DESIGN_EXAMPLE["hardware"], links_from="aws-p4de")))
    assert chosen.hardware.links_from == "aws-p4de" and chosen.hardware.inter_node_bandwidth_GBps == 6.25
    # a device no catalog cluster is built of still needs the network given
    pcie = RunSpec.from_dict(dict(DESIGN_EXAMPLE, hardware={"device": "A100-PCIE-40GB", "num_devices": 16,
                                                            "devices_per_node": 8},
                                  strategy={"tp": 8, "global_batch_size": 16}))
    assert pcie.hardware.links_from is None
    expect_spec_error(pcie.hardware.link, "inter_node_bandwidth_GBps", field="hardware.inter_node_bandwidth_GBps")


@needs_catalog("clusters", "models")
def test_links_from_must_name_a_catalog_cluster():
    bad = dict(DESIGN_EXAMPLE, hardware=dict(DESIGN_EXAMPLE["hardware"], links_from=7))
    expect_spec_error(RunSpec.from_dict, bad, field="hardware.links_from")
    with pytest.raises(CatalogError, match="unknown cluster") as exc:
        RunSpec.from_dict(dict(DESIGN_EXAMPLE, hardware=dict(DESIGN_EXAMPLE["hardware"], links_from="dgx-a1000")))
    assert exc.value.field == "hardware.links_from"


def test_fp8_accepted_on_device_with_fp8():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(8, 8, device=DEVICE_FP8), precision="fp8"))
    assert spec.hardware.device.peak_flops("fp8") == pytest.approx(1979e12)


def test_peak_flops_unsupported_precision():
    dev = DeviceSpec.parse(DEVICE)
    assert dev.peak_flops("bf16") == pytest.approx(312e12)
    expect_spec_error(dev.peak_flops, "fp8", field="strategy.precision")


def test_peak_flops_unknown_precision_name_is_spec_error():
    dev = DeviceSpec.parse(DEVICE)
    expect_spec_error(dev.peak_flops, "int8")


# --------------------------------------------------------------------------- frozen

def test_specs_are_frozen():
    spec = RunSpec.from_dict(run(GPT_SMALL, hw(8, 8), tp=2))
    frozen_errors = (ValidationError, TypeError, AttributeError)
    with pytest.raises(frozen_errors):
        spec.strategy = Strategy()  # type: ignore[misc]
    with pytest.raises(frozen_errors):
        spec.strategy.tp = 4  # type: ignore[misc]
    with pytest.raises(frozen_errors):
        spec.model.hidden_size = 1  # type: ignore[misc]
    with pytest.raises(frozen_errors):
        spec.hardware.num_devices = 16  # type: ignore[misc]
    with pytest.raises(frozen_errors):
        spec.hardware.device.memory_GiB = 1.0  # type: ignore[misc]
    with pytest.raises(frozen_errors):
        spec.hardware.device.peak_tflops.bf16 = 1.0  # type: ignore[misc]
    assert spec.strategy.tp == 2 and spec.model.hidden_size == 2048


# --------------------------------------------------------------------------- bad input

BAD_RUNS = [
    # (id, run, expected field or prefix, exact?)
    ("product-ne-num-devices", run(GPT_SMALL, hw(16, 8), tp=2, pp=2, dp=2), "strategy.dp", True),
    ("product-does-not-divide", run(GPT_SMALL, hw(8, 8), tp=4, pp=4), "strategy", False),
    ("heads-not-div-tp", run(GPT_SMALL, hw(3, 1), tp=3), "strategy.tp", True),
    ("kv-heads-vs-tp", run({"arch": "llama", "num_layers": 8, "hidden_size": 3072, "num_attention_heads": 24,
                            "num_kv_heads": 8, "vocab_size": 32000, "seq_length": 2048},
                           hw(12, 1), tp=12), "strategy.tp", True),
    ("ffn-not-div-tp", run(dict(GPT_SMALL, num_attention_heads=16, hidden_size=2048, ffn_hidden_size=5000),
                           hw(16, 8), tp=16), "strategy.tp", True),
    ("layers-lt-pp", run(dict(GPT_SMALL, num_layers=4), hw(8, 8), pp=8), "strategy.pp", True),
    ("gbs-not-div", run(GPT_SMALL, hw(8, 8), micro_batch_size=2, global_batch_size=24),
     "strategy.global_batch_size", True),
    ("gbs-lt-mbs-dp", run(GPT_SMALL, hw(8, 8), micro_batch_size=2, global_batch_size=8),
     "strategy.global_batch_size", True),
    ("unknown-strategy-key", run(GPT_SMALL, hw(), tpp=2), "strategy.tpp", True),
    ("tp-wrong-type", run(GPT_SMALL, hw(), tp="eight"), "strategy.tp", True),
    ("tp-list", run(GPT_SMALL, hw(), tp=[8]), "strategy.tp", True),
    ("tp-fraction", run(GPT_SMALL, hw(), tp=2.5), "strategy.tp", True),
    ("tp-zero", run(GPT_SMALL, hw(), tp=0), "strategy.tp", True),
    ("pp-negative", run(GPT_SMALL, hw(), pp=-1), "strategy.pp", True),
    ("dp-zero", run(GPT_SMALL, hw(), dp=0), "strategy.dp", True),
    ("cp-negative", run(GPT_SMALL, hw(), cp=-2), "strategy.cp", True),
    ("ep-zero", run(GPT_SMALL, hw(), ep=0), "strategy.ep", True),
    ("mbs-zero", run(GPT_SMALL, hw(), micro_batch_size=0), "strategy.micro_batch_size", True),
    ("gbs-negative", run(GPT_SMALL, hw(), global_batch_size=-8), "strategy.global_batch_size", True),
    ("vpp-zero", run(GPT_SMALL, hw(), virtual_pipeline_stages=0), "strategy.virtual_pipeline_stages", True),
    ("bad-schedule", run(GPT_SMALL, hw(), pipeline_schedule="zero-bubble"), "strategy.pipeline_schedule", True),
    ("bad-precision", run(GPT_SMALL, hw(), precision="int4"), "strategy.precision", True),
    ("bad-zero-stage", run(GPT_SMALL, hw(), zero_stage=4), "strategy.zero_stage", True),
    ("bad-recompute", run(GPT_SMALL, hw(), recompute="some"), "strategy.recompute", True),
    ("bad-optimizer", run(GPT_SMALL, hw(), optimizer="lion"), "strategy.optimizer", True),
    ("zero1-without-optimizer", run(GPT_SMALL, hw(), zero_stage=1, optimizer="none"), "strategy.optimizer", True),
    ("zero2-without-optimizer", run(GPT_SMALL, hw(), zero_stage=2, optimizer="none"), "strategy.optimizer", True),
    ("forward-only-with-adam", run(GPT_SMALL, hw(), forward_only=True), "strategy.forward_only", True),
    ("forward-only-with-recompute", run(GPT_SMALL, hw(), forward_only=True, optimizer="none", recompute="full"),
     "strategy.forward_only", True),
    ("strategy-not-object", {"model": GPT_SMALL, "hardware": hw(), "strategy": [1, 2]}, "strategy", True),
    ("fp8-unsupported", run(GPT_SMALL, hw(), precision="fp8"), "strategy.precision", True),
    ("interleaved-without-vpp", run(GPT_SMALL, hw(8, 8), pp=2, pipeline_schedule="interleaved"),
     "strategy.virtual_pipeline_stages", True),
    ("vpp-without-interleaved", run(GPT_SMALL, hw(8, 8), pp=2, virtual_pipeline_stages=2), "strategy.pipeline_schedule", True),
    ("vpp-times-pp-exceeds-layers", run(dict(GPT_SMALL, num_layers=6), hw(8, 8), pp=4, global_batch_size=8,
                                        pipeline_schedule="interleaved", virtual_pipeline_stages=2),
     "strategy.pp", True),
    ("interleaved-microbatches-not-multiple-of-pp",
     run(GPT_SMALL, hw(8, 8), pp=4, micro_batch_size=1, global_batch_size=6,
         pipeline_schedule="interleaved", virtual_pipeline_stages=2),
     "strategy.global_batch_size", True),
    ("ep-on-dense", run(GPT_SMALL, hw(8, 8), ep=2), "strategy.ep", True),
    ("ep-not-dividing-experts", run(MOE, hw(6, 1), ep=3), "strategy.ep", True),
    ("ep-not-dividing-dp-cp", run(MOE, hw(8, 8), tp=4, ep=4), "strategy.ep", True),
    ("cp-not-dividing-seq", run(dict(GPT_SMALL, seq_length=2049), hw(2, 8), cp=2), "strategy.cp", True),
    ("sp-seq-not-div-tp", run(dict(GPT_SMALL, seq_length=2049), hw(2, 8), tp=2, sequence_parallel=True),
     "strategy.sequence_parallel", True),
    # hardware
    ("unknown-hardware-key", {"model": GPT_SMALL, "hardware": dict(hw(), nodes=2)}, "hardware.nodes", True),
    ("missing-num-devices", {"model": GPT_SMALL, "hardware": {"device": DEVICE}}, "hardware.num_devices", True),
    ("num-devices-zero", run(GPT_SMALL, hw(0, 8)), "hardware.num_devices", True),
    ("num-devices-negative", run(GPT_SMALL, hw(-8, 8)), "hardware.num_devices", True),
    ("num-devices-string", run(GPT_SMALL, hw("many", 8)), "hardware.num_devices", True),  # type: ignore[arg-type]
    ("devices-per-node-zero", run(GPT_SMALL, hw(8, 0)), "hardware.devices_per_node", True),
    ("num-devices-not-multiple-of-node", run(GPT_SMALL, hw(12, 8)), "hardware.num_devices", True),
    ("missing-device", {"model": GPT_SMALL, "hardware": {"num_devices": 8}}, "hardware.device", True),
    ("hardware-not-object", {"model": GPT_SMALL, "hardware": "8xA100"}, "hardware", True),
    ("device-not-object", run(GPT_SMALL, {"device": 42, "num_devices": 8}), "hardware.device", True),
    ("device-memory-negative", run(GPT_SMALL, hw(device=dict(DEVICE, memory_GiB=-1))),
     "hardware.device.memory_GiB", True),
    ("device-missing-peak", run(GPT_SMALL, hw(device={k: v for k, v in DEVICE.items() if k != "peak_tflops"})),
     "hardware.device.peak_tflops", True),
    ("device-unknown-key", run(GPT_SMALL, hw(device=dict(DEVICE, flops=1))), "hardware.device.flops", True),
    ("device-peak-zero", run(GPT_SMALL, hw(device=dict(DEVICE, peak_tflops={"fp32": 0}))),
     "hardware.device.peak_tflops.fp32", True),
    ("link-wrong-type", run(GPT_SMALL, hw(inter_node_bandwidth_GBps="fast")),
     "hardware.inter_node_bandwidth_GBps", True),
    ("link-negative", run(GPT_SMALL, hw(intra_node_bandwidth_GBps=-1)), "hardware.intra_node_bandwidth_GBps", True),
    ("cluster-not-string", {"model": GPT_SMALL, "hardware": dict(hw(), cluster=3)}, "hardware.cluster", True),
    # model
    ("missing-model", {"hardware": hw()}, "model", True),
    ("missing-hardware", {"model": GPT_SMALL}, "hardware", True),
    ("model-not-object", {"model": [1, 2], "hardware": hw()}, "model", True),
    ("model-number", {"model": 7, "hardware": hw()}, "model", True),
    ("hidden-not-div-heads", run(dict(GPT_SMALL, hidden_size=2050)), "model.num_attention_heads", True),
    ("kv-not-div-heads", run(dict(LLAMA_GQA, num_kv_heads=5)), "model.num_kv_heads", True),
    ("moe-one-expert", run(dict(MOE, num_experts=1)), "model.num_experts", True),
    ("moe-top-k-gt-experts", run(dict(MOE, moe_top_k=9)), "model.moe_top_k", True),
    ("dense-with-experts", run(dict(GPT_SMALL, num_experts=8)), "model.num_experts", True),
    ("unknown-arch", run(dict(GPT_SMALL, arch="t5")), "model.arch", True),
    ("missing-arch", run({k: v for k, v in GPT_SMALL.items() if k != "arch"}), "model", False),
    ("model-unknown-key", run(dict(GPT_SMALL, layers=3)), "model.layers", True),
    ("model-layers-zero", run(dict(GPT_SMALL, num_layers=0)), "model.num_layers", True),
    ("model-missing-vocab", run({k: v for k, v in GPT_SMALL.items() if k != "vocab_size"}), "model.vocab_size",
     True),
    ("model-seq-negative", run(dict(GPT_SMALL, seq_length=-5)), "model.seq_length", True),
    ("hf-unknown-key-next-to-it", run({"hf_config": {"model_type": "gpt2"}, "seq_length": 1024, "arch": "gpt"}),
     "model.arch", True),
    ("hf-not-object", run({"hf_config": "gpt2"}), "model.hf_config", True),
    ("hf-unsupported-type", run({"hf_config": {"model_type": "mamba", "hidden_size": 768}}),
     "model.hf_config.model_type", True),
    ("hf-missing-key", run({"hf_config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                                          "vocab_size": 32000, "max_position_embeddings": 4096,
                                          "intermediate_size": 11008}}),
     "model.hf_config", False),
    ("hf-no-seq", run({"hf_config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                                     "num_hidden_layers": 32, "vocab_size": 32000, "intermediate_size": 11008}}),
     "model.seq_length", True),
    # top level
    ("unknown-top-level-key", dict(run(GPT_SMALL), strat={"tp": 2}), "strat", True),
    ("meta-not-object", dict(run(GPT_SMALL), meta="x"), "meta", True),
]


@pytest.mark.parametrize("bad,field,exact", [pytest.param(r, f, e, id=i) for i, r, f, e in BAD_RUNS])
def test_bad_run_raises_one_spec_error(bad, field, exact):
    if exact:
        expect_spec_error(RunSpec.from_dict, bad, field=field)
    else:
        expect_spec_error(RunSpec.from_dict, bad, field_prefix=field)


def test_error_messages_mention_the_numbers():
    err = expect_spec_error(RunSpec.from_dict, run(GPT_SMALL, hw(16, 8), tp=2, pp=2, dp=2), field="strategy.dp")
    assert "16" in err.message  # num_devices
    err = expect_spec_error(RunSpec.from_dict, run(GPT_SMALL, hw(3, 1), tp=3), field="strategy.tp")
    assert "32" in err.message  # heads
    err = expect_spec_error(RunSpec.from_dict, run(GPT_SMALL, hw(8, 8), pipeline_schedule="interleaved", pp=2),
                            field_prefix="strategy")
    assert "virtual_pipeline_stages" in err.message
    err = expect_spec_error(RunSpec.from_dict, run(GPT_SMALL, hw(12, 8)), field_prefix="hardware")
    assert "devices_per_node" in err.message
    err = expect_spec_error(RunSpec.from_dict, run(dict(GPT_SMALL, hidden_size=2050)), field_prefix="model")
    assert "num_attention_heads" in err.message


def test_sequence_parallel_error_names_sequence_parallel():
    err = expect_spec_error(RunSpec.from_dict,
                            run(dict(GPT_SMALL, seq_length=2049), hw(2, 8), tp=2, sequence_parallel=True))
    assert err.field in ("strategy.sequence_parallel", "strategy.tp")
    assert "seq_length" in err.message


@pytest.mark.parametrize("bad", [[], [run()], "gpt3", 42, None, 1.5, True], ids=repr)
def test_non_dict_run_is_spec_error(bad):
    expect_spec_error(RunSpec.from_dict, bad)


@pytest.mark.parametrize("text", ["{", "", "{'model': 1}", "[1, 2", "nope"])
def test_from_json_invalid_json(text):
    err = expect_spec_error(RunSpec.from_json, text)
    assert "invalid JSON" in str(err)


def test_from_json_valid_json_but_not_object():
    expect_spec_error(RunSpec.from_json, "[1, 2, 3]")
    expect_spec_error(RunSpec.from_json, '"a string"')


def test_spec_error_is_a_value_error_and_str_format():
    err = SpecError("strategy.tp", "bad")
    assert isinstance(err, ValueError)
    assert str(err) == "strategy.tp: bad"
    assert err.field == "strategy.tp" and err.message == "bad"


def test_multiple_problems_give_one_error_naming_the_first():
    err = expect_spec_error(RunSpec.from_dict, run(GPT_SMALL, hw(), tp=0, pp=0, precision="int1"))
    assert err.field in ("strategy.tp", "strategy.pp", "strategy.precision")
    assert "more problem" in err.message


# --------------------------------------------------------------------------- suspected bugs

def test_interleaved_needs_pp_at_least_two():
    expect_spec_error(RunSpec.from_dict, run(GPT_SMALL, hw(8, 8), pp=1, pipeline_schedule="interleaved",
                                             virtual_pipeline_stages=2), field_prefix="strategy")


@pytest.mark.parametrize("arch", [["gpt"], {"name": "gpt"}])
def test_unhashable_arch_is_spec_error(arch):
    expect_spec_error(RunSpec.from_dict, run(dict(GPT_SMALL, arch=arch)), field_prefix="model")


def test_roberta_null_pad_token_id():
    cfg = {"model_type": "roberta", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
           "vocab_size": 50265, "max_position_embeddings": 514, "pad_token_id": None}
    try:
        spec = RunSpec.from_dict(run({"hf_config": cfg}))
    except SpecError as exc:
        assert_one_line_error(exc)
    else:
        assert spec.model.seq_length == 512


def test_hf_architectures_not_a_list():
    cfg = {"architectures": 5, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
           "vocab_size": 50257, "max_position_embeddings": 1024}
    try:
        RunSpec.from_dict(run({"hf_config": cfg}))
    except SpecError as exc:
        assert_one_line_error(exc)


@pytest.mark.parametrize("where", ["top", "strategy", "hardware"])
def test_unknown_key_with_newline_gives_one_line(where):
    d = run(GPT_SMALL, hw())
    key = "bad\nkey"
    if where == "top":
        d[key] = 1
    elif where == "strategy":
        d["strategy"][key] = 1
    else:
        d["hardware"][key] = 1
    expect_spec_error(RunSpec.from_dict, d)


# --------------------------------------------------------------------------- model defaults and sizes

def test_llama_defaults():
    m = ModelSpec.parse({"arch": "llama", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                         "vocab_size": 32000, "seq_length": 4096})
    assert m.activation == "swiglu" and m.norm == "rmsnorm"
    assert m.position_embedding == "rope" and m.tie_embeddings is False and m.causal is True
    assert m.ffn_hidden_size == 11008
    assert m.num_kv_heads == 32
    assert m.mlp_matrices == 3


@pytest.mark.parametrize("h", [512, 1024, 2048, 4096, 5120, 8192])
def test_llama_ffn_rule(h):
    m = ModelSpec.parse({"arch": "llama", "num_layers": 2, "hidden_size": h, "num_attention_heads": 8,
                         "vocab_size": 1000, "seq_length": 128})
    f = m.ffn_hidden_size
    assert f % 256 == 0
    assert 8 * h / 3 <= f < 8 * h / 3 + 256


def test_gpt_defaults():
    m = ModelSpec.parse(GPT_SMALL)
    assert m.ffn_hidden_size == 4 * 2048
    assert m.activation == "gelu" and m.norm == "layernorm"
    assert m.position_embedding == "learned" and m.tie_embeddings is True and m.causal is True
    assert m.num_kv_heads == m.num_attention_heads
    assert m.num_experts == 1 and not m.is_moe


def test_bert_is_not_causal():
    m = ModelSpec.parse(dict(GPT_SMALL, arch="bert"))
    assert m.causal is False


def test_moe_defaults_and_active_params():
    m = ModelSpec.parse({k: v for k, v in MOE.items() if k != "moe_top_k"})
    assert m.moe_top_k == 2 and m.is_moe and m.num_moe_layers == 32
    assert m.num_active_params() < m.num_params()


def test_explicit_values_override_arch_defaults():
    m = ModelSpec.parse(dict(GPT_SMALL, activation="relu", tie_embeddings=False, ffn_hidden_size=1000))
    assert m.activation == "relu" and m.tie_embeddings is False and m.ffn_hidden_size == 1000


def test_gpt3_175b_num_params():
    m = ModelSpec.parse(GPT3_175B)
    assert m.num_params() == pytest.approx(175e9, rel=0.01)
    l, h, v, s = 96, 12288, 50257, 2048
    closed_form = 12 * l * h * h * (1 + 13 / (12 * h)) + v * h + s * h
    assert m.num_params() == pytest.approx(closed_form, rel=1e-4)


def test_llama2_7b_num_params():
    m = ModelSpec.parse(LLAMA2_7B)
    assert m.num_params() == pytest.approx(6.74e9, rel=0.01)


def test_hf_llama_config_matches_inline():
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    spec = RunSpec.from_dict(run({"hf_config": cfg, "name": "l7", "seq_length": 4096}, hw(8, 8), tp=8))
    inline = ModelSpec.parse(LLAMA2_7B)
    assert spec.model.name == "l7"
    assert spec.model.num_params() == inline.num_params()
    assert spec.model.model_dump(exclude={"name"}) == inline.model_dump(exclude={"name"})
    assert roundtrip(spec) == spec


def test_hf_gpt2_config():
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
           "n_positions": 1024, "n_inner": None, "activation_function": "gelu_new"}
    m = RunSpec.from_dict(run({"hf_config": cfg, "seq_length": 512}, hw(1, 1))).model
    assert (m.arch, m.hidden_size, m.ffn_hidden_size, m.seq_length) == ("gpt", 768, 3072, 512)
    assert m.num_params() == pytest.approx(124e6, rel=0.02)


# --------------------------------------------------------------------------- catalog (skipped without it)

@needs_catalog("clusters", "models")
def test_catalog_run_roundtrip():
    d = {"model": "gpt3-175b",
         "hardware": {"cluster": "dgx-a100", "num_devices": 1024},
         "strategy": {"tp": 8, "pp": 8, "micro_batch_size": 1, "global_batch_size": 1536}}
    spec = RunSpec.from_dict(d)
    assert spec.strategy.dp == 16
    assert spec.num_microbatches == 1536 // 16 == 96
    assert spec.hardware.devices_per_node == 8
    assert spec.model.num_params() == pytest.approx(175e9, rel=0.02)
    assert roundtrip(spec) == spec


@needs_catalog("models")
def test_catalog_device_and_model_names():
    d = {"model": "llama2-7b", "hardware": {"device": "A100-SXM4-80GB", "num_devices": 8, "devices_per_node": 8},
         "strategy": {"tp": 2}}
    spec = RunSpec.from_dict(d)
    assert spec.strategy.dp == 4
    assert spec.hardware.device.memory_GiB == pytest.approx(80, rel=0.05)
    assert spec.model.num_params() == pytest.approx(6.74e9, rel=0.01)
    assert roundtrip(spec) == spec
    # A100 has no fp8 tensor cores
    expect_spec_error(RunSpec.from_dict, dict(d, strategy={"precision": "fp8"}), field="strategy.precision")


@needs_catalog()
def test_unknown_device_name_suggests_close_names():
    d = run(GPT_SMALL, {"device": "A100-SXM4-80G", "num_devices": 8})
    err = expect_spec_error(RunSpec.from_dict, d, field="hardware.device")
    assert isinstance(err, CatalogError)
    assert "A100-SXM4-80GB" in err.message
    err = expect_spec_error(RunSpec.from_dict, run(GPT_SMALL, {"device": "zzqqxx-9000", "num_devices": 8}),
                            field="hardware.device")
    assert "zzqqxx-9000" in err.message


# --------------------------------------------------------------------------- property test

HYP_HARDWARE = hw(64, 8)
INT_KEYS = ("tp", "pp", "dp", "cp", "ep", "micro_batch_size", "global_batch_size", "virtual_pipeline_stages")

_small_int = st.one_of(st.sampled_from([1, 2, 4, 8]), st.integers(min_value=-2, max_value=64))
_junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=5),
                  st.lists(st.integers(), max_size=2))
_int_value = st.one_of(_small_int, _small_int, _small_int, _junk)  # mostly integers
_word = st.one_of(st.sampled_from(["gpipe", "1f1b", "interleaved", "fp32", "tf32", "bf16", "fp16", "fp8"]),
                  st.text(max_size=8))
# keys without control characters (see test_unknown_key_with_newline_gives_one_line)
_extra_key = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=8)

strategy_dicts = st.fixed_dictionaries(
    {},
    optional={
        **{k: _int_value for k in INT_KEYS},
        "pipeline_schedule": _word,
        "precision": _word,
        "sequence_parallel": st.booleans(),
        "zero_stage": st.integers(min_value=-1, max_value=4),
    },
)
extra_keys = st.dictionaries(_extra_key, st.integers(), max_size=2)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=strategy_dicts, extra=st.one_of(st.just({}), st.just({}), extra_keys),
       model=st.sampled_from([LLAMA_GQA, MOE, GPT_SMALL]))
def test_random_strategies_parse_or_raise_spec_error(strategy, extra, model):
    raw = dict(strategy)
    raw.update(extra)
    d = {"model": model, "hardware": HYP_HARDWARE, "strategy": raw}
    try:
        spec = RunSpec.from_dict(copy.deepcopy(d))
    except SpecError as err:
        assert_one_line_error(err)
        assert err.field == "" or err.field.split(".")[0] in {"strategy", "model", "hardware"}
        return
    except BaseException as exc:  # noqa: BLE001
        pytest.fail(f"non-SpecError {type(exc).__name__}: {exc} for {d!r}")
    s = spec.strategy
    n = spec.hardware.num_devices
    assert s.tp * s.pp * s.dp * s.cp == n
    assert s.global_batch_size % (s.micro_batch_size * s.dp) == 0
    assert spec.num_microbatches * s.micro_batch_size * s.dp == s.global_batch_size
    assert spec.model.num_attention_heads % s.tp == 0
    assert spec.model.num_layers >= s.pp * s.virtual_pipeline_stages
    assert s.ep == 1 or spec.model.num_experts % s.ep == 0
    assert spec.hardware.device.peak_tflops.get(s.precision) is not None
    assert roundtrip(spec) == spec


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
       mbs=st.integers(min_value=1, max_value=4), k=st.integers(min_value=1, max_value=8),
       give_dp=st.booleans(), give_gbs=st.booleans())
def test_consistent_strategies_always_parse(tp, pp, cp, mbs, k, give_dp, give_gbs):
    n = 64
    dp = n // (tp * pp * cp)
    strategy = {"tp": tp, "pp": pp, "cp": cp, "micro_batch_size": mbs}
    if give_dp:
        strategy["dp"] = dp
    if give_gbs:
        strategy["global_batch_size"] = mbs * dp * k
    spec = RunSpec.from_dict({"model": LLAMA_GQA, "hardware": HYP_HARDWARE, "strategy": strategy})
    assert spec.strategy.dp == dp
    assert spec.strategy.global_batch_size == mbs * dp * (k if give_gbs else 1)
    assert spec.num_microbatches == (k if give_gbs else 1)
    assert roundtrip(spec) == spec


# ------------------------------------------------------------------ heads wider than hidden_size / heads
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 36,
            "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 40960,
            "hidden_act": "silu"}


@pytest.mark.parametrize("config, total_B, active_B", [
    # Qwen3 Technical Report (arXiv 2505.09388), Tables 1-2: 8.2B; 4.0B (tied head); 30.5B total, 3.3B activated
    (QWEN3_8B, 8.2, 8.2),
    ({**QWEN3_8B, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True}, 4.0, 4.0),
    ({**QWEN3_8B, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
      "num_key_value_heads": 4, "num_hidden_layers": 48, "moe_intermediate_size": 768, "num_experts": 128,
      "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": []}, 30.5, 3.3),
    # Gemma (Gemma Team 2024, arXiv 2403.08295, Table 1 and 2): the 7B model has 8.54B parameters in all
    ({"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576,
      "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 28, "head_dim": 256,
      "vocab_size": 256000, "max_position_embeddings": 8192, "hidden_act": "gelu"}, 8.54, 8.54),
])
def test_a_head_dim_set_apart_counts_the_published_parameters(config, total_B, active_B):
    m = RunSpec.from_dict(run({"hf_config": config, "seq_length": 4096})).model
    assert m.head_dim == config["head_dim"] and m.attention_width == config["num_attention_heads"] * m.head_dim
    # the reports give one decimal (two for Gemma), and count activated parameters their own way: within 2 %
    assert m.num_params() / 1e9 == pytest.approx(total_B, rel=0.02)
    assert m.num_active_params() / 1e9 == pytest.approx(active_B, rel=0.02)


# config.json of google/gemma-2-9b and the text_config of google/gemma-3-4b-pt (the keys that shape the model)
GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
             "intermediate_size": 14336, "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 42,
             "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096,
             "hidden_activation": "gelu_pytorch_tanh"}
GEMMA3_4B_TEXT = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 34, "head_dim": 256,
                  "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024,
                  "hidden_activation": "gelu_pytorch_tanh"}
GEMMA3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
             "text_config": GEMMA3_4B_TEXT}


@pytest.mark.parametrize("config, seq, non_embedding_M", [
    # Gemma Team 2024 (arXiv 2408.00118), Table 2: 9B, 8,324,201,984 non-embedding parameters, of which the run
    # format leaves out the two extra norms a layer (post-attention and post-MLP, 2·42·3584 = 301,056)
    (GEMMA2_9B, 4096, 8324.2),
    # Gemma Team 2025 (arXiv 2503.19786), Table 1: 4B, 3,209M non-embedding parameters (and a 417M vision
    # encoder the run format leaves out)
    (GEMMA3_4B, 1024, 3209)])
def test_gemma_2_and_3_count_their_reported_parameters(config, seq, non_embedding_M):
    m = ModelSpec.from_hf_config(config, seq)
    embedding = m.vocab_size * m.hidden_size  # tied with the LM head
    assert m.tie_embeddings and (m.num_params() - embedding) / 1e6 == pytest.approx(non_embedding_M, rel=1e-3)


@pytest.mark.parametrize("config, field", [(GEMMA2_9B, "model.hf_config.sliding_window"),
                                           (GEMMA3_4B, "model.hf_config.text_config.sliding_window")])
def test_gemma_local_attention_beyond_its_window_is_refused(config, field):
    # Gemma 2's 8K pre-training sequences exceed its 4K window: its local layers are not in the run format
    with pytest.raises(SpecError) as err:
        ModelSpec.from_hf_config(config)
    assert err.value.field == field


def test_head_dim_is_written_only_where_it_is_set_apart():
    plain = ModelSpec.parse({"arch": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                             "vocab_size": 100, "seq_length": 16})
    assert plain.head_dim == 16 and "head_dim" not in plain.to_dict()  # runs and their ids as before
    wide = ModelSpec.parse({**plain.to_dict(), "head_dim": 32})
    assert wide.to_dict()["head_dim"] == 32 and ModelSpec.parse(wide.to_dict()) == wide
    # the graph's attention is as wide as the heads: q, k, v of 4 heads of 32 (3·128 wide), the output
    # projection from 128 back to 64, and 2·m·n·k FLOPs each
    from learnedperf.graph.transformer import operator_graph

    ops = {op.name: op for op in operator_graph(wide, batch=1).ops if op.phase == "fwd"}
    qkv, proj = ops["layer.attn.qkv"], ops["layer.attn.proj"]
    assert qkv.flops == 2 * 16 * (3 * 128) * 64 and proj.flops == 2 * 16 * 64 * 128
    assert ops["layer.attn.core"].shape[-1] == 32


# ------------------------------------------------------------------ MoEs with shared experts and dense layers
# config.json of deepseek-ai/deepseek-moe-16b-base (custom code: model_type "deepseek")
DEEPSEEK_MOE_16B = {
    "architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "max_position_embeddings": 4096, "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 28, "num_key_value_heads": 16, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000, "scoring_func": "softmax", "aux_loss_alpha": 0.001,
    "seq_aux": True, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 102400}
# config.json of Qwen/Qwen1.5-MoE-A2.7B
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643, "decoder_sparse_step": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
# config.json of Qwen/Qwen2-57B-A14B
QWEN2_57B_A14B = {
    **QWEN15_MOE_A27B, "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "moe_intermediate_size": 2560, "num_attention_heads": 28, "num_experts": 64,
    "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "shared_expert_intermediate_size": 20480, "sliding_window": 131072}
SHARED_EXPERT_MOES = [("deepseek-moe-16b", DEEPSEEK_MOE_16B), ("qwen1.5-moe-a2.7b", QWEN15_MOE_A27B),
                      ("qwen2-57b-a14b", QWEN2_57B_A14B)]


@needs_catalog("models")
@pytest.mark.parametrize("name, total_B, active_B", [
    ("deepseek-moe-16b", 16.4, 2.8),    # Dai et al. 2024 (arXiv 2401.06066), DeepSeekMoE 16B: 16.4B, 2.8B activated
    ("qwen1.5-moe-a2.7b", 14.3, 2.7),   # Qwen blog "Qwen1.5-MoE": 14.3B in all, 2.7B activated
    ("qwen2-57b-a14b", 57.0, 14.0),     # Qwen2 Technical Report (arXiv 2407.10671): 57B, 14B activated
])
def test_catalog_moes_with_shared_experts_count_the_reported_parameters(name, total_B, active_B):
    from learnedperf.catalog import get_model

    m = ModelSpec.parse(get_model(name))
    assert m.moe_shared_ffn_hidden_size > 0
    assert m.num_params() / 1e9 == pytest.approx(total_B, rel=0.01)
    # the reports round the activated count to one decimal (14B: none): within 2 %
    assert m.num_active_params() / 1e9 == pytest.approx(active_B, rel=0.02)


@needs_catalog("models")
@pytest.mark.parametrize("name, config", SHARED_EXPERT_MOES, ids=[n for n, _ in SHARED_EXPERT_MOES])
def test_hf_configs_of_moes_with_shared_experts_read_as_the_catalog_entry(name, config):
    from learnedperf.catalog import get_model

    spec = RunSpec.from_dict(run({"hf_config": config, "seq_length": 4096})).model
    entry = ModelSpec.parse(get_model(name))
    assert spec.model_dump(exclude={"name", "seq_length"}) == entry.model_dump(exclude={"name", "seq_length"})
    assert spec.num_params() == entry.num_params() and spec.num_active_params() == entry.num_active_params()
    assert ModelSpec.parse(spec.to_dict()) == spec
    # without model_type, the architectures class names the family (Qwen2Moe before Qwen2's dense reading)
    bare = {k: v for k, v in config.items() if k != "model_type"}
    assert ModelSpec.from_hf_config(bare, seq_length=4096) == spec


def test_hf_deepseek_moe_layout():
    m = ModelSpec.from_hf_config(DEEPSEEK_MOE_16B)
    # the first layer dense (intermediate_size wide), the other 27 MoE layers with 2 shared experts of 1408
    assert (m.moe_first_dense_layers, m.num_moe_layers, m.moe_layers_in(0, 1)) == (1, 27, 0)
    assert (m.ffn_hidden_size, m.dense_ffn_hidden_size, m.moe_shared_ffn_hidden_size) == (1408, 10944, 2816)
    assert (m.num_experts, m.moe_top_k, m.seq_length) == (64, 6, 4096)
    # no shared experts (null) and no leading dense layer: every layer a MoE layer, intermediate_size unread
    plain = ModelSpec.from_hf_config({**DEEPSEEK_MOE_16B, "n_shared_experts": None, "first_k_dense_replace": 0})
    assert (plain.num_moe_layers, plain.moe_shared_ffn_hidden_size, plain.dense_ffn_hidden_size) == (28, 0, 1408)


def test_hf_qwen_moe_dense_layers_every_decoder_sparse_step():
    # Qwen: layer i is a MoE layer when (i + 1) % decoder_sparse_step == 0, the others dense of intermediate_size
    for config in (QWEN15_MOE_A27B, {**QWEN3_8B, "model_type": "qwen3_moe", "moe_intermediate_size": 768,
                                     "num_experts": 128, "num_experts_per_tok": 8, "mlp_only_layers": []}):
        m = ModelSpec.from_hf_config({**config, "decoder_sparse_step": 2})
        L, h = config["num_hidden_layers"], config["hidden_size"]
        assert (m.moe_layer_frequency, m.num_moe_layers, m.moe_layers_in(0, 2)) == (2, L // 2, 1)
        assert m.dense_ffn_hidden_size == config["intermediate_size"]
        one = ModelSpec.from_hf_config(config)
        # half the layers trade their experts (and shared expert, and router) for a dense MLP
        moe_mlp = (m.num_experts * 3 * h * m.ffn_hidden_size + 3 * h * m.moe_shared_ffn_hidden_size
                   + h * m.num_experts)
        assert one.num_params() - m.num_params() == (L // 2) * (moe_mlp - 3 * h * config["intermediate_size"])


@pytest.mark.parametrize("config, field", [
    ({**DEEPSEEK_MOE_16B, "moe_layer_freq": 2}, "model.hf_config.moe_layer_freq"),
    ({**QWEN15_MOE_A27B, "mlp_only_layers": [0, 1]}, "model.hf_config.mlp_only_layers"),
    ({**QWEN3_8B, "model_type": "qwen3_moe", "moe_intermediate_size": 768, "num_experts": 128,
      "num_experts_per_tok": 8, "mlp_only_layers": [3]}, "model.hf_config.mlp_only_layers"),
    ({**QWEN15_MOE_A27B, "shared_expert_intermediate_size": None}, "model.hf_config.shared_expert_intermediate_size"),
    # DeepSeek-V2/V3: multi-head latent attention, whose ranks a DeepSeek-MoE config lacks
    ({**DEEPSEEK_MOE_16B, "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"]},
     "model.hf_config.kv_lora_rank"),
])
def test_hf_moe_layouts_the_run_format_cannot_place_give_one_error(config, field):
    err = expect_spec_error(RunSpec.from_dict, run({"hf_config": config}), field=field)
    if field.endswith(("moe_layer_freq", "mlp_only_layers")):
        assert "run format" in err.message
