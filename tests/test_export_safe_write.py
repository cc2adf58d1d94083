"""Atomic saves: a crash while writing never leaves a broken file under the final name."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from trainer.system import safe_write
from trainer.system.safe_write import atomic_path, save_safetensors_atomic

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
NEW = {"w": torch.zeros(2, 3), "v": torch.ones(1000)}


def half_then_fail(tensors, filename, metadata=None):
    """A writer that dies half-way: some bytes on disk, then an error."""
    with open(filename, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"w\":")
    raise OSError("disk full")


def test_writes_a_loadable_file_and_no_leftovers(tmp_path):
    path = save_safetensors_atomic(tmp_path / "sub" / "a.safetensors", GOOD, {"k": "v"})
    assert path == tmp_path / "sub" / "a.safetensors"
    assert torch.equal(load_file(str(path))["w"], GOOD["w"])
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"k": "v"}
    assert os.listdir(path.parent) == ["a.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0o600


def test_failure_mid_write_keeps_the_earlier_file(tmp_path, monkeypatch):
    path = save_safetensors_atomic(tmp_path / "last.safetensors", GOOD)
    before = path.read_bytes()
    monkeypatch.setattr(safe_write, "save_file", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save_safetensors_atomic(path, NEW)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.safetensors"]  # the temporary file is gone


def test_failure_mid_write_leaves_no_file_under_the_final_name(tmp_path, monkeypatch):
    monkeypatch.setattr(safe_write, "save_file", half_then_fail)
    with pytest.raises(OSError):
        save_safetensors_atomic(tmp_path / "last.safetensors", NEW)
    assert os.listdir(tmp_path) == []


def test_failing_rename_keeps_the_earlier_file(tmp_path, monkeypatch):
    path = save_safetensors_atomic(tmp_path / "last.safetensors", GOOD)

    def no_replace(src, dst):
        raise PermissionError("file is open in another program")

    monkeypatch.setattr(safe_write.os, "replace", no_replace)
    with pytest.raises(PermissionError):
        save_safetensors_atomic(path, NEW)
    assert torch.equal(load_file(str(path))["w"], GOOD["w"])
    assert os.listdir(tmp_path) == ["last.safetensors"]


def test_killed_process_mid_write_keeps_the_earlier_file(tmp_path):
    """A real crash (no exception handler runs): only a hidden .tmp file can be left."""
    path = save_safetensors_atomic(tmp_path / "last.safetensors", GOOD)
    before = path.read_bytes()
    script = textwrap.dedent(f"""
        import os, torch
        from trainer.system import safe_write
        def die(tensors, filename, metadata=None):
            with open(filename, "wb") as f:
                f.write(b"partial")
                f.flush()
            os._exit(9)
        safe_write.save_file = die
        safe_write.save_safetensors_atomic({str(path)!r}, {{"w": torch.zeros(3)}})
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=120)
    assert proc.returncode == 9
    assert path.read_bytes() == before
    leftovers = sorted(set(os.listdir(tmp_path)) - {"last.safetensors"})
    assert len(leftovers) == 1
    assert leftovers[0].startswith(".last.safetensors.") and leftovers[0].endswith(".tmp")


def test_refuses_non_string_metadata_before_writing(tmp_path):
    with pytest.raises(TypeError, match="ss_steps"):
        save_safetensors_atomic(tmp_path / "a.safetensors", GOOD, {"ss_steps": 3})
    assert os.listdir(tmp_path) == []


def test_atomic_path_for_any_file(tmp_path):
    target = tmp_path / "config.toml"
    target.write_text("old = 1\n")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("new = ")
            raise RuntimeError("crash")
    assert target.read_text() == "old = 1\n"
    with atomic_path(target) as tmp:
        tmp.write_text("new = 2\n")
    assert target.read_text() == "new = 2\n"
    assert os.listdir(tmp_path) == ["config.toml"]
