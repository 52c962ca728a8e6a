"""Token permutation in MoE layers (Megatron-Core's ``moe_utils.permute`` / ``unpermute`` and the alltoall
dispatcher's ``sort_chunks_by_idxs``): memory-bound ops whose bytes follow from the rows they move, checked
against closed forms."""

from __future__ import annotations

import pytest

from conftest import MOE, make_run
from learnedperf.graph.execution import compile_run
from learnedperf.specs import RunSpec

MOE16 = dict(MOE, num_experts=16, moe_top_k=4)
H = MOE["hidden_size"]


def _ops(run: RunSpec, phase: str = "forward") -> list:
    eg = compile_run(run, 1)
    return [op for blk, _ in getattr(eg.stages[0].chunks[0], phase) for op in blk if op.name.startswith("moe_layer")]


def _by_name(ops: list) -> dict:
    return {op.name: op for op in ops}


def test_permute_and_unpermute_move_every_token_copy_once():
    # one rank, bf16: T = 2·2048 tokens, k = 2 copies each
    run = make_run(MOE, micro_batch_size=2, global_batch_size=2, precision="bf16")
    T, k, e = 2 * 2048, 2, 2
    ops = _by_name(_ops(run))
    # the gather reads and writes each copy's row once
    assert ops["moe_layer.moe.permute"].bytes == pytest.approx(2 * T * k * H * e, rel=1e-12)
    assert ops["moe_layer.moe.permute"].flops == 0.0
    # the scatter-add reads each copy's row and zero-fills, reads and writes each of the T output rows
    assert ops["moe_layer.moe.unpermute"].bytes == pytest.approx((T * k + 3 * T) * H * e, rel=1e-12)
    assert ops["moe_layer.moe.unpermute"].flops == pytest.approx(T * k * H, rel=1e-12)
    # without expert parallelism nothing is regrouped by source rank
    assert not [n for n in ops if "sort_chunks" in n]


def test_the_permutations_surround_the_experts():
    names = [op.name for op in _ops(make_run(MOE16, num_devices=4, ep=4, micro_batch_size=1, global_batch_size=4))]
    order = ["moe_layer.moe.permute", "moe_layer.moe.dispatch", "moe_layer.moe.sort_chunks", "moe_layer.mlp.fc1",
             "moe_layer.mlp.fc2", "moe_layer.moe.unsort_chunks", "moe_layer.moe.combine",
             "moe_layer.moe.weighted_sum", "moe_layer.moe.unpermute"]
    assert [n for n in names if n in order] == order


@pytest.mark.parametrize("ep, regrouped", [(4, True), (16, False)])
def test_received_rows_are_regrouped_only_for_several_local_experts(ep, regrouped):
    # 16 experts over ep 4: four per rank, whose rows arrive grouped by source rank; over ep 16, one per rank
    run = make_run(MOE16, num_devices=ep, ep=ep, micro_batch_size=1, global_batch_size=ep, precision="bf16")
    ops = _by_name(_ops(run))
    T, k, e = 2048, 4, 2
    names = ("moe_layer.moe.sort_chunks", "moe_layer.moe.unsort_chunks")
    if regrouped:
        for name in names:
            assert ops[name].bytes == pytest.approx(2 * T * k * H * e, rel=1e-12)
    else:
        assert not any(n in ops for n in names)


def test_capacity_padding_moves_the_padded_rows():
    kw = dict(num_devices=4, ep=4, micro_batch_size=1, global_batch_size=4, precision="fp32")
    a = _by_name(_ops(make_run(MOE16, **kw)))
    b = _by_name(_ops(make_run(MOE16, moe_capacity_factor=1.5, **kw)))
    for name in ("moe_layer.moe.permute", "moe_layer.moe.sort_chunks", "moe_layer.moe.unsort_chunks"):
        assert b[name].bytes == pytest.approx(1.5 * a[name].bytes, rel=1e-12)
    # the output's T rows do not grow: only the moved rows' part of the scatter-add does
    T, k, e = 2048, 4, 4
    assert b["moe_layer.moe.unpermute"].bytes - a["moe_layer.moe.unpermute"].bytes == pytest.approx(
        0.5 * T * k * H * e, rel=1e-12)


def test_backward_moves_the_gradients_back():
    run = make_run(MOE, micro_batch_size=1, global_batch_size=1)
    fwd, bwd = _by_name(_ops(run)), _by_name(_ops(run, "backward"))
    for name in ("moe_layer.moe.permute", "moe_layer.moe.unpermute"):
        assert bwd[f"{name}.bwd"].bytes == pytest.approx(2 * fwd[name].bytes, rel=1e-12)


def test_deepep_permutes_once_and_regroups_nothing():
    # Megatron-Core's flex dispatcher hands DeepEP the unpermuted tokens and permutes the received rows into
    # local-expert order once: the same rows moved as the alltoall dispatcher's permute, and no sort_chunks pair
    kw = dict(num_devices=4, ep=4, micro_batch_size=1, global_batch_size=4, precision="bf16")
    a2a = _by_name(_ops(make_run(MOE16, **kw)))
    deepep = _by_name(_ops(make_run(MOE16, moe_dispatcher="deepep", **kw)))
    assert not [n for n in deepep if "sort_chunks" in n]
    T, k, e = 2048, 4, 2
    for name in ("moe_layer.moe.permute", "moe_layer.moe.unpermute"):
        assert deepep[name].bytes == a2a[name].bytes
    assert deepep["moe_layer.moe.permute"].bytes == pytest.approx(2 * T * k * H * e, rel=1e-12)
