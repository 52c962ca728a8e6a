"""Chrome / Perfetto trace of a simulated iteration (``chrome://tracing``, ui.perfetto.dev)."""

from __future__ import annotations

from .engine import Engine


def chrome_trace(engine: Engine) -> list[dict]:
    """Trace events (JSON array format): one complete event per task, a thread per stream."""
    events: list[dict] = []
    for sid, name in enumerate(engine.stream_names):
        stage, _, kind = name.partition(".")
        pid = int(stage[5:]) if stage.startswith("stage") and stage[5:].isdigit() else 0
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"pipeline stage {pid}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": sid, "args": {"name": kind}})
    for i in range(len(engine.t_stream)):
        sid = engine.t_stream[i]
        stage = engine.stream_names[sid].partition(".")[0]
        pid = int(stage[5:]) if stage[5:].isdigit() else 0
        events.append({"ph": "X", "name": engine.t_name[i] or engine.t_cat[i], "cat": engine.t_cat[i], "pid": pid,
                       "tid": sid, "ts": engine.start[i] * 1e6, "dur": (engine.end[i] - engine.start[i]) * 1e6})
    return events
