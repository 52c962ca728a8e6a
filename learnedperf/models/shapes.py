"""Measured layer shapes: what a method missed on measured runs whose per-device layers are the same.

A step's time is mostly its layers' kernels, and a kernel's efficiency on a device depends on its
shape: vTrain's A100 steps miss the simulator by up to ±25 % by (tensor-parallel size, hidden size,
micro-batch), the same miss at every pipeline depth and data-parallel width (within 1-5 %). No model
that has not seen that shape on that device can know such a miss (cuBLAS's choice of kernel for it);
a measured run with the same per-device layers has it. So a method's *shape memory* keeps, for each
**shape key** of the measured runs it calibrated on, the median of ``log(measured / predicted)`` of its
out-of-sample predictions there (held out or out of fold, never a prediction of a model that trained on
the run), and a prediction of a run with that key is multiplied by ``exp`` of it. A run with no measured
run of its key is predicted as before: the memory reaches only what a cluster's own measurements
covered, and says nothing on a device, model or layer shape nobody measured.

The key (:func:`shape_key`) is the device, its cluster and node size, the whole architecture and every
strategy field that changes what one device's layers compute or exchange (tensor, context and expert
parallel sizes, micro-batch, precision, recomputation, kernels, optimizer); it leaves out the fields that
change only how many layers a device holds, how often it runs them and how the replicas meet
(:data:`FREE_STRATEGY_FIELDS`: pipeline depth and schedule, data parallelism and ZeRO/FSDP sharding, the
global batch), so that a run's layers are looked up across those.

A method that corrects the simulator (``gnn_residual``) may keep its memory over the simulator under it instead
(``over="simulator"``): the medians are then of ``log(measured / simulated)`` and a hit is the simulator's time
times the factor. Its correction moves with the free fields that a key's runs differ in, so its own residuals
carry another strategy's correction along; which base a method's memory is over is decided on its calibration
runs (:meth:`~learnedperf.models.iteration.IterationModel.fit`).
"""

from __future__ import annotations

import json
import math
from statistics import median
from typing import Any

from ..errors import InputError

SHAPES_SUFFIX = "+shapes"
"""A method name ending in this uses its shape memory (``gnn_residual+shapes``)."""

FREE_STRATEGY_FIELDS = ("pp", "dp", "global_batch_size", "pipeline_schedule", "virtual_pipeline_stages", "zero_stage",
                        "fsdp", "dp_replicate", "overlap_grad_reduce", "overlap_param_gather", "grad_reduce_precision")
"""Strategy fields outside the shape key: they change how many layers a device holds, how many micro-batches it
runs and how the data-parallel replicas exchange or shard their states, not the shapes of one layer's kernels.
Every other field (a new one included) is in the key, so that a field nobody thought of keeps runs apart."""

SHAPES_VERSION = 2
"""Version of the memory's file: of :func:`shape_key` and of what a median is over. 2 added ``over``; a file of
version 1 is read as ``over="model"`` (what its medians were), any other version is refused."""

OVER = ("model", "simulator")
"""What a memory's medians are residuals of, and so what a hit multiplies: the method's own point model, or the
simulator under it (:class:`ShapeMemory`'s ``over``)."""


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _model_json(model: Any) -> str:
    out = model.to_dict()
    out.pop("name", None)
    return _dumps(out)


#: three required fields of an architecture: a run whose device and these match no key needs no JSON at all
_COARSE_FIELDS = ("num_layers", "hidden_size", "seq_length")


def _head(spec: Any, model_json: str) -> str:
    # the key's first four items, joined as json.dumps joins a list's items (so that head + strategy is the key)
    hw = spec.hardware
    return ",".join((_dumps(hw.device.name), _dumps(hw.cluster), _dumps(hw.devices_per_node), model_json))


def _strategy_json(spec: Any) -> str:
    return _dumps({k: v for k, v in spec.strategy.to_dict().items() if k not in FREE_STRATEGY_FIELDS})


def shape_key(spec: Any) -> str:
    """The shape key of a :class:`~learnedperf.specs.RunSpec`: a canonical JSON list of its device, cluster and
    node size, its architecture (without the model's name: an inline copy of a catalog model is the same layers)
    and its strategy less :data:`FREE_STRATEGY_FIELDS`."""
    return "[" + _head(spec, _model_json(spec.model)) + "," + _strategy_json(spec) + "]"


