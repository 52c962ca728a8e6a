"""Amend bf16 step records that ran under torch.autocast but do not say so.

Kept so that the command recorded in the manifests of earlier amendments still runs: it is
``python experiments/amend_records.py autocast DATASET_DIR ...`` (see that script).

Usage: ``python experiments/amend_autocast_records.py datasets/measured/vm-xeon-2c``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from amend_records import main  # noqa: E402 - the experiments folder is not a package

if __name__ == "__main__":
    raise SystemExit(main(["autocast", *sys.argv[1:]]))
