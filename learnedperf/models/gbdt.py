"""Gradient-boosted per-operator time regressors and the learned cost model.

:class:`OpTimeRegressor` is a scikit-learn style estimator over the columns of
:data:`~learnedperf.features.OP_FEATURE_SCHEMA`. It does not learn raw time:
its LightGBM model learns ``log(time_s / roofline_bound_s)``, the log ratio of
the measured time to the roofline lower bound that the features carry (column
``log_roofline_s``). The bound already scales with the device's peak and
bandwidth, so the residual is what transfers to devices never measured
(launch overhead, wave quantisation, cache effects, kernel efficiency).
A squared loss on a log target is also a loss on *relative* error, which is how
operator times are judged (MAPE). A device whose own kernels are in the training
data also gets its offsets (``device_offsets_``): by how much, per kind and
dtype, its kernels deviate from what the trees predict from its data sheet.

Training runs in-process, or data-parallel on a Dask cluster through
``lightgbm.dask`` (``fit(..., client=...)``): same parameters, target and
excluded features; the fitted booster is brought back to this process, so
saving, loading and predicting do not depend on how the model was trained.
:func:`load_op_training_data` assembles the operator records the default model
is trained on (this project's measured operators plus NeuSight's public ones).

Artifacts are LightGBM text models plus a JSON sidecar (feature schema version
and names, sha256 of the model file, how the model was trained): no pickles.
:meth:`OpTimeRegressor.load` refuses a missing, tampered, truncated or
schema-incompatible model with an :class:`~learnedperf.errors.InputError`.

:class:`LearnedOpCost` puts a fitted regressor behind the
:class:`~learnedperf.cost.CostModel` interface (communication delegated to a
:class:`~learnedperf.cost.RooflineCost`), so the simulator runs on learned
operator costs — where the device has no measured kernel curve for the op (its own timings
come first) and the regressor was trained on that kind of operator. An op whose
(device class, kind, dtype) no training record had (the regressor's ``coverage_``: say a
bf16 GEMM on a GPU when only NeuSight's fp32 GPU kernels were measured), or had on fewer than
:data:`MIN_COVERAGE_DEVICES` devices, none of them the one asked about (``coverage_devices_``), is
costed by the roofline instead: a tree model extrapolates flat outside its data, and on the
held-out evaluation the learned costs beat the roofline where they had such data (fp32 V100
steps) and lost where they had none (bf16 A100 steps) or only one chip's (bf16 A100 steps
against the lent Hopper GPUs' kernels).
"""

from __future__ import annotations

import json
import math
import numbers
import warnings
from pathlib import Path
from typing import Any, Iterable

from ..cost import CommCost, CostModel, RooflineCost
from ..errors import InputError, LearnedPerfError
from ..io import load_json_file
from ..features.ops import (OP_FEATURE_SCHEMA, ROOFLINE_COLUMN, FeatureSchema, device_descriptor, op_features,
                            op_features_from_ops)
from ..graph.ops import Op
from ..measure.records import sha256_file
from ..specs import HardwareSpec
from .dataset import device_class

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

#: Fewest devices whose kernels of a (device class, kind, dtype) the trees must have seen before they cost that
#: kind and dtype on a device they did not see (a device costs its own measured kinds and dtypes regardless).
#: Trees learnt from one or two devices' kernels describe those chips, not the class: when the lent H100's and
#: H200's bf16 kernels (one GH100 chip, two names) were the only bf16 GPU records, the trees costed every GPU's
#: bf16 ops from them, and ``simulator+ops`` on the held-out A100 went from 7.8 to 9.1 % (unseen strategy 7.2 ->
#: 8.6, scale 8.0 -> 8.8, random 10.4 -> 12.1); needing three devices gave 7.7, 7.2, 8.0 and 11.2 %, every other
#: split within 0.1 point (``learnedperf evaluate --methods simulator+ops`` on the README's data set of
#: 2026-11-27, night). NeuSight's five GPUs cover fp32.
MIN_COVERAGE_DEVICES = 3

#: Raw device descriptors the default regressor does not split on. With a handful of training
#: devices, each raw descriptor (SM count, clock, ...) names a device, and trees memorise devices
#: instead of learning how time scales: leaving these out cut the held-out A100's MAPE from 33.8 %
#: to 19.3 % (experiments/op_regressor_accuracy.py, L2 loss). The device still enters through the
#: scale-free columns log_compute_s, log_memory_s, log_roofline_s and log_bytes_per_l2. Pass
#: ``exclude_features=()`` to use them all once many devices are measured.
DEVICE_IDENTITY_FEATURES = ("num_sms", "l2_cache_MiB", "clock_MHz", "log_peak_flops", "log_mem_bw_Bps",
                            "log_ridge")

