"""The memory model's saved activations against what autograd saves for the step harness's layers.

``experiments/activation_memory.py`` runs one forward of a dense and of MoE layers (dropless, padded, top-2
and top-4, with a shared expert) under ``saved_tensors_hooks`` and adds up the storages autograd keeps; the
model's count plus the tensors the eager harness keeps and Megatron-Core's fused kernels do not (closed forms
from the shapes) must be what autograd saved, within 1 % (the routing's int64 indices are not modelled).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_saved_activations_match_autograd(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    try:
        from activation_memory import main
    finally:
        sys.path.pop(0)
    rc = main(["--seq", "128", "--hidden", "256", "--batch", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("\n") >= 9  # header lines, seven layers, the summary
