"""The cost interface: what one node of the execution graph costs.

Every cost model — the analytical roofline of this module, and later measured
lookups and learned regressors — answers two questions the simulator asks:

* :meth:`CostModel.compute_time_s` — seconds a compute op takes on one device;
* :meth:`CostModel.comm_cost` — the start-up latency of a collective and the
  bytes it pushes through each link level of one rank (``"intra"``: NVLink /
  xGMI / PCIe inside a node; ``"inter"``: the rank's share of the network),
  so that the simulator can share link bandwidth between concurrent transfers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..graph.ops import Op


@dataclass(frozen=True, slots=True)
class CommCost:
    """Latency and per-link-level bytes of one collective on one rank."""

    latency_s: float
    intra_bytes: float
    inter_bytes: float
    algorithm: str = "ring"


def host_bound_s(kernels_s: float, kernels: int, host_dispatch_s: float, chained: int = 0,
                 chained_dispatch_s: float = 0.0) -> float:
    """Seconds of ``kernels`` kernels issued back to back that take ``kernels_s`` on the device, when the
    host takes ``host_dispatch_s`` to issue each: ``max(kernels_s, kernels · host_dispatch_s)``; ``chained``
    more kernels, bare tensor operations of eager chains (``Op.chained``), take ``chained_dispatch_s`` each.

    Launches are asynchronous: the host runs ahead of the device and queues kernels, so over a block
    the device waits only where the host issues more slowly than it computes (the rate of a two-stage
    pipeline is its slower stage's). A per-kernel floor, ``Σ max(t, floor)``, charges every short kernel
    even where long ones gave the host a lead.
    """
    return max(kernels_s, kernels * host_dispatch_s + chained * chained_dispatch_s)


class CostModel(ABC):
    """What an op costs on one device of a given hardware spec."""

    #: short name reported in predictions' ``source``
    name: str = "cost"
    #: seconds the host takes to issue one kernel (:func:`host_bound_s`); 0: the host never binds
    host_dispatch_s: float = 0.0
    #: seconds the host takes to issue one bare tensor operation of an eager chain (``Op.chained``)
    chained_dispatch_s: float = 0.0
    #: fixed seconds one pipeline send adds to its link time (``CostParams.pipeline_send_us``)
    pipeline_send_s: float = 0.0

    @abstractmethod
    def compute_time_s(self, op: Op) -> float:
        """Seconds one device spends on compute op ``op``."""

    @abstractmethod
    def comm_cost(self, op: Op) -> CommCost:
        """Latency and bytes per link level of collective ``op``."""

    @abstractmethod
    def link_bandwidth_Bps(self, level: str) -> float:
        """Achievable bytes/s of one rank's link at ``level`` ("intra" or "inter"), one direction."""

    def comm_time_s(self, op: Op) -> float:
        """Seconds a collective takes alone on idle links."""
        c = self.comm_cost(op)
        t = 0.0
        if c.intra_bytes:
            t = max(t, c.intra_bytes / self.link_bandwidth_Bps("intra"))
        if c.inter_bytes:
            t = max(t, c.inter_bytes / self.link_bandwidth_Bps("inter"))
        return c.latency_s + t

    def time_s(self, op: Op) -> float:
        """Seconds of any op alone (compute, or communication on idle links)."""
        return self.comm_time_s(op) if op.is_comm else self.compute_time_s(op)