#: The cache column that is NaN for a device whose data sheet gives no L2 size (the catalog's
#: L4, T4, MI250X, ...; :data:`~learnedperf.features.OP_FEATURE_SCHEMA` v2).
CACHE_COLUMN = "log_bytes_per_l2"
#: Default share of training rows copied with the cache size unknown (see ``unknown_cache_share``).
UNKNOWN_CACHE_SHARE = 0.25
#: Default prior weight, in records, of a zero device offset (see ``device_offset_prior_rows``).
DEVICE_OFFSET_PRIOR_ROWS = 20.0
#: Largest |log offset| a sidecar may carry (a factor of e^3 = 20): larger is a corrupt file, not a device.
MAX_DEVICE_OFFSET = 3.0


class OpTimeRegressor:
    """Per-operator time regressor (scikit-learn conventions: ``fit`` returns self, learned state ends in ``_``).

    ``X`` is a feature matrix in :data:`OP_FEATURE_SCHEMA` order (from
    :func:`~learnedperf.features.op_features`); ``y`` and predictions are operator times in
    **milliseconds**. Internally the model fits ``log(time_s) - log_roofline_s``.

    Learned state: ``booster_`` (the LightGBM booster, always in this process), ``n_features_in_``,
    ``schema_version_``, ``trained_with_`` (``'local'``, ``'dask'``, or ``'unknown'`` for a model
    saved before this was recorded), ``dask_workers_`` (workers that trained it, 0 locally) and
    ``coverage_``: training records per ``(device class, kind, dtype)`` (:meth:`fit_records` sets it;
    ``None`` after :meth:`fit` on a bare matrix, which does not say the devices, or for a model saved
    before coverage was recorded: every op then counts as covered), ``coverage_devices_``: the names of the
    devices with such records (``None`` where ``coverage_`` is, or for a model saved before they were
    recorded: then any record covers), and ``device_offsets_``: per
    device name, the log factor by which that device's measured kernels deviate from the trees, per
    ``"kind/dtype"`` and overall per dtype (``"*/dtype"``) (:meth:`fit_records` sets it; empty after
    :meth:`fit` or for a model saved before offsets were recorded).

    Why offsets: the trees see a device only through its data sheet (``exclude_features``), so they
    predict what a device with that data sheet reaches *on average*, and a device that reaches more
    (the V100: 0.78 of its fp32 peak on large GEMMs, the other NeuSight GPUs 0.37-0.72) is predicted
    slow by every model trained without it. Its own kernels say by how much. The offset of a
    ``(device, kind, dtype)`` is the median log(measured / predicted) over its training records,
    shrunk towards the device's offset for the dtype, which is shrunk towards 0, each with the weight
    ``n / (n + device_offset_prior_rows)`` of its ``n`` records. A prediction for a device *name*
    with offsets (a measured device, in training or from a user's ``learnedperf measure``) is
    multiplied by ``exp(offset)``; any other device, and a dtype never measured on that device, get
    none: a device's data sheet is all that is known of it. Held out one NeuSight GPU at a time, 100
    random kernels of the held-out GPU in training moved ``simulator+ops`` on its measured steps from
    19.6 to 5.2 % on the V100 (``experiments/few_shot_device.py``).

    Args:
        n_jobs: LightGBM threads (local training and prediction).
        random_state: seed of the row and column subsampling.
        exclude_features: schema names held constant (so never split on) in fit and predict;
            default :data:`DEVICE_IDENTITY_FEATURES`.
        unknown_cache_share: share of the training rows with a known L2 size that :meth:`fit` adds again
            with the size unknown (``log_bytes_per_l2`` NaN), so that the trees learn where a device
            without an L2 figure belongs — the average over the training caches — instead of reading
            NaN as LightGBM does for a feature that had no missing value in training (as 0, a working
            set exactly the cache's size). 0 turns it off.
        device_offsets: learn and apply the per-device offsets above (False: the trees alone).
        device_offset_prior_rows: records' worth of weight the prior offset 0 has (> 0).
        min_coverage_devices: the devices of a (class, kind, dtype) the trees must have seen to cost it on
            another device (:meth:`covers`; default :data:`MIN_COVERAGE_DEVICES`).
        **lgbm_params: other ``lightgbm.LGBMRegressor`` arguments (defaults in ``_DEFAULT_PARAMS``).
    """

    def __init__(self, n_jobs: int = 2, random_state: int = 0,
                 exclude_features: Iterable[str] = DEVICE_IDENTITY_FEATURES,
                 unknown_cache_share: float = UNKNOWN_CACHE_SHARE, device_offsets: bool = True,
                 device_offset_prior_rows: float = DEVICE_OFFSET_PRIOR_ROWS,
                 min_coverage_devices: int = MIN_COVERAGE_DEVICES, **lgbm_params: Any):
        self.n_jobs = n_jobs
        self.random_state = random_state
        if (isinstance(unknown_cache_share, bool) or not isinstance(unknown_cache_share, numbers.Real)
                or not 0.0 <= float(unknown_cache_share) <= 1.0):
            raise InputError(f"unknown_cache_share: expected a number in [0, 1], got {unknown_cache_share!r}")
        self.unknown_cache_share = float(unknown_cache_share)
        if not isinstance(device_offsets, bool):
            raise InputError(f"device_offsets: expected true or false, got {device_offsets!r}")
        self.device_offsets = device_offsets
        if (isinstance(device_offset_prior_rows, bool) or not isinstance(device_offset_prior_rows, numbers.Real)
                or not math.isfinite(device_offset_prior_rows) or device_offset_prior_rows <= 0):
            raise InputError("device_offset_prior_rows: expected a finite number > 0, "
                             f"got {device_offset_prior_rows!r}")
        self.device_offset_prior_rows = float(device_offset_prior_rows)
        if (isinstance(min_coverage_devices, bool) or not isinstance(min_coverage_devices, int)
                or min_coverage_devices < 1):
            raise InputError(f"min_coverage_devices: expected an integer >= 1, got {min_coverage_devices!r}")
        self.min_coverage_devices = min_coverage_devices
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
                "exclude_features": list(self.exclude_features), "unknown_cache_share": self.unknown_cache_share,
                "device_offsets": self.device_offsets, "device_offset_prior_rows": self.device_offset_prior_rows,
                "min_coverage_devices": self.min_coverage_devices, **self.lgbm_params}

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

    def fit(self, X, y_ms, sample_weight=None, client=None) -> "OpTimeRegressor":
        """Fit on features ``X`` and measured times ``y_ms`` (milliseconds, > 0); return self.

        Args:
            X: feature matrix (:func:`~learnedperf.features.op_features`).
            y_ms: measured times in milliseconds.
            sample_weight: optional weight per row.
            client: a ``dask.distributed.Client``: train data-parallel with
                ``lightgbm.dask.DaskLGBMRegressor`` on its workers (rows shuffled with
                ``random_state`` and split into one partition per worker, LightGBM's network on the
                workers' own addresses). Parameters, target and excluded features are the local
                path's; LightGBM threads per worker are the worker's thread count (lightgbm.dask
                ignores ``n_jobs``). ``None`` (default): train in this process.

        Sets ``booster_`` (always a local booster), ``trained_with_`` (``'local'`` or ``'dask'``)
        and ``dask_workers_`` (workers that trained, 0 locally).

        Raises:
            InputError: a bad matrix or time, or ``client`` is not a dask Client.
            LearnedPerfError: the cluster cannot train (closed client, no workers, a worker or
                LightGBM's network failed), with the scheduler's address and the cause.
        """
        import numpy as np

        X = self._check_X(X)
        y_ms = np.asarray(y_ms, dtype=np.float64)
        if y_ms.shape != (X.shape[0],) or not np.all(np.isfinite(y_ms)) or np.any(y_ms <= 0):
            raise InputError("op times: expected one finite positive time_ms per row")
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, dtype=np.float64)
            if sample_weight.shape != (X.shape[0],):
                raise InputError(f"sample_weight: expected {X.shape[0]} weights, got shape {sample_weight.shape}")
        target = np.log(y_ms * 1e-3) - X[:, OP_FEATURE_SCHEMA.index(ROOFLINE_COLUMN)]
        X, target, sample_weight = self._with_unknown_cache(X, target, sample_weight)
        if client is None:
            import lightgbm

            model = lightgbm.LGBMRegressor(n_jobs=self.n_jobs, random_state=self.random_state, verbose=-1,
                                           **self.lgbm_params)
            model.fit(X, target, sample_weight=sample_weight, feature_name=_lgbm_names())
            self.booster_ = model.booster_
            self.trained_with_, self.dask_workers_ = "local", 0
        else:
            self.booster_, self.dask_workers_ = self._fit_dask(client, X, target, sample_weight)
            self.trained_with_ = "dask"
        self.n_features_in_ = X.shape[1]
        self.schema_version_ = OP_FEATURE_SCHEMA.version
        self.coverage_ = None
        self.coverage_devices_ = None
        self.device_offsets_ = {}
        return self

    def _with_unknown_cache(self, X, target, sample_weight) -> tuple:
        """``X``, ``target`` and ``sample_weight`` with ``unknown_cache_share`` of the rows whose L2 size is
        known appended again with it unknown (the same seeded draw on every path, local or Dask)."""
        import numpy as np

        col = OP_FEATURE_SCHEMA.index(CACHE_COLUMN)
        if self.unknown_cache_share <= 0 or CACHE_COLUMN in self.exclude_features:
            return X, target, sample_weight
        known = np.flatnonzero(np.isfinite(X[:, col]))
        k = int(round(self.unknown_cache_share * len(known)))
        if k == 0:
            return X, target, sample_weight
        pick = np.sort(np.random.default_rng(self.random_state).choice(known, k, replace=False))
        extra = X[pick].copy()
        extra[:, col] = np.nan
        if "l2_cache_MiB" not in self.exclude_features:  # the raw size too, as the features of such a device have it
            extra[:, OP_FEATURE_SCHEMA.index("l2_cache_MiB")] = np.nan
        weights = None if sample_weight is None else np.concatenate([sample_weight, sample_weight[pick]])
        return np.concatenate([X, extra]), np.concatenate([target, target[pick]]), weights

    def _fit_dask(self, client, X, target, sample_weight) -> tuple:
        """Train on ``client``'s workers; return (local booster, number of workers that held data)."""
        import numpy as np

        if not all(hasattr(client, a) for a in ("nthreads", "scatter", "scheduler")):
            raise InputError(f"client: expected a dask.distributed.Client, got {type(client).__name__}")
        address = getattr(getattr(client, "scheduler", None), "address", None) or repr(client)
        if getattr(client, "status", "running") != "running":
            raise LearnedPerfError(f"dask cluster {address}: the client is {client.status}, not running")
        try:
            workers = sorted(client.nthreads())
        except Exception as exc:  # the scheduler is gone: report it as the cluster's failure
            raise LearnedPerfError(f"dask cluster {address}: cannot list workers ({type(exc).__name__}: {exc})") from exc
        if not workers:
            raise LearnedPerfError(f"dask cluster {address}: no workers; start workers or train locally (client=None)")
        n = X.shape[0]
        if n < len(workers):
            raise InputError(f"op records: {n} rows cannot be split over {len(workers)} dask workers")
        import dask
        import dask.array as da
        from lightgbm.dask import DaskLGBMRegressor

        # Shuffled, so that each worker's part looks like the whole: LightGBM's data-parallel learner
        # builds each feature's bins from one worker's rows.
        order = np.random.default_rng(self.random_state).permutation(n)
        parts = np.array_split(order, len(workers))
        try:
            xs, ys, ws = [], [], []
            for worker, idx in zip(workers, parts):
                # One partition pinned to each worker: lightgbm.dask trains on the workers that hold data.
                for arrays, chunk in ((xs, X[idx]), (ys, target[idx]), (ws, None if sample_weight is None
                                                                        else sample_weight[idx])):
                    if chunk is None:
                        continue
                    fut = client.scatter(chunk, workers=[worker])
                    arrays.append(da.from_delayed(dask.delayed(fut), shape=chunk.shape, dtype=chunk.dtype))
            model = DaskLGBMRegressor(client=client, random_state=self.random_state, verbose=-1,
                                      **self.lgbm_params)
            with warnings.catch_warnings():
                # lightgbm.dask always sets threads from each worker's nthreads and warns that the
                # wrapper's own n_jobs default is ignored; that is the documented behaviour here
                warnings.filterwarnings("ignore", message="Parameter n_jobs will be ignored", category=UserWarning)
                model.fit(da.concatenate(xs), da.concatenate(ys),
                          sample_weight=da.concatenate(ws) if ws else None, feature_name=_lgbm_names())
            booster = model.to_local().booster_
        except Exception as exc:  # worker death, LightGBM network errors, ...: name the cluster and the cause
            raise LearnedPerfError(f"dask cluster {address}: LightGBM training failed "
                                   f"({type(exc).__name__}: {exc})") from exc
        return booster, len(workers)

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
    def fit_records(self, records, sample_weight=None, client=None) -> "OpTimeRegressor":
        """Fit on an ``OP_COLUMNS`` DataFrame of measured operator records; return self.

        ``client``: a ``dask.distributed.Client`` to train on its workers (see :meth:`fit`).
        """
        import numpy as np

        X = op_features(records)
        self.fit(X, records["time_ms"].to_numpy(), sample_weight=sample_weight, client=client)
        self.coverage_ = op_coverage(records)
        self.coverage_devices_ = op_coverage_devices(records)
        if self.device_offsets:
            # residuals of the trees alone (fit leaves device_offsets_ empty, so predict applies none)
            resid = np.log(records["time_ms"].to_numpy(dtype=np.float64) / self.predict(X))
            self.device_offsets_ = fit_device_offsets(records["device_name"].astype(str).to_numpy(),
                                                      records["kind"].astype(str).to_numpy(),
                                                      records["dtype"].astype(str).to_numpy(), resid,
                                                      self.device_offset_prior_rows)
        return self

    def covers(self, device_name: str, op: Op) -> bool:
        """Whether the trees may cost ``op`` on ``device_name``: training records of its kind and dtype exist on
        that device itself, or on at least ``min_coverage_devices`` devices of its class
        (:func:`~learnedperf.models.dataset.device_class`). Always True without ``coverage_``; any record
        covers without ``coverage_devices_`` (a model saved before they were recorded)."""
        cov = getattr(self, "coverage_", None)
        if cov is None:
            return True
        key = (device_class(device_name), op.kind, op.dtype)
        if key not in cov:
            return False
        devices = getattr(self, "coverage_devices_", None)
        if devices is None:
            return True
        names = devices.get(key, ())
        return device_name in names or len(names) >= self.min_coverage_devices

    def predict_records(self, records) -> "Any":
        """Predicted ``time_ms`` of each row of an ``OP_COLUMNS`` DataFrame (with the offset of each row's
        ``device_name``, where it has one)."""
        import numpy as np

        t = self.predict(op_features(records))
        if self.device_offsets_ and len(t):
            t = t * np.exp([self._offset(n, k, d) for n, k, d in zip(
                records["device_name"].astype(str), records["kind"].astype(str), records["dtype"].astype(str))])
        return t

    def predict_ops(self, ops: Iterable[Op], device: Any) -> "Any":
        """Predicted milliseconds of graph ops on ``device`` (dict, JSON text or DeviceSpec), with the
        offsets of the device's name where it has them, and never under the op's roofline bound.

        The bound (FLOPs at the data sheet's peak of the op's dtype, or bytes at its bandwidth) is what
        no kernel beats: the trees extrapolate flat outside their data, and on a device faster than any
        they learnt from (fp32 on a B200) predicted GEMMs above the peak, and iterations with an MFU
        over 1. :meth:`predict_records` does not bound: a measured record can sit under the bound of
        its stated dtype (NeuSight's "fp32" convolutions on the A100 ran in TF32, cuDNN's default).
        """
        import numpy as np

        ops = list(ops)
        X = op_features_from_ops(ops, device)
        t = self.predict(X)
        name = str(device_descriptor(device).get("name", ""))
        if len(t) and name in self.device_offsets_:
            t = t * np.exp([self._offset(name, op.kind, op.dtype) for op in ops])
        if len(t):
            t = np.maximum(t, np.exp(X[:, OP_FEATURE_SCHEMA.index(ROOFLINE_COLUMN)].astype(np.float64)) * 1e3)
        return t

    def _offset(self, name: str, kind: str, dtype: str) -> float:
        """The log offset of ``kind`` in ``dtype`` on the device called ``name`` (0 where none was learnt)."""
        per = self.device_offsets_.get(name)
        if not per:
            return 0.0
        return per.get(f"{kind}/{dtype}", per.get(f"*/{dtype}", 0.0))

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
                "feature_schema": OP_FEATURE_SCHEMA.to_sidecar(),
                "params": self.get_params(), "model_file": MODEL_FILE,
                "model_sha256": sha256_file(model_path),
                "training": {"trained_with": getattr(self, "trained_with_", "unknown"),
                             "dask_workers": getattr(self, "dask_workers_", 0)}}
        cov = getattr(self, "coverage_", None)
        if cov is not None:
            meta["coverage"] = [[*key, n] for key, n in sorted(cov.items())]
        devices = getattr(self, "coverage_devices_", None)
        if devices is not None:
            meta["coverage_devices"] = [[*key, list(names)] for key, names in sorted(devices.items())]
        meta["device_offsets"] = self.device_offsets_
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
        directory = Path(directory)
        meta_path, model_path = directory / META_FILE, directory / MODEL_FILE
        meta = load_json_file(meta_path)
        OP_FEATURE_SCHEMA.check_sidecar(meta.get("feature_schema") if isinstance(meta, dict) else None, meta_path)
        booster = load_booster(model_path, meta.get("model_sha256"), OP_FEATURE_SCHEMA, META_FILE)
        params = dict(meta.get("params") or {})
        training = meta.get("training")
        if training is None:
            # sidecars written before training was recorded: how is unknown, and is said so
            training = {"trained_with": "unknown", "dask_workers": 0}
        if not isinstance(training, dict) or training.get("trained_with") not in ("local", "dask", "unknown"):
            raise InputError(f"{meta_path}: 'training.trained_with' must be 'local', 'dask' or 'unknown', "
                             f"got {training!r}")
        workers = training.get("dask_workers", 0)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise InputError(f"{meta_path}: 'training.dask_workers' must be an integer >= 0, got {workers!r}")
        self = cls(**params)
        self.coverage_ = _read_coverage(meta.get("coverage"), meta_path)
        self.coverage_devices_ = _read_coverage_devices(meta.get("coverage_devices"), meta_path)
        self.device_offsets_ = _read_offsets(meta.get("device_offsets"), meta_path)
        self.booster_ = booster
        self.trained_with_ = training["trained_with"]
        self.dask_workers_ = workers
        self.n_features_in_ = booster.num_feature()
        self.schema_version_ = OP_FEATURE_SCHEMA.version  # checked equal to the sidecar's above
        return self


