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
        demand = tuple(demands)
        for _link, b in demand:
            if not b > 0:  # rare: drop the links that carry nothing (a generator for every transfer is slower)
                demand = tuple((link, b) for link, b in demands if b > 0)
                break
        return self._add(stream, latency_s, demand, deps, category, name)

    # ------------------------------------------------------------------ run
    def run(self) -> float:
        """Execute every task; return the time the last one ends (s)."""
        # The loop below is the simulator's hottest code (hundreds of events per simulation, thousands of
        # simulations per data set): helpers are inlined and state lives in local lists. Events at the same
        # time are ordered by their push sequence, so every push happens in the same order as in the plain
        # formulation (sets of affected flows and touched streams are built and iterated as before): the
        # result is bit-identical.
        n = len(self.t_stream)
        start = [0.0] * n
        end = [0.0] * n
        ready_at = [0.0] * n  # time the last dependency finished
        waited = [-1] * n  # the dependency that finished last
        ndeps = list(self.t_ndeps)
        pos = [0] * len(self.stream_tasks)
        stream_free = [0.0] * len(self.stream_tasks)
        stream_busy = [False] * len(self.stream_tasks)
        heap: list = []
        seq = 0
        t_dur, t_demand, t_succ, t_stream = self.t_dur, self.t_demand, self.t_succ, self.t_stream
        stream_tasks = self.stream_tasks
        heappush, heappop = heapq.heappush, heapq.heappop
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
            heappush(heap, (t0 + t_dur[i], seq, _FLOW_START if t_demand[i] else _DONE, i, 0))

        def rerate(affected: set, now: float) -> None:
            nonlocal seq
            for j in affected:
                f = flows[j]
                f[0] -= f[1] * (now - f[2])
                f[2] = now
                # min over the flow's links of bandwidth / flows on it / bytes (an explicit loop: min() over a
                # generator costs a frame per call; the first of equal values is kept, as min() does)
                dem = t_demand[j]
                link, b = dem[0]
                rate = link_bw[link] / len(link_flows[link]) / b
                if len(dem) > 1:
                    for link, b in dem[1:]:
                        r = link_bw[link] / len(link_flows[link]) / b
                        if r < rate:
                            rate = r
                f[1] = rate
                f[3] += 1
                seq += 1
                left = f[0]
                heappush(heap, (now + (left if left > 0.0 else 0.0) / rate, seq, _FLOW_CHECK, j, f[3]))

        for s in range(len(stream_tasks)):
            try_start(s, 0.0)
        now = 0.0
        while heap:
            now, _, kind, i, ver = heappop(heap)
            if kind == _FLOW_START:
                affected = {i}
                for link, _b in t_demand[i]:
                    on_link = link_flows[link]
                    on_link.add(i)
                    affected |= on_link
                flows[i] = [1.0, 0.0, now, 0]
                rerate(affected, now)
                continue
            if kind == _FLOW_CHECK:
                f = flows.get(i)
                if f is None or f[3] != ver:
                    continue  # superseded by a later rate change
                del flows[i]
                affected = set()
                for link, _b in t_demand[i]:
                    on_link = link_flows[link]
                    on_link.discard(i)
                    affected |= on_link
                if affected:
                    rerate(affected, now)
            # task i ends: release its stream and its successors, then start what can start on the streams
            # touched (in the order of the set of them, as built before)
            end[i] = now
            s = t_stream[i]
            stream_free[s] = now
            stream_busy[s] = False
            pos[s] += 1
            succ = t_succ[i]
            other = False
            for j in succ:
                ndeps[j] -= 1
                if now >= ready_at[j]:
                    ready_at[j] = now
                    waited[j] = i
                if t_stream[j] != s:
                    other = True
            if other:
                touched = {s}
                for j in succ:
                    touched.add(t_stream[j])
                for t in touched:
                    try_start(t, now)
            else:
                try_start(s, now)
            done += 1
        if done != n:
            stuck = [self.t_name[i] for i in range(n) if ndeps[i] or (end[i] == 0.0 and start[i] == 0.0)][:3]
            raise RuntimeError(f"simulation deadlock: {n - done} tasks never ran (e.g. {stuck})")
        self.start, self.end, self.waited = start, end, waited
        return max(end) if end else 0.0

    def records(self) -> list[TaskRecord]:
        """Every task's record, after :meth:`run`."""
        out = []
        for i in range(len(self.t_stream)):
            w = self.waited[i]
            out.append(TaskRecord(self.t_name[i], self.stream_names[self.t_stream[i]], self.t_cat[i], self.start[i],
                                  self.end[i], self.t_cat[w] if w >= 0 else ""))
        return out
