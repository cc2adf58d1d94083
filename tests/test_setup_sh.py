"""setup.sh: the platform probe, what it installs from where (lock or --latest), that a second
run does nothing, and that a failed install leaves no venv looking valid.

The installs here are fakes: a `python` whose venv records every pip and uv command, so the
tests need no network and take a second. The real install is what ./test.sh and CI run first."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCKED_UV = re.search(r"^uv==(\S+)", (ROOT / "locks/bootstrap.txt").read_text(), re.M).group(1)


def _fake_tool(folder: Path, name: str, body: str = "exit 0") -> None:
    folder.mkdir(exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


def _setup(tmp_path, *args, path_dirs=(), python="python3"):
    env = {**os.environ, "KOHYA_VENV": str(tmp_path / "venv"), "PYTHON": python,
           "PATH": ":".join([*map(str, path_dirs), "/usr/bin", "/bin"])}
    for name in [k for k in env if k.startswith("UV_")]:
        del env[name]
    return subprocess.run(["bash", str(ROOT / "setup.sh"), *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path)


# A python that makes venvs whose python, pip and uv succeed and write each command to calls.log.
FAKE_VENV_PYTHON = """#!/bin/sh
echo "python $*" >> "$(dirname "$0")/../calls.log"
case "$*" in
  *"print(torch.__version__)"*|*'version("torch")'*) echo 2.13.0+cpu ;;
  *sysconfig*) echo /fake/site-packages ;;
esac
exit 0
"""
FAKE_UV = f"""#!/bin/sh
[ "$1" = --version ] && {{ echo "uv {LOCKED_UV}"; exit 0; }}
line="uv $*"
prev=""
for arg in "$@"; do   # what each constraint file says, as it is gone after setup.sh
  [ "$prev" = -c ] && line="$line CONSTRAINT $(grep '^torch' "$arg")"
  prev=$arg
done
echo "$line" >> "$(dirname "$0")/../calls.log"
exit 0
"""


def _fake_python(tmp_path: Path) -> Path:
    venv_python = tmp_path / "venv-python"
    venv_python.write_text(FAKE_VENV_PYTHON)
    uv = tmp_path / "fake-uv"
    uv.write_text(FAKE_UV)
    python = tmp_path / "fakepython"
    python.write_text(f"""#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp {venv_python} "$3/bin/python" && exit 0
fi
if [ "$1 $2 $3" = "-m pip --python" ]; then   # the bootstrap: pip puts uv into the venv
  bin=$(dirname "$4"); cp {uv} "$bin/uv"; echo "bootstrap $*" >> "$bin/../calls.log"; exit 0
