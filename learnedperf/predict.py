"""The predictor: runs in the DESIGN.md format in, prediction objects out, from a checkpoint.

:meth:`Predictor.load` verifies a checkpoint (default ``checkpoints/default``). Every
answer comes from one of two **tiers**:

* ``"full"`` — the checkpoint's method, 5-15 ms a run (steps below);
* ``"fast"`` — its surrogate (:mod:`learnedperf.models.surrogate`), distilled from the
  full tier, ~100 µs a run in a batch: peak memory exactly as the simulator computes it
  (:func:`~learnedperf.simulate.memory.peak_memory_of`), the time and breakdown shares
  from LightGBM over closed-form run features, the interval widened by the surrogate's
  measured disagreement with the full tier. This is what :meth:`Predictor.predict_many`,
  :meth:`Predictor.rank` and the screening pass of :meth:`Predictor.search` use.

The full tier:

1. the simulator runs the run on the checkpoint's cost model (the fitted roofline, or the
   checkpoint's learned operator costs) — it gives memory, ``fits_in_memory`` and the breakdown;
2. a GNN method corrects (``gnn_residual*``) or replaces (``gnn_direct``) the iteration time
   from the run's coarsened execution graph; the breakdown is scaled to the corrected time
   (``breakdown_scale`` says by how much);
3. the 90 % interval comes from the checkpoint's conformal calibration on held-out measured runs.

``source`` names the checkpoint, method and tier; ``simulator_iteration_time_ms`` keeps the
simulator's own answer (full tier).
"""

from __future__ import annotations

from itertools import product
from pathlib import Path
from typing import Any, Optional

from .errors import InputError, LearnedPerfError

TIERS = ("fast", "full")
"""Answer tiers: the surrogate, or the checkpoint's full method (see module docstring)."""

#: Said in a prediction's ``notes`` when the model's time implied an MFU over 1 and was raised to the peak's.
BOUNDED_NOTE = ("the model's time implied more than the device's peak FLOP/s (MFU over 1): the time is the "
                "peak's, and the interval starts there")


def _at_most_peak(t_ms: float, mfu: float, lo_ms: float, hi_ms: float) -> tuple[float, float, float, bool]:
    """``(t, lo, hi, bounded)``: a time and interval no shorter than the run's FLOPs at the device's peak.

    ``mfu`` is the run's MFU at ``t_ms``; MFU x time is the run's model FLOPs over the peak, which no
    iteration beats (it executes at least its model's FLOPs). A learned correction extrapolating past
    its data (fp32 on a B200, faster than any device it saw) can go under it: such a time is raised to
    the bound, and so is an interval end below it.
    """
    floor_ms = t_ms * mfu
    bounded = floor_ms > t_ms
    t = max(t_ms, floor_ms)
    return t, max(lo_ms, floor_ms), max(hi_ms, t), bounded


def check_tier(tier: Any) -> str:
    """``tier`` if it is one of :data:`TIERS`; InputError naming it otherwise."""
    if tier not in TIERS:
        raise InputError(f"tier: must be one of {', '.join(TIERS)}, got {tier!r}")
    return tier


def error_text(exc: BaseException) -> str:
    """One line saying why a run failed (the field and the problem for invalid input)."""
    if isinstance(exc, (LearnedPerfError, ValueError)):
        text = " ".join(str(exc).split())
        return text or type(exc).__name__
    if isinstance(exc, (KeyError, TypeError)):
        return f"{type(exc).__name__}: {exc}"
    return f"internal error: {type(exc).__name__}: {exc}"


def _iter_runs(runs: Any) -> Any:
    """An iterator over ``runs`` (predict_many's argument); InputError if it is not a collection of runs.

    A single run is a dict, and iterating over a dict yields its keys: without this check
    ``predict_many(run)`` would answer "a run must be a JSON object, got str" for its first
    key, which hides the real mistake. A string is iterable too (its characters).
    """
    from .specs import RunSpec

    hint = "predict_many takes a list (or another iterable) of runs"
    if isinstance(runs, (dict, RunSpec)):
        raise InputError(f"runs: {hint}, got a single run object: use predict(run) for one run, "
                         "or predict_many([run])")
    if runs is None or isinstance(runs, (str, bytes, bytearray)):
        raise InputError(f"runs: {hint}, got {'None' if runs is None else type(runs).__name__}")
    try:
        return iter(runs)
    except TypeError:
        raise InputError(f"runs: {hint}, got {type(runs).__name__}") from None


