"""The lock files (locks/, written by scripts/lock.py): what they hold, that they agree with the
ranges of requirements*.txt, and that the venv the tests run in was installed from them."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "locks"
PLATFORMS = ("cpu", "cuda", "rocm", "ipex")
ALL_LOCKS = [*PLATFORMS, "dev", "bootstrap"]
CUDA_ONLY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def pins(lock: str) -> list[tuple[Requirement, list[str]]]:
    """(name==version ; marker, [hashes]) for each entry of locks/<lock>.txt."""
    entries: list[tuple[Requirement, list[str]]] = []
    for line in (LOCKS / f"{lock}.txt").read_text().splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            entries.append((Requirement(line.rstrip(" \\")), []))
        elif "--hash=" in line:
            entries[-1][1].append(line.split("--hash=")[1].rstrip(" \\"))
    return entries


def applies(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate()


def ranges(path: str) -> dict[str, Requirement]:
    found = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            found[canonicalize_name(req.name)] = req
    return found


def torch_pin(platform: str) -> str:
    return str(ranges(f"requirements_linux_{platform}.txt")["torch"].specifier)


@pytest.mark.parametrize("lock", ALL_LOCKS)
def test_every_entry_is_an_exact_version_with_hashes_and_no_local_path(lock):
    text = (LOCKS / f"{lock}.txt").read_text()
    for local in ("file://", "/opt/", "/tmp/", "/home/", "/root/", "--find-links", "--index-url"):
        assert local not in text, f"locks/{lock}.txt holds {local!r}: it must install anywhere"
    entries = pins(lock)
    assert entries
    for req, hashes in entries:
        assert str(req.specifier).startswith("=="), req
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), req


def test_only_the_cuda_lock_holds_torch_and_the_cuda_libraries():
    cuda = {canonicalize_name(r.name): r for r, _ in pins("cuda")}
    assert str(cuda["torch"].specifier) == torch_pin("cuda")
    assert any(name.startswith("nvidia-") for name in cuda)
    for platform in ("cpu", "rocm", "ipex"):
        names = {canonicalize_name(r.name) for r, _ in pins(platform)}
        assert not [n for n in names if CUDA_ONLY.match(n)], platform
        # ...and the rest is what the CUDA lock holds, at the same versions
        assert names == {n for n in cuda if not CUDA_ONLY.match(n)}, platform
        header = (LOCKS / f"{platform}.txt").read_text().split("\n\n")[0]
        assert f"torch{torch_pin(platform)} from requirements_linux_{platform}.txt" in header


@pytest.mark.parametrize("lock, source", [("cuda", "requirements.txt"),
                                          ("dev", "requirements_dev.txt")])
def test_the_pins_are_inside_the_ranges(lock, source):
    """A range changed without `scripts/lock.py` fails here (for this Python)."""
    locked = {canonicalize_name(r.name): r for r, _ in pins(lock) if applies(r)}
    for name, wanted in ranges(source).items():
        assert name in locked, f"{name} is in {source} but not in locks/{lock}.txt"
        version = next(iter(locked[name].specifier)).version
        assert wanted.specifier.contains(version, prereleases=True), (
            f"locks/{lock}.txt pins {name} {version}, outside {source}'s {wanted.specifier}")


def test_the_test_venv_holds_the_locked_versions():
    """./test.sh installs the lock (setup.sh --dev); a venv made by --latest / --lowest, or not
    by setup.sh at all, is not checked."""
    marker = Path(sys.prefix) / ".kohya-setup-ok"
    if not marker.exists() or marker.read_text().split()[2:3] != ["lock"]:
        pytest.skip("this venv was not installed from the locks by setup.sh")
    platform = marker.read_text().split()[0]
    differ = []
    for lock in (platform, "dev"):
        for req, _ in pins(lock):
            if not applies(req):
                continue
            try:
                have = importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                differ.append(f"{req.name}: locked {req.specifier}, not installed")
                continue
            if not req.specifier.contains(have, prereleases=True):
                differ.append(f"{req.name}: locked {req.specifier}, installed {have}")
    assert differ == []
