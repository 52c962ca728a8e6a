"""Runs of Hugging Face models as single-GPU profilers time them: eval-mode forwards, classification heads, eager
attention and GPT-2's written-out GELU.

Dropout is the identity in an inference or evaluation forward (``forward_only``); a ``*ForSequenceClassification``
model (``lm_head`` false) has no vocabulary projection or loss; NeuSight's runs are of this kind. The expected
values are closed forms of the shapes, or read from NeuSight's traced graphs (``../shared/data``), which are
independent of the loader that builds the runs.
"""

from __future__ import annotations

import json

import pytest

from conftest import GPT_SMALL, LLAMA_GQA, make_run
from learnedperf.graph.execution import compile_run
from learnedperf.graph.ops import Group
from learnedperf.graph.transformer import (EAGER_GELU_NEW, EAGER_SOFTMAX, EAGER_SOFTMAX_CAUSAL, head_forward,
                                           layer_forward, shard_for)
from learnedperf.measure.public import default_shared_data
from learnedperf.simulate.memory import peak_memory_of
from learnedperf.specs import ModelSpec, RunSpec

BERT = {"name": "bert-l", "arch": "bert", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
        "vocab_size": 30522, "seq_length": 512}


def _forward(run):
    sh = shard_for(run, Group(1, 1), Group(1, 1), Group(1, 1))
    return [op.name for op in layer_forward(run.model, sh)]


@pytest.mark.parametrize("model", [GPT_SMALL, BERT])
def test_an_inference_forward_runs_no_dropout(model):
    kw = dict(precision="fp32", flash_attention=False, optimizer="none")
    train, infer = _forward(make_run(model, **kw)), _forward(make_run(model, forward_only=True, **kw))
    assert "layer.attn.dropout" in train
    assert [n for n in train if n != "layer.attn.dropout"] == infer


def test_a_classification_head_runs_its_pooler_not_the_vocabulary():
    run = make_run({**BERT, "lm_head": False}, micro_batch_size=8, precision="fp32")
    sh = shard_for(run, Group(1, 1), Group(1, 1), Group(1, 1))
    ops = {op.name: op for op in head_forward(run.model, sh)}
    assert set(ops) == {"head.layernorm", "head.pooler"}
    h = BERT["hidden_size"]
    # the pooler: an h x h GEMM over each sequence's first token
    assert (ops["head.pooler"].flops, ops["head.pooler"].shape) == (2.0 * 8 * h * h, (1, 8, h, h))
    lm = {op.name for op in head_forward(make_run(BERT, micro_batch_size=8, precision="fp32").model, sh)}
    assert {"head.logits", "head.cross_entropy"} <= lm
    # no table gradient is added for a head that does not exist: the tied embedding's backward is the lookup's
    bwd = {op.name for c in compile_run(run).stages[0].chunks for ops_, _ in c.backward for op in ops_}
    assert "embedding.tied_grad_add" not in bwd and "embedding.grad_zero" in bwd


def test_a_classification_head_holds_no_output_matrix_and_no_logits():
    h, V, T = LLAMA_GQA["hidden_size"], LLAMA_GQA["vocab_size"], 2 * LLAMA_GQA["seq_length"]
    lm, cls = ModelSpec.parse(LLAMA_GQA), ModelSpec.parse({**LLAMA_GQA, "lm_head": False})
    assert lm.num_params() - cls.num_params() == V * h  # Llama's untied output matrix
    kw = dict(micro_batch_size=2, global_batch_size=2, precision="fp32", optimizer="none")
    a, b = peak_memory_of(make_run(LLAMA_GQA, **kw)), peak_memory_of(make_run({**LLAMA_GQA, "lm_head": False}, **kw))
    assert a.weights - b.weights == V * h * 4
    # the fp32 logits and their gradient of one micro-batch
    assert a.temporary - b.temporary == 2 * 4 * T * V


def test_lm_head_is_left_out_at_its_default_and_round_trips():
    from learnedperf.measure.records import run_id

    plain = make_run(BERT).to_dict()
    assert "lm_head" not in plain["model"]
    cls = make_run({**BERT, "lm_head": False})
    assert cls.to_dict()["model"]["lm_head"] is False
    assert RunSpec.from_dict(json.loads(json.dumps(cls.to_dict()))) == cls
    assert run_id(plain) != run_id(cls.to_dict())


