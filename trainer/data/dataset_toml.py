"""sd-scripts' dataset TOML (``dataset.dataset_config``): its folders and their options.

The file has the layout that kohya-ss/sd-scripts documents in docs/config_README-en.md: a
``[general]`` table, ``[[datasets]]`` (per-dataset: resolution, batch_size and the bucket
options) and their ``[[datasets.subsets]]`` (one image folder each, with its repeats, class
tokens, caption and augmentation options). As in sd-scripts (library/config_util.py, whose key
sets this module follows for DreamBooth-style datasets with caption dropout), a value comes from
the subset, its dataset, ``[general]``, the run's ``dataset`` section (sd-scripts' command line),
then the built-in default. Differences (docs/dataset_toml.md): fine-tuning subsets and a few
options are refused by name; every ``batch_size`` must equal ``training.train_batch_size``; a
relative ``image_dir`` is read from the TOML's folder; ``cache_info`` is accepted and ignored.
musubi-tuner's image-dataset TOML is read too, converted to this form (trainer/data/musubi_toml.py).
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from trainer.config import DatasetSection, TrainingSection
from trainer.data.buckets import BucketSpec
from trainer.data.captions import CaptionOptions
from trainer.data.discover import Candidate, ConceptFolder, SubsetOptions, scan_folder
from trainer.data.errors import DatasetTomlError
from trainer.data.musubi_toml import as_sd_scripts

FIELD = "dataset.dataset_config"

# Options of a whole dataset: in [general] and [[datasets]].
DATASET_KEYS = ("batch_size", "resolution", "enable_bucket", "min_bucket_reso",
                "max_bucket_reso", "bucket_reso_steps", "bucket_no_upscale")
# Options of a subset that [general] and [[datasets]] may set for all their subsets.
SHARED_KEYS = ("num_repeats", "class_tokens", "caption_extension", "shuffle_caption",
               "keep_tokens", "keep_tokens_separator", "caption_prefix", "caption_suffix",
               "caption_dropout_rate", "caption_tag_dropout_rate",
               "caption_dropout_every_n_epochs", "flip_aug", "color_aug", "random_crop",
               "cache_info", "enable_wildcard", "control_resolution", "no_resize_control")
# Options of one subset only.
SUBSET_KEYS = ("image_dir", "is_reg", "alpha_mask", "conditioning_data_dir", "control_directory")
# The run's ``dataset`` section fields that a subset or dataset inherits when the TOML is silent.
FROM_SECTION = ("caption_extension", "shuffle_caption", "keep_tokens", "enable_wildcard",
                "caption_prefix", "caption_suffix", "caption_dropout_rate",
                "caption_tag_dropout_rate", "flip_aug", "color_aug", "random_crop", "resolution",
                "enable_bucket", "min_bucket_reso", "max_bucket_reso", "bucket_reso_steps",
                "bucket_no_upscale", "alpha_mask")
UNSUPPORTED = {  # sd-scripts' options that this trainer does not have, and what to do instead
    "metadata_file": "fine-tuning subsets (a metadata JSON); use image_dir with caption files "
                     "beside the images",
    "face_crop_aug_range": "face-crop augmentation; remove it",
    "caption_separator": "captions are always split at commas; remove it",
    "secondary_separator": "secondary separators; remove it",
    "token_warmup_min": "token warm-up; remove it",
    "token_warmup_step": "token warm-up; remove it",
    "custom_attributes": "custom attributes; remove them",
    "resize_interpolation": "a choice of resize filter; remove it",
    "network_multiplier": "a per-dataset network multiplier; remove it",
    "validation_split": "per dataset; set dataset.validation_split in the training config",
    "validation_seed": "the held-out images follow training.seed; remove it",
}
MAX_REPEATS = 100_000


@dataclass(frozen=True)
class Subset:
    """One ``[[datasets.subsets]]`` with every option resolved."""

    where: str  # "datasets[0].subsets[1]"
    image_dir: Path
    repeats: int
    class_tokens: Optional[str]
    caption_extension: str
    is_reg: bool
    options: SubsetOptions  # alpha_mask and mask_dir (conditioning_data_dir) included


@dataclass(frozen=True)
class DatasetToml:
    path: Path
    subsets: list[Subset]
    batch_sizes: dict[str, int]  # "datasets[i].batch_size" -> value, where the TOML sets one


def _unknown(where: str, key: str, allowed: tuple[str, ...]) -> str:
    """The message for ``key`` that ``where`` does not take, with the reason or a suggestion."""
    name = f"{where}.{key}" if where else key
    if key in UNSUPPORTED:
        return f"{name}: an sd-scripts option that this trainer does not support " \
               f"({UNSUPPORTED[key]})"
    if key in SUBSET_KEYS:
        return f"{name}: a per-subset option: set it in [[datasets.subsets]]"
    if key in DATASET_KEYS:
        return f"{name}: a per-dataset option: set it in [[datasets]] or [general]"
    match = difflib.get_close_matches(key, [*allowed, *UNSUPPORTED], n=1, cutoff=0.6)
    return f"{name}: unknown key" + (f"; did you mean {match[0]}?" if match else "")


def _check_keys(table: Mapping[str, Any], where: str, allowed: tuple[str, ...],
                problems: list[str]) -> None:
    for key in table:
        if key not in allowed:
            problems.append(_unknown(where, key, allowed))


def _section_value(key: str, value: Any, name: str, problems: list[str]) -> None:
    """Check ``value`` against the schema field of the same name (bounds and type)."""
    from trainer.config.files import _describe

    section, field = (TrainingSection, "train_batch_size") if key == "batch_size" \
        else (DatasetSection, key)
    try:
        section.model_validate({field: value})
    except ValidationError as exc:
        problems += [_describe({**err, "loc": (name,)}) for err in exc.errors()]


def _check_value(key: str, value: Any, name: str, problems: list[str]) -> None:
    """Problems with the value of one key (``name`` is its place, e.g. datasets[0].x)."""
    def want(ok: bool, what: str) -> None:
        if not ok:
            problems.append(f"{name} = {value!r}: must be {what}")

    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in ("resolution", "control_resolution"):  # musubi-tuner's edit controls' too
        sides = value if isinstance(value, list) else [value]
        want(len(sides) in (1, 2), "an int or [width, height]")
        for side in sides[:2]:
            _section_value("resolution", side, name, problems)
    elif key == "batch_size" or key in FROM_SECTION:
        _section_value(key, value, name, problems)
    elif key == "num_repeats":
        want(is_int and 1 <= value <= MAX_REPEATS, f"an integer from 1 to {MAX_REPEATS}")
    elif key == "caption_dropout_every_n_epochs":
        want(is_int and value >= 0, "an integer >= 0 (0 = off)")
    elif key in ("is_reg", "cache_info", "no_resize_control"):
        want(isinstance(value, bool), "true or false")
    elif key in ("image_dir", "conditioning_data_dir", "control_directory",
                 "keep_tokens_separator"):
        want(isinstance(value, str) and value.strip() != "", "a non-empty string")
    elif key == "class_tokens":
        want(isinstance(value, str), "a string")


def _tables(value: Any, name: str, table: str, problems: list[str]) -> list[dict[str, Any]]:
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    problems.append(f"{name}: must be an array of tables ([[{table}]])")
    return []


def read_toml(path: Path) -> dict[str, Any]:
    """The raw TOML of ``path`` in sd-scripts' form (musubi-tuner's form converted to it,
    trainer/data/musubi_toml.py); a missing or broken file raises DatasetTomlError."""
    from trainer.config import files as config_io

    if not path.exists():
        raise DatasetTomlError(["file not found; check dataset.dataset_config"], path)
    try:  # the size, UTF-8, TOML, nesting and number checks of every config file
        raw = config_io.load_toml_text(config_io.read_config_text(path), str(path))
    except config_io.ConfigError as exc:
        raise DatasetTomlError(exc.problems, path) from None
    return as_sd_scripts(raw, path)


def _validated(raw: dict[str, Any], problems: list[str]) -> tuple[dict, list[dict]]:
    """([general], [[datasets]] each with its "subsets") after checking every key and value."""
    _check_keys(raw, "", ("general", "datasets"), problems)
    general = raw.get("general", {})
    if not isinstance(general, dict):
        problems.append("general: must be a table ([general])")
        general = {}
    _check_keys(general, "general", DATASET_KEYS + SHARED_KEYS, problems)
    checked = [("general", general)]
    datasets = _tables(raw.get("datasets", []), "datasets", "datasets", problems)
    if "datasets" not in raw:
        problems.append("datasets: no [[datasets]] table; add one with its "
                        "[[datasets.subsets]] (each an image_dir)")
    for i, dataset in enumerate(datasets):
        where = f"datasets[{i}]"
        _check_keys(dataset, where, DATASET_KEYS + SHARED_KEYS + ("subsets",), problems)
        checked.append((where, dataset))
        subsets = _tables(dataset.get("subsets", []), f"{where}.subsets", "datasets.subsets",
                          problems)
        if not subsets:
            problems.append(f"{where}: no [[datasets.subsets]]; add one with an image_dir")
        dataset["subsets"] = subsets
        for j, subset in enumerate(subsets):
            sub_where = f"{where}.subsets[{j}]"
            _check_keys(subset, sub_where, SUBSET_KEYS + SHARED_KEYS, problems)
            checked.append((sub_where, subset))
            if "image_dir" not in subset and "metadata_file" not in subset:
                problems.append(f"{sub_where}.image_dir: required (the folder of its images)")
    for where, table in checked:
        for key, value in table.items():
            if key != "subsets" and key not in UNSUPPORTED:
                _check_value(key, value, f"{where}.{key}", problems)
    return general, datasets


def _lookup(key: str, levels: list[dict[str, Any]], default: Any) -> Any:
    """sd-scripts' fallback: the first level (subset, dataset, general) that sets ``key``."""
    for level in levels:
        if key in level:
            return level[key]
    return default


