"""Training and evaluation runs of the learned models, assembled from a generated data set.

:func:`load_runs` reads a data set written by ``learnedperf generate`` (simulated and
measured records, their execution graphs) and returns a :class:`Runs` table: one row
per usable record with its spec, its graph, and the simulator's answer under each
*base* the models build on:

* ``sim_ms`` — the simulator on the fitted roofline cost model (the record's own
  ``sim_iteration_time_ms``);
* ``sim_ops_ms`` — the simulator on learned operator costs
  (:class:`~learnedperf.models.gbdt.LearnedOpCost`), when an operator regressor is given.

Measured records store no simulated breakdown, so they are simulated again here (the
graph features need it). A record that cannot be used (no graph, no simulator answer,
no positive target) is counted by reason in :attr:`Runs.dropped` — never dropped silently.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError

#: Breakdown columns of a record, in the simulator's ``breakdown_ms`` keys.
BREAKDOWN_COLUMNS = {"forward": "forward_ms", "backward": "backward_ms", "recompute": "recompute_ms",
                     "compute": "compute_ms", "optimizer": "optimizer_ms",
                     "exposed_communication": "exposed_communication_ms", "pipeline_bubble": "pipeline_bubble_ms"}


@dataclass
class Runs:
    """Usable runs of a data set, aligned row by row.

    Attributes:
        records: the records (pandas DataFrame, index 0..n-1).
        specs: the parsed :class:`~learnedperf.specs.RunSpec` of each row.
        graphs: the coarsened execution graph of each row (dict of numpy arrays).
        breakdown_ms: the roofline simulator's breakdown of each row.
        sim_ms: the roofline simulator's iteration time of each row (numpy).
        sim_ops: ``(sim_ops_ms, breakdown_ms list, learned node times list)`` on learned op costs, or None;
            simulated rows have NaN ``sim_ops_ms`` and the roofline breakdown (see :func:`load_runs`).
        dropped: unusable records by reason.
        op_regressor: the operator regressor ``sim_ops`` was computed with (None without).
    """

    records: Any
    specs: list
    graphs: list
    breakdown_ms: list
    sim_ms: Any
    sim_ops: Optional[tuple] = None
    dropped: Counter = field(default_factory=Counter)
    op_regressor: Any = None

    def __len__(self) -> int:
        return len(self.records)

    @property
    def measured(self):
        """Boolean numpy mask of measured rows."""
        return (self.records["source"] == "measured").to_numpy()

    def subset(self, mask: Any) -> "Runs":
        """The rows where boolean ``mask`` is true, as a new :class:`Runs`."""
        import numpy as np

        idx = np.flatnonzero(np.asarray(mask, dtype=bool))
        sim_ops = None
        if self.sim_ops is not None:
            t, bd, nodes = self.sim_ops
            sim_ops = (t[idx], [bd[i] for i in idx], [nodes[i] for i in idx])
        return Runs(self.records.iloc[idx].reset_index(drop=True), [self.specs[i] for i in idx],
                    [self.graphs[i] for i in idx], [self.breakdown_ms[i] for i in idx], self.sim_ms[idx], sim_ops,
                    Counter(self.dropped), self.op_regressor)


def _record_breakdown(row: Any) -> Optional[dict]:
    out = {}
    for key, col in BREAKDOWN_COLUMNS.items():
        v = row[col]
        if v is None or v != v:
            return None
        out[key] = float(v)
    return out


def _breakdown(breakdown_ms: Any) -> dict:
    """The :data:`BREAKDOWN_COLUMNS` parts of a prediction's ``breakdown_ms``, as floats (0 where absent)."""
    return {k: float(breakdown_ms.get(k, 0.0)) for k in BREAKDOWN_COLUMNS}


def _learned_simulation(spec: Any, regressor: Any, comm: Any = None) -> tuple[float, dict]:
    """(iteration ms, breakdown) of ``spec`` simulated on learned operator costs (``comm``: their roofline,
    default ``RooflineCost(spec.hardware)``)."""
    from ..simulate import simulate
    from .gbdt import LearnedOpCost

    res = simulate(spec, cost=LearnedOpCost(spec.hardware, regressor, comm=comm).prefetch_run(spec)).to_prediction()
    return res["iteration_time_ms"], _breakdown(res["breakdown_ms"])


