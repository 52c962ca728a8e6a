"""Feature schemas shared by training and inference (see :mod:`.ops`)."""

from .ops import OP_FEATURE_SCHEMA, ROOFLINE_COLUMN, FeatureSchema, op_features, op_features_from_ops

__all__ = ["OP_FEATURE_SCHEMA", "ROOFLINE_COLUMN", "FeatureSchema", "op_features", "op_features_from_ops"]
