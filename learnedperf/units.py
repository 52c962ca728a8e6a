"""Units and dtype sizes shared by every stage.

Names carry their unit (``_ms``, ``_GBps``, ``_GiB``); these constants convert.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 1e9
TFLOP = 1e12
US = 1e-6
MS = 1e-3

#: Bytes per element of each precision name used in strategies and operators.
BYTES_PER_ELEMENT = {
    "fp32": 4,
    "tf32": 4,  # tf32 is an fp32 storage format computed on tensor cores
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int64": 8,
    "int32": 4,
}

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


def dtype_bytes(dtype: str) -> int:
    """Return the size in bytes of one element of ``dtype``."""
    return BYTES_PER_ELEMENT[dtype]