def test_hf_configs_name_their_head_and_their_gelu():
    cfg = {"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
           "intermediate_size": 4096, "vocab_size": 30522, "max_position_embeddings": 512, "hidden_act": "gelu"}
    assert ModelSpec.from_hf_config(cfg).lm_head
    seq = ModelSpec.from_hf_config({**cfg, "architectures": ["BertForSequenceClassification"]})
    assert not seq.lm_head and seq.activation == "gelu"
    gpt2 = {"model_type": "gpt2", "n_embd": 1280, "n_layer": 36, "n_head": 20, "vocab_size": 50257,
            "n_positions": 1024, "activation_function": "gelu_new"}
    assert ModelSpec.from_hf_config(gpt2).activation == "gelu_new"
    assert ModelSpec.from_hf_config({**gpt2, "activation_function": "gelu_pytorch_tanh"}).activation == "gelu"


# ------------------------------------------------------------------ NeuSight's runs and their traced graphs
SHARED = default_shared_data()
_needed = [SHARED / n for n in ("neusight_step_times.csv", "neusight_graph_nodes.parquet", "neusight_devices.csv")]
_missing = [str(p) for p in _needed if not p.exists()]
needs_shared = pytest.mark.skipif(bool(_missing), reason=f"public data not available: {', '.join(_missing)}")


@pytest.fixture(scope="module")
def graphs():
    from learnedperf.measure.public import load_neusight_graph_nodes

    return load_neusight_graph_nodes()


@pytest.fixture(scope="module")
def steps():
    from learnedperf.measure.public import load_neusight_steps

    return load_neusight_steps().records


@needs_shared
def test_neusight_runs_have_the_head_their_graphs_end_in(graphs, steps):
    # a run's traced graph has a 'classifier' node exactly where the loader gave the model a classification head
    classifier = set(graphs.loc[graphs["name"] == "classifier", "run"])
    seen = 0
    for s in steps:
        run = json.loads(s["run"])
        traced = {r for r in set(graphs["run"]) if run["id"].endswith("-" + r)}
        if not traced:
            continue
        seen += 1
        head = RunSpec.from_dict(run).model.lm_head
        assert head == (not (traced & classifier)), run["id"]
        # HF models in eager PyTorch, the fused attention kernel off
        assert run["strategy"]["fused_elementwise"] is False and run["strategy"]["flash_attention"] is False
    assert seen >= 30


def _between(block, first, last):
    rows = block.reset_index(drop=True)
    i = rows.index[rows["name"] == first][0]
    j = rows.index[rows["name"] == last][0]
    return rows.iloc[i + 1:j]


@needs_shared
def test_the_traced_eager_chains_have_the_kernels_of_the_model(graphs):
    # GPT-2's block on the T4, as traced: between the scores' product and the context's, the scaling by a
    # scalar tensor and the causal where with its fill value (both made by torch.full), then softmax (dropout is
    # no kernel in inference); between the MLP's two GEMMs, NewGELUActivation's eight tensor operations.
    # BERT's: the scaling, the padding mask and softmax. Python scalars, shape queries, views and no-op casts
    # are no kernels.
    def kernels(nodes, shape):
        return int(((nodes["target_op"] == "torch.full")
                    | nodes["output_shape"].apply(lambda o: list(o) == shape)
                    & ~nodes["target_op"].isin([".to", ".type", ".view", "Dropout", "getitem"])).sum())

    run = graphs[(graphs["run"] == "gpt2_large-inf-1024-4") & (graphs["device"] == "Tesla T4") & graphs["in_layer"]]
    assert kernels(_between(run, "matmul", "matmul_1"), [4, 20, 1024, 1024]) == EAGER_SOFTMAX_CAUSAL[0]
    assert kernels(_between(run, "addmm_2", "addmm_3"), [4, 1024, 5120]) == EAGER_GELU_NEW[0]
    bert = graphs[(graphs["run"] == "bert_large-inf-512-8") & (graphs["device"] == "Tesla T4") & graphs["in_layer"]]
    assert kernels(_between(bert, "matmul", "matmul_1"), [8, 16, 512, 512]) == EAGER_SOFTMAX[0]