fi
exit 1
""")
    for script in (venv_python, uv, python):
        script.chmod(0o755)
    return python


def _calls(tmp_path) -> list[str]:
    log = tmp_path / "venv" / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _torch_constraint(command: str) -> str:
    """The torch line of the constraint file in a recorded install (setup.sh writes it into a
    temporary folder that it removes at exit, so the fake uv copies each constraint file)."""
    return re.search(r"CONSTRAINT torch==\S+", command).group(0).split()[1]


def _installs(tmp_path, constraints=False) -> list[str]:
    found = [c for c in _calls(tmp_path) if c.startswith("uv pip install")]
    return found if constraints else [c.split(" CONSTRAINT ")[0] for c in found]


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


def test_the_cpu_lock_is_installed_after_a_cpu_torch(tmp_path):
    proc = _setup(tmp_path, "--cpu", python=_fake_python(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = _calls(tmp_path)
    assert calls[0].startswith("bootstrap ") and "-r locks/bootstrap.txt" in calls[0]
    assert "--require-hashes" in calls[0]
    torch_cpu, lock, project = _installs(tmp_path, constraints=True)
    assert torch_cpu.endswith("torch==2.13.0+cpu")  # a CPU build, never PyPI's CUDA one
    assert lock.split(" CONSTRAINT ")[0].endswith("-r locks/cpu.txt")
    assert "--upgrade" not in lock
    assert _torch_constraint(lock) == "torch==2.13.0+cpu"
    assert "--no-deps" in project and project.endswith("-e .")
    assert any(c.startswith("uv pip check") for c in calls)
    assert (tmp_path / "venv" / ".kohya-setup-ok").read_text().startswith("cpu dev=0 lock ")
    # bytecode compiled at install: no process pays 6 s of compiling where .pyc can't be written
    assert all("--compile-bytecode" in c for c in (torch_cpu, lock, project))
    assert not any("compileall" in c for c in calls)


def test_gui_sh_s_first_set_up_compiles_the_bytecode_in_the_background(tmp_path):
    """./gui.sh's first run: the app starts while the bytecode compiles at the lowest
    priority (what the first page imports is compiled by that import)."""
    import time

    proc = _setup(tmp_path, "--cpu", "--compile-later", python=_fake_python(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compiling the packages' bytecode in the background" in proc.stdout
    assert not any("--compile-bytecode" in c for c in _installs(tmp_path))
    deadline = time.monotonic() + 30
    while "python -m compileall -q -j 0 /fake/site-packages" not in _calls(tmp_path):
        assert time.monotonic() < deadline, _calls(tmp_path)
        time.sleep(0.1)
    assert "./setup.sh --compile-later" in (ROOT / "gui.sh").read_text()


def test_a_second_run_does_nothing(tmp_path):
    python = _fake_python(tmp_path)
    assert _setup(tmp_path, "--cpu", "--dev", python=python).returncode == 0
    before = _calls(tmp_path)
    proc = _setup(tmp_path, "--cpu", "--dev", python=python)
    assert proc.returncode == 0 and "already set up for cpu (lock); nothing to do" in proc.stdout
    assert _calls(tmp_path) == before


def test_dev_adds_the_dev_lock_and_latest_resolves_the_ranges(tmp_path):
    python = _fake_python(tmp_path)
    assert _setup(tmp_path, "--cpu", "--dev", python=python).returncode == 0
    assert _installs(tmp_path)[1].endswith("-r locks/cpu.txt -r locks/dev.txt")
    (tmp_path / "venv" / "calls.log").unlink()
    proc = _setup(tmp_path, "--cpu", "--dev", "--latest", python=python)
    assert proc.returncode == 0, proc.stderr
    assert "newest versions (--latest)" in proc.stdout
    latest = _installs(tmp_path, constraints=True)[1]  # not "nothing to do": another mode
    assert latest.split(" CONSTRAINT ")[0].endswith("-r requirements.txt -r requirements_dev.txt")
    assert "--upgrade" in latest and "-c " in latest
    # torch is held at the exact build installed (a bare 2.13.0 would let --upgrade take PyPI's
    # CUDA build of 2.13.0 over the CPU one)
    assert _torch_constraint(latest) == "torch==2.13.0+cpu"
    assert (tmp_path / "venv" / ".kohya-setup-ok").read_text().startswith("cpu dev=1 latest ")


@pytest.mark.parametrize("flag, platform", [("--cuda", "cuda"), ("--use-rocm", "rocm"),
                                            ("--use-ipex", "ipex")])
def test_each_platform_installs_its_torch_then_its_lock(tmp_path, flag, platform):
    assert _setup(tmp_path, flag, python=_fake_python(tmp_path)).returncode == 0
    installs = _installs(tmp_path)
    if platform == "cuda":  # PyPI's torch and its CUDA libraries are in the lock, hashed
        assert installs[0].endswith("-r locks/cuda.txt")
    else:
        assert installs[0].endswith(f"-r requirements_linux_{platform}.txt")
        assert installs[1].endswith(f"-r locks/{platform}.txt")


def test_failed_bootstrap_leaves_no_venv(tmp_path):
    # a "python" that makes a venv whose python always fails (and has no pip of its own)
    fake_python = tmp_path / "fakepython"
    fake_python.write_text('#!/bin/sh\n[ "$1" = "-m" ] && [ "$2" = "venv" ] || exit 1\n'
                           'mkdir -p "$3/bin"\nprintf "#!/bin/sh\\nexit 1\\n" > "$3/bin/python"\n'
                           'chmod +x "$3/bin/python"\n')
    fake_python.chmod(0o755)
    proc = _setup(tmp_path, "--cpu", python=str(fake_python))
    assert proc.returncode == 1
    assert "FAILED while installing uv" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_failed_install_into_an_existing_venv_unmarks_it(tmp_path):
    python = _fake_python(tmp_path)
    assert _setup(tmp_path, "--cpu", python=python).returncode == 0
    uv = tmp_path / "venv" / "bin" / "uv"
    uv.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "uv {LOCKED_UV}"; exit 0; }}\n'
                  'exit 1\n')  # every install fails now
    proc = _setup(tmp_path, "--cpu", "--dev", python=python)
    assert proc.returncode == 1 and "FAILED while installing" in proc.stderr
    assert (tmp_path / "venv" / "bin" / "python").exists()  # the user's venv is kept...
    assert not (tmp_path / "venv" / ".kohya-setup-ok").exists()  # ...but not marked


def test_unknown_option_is_refused(tmp_path):
    proc = _setup(tmp_path, "--use-cuda")
    assert proc.returncode == 2 and "unknown option --use-cuda" in proc.stderr


def _uv_env():
    import importlib.util

    spec = importlib.util.spec_from_file_location("uv_env", ROOT / "scripts" / "uv_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pips_package_sources_reach_uv():
    uv_env = _uv_env()
    listing = ("global.extra-index-url='file:///m/simple file:///n/simple'\n"
               "global.find-links='/wheels'\n"
               "install.find-links='/install-wheels'\n"
               "global.constraint='/etc/c.txt'\n"
               ":env:.find-links='/env-a /env-b'\n"
               "global.timeout='60'\n")
    settings = uv_env.pip_settings(listing)
    assert settings["find-links"] == "/env-a /env-b"  # PIP_* over [install] over [global]
    out = uv_env.uv_variables(settings, environ={})
    assert out == {"UV_INDEX": "file:///m/simple file:///n/simple",
                   "UV_FIND_LINKS": "/env-a,/env-b", "UV_CONSTRAINT": "/etc/c.txt",
                   # pip takes the best version across all sources; uv would stop at the first
                   "UV_INDEX_STRATEGY": "unsafe-best-match"}
    # what the user set for uv wins; a pip without such settings gives nothing
    assert "UV_FIND_LINKS" not in uv_env.uv_variables(settings, environ={"UV_FIND_LINKS": "x"})
    assert uv_env.uv_variables(uv_env.pip_settings(""), environ={}) == {}