def _spec(levels: list[dict[str, Any]], ds: Any) -> BucketSpec:
    def get(key: str) -> Any:
        return _lookup(key, levels, getattr(ds, key))

    res = get("resolution")
    width, height = (res, res) if isinstance(res, int) else (res[0], res[-1])
    return BucketSpec(resolution=width, height=height if height != width else None,
                      enabled=get("enable_bucket"), min_side=get("min_bucket_reso"),
                      max_side=get("max_bucket_reso"), step=get("bucket_reso_steps"),
                      no_upscale=get("bucket_no_upscale"))


def _folder(base: Path, value: Optional[str]) -> Optional[Path]:
    path = Path(value).expanduser() if value else None
    return path if path is None or path.is_absolute() else base / path


def _subset(where: str, levels: list[dict[str, Any]], index: int, spec: BucketSpec, ds: Any,
            base: Path) -> Subset:
    def get(key: str, default: Any = None) -> Any:
        return _lookup(key, levels, getattr(ds, key, default))

    caption = CaptionOptions(
        shuffle=get("shuffle_caption"), keep_tokens=get("keep_tokens"),
        dropout_rate=get("caption_dropout_rate"),
        tag_dropout_rate=get("caption_tag_dropout_rate"),
        prefix=get("caption_prefix"), suffix=get("caption_suffix"),
        keep_tokens_separator=get("keep_tokens_separator"),
        dropout_every_n_epochs=get("caption_dropout_every_n_epochs") or None,
        wildcard="random" if get("enable_wildcard") else "off")
    options = SubsetOptions(caption, spec, flip_aug=get("flip_aug"), color_aug=get("color_aug"),
                            random_crop=get("random_crop"), dataset=index, where=where,
                            alpha_mask=bool(get("alpha_mask", False)),
                            mask_dir=_folder(base, levels[0].get("conditioning_data_dir")),
                            control_dir=_folder(base, levels[0].get("control_directory")),
                            control_resolution=_lookup("control_resolution", levels, None),
                            no_resize_control=bool(_lookup("no_resize_control", levels, False)))
    repeats = _lookup("num_repeats", levels, ds.dataset_repeats or 1)  # sd-scripts' fallback
    return Subset(where, _folder(base, levels[0]["image_dir"]), repeats,
                  get("class_tokens"), get("caption_extension"), bool(get("is_reg", False)),
                  options)


