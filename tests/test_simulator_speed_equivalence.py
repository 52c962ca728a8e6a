"""What keeps the simulator fast without changing its results, checked on values known independently (no timing).

A simulation leaves no reference cycles: its builder, engine and compiled graph are freed as soon as the
call returns. A cycle (a closure over the builder kept on the builder did it) leaves all of them to the
cyclic garbage collector, which then spends about a fifth of the data-set generator's time traversing them.
"""

from __future__ import annotations

import gc

from learnedperf.data.sampler import sample_runs
from learnedperf.simulate import simulate
from learnedperf.specs import RunSpec


def test_simulation_leaves_no_reference_cycles():
    # sampled runs cover pipelines (extrapolated and not), ZeRO-3/FSDP, zero bubble and expert parallelism
    runs = [RunSpec.from_dict(run) for _i, run in sample_runs(40, 0)]
    simulate(runs[0])  # first-use caches (catalog, parameters) are not garbage
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for run in runs:
            simulate(run)
            simulate(run, exact=True)
        unreachable = gc.collect()
    finally:
        if was_enabled:
            gc.enable()
    assert unreachable == 0
