"""The README's commands work as a user pastes them.

Every ```bash block of the README is run here, command by command, in a fresh folder that holds
the checkout's presets and test data (so the presets' relative output folders land there), with
the studio's data folder of the test session. Blocks that show a command with placeholders for
the user's own files (``my.toml``, ``my-lora.safetensors``) are ```sh blocks and are not run; the
README's set-up, GUI and test commands (``./setup.sh``, ``./gui.sh``, ``./test.sh``) have their
own tests and CI. A command that fails, or a README that stops showing one of the commands a new
user needs offline, fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN_HERE = ("./setup.sh", "./gui.sh", "./test.sh")  # tested by test_setup_sh.py and CI
PYTHON = re.compile(r"^(\.venv/bin/python|python3?)\s+-m\s+trainer\s")
# What a new user runs offline, and so what the README must show in a ```bash block.
MUST_SHOW = ["train presets/lora/default.toml", "train presets/dreambooth/default.toml",
             "train presets/textual_inversion/default.toml", "tiny-model", "example-config",
             "doctor", "import-kohya tests/data/kohya_ss/", "advise presets/"]


def bash_commands(markdown: str) -> list[str]:
    """The commands of every ```bash block: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


def trainer_commands() -> list[str]:
    commands = bash_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    others = [c for c in commands if not PYTHON.match(c) and not c.startswith(NOT_RUN_HERE)]
    assert others == [], f"README ```bash commands this test does not know how to run: {others}"
    return [c for c in commands if PYTHON.match(c)]


def test_the_readme_shows_what_a_new_user_runs_offline():
    shown = " | ".join(trainer_commands())
    assert [m for m in MUST_SHOW if m not in shown] == []


def test_the_commands_parse_a_block_as_a_shell_would():
    text = "intro\n```bash\npython -m trainer a \\\n    --b 'c d'   # note\n# alone\n```\n" \
           "```sh\npython -m trainer never\n```\n"
    assert bash_commands(text) == ["python -m trainer a --b 'c d'"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A user's folder: the checkout's presets and test data, nothing written into the checkout."""
    folder = tmp_path_factory.mktemp("readme")
    for name in ("presets", "tests"):
        (folder / name).symlink_to(ROOT / name)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("command", trainer_commands())
def test_a_readme_command_runs_as_pasted(command, workdir, studio_home):
    example = ROOT / "config_example.toml"
    before = example.read_bytes()
    args = [sys.executable, "-m", "trainer", *shlex.split(PYTHON.sub("", command, count=1))]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr
    assert example.read_bytes() == before  # `example-config` rewrites it the same: it is fresh
