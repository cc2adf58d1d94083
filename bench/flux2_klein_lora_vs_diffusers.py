"""A FLUX.2 [klein] 4B LoRA at 256 px: the studio against diffusers' own example
(``examples/dreambooth/train_dreambooth_lora_flux2_klein.py``), same model, images and settings.

    .venv/bin/python bench/flux2_klein_lora_vs_diffusers.py --example DIR
        [--df-python PY] [--df-pythonpath DIR] [--work /tmp/kbench] [--reps 3] [--steps 5]
        [--only diffusers,studio] [--double 2] [--single 2]

The model and images are bench/flux2_klein_model.py's (built into ``WORK/k`` if missing): klein
4B's transformer at real width (hidden 3072, text input 7680 = 3 x Qwen3-4B's 2560) with
``--double`` and ``--single`` blocks and random weights, in the ``Flux2KleinPipeline`` folder
layout. The example's code is not the project's: take it from a diffusers snapshot into a
folder outside the checkout (``--example``: the folder holding the script). It imports
torchvision, which the studio's venv lacks and which has no CPU wheel for this torch: install
the wheel beside it (``pip install --no-deps --target DIR torchvision``), and where its C ops do
not load against this torch, empty ``DIR/torchvision/_meta_registrations.py`` (the example uses
only PIL transforms); ``--df-pythonpath DIR`` puts it on the example's path alone.

Same for both: LoRA rank 4 alpha 4 (the example's defaults), AdamW, lr 1e-4 constant, no
warm-up, batch 1, 256 px (one square size, no buckets), ``--steps`` steps, seed 42, fp32
(``--mixed_precision no`` / ``training.mixed_precision = "no"``), one caption for every image
(the example's ``--instance_prompt``), prompts padded to 512 tokens (both pipelines' length),
the text read at Qwen3's layers 9, 18 and 27 (the klein pipeline's; the example's default
--text_encoder_out_layers is 10 20 30, so it is passed), and the same layers trained: the
studio's (musubi-tuner's: every Linear of the double and single blocks, image and text stream,
attention and MLP), given to the example as ``--lora_layers`` (its default trains the
attention of the image stream and the single blocks only). Each tool caches what it caches by
default: the example encodes the prompt once and runs the VAE at every step (no
``--cache_latents``; ``--df-args=--cache_latents`` measures it with its latent cache); the
studio caches the text and the latents, both before its transformer is built (a text-first
run: trainer/run/text_first.py, trainer/run/caches.py), so its steps are training steps only.

Rounds, load wait and the measures are bench/vs_example.py's: ``--reps`` rounds, the tools
alternated, one run at a time, each started once the 1-minute load average is under
``--max-load`` (or after ``--load-wait`` seconds, noted); s/step is the median of the steps
after the first, start -> step 1 is from launch to step 1's progress update, peak RSS the
largest RSS of the process tree (or the process's own ``wait4`` peak where larger); the table
gives the median of the rounds and the studio's ratios to the example.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from example_procs import cpu_kind
from vs_example import (
    CAPTION,
    add_arguments,
    build_images,
    one_run,
    report,
    rounds,
)

EXAMPLE = "train_dreambooth_lora_flux2_klein.py"
OUT_LAYERS = ("9", "18", "27")  # Flux2KleinPipeline.encode_prompt's text_encoder_out_layers
# the studio's FLUX.2 targets (trainer/families/flux2/lora.py) as the example's peft suffixes;
# a single block's attn.to_out is named whole, as the example's default does (to_out alone
# would also match the double blocks' ModuleList)
DOUBLE = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
          "to_add_out", "ff.linear_in", "ff.linear_out", "ff_context.linear_in",
          "ff_context.linear_out")


def lora_layers(single: int) -> str:
    return ",".join([*DOUBLE, "to_qkv_mlp_proj",
                     *(f"single_transformer_blocks.{i}.attn.to_out" for i in range(single))])


def example_cmd(args, model: Path, data: Path, out: Path, single: int) -> list[str]:
    return [args.df_python, str(Path(args.example) / EXAMPLE),
            f"--pretrained_model_name_or_path={model}", f"--instance_data_dir={data}",
            f"--instance_prompt={CAPTION}", "--resolution=256", "--rank=4", "--lora_alpha=4",
            f"--lora_layers={lora_layers(single)}", "--text_encoder_out_layers", *OUT_LAYERS,
            "--max_sequence_length=512", "--train_batch_size=1",
            f"--max_train_steps={args.steps}", "--learning_rate=1e-4",
            "--lr_scheduler=constant", "--lr_warmup_steps=0", "--seed=42",
            "--mixed_precision=no", "--dataloader_num_workers=0",
            "--checkpointing_steps=100000", f"--output_dir={out}", *args.df_args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, EXAMPLE, "/tmp/kbench")
    parser.add_argument("--double", type=int, default=2, help="double-stream blocks (real: 5)")
    parser.add_argument("--single", type=int, default=2, help="single-stream blocks (real: 20)")
    args = parser.parse_args()
    model = Path(args.work) / "k" / "model"
    if not (model / "model_index.json").exists():
        from flux2_klein_model import build_model

        build_model(model, args.double, args.single)
        build_images(model.parent)
    config = json.loads((model / "transformer/config.json").read_text())
    double, single = config["num_layers"], config["num_single_layers"]
    print(f"model: {model} ({double} double, {single} single blocks); CPU: {cpu_kind()}; "
          f"threads: {args.threads or 'each tool its own'}")
    done = rounds(args, lambda tool, rep: one_run(
        args, tool, rep, model, Path(args.work) / "k",
        lambda images, out: example_cmd(args, model, images, out, single)))
    report(done, args, f"FLUX.2 klein 4B width LoRA ({double} double + {single} single "
                       f"blocks), 256 px, fp32, batch 1")


if __name__ == "__main__":
    main()
