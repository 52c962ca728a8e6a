"""A graph neural network over the execution graph that predicts the iteration time of a run.

:class:`IterationGNN` is a PyTorch Geometric module: typed-edge message passing over the
coarsened execution graph (:mod:`learnedperf.data.graphs`), a graph readout, and a head
that also sees the run-level features (:data:`~learnedperf.features.GLOBAL_FEATURE_SCHEMA`).

:class:`GNNRegressor` is the scikit-learn style estimator around it. It predicts
``log(iteration_time_ms)`` in one of two modes:

* ``"residual"`` — ``log(t) = log(sim_ms) + f(graph)``: the network learns what the
  analytical simulator gets wrong (overlap, efficiency, framework overhead);
* ``"direct"`` — ``log(t) = f(graph)`` with the simulator's global columns
  (:data:`~learnedperf.features.SIMULATOR_GLOBAL_FEATURES`) zeroed: the network must
  aggregate the per-node cost-model times itself. Pretraining on simulated records
  teaches it how; it then also answers for runs the simulator cannot run.

Training is provenance-aware: phase 1 fits all samples, simulated ones down-weighted
(``simulated_weight``); phase 2 fine-tunes on the measured samples at a lower learning rate,
alone or (``finetune_simulated_weight`` > 0) with the simulated ones replayed at that weight, which keeps
a residual network's correction near zero where only simulated runs are (the configurations no
measurement reached). The loss is a weighted Huber loss on log time, i.e. on relative error.

``ensemble`` networks (default 1) can be trained from different seeds on the same data and
normalisation; the prediction is the mean of their log times. One network's answer moves with its
seed (initialisation and batch order); the mean of several moves less, and each member's answer is
returned by :meth:`GNNRegressor.predict_log_members`.

Checkpoints are ``gnn.safetensors`` (the ``state_dict`` of every member, keys prefixed
``member<k>.``) plus ``gnn.json``
(hyper-parameters, feature schema and version, normalisation, tensor shapes, sha256 of
the weights): no pickles. :meth:`GNNRegressor.load` refuses a missing, tampered,
truncated or schema-incompatible checkpoint with an :class:`~learnedperf.errors.InputError`.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GINEConv
from torch_geometric.nn.aggr import Aggregation, AttentionalAggregation, MeanAggregation
from torch_geometric.utils import scatter, softmax

from ..data.records import SOURCES
from ..errors import InputError
from ..features.graph import (EDGE_FEATURE_SCHEMA, GLOBAL_FEATURE_SCHEMA, GRAPH_FEATURE_SCHEMA_VERSION,
                              NODE_FEATURE_SCHEMA, SIMULATOR_GLOBAL_FEATURES, edge_feature_matrix,
                              global_feature_vector, global_features_from_record, graph_feature_schema_dict,
                              node_feature_matrix)
from ..io import load_json_object
from ..measure.records import sha256_file

WEIGHTS_FILE = "gnn.safetensors"
META_FILE = "gnn.json"
#: Checkpoint format tag and version of the JSON sidecar layout.
FORMAT = "learnedperf.GNNRegressor"
FORMAT_VERSION = 2
#: Sidecar layouts :meth:`GNNRegressor.load` reads: 1 is one network (tensor names unprefixed, a scalar target
#: offset and scale, one history), written before ensembles; it loads as an ensemble of one.
READABLE_FORMAT_VERSIONS = (1, 2)
#: Seed step between ensemble members: member k trains with ``seed + k * MEMBER_SEED_STEP`` (its fine-tuning
#: shuffles with that plus 1), so that member 0 is the single network of ``ensemble=1``.
MEMBER_SEED_STEP = 1000
MODES = ("residual", "direct")
#: What the network's output is added to, per mode (stored in the sidecar for readers).
TARGETS = {"residual": "log(iteration_time_ms) - log(sim_ms)", "direct": "log(iteration_time_ms)"}
#: Floor of the target scale in log units: a near-constant target (e.g. every residual equal) must not
#: turn into a huge standardised output the last layer has to chase.
MIN_TARGET_SCALE = 0.05
#: Standard deviations below this count as a constant column (scaled by 1, i.e. only centred).
_MIN_STD = 1e-6


# ================================================================== samples
@dataclass
class GraphSample:
    """One run as the GNN sees it: feature matrices of its graph, run features and targets.

    Args:
        node_x: node features, columns of :data:`~learnedperf.features.NODE_FEATURE_SCHEMA`.
        edge_index: edges as (source, target) node indices.
        edge_attr: edge features, columns of :data:`~learnedperf.features.EDGE_FEATURE_SCHEMA`.
        global_x: run features, columns of :data:`~learnedperf.features.GLOBAL_FEATURE_SCHEMA`.
        sim_ms: the simulator's iteration time in ms (NaN allowed only in ``"direct"`` mode).
        y_ms: the target iteration time in ms (simulated or measured), if known.
        weight: sample weight in training.
        source: ``"simulated"`` or ``"measured"`` (provenance of ``y_ms``).
        run_id: the record's run id, for reference.

    Shapes:
        - **node_x:** :math:`(N, F_{node})` float32
        - **edge_index:** :math:`(2, E)` int64
        - **edge_attr:** :math:`(E, F_{edge})` float32
        - **global_x:** :math:`(F_{global},)` float32
    """

    node_x: np.ndarray
    edge_index: np.ndarray
    edge_attr: np.ndarray
    global_x: np.ndarray
    sim_ms: float
    y_ms: Optional[float] = None
    weight: float = 1.0
    source: str = "simulated"
    run_id: Optional[str] = None

    def __post_init__(self) -> None:
        self.node_x = np.asarray(self.node_x, dtype=np.float32)
        self.edge_index = np.asarray(self.edge_index, dtype=np.int64)
        self.edge_attr = np.asarray(self.edge_attr, dtype=np.float32)
        self.global_x = np.asarray(self.global_x, dtype=np.float32)
        nf, ef, gf = (len(s.features) for s in (NODE_FEATURE_SCHEMA, EDGE_FEATURE_SCHEMA, GLOBAL_FEATURE_SCHEMA))
        if self.node_x.ndim != 2 or self.node_x.shape[1] != nf or self.node_x.shape[0] == 0:
            raise InputError(f"GraphSample.node_x: shape {self.node_x.shape}, expected (N >= 1, {nf})")
        if self.edge_index.ndim != 2 or self.edge_index.shape[0] != 2:
            raise InputError(f"GraphSample.edge_index: shape {self.edge_index.shape}, expected (2, E)")
        if self.edge_index.size and (self.edge_index.min() < 0 or self.edge_index.max() >= self.node_x.shape[0]):
            raise InputError("GraphSample.edge_index: node index out of range")
        if self.edge_attr.shape != (self.edge_index.shape[1], ef):
            raise InputError(f"GraphSample.edge_attr: shape {self.edge_attr.shape}, expected "
                             f"({self.edge_index.shape[1]}, {ef})")
        if self.global_x.shape != (gf,):
            raise InputError(f"GraphSample.global_x: shape {self.global_x.shape}, expected ({gf},)")
        for name in ("node_x", "edge_attr", "global_x"):
            if not np.all(np.isfinite(getattr(self, name))):
                raise InputError(f"GraphSample.{name}: non-finite values")
        if self.source not in SOURCES:
            raise InputError(f"GraphSample.source: {self.source!r}, expected one of {list(SOURCES)}")

    @property
    def num_nodes(self) -> int:
        """Nodes of the graph."""
        return int(self.node_x.shape[0])


def make_sample(graph: Mapping, spec: Any, sim_time_ms: float, breakdown_ms: Mapping[str, float],
                learned_time_s: Any = None, *, y_ms: Optional[float] = None, weight: float = 1.0,
                source: str = "simulated", run_id: Optional[str] = None) -> GraphSample:
    """A :class:`GraphSample` from a graph dict (``load_graph`` / ``graph_of``), a run and its simulation.

    Args:
        graph: the run's coarsened execution graph.
        spec: the run (:class:`~learnedperf.specs.RunSpec` or run-format dict).
        sim_time_ms: the simulator's iteration time in ms.
        breakdown_ms: the simulator's breakdown in ms.
        learned_time_s: optional per-node learned op times in seconds (see
            :func:`~learnedperf.features.node_feature_matrix`).
        y_ms, weight, source, run_id: as in :class:`GraphSample`.
    """
    node_x = node_feature_matrix(graph, learned_time_s)
    edge_attr = edge_feature_matrix(graph)  # also checks edge_index
    return GraphSample(node_x=node_x, edge_index=np.asarray(graph["edge_index"], dtype=np.int64),
                       edge_attr=edge_attr, global_x=global_feature_vector(spec, sim_time_ms, breakdown_ms),
                       sim_ms=float(sim_time_ms), y_ms=y_ms, weight=weight, source=source,
                       run_id=run_id if run_id is not None else graph.get("run_id"))


def sample_from_record(row: Any, graph: Mapping, learned_time_s: Any = None) -> GraphSample:
    """A :class:`GraphSample` of one data-store record (dict or pandas row) and its graph.

    Target ``iteration_time_ms``, provenance ``source`` and the simulator columns come from
    the record.

    Raises:
        InputError: as :func:`~learnedperf.features.global_features_from_record` (e.g. a
            measured record without a breakdown: re-simulate it and use :func:`make_sample`).
    """
    node_x = node_feature_matrix(graph, learned_time_s)
    edge_attr = edge_feature_matrix(graph)  # also checks edge_index
    return GraphSample(node_x=node_x, edge_index=np.asarray(graph["edge_index"], dtype=np.int64),
                       edge_attr=edge_attr, global_x=global_features_from_record(row),
                       sim_ms=float(row["sim_iteration_time_ms"]), y_ms=float(row["iteration_time_ms"]),
                       source=str(row["source"]), run_id=str(row["run_id"]) if "run_id" in row else None)


# ================================================================== the network
class LogSumExpAggregation(Aggregation):
    r"""Per-graph, per-channel log-sum-exp of node values: a sum in log space.

    If a node's channel holds the log of its contribution to the iteration time (log time +
    log repeat + log executions), the aggregate is the log of the summed time — the way an
    iteration time is composed — without the scale trouble of a plain sum over 40 to 3,000
    nodes.

    .. math::
        \mathbf{r}_i = \log \sum_{n \in \mathcal{V}_i} \exp(\mathbf{x}_n)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F)` (or :math:`(K, |\mathcal{V}|, F)`, nodes on
          ``dim``), batch vector :math:`(|\mathcal{V}|)`
        - **output:** :math:`(|\mathcal{G}|, F)` (or :math:`(K, |\mathcal{G}|, F)`)
    """

    def forward(self, x: Tensor, index: Optional[Tensor] = None, ptr: Optional[Tensor] = None,
                dim_size: Optional[int] = None, dim: int = -2) -> Tensor:
        """Aggregate ``x`` (nodes × channels) per graph given the batch vector ``index``."""
        if index is None:
            index = x.new_zeros(x.size(0), dtype=torch.long)
        # subtracting the per-graph maximum keeps exp() in range; the max is a constant for the gradient
        dim = dim % x.dim()  # -2 is the node axis of (nodes, F) and of a stack (members, nodes, F)
        m = scatter(x.detach(), index, dim=dim, dim_size=dim_size, reduce="max")
        s = scatter((x - m.index_select(dim, index)).exp(), index, dim=dim, dim_size=dim_size, reduce="sum")
        return m + s.clamp_min(torch.finfo(x.dtype).tiny).log()


def _mlp(d_in: int, d_hidden: int, d_out: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.SiLU(), torch.nn.Linear(d_hidden, d_out))


class IterationGNN(torch.nn.Module):
    r"""Graph network over an execution graph that outputs one scalar per graph.

    Nodes are encoded by an MLP; each of ``num_layers`` layers passes messages along the
    edges in both directions (one :class:`~torch_geometric.nn.conv.GINEConv` with the edge
    features for the data-flow direction, one for the reverse, so that an op learns both
    what feeds it and what waits on it), then adds the result to the node state (residual)
    and applies :class:`~torch.nn.LayerNorm`:

    .. math::
        \mathbf{h}^{(l+1)} = \mathrm{LN}\big(\mathbf{h}^{(l)} + \sigma(\mathrm{GINE}_\rightarrow(\mathbf{h}^{(l)})
        + \mathrm{GINE}_\leftarrow(\mathbf{h}^{(l)}))\big)

    The readout concatenates attention pooling
    (:class:`~torch_geometric.nn.aggr.AttentionalAggregation`), the mean, and a
    log-sum-exp (:class:`LogSumExpAggregation`) of ``lse_channels`` projections, plus the
    encoded global features; an MLP head maps that to the output. The head's last layer
    starts at zero, so an untrained network outputs 0 (the estimator's target offset).

    Args:
        node_dim: node feature width :math:`F_{node}`.
        edge_dim: edge feature width :math:`F_{edge}`.
        global_dim: global feature width :math:`F_{global}`.
        hidden: hidden width of every layer.
        num_layers: message-passing layers.
        lse_channels: channels of the log-sum-exp readout.
        dropout: dropout before the head's last layer.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{node})`, edge indices :math:`(2, |\mathcal{E}|)`,
          edge features :math:`(|\mathcal{E}|, F_{edge})`, batch vector :math:`(|\mathcal{V}|)`,
          global features :math:`(|\mathcal{G}|, F_{global})`
        - **output:** :math:`(|\mathcal{G}|)`
    """

    def __init__(self, node_dim: int, edge_dim: int, global_dim: int, hidden: int = 64, num_layers: int = 3,
                 lse_channels: int = 4, dropout: float = 0.0):
        super().__init__()
        if min(node_dim, edge_dim, global_dim, hidden, lse_channels) < 1 or num_layers < 0:
            raise InputError("IterationGNN: dimensions must be >= 1 and num_layers >= 0")
        self.node_encoder = _mlp(node_dim, hidden, hidden)
        self.convs_fwd = torch.nn.ModuleList()
        self.convs_bwd = torch.nn.ModuleList()
        self.norms = torch.nn.ModuleList()
        for _ in range(num_layers):
            self.convs_fwd.append(GINEConv(_mlp(hidden, hidden, hidden), train_eps=True, edge_dim=edge_dim))
            self.convs_bwd.append(GINEConv(_mlp(hidden, hidden, hidden), train_eps=True, edge_dim=edge_dim))
            self.norms.append(torch.nn.LayerNorm(hidden))
        self.att_pool = AttentionalAggregation(gate_nn=_mlp(hidden, hidden, 1), nn=torch.nn.Linear(hidden, hidden))
        self.mean_pool = MeanAggregation()
        self.lse_proj = torch.nn.Linear(hidden, lse_channels)
        self.lse_pool = LogSumExpAggregation()
        self.global_encoder = _mlp(global_dim, hidden, hidden)
        self.head = torch.nn.Sequential(torch.nn.Linear(3 * hidden + lse_channels, hidden), torch.nn.SiLU(),
                                        torch.nn.Dropout(dropout), torch.nn.Linear(hidden, 1))
        torch.nn.init.zeros_(self.head[-1].weight)
        torch.nn.init.zeros_(self.head[-1].bias)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor, u: Tensor) -> Tensor:
        """One scalar per graph of the batch (see the class docstring for shapes)."""
        num_graphs = u.size(0)
        h = self.node_encoder(x)
        rev = edge_index.flip(0)
        for conv_f, conv_b, norm in zip(self.convs_fwd, self.convs_bwd, self.norms):
            h = norm(h + torch.nn.functional.silu(conv_f(h, edge_index, edge_attr) + conv_b(h, rev, edge_attr)))
        pooled = torch.cat([self.att_pool(h, batch, dim_size=num_graphs),
                            self.mean_pool(h, batch, dim_size=num_graphs),
                            self.lse_pool(self.lse_proj(h), batch, dim_size=num_graphs),
                            self.global_encoder(u)], dim=-1)
        return self.head(pooled).squeeze(-1)


class IterationGNNEnsemble(torch.nn.Module):
    r"""Several :class:`IterationGNN` of one architecture evaluated in one pass (inference only).

    Every member's parameters are stacked along a leading member axis, and each layer runs once for
    all members as a batched matrix product, so ``K`` members cost about one member's Python and
    dispatch overhead: on the small coarsened graphs of one prediction that overhead, not the
    arithmetic, is most of a forward pass. The output equals calling each member in turn, up to
    float rounding (the same operations in the same order per member).

    Args:
        members: trained :class:`IterationGNN` modules of equal widths and depth (their tensors are
            copied; later changes to the members do not reach the ensemble).

    Shapes:
        - **input:** as :class:`IterationGNN`: node features :math:`(|\mathcal{V}|, F_{node})`, edge indices
          :math:`(2, |\mathcal{E}|)`, edge features :math:`(|\mathcal{E}|, F_{edge})`, batch vector
          :math:`(|\mathcal{V}|)`, global features :math:`(|\mathcal{G}|, F_{global})`
        - **output:** :math:`(K, |\mathcal{G}|)`, row :math:`k` the output of member :math:`k`
    """

    def __init__(self, members: Sequence[IterationGNN]):
        super().__init__()
        members = list(members)
        if not members or not all(isinstance(m, IterationGNN) for m in members):
            raise InputError("IterationGNNEnsemble: members must be one or more IterationGNN modules")
        states = [m.state_dict() for m in members]
        if len({tuple((k, tuple(v.shape)) for k, v in state.items()) for state in states}) != 1:
            raise InputError("IterationGNNEnsemble: members differ in architecture")
        self.num_layers = len(members[0].convs_fwd)
        self.ln_eps = [norm.eps for norm in members[0].norms]
        for name in states[0]:
            # stacked copies, detached: the ensemble never trains
            self.register_buffer(name.replace(".", "__"), torch.stack([state[name].detach() for state in states]))

    def _t(self, name: str) -> Tensor:
        return getattr(self, name.replace(".", "__"))

    def _linear(self, prefix: str, x: Tensor) -> Tensor:
        """``x @ W_k^T + b_k`` for every member: ``x`` is shared (n, in) or stacked (K, n, in)."""
        return torch.matmul(x, self._t(prefix + ".weight").transpose(1, 2)) + self._t(prefix + ".bias")[:, None, :]

    def _mlp(self, prefix: str, x: Tensor) -> Tensor:
        """The members' :func:`_mlp` (Linear, SiLU, Linear) under ``prefix``."""
        return self._linear(prefix + ".2", torch.nn.functional.silu(self._linear(prefix + ".0", x)))

    def _gine(self, prefix: str, h: Tensor, edge_index: Tensor, e: Tensor) -> Tensor:
        """The members' :class:`~torch_geometric.nn.conv.GINEConv` (add aggregation, source to target)."""
        src, dst = edge_index
        msg = (h.index_select(1, src) + self._linear(prefix + ".lin", e)).relu()
        out = scatter(msg, dst, dim=1, dim_size=h.size(1), reduce="sum")
        out = out + (1 + self._t(prefix + ".eps"))[:, :, None] * h
        return self._mlp(prefix + ".nn", out)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor, u: Tensor) -> Tensor:
        """One scalar per member and graph of the batch (see the class docstring for shapes)."""
        num_graphs = u.size(0)
        h = self._mlp("node_encoder", x)
        rev = edge_index.flip(0)
        for i in range(self.num_layers):
            z = h + torch.nn.functional.silu(self._gine(f"convs_fwd.{i}", h, edge_index, edge_attr)
                                             + self._gine(f"convs_bwd.{i}", h, rev, edge_attr))
            z = torch.nn.functional.layer_norm(z, (z.size(-1),), eps=self.ln_eps[i])
            h = z * self._t(f"norms.{i}.weight")[:, None, :] + self._t(f"norms.{i}.bias")[:, None, :]
        gate = softmax(self._mlp("att_pool.gate_nn", h), batch, num_nodes=num_graphs, dim=1)
        att = scatter(gate * self._linear("att_pool.nn", h), batch, dim=1, dim_size=num_graphs, reduce="sum")
        mean = scatter(h, batch, dim=1, dim_size=num_graphs, reduce="mean")
        lse = LogSumExpAggregation()(self._linear("lse_proj", h), batch, dim_size=num_graphs, dim=1)
        pooled = torch.cat([att, mean, lse, self._mlp("global_encoder", u)], dim=-1)
        # head: Linear, SiLU, Dropout (identity at inference), Linear
        return self._linear("head.3", torch.nn.functional.silu(self._linear("head.0", pooled))).squeeze(-1)


