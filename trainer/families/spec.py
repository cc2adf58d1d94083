"""What a model family is, without torch: the names people and settings use, the objective, the
text encoders, the embedded twin and the variants. Each family folder declares its
:class:`FamilySpec` in its ``__init__.py``; the registry (:mod:`trainer.families`) lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "families"
Objective = Literal["ddpm", "flow"]


class ModelLoadError(ValueError):
    """A base model that cannot be loaded; the message names the setting and the file."""


class DetectionError(ModelLoadError):
    """The file is not a checkpoint of a family the studio loads; the message says what it is."""


@dataclass(frozen=True)
class Variant:
    """One release of a family: ``name`` as sd-scripts' metadata names it (``dev``,
    ``5-large``), its label, its shipped configs (a folder of ``trainer/assets/families``) and
    its T5 length where it has T5. ``version``: the value of ``model.model_version`` that names
    this variant, for a release whose single file has its family's base model's keys (a
    Qwen-Image-Edit file has Qwen-Image's: ``qwen_image_edit`` says which, as ``flux1_kontext``
    says it of a FLUX.1 Kontext file); empty: the file or the folder tells it."""

    name: str
    label: str
    asset: str
    t5_length: Optional[int] = None
    version: str = ""


@dataclass(frozen=True)
class ControlSpec:
    """Edit training: the control (reference) images one sample of a family takes beside its
    target. ``max``: at most that many (0: not an edit model); ``required``: at least that many
    (an edit model that cannot train on a target alone). ``area``: unset, every control is
    rendered with its target's resize, crop and flip (one bucket); a pixel count, each control
    is resized to about that area at its own aspect, sides on multiples of ``multiple``, as
    the family's pipeline sizes its references (flipped with its target, not cropped with it);
    with ``sizes`` too, each control is resized to the one of those (width, height) whose
    aspect is nearest its own, as a pipeline with a table of preferred resolutions does (FLUX.1
    Kontext's); with ``shrink_only``, ``area`` is a limit: a control within it keeps its size
    (sides cut to multiples of ``multiple``), a larger one is scaled down to about it (FLUX.2's
    references). Read generically by trainer/data/controls.py and the config rules."""

    max: int = 0
    required: int = 0
    # the family's text encoder reads the controls too (Qwen-Image-Edit's Qwen2.5-VL): its
    # encode takes their pixels (``encode(..., controls=...)``) and the text cache keys each
    # row by its caption and its controls (trainer/data/control_batch.py)
    text: bool = False
    area: Optional[int] = None
    multiple: int = 16
    sizes: tuple[tuple[int, int], ...] = ()
    shrink_only: bool = False
    # what the family's pipeline accepts of a control file (FLUX.2's
    # Flux2ImageProcessor.check_image_input): sides of at least ``min_side`` pixels, the long
    # side at most ``max_aspect`` times the short one (0: no limit); a file outside them trains
    # but its samples would be refused, so the dataset check refuses it before the run
    min_side: int = 0
    max_aspect: float = 0.0


@dataclass(frozen=True)
class FamilySpec:
    """A family as the config, the GUI and the registry see it.

    ``name`` is the value of ``model.model_version``; ``label`` what people read. ``folder`` is
    the package under ``trainer/families`` that holds its roles (SD 1.x and 2.x share ``sd``).
    ``denoiser`` is ``"unet"`` or ``"transformer"``; ``objective`` ``"ddpm"`` or ``"flow"``.
    ``text_encoders`` names the slots (``clip_l``, ``open_clip``, ``clip_g``, ``t5xxl``) in the
    order of the model's ``text_encoder``, ``text_encoder_2``, ...; ``part_settings`` the
    settings that name a part a single file may lack. ``pipelines`` are the diffusers pipeline
    classes whose folders hold it; ``embedded`` the id of its tiny twin; ``kohya_version`` the
    ``ss_base_model_version`` sd-scripts writes for it."""

    name: str
    label: str
    folder: str
    denoiser: Literal["unet", "transformer"]
    objective: Objective
    text_encoders: tuple[str, ...]
    embedded: Optional[str] = None
    # more embedded tiny twins of the family's variants (``embedded:tiny-flux2-dev``,
    # ``embedded:tiny-qwen-image-edit``), built by its tiny role into a folder named like the id
    more_twins: tuple[str, ...] = ()
    pipelines: tuple[str, ...] = ()
    variants: tuple[Variant, ...] = ()
    part_settings: dict[str, str] = field(default_factory=dict)
    kohya_version: str = ""
    textual_inversion: bool = True
    lycoris: bool = True
    # a plain LoRA file continues (network.network_weights with network_type "lora"): always
    # for a UNet family; a transformer family's lora role reads its own and the peers' files
    continues_lora: bool = False
    # the values of network.train_blocks its LoRA reads (the first is the default's, "all");
    # none: it has one kind of block
    train_blocks: tuple[str, ...] = ()
    controls: ControlSpec = ControlSpec()  # edit training's control images (none by default)

    @property
    def twins(self) -> tuple[str, ...]:
        """The ids of every tiny twin of the family (``embedded`` first)."""
        return ((self.embedded,) if self.embedded else ()) + self.more_twins

    @property
    def has_t5(self) -> bool:
        return "t5xxl" in self.text_encoders

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if name in (v.name, v.asset):
                return v
        known = ", ".join(v.name for v in self.variants)
        raise KeyError(f"{self.label} has no variant {name!r} (known: {known})")

    def assets(self, variant: Optional[str] = None) -> Path:
        """The shipped component configs of a variant (the first when unnamed)."""
        chosen = self.variant(variant) if variant else self.variants[0]
        return ASSETS / chosen.asset


@dataclass(frozen=True)
class Found:
    """What a base model path holds: ``family`` is a value of ``model.model_version``;
    ``header`` the detecting family's facts of a single file (its own record: the parts inside,
    the variant, shapes), for its loader."""

    family: str
    layout: str  # "diffusers folder" or "single file"
    description: str
    header: object = None

    @property
    def flow(self) -> object:
        """The header facts of a transformer family's file (None for a UNet family's)."""
        return self.header if self.objective == "flow" else None

    @property
    def unet(self) -> object:
        """The header facts of a UNet family's file (None for a transformer family's)."""
        return self.header if self.objective == "ddpm" else None

    @property
    def objective(self) -> str:
        from trainer.families import spec

        return spec(self.family).objective

    @property
    def is_flow(self) -> bool:
        return self.objective == "flow"
