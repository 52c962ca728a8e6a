"""Validated, frozen, JSON round-trippable specifications of runs."""

from .hardware import DeviceSpec, HardwareSpec, PeakTflops, resolve_hardware
from .model import ModelSpec, resolve_model
from .run import RunSpec
from .strategy import Strategy

__all__ = ["DeviceSpec", "HardwareSpec", "PeakTflops", "ModelSpec", "RunSpec", "Strategy",
           "resolve_hardware", "resolve_model"]