class Predictor:
    """Predicts runs with a verified checkpoint.

    A predictor caches parsed models and hardware and their costs between calls, and is not
    meant to be shared between threads: give each thread its own :meth:`fork` (same loaded
    models, no second load).

    Args:
        checkpoint: a loaded :class:`~learnedperf.checkpoint.Checkpoint`.
    """

    def __init__(self, checkpoint: Any):
        from .specs.run import SpecCache

        self.checkpoint = checkpoint
        self._specs = SpecCache()
        self._contexts: dict[tuple[int, int], Any] = {}

    @classmethod
    def load(cls, path: Optional[str | Path] = None) -> "Predictor":
        """Load and verify the checkpoint at ``path`` (default ``checkpoints/default``)."""
        from .checkpoint import load_checkpoint

        return cls(load_checkpoint(path))

    def fork(self) -> "Predictor":
        """A predictor over the same loaded checkpoint with caches of its own, for another thread.

        The loaded models are only read when predicting (LightGBM's predict takes a shared lock;
        the GNN runs in eval mode), while the caches of parsed specs and run contexts are written:
        two threads each use their own predictor, so a long search in one does not wait for, or
        block, fast predictions in the other.
        """
        return Predictor(self.checkpoint)

    @property
    def source(self) -> str:
        """The ``source`` of this predictor's answers."""
        return self.checkpoint.source

    def predict(self, run: Any, tier: str = "fast") -> dict:
        """The prediction object of ``run`` (a run-format dict or a :class:`RunSpec`).

        Raises:
            SpecError / InputError: the run is invalid (the message names the field), or the
                tier is unknown or the checkpoint has no surrogate for ``tier="fast"``.
        """
        if check_tier(tier) == "full":
            return self.predict_with_result(run)[0]
        return self.predict_many([run], tier="fast")[0]

    def predict_many(self, runs: Any, tier: str = "fast", errors: str = "raise") -> list[dict]:
        """Prediction objects of ``runs`` (run-format dicts or RunSpecs), in order.

        Args:
            runs: an iterable of runs.
            tier: ``"fast"`` (the surrogate, vectorised) or ``"full"``.
            errors: ``"raise"`` raises on the first invalid run; ``"return"`` puts
                ``{"error": message, "index": i}`` (with the run's ``id`` when it has one) in
                its place and answers the rest.

        Raises:
            InputError: ``runs`` is not an iterable of runs (a single run, None, a string), or
                ``tier`` / ``errors`` is unknown.
        """
        import gc

        check_tier(tier)
        if errors not in ("raise", "return"):
            raise InputError(f"errors: must be 'raise' or 'return', got {errors!r}")
        runs = _iter_runs(runs)
        # a batch allocates many short-lived acyclic objects; with torch loaded the heap is large and
        # the cyclic collector's passes over it cost more than the batch itself (measured: parsing
        # 60 -> 11 µs a run), so it pauses for the batch (a long-running process should also call
        # gc.freeze() once after loading, as the CLI and the service do)
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._predict_many(list(runs), tier, errors)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _predict_many(self, runs: list, tier: str, errors: str) -> list[dict]:
        from .specs import RunSpec

        out: list[Any] = [None] * len(runs)
        specs: list[Any] = []
        where: list[int] = []
        for i, run in enumerate(runs):
            try:
                spec = run if isinstance(run, RunSpec) else RunSpec.from_dict(run, self._specs)
                if tier == "full":
                    out[i] = self.predict_with_result(spec)[0]
                else:
                    specs.append(spec)
                    where.append(i)
            except Exception as exc:  # noqa: BLE001 - one run's failure is that run's answer
                if errors == "raise":
                    raise
                out[i] = self._error(i, run, exc)
        if specs:
            for i, pred in zip(where, self._fast(specs, errors == "raise")):
                out[i] = pred if not isinstance(pred, BaseException) else self._error(i, runs[i], pred)
        return out

    # ------------------------------------------------------------------ planners
    def rank(self, model: Any, hardware: Any, strategies: Any, tier: str = "fast") -> list[dict]:
        """Rank ``strategies`` (run-format strategy dicts) of one model on one hardware, fastest first.

        Runs that fit in memory come first, by predicted time; then those that do not; then invalid
        strategies with their error. Each entry: ``rank`` (1-based, None for invalid), ``strategy`` (as
        given), and ``prediction`` or ``error``.
        """
        strategies = list(strategies)
        preds = self.predict_many([{"model": model, "hardware": hardware, "strategy": s} for s in strategies],
                                  tier=tier, errors="return")
        entries = [{"strategy": s, **({"error": p["error"]} if "error" in p else {"prediction": p})}
                   for s, p in zip(strategies, preds)]
        ok = sorted((e for e in entries if "prediction" in e),
                    key=lambda e: (not e["prediction"]["fits_in_memory"], e["prediction"]["iteration_time_ms"]))
        for k, e in enumerate(ok):
            e["rank"] = k + 1
        return ok + [{"rank": None, **e} for e in entries if "error" in e]

    def search(self, model: Any, hardware: Any, constraints: Optional[dict] = None, top: int = 10,
               rescore: Optional[int] = None) -> dict:
        """The ``top`` fastest valid strategies of ``model`` on ``hardware`` that fit in memory.

        Every strategy :func:`enumerate_strategies` yields under ``constraints`` is checked and
        screened with the fast tier; the ``rescore`` best (default ``max(3·top, 20)``) are predicted
        again with the full tier and ranked on it. Each result says how sure the ranking is: the
        probability that it is the fastest of the re-scored ones (``p_fastest``), and that it
        beats the next one, if every prediction's error were independent and log-normal with the
        spread of its 90 % interval. Checked against measurements by
        ``experiments/search_regret.py`` (vTrain groups: stated 0.71 on average for the full
        tier's pick, which was the measured fastest in 0.67 of the groups).

        Candidates the run validation refuses (e.g. ``zb-h1`` with a fixed ``fsdp``) are counted in
        ``invalid_by_field`` by the field their error names, with the first such error of each field in
        ``invalid_example``; a space with no valid candidate gives ``valid`` 0 and no results.

        Raises:
            InputError / SpecError: bad model, hardware or constraint (the message names it).
        """
        import math
        import time

        t0 = time.perf_counter()
        if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= 1000:
            raise InputError(f"top: must be an integer in 1..1000, got {top!r}")
        if rescore is None:
            rescore = max(3 * top, 20)
        if not isinstance(rescore, int) or isinstance(rescore, bool) or not 1 <= rescore <= 10000:
            raise InputError(f"rescore: must be an integer in 1..10000, got {rescore!r}")
        model_spec, hw_spec = self._specs.model(model), self._specs.hardware(hardware)
        cons, cands = enumerate_strategies(model_spec, hw_spec, constraints)
        headroom = cons["memory_headroom_GiB"]
        runs = [{"model": model, "hardware": hardware, "strategy": s} for s in cands]
        fast = self.predict_many(runs, tier="fast", errors="return")
        valid = [(s, p) for s, p in zip(cands, fast) if "error" not in p]
        # why candidates were invalid, by the field each error names, with the first message of each field
        # (nothing is dropped unsaid)
        invalid: dict[str, int] = {}
        invalid_example: dict[str, str] = {}
        for p in fast:
            if "error" in p:
                field = p["error"].split(":", 1)[0]
                invalid[field] = invalid.get(field, 0) + 1
                invalid_example.setdefault(field, p["error"])
        fits = [(s, p) for s, p in valid if p["peak_memory_GiB"] <= hw_spec.device.memory_GiB - headroom]
        fits.sort(key=lambda sp: sp[1]["iteration_time_ms"])
        shortlist = fits[:rescore]
        full = self.predict_many([{"model": model, "hardware": hardware, "strategy": s} for s, _ in shortlist],
                                 tier="full", errors="return")
        scored = [(s, f, p) for (s, f), p in zip(shortlist, full) if "error" not in p]
        rescore_failed = [{"strategy": s, "error": p["error"]} for (s, _f), p in zip(shortlist, full) if "error" in p]
        scored.sort(key=lambda x: x[2]["iteration_time_ms"])
        p_best, p_next = _ranking_confidence([p for _s, _f, p in scored])
        results = []
        for k, (s, f, p) in enumerate(scored[:top]):
            results.append({"rank": k + 1, "strategy": s, "iteration_time_ms": p["iteration_time_ms"],
                            "interval_ms": p["interval_ms"], "fast_iteration_time_ms": f["iteration_time_ms"],
                            "peak_memory_GiB": p["peak_memory_GiB"], "tokens_per_second": p["tokens_per_second"],
                            "mfu": p["mfu"], "p_fastest": p_best[k], "p_faster_than_next": p_next[k],
                            "prediction": p})
        return {"model": model_spec.name, "device": hw_spec.device.name, "num_devices": hw_spec.num_devices,
                "constraints": cons, "candidates": len(cands), "valid": len(valid), "fit_in_memory": len(fits),
                "invalid_by_field": invalid, "invalid_example": invalid_example, "rescored": len(scored),
                "rescore_failed": rescore_failed,
                "results": results, "source": self.source,
                "confidence_note": "p_fastest / p_faster_than_next assume independent log-normal errors with "
                                   "each interval's spread",
                "elapsed_ms": (time.perf_counter() - t0) * 1e3,
                "best_fast_ms": fits[0][1]["iteration_time_ms"] if fits else math.nan}

    @staticmethod
    def _error(index: int, run: Any, exc: BaseException) -> dict:
        from .specs.run import echoed_id

        return {"error": error_text(exc), "index": index, **echoed_id(run)}

    # ------------------------------------------------------------------ fast tier
    def _context(self, spec: Any) -> Any:
        """The :class:`~learnedperf.features.run.RunContext` of a run's (model, hardware), cached.

        Keyed by object identity: :class:`~learnedperf.specs.run.SpecCache` hands out one object
        per distinct input, and the context keeps its objects alive so an id is never reused.
        """
        from .features.run import RunContext

        key = (id(spec.model), id(spec.hardware))
        ctx = self._contexts.get(key)
        if ctx is None:
            if len(self._contexts) >= 1024:
                self._contexts.pop(next(iter(self._contexts)))
            ctx = self._contexts[key] = RunContext(spec.model, spec.hardware)
        return ctx

    def _features(self, spec: Any) -> tuple:
        """``(RunContext, MemoryBreakdown, run features, AnalyticTime)`` of a RunSpec: what the
        surrogate sees of it (at prediction and at distillation alike)."""
        from .features.run import run_features, run_stage_loads
        from .simulate.memory import peak_memory_of
        from .units import GiB

        ctx = self._context(spec)
        loads = run_stage_loads(spec, ctx)
        mem = peak_memory_of(spec, loads)
        x, at = run_features(spec, ctx, mem.total / GiB, loads)
        return ctx, mem, x, at

    def _fast(self, specs: list, raise_errors: bool) -> list:
        """Fast-tier predictions of valid RunSpecs (an exception object in place of a run that fails)."""
        import math

        import numpy as np

        from .models.surrogate import BREAKDOWN_PARTS
        from .simulate import SIMULATOR_VERSION
        from .units import GiB

        ck = self.checkpoint
        if ck.surrogate is None:
            raise InputError(f"checkpoint {ck.path.name}: has no surrogate for tier 'fast' (retrain it with "
                             "'learnedperf train', or use tier 'full')")
        rows, analytic, mems, ctxs, ok = [], [], [], [], []
        out: list[Any] = [None] * len(specs)
        for i, spec in enumerate(specs):
            try:
                ctx, mem, x, at = self._features(spec)
            except Exception as exc:  # noqa: BLE001 - e.g. a link bandwidth the run needs and nobody gave
                if raise_errors:
                    raise
                out[i] = exc
                continue
            rows.append(x)
            analytic.append(at.total_s)
            mems.append(mem)
            ctxs.append(ctx)
            ok.append(i)
        if not ok:
            return out
        X = np.asarray(rows, dtype=float)
        times = ck.surrogate.predict(X, analytic)
        shares = ck.surrogate.predict_shares(X)
        valid = [specs[i] for i in ok]
        shape_runs = None
        times = np.asarray(times, dtype=float)
        bound_lo = np.full(len(valid), ck.surrogate_bounds[0])
        bound_hi = np.full(len(valid), ck.surrogate_bounds[1])
        if ck.shapes is not None:
            # the surrogate learnt the full tier before its shape memory (surrogate_labels): applied here as there
            factors, shape_runs = ck.shapes.lookup(valid)
            factors = np.exp(np.asarray(factors, dtype=float))
            hit = np.asarray(shape_runs) > 0
            if ck.shapes.over == "simulator" and hit.any():
                # the hits multiply the surrogate's simulator time, and are as far from the full tier as it is
                times[hit] = ck.surrogate.predict_simulator(X[hit], np.asarray(analytic)[hit])
                bound_lo[hit], bound_hi[hit] = ck.surrogate_simulator_bounds
            times = times * factors
        novelty = ck.interval.novelty_classes(valid)
        lo, hi = ck.interval.interval_for_specs(times, valid, novelty,
                                                None if shape_runs is None else [n > 0 for n in shape_runs])
        lo, hi = lo * np.exp(bound_lo), hi * np.exp(bound_hi)
        source = ck.source + ":fast"
        for j, i in enumerate(ok):
            spec, t_ms, mem = specs[i], float(times[j]), mems[j]
            s, hw = spec.strategy, spec.hardware
            t_s = t_ms / 1e3
            peak = hw.device.peak_tflops.get(s.precision) or hw.device.peak_tflops.fp32
            tflops = ctxs[j].flops_per_seq_of(s) * s.global_batch_size / t_s / hw.num_devices / 1e12
            t_ms, lo_j, hi_j, bounded = _at_most_peak(t_ms, tflops / peak, float(lo[j]), float(hi[j]))
            t_s, tflops = t_ms / 1e3, min(tflops, peak)
            mem_gib = mem.total / GiB
            pred: dict[str, Any] = {
                "iteration_time_ms": t_ms,
                "tokens_per_second": s.global_batch_size * spec.model.seq_length / t_s,
                "samples_per_second": s.global_batch_size / t_s,
                "tflops_per_device": tflops,
                "mfu": tflops / peak,
                "peak_memory_GiB": mem_gib,
                "memory_GiB": mem.to_GiB(),
                "peak_memory_phase": mem.phase,
                "fits_in_memory": mem_gib <= hw.device.memory_GiB,
                "interval_ms": [lo_j, hi_j],
                "interval_coverage": ck.interval.coverage,
                "novelty": list(novelty[j]),
                "source": source,
                "method": ck.method,
                "tier": "fast",
                "simulator_version": SIMULATOR_VERSION,
            }
            if shape_runs is not None:
                pred["shape_runs"] = int(shape_runs[j])
            if shares is not None:
                share = {p: float(shares[j, k]) for k, p in enumerate(BREAKDOWN_PARTS)}
                # parts a strategy cannot have are zero, not the trees' small leftovers
                impossible = {"recompute": s.recompute == "none", "pipeline_bubble": s.pp == 1,
                              "backward": s.forward_only, "optimizer": s.forward_only or s.optimizer == "none"}
                share.update({p: 0.0 for p, no in impossible.items() if no})
                # each share has its own trees: scaled so that the parts add up to the time, as the full tier's do
                total = sum(share.values())
                bd = {p: (v / total if total > 0 else 0.0) * t_ms for p, v in share.items()}
                bd["compute"] = bd["forward"] + bd["backward"] + bd["recompute"]
                pred["breakdown_ms"] = bd
            notes = hw.assumptions() + ([BOUNDED_NOTE] if bounded else [])
            if notes:
                pred["notes"] = notes
            if spec.id is not None:
                pred["id"] = spec.id
            out[i] = pred
        return out

    def predict_with_result(self, run: Any, trace: bool = False, shapes: bool = True) -> tuple[dict, Any]:
        """``(prediction, SimResult)``: the prediction and the simulator result under it.

        ``shapes=False`` leaves out a ``+shapes`` checkpoint's shape memory (the point model alone, which the
        surrogate learns: both tiers apply the memory after it)."""
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
        from .models.iteration import base_method

        if base_method(ck.method) == "formula":
            from .models.iteration import ideal_time_ms

            t = float(ideal_time_ms([spec])[0]) / ck.formula_mfu
        elif ck.gnn is not None:
            t = float(self._gnn_time_ms(spec, eg, base, pred["breakdown_ms"]))
        else:
            t = base
        shape_runs = None
        if ck.shapes is not None and shapes:
            factor, runs = ck.shapes.lookup([spec])
            # a memory over the simulator multiplies the simulator's time, one over the model the model's
            t = (base if runs[0] > 0 and ck.shapes.over == "simulator" else t) * math.exp(factor[0])
            shape_runs = runs[0]
        if not (math.isfinite(t) and t > 0):
            raise InputError(f"checkpoint {ck.path.name}: the model produced an invalid time {t!r} for this run")
        novelty = ck.interval.novelty_classes([spec])
        lo, hi = ck.interval.interval_for_specs([t], [spec], novelty,
                                                None if shape_runs is None else [shape_runs > 0])
        # the simulator's MFU at its own time says the model's at any other: MFU x time is the run's work
        t, lo_0, hi_0, bounded = _at_most_peak(t, pred["mfu"] * base / t, float(lo[0]), float(hi[0]))
        if bounded:
            pred["notes"] = list(pred.get("notes") or []) + [BOUNDED_NOTE]
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
            "interval_ms": [lo_0, hi_0],
            "interval_coverage": ck.interval.coverage,
            "novelty": list(novelty[0]),
            "method": ck.method,
            "tier": "full",
        })
        if shape_runs is not None:
            # how many measured runs of this layer shape the memory's factor rests on (0: none, no factor)
            pred["shape_runs"] = int(shape_runs)
        return pred, result

    def _gnn_time_ms(self, spec: Any, eg: Any, base_ms: float, breakdown_ms: dict) -> float:
        return float(self.checkpoint.gnn.predict([self.gnn_sample(spec, eg, base_ms, breakdown_ms)])[0])

    def gnn_sample(self, spec: Any, eg: Any, base_ms: float, breakdown_ms: dict) -> Any:
        """The checkpoint GNN's input for a run (a :class:`~learnedperf.models.gnn.GraphSample`), as the full
        tier builds it: ``spec`` a :class:`~learnedperf.specs.RunSpec`, ``eg`` its compiled execution graph,
        ``base_ms`` and ``breakdown_ms`` the simulator's iteration time and breakdown (``simulator_iteration_time_ms``
        of a full-tier prediction, and its ``breakdown_ms`` over ``breakdown_scale``). The full tier corrects with
        it; callers need it only to look into the correction (``experiments/correction_attribution.py``)."""
        from .cost import RooflineCost
        from .data.graphs import graph_of
        from .models.dataset import BREAKDOWN_COLUMNS, learned_node_times_s
        from .models.gnn import make_sample

        ck = self.checkpoint
        if ck.gnn is None:
            raise InputError(f"checkpoint {ck.path.name}: method {ck.method!r} has no GNN")
        # node times are the roofline's, as in the graph store the GNN was trained on
        graph = graph_of(eg, RooflineCost(spec.hardware))
        nodes = learned_node_times_s(graph, spec, ck.op_regressor) if ck.op_regressor is not None else None
        bd = {k: float(breakdown_ms.get(k, 0.0)) for k in BREAKDOWN_COLUMNS}
        return make_sample(graph, spec, base_ms, bd, learned_time_s=nodes)


