"""Whether the machine stayed quiet while it was being measured.

A timing taken while other processes use the CPU describes the contention, not the hardware,
and nothing in the timing itself says so. This project's earlier CPU collection is the
example: re-measured on a quiet machine, its training steps ran faster by a median factor of
1.62 (1.08–2.70; ``notes`` of ``datasets/measured/vm-xeon-2c/manifest.json``).

Linux's ``/proc/stat`` counts every CPU's busy time since boot (user, nice, system and steal —
steal being time the hypervisor gave to another virtual machine; irq and softirq are left out,
because the loopback traffic of the measured ranks is processed there without being charged to
their process time). The
measured processes count their own with :func:`time.process_time`. Over a window, the
difference is the CPU time of everything else: :func:`foreign_share` divides it by the
window's capacity (wall time × logical CPUs). On platforms without ``/proc/stat`` the check
says it cannot tell (``None``) rather than reporting a quiet machine.

``/proc/stat`` ticks at ``USER_HZ`` (normally 100 per second and CPU), so a window of a few
hundred milliseconds resolves a share to a few per cent; :data:`MIN_FOREIGN_S` keeps tick
noise on short windows from flagging a quiet machine.
"""

from __future__ import annotations

import os
import time
from typing import Optional

QUIET_SHARE = 0.15
"""A window whose other processes used more than this share of the machine's CPUs is contended.

Why 0.15: over the 2 × 136 steps of two quiet collections of ``datasets/measured/vm-xeon-2c``
(2-core VM) the share was 0.000–0.054 (kernel threads, tick rounding); one competing busy
process on 2 cores is 0.5."""

MIN_FOREIGN_S = 0.05
"""Foreign CPU seconds below which a window is never called contended (5 ticks at USER_HZ=100)."""

# /proc/stat "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice.
# guest time is already inside user, so it is not added again; idle and iowait are not busy;
# irq and softirq are not charged to any process (see the module docstring).
_BUSY_FIELDS = (0, 1, 2, 7)


def machine_busy_s(path: str = "/proc/stat") -> Optional[float]:
    """CPU-seconds every CPU of the machine has been busy since boot, or None without ``/proc/stat``."""
    try:
        with open(path, encoding="ascii") as fh:
            first = fh.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:]]
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks)) / float(hz)


def logical_cpus() -> int:
    """CPUs the kernel schedules on (what ``/proc/stat`` sums over)."""
    return os.cpu_count() or 1


def foreign_share(busy_s: Optional[float], own_cpu_s: float, wall_s: float,
                  cpus: Optional[int] = None) -> dict:
    """Share of the machine's CPU capacity used by other processes over one window.

    Args:
        busy_s: machine busy CPU-seconds over the window (difference of two
            :func:`machine_busy_s`), or None when the platform cannot tell.
        own_cpu_s: CPU-seconds of the measured processes over the same window.
        wall_s: the window's wall-clock length.
        cpus: logical CPUs (default: this machine's).

    Returns:
        ``{"wall_s", "foreign_cpu_s", "foreign_share", "contended"}``; the last three are None
        when ``busy_s`` is None. ``foreign_cpu_s`` is clipped at 0 (tick rounding can make
        the busy count fall a tick short of the processes' own time).
    """
    if busy_s is None:
        return {"wall_s": wall_s, "foreign_cpu_s": None, "foreign_share": None, "contended": None}
    cpus = cpus or logical_cpus()
    foreign = max(0.0, busy_s - own_cpu_s)
    share = foreign / (max(wall_s, 1e-9) * cpus)
    return {"wall_s": round(wall_s, 6), "foreign_cpu_s": round(foreign, 4), "foreign_share": round(share, 4),
            "contended": bool(share > QUIET_SHARE and foreign > MIN_FOREIGN_S)}


class Window:
    """Times a window in this process and reports the foreign share over it.

    Use for work done by this process only (its threads included)::

        w = Window()
        ...  # measure
        report = w.close()
    """

    def __init__(self) -> None:
        self.busy0 = machine_busy_s()
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()

    def elapsed(self) -> dict:
        """This process's CPU seconds (``cpu_s``), the wall seconds (``wall_s``) and the machine's
        busy CPU-seconds (``busy_s``, None without ``/proc/stat``) since the window opened: the raw
        terms, for windows whose own time is summed over several processes."""
        wall = time.perf_counter() - self.t0
        busy1 = machine_busy_s()
        return {"cpu_s": time.process_time() - self.cpu0, "wall_s": wall,
                "busy_s": None if self.busy0 is None or busy1 is None else busy1 - self.busy0}

    def close(self) -> dict:
        """The :func:`foreign_share` report of the window so far."""
        e = self.elapsed()
        return foreign_share(e["busy_s"], e["cpu_s"], e["wall_s"])


def wait_until_quiet(timeout_s: float = 30.0, probe_s: float = 1.0) -> Optional[dict]:
    """Sleep in ``probe_s`` windows until one is not contended, for at most ``timeout_s``.

    Returns the last window's report (its ``contended`` says whether the wait succeeded), or
    None when the platform cannot tell. While this process sleeps, everything busy is foreign.
    """
    deadline = time.monotonic() + timeout_s
    report = None
    while True:  # bounded: every pass sleeps probe_s and the deadline ends it
        w = Window()
        if w.busy0 is None:
            return None
        time.sleep(probe_s)
        report = w.close()
        if not report["contended"] or time.monotonic() >= deadline:
            return report