# ================================================================== batching
class NodeBudgetBatches:
    """Batches of sample indices with at most ``batch_size`` graphs and about ``max_nodes`` nodes.

    A batch is closed before it would exceed ``max_nodes`` (a single larger graph forms a batch
    of its own), so a few 3,000-node graphs cannot make one batch hundreds of times larger than
    the usual one. Used as the ``batch_sampler`` of a PyG :class:`~torch_geometric.loader.DataLoader`.

    Args:
        num_nodes: nodes of each sample.
        batch_size: most graphs per batch.
        max_nodes: node budget per batch.
        shuffle: shuffle the order every iteration (with ``seed`` + iteration count), else keep it.
        seed: seed of the shuffling.
    """

    def __init__(self, num_nodes: Sequence[int], batch_size: int, max_nodes: int, shuffle: bool = False,
                 seed: int = 0):
        self.num_nodes = np.asarray(num_nodes, dtype=np.int64)
        self.batch_size, self.max_nodes, self.shuffle, self.seed = batch_size, max_nodes, shuffle, seed
        self._epoch = 0

    def _batches(self) -> list[list[int]]:
        order = (np.random.default_rng([self.seed, self._epoch]).permutation(len(self.num_nodes))
                 if self.shuffle else np.arange(len(self.num_nodes)))
        out: list[list[int]] = []
        cur: list[int] = []
        nodes = 0
        for i in order.tolist():
            n = int(self.num_nodes[i])
            if cur and (len(cur) >= self.batch_size or nodes + n > self.max_nodes):
                out.append(cur)
                cur, nodes = [], 0
            cur.append(i)
            nodes += n
        if cur:
            out.append(cur)
        return out

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches()
        self._epoch += 1
        return iter(batches)

    def __len__(self) -> int:
        return len(self._batches())