def op_coverage(records: Any) -> dict[tuple[str, str, str], int]:
    """Records per ``(device class, kind, dtype)`` of an ``OP_COLUMNS`` DataFrame: what a regressor
    fitted on them has seen."""
    from collections import Counter

    classes = [device_class(n) for n in records["device_name"].astype(str)]
    return dict(Counter(zip(classes, records["kind"].astype(str), records["dtype"].astype(str))))


def op_coverage_devices(records: Any) -> dict[tuple[str, str, str], tuple[str, ...]]:
    """The sorted device names with records of each ``(device class, kind, dtype)`` of an ``OP_COLUMNS``
    DataFrame."""
    out: dict[tuple[str, str, str], set] = {}
    for name, kind, dtype in set(zip(records["device_name"].astype(str), records["kind"].astype(str),
                                     records["dtype"].astype(str))):
        out.setdefault((device_class(name), kind, dtype), set()).add(name)
    return {key: tuple(sorted(names)) for key, names in sorted(out.items())}


def _read_coverage_devices(data: Any, where: Path) -> dict | None:
    """A sidecar's ``coverage_devices`` list back as a dict (None when absent); a malformed one raises InputError."""
    if data is None:
        return None
    ok = isinstance(data, list) and all(
        isinstance(e, list) and len(e) == 4 and all(isinstance(s, str) for s in e[:3])
        and isinstance(e[3], list) and e[3] and all(isinstance(n, str) and n for n in e[3]) for e in data)
    if not ok:
        raise InputError(f"{where}: 'coverage_devices' must be a list of [device class, kind, dtype, "
                         "[device names]]")
    return {(e[0], e[1], e[2]): tuple(e[3]) for e in data}