def _batch_problems(sizes: dict[str, int], cfg: Any) -> list[str]:
    """Every dataset must have the run's one batch size."""
    want = cfg.training.train_batch_size
    return [f"{name} = {value} differs from training.train_batch_size = {want}: a run has one "
            f"batch size; set training.train_batch_size = {value} or change or remove "
            f"{name}" for name, value in sizes.items() if value != want]


def load_dataset_toml(path: Path, cfg: Any) -> DatasetToml:
    """Read, check and resolve the dataset TOML at ``path`` for the run ``cfg``; raises
    DatasetTomlError listing every problem (unknown keys, bad values, batch sizes)."""
    raw = read_toml(path)
    problems: list[str] = []
    general, datasets = _validated(raw, problems)
    if problems:
        raise DatasetTomlError(problems, path)
    ds, subsets, sizes = cfg.dataset, [], {}
    for i, dataset in enumerate(datasets):
        spec = _spec([dataset, general], ds)
        if spec.min_side > spec.max_side:
            problems.append(f"datasets[{i}]: min_bucket_reso ({spec.min_side}) is larger than "
                            f"max_bucket_reso ({spec.max_side})")
        size = _lookup("batch_size", [dataset, general], None)
        if size is not None:
            sizes[f"datasets[{i}].batch_size"] = size
        for j, subset in enumerate(dataset["subsets"]):
            where = f"datasets[{i}].subsets[{j}]"
            subsets.append(_subset(where, [subset, dataset, general], i, spec, ds,
                                   path.parent))
    problems += _batch_problems(sizes, cfg)
    if problems:
        raise DatasetTomlError(problems, path)
    return DatasetToml(path, subsets, sizes)


