"""fp8 recipes (Transformer Engine): the layers' linear layers run in fp8 after a cast of each input and
of each output gradient, attention's products, the router and the LM head stay bf16, and each weight is
cast once a step. Byte counts checked against the cast kernels' closed form."""

from __future__ import annotations

import pytest

from conftest import A100_LIKE, LLAMA_GQA, MOE, make_run
from learnedperf.graph.execution import compile_run
from learnedperf.graph.transformer import optimizer_ops

LINEARS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
# the inline test device with an fp8 peak (an H100-like doubling of bf16's)
FP8_DEVICE = dict(A100_LIKE, peak_tflops=dict(A100_LIKE["peak_tflops"], fp8=2 * A100_LIKE["peak_tflops"]["bf16"]))


def fp8_run(model: dict, precision: str = "fp8"):
    return make_run(model, num_devices=1, device=FP8_DEVICE, precision=precision, micro_batch_size=1,
                    global_batch_size=1)


def chunk_ops(run, phase_blocks: str = "forward") -> dict:
    chunk = compile_run(run).stages[0].chunks[0]
    return {op.name: op for blk, _ in getattr(chunk, phase_blocks) for op in blk}


def test_each_linear_input_is_cast_to_fp8_and_nothing_else_is():
    run = fp8_run(LLAMA_GQA)
    ops = chunk_ops(run)
    for tag in LINEARS:
        gemm, cast = ops[f"layer.{tag}"], ops[f"layer.{tag}.fp8_cast"]
        _b, m, _n, k = gemm.shape
        assert gemm.dtype == "fp8"
        # cast_transpose: 2 bytes read, the fp8 copy and its transpose written (1 + 1) per input element;
        # after a norm or an activation only the transpose (1 read, 1 written): attention's output alone
        # is cast whole
        assert (cast.kind, cast.bytes) == ("elementwise", (4.0 if tag == "attn.proj" else 2.0) * m * k)
    assert ops["head.logits"].dtype == "bf16"  # the output layer stays bf16
    assert sum(name.endswith(".fp8_cast") for name in ops) == len(LINEARS)
    bf16 = chunk_ops(fp8_run(LLAMA_GQA, "bf16"))
    assert not [name for name in bf16 if "fp8" in name]


def test_each_fp8_gemm_casts_its_output_gradient_once_and_input_casts_have_no_backward():
    run = fp8_run(LLAMA_GQA)
    fwd, bwd = chunk_ops(run), chunk_ops(run, "backward")
    for tag in LINEARS:
        _b, m, n, _k = fwd[f"layer.{tag}"].shape
        assert bwd[f"layer.{tag}.grad_fp8_cast"].bytes == 4.0 * m * n
        assert f"layer.{tag}.fp8_cast.bwd" not in bwd
    assert "head.logits.grad_fp8_cast" not in bwd


def test_moe_router_stays_bf16_and_experts_cast_their_routed_tokens():
    run = fp8_run(MOE)
    ops = chunk_ops(run)
    assert ops["moe_layer.moe.router"].dtype == "bf16"
    assert "moe_layer.moe.router.fp8_cast" not in ops
    fc1 = ops["moe_layer.mlp.fc1"]
    experts, rows, _n, h = fc1.shape
    assert ops["moe_layer.mlp.fc1.fp8_cast"].bytes == 4.0 * experts * rows * h  # dispatched, not normed
    assert ops["moe_layer.mlp.fc2.fp8_cast"].bytes == 2.0 * experts * rows * ops["moe_layer.mlp.fc2"].shape[3]


@pytest.mark.parametrize("optimizer, bf16_bytes", [("adam", 16 + 12 + 2 + 4), ("sgd", 12 + 4)])
def test_optimizer_step_casts_each_weight_once(optimizer, bf16_bytes):
    (bf16,) = optimizer_ops(1000, optimizer, "bf16")
    (fp8,) = optimizer_ops(1000, optimizer, "fp8")
    assert bf16.bytes == 1000 * bf16_bytes
    # the same bf16 weight copy, and one cast_transpose of every weight a step
    assert fp8.bytes == bf16.bytes + 1000 * 4


@pytest.mark.parametrize("tp, sp", [(1, False), (2, True)])
def test_saved_gemm_inputs_take_one_byte(tp, sp):
    from learnedperf.simulate.memory import layer_activation_bytes

    def run(precision):
        return make_run(LLAMA_GQA, num_devices=tp, device=FP8_DEVICE, precision=precision, tp=tp,
                        sequence_parallel=sp, micro_batch_size=2, global_batch_size=2)

    # Transformer Engine keeps the QKV and FC1 inputs (the norms' fp8 outputs), the projection's input and the
    # FC2 input in fp8 for the weight gradients: one byte an element less than bf16 for each; Q, K, V, the
    # norms' inputs and the activation's input stay bf16
    T, h, f = 2 * LLAMA_GQA["seq_length"], LLAMA_GQA["hidden_size"], LLAMA_GQA["ffn_hidden_size"]
    saved = 2 * T * h / (tp if sp else 1) + T * (h + f) / tp
    assert layer_activation_bytes(run("bf16")) - layer_activation_bytes(run("fp8")) == pytest.approx(saved)
