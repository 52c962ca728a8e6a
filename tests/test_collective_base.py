"""A collective call's fixed time (``collective_base_us``): added once to every kind, charged on catalog links
only, and fitted by the all-reduce calibration from tables whose constants are known."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import KNOWN_PARAMS
from learnedperf.cost.calibrate import fit_nvlink_allreduce_base
from learnedperf.cost.collective import collective_cost
from learnedperf.cost.roofline import RooflineCost
from learnedperf.graph.ops import Group, comm
from learnedperf.specs import RunSpec
from learnedperf.units import MiB

A_INTRA, A_INTER, BW_INTRA, BW_INTER = 3e-6, 11e-6, 240e9, 20e9
BASE = 37e-6

#: (kind, bytes, group size, ranks per node): a ring in a node, rings and trees across nodes, the others
CASES = [("allreduce", 64 * MiB, 8, 8), ("allreduce", 64 * MiB, 16, 8), ("allreduce", 1024.0, 512, 8),
         ("allgather", 8 * MiB, 32, 8), ("reducescatter", 8 * MiB, 4, 4), ("alltoall", 8 * MiB, 16, 8),
         ("alltoall", 8 * MiB, 8, 8), ("p2p", 8 * MiB, 2, 1), ("p2p", 8 * MiB, 4, 4)]


@pytest.mark.parametrize("kind,nbytes,size,per_node", CASES)
def test_the_base_is_added_once_to_every_kind(kind, nbytes, size, per_node):
    op = comm("x", kind, "bwd", nbytes, Group(size, per_node), "fp32")
    plain = collective_cost(op, A_INTRA, A_INTER, BW_INTRA, BW_INTER)
    based = collective_cost(op, A_INTRA, A_INTER, BW_INTRA, BW_INTER, BASE)
    assert based.latency_s == pytest.approx(plain.latency_s + BASE, rel=1e-12)
    # the same algorithm (ring or tree: the base is common to both) and the same bytes
    assert (based.algorithm, based.intra_bytes, based.inter_bytes) == \
        (plain.algorithm, plain.intra_bytes, plain.inter_bytes)


def test_a_trivial_group_pays_no_base():
    for op in (comm("x", "allreduce", "bwd", 64 * MiB, Group(1, 1), "fp32"),
               comm("x", "allreduce", "bwd", 0.0, Group(8, 8), "fp32")):
        c = collective_cost(op, A_INTRA, A_INTER, BW_INTRA, BW_INTER, BASE)
        assert (c.latency_s, c.intra_bytes, c.inter_bytes) == (0.0, 0.0, 0.0)


def _hardware(**links):
    return RunSpec.from_dict({"model": "gpt3-125m", "hardware": {"cluster": "dgx-a100", "num_devices": 8, **links},
                              "strategy": {"micro_batch_size": 1, "global_batch_size": 8}}).hardware


def test_catalog_links_pay_the_base_measured_latencies_do_not():
    params = replace(KNOWN_PARAMS, collective_base_us=40.0, alpha_intra_us=2.0)
    op = comm("x", "allreduce", "bwd", 25 * MiB, Group(8, 8), "fp16")
    # the cluster's links from the catalog: the shipped constants, base and per-step latency
    assert RooflineCost(_hardware(), params).comm_cost(op).latency_s == pytest.approx((40.0 + 14 * 2.0) * 1e-6)
    # a link latency stated by the run (fit_link's two terms, the fixed time folded into α): no base
    measured = RooflineCost(_hardware(intra_node_latency_us=6.0, intra_node_bandwidth_GBps=200.0), params)
    assert measured.comm_cost(op).latency_s == pytest.approx(14 * 6.0 * 1e-6)


def _write_tables(root, base_us, alpha_us, eff, link_Bps, noise=None):
    """vTrain-layout all-reduce tables (2-8 GPUs, 1 MB - 1 GB; every half octave, where vTrain's step by
    1 MB: the same range in a tenth of a second's fit) made from known constants."""
    folder = root / "vtrain" / "trace" / "a100"
    folder.mkdir(parents=True)
    sizes = np.unique(np.round(2 ** np.arange(0.0, 10.01, 0.5))).astype(np.int64) * 2**20
    rng = np.random.default_rng(0)
    for n in range(2, 9):
        t = (base_us + 2 * (n - 1) * alpha_us) * 1e-6 + 2 * (n - 1) / n * sizes / (link_Bps * eff)
        if noise:
            t = t * np.exp(rng.normal(0.0, noise, len(t)))
        lines = ["size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)"]
        lines += [f"{s},{s // 4},float,{x * 1e9:.1f},0,{x * 1e9:.1f},0" for s, x in zip(sizes, t)]
        (folder / f"AR_GPU{n}_1M_1024M_LUT").write_text("\n".join(lines) + "\n")


def test_the_fit_recovers_the_constants_of_its_tables(tmp_path):
    from learnedperf.catalog import get_device

    link = get_device("A100-SXM4-80GB")["intra_node_bandwidth_GBps"] * 1e9
    # constants on the fit's grid: recovered exactly, with no error left
    _write_tables(tmp_path, 23.0, 3.5, 0.82, link)
    fit = fit_nvlink_allreduce_base(tmp_path)
    assert (fit["base_us"], fit["alpha_us"], fit["eff"]) == pytest.approx((23.0, 3.5, 0.82))
    assert fit["_mean_abs_log_error"] == pytest.approx(0.0, abs=1e-5)
    # with the base held at 0 (the shipped two-term form) the tables cannot be fitted exactly
    two = fit_nvlink_allreduce_base(tmp_path, base_grid_us=[0.0])
    assert two["base_us"] == 0.0 and two["_mean_abs_log_error"] > 0.02


def test_the_fit_tells_the_base_from_the_per_step_latency_under_noise(tmp_path):
    from learnedperf.catalog import get_device

    link = get_device("A100-SXM4-80GB")["intra_node_bandwidth_GBps"] * 1e9
    # 3 % log-normal noise on every row: the two latencies still come apart (a fit of one latency term
    # alone, the model before, would have to put the base into α: 23 + 14·3.5 = 72 µs at 8 GPUs, 30 at 2)
    _write_tables(tmp_path, 23.0, 3.5, 0.82, link, noise=0.03)
    fit = fit_nvlink_allreduce_base(tmp_path)
    assert fit["base_us"] == pytest.approx(23.0, abs=3.0)
    assert fit["alpha_us"] == pytest.approx(3.5, abs=0.5)
    assert fit["eff"] == pytest.approx(0.82, abs=0.02)
