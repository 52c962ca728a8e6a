"""Data sets of runs: the record schema, the sampler and generator, storage and splits.

* :mod:`.sampler` — seeded, stratified sampling of valid runs (:func:`sample_runs`);
* :mod:`.records` — one record schema for simulated and measured runs (:data:`RECORD_COLUMNS`);
* :mod:`.graphs` — the compact execution graph of each run, stored in Parquet (:func:`load_graph`);
* :mod:`.store` — shards, ``manifest.json``, checksums (:func:`verify`, :func:`load_records`);
* :mod:`.splits` — named held-out splits (:func:`split_mask`);
* :mod:`.generate` — the generator, local or on Dask, resumable (:func:`run_generate`).

Importing this package loads only the standard library; pandas, pyarrow, numpy, tqdm
and dask are imported by the functions that use them.
"""

from .graphs import EDGE_TYPES, NODE_FEATURES, load_graph
from .records import RECORD_COLUMNS, SCHEMA_VERSION
from .sampler import FAMILIES, SAMPLER_VERSION, draw, sample_runs
from .splits import SPLITS, split_mask
from .store import load_records, verify



def __getattr__(name: str):
    # the generator is loaded on first use, so that ``python -m learnedperf.data.generate`` runs a module
    # that importing this package has not already imported
    if name in ("run_generate", "GENERATOR_VERSION"):
        from . import generate

        return getattr(generate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EDGE_TYPES", "FAMILIES", "GENERATOR_VERSION", "NODE_FEATURES", "RECORD_COLUMNS", "SAMPLER_VERSION",
           "SCHEMA_VERSION", "SPLITS", "draw", "load_graph", "load_records", "run_generate", "sample_runs",
           "split_mask", "verify"]
