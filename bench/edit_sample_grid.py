"""Train a tiny edit LoRA from the CLI and show what its samples make of their controls: one PNG
grid per sample prompt, control | target | sample, with labels.

The run is ``python -m trainer train`` on an edit preset (``presets/lora/tiny-flux-kontext.toml``
by default, or ``tiny-qwen-image-edit.toml``) whose sample prompts are the dataset's captions,
each with its control image (``--ci``, from the preset's ``dataset.control_dir``), sampled at
the last step; ``--row "caption=>control.png"`` adds a prompt of your own (its target cell then
says there is none). The target is the dataset image whose caption is the prompt's, if any.
The grids and the run's outputs go into ``--out`` (default /tmp/edit_grid), which it prints.

    .venv/bin/python bench/edit_sample_grid.py [--preset tiny-qwen-image-edit] [--rows 3]

Both edit pipelines resize a control to about 1024 x 1024 before the VAE (as diffusers does),
so each sample of the tiny models takes seconds on a CPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CELL = 192  # each picture's height in the grid
LABEL = 18  # the label strip above each picture
GAP = 6
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def dataset_rows(cfg, count: int) -> list[tuple[str, Path, Optional[Path]]]:
    """(caption, control, target) of the first ``count`` training images that have a control
    in the config's ``dataset.control_dir`` (read from ``dataset.train_data_dir``)."""
    from trainer.config.paths import data_home
    from trainer.data.sample import resolve_dataset_dir

    train = resolve_dataset_dir(cfg.dataset.train_data_dir, data_home())
    controls = (train / cfg.dataset.control_dir).resolve()
    rows = []
    for image in sorted(p for p in train.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES):
        caption_file = image.with_suffix(".txt")
        found = [c for c in controls.rglob(image.stem + ".*") if c.suffix.lower() in
                 IMAGE_SUFFIXES]
        if caption_file.is_file() and found:
            rows.append((caption_file.read_text(encoding="utf-8").strip(), found[0], image))
        if len(rows) == count:
            break
    return rows


def target_of(cfg, caption: str) -> Optional[Path]:
    """The dataset image whose caption is ``caption``, if any."""
    from trainer.config.paths import data_home
    from trainer.data.sample import resolve_dataset_dir

    train = resolve_dataset_dir(cfg.dataset.train_data_dir, data_home())
    for text in sorted(train.rglob("*.txt")):
        if text.read_text(encoding="utf-8").strip() == caption:
            image = next((text.with_suffix(s) for s in IMAGE_SUFFIXES
                          if text.with_suffix(s).is_file()), None)
            if image is not None:
                return image
    return None


def write_config(preset: Path, out: Path, rows, steps: Optional[int], sample_steps: int,
                 seed: int) -> tuple[Path, int]:
    """The preset with the rows' sample prompts, sampled once at the last step, into
    ``out/config.toml``; (its path, the step the samples are drawn at)."""
    import tomli_w

    from trainer.config.files import from_dict, load, to_dict

    raw = to_dict(load(preset, [f"saving.output_dir={out / 'run'}", "training.log_with=none"]))
    if steps is not None:
        raw["training"]["max_train_steps"] = steps
    last = total_steps(from_dict(raw))
    raw["sampling"]["sample_prompts"] = [f"{caption} --ci {control} --d {seed} --s "
                                         f"{sample_steps}" for caption, control, _ in rows]
    raw["sampling"]["sample_every_n_steps"] = last
    path = out / "config.toml"
    path.write_text(tomli_w.dumps(raw), encoding="utf-8")
    return path, last


def total_steps(cfg) -> int:
    """The run's steps, as the run plans them from the dataset and the preset."""
    from trainer.config.paths import data_home
    from trainer.config.plan import plan_steps
    from trainer.data import prepare_dataset

    tr = cfg.training
    data = prepare_dataset(cfg, lambda _: None, data_home=data_home())
    return plan_steps(data.steps_per_epoch(tr.train_batch_size), tr.gradient_accumulation_steps,
                      tr.max_train_steps, tr.max_train_epochs).total_steps


def cell(path: Optional[Path], title: str):
    """One labelled picture (or a grey 'none' box) of height CELL + LABEL."""
    from PIL import Image, ImageDraw

    if path is None:
        picture = Image.new("RGB", (CELL, CELL), (90, 90, 90))
        ImageDraw.Draw(picture).text((8, CELL // 2 - 6), "none", fill=(230, 230, 230))
    else:
        with Image.open(path) as img:
            picture = img.convert("RGB")
        picture = picture.resize((max(1, round(picture.width * CELL / picture.height)), CELL),
                                 Image.NEAREST if picture.height < CELL else Image.LANCZOS)
    out = Image.new("RGB", (max(picture.width, 8 * len(title)), CELL + LABEL), "white")
    ImageDraw.Draw(out).text((4, 3), title, fill="black")
    out.paste(picture, (0, LABEL))
    return out


def grid(row: tuple[str, Path, Optional[Path]], sample: Path, step: int, path: Path) -> Path:
    """control | target | sample side by side, the prompt under them."""
    from PIL import Image, ImageDraw

    caption, control, target = row
    cells = [cell(control, "control"), cell(target, "target" if target else "target (none)"),
             cell(sample, f"sample, step {step}")]
    width = sum(c.width for c in cells) + GAP * (len(cells) + 1)
    out = Image.new("RGB", (width, CELL + LABEL + 2 * GAP + 20), (240, 240, 240))
    x = GAP
    for c in cells:
        out.paste(c, (x, GAP))
        x += c.width + GAP
    ImageDraw.Draw(out).text((GAP, CELL + LABEL + GAP + 4), f"prompt: {caption}",
                             fill="black")
    out.save(path)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny-flux-kontext",
                        help="an edit preset of presets/lora (name or path)")
    parser.add_argument("--out", default="/tmp/edit_grid")
    parser.add_argument("--rows", type=int, default=3, help="dataset captions to sample")
    parser.add_argument("--row", action="append", default=[], metavar="CAPTION=>CONTROL",
                        help="a prompt of your own with its control image")
    parser.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    parser.add_argument("--sample-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    from trainer.config.files import load

    preset = Path(args.preset)
    if not preset.is_file():
        preset = ROOT / "presets" / "lora" / f"{args.preset.removesuffix('.toml')}.toml"
    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = load(preset, [])
    rows = dataset_rows(cfg, args.rows)
    for extra in args.row:
        caption, _, control = extra.partition("=>")
        rows.append((caption.strip(), Path(control.strip()).expanduser().resolve(),
                     target_of(cfg, caption.strip())))
    config, step = write_config(preset, out, rows, args.steps, args.sample_steps, args.seed)
    print(f"training {preset.name} for {step} steps, {len(rows)} sample prompt(s) with "
          f"controls: {config}", flush=True)
    start = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "trainer", "train", str(config)], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        return done.returncode
    print(f"trained and sampled in {time.time() - start:.0f} s")
    name = load(config, []).saving.output_name
    for i, row in enumerate(rows):
        sample = out / "run" / "sample" / f"{name}_{step:06d}_{i:02d}.png"
        print(grid(row, sample, step, out / f"grid_{i:02d}.png"))
    print(f"grids in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
