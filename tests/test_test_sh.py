"""The README's test command ends when a pytest worker dies.

With ``--dist loadfile``, pytest-xdist (3.8) replaced a crashed worker and then waited for ever
(pytest-dev/pytest-xdist#784, #1378): stop 42's CI ran into its 90-minute limit after a worker
was killed for its memory, with no test named. test.sh passes ``--max-worker-restart=0``, so
the run stops, fails and names the test the worker died in. This runs test.sh's own pytest
line on a small suite whose second file kills its worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from trainer.config.paths import PROJECT_ROOT


def pytest_line() -> str:
    """test.sh's line that starts pytest (after its set-up), its continued lines joined."""
    text = (PROJECT_ROOT / "test.sh").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines()
             if re.match(r'\s*exec "\$VENV/bin/python" -m pytest ', line)]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_crashed_worker_ends_the_run_and_names_its_test(tmp_path):
    (tmp_path / "test_a.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "test_b.py").write_text(
        "import os\n\ndef test_dies():\n    os._exit(1)\n\ndef test_after():\n    pass\n")
    (tmp_path / "test_c.py").write_text("def test_three():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this project's configuration
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent),
           "KOHYA_TEST_WORKERS": "1"}
    script = f"set -euo pipefail\n{pytest_line()}\n"
    done = subprocess.run(["bash", "-c", script, "test.sh", "-p", "no:cacheprovider",
                           "test_a.py", "test_b.py", "test_c.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "crashed while running 'test_b.py::test_dies'" in out, out
