"""Learned models. Heavy libraries (lightgbm, pandas, torch) load only when a model is fitted or loaded.

* :mod:`.gbdt` — per-operator time regressors (LightGBM) and the learned cost model;
* :mod:`.shapes` — the shape memory of the ``+shapes`` methods (the median miss per measured layer shape);
* :mod:`.gnn` — the graph network over execution graphs (PyTorch Geometric); its names
  (``GNNRegressor``, ``IterationGNN``, ``GraphSample``, ``make_sample``) are imported from here on
  first use, so that importing this package does not import torch.
"""

from .gbdt import LearnedOpCost, OpTimeRegressor

_GNN_NAMES = ("GNNRegressor", "GraphSample", "IterationGNN", "make_sample", "sample_from_record")


def __getattr__(name: str):
    if name in _GNN_NAMES:
        from . import gnn

        return getattr(gnn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GNNRegressor", "GraphSample", "IterationGNN", "LearnedOpCost", "OpTimeRegressor", "make_sample",
           "sample_from_record"]
