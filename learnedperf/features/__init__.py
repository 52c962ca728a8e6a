"""Feature schemas shared by training and inference: per operator (:mod:`.ops`) and per
execution graph (:mod:`.graph`: nodes, edges, run-level)."""

from .graph import (EDGE_FEATURE_SCHEMA, GLOBAL_FEATURE_SCHEMA, GRAPH_FEATURE_SCHEMA_VERSION, NODE_FEATURE_SCHEMA,
                    SIMULATOR_GLOBAL_FEATURES, edge_feature_matrix, global_feature_vector,
                    global_features_from_record, graph_feature_schema_dict, node_feature_matrix)
from .ops import OP_FEATURE_SCHEMA, ROOFLINE_COLUMN, FeatureSchema, op_features, op_features_from_ops

__all__ = ["EDGE_FEATURE_SCHEMA", "GLOBAL_FEATURE_SCHEMA", "GRAPH_FEATURE_SCHEMA_VERSION", "NODE_FEATURE_SCHEMA",
           "OP_FEATURE_SCHEMA", "ROOFLINE_COLUMN", "SIMULATOR_GLOBAL_FEATURES", "FeatureSchema",
           "edge_feature_matrix", "global_feature_vector", "global_features_from_record",
           "graph_feature_schema_dict", "node_feature_matrix", "op_features", "op_features_from_ops"]
