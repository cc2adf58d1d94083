"""A Z-Image LoRA at 256 px: the studio against diffusers' own example
(``examples/dreambooth/train_dreambooth_lora_z_image.py``), same model, images and settings.

    .venv/bin/python bench/zimage_lora_vs_diffusers.py --example DIR [--df-python PY]
        [--work /tmp/zbench] [--reps 3] [--steps 6] [--only diffusers,studio]

The model and images are bench/zimage_model.py's (built into ``WORK/z`` if missing): a Z-Image
at real width (dim 3840, Qwen3 width 2560) with a few blocks and random weights. The example's
code is not the project's: take it from a diffusers snapshot into a folder outside the checkout
(``--example``: the folder holding the script) and run it with a Python that has diffusers,
transformers, accelerate, peft and torchvision (``--df-python``; default: this venv's). Where
torchvision has no wheel (no CPU build for the box), ``--df-python`` may be a wrapper around this
venv's Python that imports transformers and diffusers first (so that they cache "no
torchvision" and use none themselves), then puts a stand-in on ``sys.path`` with the calls the
example makes (``transforms.InterpolationMode``, ``RandomCrop.get_params``; ``functional``'s
``resize``, ``center_crop``, ``crop``, ``hflip``, ``to_tensor``, ``normalize`` on PIL images)
and runs the script with ``runpy``: the example's step, its models and its memory are
untouched (only its image preprocessing goes through the stand-in).

Same for both: LoRA rank 4 alpha 4 (the example's defaults) on the transformer only, AdamW,
lr 1e-4 constant, no warm-up, batch 1, 256 px (one square size, no buckets), ``--steps``
steps, seed 42, fp32 (``--mixed_precision no`` / ``training.mixed_precision = "no"``), one
caption for every image (the example's ``--instance_prompt``). Each tool caches what it caches
by default: the example encodes the prompt once and runs the VAE at every step (no
``--cache_latents``; ``--df-args --cache_latents`` measures it with its latent cache); the
studio caches the text and the latents, both before the transformer is built (a text-first
run: trainer/run/text_first.py, trainer/run/caches.py), so its steps are training steps only
and the VAE's encode (0.27 TFLOP per image at 256 px, more than the depth-1 transformer's
forward, 0.20) is in its start -> step 1. Their targets differ where neither can be told to
match: the example trains the attention (to_q, to_k, to_v, to_out.0) of every block, refiners
included; the studio its
family's (musubi-tuner's: attention and SwiGLU of the main layers), so its backward pass stops
at the main layers, where the example's goes on through the refiners: at the bench's depth
(one main layer, two refiners) that is a large share of a step, at the real depth (30 and 4)
a small one. ``--studio-root`` runs
another checkout's trainer/ (e.g. a fix, against the same example figures).

``--reps`` rounds, the tools alternated, one run at a time, each started once the 1-minute load
average is under ``--max-load`` (or after ``--load-wait`` seconds, noted). For each run: s/step
is the median of the steps after the first (from each tool's progress output, timestamped
here as it arrives); CPU s/step the median of the CPU seconds (user + system, every thread)
its process tree spent over the same steps, which other work on the machine stretches far
less than the wall-clock seconds (a figure to read beside s/step on a shared machine);
start -> step 1 is from launch to step 1's progress update; peak RSS is the largest sum of
the RSS of the process and its descendants (polled every 0.1 s), or the process's own peak
(``wait4``'s maxrss) where that is larger. The table gives the median of
the rounds and the studio's ratios to the example.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from example_procs import cpu_kind
from vs_example import (
    add_arguments,
    one_run,
    report,
    rounds,
)

EXAMPLE = "train_dreambooth_lora_z_image.py"


def example_cmd(args, model: Path, data: Path, out: Path) -> list[str]:
    from zimage_model import CAPTION

    return [args.df_python, str(Path(args.example) / EXAMPLE),
            f"--pretrained_model_name_or_path={model}", f"--instance_data_dir={data}",
            f"--instance_prompt={CAPTION}", "--resolution=256", "--rank=4", "--lora_alpha=4",
            "--train_batch_size=1", f"--max_train_steps={args.steps}",
            "--learning_rate=1e-4", "--lr_scheduler=constant", "--lr_warmup_steps=0",
            "--seed=42", "--mixed_precision=no", "--dataloader_num_workers=0",
            "--checkpointing_steps=100000", f"--output_dir={out}", *args.df_args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, EXAMPLE, "/tmp/zbench")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--refiners", type=int, default=1)
    parser.add_argument("--te-layers", type=int, default=2)
    args = parser.parse_args()
    model = Path(args.work) / "z" / "model"
    if not (model / "model_index.json").exists():
        from zimage_model import build_images, build_model

        build_model(model, args.layers, args.refiners, args.te_layers)
        build_images(model.parent)
    layers = json.loads((model / "transformer/config.json").read_text())["n_layers"]
    print(f"model: {model} ({layers} layers); CPU: {cpu_kind()}; "
          f"threads: {args.threads or 'each tool its own'}")
    done = rounds(args, lambda tool, rep: one_run(
        args, tool, rep, model, Path(args.work) / "z",
        lambda images, out: example_cmd(args, model, images, out)))
    report(done, args, "Z-Image LoRA, 256 px, fp32, batch 1")


if __name__ == "__main__":
    main()
