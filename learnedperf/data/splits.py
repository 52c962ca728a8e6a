"""Named held-out splits of a data set.

Each split decides test membership from a record's own columns (a deterministic
function of the run), so the same run is on the same side in every data set and
every version, and a split can be recomputed from the Parquet alone with
:func:`split_mask`. The manifest stores each split's rule and its train/test counts.

========================  ==========================================================================
``unseen_family``         test: model family ``llama`` (GQA, SwiGLU, RMSNorm, RoPE) — trained on gpt/bert/moe
``unseen_device``         test: device types H200-SXM-141GB, MI300X, L40S (and synthetic devices derived
                          from them)
``unseen_strategy``       test: interleaved pipeline schedules (virtual stages)
``unseen_sharding``       test: fully sharded states (ZeRO-3 or FSDP FULL_SHARD)
``unseen_scale``          test: more than 2,048 devices — every test run has more devices than any
                          training run
``random``                test: 10 % of configurations by hash of ``config_id`` (in-distribution baseline)
========================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InputError
from ..specs.strategy import INTERLEAVED_SCHEDULES

HOLDOUT_FAMILY = "llama"
HOLDOUT_DEVICES = ("H200-SXM-141GB", "MI300X", "L40S")
SCALE_THRESHOLD = 2048
RANDOM_TEST_PERCENT = 10


@dataclass(frozen=True)
class Split:
    """A named split: its rule in words and as data, and the columns its test mask reads."""

    name: str
    rule: str
    test_if: dict
    columns: tuple[str, ...]
    mask: Callable[[Any], Any]

    def describe(self) -> dict:
        """JSON-compatible description (for the manifest)."""
        return {"rule": self.rule, "test_if": self.test_if, "columns": list(self.columns)}


def _hash_bucket(values: Any) -> Any:
    return values.map(lambda cid: int(str(cid)[:8], 16) % 100)


SPLITS: dict[str, Split] = {s.name: s for s in (
    Split("unseen_family", f"test = model family {HOLDOUT_FAMILY!r}; train = every other family",
          {"column": "arch", "op": "==", "value": HOLDOUT_FAMILY}, ("arch",),
          lambda df: df["arch"] == HOLDOUT_FAMILY),
    Split("unseen_device", f"test = device type in {list(HOLDOUT_DEVICES)} (synthetic devices derived from them "
                           "included); train = every other device",
          {"column": "device_type", "op": "in", "value": list(HOLDOUT_DEVICES)}, ("device_type",),
          lambda df: df["device_type"].isin(HOLDOUT_DEVICES)),
    Split("unseen_strategy", "test = interleaved pipeline schedules (virtual pipeline stages in Megatron's "
                             "placement, with or without zero bubble); train = the other schedules / no pipeline",
          {"column": "pipeline_schedule", "op": "in", "value": list(INTERLEAVED_SCHEDULES)},
          ("pipeline_schedule", "pp"),
          lambda df: df["pipeline_schedule"].isin(INTERLEAVED_SCHEDULES) & (df["pp"] > 1)),
    Split("unseen_sharding", "test = fully sharded states (ZeRO stage 3 or FSDP FULL_SHARD); "
                             "train = ZeRO 0-2 and FSDP SHARD_GRAD_OP",
          {"column": "effective_zero_stage", "op": "==", "value": 3}, ("effective_zero_stage",),
          lambda df: df["effective_zero_stage"] == 3),
    Split("unseen_scale", f"test = num_devices > {SCALE_THRESHOLD}: every test run has more devices than any "
                          "training run",
          {"column": "num_devices", "op": ">", "value": SCALE_THRESHOLD}, ("num_devices",),
          lambda df: df["num_devices"] > SCALE_THRESHOLD),
    Split("random", f"test = {RANDOM_TEST_PERCENT} % of configurations: int(config_id[:8], 16) % 100 < "
                    f"{RANDOM_TEST_PERCENT} (identical configurations stay on one side)",
          {"column": "config_id", "op": "hash%100<", "value": RANDOM_TEST_PERCENT}, ("config_id",),
          lambda df: _hash_bucket(df["config_id"]) < RANDOM_TEST_PERCENT),
)}


def split_mask(df: Any, name: str) -> Any:
    """Boolean :class:`pandas.Series` over the records of ``df``: True = test, False = train.

    Raises:
        InputError: unknown split name, or ``df`` lacks a column the split reads.
    """
    split = SPLITS.get(name)
    if split is None:
        raise InputError(f"unknown split {name!r}; known: {', '.join(SPLITS)}")
    missing = [c for c in split.columns if c not in df.columns]
    if missing:
        raise InputError(f"split {name!r} needs column(s) {missing}")
    return split.mask(df).astype(bool)


def split_summary(df: Any) -> dict:
    """Every split's rule and train/test counts (overall and per source) over the records ``df``."""
    out = {}
    for name, split in SPLITS.items():
        test = split_mask(df, name)
        entry = split.describe()
        entry["counts"] = {"train": int((~test).sum()), "test": int(test.sum())}
        if "source" in df.columns:
            by_source = {}
            for src in sorted(df["source"].unique()):
                t = test[df["source"] == src]
                by_source[str(src)] = {"train": int((~t).sum()), "test": int(t.sum())}
            entry["counts_by_source"] = by_source
        if name == "unseen_scale" and len(df):
            n = df["num_devices"]
            entry["max_train_num_devices"] = int(n[~test].max()) if (~test).any() else None
            entry["min_test_num_devices"] = int(n[test].min()) if test.any() else None
        out[name] = entry
    return out


__all__ = ["HOLDOUT_DEVICES", "HOLDOUT_FAMILY", "RANDOM_TEST_PERCENT", "SCALE_THRESHOLD", "SPLITS", "Split",
           "split_mask", "split_summary"]
