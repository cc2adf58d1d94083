"""setup.sh: the platform probe, and a failed install that leaves no venv looking valid."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _fake_tool(folder: Path, name: str, body: str = "exit 0") -> None:
    folder.mkdir(exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


def _setup(tmp_path, *args, path_dirs=(), python="python3"):
    env = {**os.environ, "KOHYA_VENV": str(tmp_path / "venv"), "PYTHON": python,
           "PATH": ":".join([*map(str, path_dirs), "/usr/bin", "/bin"])}
    return subprocess.run(["bash", str(ROOT / "setup.sh"), *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path)


@pytest.mark.parametrize("tools, expected", [
    ({"rocminfo": "exit 0"}, "installing for rocm (rocminfo is on the PATH)"),
    ({"sycl-ls": "exit 0"}, "installing for ipex (an Intel GPU runtime was found)"),
    ({"nvidia-smi": "echo 'GPU 0: NVIDIA H200'"}, "installing for cuda (nvidia-smi lists a GPU)"),
    ({"nvidia-smi": "exit 9"}, "installing for cpu (no ROCm"),
    ({}, "installing for cpu (no ROCm"),
])
def test_platform_probe(tmp_path, tools, expected):
    for name, body in tools.items():
        _fake_tool(tmp_path / "bin", name, body)
    proc = _setup(tmp_path, "--dry-run", path_dirs=[tmp_path / "bin"])
    assert proc.returncode == 0 and expected in proc.stdout, proc.stdout + proc.stderr


def test_explicit_flag_wins_over_the_probe(tmp_path):
    _fake_tool(tmp_path / "bin", "rocminfo")
    proc = _setup(tmp_path, "--cpu", "--dry-run", path_dirs=[tmp_path / "bin"])
    assert "installing for cpu (--cpu was given)" in proc.stdout


def test_failed_install_leaves_no_venv(tmp_path):
    # a "python" whose venv has a pip that always fails
    fake_python = tmp_path / "fakepython"
    fake_python.write_text('#!/bin/sh\n[ "$1" = "-m" ] && [ "$2" = "venv" ] || exit 1\n'
                           'mkdir -p "$3/bin"\nprintf "#!/bin/sh\\nexit 1\\n" > "$3/bin/python"\n'
                           'chmod +x "$3/bin/python"\n')
    fake_python.chmod(0o755)
    proc = _setup(tmp_path, "--cpu", python=str(fake_python))
    assert proc.returncode == 1
    assert "FAILED while installing PyTorch for cpu" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_unknown_option_is_refused(tmp_path):
    proc = _setup(tmp_path, "--use-cuda")
    assert proc.returncode == 2 and "unknown option --use-cuda" in proc.stderr
