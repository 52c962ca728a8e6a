"""NeuSight's whole-model fx graphs: the node loader and the mapping of nodes to operator records.

The expected numbers are recomputed by hand from each node's shapes. Every test needs
``../shared/data`` (``neusight_graph_nodes.parquet`` and ``neusight_devices.csv``) and skips, saying
which file is missing, when it is absent.
"""

from __future__ import annotations

import json

import pytest

from learnedperf.errors import InputError
from learnedperf.measure.public import (GRAPH_NODE_COLUMNS, GRAPH_OP_EXTRA_COLUMNS, default_shared_data,
                                        load_neusight_graph_nodes, neusight_graph_ops)
from learnedperf.measure.records import OP_COLUMNS

SHARED = default_shared_data()
NEEDED = ("neusight_graph_nodes.parquet", "neusight_devices.csv")
_missing = [str(SHARED / n) for n in NEEDED if not (SHARED / n).exists()]
pytestmark = pytest.mark.skipif(bool(_missing), reason=f"public data not available: {', '.join(_missing)}")

#: Reasons that annotate a mapped node (one direction, or its gradient accumulation) rather than a node left out.
NOTES = ("bwd not timed (bw_latency 0)", "parameter-gradient accumulation (acc_latency, no op record)")


@pytest.fixture(scope="module")
def nodes():
    return load_neusight_graph_nodes()


@pytest.fixture(scope="module")
def mapped(nodes):
    return neusight_graph_ops(nodes)


def node(nodes, run, name):
    hit = nodes[(nodes["run"] == run) & (nodes["name"] == name)]
    assert len(hit) == 1, (run, name)
    return hit.iloc[0]


def records(ops, run, name):
    return {r["direction"]: r for _, r in ops[(ops["run"] == run) & (ops["node_name"] == name)].iterrows()}


def test_loader_parses_every_field(nodes):
    assert list(nodes.columns) == list(GRAPH_NODE_COLUMNS)
    assert set(nodes["mode"]) == {"inf", "train"}
    assert set(nodes["device"]) >= {"Tesla V100-PCIE-32GB", "Tesla T4", "NVIDIA A100-PCIE-40GB"}
    n = node(nodes, "bert_large-train-512-8", "bert_encoder_layer_0_intermediate_dense")
    assert (n["model"], n["mode"], n["seq"], n["batch"]) == ("bert_large", "train", 512, 8)
    assert (n["node_op"], n["target_op"], n["module_type"]) == ("call_module", "Linear",
                                                                 "torch.nn.modules.linear.Linear")
    assert n["input_shapes"] == [[8, 512, 1024]] and n["output_shape"] == [8, 512, 4096] and n["dtype"] == "fp32"
    assert n["in_layer"] and n["users"] == ["gelu"]
    assert n["latency_ms"] == pytest.approx(n["fw_latency_ms"] + n["bw_latency_ms"] + n["acc_latency_ms"])
    # memory addresses are gone from targets, so the same call has one name in every run
    mm = node(nodes, "gpt2_large-train-1024-1", "addmm")
    assert (mm["target"], mm["target_op"]) == ("<built-in method addmm of type object>", "torch.addmm")
    size = node(nodes, "gpt2_large-train-1024-1", "size")
    assert size["dtype"] is None and size["target_op"] == ".size" and not size["in_layer"]
    assert not node(nodes, "gpt2_large-train-1024-1", "lm_head")["in_layer"]


def test_linear_addmm_and_batched_matmul_flops(mapped):
    ops, _ = mapped
    assert list(ops.columns) == list(OP_COLUMNS) + list(GRAPH_OP_EXTRA_COLUMNS)
    assert set(ops["mode"]) == {"train"} and set(ops["source"]) == {"neusight_graphs"}

    # Linear 1024 -> 4096 on 8·512 tokens: M = 4096 rows, reduction K = 1024, N = 4096 outputs
    r = records(ops, "bert_large-train-512-8", "bert_encoder_layer_0_intermediate_dense")
    B, M, N, K = 1, 8 * 512, 4096, 1024
    assert json.loads(r["fwd"]["shape"]) == [B, M, N, K] and r["fwd"]["kind"] == "matmul"
    assert r["fwd"]["flops"] == 2.0 * B * M * N * K
    assert r["fwd"]["bytes"] == 4.0 * B * (M * K + K * N + M * N)
    assert (r["bwd"]["flops"], r["bwd"]["bytes"]) == (2 * r["fwd"]["flops"], 2 * r["fwd"]["bytes"])
    dev = json.loads(r["fwd"]["device"])
    assert (r["fwd"]["device_name"], dev["peak_tflops"]["fp32"]) == ("V100-PCIE-32GB", pytest.approx(14.029))  # neusight_devices.csv SingleFLOPs

    # GPT-2's Conv1D is addmm(bias, x[1024, 1280], W[1280, 3840]): the reduction is the shared 1280
    r = records(ops, "gpt2_large-train-1024-1", "addmm")
    assert json.loads(r["fwd"]["shape"]) == [1, 1024, 3840, 1280]
    assert r["fwd"]["flops"] == 2.0 * 1024 * 3840 * 1280

    # attention scores: [8,16,512,64] x [8,16,64,512] = 128 GEMMs of 512x512, reduction 64
    r = records(ops, "bert_large-train-512-8", "matmul")
    assert json.loads(r["fwd"]["shape"]) == [128, 512, 512, 64]
    assert r["fwd"]["flops"] == 2.0 * 128 * 512 * 512 * 64
    assert r["fwd"]["op"] == "bmm"


