"""Learned models. Heavy libraries (lightgbm, pandas) load only when a model is fitted or loaded."""

from .gbdt import LearnedOpCost, OpTimeRegressor

__all__ = ["LearnedOpCost", "OpTimeRegressor"]
