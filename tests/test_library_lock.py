"""The GUI's advisor and a run, started at once in a fresh process, both import diffusers'
and transformers' lazy classes for the first time. Without trainer/system/library_lock.py the
run failed at its model load with ``ImportError: cannot import name 'StableDiffusionPipeline'
from 'diffusers'`` (the DreamBooth tab of a freshly started studio, whose memory estimate was
still being computed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json, sys, threading
    from trainer.config import files as config_io

    out = sys.argv[1]
    cfg = config_io.load("presets/dreambooth/default.toml", [
        f"saving.output_dir={out}", "training.max_train_steps=1",
        "sampling.sample_prompts=[]"])
    assert "diffusers" not in sys.modules and "transformers" not in sys.modules
    start = threading.Barrier(2)
    answers = {}

    def estimate():
        from trainer.advisor import shipped
        from trainer.advisor.estimate import advise
        shipped._LOADED["index"] = {}  # simulate (import diffusers), as for an unshipped model
        start.wait()
        answers["advice"] = advise(cfg).problems

    def train():
        from trainer.run.loop import run
        start.wait()
        finished = run(cfg)
        answers["run"] = [finished.status, finished.error]

    threads = [threading.Thread(target=estimate), threading.Thread(target=train)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps(answers))
""")


def test_advisor_and_run_start_together_in_a_fresh_process(tmp_path):
    env = dict(os.environ, KOHYA_STUDIO_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out")], cwd=PROJECT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers["run"] == ["finished", None], done.stderr[-3000:]
    assert answers["advice"] == []
    assert (tmp_path / "out" / "default-dreambooth.safetensors").is_file()
