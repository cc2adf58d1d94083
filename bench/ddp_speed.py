"""Images per second with one process x 2 threads and with 2 processes x 1 thread (DDP, gloo),
and one process x 1 thread for reference.

    python bench/ddp_speed.py [--steps 30] [--batch 4] [--resolution 64]

The embedded tiny SD 1.x model, a LoRA, 8 generated images, the latent cache on; both cases
train the same global batch (1 x batch vs 2 x batch/2). The rate is rank 0's steps/s over the
last 20 steps (the Step events' meter), times the global batch; start-up is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from childproc import ROOT, run_child


def _dataset(root: Path) -> Path:
    from PIL import Image, ImageDraw

    folder = root / "data" / "1_shapes"
    folder.mkdir(parents=True)
    for i in range(8):
        img = Image.new("RGB", (64, 64), (30 * i, 60, 200 - 20 * i))
        ImageDraw.Draw(img).ellipse((8 + i, 8, 56, 56 - i), fill=(220, 30, 30))
        img.save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a red shape {i}")
    return root / "data"


def _config(out: str, data: str, steps: int, batch: int, resolution: int, processes: int):
    sys.path.insert(0, str(ROOT))
    from trainer.config.files import from_dict

    return from_dict({
        "dataset": {"train_data_dir": data, "resolution": resolution, "min_bucket_reso": 64,
                    "max_bucket_reso": 256, "bucket_reso_steps": 64, "cache_latents": True},
        "training": {"max_train_steps": steps, "train_batch_size": batch,
                     "num_processes": processes, "log_with": "none"},
        "saving": {"output_dir": out}})


def _rate(events: list) -> float:
    from trainer.events import Step

    steps = [e for e in events if isinstance(e, Step)]
    return steps[-1].it_per_s if steps else float("nan")


def _one_process(args: list) -> dict:
    """Runs in the child (OMP_NUM_THREADS=2): in-process training, as the GUI does."""
    from trainer.events import ListSink
    from trainer.run.loop import run

    sink = ListSink()
    result = run(_config(*args, processes=1), sink)
    assert result.status == "finished", result.error
    return {"steps_per_s": _rate(sink.events)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=4, help="the global batch (even)")
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(_one_process(json.loads(a.child))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = str(_dataset(Path(tmp)))
        one = {n: run_child(__file__, [f"{tmp}/one{n}", data, a.steps, a.batch, a.resolution],
                            OMP_NUM_THREADS=str(n))["steps_per_s"] for n in (2, 1)}
        sys.path.insert(0, str(ROOT))
        from trainer.events import ListSink
        from trainer.run.launch import run_launched

        os.environ["OMP_NUM_THREADS"] = "1"
        sink = ListSink()
        result = run_launched(_config(tmp + "/two", data, a.steps, a.batch // 2,
                                      a.resolution, 2), sink)
        assert result.status == "finished", result.error
        two = _rate(sink.events)
    print(f"tiny SD 1.x LoRA, {a.resolution} px, global batch {a.batch}, {a.steps} steps, "
          f"{os.cpu_count()} cores")
    print(f"1 process  x 2 threads: {one[2] * a.batch:7.1f} images/s")
    print(f"1 process  x 1 thread:  {one[1] * a.batch:7.1f} images/s  (for reference)")
    print(f"2 processes x 1 thread: {two * a.batch:7.1f} images/s")


if __name__ == "__main__":
    main()