def _read_coverage(data: Any, where: Path) -> dict | None:
    """A sidecar's ``coverage`` list back as a dict (None when absent); a malformed one raises InputError."""
    if data is None:
        return None
    ok = isinstance(data, list) and all(
        isinstance(e, list) and len(e) == 4 and all(isinstance(s, str) for s in e[:3])
        and isinstance(e[3], int) and not isinstance(e[3], bool) and e[3] > 0 for e in data)
    if not ok:
        raise InputError(f"{where}: 'coverage' must be a list of [device class, kind, dtype, records > 0]")
    return {(e[0], e[1], e[2]): e[3] for e in data}


def fit_device_offsets(names: Any, kinds: Any, dtypes: Any, log_resid: Any, prior_rows: float) -> dict:
    """Per-device log offsets from the log residuals (measured / predicted) of training records.

    For each device and dtype, ``"*/dtype"`` is ``median(r) · n / (n + prior_rows)`` over its ``n`` records;
    for each kind, ``"kind/dtype"`` is that plus ``(median(r_kind) − it) · n_k / (n_k + prior_rows)``: a
    kind with few records stays near its dtype's offset, a dtype with few records near 0.

    Returns:
        ``{device name: {"kind/dtype" or "*/dtype": log offset}}`` (rounded to 1e-6, and clipped to
        ±:data:`MAX_DEVICE_OFFSET`, the most a sidecar may carry).
    """
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"name": names, "kind": kinds, "dtype": dtypes, "r": np.asarray(log_resid, dtype=np.float64)})
    df = df[np.isfinite(df["r"])]

    def stored(value: float) -> float:
        return round(max(-MAX_DEVICE_OFFSET, min(MAX_DEVICE_OFFSET, value)), 6)

    out: dict[str, dict[str, float]] = {}
    for (name, dtype), g in df.groupby(["name", "dtype"], sort=True):
        base = float(np.median(g["r"])) * len(g) / (len(g) + prior_rows)
        per = out.setdefault(str(name), {})
        per[f"*/{dtype}"] = stored(base)
        for kind, gk in g.groupby("kind", sort=True):
            weight = len(gk) / (len(gk) + prior_rows)
            per[f"{kind}/{dtype}"] = stored(base + (float(np.median(gk["r"])) - base) * weight)
    return out