#: Fewest tokens of a sequence per context-parallel rank the default search considers: below this,
#: splitting the sequence only adds communication (context parallelism pays for long sequences).
MIN_CP_TOKENS = 1024

#: Search constraints, their defaults and what they mean (see :func:`enumerate_strategies`).
SEARCH_CONSTRAINTS = {
    "global_batch_size": (None, "sequences per iteration (required)"),
    "precision": ("bf16", "precision of every candidate"),
    "tp": (None, "allowed tensor-parallel sizes (default: powers of two dividing the heads)"),
    "pp": (None, "allowed pipeline sizes (default: divisors of the devices, at most the layers)"),
    "cp": (None, "allowed context-parallel sizes (default: powers of two up to 8 that leave every rank at "
                 f"least {MIN_CP_TOKENS} tokens of the sequence)"),
    "ep": (None, "allowed expert-parallel sizes (MoE; default: divisors of the experts)"),
    "micro_batch_size": ([1, 2, 4, 8], "allowed micro-batch sizes"),
    "max_tp": (None, "largest tensor-parallel size (default: the node size)"),
    "max_pp": (64, "largest pipeline size"),
    "schedules": (["1f1b", "interleaved"], "pipeline schedules of the candidates with pp > 1 (gpipe, 1f1b, "
                                           "interleaved; zero bubble zb-h1, one model chunk per rank, zb-v, two "
                                           "in a V, and interleaved-zb, not with fixed fsdp); a candidate without a "
                                           "pipeline takes 1f1b"),
    "virtual_stages": ([2, 4], "virtual stages per rank of the interleaved schedules (interleaved, "
                               "interleaved-zb)"),
    "recompute": (["none", "selective", "full"], "recomputation policies"),
    "zero_stages": ([0, 1, 2, 3], "ZeRO stages (2 and 3 only without a pipeline; with a data-parallel group "
                                  "of one rank, dp·cp 1, stages 1 and 2 shard nothing: only the lowest listed "
                                  "of 0-2 is tried)"),
    "hybrid_sharding": ([False, True], "with true, a ZeRO candidate whose data-parallel group leaves a node also "
                                       "comes with one copy of its states per node (dp_replicate: FSDP "
                                       "HYBRID_SHARD's layout); [true] alone keeps only that variant"),
    "sequence_parallel": ([True, False], "sequence parallelism choices (with tp > 1)"),
    "moe_dispatchers": (["alltoall"], "expert dispatch choices of the candidates with ep > 1 (alltoall, deepep)"),
    "overlap_moe_comm": ([False], "choices of overlapping expert all-to-alls with computation (candidates with "
                                  "ep > 1)"),
    "memory_headroom_GiB": (0.0, "memory to leave free on every device"),
    "fixed": ({}, "other strategy fields every candidate takes as given (e.g. flash_attention, "
                  "overlap_grad_reduce, optimizer; moe_dispatcher and overlap_moe_comm go to the candidates "
                  "with ep > 1 only, checkpoint_impl to those that recompute); validated with the run"),
    "max_candidates": (200000, "refuse a search space larger than this"),
}


