"""The fast surrogate: LightGBM over closed-form run features, distilled from the full model.

The full model of a checkpoint (simulator + GNN) answers in 5-15 ms; a planner scoring
thousands of strategies a second needs ~100 µs. :class:`SurrogateRegressor` learns, from
runs labelled by the full model (*distillation*: labels are free, so the sampled runs can
cover every model family, device, scale and strategy the sampler draws),

* ``log(full time / analytic time)`` from :data:`~learnedperf.features.run.RUN_FEATURE_SCHEMA`
  (the analytic time of :func:`~learnedperf.features.run.analytic_time` carries the scaling,
  the trees learn a bounded correction), and
* the share of each breakdown part (:data:`BREAKDOWN_PARTS`) in the full model's time, and
* optionally ``log(simulator time / analytic time)``, the simulator under the full model: what a shape memory kept
  over the simulator (:class:`~learnedperf.models.shapes.ShapeMemory`'s ``over``) multiplies on a fast answer.

Its *fidelity* — the conformal quantiles of ``log(full / surrogate)`` on held-out distilled
runs — widens the checkpoint's interval for fast answers, so a fast interval accounts for
both the full model's error and the surrogate's.

Saved as LightGBM text models plus a JSON sidecar with the schema and sha256 of every file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from ..features.run import RUN_FEATURE_SCHEMA
from ..io import load_json_object
from ..measure.records import sha256_file

META_FILE = "surrogate.json"
TIME_FILE = "time.txt"
SIMULATOR_FILE = "simulator.txt"
#: Breakdown parts whose share of the iteration time the surrogate predicts (``compute`` is their
#: forward + backward + recompute sum, as in the simulator's breakdown).
BREAKDOWN_PARTS = ("forward", "backward", "recompute", "optimizer", "exposed_communication", "pipeline_bubble")
#: Trees and leaves of each share model (held-out share error 0.3-5.5 points at 6,000 distilled runs,
#: against 0.3-4.8 with 200 trees of 63 leaves, at a tenth of the prediction time).
SHARE_TREES, SHARE_LEAVES = 100, 15
#: Monotone constraints of the time model (LightGBM ``monotone_constraints``; -1: the correction may only fall
#: as the feature grows, +1: only rise). A run cannot be slower on a device with more memory, more L2 or a higher
#: clock and otherwise the same figures, and the analytic time reads none of the three, so the correction carries
#: their whole effect; ``memory_share`` (peak memory over device memory) is the same capacity seen from the run.
#: The rates (peak FLOP/s, bandwidths) are left free: the analytic time falls with them, and where the host or
#: a fixed cost binds, the full time falls less, so the correction rightly rises. On labels of the checkpoint of
#: 2026-11-28, morning, the dominating device of a catalog pair came out more than 1 % behind on 657 of 8,696
#: comparisons of sampled runs unconstrained and on 503 constrained (the full tier: 11), at held-out fidelity
#: 5.41 / 3.27 % against 5.37 / 3.17 (``python experiments/surrogate_monotone.py --data gen3k``). The largest
#: excess did not fall (+20.8 % against +16.8): the rates and the analytic times still carry the rest.
TIME_MONOTONE = {"memory_GiB": -1, "l2_MiB": -1, "clock_MHz": -1, "memory_share": 1}


class SurrogateRegressor:
    """LightGBM time and breakdown-share models on run features (scikit-learn style).

    Args:
        n_estimators, learning_rate, num_leaves, min_child_samples: LightGBM parameters of the
            time model. The share models are smaller (``SHARE_TREES`` trees of ``SHARE_LEAVES``
            leaves): their error is a few percent of the time either way, and every tree costs
            prediction time.
        random_state: LightGBM seed.
        monotone: hold the time model to :data:`TIME_MONOTONE` (False: unconstrained, for comparison).
    """

    def __init__(self, n_estimators: int = 300, learning_rate: float = 0.1, num_leaves: int = 31,
                 min_child_samples: int = 10, random_state: int = 0, monotone: bool = True):
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.random_state = random_state
        self.monotone = monotone

    def get_params(self, deep: bool = True) -> dict:
        """Constructor arguments (scikit-learn convention)."""
        return {"n_estimators": self.n_estimators, "learning_rate": self.learning_rate,
                "num_leaves": self.num_leaves, "min_child_samples": self.min_child_samples,
                "random_state": self.random_state, "monotone": self.monotone}

    def _params(self, trees: int, leaves: int) -> dict:
        return {"objective": "regression", "learning_rate": self.learning_rate, "num_leaves": leaves,
                "min_data_in_leaf": self.min_child_samples, "seed": self.random_state, "verbose": -1,
                "num_iterations": trees, "deterministic": True, "force_row_wise": True}

    def fit(self, X: Any, time_ms: Any, analytic_s: Any, shares: Optional[Any] = None,
            sample_weight: Optional[Any] = None, simulator_ms: Optional[Any] = None) -> "SurrogateRegressor":
        """Fit on runs with features ``X`` (n × schema), full-model times ``time_ms``, analytic
        times ``analytic_s``, optionally breakdown shares (n × :data:`BREAKDOWN_PARTS`) and the simulator's
        times ``simulator_ms`` under the full model (a model of them, :meth:`predict_simulator`)."""
        import lightgbm
        import numpy as np

        X = self._check_X(X)
        y = np.asarray(time_ms, dtype=float)
        a = np.asarray(analytic_s, dtype=float)
        if y.shape != (len(X),) or a.shape != (len(X),):
            raise InputError(f"time_ms and analytic_s need {len(X)} values each")
        if not (np.isfinite(y).all() and (y > 0).all() and np.isfinite(a).all() and (a > 0).all()):
            raise InputError("time_ms and analytic_s must be positive and finite")
        target = np.log(y / (a * 1e3))
        ds = lightgbm.Dataset(X, target, weight=sample_weight, feature_name=RUN_FEATURE_SCHEMA.names,
                              free_raw_data=True)
        params = self._params(self.n_estimators, self.num_leaves)
        if self.monotone:
            # "advanced" keeps more of each constrained split's gain than the default "basic"
            params.update(monotone_constraints=[TIME_MONOTONE.get(n, 0) for n in RUN_FEATURE_SCHEMA.names],
                          monotone_constraints_method="advanced")
        self.time_booster_ = lightgbm.train(params, ds)
        self.simulator_booster_ = None
        if simulator_ms is not None:
            sim = np.asarray(simulator_ms, dtype=float)
            if sim.shape != (len(X),) or not (np.isfinite(sim).all() and (sim > 0).all()):
                raise InputError(f"simulator_ms needs {len(X)} positive finite values")
            # the same trees and constraints as the time model: the simulator is as monotone in the device's figures
            dss = lightgbm.Dataset(X, np.log(sim / (a * 1e3)), weight=sample_weight,
                                   feature_name=RUN_FEATURE_SCHEMA.names, free_raw_data=True)
            self.simulator_booster_ = lightgbm.train(params, dss)
        self.share_boosters_ = {}
        if shares is not None:
            S = np.asarray(shares, dtype=float)
            if S.shape != (len(X), len(BREAKDOWN_PARTS)):
                raise InputError(f"shares must be {len(X)} x {len(BREAKDOWN_PARTS)}")
            for j, part in enumerate(BREAKDOWN_PARTS):
                dsj = lightgbm.Dataset(X, np.clip(S[:, j], 0.0, 1.0), weight=sample_weight,
                                       feature_name=RUN_FEATURE_SCHEMA.names)
                self.share_boosters_[part] = lightgbm.train(self._params(SHARE_TREES, SHARE_LEAVES), dsj)
        self.n_train_ = int(len(X))
        return self

    @staticmethod
    def _check_X(X: Any):
        import numpy as np

        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(RUN_FEATURE_SCHEMA.features):
            raise InputError(f"run features must be n x {len(RUN_FEATURE_SCHEMA.features)}, got {X.shape}")
        return X

    def _check_fitted(self) -> None:
        if not hasattr(self, "time_booster_"):
            raise InputError("SurrogateRegressor is not fitted: call fit() or load() first")

    def predict(self, X: Any, analytic_s: Any):
        """Iteration times in ms of runs with features ``X`` and analytic times ``analytic_s``."""
        import numpy as np

        self._check_fitted()
        X = self._check_X(X)
        if len(X) == 0:
            return np.empty(0)
        return np.exp(self.time_booster_.predict(X)) * np.asarray(analytic_s, dtype=float) * 1e3

    def predict_simulator(self, X: Any, analytic_s: Any):
        """The simulator's iteration times in ms (under the full model) of runs with features ``X``.

        Raises:
            InputError: the surrogate was fitted without ``simulator_ms``.
        """
        import numpy as np

        self._check_fitted()
        if self.simulator_booster_ is None:
            raise InputError("SurrogateRegressor has no simulator model (fitted without simulator_ms)")
        X = self._check_X(X)
        if len(X) == 0:
            return np.empty(0)
        return np.exp(self.simulator_booster_.predict(X)) * np.asarray(analytic_s, dtype=float) * 1e3

    def predict_shares(self, X: Any):
        """Breakdown shares (n × :data:`BREAKDOWN_PARTS`, each clipped to [0, 1]), or None if not fitted."""
        import numpy as np

        self._check_fitted()
        if not self.share_boosters_:
            return None
        X = self._check_X(X)
        if len(X) == 0:
            return np.empty((0, len(BREAKDOWN_PARTS)))
        return np.clip(np.column_stack([self.share_boosters_[p].predict(X) for p in BREAKDOWN_PARTS]), 0.0, 1.0)

    # ------------------------------------------------------------------ files
    def save(self, directory: str | Path, extra: Optional[dict] = None) -> Path:
        """Write the LightGBM text models and the sidecar into ``directory`` (``extra``: more sidecar keys)."""
        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = {"time": TIME_FILE, **{p: f"share_{p}.txt" for p in self.share_boosters_}}
        boosters = {"time": self.time_booster_, **self.share_boosters_}
        if self.simulator_booster_ is not None:
            files["simulator"], boosters["simulator"] = SIMULATOR_FILE, self.simulator_booster_
        for key, name in files.items():
            boosters[key].save_model(str(directory / name))
        meta = {"format": "learnedperf.SurrogateRegressor", "target": "log(full_ms / analytic_ms)",
                "feature_schema": RUN_FEATURE_SCHEMA.to_sidecar(),
                "params": self.get_params(), "n_train": self.n_train_,
                "models": {k: {"file": n, "sha256": sha256_file(directory / n)} for k, n in files.items()},
                **(extra or {})}
        (directory / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> tuple["SurrogateRegressor", dict]:
        """Load what :meth:`save` wrote; return the regressor and the sidecar dict.

        Raises:
            InputError: a missing or unreadable file, a sha256 mismatch (tampered or truncated), or a
                feature schema other than this package's :data:`RUN_FEATURE_SCHEMA`.
        """
        from .gbdt import load_booster

        directory = Path(directory)
        meta_path = directory / META_FILE
        meta = load_json_object(meta_path, "surrogate sidecar (a JSON object)")
        RUN_FEATURE_SCHEMA.check_sidecar(meta.get("feature_schema"), meta_path)
        models = meta.get("models")
        if not isinstance(models, dict) or "time" not in models:
            raise InputError(f"{meta_path}: 'models' must list at least the time model")
        obj = cls(**{k: v for k, v in (meta.get("params") or {}).items() if k in cls().get_params()})
        boosters = {}
        for key, entry in models.items():
            if key not in ("time", "simulator") and key not in BREAKDOWN_PARTS:
                raise InputError(f"{meta_path}: unknown model {key!r}")
            if not isinstance(entry, dict):
                raise InputError(f"{meta_path}: models.{key} must be an object with 'file' and 'sha256'")
            boosters[key] = load_booster(directory / str(entry.get("file", "")), entry.get("sha256"),
                                         RUN_FEATURE_SCHEMA, META_FILE)
        obj.time_booster_ = boosters.pop("time")
        obj.simulator_booster_ = boosters.pop("simulator", None)
        obj.share_boosters_ = {p: boosters[p] for p in BREAKDOWN_PARTS if p in boosters}
        obj.n_train_ = int(meta.get("n_train", 0))
        return obj, meta


__all__ = ["BREAKDOWN_PARTS", "META_FILE", "SurrogateRegressor", "TIME_MONOTONE"]
