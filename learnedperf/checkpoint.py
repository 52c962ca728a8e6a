"""Self-describing checkpoints: the learned iteration-time model as files anyone can audit.

A checkpoint is a directory::

    manifest.json                 format, versions, method, feature schemas, normalisation,
                                  interval calibration, training data, metrics, sha256 of every file
    op_regressor/op_time_model.txt  LightGBM text model (methods on learned operator costs)
    op_regressor/op_time_model.json its sidecar (feature schema, sha256)
    gnn/gnn.safetensors           the GNN's state_dict, one per ensemble member (safetensors: tensors only)
    gnn/gnn.json                  its hyperparameters and normalisation
    surrogate/*.txt               the fast tier's LightGBM models (time, breakdown shares)
    surrogate/surrogate.json      their sidecar: run feature schema, fidelity, sha256
    shapes.json                   the shape memory of a ``+shapes`` method (median residual per layer-shape key)

:func:`load_checkpoint` refuses, with one :class:`~learnedperf.errors.InputError` naming
the file and the problem, a checkpoint that is missing a file, whose file's sha256
differs from the manifest (tampered or truncated), that an older or newer format wrote,
or whose feature schema, simulator or cost model differ from this code's (its
predictions would silently mean something else: retrain with ``learnedperf train``). The simulator
is compared by what it answers (:func:`~learnedperf.simulate.fingerprint.simulator_fingerprint`),
not only by its version number.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .errors import InputError
from .io import load_json_file, load_json_object

FORMAT = "learnedperf-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
OP_DIR = "op_regressor"
GNN_DIR = "gnn"
SURROGATE_DIR = "surrogate"
SHAPES_FILE = "shapes.json"


def default_checkpoint_dir() -> Path:
    """``checkpoints/default`` of the repository the package is installed from."""
    return Path(__file__).resolve().parents[1] / "checkpoints" / "default"


def library_versions() -> dict:
    """Versions of the package and of the libraries a checkpoint depends on (from package metadata:
    nothing is imported)."""
    from importlib import metadata

    from . import __version__

    out = {"learnedperf": __version__, "python": platform.python_version()}
    for dist in ("numpy", "pandas", "lightgbm", "torch", "torch-geometric", "safetensors", "scikit-learn"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _compat() -> dict:
    """What a checkpoint must agree on with this code."""
    from .data.records import cost_model_version
    from .features.graph import GRAPH_FEATURE_SCHEMA_VERSION
    from .features.ops import OP_FEATURE_SCHEMA
    from .simulate import SIMULATOR_VERSION
    from .simulate.fingerprint import simulator_fingerprint

    # the fingerprint is what the simulator answers (simulate/fingerprint.py): the version number alone
    # stayed the same through changes that moved the times a residual GNN corrects
    return {"op_feature_schema_version": OP_FEATURE_SCHEMA.version,
            "graph_feature_schema_version": GRAPH_FEATURE_SCHEMA_VERSION,
            "simulator_version": SIMULATOR_VERSION, "simulator_fingerprint": simulator_fingerprint(),
            "cost_model_version": cost_model_version("roofline")}


def _file_names(directory: Path) -> list[str]:
    """Every file of a checkpoint but its manifest, relative, sorted."""
    return sorted(f.relative_to(directory).as_posix() for f in directory.rglob("*")
                  if f.is_file() and f.name != MANIFEST)


def _files(directory: Path) -> dict:
    from .measure.records import sha256_file

    return {name: {"sha256": sha256_file(directory / name), "bytes": (directory / name).stat().st_size}
            for name in _file_names(directory)}


def save_checkpoint(directory: str | Path, model: Any, training_data: dict, metrics: Optional[dict] = None,
                    notes: Optional[list[str]] = None) -> Path:
    """Write a fitted :class:`~learnedperf.models.iteration.IterationModel` as a checkpoint.

    Args:
        directory: created if missing; an older checkpoint there is replaced; any other non-empty
            directory is refused.
        model: the fitted model (its op regressor and GNN are written when the method uses them).
        training_data: description of the data it was trained on (data set manifest hash, counts).
        metrics: evaluation figures to record (e.g. the held-out report's tables).
        notes: free-text lines for readers.

    Returns:
        the manifest path.
    """
    from .features.graph import graph_feature_schema_dict
    from .features.ops import OP_FEATURE_SCHEMA
    from .models.iteration import GNN_METHODS, needs_ops
    from .models.shapes import SHAPES_SUFFIX

    import shutil

    directory = Path(directory)
    if directory.is_dir() and any(directory.iterdir()) and not (directory / MANIFEST).is_file():
        raise InputError(f"{directory}: not empty and not a checkpoint; refusing to write into it")
    directory.mkdir(parents=True, exist_ok=True)
    # an older checkpoint's parts go first: a component the new method does not use must not stay listed
    for old in (directory / MANIFEST, directory / OP_DIR, directory / GNN_DIR, directory / SURROGATE_DIR,
                directory / SHAPES_FILE):
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
    components: dict[str, Any] = {}
    if needs_ops(model.method):
        model.op_regressor.save(directory / OP_DIR)
        components["op_regressor"] = OP_DIR
    normalisation = None
    if model.method in GNN_METHODS:
        model.gnn_.save(directory / GNN_DIR)
        components["gnn"] = GNN_DIR
        gnn_meta = load_json_file(directory / GNN_DIR / "gnn.json")
        normalisation = gnn_meta.get("normalisation")
    if model.method.endswith(SHAPES_SUFFIX):  # a fitted +shapes model always has its memory
        (directory / SHAPES_FILE).write_text(json.dumps(model.shapes_.to_dict(), indent=0, sort_keys=True) + "\n",
                                             encoding="utf-8")
        components["shapes"] = SHAPES_FILE
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "method": model.method, "components": components,
        "model": {"formula_mfu": getattr(model, "mfu_", None), "gnn_params": model.gnn_params,
                  "calibration_fraction": model.calibration_fraction, "folds": model.folds, "seed": model.seed,
                  "n_train": model.n_train_, "n_train_measured": model.n_train_measured_},
        "versions": library_versions(), "compat": _compat(),
        "feature_schema": {"op": OP_FEATURE_SCHEMA.to_dict(), "graph": graph_feature_schema_dict()},
        "normalisation": normalisation,
        "interval": model.interval_.to_dict(),
        "training_data": training_data, "metrics": metrics or {}, "notes": list(notes or []),
        "files": _files(directory),
    }
    return _write_manifest(directory, manifest)


def _write_manifest(directory: Path, manifest: dict) -> Path:
    path = directory / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def add_surrogate(directory: str | Path, surrogate: Any, fidelity: dict) -> Path:
    """Add (or replace) the fast tier's surrogate of the checkpoint in ``directory``.

    Args:
        surrogate: a fitted :class:`~learnedperf.models.surrogate.SurrogateRegressor`.
        fidelity: its agreement with the full tier on held-out distilled runs; must hold
            ``log_lower`` <= 0 <= ``log_upper`` (conformal quantiles of log(full / surrogate)),
            which widen the fast tier's interval.

    Returns:
        the manifest path (its file list and sha256 updated).
    """
    import math
    import shutil

    from .features.run import RUN_FEATURE_SCHEMA

    directory = Path(directory)
    manifest = load_json_file(directory / MANIFEST)
    lo, hi = fidelity.get("log_lower"), fidelity.get("log_upper")
    if not (isinstance(lo, float) and isinstance(hi, float) and math.isfinite(lo) and math.isfinite(hi)
            and lo <= 0.0 <= hi):
        raise InputError(f"surrogate fidelity needs finite log_lower <= 0 <= log_upper, got {lo!r}, {hi!r}")
    if (directory / SURROGATE_DIR).exists():
        shutil.rmtree(directory / SURROGATE_DIR)
    surrogate.save(directory / SURROGATE_DIR, extra={"fidelity": fidelity})
    manifest["components"]["surrogate"] = SURROGATE_DIR
    manifest["feature_schema"]["run"] = RUN_FEATURE_SCHEMA.to_dict()
    manifest["surrogate_fidelity"] = fidelity
    manifest["files"] = _files(directory)
    return _write_manifest(directory, manifest)


@dataclass
class Checkpoint:
    """A verified checkpoint: its manifest and its loaded parts.

    Attributes:
        path: the directory.
        manifest: the parsed ``manifest.json``.
        method: the :data:`~learnedperf.models.iteration.METHODS` entry it answers with.
        interval: the calibrated :class:`~learnedperf.models.intervals.ConformalInterval`.
        op_regressor: the :class:`~learnedperf.models.gbdt.OpTimeRegressor`, or None.
        gnn: the :class:`~learnedperf.models.gnn.GNNRegressor`, or None.
        formula_mfu: the fitted MFU of the ``formula`` method, or None.
        surrogate: the fast tier's :class:`~learnedperf.models.surrogate.SurrogateRegressor`, or None.
        surrogate_bounds: ``(log_lower, log_upper)`` of log(full / surrogate) on held-out runs.
        surrogate_simulator_bounds: the same of the surrogate's simulator model (log(simulator / its model)), where
            it has one (a memory over the simulator: the fast tier's hits multiply that model's time).
        shapes: the :class:`~learnedperf.models.shapes.ShapeMemory` of a ``+shapes`` method, or None.
    """

    path: Path
    manifest: dict
    method: str
    interval: Any
    op_regressor: Any = None
    gnn: Any = None
    formula_mfu: Optional[float] = None
    surrogate: Any = None
    surrogate_bounds: tuple[float, float] = (0.0, 0.0)
    surrogate_simulator_bounds: Optional[tuple[float, float]] = None
    shapes: Any = None

    @property
    def source(self) -> str:
        """The ``source`` a prediction of this checkpoint reports."""
        return f"checkpoint:{self.path.name}:{self.method}"


def load_checkpoint(path: str | Path | None = None) -> Checkpoint:
    """Load and verify a checkpoint (default: :func:`default_checkpoint_dir`).

    Raises:
        InputError: no manifest; not a checkpoint; an unknown format version; a listed file missing or
            with another sha256; a file not listed; an incompatible feature schema, simulator or cost
            model; a component that does not load. The message names the file and what is wrong.
    """
    from .measure.records import verify_files
    from .models.intervals import ConformalInterval
    from .models.iteration import METHODS, base_method

    path = Path(path) if path is not None else default_checkpoint_dir()
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise InputError(f"{mpath}: no checkpoint manifest (train one with 'learnedperf train')")
    manifest = load_json_object(mpath, "learnedperf checkpoint manifest", FORMAT, FORMAT_VERSION)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise InputError(f"{mpath}: 'files' must map file names to their sha256")
    verify_files(path, files, MANIFEST, what="checkpoint file")
    extra = sorted(set(_file_names(path)) - set(files))
    if extra:
        raise InputError(f"{path / extra[0]}: file not listed in {MANIFEST} (checkpoint altered)")
    compat, ours = manifest.get("compat") or {}, _compat()
    for key, value in ours.items():
        if compat.get(key) != value:
            raise InputError(f"{mpath}: incompatible checkpoint: {key} is {compat.get(key)!r}, this code has "
                             f"{value!r}; retrain it with 'learnedperf train'")
    method = manifest.get("method")
    if method not in METHODS:
        raise InputError(f"{mpath}: unknown method {method!r}")
    interval = ConformalInterval.from_dict(manifest.get("interval"))
    comps = manifest.get("components") or {}
    ckpt = Checkpoint(path, manifest, method, interval,
                      formula_mfu=(manifest.get("model") or {}).get("formula_mfu"))
    mfu = ckpt.formula_mfu
    if base_method(method) == "formula" and not (isinstance(mfu, (int, float)) and mfu > 0):
        raise InputError(f"{mpath}: method 'formula' needs a positive model.formula_mfu")
    if "op_regressor" in comps:
        from .models.gbdt import OpTimeRegressor

        ckpt.op_regressor = OpTimeRegressor.load(path / comps["op_regressor"])
    if "gnn" in comps:
        from .models.gnn import GNNRegressor

        ckpt.gnn = GNNRegressor.load(path / comps["gnn"])
    if "surrogate" in comps:
        from .models.surrogate import SurrogateRegressor

        ckpt.surrogate, meta = SurrogateRegressor.load(path / comps["surrogate"])
        fid = meta.get("fidelity") if isinstance(meta.get("fidelity"), dict) else {}
        lo, hi = fid.get("log_lower"), fid.get("log_upper")
        if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo <= 0.0 <= hi):
            raise InputError(f"{path / comps['surrogate']}: surrogate fidelity bounds missing or invalid")
        ckpt.surrogate_bounds = (float(lo), float(hi))
        sim_fid = fid.get("simulator")
        if sim_fid is not None:
            lo, hi = (sim_fid.get("log_lower"), sim_fid.get("log_upper")) if isinstance(sim_fid, dict) else (None, None)
            if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo <= 0.0 <= hi):
                raise InputError(f"{path / comps['surrogate']}: surrogate simulator fidelity bounds invalid")
            ckpt.surrogate_simulator_bounds = (float(lo), float(hi))
    if "shapes" in comps:
        from .models.shapes import ShapeMemory

        spath = path / comps["shapes"]
        ckpt.shapes = ShapeMemory.from_dict(load_json_file(spath), where=str(spath))
        if ckpt.shapes.over == "simulator" and ckpt.surrogate is not None and (
                ckpt.surrogate.simulator_booster_ is None or ckpt.surrogate_simulator_bounds is None):
            raise InputError(f"{spath}: the memory is over the simulator, but the surrogate has no simulator model "
                             "with its fidelity (retrain with 'learnedperf train')")
    from .models.iteration import GNN_METHODS, needs_ops
    from .models.shapes import SHAPES_SUFFIX

    if method.endswith(SHAPES_SUFFIX) != (ckpt.shapes is not None):
        raise InputError(f"{mpath}: method {method!r} " + ("needs components.shapes" if ckpt.shapes is None
                                                          else "has no shape memory, but components lists one"))
    if needs_ops(method) and ckpt.op_regressor is None:
        raise InputError(f"{mpath}: method {method!r} needs components.op_regressor")
    if method in GNN_METHODS and ckpt.gnn is None:
        raise InputError(f"{mpath}: method {method!r} needs components.gnn")
    return ckpt


__all__ = ["Checkpoint", "FORMAT", "FORMAT_VERSION", "add_surrogate", "default_checkpoint_dir", "library_versions", "load_checkpoint",
           "save_checkpoint"]