def _read_offsets(data: Any, where: Path) -> dict:
    """A sidecar's ``device_offsets`` (``{}`` when absent); a malformed one raises InputError."""
    if data is None:
        return {}
    ok = isinstance(data, dict) and all(
        isinstance(name, str) and isinstance(per, dict) and all(
            isinstance(key, str) and key.count("/") == 1 and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and abs(v) <= MAX_DEVICE_OFFSET for key, v in per.items())
        for name, per in data.items())
    if not ok:
        raise InputError(f"{where}: 'device_offsets' must map device names to {{'kind/dtype': log offset}} "
                         f"with finite offsets of at most {MAX_DEVICE_OFFSET} in magnitude")
    return {name: {k: float(v) for k, v in per.items()} for name, per in data.items()}


#: ``datasets/measured`` of the repository this package sits in (learnedperf/../datasets/measured).
MEASURED_DIR = Path(__file__).resolve().parents[2] / "datasets" / "measured"


def _held_out_of_operator_training(manifest: dict, path: Path) -> str | None:
    """The reason a measured data set's manifest gives for keeping its operator records out of the
    regressor's training (``"operator_training": {"use": false, "why": ...}``), or None to use them.

    A data set's steps stay in the learned models' training either way: the key says only that its
    isolated operator timings describe something other than the device (the lent GPUs' VM hosts)."""
    entry = manifest.get("operator_training")
    if entry is None:
        return None
    if (not isinstance(entry, dict) or not isinstance(entry.get("use"), bool)
            or not isinstance(entry.get("why"), str) or not entry["why"].strip()):
        raise InputError(f"{path}: 'operator_training' must be {{\"use\": true or false, \"why\": a reason}}, "
                         f"got {entry!r}")
    return None if entry["use"] else entry["why"].strip()