class ShapeMemory:
    """The median out-of-sample log residual of a method per shape key (scikit-learn style: ``fit`` returns self).

    Args:
        min_runs: measured runs a key needs before its median is used (1: any measured run of the shape).
        over: what the residuals given to ``fit`` are of, and what a hit's factor multiplies (:data:`OVER`):
            ``"model"``, the method's own point model, or ``"simulator"``, the simulator under a correcting model.
            The memory does not choose: :class:`~learnedperf.models.iteration.IterationModel` does.

    Attributes:
        table_: shape key → ``(median log(measured / predicted), runs)``.
        devices_: the device names of the keys (a lookup skips the key of a run on any other device).
    """

    def __init__(self, min_runs: int = 1, over: str = "model"):
        if isinstance(min_runs, bool) or not isinstance(min_runs, int) or min_runs < 1:
            raise InputError(f"shape memory: min_runs must be an integer >= 1, got {min_runs!r}")
        if over not in OVER:
            raise InputError(f"shape memory: over must be one of {', '.join(OVER)}, got {over!r}")
        self.min_runs = min_runs
        self.over = over

    def fit(self, keys: list[str], log_residuals: Any) -> "ShapeMemory":
        """Keep each key's median of ``log_residuals`` (``log(measured / predicted)`` of out-of-sample predictions)."""
        res = [float(r) for r in log_residuals]
        if len(res) != len(keys):
            raise InputError(f"shape memory: {len(keys)} keys but {len(res)} residuals")
        if not all(math.isfinite(r) for r in res):
            raise InputError("shape memory: a residual is not finite")
        by_key: dict[str, list[float]] = {}
        for k, r in zip(keys, res):
            by_key.setdefault(k, []).append(r)
        self.table_ = {k: (median(v), len(v)) for k, v in sorted(by_key.items()) if len(v) >= self.min_runs}
        return self._index()

    def _index(self) -> "ShapeMemory":
        # what a lookup checks before it builds a whole key: the devices, then (device, cluster, node, model)
        items = [json.loads(k) for k in self.table_]
        self.devices_ = frozenset(it[0] for it in items)
        self._coarse = frozenset((it[0],) + tuple(it[3][f] for f in _COARSE_FIELDS) for it in items)
        self._heads = frozenset(",".join(_dumps(x) for x in it[:4]) for it in items)
        self._models: dict[Any, str] = {}
        return self

    def _check(self) -> None:
        if not hasattr(self, "table_"):
            raise InputError("shape memory is not fitted")

    def lookup(self, specs: list) -> tuple[list[float], list[int]]:
        """``(log factor, runs)`` per spec: the median of its key, or ``(0.0, 0)`` where no measured run has it."""
        self._check()
        factors, counts = [], []
        for spec in specs:
            hit = None
            # a planner asks thousands of strategies of one model: its JSON is made once, and the strategy's only
            # where some measured run had this device and model (a run of another size skips both)
            coarse = (spec.hardware.device.name,) + tuple(getattr(spec.model, f) for f in _COARSE_FIELDS)
            if coarse in self._coarse:
                model = self._models.get(spec.model)
                if model is None:
                    if len(self._models) >= 1024:
                        self._models.clear()
                    model = self._models[spec.model] = _model_json(spec.model)
                head = _head(spec, model)
                if head in self._heads:
                    hit = self.table_.get("[" + head + "," + _strategy_json(spec) + "]")
            factors.append(hit[0] if hit else 0.0)
            counts.append(hit[1] if hit else 0)
        return factors, counts

    def leave_group_out(self, keys: list[str], log_residuals: Any, groups: Any) -> tuple[list[float], list[int]]:
        """For the runs the memory is fitted on: ``(log factor, runs)`` of each from the runs of its key in *other*
        groups (strategy groups), as a run of a new strategy would get it — what its interval calibrates on."""
        res = [float(r) for r in log_residuals]
        groups = [str(g) for g in groups]
        by_key: dict[str, list[tuple[str, float]]] = {}
        for k, g, r in zip(keys, groups, res):
            by_key.setdefault(k, []).append((g, r))
        factors, counts = [], []
        for k, g in zip(keys, groups):
            others = [r for gg, r in by_key[k] if gg != g]
            use = len(others) >= self.min_runs
            factors.append(median(others) if use else 0.0)
            counts.append(len(others) if use else 0)
        return factors, counts

    def to_dict(self) -> dict:
        """JSON state: ``{"version", "min_runs", "over", "table": {key: [median, runs]}}``."""
        self._check()
        return {"version": SHAPES_VERSION, "min_runs": self.min_runs, "over": self.over,
                "table": {k: [m, n] for k, (m, n) in self.table_.items()}}

    @classmethod
    def from_dict(cls, data: Any, where: str = "shape memory") -> "ShapeMemory":
        """Inverse of :meth:`to_dict`; anything malformed raises :class:`InputError` naming ``where`` and the entry."""
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected a JSON object")
        version = data.get("version")
        if version not in (1, SHAPES_VERSION) or isinstance(version, bool):
            raise InputError(f"{where}: version {version!r}, this code reads 1 and {SHAPES_VERSION} "
                             "(retrain with 'learnedperf train')")
        if version == 1 and "over" in data:
            raise InputError(f"{where}: version 1 has no 'over' (its medians are over the model)")
        try:
            # version 1 was written before a memory could be over the simulator: its medians are the model's
            obj = cls(data.get("min_runs"), data.get("over") if version != 1 else "model")
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        table = data.get("table")
        if not isinstance(table, dict):
            raise InputError(f"{where}: 'table' must be a JSON object")
        out = {}
        for key, entry in table.items():
            try:
                items = json.loads(key)
                ok = (isinstance(items, list) and len(items) == 5 and isinstance(items[0], str)
                      and isinstance(items[3], dict) and isinstance(items[4], dict)
                      and all(f in items[3] for f in _COARSE_FIELDS))
            except (ValueError, TypeError):
                ok = False
            if not ok:
                raise InputError(f"{where}: key {key[:80]!r} is not a shape key")
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], (int, float))
                    and not isinstance(entry[0], bool) and math.isfinite(entry[0]) and isinstance(entry[1], int)
                    and not isinstance(entry[1], bool) and entry[1] >= obj.min_runs):
                raise InputError(f"{where}: entry of key {key[:80]!r} must be [finite median, runs >= min_runs], "
                                 f"got {entry!r}")
            out[key] = (float(entry[0]), int(entry[1]))
        obj.table_ = out
        return obj._index()


__all__ = ["FREE_STRATEGY_FIELDS", "OVER", "SHAPES_SUFFIX", "SHAPES_VERSION", "ShapeMemory", "shape_key"]
