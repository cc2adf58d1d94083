"""What the CLI's ``train`` path imports (issue 20): ``python -X importtime -m trainer train``
on the default preset for one step, then the 15 slowest imports (cumulative, top-level
packages) and whether anything the run does not use came in (gradio, the GUI, the tools, the
importers, the advisor, onnxruntime). The tiny model is built first, in a process of its own:
a user's run loads a model, it does not write one (diffusers' pipeline ``save_pretrained`` that
writes it imports every pipeline module and onnxruntime). ``uptime`` before and after: the
figures are wall time, so they move with the machine's load.

    python bench/train_imports.py [CONFIG.toml]
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNUSED = ("gradio", "kohya_gui", "trainer.tools", "trainer.importers", "trainer.advisor",
          "onnxruntime")
LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def main() -> None:
    config = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "presets/lora/default.toml")
    out = tempfile.mkdtemp(prefix="bench-imports-")
    env = dict(os.environ, HF_HUB_OFFLINE="1", KOHYA_STUDIO_HOME=out)
    build = ("from trainer.config import EMBEDDED_MODEL; "
             "from trainer.models.loader import resolve_model_path; "
             "resolve_model_path(EMBEDDED_MODEL)")
    subprocess.run([sys.executable, "-c", build], cwd=ROOT, env=env, check=True)
    print("load:", os.getloadavg())
    cmd = [sys.executable, "-X", "importtime", "-m", "trainer", "train", config,
           "--set", "training.max_train_steps=1", "--set", "training.max_train_epochs=1",
           "--set", f"saving.output_dir={out}/out", "--set", "training.log_with=none"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    rows = [(int(m[2]), len(m[3]), m[4]) for m in LINE.finditer(done.stderr)]
    print(f"imports: {sum(int(m[1]) for m in LINE.finditer(done.stderr)) / 1e6:.2f} s wall "
          f"(sum of self times); the whole 1-step run: {cpu:.2f} s CPU (user + sys, less "
          f"moved by the load than wall time)")
    top = sorted((r for r in rows if r[1] == 1), reverse=True)[:15]
    print(f"exit {done.returncode}; {len(rows)} modules imported; slowest top-level imports "
          f"(cumulative):")
    for micros, _, name in top:
        print(f"  {micros / 1e6:7.2f} s  {name}")
    names = {r[2] for r in rows}
    found = sorted(n for n in names if n.startswith(UNUSED))
    print("not used by a run, imported:", ", ".join(found) if found else "none")
    models = sorted(n for n in names if n.startswith("diffusers.models.") and n.count(".") == 3)
    print(f"diffusers model modules: {len(models)}; load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
