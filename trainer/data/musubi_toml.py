"""musubi-tuner's dataset TOML (kohya-ss/musubi-tuner ``docs/dataset_config.md``,
``src/musubi_tuner/dataset/config_utils.py``) read as sd-scripts' (trainer/data/dataset_toml.py).

musubi-tuner writes one folder per ``[[datasets]]`` (no subsets): ``image_directory`` (or
``image_jsonl_file``, ``video_directory``, ``video_jsonl_file``), its ``cache_directory``, and
the options its ``[general]`` may set for all (``resolution``, ``caption_extension``,
``batch_size``, ``num_repeats``, ``enable_bucket``, ``bucket_no_upscale``). The form is told by
those keys; :func:`as_sd_scripts` turns each such dataset into an sd-scripts ``[[datasets]]``
with one ``[[datasets.subsets]]`` whose ``image_dir`` is the ``image_directory``, so that every
value then has the sd-scripts form's checks and fallbacks (an unset option comes from the run's
``dataset`` section, not from musubi-tuner's built-in 960x544 without buckets).

``cache_directory`` is accepted and not used: the latent cache is ``dataset.cache_dir``. A
dataset's ``control_directory`` (edit training's control images) becomes its subset's, and
``control_resolution`` / ``no_resize_control`` stay options of the dataset (or ``[general]``)
that its subset inherits (trainer/data/controls.py, control_sizing.py). Video datasets,
Qwen-Image-Layered's ``multiple_target``, FramePack's options and metadata JSONL files are
refused, each with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.data.errors import DatasetTomlError

VIDEO = "video datasets are not trained here yet; keep to image datasets (image_directory)"
FRAMEPACK = "a FramePack option; remove it"
REFUSED = {
    **{key: VIDEO for key in ("video_directory", "video_jsonl_file", "target_frames",
                              "frame_extraction", "frame_stride", "frame_sample", "max_frames",
                              "source_fps")},
    **{key: FRAMEPACK for key in ("fp_latent_window_size", "fp_1f_clean_indices",
                                  "fp_1f_target_index", "fp_1f_no_post")},
    "multiple_target": "Qwen-Image-Layered training (several target images) is not supported",
    "image_jsonl_file": "metadata JSONL files are not read; put the images in a folder with a "
                        "caption file beside each (image1.png + image1.txt) and set "
                        "image_directory",
}
IGNORED = ("cache_directory",)  # the latent cache is dataset.cache_dir
SUBSET = ("control_directory",)  # a folder of the dataset's one subset
# musubi-tuner's older names of the control options, read as the new ones (as it does)
RENAMED = {"flux_kontext_no_resize_control": "no_resize_control",
           "qwen_image_edit_no_resize_control": "no_resize_control",
           "qwen_image_edit_control_resolution": "control_resolution"}
MUSUBI_KEYS = ("image_directory", *IGNORED, *SUBSET, *RENAMED, *REFUSED)


def _renamed(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` with the older control option names renamed; a new name set beside its old
    one wins."""
    out = {RENAMED.get(k, k): v for k, v in table.items() if k not in RENAMED}
    for old, new in RENAMED.items():
        if old in table and new not in table:
            out[new] = table[old]
    return out


def is_musubi(raw: dict[str, Any]) -> bool:
    """musubi-tuner's form: a ``[[datasets]]`` with one of its keys and no subsets."""
    datasets = raw.get("datasets")
    if not isinstance(datasets, list):
        return False
    tables = [d for d in datasets if isinstance(d, dict)]
    return any(k in d for d in tables for k in MUSUBI_KEYS) and \
        not any("subsets" in d for d in tables)


def _dataset(where: str, table: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """One musubi-tuner ``[[datasets]]`` as an sd-scripts one with a single subset."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in REFUSED:
            problems.append(f"{where}.{key}: musubi-tuner's {key}: {REFUSED[key]}")
        elif key not in IGNORED and key != "image_directory" and key not in SUBSET:
            out[key] = value  # the sd-scripts form's checks name a bad key or value
    folder = table.get("image_directory")
    if folder is None:
        if not any(k in table for k in REFUSED):
            problems.append(f"{where}.image_directory: required (the folder of its images)")
        return out
    if not isinstance(folder, str) or not folder.strip():
        problems.append(f"{where}.image_directory = {folder!r}: must be a non-empty string")
        return out
    out["subsets"] = [{"image_dir": folder, **{k: table[k] for k in SUBSET if k in table}}]
    return out


def as_sd_scripts(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """``raw`` itself when it is in sd-scripts' form, else musubi-tuner's form converted to it;
    raises DatasetTomlError naming every refused key."""
    if not is_musubi(raw):
        return raw
    problems: list[str] = []
    general = raw.get("general", {})
    if isinstance(general, dict):
        general = _renamed(general)
        problems += [f"general.{key}: musubi-tuner's {key}: {REFUSED[key]}"
                     for key in general if key in REFUSED]
    datasets = [_dataset(f"datasets[{i}]", _renamed(table), problems)
                if isinstance(table, dict) else table for i, table in enumerate(raw["datasets"])]
    if problems:
        raise DatasetTomlError(problems, path)
    return {**raw, "datasets": datasets, **({"general": general} if "general" in raw else {})}