def _int_list(name: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool)
                                                          and v >= 1 for v in value):
        raise InputError(f"constraints.{name}: must be a non-empty list of positive integers, got {value!r}")
    return sorted(set(value))


def _check_constraints(model: Any, hw: Any, constraints: Optional[dict]) -> dict:
    """Constraints with defaults filled in; an unknown key or a bad value raises InputError naming it."""
    from .specs.strategy import PIPELINE_SCHEDULES

    if constraints is None:
        constraints = {}
    if not isinstance(constraints, dict):
        raise InputError(f"constraints: must be a JSON object, got {type(constraints).__name__}")
    unknown = sorted(set(constraints) - set(SEARCH_CONSTRAINTS))
    if unknown:
        raise InputError(f"constraints.{unknown[0]}: unknown constraint (known: {', '.join(SEARCH_CONSTRAINTS)})")
    c = {k: constraints.get(k, default) for k, (default, _what) in SEARCH_CONSTRAINTS.items()}
    gbs = c["global_batch_size"]
    if not isinstance(gbs, int) or isinstance(gbs, bool) or gbs < 1:
        raise InputError(f"constraints.global_batch_size: a positive integer is required, got {gbs!r}")
    if c["precision"] not in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        raise InputError(f"constraints.precision: unknown precision {c['precision']!r}")
    for k in ("tp", "pp", "cp", "ep", "micro_batch_size", "virtual_stages"):
        if c[k] is not None:
            c[k] = _int_list(k, c[k])
    for k in ("max_tp", "max_pp", "max_candidates"):
        if c[k] is not None and (not isinstance(c[k], int) or isinstance(c[k], bool) or c[k] < 1):
            raise InputError(f"constraints.{k}: must be a positive integer, got {c[k]!r}")
    for k, allowed in (("schedules", PIPELINE_SCHEDULES),
                       ("recompute", ("none", "selective", "full")),
                       ("zero_stages", (0, 1, 2, 3)), ("sequence_parallel", (True, False)),
                       ("hybrid_sharding", (True, False)), ("moe_dispatchers", ("alltoall", "deepep")),
                       ("overlap_moe_comm", (True, False))):
        v = c[k]
        if not isinstance(v, list) or not v or any(x not in allowed or isinstance(x, bool) != isinstance(
                allowed[0], bool) for x in v):
            raise InputError(f"constraints.{k}: must be a non-empty list of {list(allowed)}, got {v!r}")
    fixed = c["fixed"]
    searched = {"tp", "pp", "dp", "cp", "ep", "micro_batch_size", "global_batch_size", "pipeline_schedule",
                "virtual_pipeline_stages", "recompute", "zero_stage", "sequence_parallel", "precision",
                "dp_replicate"}
    # the dispatch keys are searched when the constraints list more than their default
    varied = [key for key in _EP_CHOICES.values() if c[key] != SEARCH_CONSTRAINTS[key][0]]
    searched |= {k for k, key in _EP_CHOICES.items() if key in varied}
    if not isinstance(fixed, dict) or searched & set(fixed):
        raise InputError(f"constraints.fixed: must be an object of strategy fields the search does not vary "
                         f"(not {sorted(searched & set(fixed)) if isinstance(fixed, dict) else fixed!r})")
    if not model.is_moe:
        # a dense model has no expert-parallel candidate to take them: say so rather than drop them
        asked = [f"fixed.{k}" for k in _EP_CHOICES if k in fixed] + varied
        if asked:
            raise InputError(f"constraints.{asked[0]}: expert dispatch needs a mixture-of-experts model; "
                             f"{model.name} has no experts")
    h = c["memory_headroom_GiB"]
    if not isinstance(h, (int, float)) or isinstance(h, bool) or not (0 <= h < hw.device.memory_GiB):
        raise InputError(f"constraints.memory_headroom_GiB: must be in [0, {hw.device.memory_GiB}), got {h!r}")
    if c["max_tp"] is None:
        c["max_tp"] = hw.node_size
    return c


