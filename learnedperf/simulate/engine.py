"""A discrete-event executor of tasks on streams and shared links.

Tasks run on *streams* (a CUDA-stream-like FIFO: a task starts when the task
before it on its stream has finished and all its dependencies have finished).
A compute task takes a fixed time. A transfer task first waits its latency,
then moves bytes over one or more *links*; all transfers active on a link
share its bandwidth equally (processor sharing), so a transfer's rate is
``min over its links of bandwidth / active transfers`` and is recomputed
whenever a transfer starts or ends.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

_DONE, _FLOW_START, _FLOW_CHECK = 0, 1, 2  # event kinds


@dataclass
class TaskRecord:
    """What happened to one task: stream, category, start and end (s), the category it waited on."""

    name: str
    stream: str
    category: str
    start: float
    end: float
    waited_on: str


class Engine:
    """Build a task graph with :meth:`add_stream`, :meth:`add_link`, :meth:`compute`, :meth:`transfer`; then :meth:`run`."""

    def __init__(self) -> None:
        self.stream_names: list[str] = []
        self.stream_tasks: list[list[int]] = []
        self.link_bw: list[float] = []
        self.link_names: list[str] = []
        # task arrays (struct of lists: faster than objects in CPython)
        self.t_stream: list[int] = []
        self.t_dur: list[float] = []
        self.t_demand: list[tuple] = []
        self.t_ndeps: list[int] = []
        self.t_succ: list[list[int]] = []
        self.t_cat: list[str] = []
        self.t_name: list[str] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.waited: list[int] = []

    def add_stream(self, name: str) -> int:
        """A new stream; returns its id."""
        self.stream_names.append(name)
        self.stream_tasks.append([])
        return len(self.stream_names) - 1

    def add_link(self, name: str, bandwidth_Bps: float) -> int:
        """A new link of ``bandwidth_Bps`` bytes per second; returns its id."""
        if bandwidth_Bps <= 0:
            raise ValueError(f"link {name} needs a positive bandwidth")
        self.link_names.append(name)
        self.link_bw.append(bandwidth_Bps)
        return len(self.link_bw) - 1

    def _add(self, stream: int, dur: float, demand: tuple, deps, category: str, name: str) -> int:
        i = len(self.t_stream)
        self.t_stream.append(stream)
        self.t_dur.append(dur)
        self.t_demand.append(demand)
        n = 0
        for d in deps:
            if d is not None and d >= 0:
                self.t_succ[d].append(i)
                n += 1
        self.t_ndeps.append(n)
        self.t_succ.append([])
        self.t_cat.append(category)
        self.t_name.append(name)
        self.stream_tasks[stream].append(i)
        return i

    def compute(self, stream: int, duration_s: float, deps=(), category: str = "compute", name: str = "") -> int:
        """A task busy for ``duration_s`` on ``stream`` after ``deps``; returns its id."""
        return self._add(stream, duration_s, (), deps, category, name)

    def transfer(self, stream: int, latency_s: float, demands: list[tuple[int, float]], deps=(),
                 category: str = "comm", name: str = "") -> int:
        """A transfer: ``latency_s`` then ``bytes`` on each ``(link, bytes)`` of ``demands``, sharing links."""
        demand = tuple((link, b) for link, b in demands if b > 0)
        return self._add(stream, latency_s, demand, deps, category, name)

    # ------------------------------------------------------------------ run
    def run(self) -> float:
        """Execute every task; return the time the last one ends (s)."""
        n = len(self.t_stream)
        start = [0.0] * n
        end = [0.0] * n
        ready_at = [0.0] * n  # time the last dependency finished
        waited = [-1] * n  # the dependency that finished last
        ndeps = list(self.t_ndeps)
        pos = [0] * len(self.stream_tasks)
        stream_free = [0.0] * len(self.stream_tasks)
        stream_busy = [False] * len(self.stream_tasks)
        stream_prev = [-1] * len(self.stream_tasks)
        heap: list = []
        seq = 0
        t_dur, t_demand = self.t_dur, self.t_demand
        stream_tasks = self.stream_tasks
        # link sharing state: only flows that share a link with a starting/ending flow change rate
        link_bw = self.link_bw
        link_flows: list[set] = [set() for _ in link_bw]
        flows: dict[int, list] = {}  # task -> [remaining fraction, rate (1/s), last update, version]
        done = 0

        def try_start(s: int, now: float) -> None:
            nonlocal seq
            if stream_busy[s]:
                return
            tasks = stream_tasks[s]
            p = pos[s]
            if p >= len(tasks):
                return
            i = tasks[p]
            if ndeps[i]:
                return
            t0 = max(now, ready_at[i], stream_free[s])
            start[i] = t0
            stream_busy[s] = True
            seq += 1
            heapq.heappush(heap, (t0 + t_dur[i], seq, _FLOW_START if t_demand[i] else _DONE, i, 0))

        def rerate(affected: set, now: float) -> None:
            nonlocal seq
            for j in affected:
                f = flows[j]
                f[0] -= f[1] * (now - f[2])
                f[2] = now
                f[1] = min(link_bw[l] / len(link_flows[l]) / b for l, b in t_demand[j])
                f[3] += 1
                seq += 1
                heapq.heappush(heap, (now + max(0.0, f[0]) / f[1], seq, _FLOW_CHECK, j, f[3]))

        for s in range(len(stream_tasks)):
            try_start(s, 0.0)
        now = 0.0
        while heap:
            now, _, kind, i, ver = heapq.heappop(heap)
            if kind == _FLOW_START:
                affected = {i}
                for l, _b in t_demand[i]:
                    link_flows[l].add(i)
                    affected |= link_flows[l]
                flows[i] = [1.0, 0.0, now, 0]
                rerate(affected, now)
                continue
            if kind == _FLOW_CHECK:
                f = flows.get(i)
                if f is None or f[3] != ver:
                    continue  # superseded by a later rate change
                del flows[i]
                affected = set()
                for l, _b in t_demand[i]:
                    link_flows[l].discard(i)
                    affected |= link_flows[l]
                if affected:
                    rerate(affected, now)
            self._finish(i, now, end, ready_at, waited, ndeps, pos, stream_free, stream_busy, stream_prev, try_start)
            done += 1
        if done != n:
            stuck = [self.t_name[i] for i in range(n) if ndeps[i] or (end[i] == 0.0 and start[i] == 0.0)][:3]
            raise RuntimeError(f"simulation deadlock: {n - done} tasks never ran (e.g. {stuck})")
        self.start, self.end, self.waited = start, end, waited
        return max(end) if end else 0.0

    def _finish(self, i, now, end, ready_at, waited, ndeps, pos, stream_free, stream_busy, stream_prev, try_start):
        end[i] = now
        s = self.t_stream[i]
        stream_free[s] = now
        stream_busy[s] = False
        stream_prev[s] = i
        pos[s] += 1
        touched = {s}
        for j in self.t_succ[i]:
            ndeps[j] -= 1
            if now >= ready_at[j]:
                ready_at[j] = now
                waited[j] = i
            touched.add(self.t_stream[j])
        for t in touched:
            try_start(t, now)

    def records(self) -> list[TaskRecord]:
        """Every task's record, after :meth:`run`."""
        out = []
        for i in range(len(self.t_stream)):
            w = self.waited[i]
            out.append(TaskRecord(self.t_name[i], self.stream_names[self.t_stream[i]], self.t_cat[i], self.start[i],
                                  self.end[i], self.t_cat[w] if w >= 0 else ""))
        return out