def _provenance(directory: Path) -> str:
    """``directory`` relative to the repository root when inside it (``'datasets/measured/vm-xeon-2c'``)."""
    root = MEASURED_DIR.parents[1]
    try:
        return directory.resolve().relative_to(root).as_posix()
    except ValueError:
        return str(directory)


def load_booster(path: Path, sha256: Any, schema: FeatureSchema, sidecar: str) -> Any:
    """The LightGBM text model at ``path``, verified: present, with the ``sha256`` its ``sidecar``
    records, readable, and taking ``schema``'s features. Raises :class:`InputError` naming the file."""
    import lightgbm

    if not path.is_file():
        raise InputError(f"{path}: missing")
    if sha256_file(path) != sha256:
        raise InputError(f"{path}: sha256 differs from {sidecar} (file changed or truncated)")
    try:
        booster = lightgbm.Booster(model_file=str(path))
    except lightgbm.basic.LightGBMError as exc:
        raise InputError(f"{path}: not a LightGBM model ({exc})") from None
    if booster.num_feature() != len(schema.features):
        raise InputError(f"{path}: model has {booster.num_feature()} features, schema has {len(schema.features)}")
    return booster


def load_op_training_data(measured_dirs: Iterable[str | Path] | None = None, neusight: bool = True,
                          neusight_graphs: bool = False, rows_per_device: int | None = None,
                          seed: int = 0) -> "Any":
    """The operator records the default :class:`OpTimeRegressor` is trained on (a pandas DataFrame).

    Sources, concatenated in this order:

    * every ``ops_*.parquet`` of each directory of ``measured_dirs`` (default: every directory
      under :data:`MEASURED_DIR`, this repository's ``datasets/measured/*/``). A directory's
      ``manifest.json``, when it has one, is checked first (sha256 of every listed file).
      Collective records (``kind`` in ``COMM_KINDS``, e.g. the whole of ``ops_*_collectives.parquet``)
      are left out: the collective model costs them, the regressor has no kind for them;
    * ``neusight``: NeuSight's single-kernel latencies (:func:`~learnedperf.measure.public.load_neusight_ops`);
    * ``neusight_graphs``: the nodes of NeuSight's whole-model *training* graphs
      (:func:`~learnedperf.measure.public.neusight_graph_ops`).

    Records without a positive, finite ``time_ms`` cannot be learned from and are left out.
    Everything left out is counted in ``df.attrs["skipped"]`` (reason → rows or nodes).

    Args:
        measured_dirs: directories of measured operator records (``None``: the repository's).
        neusight: add NeuSight's kernel latencies (needs ``shared/data``).
        neusight_graphs: add the operator records of NeuSight's training graphs (needs ``shared/data``).
        rows_per_device: keep at most this many rows of each (provenance, device) pair, drawn
            without replacement with ``seed`` (the same arguments give the same rows); ``None``: all.
        seed: seed of that draw.

    Returns:
        ``OP_COLUMNS`` (:mod:`learnedperf.measure.records`) plus ``provenance``: where the row comes
        from (``'datasets/measured/vm-xeon-2c'``, ``'neusight'``, ``'neusight_graphs'``); the device
        is in ``device_name`` and ``device`` (its descriptor).

    Raises:
        InputError: a directory is missing, a file is unreadable or corrupt, a manifest's sha256
            differs, a file lacks a column or has an unknown op kind (the message names the file),
            or the shared data a NeuSight source needs is missing.
    """
    import numpy as np
    import pandas as pd

    from ..features.ops import KINDS
    from ..graph.ops import COMM_KINDS
    from ..measure import public
    from ..measure.records import OP_COLUMNS, parquet_rows, verify_manifest

    if rows_per_device is not None and (isinstance(rows_per_device, bool)
                                        or not isinstance(rows_per_device, numbers.Integral) or rows_per_device <= 0):
        raise InputError(f"rows_per_device: expected a positive integer or None, got {rows_per_device!r}")
    if measured_dirs is None:
        if not MEASURED_DIR.is_dir():
            raise InputError(f"{MEASURED_DIR}: no such directory (pass measured_dirs=)")
        measured_dirs = sorted(p for p in MEASURED_DIR.iterdir() if p.is_dir())
    frames, skipped = [], {}
    for d in map(Path, measured_dirs):
        if not d.is_dir():
            raise InputError(f"{d}: no such directory of measured records")
        held_out = None
        if (d / "manifest.json").is_file():
            held_out = _held_out_of_operator_training(verify_manifest(d), d / "manifest.json")
        prov = _provenance(d)
        for f in sorted(d.glob("ops_*.parquet")):
            if held_out is not None:
                skipped[f"{prov}/{f.name}: held out of operator training by its manifest ({held_out})"] = \
                    parquet_rows(f)
                continue
            try:
                df = pd.read_parquet(f)
            except Exception as exc:  # pyarrow: truncated or corrupt file, not Parquet at all
                raise InputError(f"{f}: cannot read operator records ({type(exc).__name__}: {exc})") from None
            missing = [c for c in OP_COLUMNS if c not in df.columns]
            if missing:
                raise InputError(f"{f}: missing column(s) {missing}")
            comm = df["kind"].isin(COMM_KINDS).to_numpy()
            unknown = sorted(set(df.loc[~comm, "kind"].astype(str)) - set(KINDS))
            if unknown:
                raise InputError(f"{f}: unknown op kind(s) {unknown}")
            if comm.any():
                key = f"{prov}/{f.name}: collective records (costed by the collective model)"
                skipped[key] = int(comm.sum())
            frames.append(df.loc[~comm, list(OP_COLUMNS)].assign(provenance=prov))
    if neusight:
        frames.append(public.load_neusight_ops().assign(provenance="neusight"))
    if neusight_graphs:
        ops, unmapped = public.neusight_graph_ops(public.load_neusight_graph_nodes())
        frames.append(ops[list(OP_COLUMNS)].assign(provenance="neusight_graphs"))
        for reason, n in unmapped.groupby("reason")["nodes"].sum().items():
            skipped[f"neusight_graphs: {reason}"] = int(n)
    if not frames:
        raise InputError("op training data: no source gave records (no ops_*.parquet in "
                         f"{[str(d) for d in measured_dirs]} and neusight sources off)")
    df = pd.concat(frames, ignore_index=True)
    t = pd.to_numeric(df["time_ms"], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~(np.isfinite(t) & (t > 0))
    for prov, n in pd.Series(df["provenance"][bad]).value_counts().items():
        skipped[f"{prov}: time_ms missing or not positive"] = int(n)
    df = df[~bad].reset_index(drop=True)
    if rows_per_device is not None:
        df, dropped = draw_per_device(df, rows_per_device, seed)
        if dropped:
            skipped[f"rows_per_device={rows_per_device}: not drawn"] = dropped
    df.attrs["skipped"] = skipped
    return df


def draw_per_device(records: Any, rows_per_device: int, seed: int = 0) -> tuple[Any, int]:
    """At most ``rows_per_device`` rows of each (provenance, device) pair of operator records, drawn without
    replacement with ``seed`` (:func:`load_op_training_data`'s ``rows_per_device``), and the number of rows
    not drawn. The same records and arguments give the same rows."""
    import numpy as np

    rng = np.random.default_rng(seed)
    keep, dropped = [], 0
    # groups in sorted order, so the draw depends only on the data and the seed
    for _, idx in sorted(records.groupby(["provenance", "device_name"]).indices.items()):
        if len(idx) > rows_per_device:
            dropped += len(idx) - rows_per_device
            idx = rng.choice(idx, rows_per_device, replace=False)
        keep.append(idx)
    return records.iloc[np.sort(np.concatenate(keep))].reset_index(drop=True), dropped


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
        # the host issues learned kernels as it does the roofline's
        self.host_dispatch_s = self.comm.host_dispatch_s
        self.chained_dispatch_s = self.comm.chained_dispatch_s
        self.pipeline_send_s = self.comm.pipeline_send_s
        self._device = hardware.device.to_dict()
        self._cache: dict[Op, float] = {}
        #: distinct compute ops costed by the regressor / by ``comm`` (outside the regressor's coverage)
        self.costed = {"learned": 0, "roofline": 0}

    def prefetch(self, ops: Iterable[Op]) -> None:
        """Predict and memoise the compute ops of ``ops`` not yet seen, in one batch; ops the device's
        measured curves cost (:meth:`RooflineCost.has_curve`) and ops outside the regressor's coverage
        (:meth:`OpTimeRegressor.covers`) get ``comm``'s (the roofline's) time."""
        todo = list({op: None for op in ops if not op.is_comm and op not in self._cache})
        name = self.hw.device.name
        # the device's own measured kernel curves come first: they are timings of this device, where the
        # regressor generalises over others (on the held-out evaluation it lost to them on CPU steps)
        curves = self.comm.has_curve if isinstance(self.comm, RooflineCost) else (lambda op: False)
        learned = [op for op in todo if self.regressor.covers(name, op) and not curves(op)]
        if learned:
            times_ms = self.regressor.predict_ops(learned, self._device)
            for op, t in zip(learned, times_ms):
                self._cache[op] = float(t) * 1e-3
        for op in todo:
            if op not in self._cache:
                self._cache[op] = self.comm.compute_time_s(op)
        self.costed["learned"] += len(learned)
        self.costed["roofline"] += len(todo) - len(learned)

    def prefetch_run(self, run: Any) -> "LearnedOpCost":
        """Predict every compute op of ``run``'s execution graph in one batch; return self.

        The simulator asks for op costs one at a time, and one LightGBM call per op costs about a
        millisecond: batching a run's ops first makes a learned-cost simulation as fast as a roofline
        one. Ops compare by value, so the shortened schedule's ops are the simulated ones.
        """
        from ..graph.execution import compile_run
        from ..simulate.memory import memory_microbatches

        return self.prefetch_graph(compile_run(run, memory_microbatches(run)))

    def prefetch_graph(self, eg: Any) -> "LearnedOpCost":
        """:meth:`prefetch_run` for an already compiled execution graph ``eg``; return self."""
        self.prefetch(op for st in eg.stages for ch in st.chunks for ops, _rep in ch.forward + ch.backward
                      for op in ops)
        return self

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
