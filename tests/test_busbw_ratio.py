"""Measured bus bandwidth of a collective relative to all-reduce (``hardware.collective_busbw_ratio``):
the spec, the cost model, the fit from benchmark records, and the committed CPU records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from learnedperf.cost import RooflineCost
from learnedperf.cost.params import CostParams
from learnedperf.errors import InputError, SpecError
from learnedperf.graph.ops import Group, comm
from learnedperf.measure.bench import fit_busbw_ratios, fit_link
from learnedperf.specs import RunSpec

ROOT = Path(__file__).resolve().parents[1]
CPU_DATA = ROOT / "datasets" / "measured" / "vm-xeon-2c"
ALPHA_US, BW_GBPS = 40.0, 2.0  # one node's links, as a run gives them


def _hw(ratios=None, **extra):
    hw = {"cluster": "dgx-a100", "num_devices": 8, "intra_node_latency_us": ALPHA_US,
          "intra_node_bandwidth_GBps": BW_GBPS, **extra}
    if ratios is not None:
        hw["collective_busbw_ratio"] = ratios
    return RunSpec.from_dict({"model": "gpt3-125m", "hardware": hw,
                              "strategy": {"micro_batch_size": 1, "global_batch_size": 8}}).hardware


# ------------------------------------------------------------------------------ spec
def test_ratios_round_trip_and_default_to_one():
    hw = _hw({"allgather": 0.5, "p2p": 2.0})
    assert hw.busbw_ratio("allgather") == 0.5 and hw.busbw_ratio("p2p") == 2.0
    assert hw.busbw_ratio("reducescatter") == 1.0 and hw.busbw_ratio("allreduce") == 1.0
    assert hw.to_dict()["collective_busbw_ratio"] == {"allgather": 0.5, "p2p": 2.0}
    # absent: not written (old runs keep their canonical form and run_id)
    assert "collective_busbw_ratio" not in _hw().to_dict()


@pytest.mark.parametrize("ratios, field, message", [
    ({"allgathr": 0.5}, "collective_busbw_ratio.allgathr", "unknown collective"),
    ({"allreduce": 0.5}, "collective_busbw_ratio.allreduce", "unknown collective"),  # the reference itself
    ({"allgather": 0}, "collective_busbw_ratio.allgather", r"\(0, 10\]"),
    ({"allgather": 11.0}, "collective_busbw_ratio.allgather", r"\(0, 10\]"),
    ({"allgather": "0.5"}, "collective_busbw_ratio.allgather", "valid number"),
    ([0.5], "collective_busbw_ratio", "dictionary"),
])
def test_bad_ratios_name_the_field(ratios, field, message):
    with pytest.raises(SpecError, match=message) as err:
        _hw(ratios)
    assert err.value.field == f"hardware.{field}"


# ------------------------------------------------------------------------------ cost
@pytest.mark.parametrize("kind, volume", [("allgather", 7 / 8), ("reducescatter", 7 / 8), ("alltoall", 7 / 8)])
def test_cost_moves_bytes_at_the_ratio_of_the_link(kind, volume):
    """8 ranks in one node, S bytes: ring volume (n-1)/n·S (all-to-all (k-1)/n·S) at B·ratio."""
    S, r = 64e6, 0.25
    params = CostParams(link_efficiency_intra=1.0)
    op = comm("x", kind, "bwd", S, Group(8, 8), "fp32")
    plain = RooflineCost(_hw(), params).comm_time_s(op)
    slow = RooflineCost(_hw({kind: r}), params).comm_time_s(op)
    latency = 7 * ALPHA_US * 1e-6
    assert plain == pytest.approx(latency + volume * S / (BW_GBPS * 1e9), rel=1e-9)
    assert slow == pytest.approx(latency + volume * S / (BW_GBPS * 1e9 * r), rel=1e-9)
    # all-reduce is the reference: unchanged by any ratio
    ar = comm("y", "allreduce", "bwd", S, Group(8, 8), "fp32")
    assert RooflineCost(_hw({kind: r}), params).comm_time_s(ar) == RooflineCost(_hw(), params).comm_time_s(ar)


# ------------------------------------------------------------------------------ fit
def _synthetic(p: int, ratios: dict, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """Records of the cost model's α-β ring on p ranks: all-reduce at B, others at B·ratio."""
    rng = np.random.default_rng(seed)
    alpha, bw = ALPHA_US * 1e-6, BW_GBPS * 1e9
    out = []
    for s in np.logspace(12, 26, 15, base=2):
        times = {"allreduce": 2 * (p - 1) * alpha + 2 * (p - 1) / p * s / bw}
        for op, r in ratios.items():
            times[op] = (p - 1) * alpha + (p - 1) / p * s / (bw * r)
        for op, t in times.items():
            out.append({"op": op, "kind": op, "world_size": p, "bytes": float(s),
                        "time_ms": t * (1 + noise * rng.standard_normal()) * 1e3})
    return out


