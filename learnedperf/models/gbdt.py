"""Gradient-boosted per-operator time regressors and the learned cost model.

:class:`OpTimeRegressor` is a scikit-learn style estimator over the columns of
:data:`~learnedperf.features.OP_FEATURE_SCHEMA`. It does not learn raw time:
its LightGBM model learns ``log(time_s / roofline_bound_s)``, the log ratio of
the measured time to the roofline lower bound that the features carry (column
``log_roofline_s``). The bound already scales with the device's peak and
bandwidth, so the residual is what transfers to devices never measured
(launch overhead, wave quantisation, cache effects, kernel efficiency).
A squared loss on a log target is also a loss on *relative* error, which is how
operator times are judged (MAPE).

Artifacts are LightGBM text models plus a JSON sidecar (feature schema version
and names, sha256 of the model file): no pickles. :meth:`OpTimeRegressor.load`
refuses a missing, tampered, truncated or schema-incompatible model with an
:class:`~learnedperf.errors.InputError`.

:class:`LearnedOpCost` puts a fitted regressor behind the
:class:`~learnedperf.cost.CostModel` interface (communication delegated to a
:class:`~learnedperf.cost.RooflineCost`), so the simulator runs on learned
operator costs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from ..cost import CommCost, CostModel, RooflineCost
from ..errors import InputError
from ..features.ops import OP_FEATURE_SCHEMA, ROOFLINE_COLUMN, op_features, op_features_from_ops
from ..graph.ops import Op
from ..measure.records import sha256_file
from ..specs import HardwareSpec

MODEL_FILE = "op_time_model.txt"
META_FILE = "op_time_model.json"
#: What the LightGBM model predicts; stored in the sidecar so a reader knows how to invert it.
TARGET = "log(time_s / exp(log_roofline_s))"

#: LightGBM defaults. Huber on the log residual (delta 0.5, i.e. a factor ~1.65) keeps a few noisy
#: kernels from dominating: leave-one-device-out MAPE 33.8/23.9/21.7/20.0/29.4 % with L2 vs
#: 18.4/23.5/18.5/18.8/28.3 % with Huber (A100/P100/P4/T4/V100, raw device columns excluded).
_DEFAULT_PARAMS = {"n_estimators": 300, "learning_rate": 0.05, "num_leaves": 63, "min_child_samples": 20,
                   "subsample": 0.8, "subsample_freq": 1, "colsample_bytree": 0.9, "reg_lambda": 1.0,
                   "objective": "huber", "alpha": 0.5}

#: Raw device descriptors the default regressor does not split on. With a handful of training
#: devices, each raw descriptor (SM count, clock, ...) names a device, and trees memorise devices
#: instead of learning how time scales: leaving these out cut the held-out A100's MAPE from 33.8 %
#: to 19.3 % (experiments/op_regressor_accuracy.py, L2 loss). The device still enters through the
#: scale-free columns log_compute_s, log_memory_s, log_roofline_s and log_bytes_per_l2. Pass
#: ``exclude_features=()`` to use them all once many devices are measured.
DEVICE_IDENTITY_FEATURES = ("num_sms", "l2_cache_MiB", "clock_MHz", "log_peak_flops", "log_mem_bw_Bps",
                            "log_ridge")


class OpTimeRegressor:
    """Per-operator time regressor (scikit-learn conventions: ``fit`` returns self, learned state ends in ``_``).

    ``X`` is a feature matrix in :data:`OP_FEATURE_SCHEMA` order (from
    :func:`~learnedperf.features.op_features`); ``y`` and predictions are operator times in
    **milliseconds**. Internally the model fits ``log(time_s) - log_roofline_s``.

    Args:
        n_jobs: LightGBM threads.
        random_state: seed of the row and column subsampling.
        exclude_features: schema names held constant (so never split on) in fit and predict;
            default :data:`DEVICE_IDENTITY_FEATURES`.
        **lgbm_params: other ``lightgbm.LGBMRegressor`` arguments (defaults in ``_DEFAULT_PARAMS``).
    """

    def __init__(self, n_jobs: int = 2, random_state: int = 0,
                 exclude_features: Iterable[str] = DEVICE_IDENTITY_FEATURES, **lgbm_params: Any):
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.exclude_features = tuple(exclude_features)
        unknown = [n for n in self.exclude_features if n not in OP_FEATURE_SCHEMA.names]
        if unknown:
            raise InputError(f"exclude_features: unknown feature(s) {unknown}")
        if ROOFLINE_COLUMN in self.exclude_features:
            raise InputError(f"exclude_features: {ROOFLINE_COLUMN} is the baseline of the target, it cannot be excluded")
        self.lgbm_params = {**_DEFAULT_PARAMS, **lgbm_params}

    # ------------------------------------------------------------ sklearn API
    def get_params(self, deep: bool = True) -> dict:
        """Constructor arguments (scikit-learn convention)."""
        return {"n_jobs": self.n_jobs, "random_state": self.random_state,
                "exclude_features": list(self.exclude_features), **self.lgbm_params}

    def _check_X(self, X) -> "Any":
        import numpy as np

        X = np.asarray(X, dtype=np.float32)
        n_feat = len(OP_FEATURE_SCHEMA.features)
        if X.ndim != 2 or X.shape[1] != n_feat:
            raise InputError(f"feature matrix: expected shape (n, {n_feat}) of schema "
                             f"{OP_FEATURE_SCHEMA.name} v{OP_FEATURE_SCHEMA.version}, got {X.shape}")
        if self.exclude_features:
            # a constant column is never split on; zero it in a copy so the caller's matrix is untouched
            X = X.copy()
            X[:, [OP_FEATURE_SCHEMA.index(n) for n in self.exclude_features]] = 0.0
        return X

    def fit(self, X, y_ms, sample_weight=None) -> "OpTimeRegressor":
        """Fit on features ``X`` and measured times ``y_ms`` (milliseconds, > 0); return self."""
        import lightgbm
        import numpy as np

        X = self._check_X(X)
        y_ms = np.asarray(y_ms, dtype=np.float64)
        if y_ms.shape != (X.shape[0],) or not np.all(np.isfinite(y_ms)) or np.any(y_ms <= 0):
            raise InputError("op times: expected one finite positive time_ms per row")
        target = np.log(y_ms * 1e-3) - X[:, OP_FEATURE_SCHEMA.index(ROOFLINE_COLUMN)]
        model = lightgbm.LGBMRegressor(n_jobs=self.n_jobs, random_state=self.random_state, verbose=-1,
                                       **self.lgbm_params)
        model.fit(X, target, sample_weight=sample_weight, feature_name=_lgbm_names())
        self.booster_ = model.booster_
        self.n_features_in_ = X.shape[1]
        self.schema_version_ = OP_FEATURE_SCHEMA.version
        return self

    def predict(self, X) -> "Any":
        """Predicted times in milliseconds for the rows of ``X``."""
        import numpy as np

        if not hasattr(self, "booster_"):
            raise InputError("OpTimeRegressor: not fitted (call fit or load first)")
        X = self._check_X(X)
        if len(X) == 0:
            return np.zeros(0)
        resid = self.booster_.predict(X, num_threads=self.n_jobs)
        return np.exp(resid + X[:, OP_FEATURE_SCHEMA.index(ROOFLINE_COLUMN)].astype(np.float64)) * 1e3

    # ------------------------------------------------------- records API
    def fit_records(self, records, sample_weight=None) -> "OpTimeRegressor":
        """Fit on an ``OP_COLUMNS`` DataFrame of measured operator records; return self."""
        return self.fit(op_features(records), records["time_ms"].to_numpy(), sample_weight=sample_weight)

    def predict_records(self, records) -> "Any":
        """Predicted ``time_ms`` of each row of an ``OP_COLUMNS`` DataFrame."""
        return self.predict(op_features(records))

    def predict_ops(self, ops: Iterable[Op], device: Any) -> "Any":
        """Predicted milliseconds of graph ops on ``device`` (dict, JSON text or DeviceSpec)."""
        return self.predict(op_features_from_ops(ops, device))

    # ------------------------------------------------------------ storage
    def save(self, directory: str | Path) -> Path:
        """Write the LightGBM text model and its JSON sidecar into ``directory``; return the directory."""
        if not hasattr(self, "booster_"):
            raise InputError("OpTimeRegressor: not fitted, nothing to save")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model_path = directory / MODEL_FILE
        self.booster_.save_model(str(model_path))
        meta = {"format": "learnedperf.OpTimeRegressor", "target": TARGET, "time_unit": "ms",
                "feature_schema": {"name": OP_FEATURE_SCHEMA.name, "version": OP_FEATURE_SCHEMA.version,
                                   "names": OP_FEATURE_SCHEMA.names},
                "params": self.get_params(), "model_file": MODEL_FILE,
                "model_sha256": sha256_file(model_path)}
        (directory / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "OpTimeRegressor":
        """Load a regressor written by :meth:`save`.

        Raises:
            InputError: a file is missing or unreadable, the model file's sha256 differs from the
                sidecar (tampered or truncated), or the feature schema version or names differ from
                this package's :data:`OP_FEATURE_SCHEMA`.
        """
        import lightgbm

        directory = Path(directory)
        meta_path, model_path = directory / META_FILE, directory / MODEL_FILE
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"{meta_path}: cannot read ({exc.strerror})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{meta_path}: not valid JSON ({exc})") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("feature_schema"), dict):
            raise InputError(f"{meta_path}: missing 'feature_schema'")
        fs = meta["feature_schema"]
        if fs.get("version") != OP_FEATURE_SCHEMA.version:
            raise InputError(f"{meta_path}: feature schema version {fs.get('version')} is incompatible with "
                             f"this package's op schema v{OP_FEATURE_SCHEMA.version}")
        if fs.get("names") != OP_FEATURE_SCHEMA.names:
            raise InputError(f"{meta_path}: feature names differ from this package's op schema "
                             f"v{OP_FEATURE_SCHEMA.version}")
        if not model_path.is_file():
            raise InputError(f"{model_path}: missing")
        if sha256_file(model_path) != meta.get("model_sha256"):
            raise InputError(f"{model_path}: sha256 differs from {META_FILE} (file changed or truncated)")
        try:
            booster = lightgbm.Booster(model_file=str(model_path))
        except lightgbm.basic.LightGBMError as exc:
            raise InputError(f"{model_path}: not a LightGBM model ({exc})") from None
        if booster.num_feature() != len(OP_FEATURE_SCHEMA.features):
            raise InputError(f"{model_path}: model has {booster.num_feature()} features, schema has "
                             f"{len(OP_FEATURE_SCHEMA.features)}")
        params = dict(meta.get("params") or {})
        self = cls(**params)
        self.booster_ = booster
        self.n_features_in_ = booster.num_feature()
        self.schema_version_ = fs["version"]
        return self


def _lgbm_names() -> list[str]:
    # LightGBM rejects some characters in feature names (e.g. '=' is fine, '+' is not in JSON dumps)
    return [n.replace("=", "_").replace("+", "_") for n in OP_FEATURE_SCHEMA.names]


class LearnedOpCost(CostModel):
    """Compute time from an :class:`OpTimeRegressor`, communication from a :class:`RooflineCost`.

    Predictions are memoised per distinct op; :meth:`prefetch` predicts many ops in one batch
    (one LightGBM call), which is what a simulator should call with a graph's ops first.

    Args:
        hardware: the run's hardware (its device descriptor feeds the features).
        regressor: a fitted regressor.
        comm: the cost model for collectives (default: ``RooflineCost(hardware)``).
    """

    name = "learned-gbdt"

    def __init__(self, hardware: HardwareSpec, regressor: OpTimeRegressor, comm: CostModel | None = None):
        self.hw = hardware
        self.regressor = regressor
        self.comm = comm or RooflineCost(hardware)
        self._device = hardware.device.to_dict()
        self._cache: dict[Op, float] = {}

    def prefetch(self, ops: Iterable[Op]) -> None:
        """Predict and memoise the compute ops of ``ops`` not yet seen, in one batch."""
        todo = list({op: None for op in ops if not op.is_comm and op not in self._cache})
        if todo:
            times_ms = self.regressor.predict_ops(todo, self._device)
            for op, t in zip(todo, times_ms):
                self._cache[op] = float(t) * 1e-3

    def compute_time_s(self, op: Op) -> float:
        """Seconds of compute op ``op`` on one device, as the regressor predicts."""
        t = self._cache.get(op)
        if t is None:
            self.prefetch([op])
            t = self._cache[op]
        return t

    def comm_cost(self, op: Op) -> CommCost:
        """Latency and bytes per link level of collective ``op`` (from the communication model)."""
        return self.comm.comm_cost(op)

    def link_bandwidth_Bps(self, level: str) -> float:
        """Achievable bytes/s of one rank's ``level`` link (from the communication model)."""
        return self.comm.link_bandwidth_Bps(level)