def _run_problems(toml: DatasetToml, cfg: Any) -> list[str]:
    """Subset options that this run's other settings rule out."""
    ds, problems = cfg.dataset, []
    for sub in toml.subsets:
        if sub.is_reg and cfg.mode == "textual_inversion":
            problems.append(f"{sub.where}.is_reg: regularization images are not used in "
                            f"textual_inversion mode (only the token learns); remove the subset")
        if sub.options.random_crop and ds.cache_latents:
            problems.append(f"{sub.where}.random_crop cannot be used with "
                            f"dataset.cache_latents: cached latents hold one fixed crop per "
                            f"image; turn one of them off")
        if not sub.options.caption.is_static and ds.cache_text_encoder_outputs:
            problems.append(f"dataset.cache_text_encoder_outputs is on, but {sub.where} "
                            f"changes its captions per step (shuffle or caption dropout)")
        if (sub.options.alpha_mask or sub.options.mask_dir) and not cfg.training.masked_loss:
            key = "alpha_mask" if sub.options.alpha_mask else "conditioning_data_dir"
            problems.append(f"{sub.where}.{key} is set but training.masked_loss is off: the "
                            f"mask would not be used; turn masked_loss on or remove it")
    return problems


def _scan(sub: Subset, seen: set[Path], warn: Callable[[str], None],
          problems: list[str]) -> list[Candidate]:
    """The images of one subset; a folder already read in its dataset is skipped (sd-scripts:
    a duplicate subset is ignored)."""
    where = f"{sub.where}.image_dir"
    if not sub.image_dir.is_dir():
        what = "does not exist" if not sub.image_dir.exists() else "is not a folder"
        problems.append(f"{where}: {sub.image_dir} {what} (a relative image_dir is read from "
                        f"the TOML file's folder); set it to the folder that holds the images")
        return []
    key = sub.image_dir.resolve()
    if key in seen:
        warn(f"{where}: {sub.image_dir} is already a subset of this dataset; skipped")
        return []
    seen.add(key)
    folder = ConceptFolder(sub.image_dir, sub.repeats, sub.class_tokens or "", sub.options)
    found = scan_folder(folder, sub.caption_extension, sub.is_reg, problems)
    if not found:
        problems.append(f"{where}: no images in {sub.image_dir}; it needs .png, .jpg, .jpeg, "
                        f".webp or .bmp images directly inside (not in subfolders)")
    bare = [c.path.name for c in found if not c.path.with_suffix(sub.caption_extension).is_file()]
    if bare and sub.class_tokens is None:
        problems.append(f"{sub.where}.class_tokens: not set, and {len(bare)} image(s) have no "
                        f"{sub.caption_extension} caption file (e.g. {bare[0]}); set "
                        f"class_tokens or add caption files")
    return found