def test_fit_recovers_known_ratios():
    recs = _synthetic(4, {"allgather": 0.5, "reducescatter": 0.3})
    link = fit_link(recs, 4)
    assert link["intra_node_latency_us"] == pytest.approx(ALPHA_US, rel=1e-6)
    assert fit_busbw_ratios(recs, link, 4) == {"allgather": 0.5, "reducescatter": 0.3}
    noisy = _synthetic(4, {"allgather": 0.5, "reducescatter": 0.3}, noise=0.03, seed=1)
    got = fit_busbw_ratios(noisy, fit_link(noisy, 4), 4)
    assert got["allgather"] == pytest.approx(0.5, rel=0.05) and got["reducescatter"] == pytest.approx(0.3, rel=0.05)


def test_fit_skips_kinds_without_bandwidth_bound_sizes_and_refuses_flat_times():
    recs = _synthetic(2, {"allgather": 0.5})
    link = fit_link(recs, 2)
    # only latency-bound all-gathers (4 KiB: volume term far below the latency term): nothing to fit
    small = [r for r in recs if r["op"] != "allgather" or r["bytes"] <= 4096]
    assert fit_busbw_ratios(small, link, 2) == {}
    flat = [r for r in recs if r["op"] == "allreduce"] + [
        {"op": "allgather", "world_size": 2, "bytes": s, "time_ms": 1e-3} for s in (1e8, 2e8)]
    with pytest.raises(InputError, match="allgather times do not grow"):
        fit_busbw_ratios(flat, link, 2)


# ------------------------------------------------------------------------------ committed records
def test_committed_cpu_steps_carry_the_fit_of_their_collectives():
    import pandas as pd

    manifest = json.loads((CPU_DATA / "manifest.json").read_text())
    comm_recs = pd.read_parquet(CPU_DATA / "ops_cpu_collectives.parquet").to_dict("records")
    steps = pd.read_parquet(CPU_DATA / "steps_cpu.parquet")
    # the collection that measured the steps (and the collectives they carry)
    collection = next(c for c in reversed(manifest["collections"]) if "steps_cpu.parquet" in c["files"])
    links = collection["links"]
    # ratios compare like with like: each collective against the all-reduce, both after a barrier
    barrier = {w: fits["barrier_median"] for w, fits in collection["link_fits"].items()}
    seen = 0
    for text in steps["run"]:
        hw = json.loads(text)["hardware"]
        w = hw["num_devices"]
        if w == 1:
            assert "collective_busbw_ratio" not in hw
            continue
        link = links[str(w)]
        fit = fit_busbw_ratios([r for r in comm_recs if r["world_size"] == w], barrier[str(w)], w)
        assert hw["collective_busbw_ratio"] == fit == link["collective_busbw_ratio"]
        assert hw["intra_node_latency_us"] == link["intra_node_latency_us"]
        seen += 1
    assert seen == 94
    # gloo's reduce-scatter is far below ring speed relative to its all-reduce (a third, not 1)
    assert all(links[w]["collective_busbw_ratio"]["reducescatter"] < 0.5 for w in links)
