"""The experiments' checkpoint option and loading: ``--checkpoint DIR`` and one clear error for a checkpoint that
is missing, tampered, truncated or incompatible (what :meth:`learnedperf.predict.Predictor.load` refuses).

Imported by the scripts beside it (``python experiments/NAME.py`` puts this folder on ``sys.path``).
"""

from __future__ import annotations

import argparse
from typing import Optional


def add_checkpoint_argument(ap: argparse.ArgumentParser) -> None:
    """Add the ``--checkpoint`` option (default: the shipped ``checkpoints/default``)."""
    ap.add_argument("--checkpoint", help="checkpoint directory (default checkpoints/default)")


def load_predictor(path: Optional[str], prog: str):
    """The :class:`~learnedperf.predict.Predictor` of ``path`` (None: the default checkpoint).

    Raises:
        SystemExit: the checkpoint does not load; the message, ``"<prog>: error: <reason>"``, goes to stderr and
            the exit status is 1.
    """
    from learnedperf.errors import LearnedPerfError
    from learnedperf.predict import Predictor

    try:
        return Predictor.load(path)
    except LearnedPerfError as exc:
        raise SystemExit(f"{prog}: error: {exc}") from None


def tiers_of(predictor, prog: str) -> tuple[str, ...]:
    """The tiers ``predictor``'s checkpoint answers: ``("full", "fast")``, or ``("full",)`` for one trained
    without a surrogate (``learnedperf train --surrogate-runs 0``), which is said once on stdout."""
    if predictor.checkpoint.surrogate is not None:
        return ("full", "fast")
    print(f"{prog}: checkpoint {predictor.source} has no surrogate (trained with --surrogate-runs 0): "
          "the fast tier is not scored")
    return ("full",)


def require_fast_tier(predictor, prog: str) -> None:
    """Exit with one line naming the checkpoint where it has no surrogate (the script measures the fast tier).

    Raises:
        SystemExit: no surrogate; the message goes to stderr and the exit status is 1.
    """
    if predictor.checkpoint.surrogate is None:
        raise SystemExit(f"{prog}: error: checkpoint {predictor.source} has no surrogate (trained with "
                         "--surrogate-runs 0), and this script measures the fast tier")