def test_memory_bound_and_embedding_nodes(mapped, nodes):
    ops, _ = mapped
    run = "bert_large-train-512-8"
    ln = records(ops, run, "bert_encoder_layer_0_output_layer_norm")
    n = node(nodes, run, "bert_encoder_layer_0_output_layer_norm")
    assert (ln["fwd"]["kind"], json.loads(ln["fwd"]["shape"])) == ("layernorm", [4096, 1024])
    # measure.ops conventions: norms 5 FLOPs per element, x read and y written
    assert (ln["fwd"]["flops"], ln["fwd"]["bytes"]) == (5.0 * 4096 * 1024, 4.0 * 2 * 4096 * 1024)
    assert (ln["fwd"]["time_ms"], ln["bwd"]["time_ms"]) == (n["fw_latency_ms"], n["bw_latency_ms"])

    sm = records(ops, run, "softmax")
    assert sm["fwd"]["kind"] == "softmax" and json.loads(sm["fwd"]["shape"]) == [8 * 16 * 512, 512]
    drop = records(ops, run, "bert_encoder_layer_0_output_dropout")
    assert drop["fwd"]["kind"] == "elementwise" and drop["fwd"]["flops"] == 2.0 * 4096 * 1024  # dropout: 2/elem
    # the attention-mask add broadcasts [8,1,1,512] over the scores: the mask is read once, not 16·512 times
    add = records(ops, run, "add_7")
    numel = 8 * 16 * 512 * 512
    assert add["fwd"]["bytes"] == 4.0 * (numel + 8 * 512 + numel)
    emb = records(ops, run, "bert_embeddings_word_embeddings")
    assert (emb["fwd"]["kind"], json.loads(emb["fwd"]["shape"])) == ("embedding", [4096, 1024])
    assert emb["fwd"]["bytes"] == 4.0 * 4096 * 1024 + 8 * 4096


def test_every_training_node_is_mapped_or_counted(mapped, nodes):
    ops, unmapped = mapped
    train = nodes[nodes["mode"] == "train"]
    left_out = unmapped[~unmapped["reason"].isin(NOTES)]
    mapped_nodes = ops.groupby(["run", "node_index"]).ngroups
    assert mapped_nodes + left_out["nodes"].sum() == len(train)
    # and every millisecond is in a record or in the unmapped table
    total = train["fw_latency_ms"].sum() + train["bw_latency_ms"].sum()
    assert ops["time_ms"].sum() + unmapped["fw_latency_ms"].sum() + unmapped["bw_latency_ms"].sum() == \
        pytest.approx(total)
    assert unmapped["acc_latency_ms"].sum() == pytest.approx(train["acc_latency_ms"].sum())
    by_target = unmapped.groupby(["target_op", "reason"])["nodes"].sum()
    assert by_target[(".view", "no kernel (view, shape query or Python value)")] == 22
    assert by_target[("torch.ones", "no learnedperf kind for 'torch.ones'")] == 2
    assert by_target[("placeholder", "graph input, parameter or output (no kernel)")] == 3
    assert by_target[(".to", "cast to the same dtype (no kernel)")] == 3
    assert set(ops["kind"]) <= {"matmul", "softmax", "layernorm", "elementwise", "embedding"}


def test_inference_graphs_map_forward_only(nodes):
    ops, _ = neusight_graph_ops(nodes, modes=("inf",))
    assert set(ops["mode"]) == {"inf"} and set(ops["direction"]) == {"fwd"}
    assert ops["device_name"].nunique() == 5


def test_errors_name_the_problem(nodes, tmp_path):
    with pytest.raises(InputError, match="modes: unknown mode"):
        neusight_graph_ops(nodes, modes=("training",))
    with pytest.raises(InputError, match="missing column"):
        neusight_graph_ops(nodes.drop(columns=["output_shape"]))
    with pytest.raises(InputError, match="nowhere.parquet: cannot read"):
        load_neusight_graph_nodes(tmp_path / "nowhere.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    with pytest.raises(InputError, match="bad.parquet: cannot read"):
        load_neusight_graph_nodes(bad)


def test_graph_ops_join_the_training_data():
    from learnedperf.models.gbdt import load_op_training_data

    df = load_op_training_data(measured_dirs=[], neusight=False, neusight_graphs=True)
    assert set(df["provenance"]) == {"neusight_graphs"} and set(df["device_name"]) == {"V100-PCIE-32GB"}
    assert df.attrs["skipped"]["neusight_graphs: no kernel (view, shape query or Python value)"] > 0


def test_inference_no_ops_are_not_costed(nodes):
    # OPT: contiguous() after a transpose copies; contiguous() of lm_head's fresh output does not;
    # eval-mode dropout is the identity
    ops, unmapped = neusight_graph_ops(nodes[nodes["run"] == "opt_13-inf-2048-2"], modes=("inf",))
    t4 = ops[ops["device_name"] == "T4"]
    assert "contiguous" in set(t4["node_name"]) and "contiguous_3" not in set(t4["node_name"])
    assert not t4["op"].isin(["dropout"]).any()
    reasons = unmapped[unmapped["device"] == "Tesla T4"].groupby("reason")["nodes"].sum()
    assert reasons["contiguous() of a contiguous tensor (no kernel)"] == 1
    assert reasons["no kernel (dropout in inference is the identity)"] >= 1
