"""The quiet-machine check of measurements (learnedperf.measure.quiet and its use in collections).

Values are checked against closed forms (the share is foreign CPU-seconds over wall × CPUs) and
against a known load: one busy-looping process takes one CPU, i.e. a share of 1/CPUs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from learnedperf.measure import collect, quiet
from learnedperf.measure.quiet import QUIET_SHARE, Window, foreign_share, machine_busy_s

HAS_PROC_STAT = machine_busy_s() is not None
needs_proc_stat = pytest.mark.skipif(not HAS_PROC_STAT, reason="no /proc/stat on this platform")

#: a process that keeps one CPU busy until killed (bounded by its own deadline as well)
GPT = {"name": "gpt-test", "arch": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
       "vocab_size": 256, "seq_length": 32}
HARDWARE = {"device": {"name": "test-cpu", "vendor": "test", "peak_tflops": {"fp32": 0.1},
                       "memory_bandwidth_GBps": 20.0, "memory_GiB": 24.0},
            "devices_per_node": 2, "intra_node_bandwidth_GBps": 5.0, "intra_node_latency_us": 20.0}

HOG = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end:\n    pass\n"


def test_foreign_share_closed_form():
    # 3 busy CPU-seconds, 1 of them ours, over 2 s on 2 CPUs: 2 foreign seconds of a 4-second capacity
    r = foreign_share(3.0, 1.0, 2.0, cpus=2)
    assert r["foreign_cpu_s"] == pytest.approx(2.0) and r["foreign_share"] == pytest.approx(0.5)
    assert r["contended"] is True
    # tick rounding can make the machine's count fall short of the processes' own: clipped at zero
    assert foreign_share(0.99, 1.0, 1.0, cpus=2)["foreign_cpu_s"] == 0.0
    # a large share of a tiny window stays below the absolute floor: tick noise, not contention
    tiny = foreign_share(0.01, 0.0, 0.005, cpus=2)
    assert tiny["foreign_share"] > QUIET_SHARE and tiny["contended"] is False
    # a platform that cannot tell says so rather than reporting a quiet machine
    assert foreign_share(None, 1.0, 1.0) == {"wall_s": 1.0, "foreign_cpu_s": None, "foreign_share": None,
                                             "contended": None}


def test_machine_busy_counts_user_nice_system_steal(tmp_path):
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 5000 40 7 9 11 3 0\ncpu0 50 10 15 2500 20 3 4 5 1 0\n")
    assert machine_busy_s(str(stat)) == pytest.approx((100 + 20 + 30 + 11) / hz)
    stat.write_text("intr 1 2 3\n")
    assert machine_busy_s(str(stat)) is None
    assert machine_busy_s(str(tmp_path / "missing")) is None


@needs_proc_stat
def test_window_sees_one_busy_process():
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        time.sleep(0.3)  # let it start spinning
        w = Window()
        time.sleep(1.0)
        r = w.close()
    finally:
        hog.kill()
        hog.wait(timeout=10)
    cpus = os.cpu_count() or 1
    # one spinning process is one CPU of `cpus`; allow for a scheduler that shares it out unevenly
    assert r["foreign_share"] >= 0.6 / cpus
    assert r["foreign_share"] <= 1.0 + 0.05
    if cpus <= 6:  # 1/cpus is above the threshold: the check must call it contended
        assert r["contended"] is True


@needs_proc_stat
def test_two_rank_step_counts_its_own_ranks():
    """The ranks' CPU time is the measurement's: two ranks keeping two CPUs busy are not foreign load."""
    from learnedperf.measure.quiet import wait_until_quiet
    from learnedperf.measure.steps import StepConfig, measure_step

    before = wait_until_quiet(timeout_s=10.0)
    if before["contended"]:  # other load would make the share large whatever the accounting does
        pytest.skip(f"other processes use {before['foreign_share']:.0%} of the CPUs: cannot tell own time apart")
    check: dict = {}
    measure_step(StepConfig(GPT, 2, {"grad_bucket_size_MiB": 1.0}, warmup=1, repeats=8), HARDWARE, quiet=check)
    assert set(check) == {"wall_s", "foreign_cpu_s", "foreign_share", "contended"}
    assert check["wall_s"] > 0
    # were the ranks' time missing, two busy ranks on a 2-CPU machine would read as a share near 1
    assert check["foreign_share"] < 0.5


def test_quietly_remeasures_once_and_keeps_a_contended_record(monkeypatch):
    monkeypatch.setattr(collect, "wait_until_quiet", lambda: None)
    logs: list[str] = []
    calm = {"wall_s": 1.0, "foreign_cpu_s": 0.0, "foreign_share": 0.0, "contended": False}
    busy = {"wall_s": 1.0, "foreign_cpu_s": 1.0, "foreign_share": 0.5, "contended": True}
    ledger: dict = {"remeasured": [], "contended": []}

    def again_calm():
        return "second", calm

    # quiet the first time: the first result stands and nothing is measured again
    assert collect._quietly(("first", calm), lambda: pytest.fail("measured again"), "a", ledger,
                            logs.append) == ("first", calm)
    # contended, then quiet: the second result replaces the first and the manifest says so
    assert collect._quietly(("first", busy), again_calm, "b", ledger, logs.append) == ("second", calm)
    assert ledger["remeasured"] == [{"case": "b", "first_foreign_share": 0.5, "foreign_share": 0.0}]
    assert ledger["contended"] == [] and "50%" in logs[-1]
    # contended twice: the record is kept, never dropped, and listed as contended
    result, check = collect._quietly(("first", busy), lambda: ("second", busy), "c", ledger, logs.append)
    assert result == "second" and check["contended"] is True
    assert ledger["contended"] == ["c"]


def test_share_summary_pools_windows():
    checks = [foreign_share(1.0, 0.5, 1.0, cpus=2), foreign_share(0.01, 0.0, 0.004, cpus=2)]
    s = collect._share_summary(checks)
    assert s["windows"] == 2 and s["wall_s"] == pytest.approx(1.004)
    # pooled: 0.51 foreign CPU-seconds over 1.004 s of capacity on this machine's CPUs
    assert s["foreign_cpu_s"] == pytest.approx(0.51)
    assert s["pooled_share"] == pytest.approx(0.51 / (1.004 * quiet.logical_cpus()), abs=1e-3)
    assert s["contended_windows"] == 1
    assert collect._share_summary([foreign_share(None, 0.0, 1.0)])["pooled_share"] is None
