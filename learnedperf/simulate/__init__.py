"""Discrete-event simulation of distributed training iterations."""

from .simulator import SIMULATOR_VERSION, SimResult, simulate

__all__ = ["SIMULATOR_VERSION", "SimResult", "simulate"]
