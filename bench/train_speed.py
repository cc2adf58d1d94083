"""Training speed and memory of the tiny model on this machine.

    python bench/train_speed.py [--steps 40]

Prints steps/s (after a warm-up) and peak RSS for 64 px batch 1 and 128 px batch 4, with the
latent cache on and off, and how many images a second run on the same data encodes (disk
cache). Each case runs in a fresh process so that its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from childproc import ROOT, StepTimes, parse_or_run_child, peak_rss_mib, run_child

WARMUP = 5


def _case(resolution: int, batch: int, cache: bool, steps: int, out: str, to_disk: bool) -> dict:
    """Runs inside the child process: one training run, timed per step."""
    sys.path.insert(0, str(ROOT))
    import trainer.run.caches as caches
    import trainer.run.loop as loop
    from trainer.config.files import from_dict

    encoded = []
    real_encode = caches.encode_images

    def counting(vae, pixels, *family):
        encoded.append(pixels.shape[0])
        return real_encode(vae, pixels, *family)

    caches.encode_images = counting
    sink = StepTimes()

    cfg = from_dict({
        "dataset": {"resolution": resolution, "min_bucket_reso": 64, "max_bucket_reso": 256,
                    "bucket_reso_steps": 64, "cache_latents": cache,
                    "cache_latents_to_disk": to_disk, "cache_dir": out + "/cache"},
        "training": {"max_train_steps": steps, "train_batch_size": batch, "log_with": "none"},
        "saving": {"output_dir": out},
    })
    result = loop.run(cfg, sink)
    assert result.status == "finished", result.error
    return {"steps_per_s": sink.rate(WARMUP), "peak_rss_mib": peak_rss_mib(),
            "encoded": sum(encoded)}


def _child(args: list[str]) -> dict:
    return run_child(__file__, args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parse_or_run_child(parser, _case)
    home = tempfile.mkdtemp(prefix="bench-home-")
    os.environ["KOHYA_STUDIO_HOME"] = home
    print(f"tiny SD 1.x LoRA, {args.steps} steps (first {WARMUP} not timed), {os.cpu_count()} "
          f"cores (CPU training leaves one free unless OMP_NUM_THREADS is set)")
    print(f"{'case':<28}{'steps/s':>10}{'peak RSS MiB':>15}")
    for resolution, batch in ((64, 1), (128, 4)):
        for cache in (True, False):
            out = tempfile.mkdtemp(prefix="bench-out-")
            r = _child([resolution, batch, cache, args.steps, out, False])
            name = f"{resolution}px batch {batch} cache {'on' if cache else 'off'}"
            print(f"{name:<28}{r['steps_per_s']:>10.2f}{r['peak_rss_mib']:>15.0f}")
    out = tempfile.mkdtemp(prefix="bench-out-")
    first = _child([64, 1, True, WARMUP + 2, out, True])
    second = _child([64, 1, True, WARMUP + 2, out, True])
    print(f"disk latent cache: first run encoded {first['encoded']} images, "
          f"second run encoded {second['encoded']}")


if __name__ == "__main__":
    main()
