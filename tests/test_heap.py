"""``training.cpu_freed_memory`` (trainer/system/heap.py): what becomes of the large blocks a
CPU run's steps free. glibc maps large blocks on their own and unmaps them when freed, raising
its threshold as it goes; 'reuse' keeps every block in the heap for the next step, 'return'
maps every block over 128 KiB and gives it back when freed. Read back from glibc itself
(``mallinfo2``: the mapped blocks and their bytes) and from the process's page faults."""

from __future__ import annotations

import ctypes
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Log, Step
from trainer.run.loop import run
from trainer.system import heap

BLOCK = 2**28  # float32 elements, never touched: 1 GiB
STEP = (16, 8, 20, 16, 4)  # a step's large tensors, in MiB of float32 elements (4 bytes each)
STEP_PAGES = 2 * sum(STEP) * 4 * 2**20 // resource.getpagesize()


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def libc():
    lib = heap.glibc()
    assert lib is not None, "these tests run on glibc (Linux), as CI does"
    lib.mallinfo2.restype = MallInfo2
    return lib


def mapped_while_alive() -> int:
    """The bytes of glibc's own mappings that a live tensor adds, one larger than all the
    heap's free chunks together (so that glibc can only map it or grow the heap) and at least
    1 GiB; empty: no page of it is touched."""
    info = libc().mallinfo2()
    elements = max(BLOCK, (info.fordblks + 2**28) // 4)
    before = info.hblkhd
    block = torch.empty(elements)
    grown = libc().mallinfo2().hblkhd - before
    del block
    return grown


def step_faults() -> int:
    """Minor page faults of a step-like pattern: large tensors written, then all freed."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.zeros(n * 2**20) for n in STEP]
    ys = [x + 1 for x in xs]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del xs, ys
    return faults


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@pytest.fixture
def kept():
    handle = heap.keep_freed_blocks("cpu", environ={})
    yield handle
    if handle is not None:
        handle.restore()


def test_large_blocks_come_from_the_heap_and_are_reused(kept):
    assert isinstance(kept, heap.HeapMode) and kept.mode == "reuse"
    assert mapped_while_alive() == 0  # from the heap, not a mapping of its own
    [step_faults() for _ in range(3)]  # the heap grows to the steps' size
    assert sum(step_faults() for _ in range(3)) < STEP_PAGES // 2  # then its pages are reused


def test_restore_returns_the_free_pages_and_maps_large_blocks_again(kept):
    [step_faults() for _ in range(3)]
    held = rss()
    kept.restore()
    kept.restore()  # once only
    assert rss() < held - STEP_PAGES * resource.getpagesize() // 4
    assert mapped_while_alive() >= BLOCK * 4


def test_without_it_glibc_maps_large_blocks():
    assert mapped_while_alive() >= BLOCK * 4


@pytest.mark.parametrize("environ", [{"MALLOC_MMAP_THRESHOLD_": "1048576"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}])
def test_the_environment_s_own_malloc_settings_are_left_alone(environ):
    assert heap.environment_setting(environ) == next(iter(environ))
    assert heap.keep_freed_blocks("cpu", environ=environ) is None
    assert mapped_while_alive() >= BLOCK * 4


def test_other_backends_are_left_alone():
    assert heap.keep_freed_blocks("cuda", environ={}) is None
    assert heap.return_freed_blocks("cuda", environ={}) is None
    assert heap.set_mode("return", "cuda", environ={}) is None
    assert heap.environment_setting({"MALLOC_MMAP_THRESHOLD_": ""}) is None


# -- the thresholds, in a fresh process each: a block of a few MiB comes from a small heap's
# top or from a mapping of its own depending only on glibc's mmap threshold
PROBE = """
import ctypes, sys
from trainer.system import heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost").split()]

libc = heap.glibc()
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def mapped(size):
    before = libc.mallinfo2().hblks
    block = libc.malloc(size)
    grown = libc.mallinfo2().hblks - before
    libc.free(block)
    return grown

mode, restored, warm = sys.argv[1], sys.argv[2] == "restored", sys.argv[3] == "warm"
if warm:  # glibc's rule raises its thresholds (mmap 16 MiB, trim 32 MiB), as a set-up does
    libc.free(libc.malloc(16 << 20))
handle = heap.set_mode(mode, "cpu", environ={})
if restored:
    handle.restore()
small = [libc.malloc(100 << 10) for _ in range(200)]  # 20 MiB from the heap's top
for block in reversed(small):
    libc.free(block)
print(mapped(4 << 20), mapped(4 << 20), mapped(64 << 20), libc.mallinfo2().arena >> 20)
"""


def probe(mode: str, restored: bool = False, warm: bool = False) -> tuple[int, ...]:
    """(a 4 MiB block mapped, the next 4 MiB block mapped, a 64 MiB block mapped, the MiB the
    heap holds after 20 MiB of small blocks were freed)."""
    done = subprocess.run([sys.executable, "-c", PROBE, mode, "restored" if restored else "-",
                           "warm" if warm else "-"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1],
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return tuple(int(n) for n in done.stdout.split())


def test_glibc_raises_its_thresholds_after_a_mapped_block_is_freed():
    assert probe("glibc")[:3] == (1, 0, 1)  # the first 4 MiB mapped, the next from the heap
    assert probe("glibc", warm=True)[3] >= 20  # and keeps what a step freed at the heap's top


@pytest.mark.parametrize("warm", [False, True])
def test_return_maps_every_block_over_128_kib_and_trims_the_heap(warm):
    mapped_4, mapped_4_again, mapped_64, heap_mib = probe("return", warm=warm)
    assert (mapped_4, mapped_4_again, mapped_64) == (1, 1, 1)
    assert heap_mib < 5


@pytest.mark.parametrize("mode", ["reuse", "return"])
def test_restore_leaves_glibc_as_its_rule_settles_in_a_training_process(mode):
    assert probe(mode, restored=True)[:3] == (0, 0, 1)  # 32 MiB threshold: 4 MiB from the heap


def test_an_unknown_mode_names_the_setting():
    with pytest.raises(ValueError, match="training.cpu_freed_memory = 'keep'.*glibc, reuse"):
        heap.set_mode("keep", "cpu", environ={})


def lines(sink):
    return [e.message for e in sink.events if isinstance(e, Log)]


class Recorder(ListSink):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def emit(self, event):
        if isinstance(event, Step):
            self.seen.append(mapped_while_alive())
        super().emit(event)


@pytest.fixture
def restores(monkeypatch):
    """No malloc setting in the environment; the (mode, still active) of every restore."""
    for name in heap.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    calls = []
    real_restore = heap.HeapMode.restore
    monkeypatch.setattr(heap.HeapMode, "restore",
                        lambda self: (calls.append((self.mode, self.active)),
                                      real_restore(self)))
    return calls


def test_a_cpu_run_keeps_freed_blocks_for_its_steps_and_gives_them_back(tmp_path, restores):
    seen = []
    data = one_image_dataset(tmp_path / "data")
    sink = Recorder(seen)
    result = run(small_config(tmp_path, data, training={"max_train_steps": 2,
                                                        "cpu_freed_memory": "reuse"}), sink)
    assert result.status == "finished", result.error
    assert len(seen) >= 2 and set(seen) == {0}  # every step: large blocks from the heap
    assert restores == [("reuse", True)]
    assert any("CPU heap: the steps reuse the blocks they free" in line
               for line in lines(sink))
    assert mapped_while_alive() >= BLOCK * 4  # glibc maps large blocks again after the run


def test_a_cpu_run_says_when_the_environment_sets_the_heap(tmp_path, monkeypatch):
    monkeypatch.setenv("MALLOC_TOP_PAD_", "131072")
    data = one_image_dataset(tmp_path / "data")
    sink = ListSink()
    result = run(small_config(tmp_path, data, training={"max_train_steps": 1,
                                                        "cpu_freed_memory": "reuse"}), sink)
    assert result.status == "finished", result.error
    assert any("CPU heap: as MALLOC_TOP_PAD_ in the environment sets it" in line
               for line in lines(sink))


def test_by_default_a_cpu_run_leaves_the_heap_to_glibc(tmp_path, monkeypatch):
    for name in heap.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    seen = []
    data = one_image_dataset(tmp_path / "data")
    sink = Recorder(seen)
    result = run(small_config(tmp_path, data, training={"max_train_steps": 2}), sink)
    assert result.status == "finished", result.error
    assert seen and min(seen) >= BLOCK * 4  # large blocks mapped on their own, as glibc does
    assert not any("CPU heap" in line for line in lines(sink))


def test_a_cpu_run_in_return_mode_sets_it_for_its_steps_and_ends_it(tmp_path, restores):
    data = one_image_dataset(tmp_path / "data")
    sink = ListSink()
    result = run(small_config(tmp_path, data, training={"max_train_steps": 2,
                                                        "cpu_freed_memory": "return"}), sink)
    assert result.status == "finished", result.error
    assert restores == [("return", True)]
    assert any("CPU heap: every block over 128 KiB that a step frees goes back" in line
               and "training.cpu_freed_memory = 'return'" in line for line in lines(sink))
