"""Amend measured step records whose bf16 steps ran under torch.autocast but do not say so.

``learnedperf measure`` runs bf16 steps as the fp32 model under ``torch.autocast`` (see
:mod:`learnedperf.measure.steps`); records written before the run format had
``strategy.mixed_precision`` describe them as plain ``"precision": "bf16"``, which the simulator
reads as Megatron-style bf16 weights with fp32 master copies. This script adds
``"mixed_precision": "autocast"`` to the ``run`` of every bf16 step record (and recomputes its
``run_id``, the hash of the run), leaves every measured value as it is, rewrites the parquet file
and updates the manifest's checksums, recording the amendment (date, command, rows changed) under
``amendments``. Running it again changes nothing.

Usage: ``python experiments/amend_autocast_records.py datasets/measured/vm-xeon-2c``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def amend(directory: Path) -> int:
    """Amend ``steps*.parquet`` of ``directory``; returns the number of rows changed."""
    import pandas as pd

    from learnedperf.measure.records import (STEP_COLUMNS, canonical_json, now_utc, run_id, sha256_file,
                                            verify_manifest, write_parquet)

    manifest = verify_manifest(directory)
    changed = 0
    for path in sorted(directory.glob("steps*.parquet")):
        frame = pd.read_parquet(path)
        runs, ids, n = [], [], 0
        for text, rid in zip(frame["run"], frame["run_id"]):
            run = json.loads(text)
            s = run.get("strategy", {})
            if s.get("precision") == "bf16" and "mixed_precision" not in s:
                s["mixed_precision"] = "autocast"
                text, rid, n = canonical_json(run), run_id(run), n + 1
            runs.append(text)
            ids.append(rid)
        if not n:
            continue
        frame["run"], frame["run_id"] = runs, ids
        write_parquet(frame.to_dict("records"), path, STEP_COLUMNS, "step")
        manifest["files"][path.name] = {"rows": int(len(frame)), "sha256": sha256_file(path)}
        manifest.setdefault("amendments", []).append({
            "date": now_utc(), "file": path.name, "rows_changed": n,
            "command": f"python experiments/amend_autocast_records.py {directory.as_posix()}",
            "what": "bf16 steps ran under torch.autocast: added strategy.mixed_precision = 'autocast' to "
                    "their run and recomputed run_id; measured values unchanged"})
        changed += n
        print(f"{path}: {n} bf16 step records marked autocast")
    if changed:
        (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n",
                                                 encoding="utf-8")
        verify_manifest(directory)
    return changed


def main(argv: list[str]) -> int:
    """Amend every directory named on the command line."""
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for d in argv:
        n = amend(Path(d))
        print(f"{d}: {n} rows changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