def learned_node_times_s(graph: dict, spec: Any, regressor: Any, comm: Any = None):
    """The learned operator costs' seconds for every compute node of ``graph`` (NaN for collectives):
    the regressor's where it covers the op, the roofline's elsewhere (:class:`~learnedperf.models.gbdt.LearnedOpCost`;
    ``comm``: that roofline, default ``RooflineCost(spec.hardware)``).

    The ops come from :func:`~learnedperf.data.graphs.node_op` (a causal mask is not stored:
    attention nodes count as non-causal).
    """
    import numpy as np

    from ..data.graphs import node_op
    from .gbdt import LearnedOpCost

    out = np.full(len(graph["kind"]), np.nan)
    compute = np.flatnonzero(~graph["is_comm"])
    if len(compute):
        ops = [node_op(graph, int(i)) for i in compute]
        cost = LearnedOpCost(spec.hardware, regressor, comm=comm)
        cost.prefetch(ops)
        out[compute] = [cost.compute_time_s(op) for op in ops]
    return out


def unusable_reason(shard: Any, sim_ms: Any, time_ms: Any) -> Optional[str]:
    """Why a record (its ``graph_shard``, ``sim_iteration_time_ms`` and ``iteration_time_ms``) cannot train or
    test a method, or None when it can."""
    if shard is None or shard != shard:
        return "no execution graph"
    if sim_ms is None or not sim_ms == sim_ms or sim_ms <= 0:
        return "the simulator has no answer"
    if time_ms is None or not time_ms == time_ms or time_ms <= 0:
        return "no positive iteration_time_ms"
    return None


def check_simulator(data_dir: str | Path) -> None:
    """Refuse a data set whose simulated labels another simulator computed.

    Its records store the simulator's times (the simulated runs' targets, the measured runs' residual
    baselines), so a model fitted on them corrects the simulator that generated them, not this one.

    Raises:
        InputError: the data set's manifest has no ``simulator_fingerprint`` (written before it was recorded)
            or another one than this code's.
    """
    from ..data.store import MANIFEST
    from ..io import load_json_file
    from ..simulate.fingerprint import simulator_fingerprint

    path = Path(data_dir) / MANIFEST
    theirs, ours = load_json_file(path).get("simulator_fingerprint"), simulator_fingerprint()
    if theirs != ours:
        why = ("records no simulator fingerprint (generated before it was recorded)" if theirs is None
               else f"was generated by a simulator with fingerprint {theirs}, this code's is {ours}")
        raise InputError(f"{path}: the data set {why}: its simulated times are not this simulator's; "
                         "generate it again with 'learnedperf generate'")