def enumerate_strategies(model: Any, hw: Any, constraints: Optional[dict] = None) -> tuple[dict, list[dict]]:
    """The constraints (defaults filled in) and every candidate strategy of ``model`` on ``hw``.

    Candidates are the products of tp (powers of two dividing the attention heads, up to
    ``max_tp``), pp (divisors of the devices left, at most the layers), cp, dp (the rest),
    ep (MoE), micro-batch size (dividing the batch per data-parallel rank), schedule and
    virtual stages, recomputation, ZeRO stage (with and without hybrid sharding: one copy of the states
    per node; where dp·cp is 1, ZeRO 1 and 2 shard nothing and only the lowest listed of stages 0-2 is a
    candidate, and with ``fsdp`` fixed ZeRO 0 and 3 are one FULL_SHARD candidate; see
    :func:`_distinct_zero_stages`), sequence parallelism and, with ep > 1, the expert
    dispatch choices (alltoall only and all-to-alls blocking unless the constraints list more). Strategies the run
    validation rejects (e.g. interleaving whose micro-batches are not a multiple of pp) are counted by the
    caller as invalid, not hidden.

    Raises:
        InputError: a bad constraint, or more than ``max_candidates`` candidates.
    """
    from .specs.strategy import EXPERT_DISPATCH_DEFAULTS, INTERLEAVED_SCHEDULES, V_SHAPE_SCHEDULES

    c = _check_constraints(model, hw, constraints)
    n, gbs = hw.num_devices, c["global_batch_size"]
    # expert dispatch moves tokens between expert-parallel ranks: an ep 1 candidate takes none of it; an ep > 1
    # one each of the dispatch choices (a key left out where it is at its default)
    fixed_ep1 = {k: v for k, v in c["fixed"].items() if k not in _EP_CHOICES}
    dispatch_ep = [{k: v for k, v in zip(_EP_CHOICES, choice) if v != EXPERT_DISPATCH_DEFAULTS[k]}
                   for choice in product(*(c[key] for key in _EP_CHOICES.values()))]
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    tps = c["tp"] or [t for t in divisors if t & (t - 1) == 0 and model.num_attention_heads % t == 0]
    tps = [t for t in tps if t <= c["max_tp"]]
    out: list[dict] = []
    for tp in tps:
        for pp in c["pp"] or divisors:
            if pp > c["max_pp"] or pp > model.num_layers or n % (tp * pp):
                continue
            cps = c["cp"] or [k for k in (1, 2, 4, 8)
                              if k == 1 or (model.seq_length % (2 * k) == 0 and model.seq_length // k >= MIN_CP_TOKENS)]
            for cp in cps:
                if n % (tp * pp * cp):
                    continue
                dp = n // (tp * pp * cp)
                eps = [1]
                if model.is_moe:
                    eps = c["ep"] or [e for e in range(1, model.num_experts + 1) if model.num_experts % e == 0]
                    eps = [e for e in eps if (dp * cp) % e == 0]
                for mbs in c["micro_batch_size"]:
                    if gbs % (mbs * dp):
                        continue
                    pipes: list[tuple[str, int]] = [("1f1b", 1)]
                    if pp > 1:
                        pipes = [(sch, 2 if sch in V_SHAPE_SCHEDULES else 1) for sch in c["schedules"]
                                 if sch not in INTERLEAVED_SCHEDULES]
                        pipes += [(sch, v) for sch in c["schedules"] if sch in INTERLEAVED_SCHEDULES
                                  for v in c["virtual_stages"] if v >= 2]
                    sps = [sp for sp in c["sequence_parallel"] if tp > 1 or not sp] or [False]
                    zeros = _distinct_zero_stages([z for z in c["zero_stages"] if pp == 1 or z <= 1], dp * cp,
                                                  c["fixed"])
                    for ep in eps:
                        sharding = [(z, r) for z in zeros for r in _replica_choices(z, tp, dp, cp, ep, hw.node_size,
                                                                                    c["hybrid_sharding"])]
                        fixed, dispatch = (c["fixed"], dispatch_ep) if ep > 1 else (fixed_ep1, [{}])
                        for sched, v in pipes:
                            for rc in c["recompute"]:
                                for z, r in sharding:
                                    for sp, dv in product(sps, dispatch):
                                        cand = {**fixed, **dv, "tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep,
                                                "micro_batch_size": mbs, "global_batch_size": gbs,
                                                "pipeline_schedule": sched, "virtual_pipeline_stages": v,
                                                "recompute": rc, "zero_stage": z, "dp_replicate": r,
                                                "sequence_parallel": sp, "precision": c["precision"]}
                                        if rc == "none":
                                            cand.pop("checkpoint_impl", None)  # says how a recomputation runs
                                        out.append(cand)
                                        if len(out) > c["max_candidates"]:
                                            raise InputError(
                                                f"constraints.max_candidates: the search space exceeds "
                                                f"{c['max_candidates']} strategies; narrow it (e.g. tp, pp, "
                                                f"micro_batch_size, recompute)")
    return c, out


#: The expert-dispatch strategy fields (only a candidate with expert parallelism takes them) and the constraint
#: listing each one's choices, in the order the candidates combine them.
_EP_CHOICES = {"moe_dispatcher": "moe_dispatchers", "overlap_moe_comm": "overlap_moe_comm"}


def _distinct_zero_stages(zeros: list[int], shard_group: int, fixed: dict) -> list[int]:
    """The ZeRO stages of ``zeros`` that make different runs when ZeRO shards over ``shard_group`` (dp·cp) ranks.

    With one rank in the group there is nothing to shard: ZeRO 1 and 2 keep every state whole and run as
    ZeRO 0 (the simulator gives them the same time and memory), so only the lowest of those listed stays.
    ZeRO 3 stays: it still gathers each layer's weights into a buffer (the simulator charges that memory).
    With ``fsdp`` fixed every stage maps to an FSDP mode
    (:attr:`~learnedperf.specs.strategy.Strategy.effective_zero_stage`): 0 and 3 are both FULL_SHARD, so 0
    goes where 3 is listed (3 also takes the hybrid-sharded layouts), at any group size; 1 stays listed and is
    counted invalid (FSDP has no ZeRO-1 mode)."""
    if fixed.get("fsdp"):
        return [z for z in zeros if not (z == 0 and 3 in zeros)]
    unsharded = [z for z in zeros if z <= 2]
    if shard_group != 1 or not unsharded:
        return zeros
    keep = min(unsharded)
    return [z for z in zeros if z > 2 or z == keep]


def _replica_choices(zero: int, tp: int, dp: int, cp: int, ep: int, node_size: int, hybrid: list) -> list[int]:
    """``dp_replicate`` values a search tries for ZeRO stage ``zero``: 1 (one copy of the states, unless
    ``hybrid`` is ``[True]``) and, with ``True`` in ``hybrid``, one copy per node — the dp·cp ranks inside a
    node shard it, as FSDP's HYBRID_SHARD does — where that is a valid hybrid layout (ZeRO >= 1, the group
    leaves the node, the copies divide dp and the expert data-parallel size)."""
    if zero == 0:
        return [1]
    out = [1] if False in hybrid else []
    if True in hybrid and tp <= node_size:
        per_node = max(1, node_size // tp)
        r = dp * cp // per_node
        if (dp * cp) % per_node == 0 and 1 < r < dp * cp and dp % r == 0 and (dp * cp // ep) % r == 0:
            out.append(r)
    return out


def _ranking_confidence(preds: list[dict]) -> tuple[list[float], list[float]]:
    """P(fastest) and P(faster than the next) of time-sorted predictions under independent log-normal
    errors whose 90 % spread is each interval's (see :meth:`Predictor.search`)."""
    import math

    import numpy as np

    if not preds:
        return [], []
    mu = np.log([p["iteration_time_ms"] for p in preds])
    # a two-sided 90 % interval spans 2·1.645 standard deviations of a normal log error
    sd = np.asarray([max(math.log(p["interval_ms"][1] / p["interval_ms"][0]) / (2 * 1.645), 1e-6) for p in preds])
    rng = np.random.default_rng(0)
    draws = mu + sd * rng.standard_normal((4000, len(preds)))
    p_best = np.bincount(draws.argmin(axis=1), minlength=len(preds)) / len(draws)
    # P(X_k < X_k+1) = Φ((μ_k+1 − μ_k) / sqrt(σ_k² + σ_k+1²)), Φ(z) = erfc(−z/√2) / 2
    p_next = [float(0.5 * math.erfc(-(mu[k + 1] - mu[k]) / math.sqrt(2.0 * (sd[k] ** 2 + sd[k + 1] ** 2))))
              if k + 1 < len(preds) else 1.0 for k in range(len(preds))]
    return [float(x) for x in p_best], p_next


def surrogate_labels(predictor: Predictor, runs: Any) -> tuple[list, int]:
    """What :func:`distil_surrogate` fits on: ``runs`` (run-format dicts) labelled by ``predictor``'s full tier.

    Returns:
        ``(rows, refused)``: a row ``(run features, analytic s, full ms, breakdown shares, simulator ms)`` per run the
        full tier answers, the shares in :data:`~learnedperf.models.surrogate.BREAKDOWN_PARTS` order; the count of
        runs it refused.
    """
    from .models.surrogate import BREAKDOWN_PARTS
    from .specs import RunSpec

    rows, failed = [], 0
    for raw in runs:
        spec = RunSpec.from_dict(raw)
        try:
            pred = predictor.predict_with_result(spec, shapes=False)[0]
        except LearnedPerfError:
            failed += 1  # counted and reported: a run the full tier cannot answer teaches nothing
            continue
        _ctx, _mem, x, at = predictor._features(spec)
        t = pred["iteration_time_ms"]
        rows.append((x, at.total_s, t, [pred["breakdown_ms"].get(p, 0.0) / t for p in BREAKDOWN_PARTS],
                     pred["simulator_iteration_time_ms"]))
    return rows, failed


def distil_surrogate(predictor: Predictor, n: int = 20000, seed: int = 0, holdout: float = 0.2,
                     progress: bool = False, log: Any = lambda s: None, anchors: Optional[list] = None,
                     n_near: int = 0) -> tuple[Any, dict]:
    """Fit the fast tier's surrogate on ``n`` sampled runs labelled by ``predictor``'s full tier, and on
    ``n_near`` runs near ``anchors``.

    Runs come from the data set sampler (:func:`~learnedperf.data.sampler.sample_runs`, seed
    ``seed + 1`` so they differ from a data set generated with ``seed``). Near runs
    (:func:`~learnedperf.data.sampler.sample_near_runs`) take the model and hardware of an anchor — the
    measured runs the checkpoint was trained on — and a strategy of their own: the sampler draws catalog
    devices, so without them the surrogate would extrapolate on the hardware (an inline CPU with kernel
    curves, say) and the framework habits the full tier knows best from its measured runs, and where a
    cluster's own user asks most. A ``holdout`` share of each kind measures the surrogate's fidelity to
    the full tier (MAPE, and on the sampled runs the conformal quantiles of log(full / fast) that widen
    fast intervals) before the final fit on all of them.

    Returns:
        ``(surrogate, fidelity)``; ``fidelity["near"]`` describes the near runs (``n_labelled`` 0 without).
    """
    import math
    import time

    import numpy as np

    from .data.sampler import anchor_groups, draw_near, sample_runs
    from .models.intervals import conformal_quantile
    from .models.metrics import mape
    from .models.surrogate import SurrogateRegressor

    def label(it: Any, total: int, desc: str) -> tuple[list, int, float]:
        """(rows of [features, analytic s, full ms, shares, simulator ms], runs the full tier refused, seconds)"""
        t0 = time.perf_counter()
        if progress:
            from tqdm import tqdm

            it = tqdm(it, total=total, desc=desc, unit="run")
        rows, failed = surrogate_labels(predictor, (raw for _i, raw in it))
        return rows, failed, time.perf_counter() - t0

    def arrays(rows: list) -> tuple:
        return tuple(np.asarray([r[k] for r in rows], dtype=float) for k in range(5))

    groups: list = []
    if n_near > 0:
        if not anchors:
            raise InputError("distillation: n_near > 0 needs anchor runs to draw near")
        groups = anchor_groups(anchors)  # bad anchors are refused before any labelling
    sampled, failed, label_s = label(sample_runs(n, seed=seed + 1), n, "distil")
    if len(sampled) < 50:
        raise InputError(f"distillation: only {len(sampled)} of {n} sampled runs could be labelled")
    near: list = []
    near_failed, near_s = 0, 0.0
    if n_near > 0:
        # sample_near_runs' draws, on the groups made above
        near_runs = ((i, draw_near(seed + 1, i, groups).run) for i in range(n_near))
        near, near_failed, near_s = label(near_runs, n_near, "distil near")
    X, a, y, S, sim = arrays(sampled + near)
    # a memory over the simulator multiplies the simulator's time on a hit: the fast tier needs a model of it too
    shapes = predictor.checkpoint.shapes
    with_sim = shapes is not None and shapes.over == "simulator"
    is_near = np.arange(len(y)) >= len(sampled)
    rng = np.random.default_rng(seed)
    test = rng.random(len(y)) < holdout
    probe = SurrogateRegressor(random_state=seed).fit(X[~test], y[~test], a[~test], S[~test],
                                                      simulator_ms=sim[~test] if with_sim else None)
    fast = probe.predict(X[test], a[test])
    t_s, t_n = ~is_near[test], is_near[test]
    r = np.log(y[test][t_s] / fast[t_s])
    fidelity = {"n_labelled": len(sampled), "n_failed": failed, "n_holdout": int(t_s.sum()),
                "holdout_mape": round(float(mape(fast[t_s], y[test][t_s])), 3),
                "holdout_median_ape": round(float(np.median(np.abs(fast[t_s] / y[test][t_s] - 1)) * 100), 3),
                "log_lower": min(conformal_quantile(r, 0.05), 0.0), "log_upper": max(conformal_quantile(r, 0.95), 0.0),
                "share_mae": round(float(np.mean(np.abs(probe.predict_shares(X[test][t_s]) - S[test][t_s]))), 4),
                "sampler_seed": seed + 1, "label_seconds": round(label_s, 1)}
    fidelity["near"] = {"n_labelled": len(near), "n_failed": near_failed, "n_anchor_groups": len(groups),
                        "n_holdout": int(t_n.sum()), "label_seconds": round(near_s, 1)}
    if with_sim:
        # the simulator model's own fidelity: it widens a fast interval where the memory multiplies it
        fast_sim = probe.predict_simulator(X[test], a[test])
        rs = np.log(sim[test] / fast_sim)
        fidelity["simulator"] = {"holdout_mape": round(float(mape(fast_sim, sim[test])), 3),
                                 "log_lower": min(conformal_quantile(rs, 0.05), 0.0),
                                 "log_upper": max(conformal_quantile(rs, 0.95), 0.0)}
        log(f"distil: held-out fast vs full simulator MAPE {fidelity['simulator']['holdout_mape']:.2f} %")
    if t_n.any():
        fidelity["near"].update(
            holdout_mape=round(float(mape(fast[t_n], y[test][t_n])), 3),
            holdout_median_ape=round(float(np.median(np.abs(fast[t_n] / y[test][t_n] - 1)) * 100), 3))
    log(f"distil: {len(sampled)} sampled runs labelled in {label_s:.0f} s ({failed} failed); held-out fast vs full "
        f"MAPE {fidelity['holdout_mape']:.2f} %, log ratio 90 % in [{fidelity['log_lower']:.3f}, "
        f"{fidelity['log_upper']:.3f}]")
    if near:
        near_mape = fidelity["near"].get("holdout_mape", float("nan"))
        log(f"distil: {len(near)} runs near {len(groups)} measured (model, hardware) pairs labelled in {near_s:.0f} s "
            f"({near_failed} failed); held-out fast vs full MAPE {near_mape:.2f} %")
    bounds = [fidelity[k] for k in ("log_lower", "log_upper")]
    bounds += [fidelity["simulator"][k] for k in ("log_lower", "log_upper")] if with_sim else []
    if not all(math.isfinite(b) for b in bounds):
        raise InputError("distillation: the surrogate's fidelity is not finite")
    return SurrogateRegressor(random_state=seed).fit(X, y, a, S, simulator_ms=sim if with_sim else None), fidelity


__all__ = ["Predictor", "SEARCH_CONSTRAINTS", "TIERS", "distil_surrogate", "enumerate_strategies", "error_text",
           "surrogate_labels"]
