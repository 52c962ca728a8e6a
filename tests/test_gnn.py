"""Graph features and the GNN iteration-time regressor.

The graphs are real: small inline GPT runs compiled and costed (``graph_of``) and simulated, so the
features come from the same code path as the generated data set. Targets are synthetic with a known
answer (a fixed correction of the simulator, the total node time), which the tiny models must learn.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from learnedperf.cost import RooflineCost
from learnedperf.data.graphs import EDGE_TYPES, graph_of
from learnedperf.data.records import RECORD_COLUMNS
from learnedperf.errors import InputError
from learnedperf.features import (EDGE_FEATURE_SCHEMA, GLOBAL_FEATURE_SCHEMA, GRAPH_FEATURE_SCHEMA_VERSION,
                                  NODE_FEATURE_SCHEMA, SIMULATOR_GLOBAL_FEATURES, edge_feature_matrix,
                                  global_feature_vector, global_features_from_record, graph_feature_schema_dict,
                                  node_feature_matrix)
from learnedperf.features.graph import BREAKDOWN_PARTS
from learnedperf.graph.execution import compile_run
from learnedperf.graph.transformer import model_flops_per_iteration
from learnedperf.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from conftest import A100_LIKE, GPT_SMALL, hardware, make_run  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")
from learnedperf.models.gnn import (MEMBER_SEED_STEP, GNNRegressor, GraphSample, IterationGNN,  # noqa: E402
                                    NodeBudgetBatches, make_sample)

TINY = dict(hidden=16, num_layers=2, batch_size=12, lse_channels=2)

#: (devices, strategy) of the test runs: a spread of tp / pp / dp / recompute / ZeRO on 8-16 devices.
STRATEGIES = [
    (8, dict(tp=1, pp=1, global_batch_size=16)),
    (8, dict(tp=1, pp=2, global_batch_size=16)),
    (8, dict(tp=1, pp=1, zero_stage=3, global_batch_size=32)),
    (8, dict(tp=1, pp=4, micro_batch_size=2, global_batch_size=32)),
    (8, dict(tp=1, pp=1, recompute="full", global_batch_size=8)),
    (16, dict(tp=1, pp=2, zero_stage=1, global_batch_size=64)),
    (8, dict(tp=2, pp=1, global_batch_size=16)),
    (8, dict(tp=2, pp=2, global_batch_size=16)),
    (8, dict(tp=4, pp=1, sequence_parallel=True, global_batch_size=8)),
    (16, dict(tp=2, pp=2, recompute="selective", global_batch_size=32)),
    (16, dict(tp=4, pp=2, pipeline_schedule="interleaved", virtual_pipeline_stages=2, global_batch_size=16)),
    (8, dict(tp=2, pp=1, precision="fp16", micro_batch_size=2, global_batch_size=16)),
]


@pytest.fixture(scope="module")
def runs():
    """(spec, graph, prediction) of every test run."""
    out = []
    for n, strat in STRATEGIES:
        spec = make_run(GPT_SMALL, n, **strat)
        graph = graph_of(compile_run(spec), RooflineCost(spec.hardware))
        out.append((spec, graph, simulate(spec).to_prediction()))
    return out


@pytest.fixture(scope="module")
def samples(runs):
    """One simulated GraphSample per run (target: the simulator's time)."""
    return [make_sample(g, spec, p["iteration_time_ms"], p["breakdown_ms"], y_ms=p["iteration_time_ms"])
            for spec, g, p in runs]


def _total_node_time_ms(graph) -> float:
    t = np.nan_to_num(graph["time_s"]) * graph["repeat"] * graph["per_iteration"]
    return float(t.sum()) * 1e3


# =================================================================== features
def test_schemas_are_named_versioned_and_described():
    d = graph_feature_schema_dict()
    assert d["version"] == GRAPH_FEATURE_SCHEMA_VERSION
    for schema in (NODE_FEATURE_SCHEMA, EDGE_FEATURE_SCHEMA, GLOBAL_FEATURE_SCHEMA):
        assert len(set(schema.names)) == len(schema.names)
        assert all(desc for _, desc in schema.features)
        assert schema.version == GRAPH_FEATURE_SCHEMA_VERSION
    assert set(SIMULATOR_GLOBAL_FEATURES) <= set(GLOBAL_FEATURE_SCHEMA.names)
    assert json.loads(json.dumps(d)) == d
    # every breakdown part is a record column, so records and live simulations give the same vector
    assert all(f"{p}_ms" in RECORD_COLUMNS for p in BREAKDOWN_PARTS)


def test_node_and_edge_matrices_have_schema_widths_and_are_finite(runs):
    for _spec, g, _p in runs:
        x = node_feature_matrix(g)
        e = edge_feature_matrix(g)
        assert x.dtype == np.float32 and x.shape == (g["num_nodes"], len(NODE_FEATURE_SCHEMA.features))
        assert e.shape == (g["edge_index"].shape[1], len(EDGE_TYPES)) and np.isfinite(x).all()
        # edge one-hots: exactly one 1 per row, at the edge type's code
        assert np.array_equal(e.sum(1), np.ones(len(e))) and np.array_equal(e.argmax(1), g["edge_type"])
        # node one-hots sum to 1 per row; the time shares sum to 1
        kinds = [NODE_FEATURE_SCHEMA.index(n) for n in NODE_FEATURE_SCHEMA.names if n.startswith("kind=")]
        assert np.allclose(x[:, kinds].sum(1), 1.0)
        share = np.exp(x[:, NODE_FEATURE_SCHEMA.index("log_time_share")].astype(np.float64))
        assert math.isclose(share.sum(), 1.0, rel_tol=1e-3)
        # without learned times the learned column repeats the cost model's
        lt, lc = NODE_FEATURE_SCHEMA.index("log_time_s"), NODE_FEATURE_SCHEMA.index("log_learned_time_s")
        assert np.array_equal(x[:, lt], x[:, lc])


def test_learned_times_and_unknown_times(runs):
    g = dict(runs[1][1])
    n = g["num_nodes"]
    learned = np.full(n, 2e-3)
    learned[0] = np.nan  # no learned time for node 0: the cost model's is used
    x = node_feature_matrix(g, learned)
    lc, lt = NODE_FEATURE_SCHEMA.index("log_learned_time_s"), NODE_FEATURE_SCHEMA.index("log_time_s")
    assert np.allclose(x[1:, lc], math.log(2e-3)) and x[0, lc] == x[0, lt]
    g["time_s"] = g["time_s"].copy()
    g["time_s"][:3] = np.nan
    x = node_feature_matrix(g)
    unk = NODE_FEATURE_SCHEMA.index("time_unknown")
    assert np.isfinite(x).all() and x.shape[1] == len(NODE_FEATURE_SCHEMA.features)
    assert list(x[:4, unk]) == [1, 1, 1, 0] and list(x[:3, lt]) == [0, 0, 0]
    with pytest.raises(InputError, match="learned_time_s"):
        node_feature_matrix(g, np.ones(n + 1))


def test_malformed_graphs_raise_input_error(runs):
    g = runs[0][1]
    with pytest.raises(InputError, match="missing array 'flops'"):
        node_feature_matrix({k: v for k, v in g.items() if k != "flops"})
    with pytest.raises(InputError, match="'repeat' has shape"):
        node_feature_matrix({**g, "repeat": g["repeat"][:-1]})
    with pytest.raises(InputError, match="'kind' codes"):
        node_feature_matrix({**g, "kind": np.full_like(g["kind"], 99)})
    with pytest.raises(InputError, match="'time_s'"):
        node_feature_matrix({**g, "time_s": -g["time_s"]})
    with pytest.raises(InputError, match="edge_index"):
        edge_feature_matrix({**g, "edge_index": g["edge_index"] + g["num_nodes"]})
    with pytest.raises(InputError, match="edge_type"):
        edge_feature_matrix({**g, "edge_type": g["edge_type"][:-1]})
    with pytest.raises(InputError, match="expected the dict"):
        node_feature_matrix([1, 2, 3])


def test_global_features_match_closed_forms(runs):
    spec, _g, p = runs[9]  # 16 devices, tp=2, pp=2, dp=4, selective recompute
    u = global_feature_vector(spec, p["iteration_time_ms"], p["breakdown_ms"])
    idx = GLOBAL_FEATURE_SCHEMA.index
    assert u.shape == (len(GLOBAL_FEATURE_SCHEMA.features),) and np.isfinite(u).all()
    assert math.isclose(u[idx("log_num_devices")], math.log(16), rel_tol=1e-6)
    assert math.isclose(u[idx("log_tp")], math.log(2), rel_tol=1e-6)
    assert math.isclose(u[idx("log_dp")], math.log(4), rel_tol=1e-6)
    assert math.isclose(u[idx("log_num_nodes")], math.log(2), rel_tol=1e-6)
    assert u[idx("recompute=selective")] == 1 and u[idx("recompute=none")] == 0
    assert math.isclose(u[idx("log_num_microbatches")], math.log(spec.num_microbatches), rel_tol=1e-6)
    ideal_s = model_flops_per_iteration(spec) / (16 * 312e12)  # bf16 peak of the A100-like device
    assert math.isclose(u[idx("log_ideal_time_s")], math.log(ideal_s), rel_tol=1e-5)
    assert math.isclose(u[idx("log_sim_time_ms")], math.log(p["iteration_time_ms"]), rel_tol=1e-6)
    assert math.isclose(u[idx("frac_compute")], p["breakdown_ms"]["compute"] / p["iteration_time_ms"],
                        rel_tol=1e-5)
    # FSDP counts as ZeRO-3
    fsdp = make_run(GPT_SMALL, 8, fsdp=True)
    u = global_feature_vector(fsdp, 10.0, {k: 1.0 for k in BREAKDOWN_PARTS})
    assert u[idx("zero_stage=3")] == 1 and u[idx("zero_stage=0")] == 0
    with pytest.raises(InputError, match="pipeline_bubble"):
        global_feature_vector(fsdp, 10.0, {k: 1.0 for k in BREAKDOWN_PARTS if k != "pipeline_bubble"})
    with pytest.raises(InputError, match="sim_time_ms"):
        global_feature_vector(fsdp, float("nan"), {k: 1.0 for k in BREAKDOWN_PARTS})


def test_unused_link_levels_read_as_absent():
    """A step cannot depend on links it does not use: the link features of a level the run leaves idle do not
    depend on the hardware's figure for it (and read as absent), those of a level it uses do; in the graph's global
    features and the surrogate's run features alike."""
    from learnedperf.features.run import RUN_FEATURE_SCHEMA, RunContext, run_features

    parts = {k: 1.0 for k in BREAKDOWN_PARTS}
    gidx, ridx = GLOBAL_FEATURE_SCHEMA.index, RUN_FEATURE_SCHEMA.index
    bare = {k: v for k, v in A100_LIKE.items() if not k.endswith("_node_bandwidth_GBps")}

    def both(n, per_node, with_links):
        # with links: 450 and 37.5 GB/s at every level; without: 300 and 25 where the run uses the level (a run
        # must name the links it uses), nothing where it does not
        hw_extra = ({"intra_node_bandwidth_GBps": 450.0, "inter_node_bandwidth_GBps": 37.5} if with_links else
                    {**({"intra_node_bandwidth_GBps": 300.0} if min(n, per_node) > 1 else {}),
                     **({"inter_node_bandwidth_GBps": 25.0} if n > per_node else {})})
        run = make_run(GPT_SMALL, n, per_node, device=bare, hw_extra=hw_extra)
        return (global_feature_vector(run, 10.0, parts),
                np.asarray(run_features(run, RunContext(run.model, run.hardware), 1.0)[0]))

    def same(a, b, names, schema_index):
        return all(np.array_equal(a[schema_index(n)], b[schema_index(n)], equal_nan=True) for n in names)

    g_names = ("log_intra_node_bw_Bps", "intra_node_bw_unknown", "log_inter_node_bw_Bps", "inter_node_bw_unknown")
    for n, per_node, intra_used, inter_used in ((1, 8, False, False), (4, 1, False, True), (8, 8, True, False),
                                                (16, 8, True, True)):
        (g1, r1), (g0, r0) = both(n, per_node, True), both(n, per_node, False)
        assert same(g1, g0, g_names[:2], gidx) == (not intra_used), (n, per_node)
        assert same(g1, g0, g_names[2:], gidx) == (not inter_used), (n, per_node)
        assert same(r1, r0, ("log_intra_bw",), ridx) == (not intra_used), (n, per_node)
        assert same(r1, r0, ("log_inter_bw",), ridx) == (not inter_used), (n, per_node)
        assert g0[gidx("intra_node_bw_unknown")] == g0[gidx("inter_node_bw_unknown")] == 0
        assert math.isclose(g1[gidx("log_intra_node_bw_Bps")], math.log(450e9) if intra_used else 0.0, rel_tol=1e-6)
        assert math.isclose(g1[gidx("log_inter_node_bw_Bps")], math.log(37.5e9) if inter_used else 0.0, rel_tol=1e-6)


def test_global_features_from_record(runs):
    spec, _g, p = runs[3]
    run = {"model": GPT_SMALL, "hardware": hardware(8), "strategy": dict(STRATEGIES[3][1])}
    row = {"run_id": "r1", "run": json.dumps(run), "sim_iteration_time_ms": p["iteration_time_ms"],
           **{f"{k}_ms": p["breakdown_ms"][k] for k in BREAKDOWN_PARTS}}
    assert np.array_equal(global_features_from_record(row),
                          global_feature_vector(spec, p["iteration_time_ms"], p["breakdown_ms"]))
    measured = {**row, "forward_ms": None}  # measured records carry no breakdown
    with pytest.raises(InputError, match="'forward_ms' is null"):
        global_features_from_record(measured)
    with pytest.raises(InputError, match="'recompute_ms' is null"):
        global_features_from_record({**row, "recompute_ms": float("nan")})
    with pytest.raises(InputError, match="missing column 'sim_iteration_time_ms'"):
        global_features_from_record({k: v for k, v in row.items() if k != "sim_iteration_time_ms"})
    with pytest.raises(InputError, match="'run'"):
        global_features_from_record({**row, "run": "{not json"})


# =================================================================== the network
def test_iteration_gnn_shapes_and_batching(samples):
    from torch_geometric.data import Batch, Data

    net = IterationGNN(len(NODE_FEATURE_SCHEMA.features), len(EDGE_FEATURE_SCHEMA.features),
                       len(GLOBAL_FEATURE_SCHEMA.features), hidden=8, num_layers=1)
    data = [Data(x=torch.from_numpy(s.node_x), edge_index=torch.from_numpy(s.edge_index),
                 edge_attr=torch.from_numpy(s.edge_attr), u=torch.from_numpy(s.global_x)[None]) for s in samples[:3]]
    b = Batch.from_data_list(data)
    assert net(b.x, b.edge_index, b.edge_attr, b.batch, b.u).shape == (3,)
    # batches by node budget: no batch over budget unless a single graph is
    nb = NodeBudgetBatches([50, 60, 3000, 40, 70], batch_size=4, max_nodes=120, shuffle=True, seed=1)
    batches = list(nb)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert all(len(b) == 1 or sum([50, 60, 3000, 40, 70][i] for i in b) <= 120 for b in batches)


def test_stacked_members_equal_each_member_in_turn(samples):
    from torch_geometric.data import Batch, Data

    from learnedperf.models.gnn import IterationGNNEnsemble

    dims = (len(NODE_FEATURE_SCHEMA.features), len(EDGE_FEATURE_SCHEMA.features), len(GLOBAL_FEATURE_SCHEMA.features))
    torch.manual_seed(3)
    members = [IterationGNN(*dims, hidden=8, num_layers=2, lse_channels=3).eval() for _ in range(3)]
    with torch.no_grad():  # the head starts at zero (every output 0): give every member random weights throughout
        for m in members:
            for t in m.parameters():
                t.copy_(torch.randn_like(t) * 0.3)
    data = [Data(x=torch.from_numpy(s.node_x), edge_index=torch.from_numpy(s.edge_index),
                 edge_attr=torch.from_numpy(s.edge_attr), u=torch.from_numpy(s.global_x)[None]) for s in samples[:5]]
    b = Batch.from_data_list(data)
    with torch.no_grad():
        each = torch.stack([m(b.x, b.edge_index, b.edge_attr, b.batch, b.u) for m in members])
        stacked = IterationGNNEnsemble(members)(b.x, b.edge_index, b.edge_attr, b.batch, b.u)
    assert stacked.shape == (3, 5) and each.abs().min() > 1e-3  # nonzero outputs that differ by member
    assert not torch.allclose(each[0], each[1])
    assert torch.allclose(stacked, each, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="differ in architecture"):
        IterationGNNEnsemble([members[0], IterationGNN(*dims, hidden=4, num_layers=2, lse_channels=3)])
    with pytest.raises(InputError, match="one or more IterationGNN"):
        IterationGNNEnsemble([])


def test_sample_validation(samples):
    s = samples[0]
    with pytest.raises(InputError, match="node_x"):
        GraphSample(s.node_x[:, :-1], s.edge_index, s.edge_attr, s.global_x, s.sim_ms)
    with pytest.raises(InputError, match="source"):
        GraphSample(s.node_x, s.edge_index, s.edge_attr, s.global_x, s.sim_ms, source="guessed")
    with pytest.raises(InputError, match="mode"):
        GNNRegressor(mode="both")
    with pytest.raises(InputError, match="not fitted"):
        GNNRegressor().predict(samples)


def test_residual_mode_learns_a_known_correction(samples):
    # the simulator is 30 % optimistic on tp=1 runs and 10 % pessimistic on tensor-parallel ones
    factor = np.array([1.3 if spec[1]["tp"] == 1 else 0.9 for spec in STRATEGIES])
    sim = np.array([s.sim_ms for s in samples])
    m = GNNRegressor(mode="residual", pretrain_epochs=100, finetune_epochs=0, lr=1e-2, **TINY).fit(samples,
                                                                                                   sim * factor)
    ratio = m.predict(samples) / sim
    assert np.all(np.abs(ratio / factor - 1) < 0.05), ratio
    # deterministic given the seed
    again = GNNRegressor(mode="residual", pretrain_epochs=100, finetune_epochs=0, lr=1e-2, **TINY).fit(samples,
                                                                                                       sim * factor)
    assert np.array_equal(again.predict(samples), m.predict(samples))
    assert m.get_params()["mode"] == "residual" and m.history_[0]["pretrain"][-1] < m.history_[0]["pretrain"][0]


def test_direct_mode_learns_from_node_times_and_ignores_the_simulator(samples, runs):
    # a target the simulator's columns do not give: 2 × the summed cost-model time of the nodes
    y = np.array([2.0 * _total_node_time_ms(g) for _s, g, _p in runs])
    m = GNNRegressor(mode="direct", pretrain_epochs=100, finetune_epochs=0, lr=1e-2, **TINY).fit(samples, y)
    err = np.abs(m.predict_log(samples) - np.log(y))
    const = np.abs(np.log(y) - np.log(y).mean())
    assert err.mean() < 0.25 * const.mean(), (err.mean(), const.mean())
    # the simulator's inputs do not reach the network: changing them changes nothing
    col = [GLOBAL_FEATURE_SCHEMA.index(n) for n in SIMULATOR_GLOBAL_FEATURES]
    fake = []
    for s in samples:
        gx = s.global_x.copy()
        gx[col] = 123.0
        fake.append(GraphSample(s.node_x, s.edge_index, s.edge_attr, gx, float("nan")))
    assert np.array_equal(m.predict(fake), m.predict(samples))


def test_finetuning_moves_predictions_towards_measurements(samples):
    # simulated copies say sim, measured copies of the same runs say 2 × sim
    sim = np.array([s.sim_ms for s in samples])
    both = samples + samples
    y = np.concatenate([sim, 2.0 * sim])
    source = ["simulated"] * len(samples) + ["measured"] * len(samples)
    kw = dict(mode="residual", pretrain_epochs=60, lr=1e-2, simulated_weight=1.0, **TINY)
    pre = GNNRegressor(finetune_epochs=0, **kw).fit(both, y, source=source)
    ft = GNNRegressor(finetune_epochs=60, finetune_lr=1e-2, **kw).fit(both, y, source=source)
    r_pre = np.exp(np.mean(np.log(pre.predict(samples) / sim)))
    r_ft = np.exp(np.mean(np.log(ft.predict(samples) / sim)))
    assert 1.2 < r_pre < 1.65  # equal weights: between the two sources (√2 in log terms)
    assert abs(math.log(r_ft / 2.0)) < 0.1 and r_ft > r_pre
    assert ft.history_[0]["finetune"] and not pre.history_[0]["finetune"] and ft.n_measured_ == len(samples)


def test_replaying_simulated_runs_in_finetuning_keeps_the_correction_at_zero_where_nothing_was_measured(samples):
    # measured: the tp = 1 runs take 2 × the simulator; the tp > 1 runs were only simulated (target: the simulator).
    # Phase 1 sees both; phase 2 on the measured runs alone drifts the unmeasured runs' correction towards the measured
    # one, and replaying the simulated runs at a weight holds it near zero without giving up the measured runs' fit.
    sim = np.array([s.sim_ms for s in samples])
    tp1 = np.array([spec[1]["tp"] == 1 for spec in STRATEGIES])
    y = np.where(tp1, 2.0 * sim, sim)
    source = ["measured" if m else "simulated" for m in tp1]
    kw = dict(mode="residual", pretrain_epochs=30, lr=1e-2, simulated_weight=1.0, finetune_epochs=60,
              finetune_lr=1e-2, **TINY)
    alone = GNNRegressor(**kw).fit(samples, y, source=source)
    replay = GNNRegressor(finetune_simulated_weight=1.0, **kw).fit(samples, y, source=source)

    def log_ratio(m, sel):
        return float(np.mean(np.log(m.predict([s for s, k in zip(samples, sel) if k]) / sim[sel])))

    assert log_ratio(alone, ~tp1) > log_ratio(replay, ~tp1) + 0.1  # the unmeasured runs' correction drifted
    assert abs(log_ratio(replay, ~tp1)) < 0.15
    assert abs(log_ratio(replay, tp1) - math.log(2.0)) < 0.15  # the measured runs are still fitted
    assert replay.get_params()["finetune_simulated_weight"] == 1.0


def test_finetune_simulated_weight_zero_is_phase_2_on_the_measured_runs_alone(samples):
    # the default 0 trains exactly as before the parameter existed: the simulated runs take no part in phase 2
    # (a correction that differs between runs: a constant one is the networks' starting point, nothing to learn)
    y = np.array([s.sim_ms for s in samples]) * np.array([1.3 if spec[1]["tp"] == 1 else 0.9 for spec in STRATEGIES])
    src = ["measured" if i % 2 else "simulated" for i in range(len(samples))]
    kw = dict(mode="residual", pretrain_epochs=3, finetune_epochs=3, **TINY)
    a = GNNRegressor(**kw).fit(samples, y, source=src)
    b = GNNRegressor(finetune_simulated_weight=0.0, **kw).fit(samples, y, source=src)
    c = GNNRegressor(finetune_simulated_weight=0.5, **kw).fit(samples, y, source=src)
    assert _same_weights(a.modules_[0], b.modules_[0]) and not _same_weights(a.modules_[0], c.modules_[0])
    with pytest.raises(InputError, match="finetune_simulated_weight"):
        GNNRegressor(finetune_simulated_weight=-0.1)


def _same_weights(a, b) -> bool:
    """Whether two modules hold the same tensors, bit for bit."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_ensemble_members_are_the_single_networks_of_their_seeds_and_the_mean_is_their_log_mean(samples):
    # a correction that differs between runs (a constant one is the networks' starting point: nothing to learn)
    y = np.array([s.sim_ms for s in samples]) * np.array([1.3 if spec[1]["tp"] == 1 else 0.9 for spec in STRATEGIES])
    kw = dict(mode="residual", pretrain_epochs=8, finetune_epochs=0, **TINY)
    ens = GNNRegressor(ensemble=3, seed=5, **kw).fit(samples, y)
    members = ens.predict_log_members(samples)
    assert members.shape == (3, len(samples)) and len(ens.modules_) == len(ens.history_) == 3
    # member k is trained exactly as one network of seed 5 + k * MEMBER_SEED_STEP on the same data (the same
    # weights to the bit; the members' stacked forward pass rounds its sums in another order than one network's)
    for k in range(3):
        single = GNNRegressor(ensemble=1, seed=5 + k * MEMBER_SEED_STEP, **kw).fit(samples, y)
        assert _same_weights(single.modules_[0], ens.modules_[k])
        assert np.allclose(single.predict_log(samples), members[k], rtol=0, atol=1e-5)
    assert not np.array_equal(members[0], members[1])  # other seeds, other networks
    assert np.allclose(ens.predict_log(samples), members.mean(axis=0), rtol=0, atol=1e-12)
    assert np.allclose(ens.predict(samples), np.exp(members.mean(axis=0)), rtol=1e-12)


def test_member_masks_train_each_member_on_its_own_samples_only(samples):
    y = np.array([s.sim_ms for s in samples]) * np.array([1.3 if spec[1]["tp"] == 1 else 0.9 for spec in STRATEGIES])
    src = ["measured"] * len(samples)
    kw = dict(mode="residual", pretrain_epochs=6, finetune_epochs=3, **TINY)
    masks = np.ones((2, len(samples)), dtype=bool)
    masks[1, :4] = False  # member 1 leaves the first four runs out
    ens = GNNRegressor(ensemble=2, **kw).fit(samples, y, source=src, member_masks=masks)
    # member 1 is the network of its seed trained on its samples alone, with their target statistics and the
    # input normalisation of all samples: changing the targets it left out changes nothing in it
    y2 = y.copy()
    y2[:4] *= 5.0
    ens2 = GNNRegressor(ensemble=2, **kw).fit(samples, y2, source=src, member_masks=masks)
    m1, m2 = ens.predict_log_members(samples), ens2.predict_log_members(samples)
    assert _same_weights(ens.modules_[1], ens2.modules_[1]) and np.array_equal(m1[1], m2[1])
    assert not _same_weights(ens.modules_[0], ens2.modules_[0]) and not np.allclose(m1[0], m2[0])
    assert ens.target_offset_[1] == ens2.target_offset_[1] and ens.target_offset_[0] != ens2.target_offset_[0]
    # member 0 (every sample) is the plain single network
    single = GNNRegressor(**kw).fit(samples, y, source=src)
    assert _same_weights(single.modules_[0], ens.modules_[0])
    assert np.allclose(single.predict_log(samples), m1[0], rtol=0, atol=1e-5)


def test_member_masks_are_validated(samples):
    y = np.array([s.sim_ms for s in samples])
    m = GNNRegressor(ensemble=2, pretrain_epochs=1, finetune_epochs=0, **TINY)
    with pytest.raises(InputError, match=r"member_masks must be a boolean array of shape \(2, 12\)"):
        m.fit(samples, y, member_masks=np.ones((3, len(samples)), dtype=bool))
    with pytest.raises(InputError, match="member_masks must be a boolean array"):
        m.fit(samples, y, member_masks=np.ones((2, len(samples))))
    empty = np.ones((2, len(samples)), dtype=bool)
    empty[1] = False
    with pytest.raises(InputError, match=r"member\(s\) \[1\] of member_masks have no sample"):
        m.fit(samples, y, member_masks=empty)


def test_ensemble_size_is_validated():
    for bad in (0, -2):
        with pytest.raises(InputError, match="ensemble: must be >= 1"):
            GNNRegressor(ensemble=bad)


# =================================================================== checkpoints
@pytest.fixture(scope="module")
def fitted(samples):
    sim = np.array([s.sim_ms for s in samples])
    return GNNRegressor(mode="residual", pretrain_epochs=5, finetune_epochs=0, **TINY).fit(samples, sim * 1.1)


def test_save_load_round_trip_without_pickles(fitted, samples, tmp_path):
    files = fitted.save(tmp_path)
    assert sorted(p.name for p in files) == ["gnn.json", "gnn.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gnn.json", "gnn.safetensors"]
    for p in files:
        assert not p.read_bytes().startswith(b"\x80"), f"{p} looks like a pickle"
    meta = json.loads((tmp_path / "gnn.json").read_text())
    assert meta["feature_schema"]["version"] == GRAPH_FEATURE_SCHEMA_VERSION and meta["mode"] == "residual"
    assert len(meta["normalisation"]["node_mean"]) == len(NODE_FEATURE_SCHEMA.features)
    loaded = GNNRegressor.load(tmp_path)
    assert loaded.get_params() == fitted.get_params()
    assert np.array_equal(loaded.predict(samples), fitted.predict(samples))
    # the same weights make the same files, byte for byte (safetensors orders a metadata map of several keys
    # anew for every map it writes: two keys made one file in two orders about half the time)
    again = [(fitted.save(tmp_path / f"again{i}"), tmp_path / f"again{i}")[1] for i in range(8)]
    assert {(d / "gnn.safetensors").read_bytes() for d in again} == {(tmp_path / "gnn.safetensors").read_bytes()}
    assert {(d / "gnn.json").read_bytes() for d in again} == {(tmp_path / "gnn.json").read_bytes()}


def test_gnn_methods_refuse_bad_gnn_parameters_when_built():
    from learnedperf.models.iteration import IterationModel

    for params, match in (({"foo": 1}, r"unknown GNN parameter\(s\) \['foo'\]"),
                          ({"mode": "direct"}, "'mode' is set by the method"),
                          ({"hidden": "wide"}, "invalid literal"), ({"ensemble": 0}, "ensemble: must be >= 1")):
        with pytest.raises(InputError, match=match):
            IterationModel("gnn_residual", gnn_params=params)
    # methods without a GNN ignore GNN parameters, as before
    assert IterationModel("simulator", gnn_params={"foo": 1}).gnn_params == {"foo": 1}


def test_ensemble_save_load_round_trip_and_member_count_mismatch(samples, tmp_path):
    y = np.array([s.sim_ms for s in samples]) * np.array([1.3 if spec[1]["tp"] == 1 else 0.9 for spec in STRATEGIES])
    ens = GNNRegressor(mode="residual", pretrain_epochs=3, finetune_epochs=0, ensemble=2, **TINY).fit(samples, y)
    ens.save(tmp_path)
    loaded = GNNRegressor.load(tmp_path)
    assert loaded.ensemble == 2 and len(loaded.modules_) == 2
    assert np.array_equal(loaded.predict_log_members(samples), ens.predict_log_members(samples))
    meta_path = tmp_path / "gnn.json"
    good = json.loads(meta_path.read_text())
    assert good["format_version"] == 2 and len(good["training"]["history"]) == 2
    meta_path.write_text(json.dumps({**good, "params": {**good["params"], "ensemble": 3}}))
    with pytest.raises(InputError, match=r"target_offset must be 3 finite number\(s\), one per ensemble member"):
        GNNRegressor.load(tmp_path)
    norm = {**good["normalisation"], "target_offset": [0.0] * 3, "target_scale": [1.0] * 3}
    meta_path.write_text(json.dumps({**good, "params": {**good["params"], "ensemble": 3}, "normalisation": norm}))
    with pytest.raises(InputError, match="tensors do not fit 3 IterationGNN"):
        GNNRegressor.load(tmp_path)
    norm = {**good["normalisation"], "target_scale": [1.0, 0.0]}
    meta_path.write_text(json.dumps({**good, "normalisation": norm}))
    with pytest.raises(InputError, match=r"target_scale must be 2 finite number\(s\) > 0"):
        GNNRegressor.load(tmp_path)
    # a layout this package never wrote is refused by name
    meta_path.write_text(json.dumps({**good, "format_version": 3}))
    with pytest.raises(InputError, match="format version 3; this learnedperf reads versions 1, 2"):
        GNNRegressor.load(tmp_path)


def test_a_version_1_sidecar_loads_as_an_ensemble_of_one(samples, tmp_path):
    """Checkpoints written before ensembles (one network: unprefixed tensor names, scalar target offset and
    scale, one history) still load, and predict what the network they hold predicts."""
    from safetensors.torch import load_file, save_file

    from learnedperf.measure.records import sha256_file

    y = np.array([s.sim_ms for s in samples]) * np.array([1.3 if spec[1]["tp"] == 1 else 0.9 for spec in STRATEGIES])
    one = GNNRegressor(mode="residual", pretrain_epochs=3, finetune_epochs=0, **TINY).fit(samples, y)
    one.save(tmp_path)
    # rewrite it in the version 1 layout, as the learnedperf before ensembles wrote it
    weights, meta_path = tmp_path / "gnn.safetensors", tmp_path / "gnn.json"
    state = {k.removeprefix("member0."): v for k, v in load_file(str(weights)).items()}
    save_file(state, str(weights), metadata={"format": "learnedperf.GNNRegressor", "feature_schema_version": "0"})
    meta = json.loads(meta_path.read_text())
    params = {k: v for k, v in meta["params"].items() if k != "ensemble"}
    norm = {**meta["normalisation"], "target_offset": meta["normalisation"]["target_offset"][0],
            "target_scale": meta["normalisation"]["target_scale"][0]}
    v1 = {**meta, "format_version": 1, "params": params, "normalisation": norm,
          "tensors": {k: list(v.shape) for k, v in state.items()}, "weights_bytes": weights.stat().st_size,
          "weights_sha256": sha256_file(weights), "training": {**meta["training"], "history": one.history_[0]}}
    meta_path.write_text(json.dumps(v1))
    loaded = GNNRegressor.load(tmp_path)
    assert loaded.ensemble == 1 and len(loaded.modules_) == 1 and loaded.history_ == one.history_
    assert np.array_equal(loaded.predict_log(samples), one.predict_log(samples))
    # version 1 is one network: a list of targets or an ensemble size in it is refused
    meta_path.write_text(json.dumps({**v1, "normalisation": {**norm, "target_offset": [0.0]}}))
    with pytest.raises(InputError, match=r"target_offset must be 1 finite number"):
        GNNRegressor.load(tmp_path)
    meta_path.write_text(json.dumps({**v1, "params": {**params, "ensemble": 1}}))
    with pytest.raises(InputError, match="format version 1 is one network"):
        GNNRegressor.load(tmp_path)


def _saved(fitted, path: Path) -> Path:
    fitted.save(path)
    return path


def test_tampered_weights_are_refused(fitted, tmp_path):
    d = _saved(fitted, tmp_path)
    w = d / "gnn.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(InputError, match="sha256"):
        GNNRegressor.load(d)


def test_truncated_weights_are_refused(fitted, tmp_path):
    d = _saved(fitted, tmp_path)
    w = d / "gnn.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    with pytest.raises(InputError, match="truncated"):
        GNNRegressor.load(d)


def test_incompatible_or_broken_sidecar_is_refused(fitted, tmp_path):
    d = _saved(fitted, tmp_path)
    meta_path = d / "gnn.json"
    good = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**good, "feature_schema": {**good["feature_schema"], "version": 99}}))
    with pytest.raises(InputError, match="schema version 99"):
        GNNRegressor.load(d)
    names = good["feature_schema"]["node"]["names"]
    fs = {**good["feature_schema"], "node": {**good["feature_schema"]["node"], "names": names[::-1]}}
    meta_path.write_text(json.dumps({**good, "feature_schema": fs}))
    with pytest.raises(InputError, match="node feature names"):
        GNNRegressor.load(d)
    meta_path.write_text(json.dumps({**good, "params": {**good["params"], "hidden": 32}}))
    with pytest.raises(InputError, match="do not fit"):
        GNNRegressor.load(d)
    meta_path.write_text("{broken")
    with pytest.raises(InputError, match="gnn.json: invalid JSON"):
        GNNRegressor.load(d)
    meta_path.unlink()
    with pytest.raises(InputError, match="gnn.json: cannot read"):
        GNNRegressor.load(d)
    meta_path.write_text(json.dumps(good))
    (d / "gnn.safetensors").unlink()
    with pytest.raises(InputError, match="gnn.safetensors: missing"):
        GNNRegressor.load(d)


def test_models_package_exports_the_gnn_lazily():
    import subprocess

    import learnedperf.models
    from learnedperf.models import gnn

    assert learnedperf.models.GNNRegressor is gnn.GNNRegressor and learnedperf.models.make_sample is make_sample
    # a fresh interpreter: importing the packages does not import torch (the GNN loads on first use)
    code = "import sys, learnedperf.models, learnedperf.features; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