def load_runs(data_dir: str | Path, op_regressor: Any = None, sources: tuple[str, ...] = ("simulated", "measured"),
              limit_simulated: Optional[int] = None, progress: bool = False, node_times: bool = True) -> Runs:
    """Read the usable runs of the data set ``data_dir``.

    Args:
        data_dir: a data set written by ``learnedperf generate`` (checked against its manifest).
        op_regressor: a fitted :class:`~learnedperf.models.gbdt.OpTimeRegressor`; when given, every
            row is also simulated on learned operator costs (``Runs.sim_ops``).
        sources: which record sources to read.
        limit_simulated: keep at most this many simulated rows (the first by sample index).
        progress: show a progress bar on stderr.
        node_times: with ``op_regressor``, also predict every graph node's time (the node feature of
            ``gnn_residual+ops``; minutes for thousands of large graphs). Without it those entries are None.
    """
    import numpy as np

    from ..cost import RooflineCost
    from ..data.graphs import load_graphs
    from ..data.store import load_records
    from ..simulate import simulate
    from ..specs import RunSpec

    data_dir = Path(data_dir)
    df = load_records(data_dir, sources=sources, check=True)
    check_simulator(data_dir)
    if limit_simulated is not None:
        sim_rows = df.index[df["source"] == "simulated"]
        df = df.drop(sim_rows[limit_simulated:])
    dropped: Counter = Counter()
    keep = np.ones(len(df), dtype=bool)
    for i, cols in enumerate(zip(df["graph_shard"], df["sim_iteration_time_ms"], df["iteration_time_ms"])):
        reason = unusable_reason(*cols)
        if reason is not None:
            dropped[reason] += 1
            keep[i] = False
    df = df[keep].reset_index(drop=True)
    if len(df) == 0:
        raise InputError(f"{data_dir}: no usable run (dropped: {dict(dropped)})")
    graphs = load_graphs(data_dir, list(zip(df["graph_shard"], df["graph_row"].astype(int))))
    specs, breakdowns = [], []
    sim_ops_t, sim_ops_bd, node_times_s = [], [], []
    rows = df.to_dict("records")
    bar = _progress(len(rows), "simulate runs", progress)
    for row, graph in zip(rows, graphs):
        spec = RunSpec.from_dict(json.loads(row["run"]))
        specs.append(spec)
        bd = _record_breakdown(row)
        if bd is None:
            bd = simulate(spec, cost=RooflineCost(spec.hardware)).to_prediction()["breakdown_ms"]
        breakdowns.append(_breakdown(bd))
        if op_regressor is not None:
            if row["source"] == "measured":
                t_ms, learned_bd = _learned_simulation(spec, op_regressor)
                sim_ops_t.append(t_ms)
                sim_ops_bd.append(learned_bd)
            else:
                # a simulated run's target is the roofline simulator's own answer: a model built on the
                # learned-cost simulator anchors it at that target (IterationModel.samples), so the learned
                # simulation (seconds per large run) is not needed; the breakdown stays the roofline's
                sim_ops_t.append(float("nan"))
                sim_ops_bd.append(breakdowns[-1])
            node_times_s.append(learned_node_times_s(graph, spec, op_regressor) if node_times else None)
        bar.update(1)
    bar.close()
    sim_ops = (np.asarray(sim_ops_t, dtype=float), sim_ops_bd, node_times_s) if op_regressor is not None else None
    return Runs(df, specs, graphs, breakdowns, df["sim_iteration_time_ms"].to_numpy(dtype=float), sim_ops, dropped,
                op_regressor)


def with_cost_params(runs: Runs, params: Any, node_times: bool = True) -> Runs:
    """A copy of ``runs`` whose rows on devices described by measurement (those with kernel curves) are
    simulated again with cost constants ``params``: their roofline time, breakdown and graph op times,
    their time on learned operator costs and learned node times when ``runs`` has them, and a simulated
    row's target (the simulator's own answer). Every other row is shared, unchanged.

    What :func:`learnedperf.models.evaluate.evaluate` uses to hold a CPU's steps out of the constants
    fitted on measured devices' steps (:mod:`learnedperf.simulate.calibrate`).

    Raises:
        InputError: a row on such a device that the simulator cannot answer with ``params``.
    """
    import numpy as np

    from ..cost import RooflineCost
    from ..data.graphs import graph_of
    from ..graph.execution import compile_run
    from ..simulate import simulate

    rows = [i for i, spec in enumerate(runs.specs) if spec.hardware.device.kernel_curves is not None]
    records = runs.records.copy()
    graphs, breakdowns, sim_ms = list(runs.graphs), list(runs.breakdown_ms), np.array(runs.sim_ms, dtype=float)
    sim_ops = None
    if runs.sim_ops is not None:
        sim_ops = (np.array(runs.sim_ops[0], dtype=float), list(runs.sim_ops[1]), list(runs.sim_ops[2]))
    measured = runs.measured
    target = records.columns.get_loc("iteration_time_ms")
    stored = {col: records.columns.get_loc(col) for col in ("sim_iteration_time_ms", *BREAKDOWN_COLUMNS.values())}
    for i in rows:
        spec = runs.specs[i]
        cost = RooflineCost(spec.hardware, params)
        try:
            pred = simulate(spec, cost=cost).to_prediction()
            graph = graph_of(compile_run(spec), cost)
        except Exception as exc:  # noqa: BLE001 - named, with the run, in one error
            raise InputError(f"run {records['run_id'].iat[i]}: cannot be simulated with the refitted measured-device "
                             f"constants: {type(exc).__name__}: {exc}") from exc
        graphs[i] = {**runs.graphs[i], **graph}
        sim_ms[i] = pred["iteration_time_ms"]
        breakdowns[i] = _breakdown(pred["breakdown_ms"])
        # the record's own simulator columns follow, so that nothing reads the old constants' answer
        records.iat[i, stored["sim_iteration_time_ms"]] = pred["iteration_time_ms"]
        for key, col in BREAKDOWN_COLUMNS.items():
            records.iat[i, stored[col]] = breakdowns[i][key]
        if not measured[i]:
            records.iat[i, target] = pred["iteration_time_ms"]  # a simulated row's target is the simulator's answer
        if sim_ops is not None:
            if measured[i]:
                sim_ops[0][i], sim_ops[1][i] = _learned_simulation(spec, runs.op_regressor, comm=cost)
            else:
                sim_ops[1][i] = breakdowns[i]
            if node_times:
                sim_ops[2][i] = learned_node_times_s(graphs[i], spec, runs.op_regressor, comm=cost)
    return Runs(records, list(runs.specs), graphs, breakdowns, sim_ms, sim_ops, Counter(runs.dropped),
                runs.op_regressor)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    import sys

    # a bar only on a terminal: redirected to a file, tqdm's carriage returns make megabytes of log
    return tqdm(total=total, desc=desc, disable=not (enabled and sys.stderr.isatty()), leave=False, mininterval=1.0)


