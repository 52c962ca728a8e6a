"""Cost models: what one node of the execution graph costs (see :mod:`.base`)."""

from .base import CommCost, CostModel, host_bound_s
from .params import CostParams, default_params
from .roofline import RooflineCost

__all__ = ["CommCost", "CostModel", "CostParams", "RooflineCost", "default_params", "host_bound_s"]
