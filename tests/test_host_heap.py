"""A run fixes glibc's mmap threshold (trainer/system/host_heap.py): tensors of 1 MiB or more
that a step frees go back to the system even when a live one sits above them in memory."""

from __future__ import annotations

import subprocess
import sys

from train_helpers import one_image_dataset, small_config

import trainer.system.host_heap as host_heap
from trainer.config.paths import PROJECT_ROOT
from trainer.run.loop import run

# frees a 16 MiB tensor (glibc then raises its threshold to 16 MiB), makes 200 tensors of
# 2 MiB, frees all but the last, and prints how much more memory the process holds than before
SCRIPT = """
import os, sys
import torch
torch.set_num_threads(1)
if sys.argv[1] == "fixed":
    from trainer.system.host_heap import fix_mmap_threshold
    assert fix_mmap_threshold()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
x = torch.ones(16 << 20, dtype=torch.uint8)
del x
base = rss()
blocks = [torch.ones(2 << 20, dtype=torch.uint8) for _ in range(200)]
last = blocks[-1]
del blocks
print((rss() - base) / 2**20)
"""


def held_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         check=True, cwd=PROJECT_ROOT)
    return float(out.stdout.split()[-1])


def test_freed_tensors_leave_the_process_once_the_threshold_is_fixed():
    assert held_mib("glibc's own") > 300  # 398 MiB freed under the live block, kept
    assert held_mib("fixed") < 20  # the live block alone


def test_a_run_fixes_the_threshold(tmp_path, monkeypatch):
    calls = []
    real = host_heap.fix_mmap_threshold
    monkeypatch.setattr(host_heap, "fix_mmap_threshold", lambda *a: calls.append(a) or real(*a))
    data = one_image_dataset(tmp_path / "data")
    result = run(small_config(tmp_path, data, training={"max_train_steps": 1}))
    assert result.status == "finished", result.error
    assert calls == [()]
