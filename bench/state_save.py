"""The cost of a training-state save: seconds and megabytes, for the tiny model and for an
SD 1.5-size LoRA.

    python bench/state_save.py [--sd15 DIR]

Trains 2 steps with ``saving.save_state`` on and times each ``trainer.run.state.save_state`` call
(the LoRA file's own save is not counted). The SD 1.5-size case uses the random single file that
bench/single_file.py builds (``--sd15`` names its folder; built there when missing), with the
default LoRA (rank 8 on the attention blocks, AdamW).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from childproc import ROOT, parse_or_run_child, run_child


def _case(model: str, tokenizer: str, out: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import trainer.run.state as state
    from trainer.config.files import from_dict
    from trainer.run.loop import run

    timings: list[float] = []
    real = state.save_state

    def timed(s, progress):
        start = time.perf_counter()
        folder = real(s, progress)
        timings.append(time.perf_counter() - start)
        return folder

    state.save_state = timed
    model_cfg = {"pretrained_model_name_or_path": model}
    if tokenizer:
        model_cfg["tokenizer"] = tokenizer
    cfg = from_dict({
        "model": model_cfg,
        "dataset": {"resolution": 64, "min_bucket_reso": 64, "max_bucket_reso": 128,
                    "bucket_reso_steps": 64},
        "training": {"max_train_steps": 2, "log_with": "none"},
        "saving": {"output_dir": out, "save_state": True, "save_every_n_steps": 1},
    })
    result = run(cfg)
    assert result.status == "finished", result.error
    folder = max(Path(out).glob("*-state"))
    size = sum(p.stat().st_size for p in folder.iterdir())
    return {"seconds": min(timings), "mib": size / 2**20,
            "files": {p.name: round(p.stat().st_size / 2**20, 2) for p in folder.iterdir()}}


def _child(args: list) -> dict:
    return run_child(__file__, args, HF_HUB_OFFLINE="1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sd15", help="folder of bench/single_file.py's model")
    args = parse_or_run_child(parser, _case)
    os.environ["KOHYA_STUDIO_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    tiny = _child(["embedded:tiny-sd15", "", tempfile.mkdtemp(prefix="bench-out-")])
    print(f"tiny LoRA: state save {tiny['seconds']:.3f} s, {tiny['mib']:.2f} MiB {tiny['files']}")
    folder = Path(args.sd15 or tempfile.mkdtemp(prefix="bench-sd15-"))
    model = folder / "sd15-random.safetensors"
    if not model.is_file():
        subprocess.run([sys.executable, str(ROOT / "bench" / "single_file.py"), "--keep",
                        str(folder), "--steps", "2"], check=True, cwd=ROOT)
    big = _child([str(model), str(folder / "tokenizer"), tempfile.mkdtemp(prefix="bench-out-")])
    print(f"SD 1.5-size LoRA: state save {big['seconds']:.3f} s, {big['mib']:.2f} MiB "
          f"{big['files']}")


if __name__ == "__main__":
    main()