def strategy_group(records: Any):
    """Label of each record's (model, cluster, batch): the strategies of one group are ranked
    against each other (Kendall τ, top-1 regret)."""
    cols = ["model_name", "num_layers", "hidden_size", "seq_length", "device_name", "num_devices",
            "global_batch_size", "precision"]
    return records[cols].astype(str).agg("|".join, axis=1).to_numpy()


def device_class(name: str) -> str:
    """Interval calibration group of a device name: ``cpu`` (this project's CPU devices are named
    ``cpu-...``) or ``accelerator`` — CPU steps err differently from GPU steps."""
    return "cpu" if str(name).lower().startswith("cpu") else "accelerator"


def device_group(name: str, num_devices: int) -> tuple[str, str]:
    """Interval calibration groups of a run on ``num_devices`` devices of type ``name``, the most specific first:
    ``("device:<type>:single" or "device:<type>:multi", class)`` (:func:`device_class`). A device with enough
    calibration runs is calibrated on its own: the errors of a device's steps depend on its kernels and its host,
    and one class pools an A100's framework steps with a Hopper's host-bound eager ones. Its pair describes runs
    of the kind it was calibrated on, so one device and several are told apart: a multi-GPU run on a GPU measured
    in single-GPU steps only keeps its class's pair (no collective was in those errors)."""
    return (f"device:{name}:{'single' if int(num_devices) == 1 else 'multi'}", device_class(name))


#: prefix of the calibration groups of runs a shape memory corrected (:func:`shape_group`)
SHAPE_GROUP_PREFIX = "shapes:"


def shape_group(group: tuple[str, ...], shape_hit: bool) -> tuple[str, ...]:
    """The calibration groups of a run of ``group`` (:func:`device_group`) as a ``+shapes`` method calibrates it: a
    run its shape memory corrected (``shape_hit``) errs like the corrected runs, far less than one it could not,
    so it has groups of its own, ``shapes:``-prefixed and then all corrected runs pooled (``shapes:*``); the others
    keep theirs, calibrated on the uncorrected runs only."""
    if not shape_hit:
        return group
    return tuple(SHAPE_GROUP_PREFIX + g for g in group) + (SHAPE_GROUP_PREFIX + "*",)


def interval_group(records: Any, shape_hits: Any = None) -> list:
    """Mondrian calibration groups (:func:`device_group`) of each record's device type and device count (with
    ``shape_hits``, a boolean per record: those of :func:`shape_group`)."""
    groups = [device_group(str(n), int(k)) for n, k in zip(records["device_type"], records["num_devices"])]
    if shape_hits is None:
        return groups
    return [shape_group(g, bool(h)) for g, h in zip(groups, shape_hits)]


__all__ = ["BREAKDOWN_COLUMNS", "Runs", "SHAPE_GROUP_PREFIX", "check_simulator", "device_class", "device_group",
           "interval_group", "learned_node_times_s", "load_runs", "shape_group", "strategy_group", "with_cost_params"]
