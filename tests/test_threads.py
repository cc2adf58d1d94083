"""The CPU thread policy: every core while the machine is otherwise idle, one fewer while other
processes keep a core busy; OMP_NUM_THREADS fixes the count."""

import time
from types import SimpleNamespace

import pytest

from trainer.system import threads
from trainer.system.threads import (
    CpuThreads,
    CpuTimes,
    others_cores,
    read_cpu_times,
    wanted_threads,
)


def fake_torch(n):
    state = {"n": n}
    return SimpleNamespace(get_num_threads=lambda: state["n"],
                           set_num_threads=lambda k: state.update(n=k)), state


def test_others_are_the_machine_minus_this_process():
    before = CpuTimes(busy=1000, total=4000, own=500)
    # 2 cores, 200 ticks of wall time each = 400 ticks; 300 busy of which 200 were ours
    after = CpuTimes(busy=1300, total=4400, own=700)
    assert others_cores(before, after, cores=2) == pytest.approx(0.5)
    assert others_cores(before, before, cores=2) == 0.0
    # own time counted a little ahead of /proc/stat never gives a negative share
    assert others_cores(before, CpuTimes(1100, 4400, 700), cores=2) == 0.0


def test_busy_takes_a_core_away_and_calm_gives_it_back():
    assert wanted_threads(0.6, current=8, cores=8) == 7
    assert wanted_threads(0.1, current=7, cores=8) == 8
    assert wanted_threads(0.4, current=7, cores=8) == 7  # in the gap: unchanged
    assert wanted_threads(0.4, current=8, cores=8) == 8
    assert wanted_threads(3.0, current=1, cores=1) == 1


def test_tick_decides_at_most_every_interval():
    torch, state = fake_torch(2)
    clock = {"t": 0.0}
    readings = iter([CpuTimes(0, 0, 0), CpuTimes(160, 200, 100), CpuTimes(180, 400, 180),
                     CpuTimes(380, 600, 280)])
    policy = CpuThreads(torch, cores=2, read=lambda: next(readings),
                        clock=lambda: clock["t"], interval=5.0)
    clock["t"] = 1.0
    assert policy.tick() is None and state["n"] == 2  # too soon: not even read
    clock["t"] = 6.0  # others: 160 - 100 = 60 of 200 ticks on 2 cores = 0.6 cores
    assert policy.tick() == 1 and state["n"] == 1
    clock["t"] = 12.0  # others: 20 - 80 -> 0: calm again
    assert policy.tick() == 2 and state["n"] == 2
    clock["t"] = 18.0  # others: 200 - 100 = 100 of 200 ticks = 1 core
    assert policy.tick() == 1
    assert [n for n, _ in policy.changes] == [1, 2, 1]


def test_omp_num_threads_or_another_backend_turns_the_policy_off(monkeypatch):
    torch, _ = fake_torch(4)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.adaptive_threads("cpu", torch) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads.adaptive_threads("cuda", torch) is None


def test_a_run_starts_from_all_cores_even_after_a_busy_run(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_ALL_CORES", None)
    torch, state = fake_torch(4)
    policy = threads.adaptive_threads("cpu", torch)
    assert policy is not None and policy.cores == 4
    state["n"] = 3  # the previous run in this process (the GUI) ended with a core left free
    assert threads.adaptive_threads("cpu", torch).threads == 4 and state["n"] == 4


def test_proc_readings_see_this_process_burn_cpu():
    before = read_cpu_times()
    assert before is not None and 0 < before.busy <= before.total
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    after = read_cpu_times()
    assert after.own - before.own >= 20  # 0.3 s at 100 ticks/s, give or take a tick
    assert after.busy - before.busy >= after.own - before.own - 2


def test_a_cpu_run_reports_its_threads(tmp_path, monkeypatch):
    from train_helpers import one_image_dataset, small_config

    from trainer.events import Log
    from trainer.run.loop import run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    logs = []
    sink = SimpleNamespace(emit=lambda e: logs.append(e.message) if isinstance(e, Log) else None)
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"))
    assert run(cfg, sink).status == "finished"
    assert any(m.startswith("CPU training with ") for m in logs)
