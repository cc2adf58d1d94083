"""The advisor's memory and time estimates against measured runs.

    python bench/advisor_memory.py [--quick] [--model DIR]

Each case trains a few steps in a fresh process and measures its peak: on the CPU the process's
peak RSS (VmHWM: loading, caching and training, everything the process held), on a GPU
PyTorch's peak allocation (``trainer.system.device.memory_in_use``; the estimate's runtime line,
the driver's context, is left out of that comparison). The estimate is
``trainer.advisor.estimate.advise`` for the same config on the same device, computed in this
process. Cases: the tiny model
(LoRA, DreamBooth, textual inversion, SDXL LoRA) and, unless ``--quick``, a random model of
SD 1.5's size (1.07 G parameters, built once as an fp16 single file by bench/single_file.py,
about 2 GB; ``--model`` keeps it): LoRA at 256 px with and without gradient checkpointing and
at 384 px batch 4, DreamBooth with Adafactor at 128 px. Prints a markdown table (on the CPU
about 40 minutes on 2 cores, most of it the SD 1.5-size steps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from childproc import parse_or_run_child

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    ("tiny LoRA, 96 px, batch 2", "presets/lora/default.toml", []),
    ("tiny DreamBooth, 96 px, batch 2", "presets/dreambooth/default.toml",
     ["sampling.sample_prompts=[]"]),
    ("tiny textual inversion, 96 px", "presets/textual_inversion/default.toml",
     ["sampling.sample_prompts=[]"]),
    ("tiny SDXL LoRA + text encoders", "presets/lora/tiny-sdxl.toml",
     ["sampling.sample_prompts=[]"]),
]
SD15_DATA = ["dataset.min_bucket_reso=128", "dataset.max_bucket_reso=384",
             "dataset.bucket_reso_steps=64", "training.train_batch_size=1"]
LORA, DREAMBOOTH = "presets/lora/default.toml", "presets/dreambooth/default.toml"
SD15 = [
    ("SD 1.5-size LoRA, 256 px", LORA, ["dataset.resolution=256"]),
    ("SD 1.5-size LoRA, 256 px, batch 2, checkpointing", LORA,
     ["dataset.resolution=256", "training.gradient_checkpointing=true",
      "training.train_batch_size=2"]),
    ("SD 1.5-size LoRA, 384 px, batch 4", LORA,
     ["dataset.resolution=384", "dataset.max_bucket_reso=512", "training.train_batch_size=4"]),
    ("SD 1.5-size DreamBooth, Adafactor, 128 px", DREAMBOOTH,
     ["dataset.resolution=128", "optimizer.optimizer_type=\"Adafactor\"",
      "sampling.sample_prompts=[]"]),
]


def _train(preset: str, overrides: list[str]) -> dict:
    """Runs in a child: the run, its step times and its peak memory."""
    sys.path.insert(0, str(ROOT))
    from trainer.config import files as config_io
    from trainer.events import Step
    from trainer.run.loop import run
    from trainer.system.device import detect, memory_in_use

    times: list[float] = []

    class Sink:
        def emit(self, event):
            if isinstance(event, Step):
                times.append(time.perf_counter())

    result = run(config_io.load(preset, overrides), Sink())
    assert result.status == "finished", result.error
    gpu = memory_in_use(detect())  # PyTorch's peak allocation on a GPU; None on the CPU
    # from the end of the first step on: loading, caching and the first step's warm-up excluded
    rate = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
    return {"rss": peak_rss(), "gpu": gpu, "s_per_step": rate}


def peak_rss() -> int:
    """This process's peak RSS in bytes: VmHWM where Linux gives it. Not ru_maxrss: that one
    carries over the peak of the process that started this one (the kernel keeps it across
    exec), e.g. a large pytest process."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(preset: str, overrides: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps([preset, overrides])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=os.environ)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(label: str, preset: str, overrides: list[str]) -> dict:
    from trainer.advisor import estimate as advisor
    from trainer.config import files as config_io

    advice = advisor.advise(config_io.load(preset, overrides))
    if advice.memory is None:
        raise SystemExit(f"{label}: no estimate: {advice.problems}")
    got = _child(preset, overrides)
    estimate = advice.memory.peak
    measured = got["rss"]
    if got["gpu"] is not None:  # PyTorch's own count: no driver context in it
        estimate -= sum(b for what, b in advice.memory.lines if what.startswith("runtime"))
        measured = got["gpu"]
    return {"case": label, "estimate": estimate, "measured": measured,
            "phase": advice.memory.phase, "t_est": advice.timing.seconds_per_step,
            "t_meas": got["s_per_step"]}


def _sd15(folder: Path) -> Path:
    model = folder / "sd15-random.safetensors"
    if not model.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(ROOT / "bench" / "single_file.py"), "--child",
                        json.dumps(["build", str(folder)])], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    return model


def cases(args: argparse.Namespace, out: str) -> list[tuple[str, str, list[str]]]:
    common = [f"saving.output_dir={json.dumps(out)}", "training.log_with=\"none\""]
    todo = [(label, preset, extra + common + ["training.max_train_steps=8"])
            for label, preset, extra in TINY]
    if not args.quick:
        folder = Path(args.model or tempfile.mkdtemp(prefix="bench-sd15-"))
        model = _sd15(folder)
        source = [f"model.pretrained_model_name_or_path={json.dumps(str(model))}",
                  f"model.tokenizer={json.dumps(str(folder / 'tokenizer'))}"]
        todo += [(label, preset, source + SD15_DATA + extra + common
                  + ["training.max_train_steps=2"]) for label, preset, extra in SD15]
    return todo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the tiny model only")
    parser.add_argument("--model", help="a folder for the SD 1.5-size model (kept)")
    parser.add_argument("--flow", action="store_true", help="FLUX.1 / SD 3.5-size estimates "
                        "with each memory option beside sd-scripts' table (meta device, "
                        "bench/flow_advisor_table.py), then stop")
    args = parse_or_run_child(parser, _train)
    if args.flow:
        import flow_advisor_table

        flow_advisor_table.main()
        return
    os.environ.setdefault("KOHYA_STUDIO_HOME", tempfile.mkdtemp(prefix="bench-home-"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(ROOT))
    from trainer.advisor.estimate import gib
    from trainer.system.device import detect

    print(f"device: {detect().summary()}; {os.cpu_count()} cores\n")
    print("| case | peak phase | estimate | measured | error | s/step est. | s/step meas. |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, preset, overrides in cases(args, tempfile.mkdtemp(prefix="bench-out-")):
        r = measure(label, preset, overrides)
        error = (r["estimate"] - r["measured"]) / r["measured"] * 100
        print(f"| {r['case']} | {r['phase']} | {gib(r['estimate'])} | {gib(r['measured'])} | "
              f"{error:+.0f}% | {r['t_est']:.2f} | {r['t_meas']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
