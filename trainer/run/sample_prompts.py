"""Sample prompts as sd-scripts reads them (library/train_util.py ``line_to_prompt_dict`` and
``load_prompts``), and the samplers it offers (``get_my_scheduler``) as diffusers schedulers.

A prompt line may carry options after `` --``: ``--n`` negative prompt, ``--w`` / ``--h`` size,
``--d`` seed, ``--l`` guidance scale, ``--s`` steps (clamped to 1..1000), ``--ss`` sampler, and
for an edit model ``--ci`` a control (reference) image's path, once per reference
(musubi-tuner's option; its files' key ``control_image_path``, a path or a list); an option
that does not parse is ignored, as in sd-scripts. ``sampling.sample_prompts_file`` names
a ``.txt`` file (a line per prompt, ``#`` lines skipped), a ``.toml`` file (``[prompt]`` defaults
and ``[[prompt.subset]]`` prompts) or a ``.json`` list (of lines or of dicts with sd-scripts'
keys: prompt, negative_prompt, width, height, seed, sample_steps, scale, sample_sampler). The
sides are rounded down to a multiple of 8 (at least 64), as sd-scripts does. What a prompt does
not say comes from the [sampling] section, the side from dataset.resolution.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

# sd-scripts' sampler names -> (diffusers scheduler class, extra config)
SAMPLERS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddim": ("DDIMScheduler", {}),
    "pndm": ("PNDMScheduler", {}),
    "lms": ("LMSDiscreteScheduler", {}),
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}),
    "dpm_2": ("KDPM2DiscreteScheduler", {}),
    "dpm_2_a": ("KDPM2AncestralDiscreteScheduler", {}),
    "dpmsolver": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver"}),
    "dpmsolver++": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++"}),
    "dpmsingle": ("DPMSolverSinglestepScheduler", {}),
}
ALIASES = {"k_lms": "lms", "k_euler": "euler", "k_euler_a": "euler_a", "k_dpm_2": "dpm_2",
           "k_dpm_2_a": "dpm_2_a"}


def sampler_name(name: str) -> Optional[str]:
    """Our name of an sd-scripts sampler spelling (``k_euler_a`` -> ``euler_a``), or None."""
    name = ALIASES.get(name.strip().lower(), name.strip().lower())
    return name if name in SAMPLERS else None


@dataclass(frozen=True)
class SamplePrompt:
    prompt: str
    negative_prompt: Optional[str] = None
    width: Optional[int] = None
    height: Optional[int] = None
    seed: Optional[int] = None
    steps: Optional[int] = None
    scale: Optional[float] = None
    sampler: Optional[str] = None
    control_images: tuple[str, ...] = ()  # edit models' references (--ci), in order


_OPTIONS = (  # (pattern, field, convert), in sd-scripts' order of trying
    (r"w (\d+)", "width", int), (r"h (\d+)", "height", int), (r"d (\d+)", "seed", int),
    (r"s (\d+)", "steps", lambda v: max(1, min(1000, int(v)))),
    (r"l ([\d\.]+)", "scale", float), (r"n (.+)", "negative_prompt", str),
    (r"ss (.+)", "sampler", str), (r"ci (.+)", "control_images", str.strip),
)


def parse_line(line: str) -> SamplePrompt:
    """One prompt line with its ``--x value`` options."""
    parts = line.split(" --")
    values: dict[str, Any] = {}
    for part in parts[1:]:
        for pattern, name, convert in _OPTIONS:
            match = re.match(pattern, part, re.IGNORECASE)
            if match:
                try:
                    value = convert(match.group(1))
                    if name == "control_images":  # one per --ci, in order
                        value = (*values.get(name, ()), value)
                    values[name] = value
                except ValueError:
                    pass  # sd-scripts logs and skips an option it cannot read
                break
    return SamplePrompt(parts[0].strip(), **values)


_KEYS = {"prompt": "prompt", "negative_prompt": "negative_prompt", "width": "width",
         "height": "height", "seed": "seed", "sample_steps": "steps", "scale": "scale",
         "sample_sampler": "sampler"}


def from_dict(item: dict[str, Any]) -> SamplePrompt:
    """A prompt of a .toml / .json file, in sd-scripts' keys (others are ignored)."""
    values = {ours: item[theirs] for theirs, ours in _KEYS.items() if theirs in item}
    if "steps" in values:
        values["steps"] = max(1, min(1000, int(values["steps"])))
    controls = item.get("control_image_path")  # musubi-tuner's key: a path or a list
    if controls:
        values["control_images"] = (controls,) if isinstance(controls, str) else tuple(controls)
    return SamplePrompt(**{"prompt": "", **values})


def read_prompt_file(path: str | Path) -> list[SamplePrompt]:
    """The prompts of a .txt, .toml or .json prompt file (sd-scripts' ``load_prompts``)."""
    path = Path(path).expanduser()
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib

        head = tomllib.loads(text)["prompt"]
        base = {k: v for k, v in head.items() if k != "subset"}
        items: list[Any] = [{**base, **sub} for sub in head.get("subset", [])]
    elif suffix == ".json":
        items = json.loads(text)
    else:
        items = [ln.strip() for ln in text.splitlines() if ln.strip() and ln[0] != "#"]
    return [parse_line(i) if isinstance(i, str) else from_dict(i) for i in items]


def sample_prompts(cfg: Any) -> list[SamplePrompt]:
    """Every prompt of the run: the config's lines, then the prompt file's."""
    sm = cfg.sampling
    out = [parse_line(line) for line in sm.sample_prompts if line.strip()]
    if sm.sample_prompts_file:
        out += read_prompt_file(sm.sample_prompts_file)
    return out


def side(value: Optional[int], default: int) -> int:
    """sd-scripts rounds each side down to a multiple of 8, at least 64."""
    value = default if value is None else value
    return max(64, value - value % 8)


def make_scheduler(name: str, config: dict[str, Any]) -> Any:
    """The diffusers scheduler of sampler ``name`` on the training noise schedule ``config``;
    an unknown name falls back to DDIM, as in sd-scripts."""
    import diffusers

    cls, extra = SAMPLERS.get(sampler_name(name) or "ddim")
    return getattr(diffusers, cls).from_config({**config, **extra})