def dataset_candidates(cfg: Any, warn: Callable[[str], None], problems: list[str]
                       ) -> tuple[list[Candidate], Path]:
    """The images of ``cfg.dataset.dataset_config``, their folder options attached, and the
    TOML's folder (the default home of the latent cache); problems are appended, not raised,
    each naming the file and the key."""
    path = Path(cfg.dataset.dataset_config).expanduser()
    try:
        toml = load_dataset_toml(path, cfg)
    except DatasetTomlError as exc:
        problems += [f"{FIELD} ({path}): {p}" for p in exc.problems]
        return [], path.parent
    mine: list[str] = _run_problems(toml, cfg)
    found: list[Candidate] = []
    seen: dict[int, set[Path]] = {}
    for sub in toml.subsets:
        found += _scan(sub, seen.setdefault(sub.options.dataset, set()), warn, mine)
    problems += [f"{FIELD} ({path}): {p}" for p in mine]
    return found, path.parent


def _mask_source(entry: Any, missing: dict[str, list[Path]]) -> Any:
    from trainer.data.masks import MaskSource, mask_file_for

    opts = entry.folder.options
    if entry.is_reg or opts is None or not (opts.alpha_mask or opts.mask_dir):
        return None  # trains everywhere
    if opts.alpha_mask:
        return MaskSource("alpha", entry.path, "alpha")
    found = mask_file_for(entry.path, entry.folder.path.name, opts.mask_dir)
    if found is None:
        missing.setdefault(opts.where, []).append(entry.path)
        return None
    return MaskSource("file", found, "file:" + hashlib.sha256(found.read_bytes()).hexdigest())


def subset_masks(cfg: Any, entries: list[Any], problems: list[str]) -> Optional[list]:
    """training.masked_loss with a dataset TOML: each entry's mask source (None: trains
    everywhere) from its subset's alpha_mask (default dataset.alpha_mask) or
    conditioning_data_dir (mask images named like the images, as sd-scripts reads them)."""
    if not cfg.training.masked_loss:
        return None
    where = f"{FIELD} ({Path(cfg.dataset.dataset_config).expanduser()})"
    missing: dict[str, list[Path]] = {}
    dirs = {e.folder.options.where: e.folder.options.mask_dir for e in entries
            if e.folder.options and e.folder.options.mask_dir}
    for sub, folder in dirs.items():
        if not folder.is_dir():
            problems.append(f"{where}: {sub}.conditioning_data_dir: folder {folder} does "
                            f"not exist")
    if len(dirs) != sum(1 for f in dirs.values() if f.is_dir()):
        return None
    sources = [_mask_source(e, missing) for e in entries]
    for sub, paths in missing.items():
        problems.append(f"{where}: {sub}.conditioning_data_dir: no mask in {dirs[sub]} for "
                        f"{len(paths)} image(s), e.g. {paths[0].name}; add a grayscale image "
                        f"of the same name (white = train) for each")
    if not any(sources):
        problems.append(f"{where}: training.masked_loss is on, but no subset has a mask: set "
                        f"alpha_mask = true or conditioning_data_dir in its [[datasets.subsets]]")
    return sources
