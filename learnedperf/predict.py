"""The predictor: one run in the DESIGN.md format in, one prediction object out, from a checkpoint.

:meth:`Predictor.load` verifies a checkpoint (default ``checkpoints/default``) and
:meth:`Predictor.predict` answers with its method:

1. the simulator runs the run on the checkpoint's cost model (the fitted roofline, or the
   checkpoint's learned operator costs) — it gives memory, ``fits_in_memory`` and the breakdown;
2. a GNN method corrects (``gnn_residual*``) or replaces (``gnn_direct``) the iteration time
   from the run's coarsened execution graph; the breakdown is scaled to the corrected time
   (``breakdown_scale`` says by how much);
3. the 90 % interval comes from the checkpoint's conformal calibration on held-out measured runs.

``source`` names the checkpoint and method; ``simulator_iteration_time_ms`` keeps the
simulator's own answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .errors import InputError


class Predictor:
    """Predicts runs with a verified checkpoint.

    Args:
        checkpoint: a loaded :class:`~learnedperf.checkpoint.Checkpoint`.
    """

    def __init__(self, checkpoint: Any):
        self.checkpoint = checkpoint

    @classmethod
    def load(cls, path: Optional[str | Path] = None) -> "Predictor":
        """Load and verify the checkpoint at ``path`` (default ``checkpoints/default``)."""
        from .checkpoint import load_checkpoint

        return cls(load_checkpoint(path))

    @property
    def source(self) -> str:
        """The ``source`` of this predictor's answers."""
        return self.checkpoint.source

    def predict(self, run: Any) -> dict:
        """The prediction object of ``run`` (a run-format dict or a :class:`RunSpec`).

        Raises:
            SpecError / InputError: the run is invalid (the message names the field).
        """
        return self.predict_with_result(run)[0]

    def predict_with_result(self, run: Any, trace: bool = False) -> tuple[dict, Any]:
        """``(prediction, SimResult)``: the prediction and the simulator result under it."""
        import math

        from .cost import RooflineCost
        from .graph.execution import compile_run
        from .simulate import simulate
        from .simulate.memory import memory_microbatches
        from .specs import RunSpec

        ck = self.checkpoint
        spec = run if isinstance(run, RunSpec) else RunSpec.from_dict(run)
        # one compile serves the op prefetch and the GNN's graph: with the memory schedule's micro-batches
        # the coarsened graph is the same as with all of them (per_iteration comes from the run), and cheaper
        eg = compile_run(spec, memory_microbatches(spec)) if (ck.op_regressor is not None or ck.gnn is not None) \
            else None
        if ck.op_regressor is not None:
            from .models.gbdt import LearnedOpCost

            cost = LearnedOpCost(spec.hardware, ck.op_regressor).prefetch_graph(eg)
        else:
            cost = RooflineCost(spec.hardware)
        result = simulate(spec, cost=cost, trace=trace)
        pred = result.to_prediction(source=ck.source)
        base = pred["iteration_time_ms"]
        if ck.method == "formula":
            from .models.iteration import ideal_time_ms

            t = float(ideal_time_ms([spec])[0]) / ck.formula_mfu
        elif ck.gnn is not None:
            t = float(self._gnn_time_ms(spec, eg, base, pred["breakdown_ms"]))
        else:
            t = base
        if not (math.isfinite(t) and t > 0):
            raise InputError(f"checkpoint {ck.path.name}: the model produced an invalid time {t!r} for this run")
        from .models.dataset import device_class

        lo, hi = ck.interval.interval([t], [device_class(spec.hardware.device.name)])
        scale = t / base
        pred.update({
            "iteration_time_ms": t,
            "tokens_per_second": pred["tokens_per_second"] / scale,
            "samples_per_second": pred["samples_per_second"] / scale,
            "tflops_per_device": pred["tflops_per_device"] / scale,
            "mfu": pred["mfu"] / scale,
            "breakdown_ms": {k: v * scale for k, v in pred["breakdown_ms"].items()},
            "breakdown_scale": scale,
            "simulator_iteration_time_ms": base,
            "interval_ms": [float(lo[0]), float(hi[0])],
            "interval_coverage": ck.interval.coverage,
            "method": ck.method,
        })
        return pred, result

    def _gnn_time_ms(self, spec: Any, eg: Any, base_ms: float, breakdown_ms: dict) -> float:
        from .cost import RooflineCost
        from .data.graphs import graph_of
        from .models.dataset import BREAKDOWN_COLUMNS, learned_node_times_s
        from .models.gnn import make_sample

        ck = self.checkpoint
        # node times are the roofline's, as in the graph store the GNN was trained on
        graph = graph_of(eg, RooflineCost(spec.hardware))
        nodes = learned_node_times_s(graph, spec, ck.op_regressor) if ck.op_regressor is not None else None
        bd = {k: float(breakdown_ms.get(k, 0.0)) for k in BREAKDOWN_COLUMNS}
        return float(ck.gnn.predict([make_sample(graph, spec, base_ms, bd, learned_time_s=nodes)])[0])


__all__ = ["Predictor"]
