"""Measured runs: loaders of public measurements (and, later, local profiling)."""