# ================================================================== the estimator
@contextmanager
def _torch_threads(n: Optional[int]) -> Iterator[None]:
    """Run the block with ``n`` torch CPU threads (None: unchanged), restoring the setting after."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _weighted_mean_std(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = w / w.sum()
    mean = np.tensordot(w, x, axes=1)
    std = np.sqrt(np.tensordot(w, (x - mean) ** 2, axes=1))
    return mean, std


class GNNRegressor:
    """Iteration-time regressor over execution graphs (scikit-learn conventions).

    ``fit`` returns self; learned state ends in ``_``; :meth:`get_params` returns the
    constructor arguments. Times in and out are milliseconds.

    Learned state: ``modules_`` (one :class:`IterationGNN` per ensemble member), ``history_`` (per
    member, the weighted mean loss of each epoch of ``"pretrain"`` and ``"finetune"``), the
    input normalisation shared by the members (``node_mean_``, ``node_std_``, ``global_mean_``,
    ``global_std_``), each member's target offset and scale (arrays ``target_offset_``,
    ``target_scale_``), ``n_samples_`` and ``n_measured_``.

    Args:
        mode: ``"residual"`` (learn ``log(t / sim_ms)``) or ``"direct"`` (learn ``log t`` without
            the simulator's global columns).
        hidden: hidden width of :class:`IterationGNN`.
        num_layers: message-passing layers.
        pretrain_epochs: epochs of phase 1 (all samples, simulated ones weighted ``simulated_weight``).
        finetune_epochs: epochs of phase 2 (the measured samples, and the simulated ones at
            ``finetune_simulated_weight``; skipped if there is no measured sample).
        lr: AdamW learning rate of phase 1 (cosine-annealed to 0 over the phase).
        finetune_lr: learning rate of phase 2 (lower: it adjusts, it does not relearn).
        weight_decay: AdamW weight decay.
        batch_size: most graphs per batch.
        max_nodes_per_batch: node budget per batch (see :class:`NodeBudgetBatches`).
        simulated_weight: weight of simulated samples relative to measured ones in phase 1.
        finetune_simulated_weight: weight of simulated samples relative to measured ones in phase 2
            (0: phase 2 sees the measured samples alone). Fine-tuning on measured runs alone lets the
            correction drift wherever the network extrapolates a pattern of the measured runs (a
            residual one's anchor at zero on simulated runs is then only phase 1's starting point);
            replaying the simulated runs holds it there.
        huber_delta: Huber loss threshold in log units (0.5 ≈ a factor 1.65).
        lse_channels: channels of the log-sum-exp readout.
        seed: seed of initialisation and shuffling (fits on CPU are deterministic given it).
        ensemble: networks trained from seeds ``seed + k * MEMBER_SEED_STEP``; predictions are the mean
            of their log times.
        device: torch device to train and predict on (``"cpu"``, ``"cuda"``).
        num_threads: torch CPU threads while fitting and predicting (restored afterwards); None
            keeps torch's setting. Default 1: these graphs are small, and with 2 threads on a
            loaded 2-core machine one fit of a tiny model took 12× longer (5.9 s vs 0.48 s).
    """

    def __init__(self, mode: str = "residual", hidden: int = 64, num_layers: int = 3, pretrain_epochs: int = 100,
                 finetune_epochs: int = 50, lr: float = 3e-3, finetune_lr: float = 3e-4, weight_decay: float = 1e-4,
                 batch_size: int = 32, max_nodes_per_batch: int = 50_000, simulated_weight: float = 0.3,
                 huber_delta: float = 0.5, lse_channels: int = 4, seed: int = 0, device: str = "cpu",
                 num_threads: Optional[int] = 1, ensemble: int = 1, finetune_simulated_weight: float = 0.0):
        if mode not in MODES:
            raise InputError(f"GNNRegressor.mode: {mode!r}, expected one of {list(MODES)}")
        for name, value in (("hidden", hidden), ("batch_size", batch_size), ("max_nodes_per_batch",
                            max_nodes_per_batch), ("lse_channels", lse_channels), ("ensemble", ensemble)):
            if int(value) < 1:
                raise InputError(f"GNNRegressor.{name}: must be >= 1, got {value}")
        for name, value in (("num_layers", num_layers), ("pretrain_epochs", pretrain_epochs),
                            ("finetune_epochs", finetune_epochs)):
            if int(value) < 0:
                raise InputError(f"GNNRegressor.{name}: must be >= 0, got {value}")
        for name, value in (("lr", lr), ("finetune_lr", finetune_lr), ("huber_delta", huber_delta)):
            if not float(value) > 0:
                raise InputError(f"GNNRegressor.{name}: must be > 0, got {value}")
        if num_threads is not None and int(num_threads) < 1:
            raise InputError(f"GNNRegressor.num_threads: must be >= 1 or None, got {num_threads}")
        if not all(float(v) >= 0 for v in (simulated_weight, weight_decay, finetune_simulated_weight)):
            raise InputError("GNNRegressor: simulated_weight, finetune_simulated_weight and weight_decay must be >= 0")
        self.mode = mode
        self.hidden = int(hidden)
        self.num_layers = int(num_layers)
        self.pretrain_epochs = int(pretrain_epochs)
        self.finetune_epochs = int(finetune_epochs)
        self.lr = float(lr)
        self.finetune_lr = float(finetune_lr)
        self.weight_decay = float(weight_decay)
        self.batch_size = int(batch_size)
        self.max_nodes_per_batch = int(max_nodes_per_batch)
        self.simulated_weight = float(simulated_weight)
        self.finetune_simulated_weight = float(finetune_simulated_weight)
        self.huber_delta = float(huber_delta)
        self.lse_channels = int(lse_channels)
        self.seed = int(seed)
        self.device = str(device)
        self.num_threads = None if num_threads is None else int(num_threads)
        self.ensemble = int(ensemble)

    # ------------------------------------------------------------ sklearn API
    def get_params(self, deep: bool = True) -> dict:
        """Constructor arguments (scikit-learn convention)."""
        return {"mode": self.mode, "hidden": self.hidden, "num_layers": self.num_layers,
                "pretrain_epochs": self.pretrain_epochs, "finetune_epochs": self.finetune_epochs, "lr": self.lr,
                "finetune_lr": self.finetune_lr, "weight_decay": self.weight_decay, "batch_size": self.batch_size,
                "max_nodes_per_batch": self.max_nodes_per_batch, "simulated_weight": self.simulated_weight,
                "huber_delta": self.huber_delta, "lse_channels": self.lse_channels, "seed": self.seed,
                "device": self.device, "num_threads": self.num_threads, "ensemble": self.ensemble,
                "finetune_simulated_weight": self.finetune_simulated_weight}

    def set_params(self, **params: Any) -> "GNNRegressor":
        """Set constructor arguments (scikit-learn convention; validated as in ``__init__``); return self."""
        unknown = set(params) - set(self.get_params())
        if unknown:
            raise InputError(f"GNNRegressor.set_params: unknown parameter(s) {sorted(unknown)}")
        self.__init__(**{**self.get_params(), **params})
        return self

    def _new_module(self) -> IterationGNN:
        return IterationGNN(len(NODE_FEATURE_SCHEMA.features), len(EDGE_FEATURE_SCHEMA.features),
                            len(GLOBAL_FEATURE_SCHEMA.features), hidden=self.hidden, num_layers=self.num_layers,
                            lse_channels=self.lse_channels)

    # ------------------------------------------------------------ data
    @staticmethod
    def _check_samples(samples: Sequence[GraphSample]) -> list[GraphSample]:
        samples = list(samples)
        if not samples:
            raise InputError("GNNRegressor: no samples")
        bad = [i for i, s in enumerate(samples) if not isinstance(s, GraphSample)]
        if bad:
            raise InputError(f"GNNRegressor: sample(s) {bad[:5]} are not GraphSample objects (use make_sample)")
        return samples

    def _base_log(self, samples: Sequence[GraphSample]) -> np.ndarray:
        """log(sim_ms) per sample in residual mode, 0 in direct mode."""
        if self.mode == "direct":
            return np.zeros(len(samples))
        sim = np.array([s.sim_ms for s in samples], dtype=np.float64)
        bad = np.flatnonzero(~(np.isfinite(sim) & (sim > 0)))
        if bad.size:
            raise InputError(f"GNNRegressor (residual mode): sample(s) {bad[:5].tolist()} have no finite positive "
                             "sim_ms; simulate them or use mode='direct'")
        return np.log(sim)

    def _data(self, samples: Sequence[GraphSample], target: Optional[np.ndarray] = None,
              weight: Optional[np.ndarray] = None) -> list[Data]:
        """Normalised PyG ``Data`` objects (``u`` is (1, F_global) so that batches stack it to (B, F_global))."""
        sim_cols = [GLOBAL_FEATURE_SCHEMA.index(n) for n in SIMULATOR_GLOBAL_FEATURES]
        out = []
        for i, s in enumerate(samples):
            x = (s.node_x - self.node_mean_) / self.node_std_
            u = (s.global_x - self.global_mean_) / self.global_std_
            if self.mode == "direct":
                u[sim_cols] = 0.0  # the network must not see the simulator: these columns carry nothing
            d = Data(x=torch.from_numpy(x.astype(np.float32)), edge_index=torch.from_numpy(s.edge_index),
                     edge_attr=torch.from_numpy(s.edge_attr), u=torch.from_numpy(u.astype(np.float32)[None, :]))
            if target is not None:
                d.y = torch.tensor([target[i]], dtype=torch.float32)
                d.w = torch.tensor([weight[i]], dtype=torch.float32)
            out.append(d)
        return out

    def _loader(self, data: list[Data], shuffle: bool, seed: int) -> DataLoader:
        sampler = NodeBudgetBatches([d.num_nodes for d in data], self.batch_size, self.max_nodes_per_batch,
                                    shuffle=shuffle, seed=seed)
        return DataLoader(data, batch_sampler=sampler)

    # ------------------------------------------------------------ training
    def fit(self, samples: Sequence[GraphSample], y_ms: Any = None, source: Optional[Sequence[str]] = None,
            sample_weight: Any = None, member_masks: Any = None) -> "GNNRegressor":
        """Fit on graph samples and their iteration times; return self.

        Args:
            samples: :class:`GraphSample` objects (:func:`make_sample`, :func:`sample_from_record`).
            y_ms: target iteration times in ms (> 0), one per sample; None takes each sample's ``y_ms``.
            source: provenance per sample (``"simulated"`` / ``"measured"``); None takes each sample's
                ``source``.
            sample_weight: weights per sample (>= 0); None takes each sample's ``weight``.
            member_masks: boolean array ``(ensemble, len(samples))``: the samples each member trains on
                (cross-fitting leaves a fold out of each); None: every member trains on every sample.
                The input features' normalisation comes from all samples (inputs only); each member's
                target offset and scale come from its own samples, so that no target a member leaves
                out reaches it.

        Raises:
            InputError: no samples, a missing or non-positive target, mismatched lengths, an unknown
                source, a mask of another shape or one leaving a member no weighted sample, or
                (residual mode) a sample without a simulator time.
        """
        with _torch_threads(self.num_threads):
            return self._fit(self._check_samples(samples), y_ms, source, sample_weight, member_masks)

    def _fit(self, samples: list[GraphSample], y_ms: Any, source: Optional[Sequence[str]],
             sample_weight: Any, member_masks: Any) -> "GNNRegressor":
        n = len(samples)
        if y_ms is None:
            missing = [i for i, s in enumerate(samples) if s.y_ms is None]
            if missing:
                raise InputError(f"GNNRegressor.fit: sample(s) {missing[:5]} have no y_ms and none was given")
            y_ms = [s.y_ms for s in samples]
        y = np.asarray(y_ms, dtype=np.float64)
        if y.shape != (n,) or not np.all(np.isfinite(y)) or np.any(y <= 0):
            raise InputError(f"GNNRegressor.fit: y_ms must be {n} finite positive times in ms")
        src = [s.source for s in samples] if source is None else list(source)
        if len(src) != n or any(s not in SOURCES for s in src):
            raise InputError(f"GNNRegressor.fit: source must be {n} values in {list(SOURCES)}")
        w = (np.array([s.weight for s in samples], dtype=np.float64) if sample_weight is None
             else np.asarray(sample_weight, dtype=np.float64))
        if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise InputError(f"GNNRegressor.fit: sample_weight must be {n} finite values >= 0")
        measured = np.array([s == "measured" for s in src])
        w1 = w * np.where(measured, 1.0, self.simulated_weight)
        if not w1.sum() > 0:
            raise InputError("GNNRegressor.fit: every sample has weight 0")
        if member_masks is None:
            masks = np.ones((self.ensemble, n), dtype=bool)
        else:
            masks = np.asarray(member_masks)
            if masks.shape != (self.ensemble, n) or masks.dtype != bool:
                raise InputError(f"GNNRegressor.fit: member_masks must be a boolean array of shape ({self.ensemble}, "
                                 f"{n}) (ensemble, samples), got {masks.dtype} {masks.shape}")
            empty = [k for k in range(self.ensemble) if not w1[masks[k]].sum() > 0]
            if empty:
                raise InputError(f"GNNRegressor.fit: member(s) {empty} of member_masks have no sample of weight > 0")
        target = np.log(y) - self._base_log(samples)

        # normalisation from the training set; one-hot or constant columns are only centred
        nodes = np.concatenate([s.node_x for s in samples]).astype(np.float64)
        self.node_mean_ = nodes.mean(0).astype(np.float32)
        std = nodes.std(0)
        self.node_std_ = np.where(std > _MIN_STD, std, 1.0).astype(np.float32)
        glob = np.stack([s.global_x for s in samples]).astype(np.float64)
        self.global_mean_ = glob.mean(0).astype(np.float32)
        std = glob.std(0)
        self.global_std_ = np.where(std > _MIN_STD, std, 1.0).astype(np.float32)
        stats = [_weighted_mean_std(target[m], w1[m]) for m in masks]
        self.target_offset_ = np.array([float(mean) for mean, _ in stats])
        self.target_scale_ = np.array([float(max(std, MIN_TARGET_SCALE)) for _, std in stats])

        dev = torch.device(self.device)
        data = self._data(samples, target, w1)
        # phase 2's copies: the caller's weights, times finetune_simulated_weight for a simulated sample (None for a
        # simulated sample without weight in phase 2: with the default 0, phase 2 is the measured samples alone)
        w2 = w * np.where(measured, 1.0, self.finetune_simulated_weight)
        in_phase2 = measured | (w2 > 0)
        ft_all: list[Optional[Data]] = [None] * n
        for i in np.flatnonzero(in_phase2):
            ft_all[i] = data[i].clone()
            ft_all[i].w = torch.tensor([w2[i]], dtype=torch.float32)
        self.modules_: list[IterationGNN] = []
        self.history_: list[dict[str, list[float]]] = []
        for k, mask in enumerate(masks):
            seed = self.seed + k * MEMBER_SEED_STEP
            torch.manual_seed(seed)
            module = self._new_module().to(dev)
            scale = (self.target_offset_[k], self.target_scale_[k])
            ft = [ft_all[i] for i in np.flatnonzero(mask & in_phase2)]
            history = {"pretrain": self._train(module, [data[i] for i in np.flatnonzero(mask)], self.pretrain_epochs,
                                               self.lr, seed, scale),
                       "finetune": self._train(module, ft, self.finetune_epochs, self.finetune_lr, seed + 1, scale)
                       if ft and w[mask & measured].sum() > 0 else []}
            self.modules_.append(module)
            self.history_.append(history)
        self.n_samples_ = n
        self.n_measured_ = int(measured.sum())
        return self

    def _train(self, module: IterationGNN, data: list[Data], epochs: int, lr: float, seed: int,
               target: tuple[float, float]) -> list[float]:
        """Train ``module`` for ``epochs`` over ``data`` with its target ``(offset, scale)``; the weighted
        mean loss per epoch."""
        if epochs == 0:
            return []
        offset, scale = float(target[0]), float(target[1])
        dev = torch.device(self.device)
        loader = self._loader(data, shuffle=True, seed=seed)
        opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs * len(loader)))
        losses = []
        module.train()
        for _ in range(epochs):
            total = wsum = 0.0
            for batch in loader:
                batch = batch.to(dev)
                out = module(batch.x, batch.edge_index, batch.edge_attr, batch.batch, batch.u)
                pred = offset + scale * out
                per = torch.nn.functional.huber_loss(pred, batch.y, reduction="none", delta=self.huber_delta)
                bw = batch.w.sum()
                if bw <= 0:
                    continue
                loss = (per * batch.w).sum() / bw
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                total += float(loss.detach()) * float(bw)
                wsum += float(bw)
            losses.append(total / wsum if wsum else math.nan)
        module.eval()
        return losses

    # ------------------------------------------------------------ prediction
    def _check_fitted(self) -> None:
        if not hasattr(self, "modules_"):
            raise InputError("GNNRegressor: not fitted (call fit or load first)")

    def predict_log(self, samples: Sequence[GraphSample]) -> np.ndarray:
        """Predicted ``log(iteration_time_ms)`` per sample (float64, input order): the mean over the
        ensemble's members."""
        return self.predict_log_members(samples).mean(axis=0)

    def predict_log_members(self, samples: Sequence[GraphSample]) -> np.ndarray:
        """Each member's predicted ``log(iteration_time_ms)``: shape ``(ensemble, len(samples))``."""
        self._check_fitted()
        samples = self._check_samples(samples)
        with _torch_threads(self.num_threads):
            return self._predict_log_members(samples)

    def _predict_log_members(self, samples: list[GraphSample]) -> np.ndarray:
        base = self._base_log(samples)
        data = self._data(samples)
        dev = torch.device(self.device)
        stacked = self._stacked_members()
        out: list[Tensor] = []
        with torch.no_grad():
            for batch in self._loader(data, shuffle=False, seed=0):
                batch = batch.to(dev)
                out.append(stacked(batch.x, batch.edge_index, batch.edge_attr, batch.batch, batch.u).cpu())
        f = torch.cat(out, dim=1).numpy().astype(np.float64)
        return base + self.target_offset_[:, None] + self.target_scale_[:, None] * f

    def _stacked_members(self) -> IterationGNNEnsemble:
        """The members stacked into one :class:`IterationGNNEnsemble`, built on first use after each fit or
        load (kept with the list of modules it was built from, so a refit or reload rebuilds it)."""
        cached = getattr(self, "_stacked", None)
        if cached is None or cached[0] is not self.modules_:
            cached = (self.modules_, IterationGNNEnsemble(self.modules_).eval())
            self._stacked = cached
        return cached[1]

    def predict(self, samples: Sequence[GraphSample]) -> np.ndarray:
        """Predicted iteration time in ms per sample (input order)."""
        return np.exp(self.predict_log(samples))

    # ------------------------------------------------------------ storage
    def save(self, directory: str | Path) -> list[Path]:
        """Write ``gnn.safetensors`` and ``gnn.json`` into ``directory``; return the written paths."""
        from safetensors.torch import save_file

        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        weights = directory / WEIGHTS_FILE
        state = {f"member{i}.{k}": v.detach().cpu().contiguous()
                 for i, module in enumerate(self.modules_) for k, v in module.state_dict().items()}
        # one metadata key: safetensors writes its metadata map in a per-process random order, so two keys made
        # the file's bytes (and sha256) differ between trainings of the same weights; the sidecar has the schema
        save_file(state, str(weights), metadata={"format": FORMAT})
        meta = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "mode": self.mode, "target": TARGETS[self.mode],
            "time_unit": "ms", "params": self.get_params(), "feature_schema": graph_feature_schema_dict(),
            "normalisation": {"node_mean": self.node_mean_.tolist(), "node_std": self.node_std_.tolist(),
                              "global_mean": self.global_mean_.tolist(), "global_std": self.global_std_.tolist(),
                              "target_offset": self.target_offset_.tolist(),
                              "target_scale": self.target_scale_.tolist()},
            "tensors": {k: list(v.shape) for k, v in state.items()},
            "weights_file": WEIGHTS_FILE, "weights_bytes": weights.stat().st_size,
            "weights_sha256": sha256_file(weights),
            "training": {"n_samples": self.n_samples_, "n_measured": self.n_measured_, "history": self.history_},
        }
        path = directory / META_FILE
        path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return [weights, path]

    @classmethod
    def load(cls, directory: str | Path, device: Optional[str] = None) -> "GNNRegressor":
        """Load a regressor written by :meth:`save` (onto ``device``, default the saved one). A sidecar of
        format version 1, written before ensembles, loads as an ensemble of one network.

        Raises:
            InputError: a file is missing or unreadable; the weights' size or sha256 differs from
                ``gnn.json`` (truncated or tampered); the feature schema version or names differ
                from this package's; a tensor is missing or has another shape.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        directory = Path(directory)
        meta_path, weights = directory / META_FILE, directory / WEIGHTS_FILE
        meta = load_json_object(meta_path, f"{FORMAT} checkpoint", FORMAT)
        version = meta.get("format_version")
        if isinstance(version, bool) or version not in READABLE_FORMAT_VERSIONS:
            raise InputError(f"{meta_path}: {FORMAT} checkpoint format version {version!r}; this learnedperf reads "
                             f"versions {', '.join(map(str, READABLE_FORMAT_VERSIONS))}")
        one_network = version == 1
        fs = meta.get("feature_schema")
        if not isinstance(fs, dict) or fs.get("version") != GRAPH_FEATURE_SCHEMA_VERSION:
            got = fs.get("version") if isinstance(fs, dict) else None
            raise InputError(f"{meta_path}: graph feature schema version {got!r} is incompatible with this "
                             f"package's v{GRAPH_FEATURE_SCHEMA_VERSION}")
        ours = graph_feature_schema_dict()
        for part in ("node", "edge", "global"):
            if not isinstance(fs.get(part), dict) or fs[part].get("names") != ours[part]["names"]:
                raise InputError(f"{meta_path}: {part} feature names differ from this package's graph feature "
                                 f"schema v{GRAPH_FEATURE_SCHEMA_VERSION}")
        if fs.get("simulator_global_features") != ours["simulator_global_features"]:
            raise InputError(f"{meta_path}: simulator_global_features differ from this package's schema")
        if not weights.is_file():
            raise InputError(f"{weights}: missing")
        size = weights.stat().st_size
        if size != meta.get("weights_bytes"):
            raise InputError(f"{weights}: {size} bytes, {META_FILE} says {meta.get('weights_bytes')} "
                             "(truncated or changed; its sha256 cannot match)")
        if sha256_file(weights) != meta.get("weights_sha256"):
            raise InputError(f"{weights}: sha256 differs from {META_FILE} (file changed or corrupted)")
        try:
            params = dict(meta["params"])
            if one_network and "ensemble" in params:
                raise InputError(f"{meta_path}: format version 1 is one network; its params cannot name 'ensemble'")
            if device is not None:
                params["device"] = device
            self = cls(**params)
            norm = meta["normalisation"]
            dims = {"node": len(NODE_FEATURE_SCHEMA.features), "global": len(GLOBAL_FEATURE_SCHEMA.features)}
            for part in ("node", "global"):
                for stat in ("mean", "std"):
                    arr = np.asarray(norm[f"{part}_{stat}"], dtype=np.float32)
                    if arr.shape != (dims[part],) or not np.all(np.isfinite(arr)):
                        raise InputError(f"{meta_path}: normalisation {part}_{stat} must be {dims[part]} "
                                         "finite numbers")
                    setattr(self, f"{part}_{stat}_", arr)
            for stat in ("offset", "scale"):
                value = norm[f"target_{stat}"]
                arr = np.asarray([value] if one_network else value, dtype=np.float64)
                if arr.shape != (self.ensemble,) or not np.all(np.isfinite(arr)) or (stat == "scale"
                                                                                    and not np.all(arr > 0)):
                    raise InputError(f"{meta_path}: normalisation target_{stat} must be {self.ensemble} finite "
                                     f"number(s){' > 0' if stat == 'scale' else ''}, one per ensemble member")
                setattr(self, f"target_{stat}_", arr)
            training = meta.get("training") or {}
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError(f"{meta_path}: malformed ({type(exc).__name__}: {exc})") from None
        try:
            state = load_file(str(weights))
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputError(f"{weights}: not a safetensors file ({exc})") from None
        have = {k: list(v.shape) for k, v in state.items()}
        if have != meta.get("tensors"):
            raise InputError(f"{weights}: tensor names/shapes differ from the 'tensors' list of {META_FILE}")
        if one_network:  # version 1's names are the one network's own: they are member 0's
            state = {f"member0.{k}": v for k, v in state.items()}
            have = {f"member0.{k}": v for k, v in have.items()}
        modules = [self._new_module() for _ in range(self.ensemble)]
        want = {f"member{i}.{k}": list(v.shape) for i, m in enumerate(modules) for k, v in m.state_dict().items()}
        if have != want:
            missing = sorted(set(want) - set(have))
            extra = sorted(set(have) - set(want))
            wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
            raise InputError(f"{weights}: tensors do not fit {self.ensemble} IterationGNN(hidden={self.hidden}, "
                             f"num_layers={self.num_layers}): missing {missing[:3]}, unexpected {extra[:3]}, "
                             f"wrong shape {wrong[:3]}")
        for i, module in enumerate(modules):
            prefix = f"member{i}."
            module.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)},
                                   strict=True)
        self.modules_ = [m.to(torch.device(self.device)).eval() for m in modules]
        history = training.get("history", [])
        self.history_ = [history] if one_network else history
        self.n_samples_ = int(training.get("n_samples", 0))
        self.n_measured_ = int(training.get("n_measured", 0))
        return self


__all__ = ["FORMAT", "META_FILE", "MODES", "WEIGHTS_FILE", "GNNRegressor", "GraphSample", "IterationGNN",
           "IterationGNNEnsemble", "LogSumExpAggregation", "NodeBudgetBatches", "make_sample", "sample_from_record"]
