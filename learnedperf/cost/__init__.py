"""Cost models: what one node of the execution graph costs (see :mod:`.base`)."""

from .base import CommCost, CostModel
from .params import CostParams, default_params
from .roofline import RooflineCost

__all__ = ["CommCost", "CostModel", "CostParams", "RooflineCost", "default_params"]
