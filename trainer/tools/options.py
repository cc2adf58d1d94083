"""The options of every tool, declared once: type, default, bounds and one line of help.

The CLI's arguments (:func:`add_arguments`) and the Utilities tab's labels come from these
models, and both validate through them (:func:`validate`), so a value is refused the same way,
naming the option, wherever it is typed. Required options without a default become positional
arguments on the command line; the others ``--dashed-names``.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Precision = Literal["fp16", "bf16", "fp32"]
DynamicMethod = Literal["sv_ratio", "sv_fro", "sv_cumulative"]


def option(default: Any, help: str, *, split: Optional[str] = None, **bounds: Any) -> Any:
    """An option; ``split`` says how a form's text box separates a list's items (default:
    one per line)."""
    extra = {"split": split} if split else None
    return Field(default, description=help, json_schema_extra=extra, **bounds)


class ToolOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InspectOptions(ToolOptions):
    path: str = option(..., "The LoRA, LyCORIS or embedding file (.safetensors).")
    top_tags: int = option(20, "How many of the most frequent training tags to list.",
                           ge=0, le=10_000)


class MergeOptions(ToolOptions):
    base: str = option(..., "Base model: a diffusers folder or a .safetensors checkpoint.")
    loras: list[str] = option(..., "The LoRA files to merge, in order.", min_length=1)
    weights: list[float] = option([], "The strength of each LoRA (default 1.0 each).")
    save_to: Optional[str] = option(
        None, "Write the merged model as one .safetensors checkpoint in the original layout.")
    save_folder: Optional[str] = option(None, "Write the merged model as a diffusers folder.")
    precision: Precision = option("fp16", "Precision of the saved weights.")
    config_dir: Optional[str] = option(
        None, "A diffusers folder whose configs (and tokenizer) a single-file base of an "
        "unusual shape needs.")

    @model_validator(mode="after")
    def _check(self) -> MergeOptions:
        if self.weights and len(self.weights) != len(self.loras):
            raise ValueError(f"weights: {len(self.weights)} given for {len(self.loras)} LoRAs; "
                             f"give one per LoRA or none")
        if not self.save_to and not self.save_folder:
            raise ValueError("save_to or save_folder: say where to write the merged model")
        if self.save_to and not self.save_to.endswith(".safetensors"):
            raise ValueError("save_to: the checkpoint is written as .safetensors")
        return self


class ResizeOptions(ToolOptions):
    path: str = option(..., "The LoRA file to resize (.safetensors).")
    save_to: str = option(..., "Where to write the resized LoRA (.safetensors).")
    rank: int = option(4, "New rank; with a dynamic method, the largest rank kept (FLUX.1's "
                       "fused qkv / linear1: per part, as the trainer writes them).", ge=1,
                       le=4096)
    conv_rank: Optional[int] = option(
        None, "New rank of the 3x3 convolution modules; unset uses rank.", ge=1, le=4096)
    dynamic_method: Optional[DynamicMethod] = option(
        None, "Choose each module's rank from its singular values: sv_ratio (largest / kept "
        "below the parameter), sv_fro (share of the Frobenius norm kept), sv_cumulative "
        "(share of the sum of singular values kept).")
    dynamic_param: Optional[float] = option(
        None, "Target of the dynamic method: a ratio >= 1 for sv_ratio, a share in (0, 1] "
        "for sv_fro and sv_cumulative.", gt=0)
    precision: Optional[Precision] = option(None, "Precision of the saved weights; unset keeps "
                                            "the file's.")

    @model_validator(mode="after")
    def _check(self) -> ResizeOptions:
        method, param = self.dynamic_method, self.dynamic_param
        if method is not None and param is None:
            raise ValueError(f"dynamic_param: {method} needs a target")
        if method == "sv_ratio" and param is not None and param < 1:
            raise ValueError("dynamic_param: sv_ratio keeps singular values down to the "
                             "largest / ratio, so the ratio is >= 1")
        if method in ("sv_fro", "sv_cumulative") and param is not None and param > 1:
            raise ValueError(f"dynamic_param: {method} keeps a share of the energy, in (0, 1]")
        if not self.save_to.endswith(".safetensors"):
            raise ValueError("save_to: the LoRA is written as .safetensors")
        return self


class ExtractOptions(ToolOptions):
    base: str = option(..., "The base model (diffusers folder or .safetensors checkpoint).")
    tuned: str = option(..., "The fine-tuned model made from it (e.g. a DreamBooth output).")
    save_to: str = option(..., "Where to write the extracted LoRA (.safetensors).")
    rank: int = option(32, "Rank of the extracted LoRA.", ge=1, le=4096)
    conv_rank: Optional[int] = option(
        None, "Also extract the 3x3 convolutions (LoCon) at this rank; unset leaves them out.",
        ge=1, le=4096)
    min_diff: float = option(
        0.01, "A text encoder whose weights change by at most this much is left out.", ge=0)
    clamp_quantile: Optional[float] = option(
        None, "Clamp the factors' values at this quantile, as sd-scripts does with 0.99; "
        "unset keeps them exact.", gt=0, le=1)
    precision: Precision = option("fp16", "Precision of the saved weights.")
    config_dir: Optional[str] = option(
        None, "A diffusers folder whose configs (and tokenizer) single-file models of an "
        "unusual shape need.")

    @model_validator(mode="after")
    def _check(self) -> ExtractOptions:
        if not self.save_to.endswith(".safetensors"):
            raise ValueError("save_to: the LoRA is written as .safetensors")
        return self


class CaptionFolderOptions(ToolOptions):
    folder: str = option(..., "The folder of images to caption.")
    model_dir: str = option(..., "The captioning model's folder.")
    prefix: Optional[str] = option(None, "Put before every caption, e.g. the trigger word.")
    suffix: Optional[str] = option(None, "Put after every caption.")
    overwrite: bool = option(False, "Replace existing caption files; off keeps them.")
    caption_extension: str = option(".txt", "Extension of the caption files.",
                                    pattern=r"^\.[A-Za-z0-9_-]+$")
    recursive: bool = option(False, "Caption the images of subfolders too.")
    batch_size: int = option(4, "Images per batch.", ge=1, le=256)


class CaptionEditorOptions(CaptionFolderOptions):
    control_dir: Optional[str] = option(
        None, "Edit training: the folder of the control images, shown beside each image "
        "(paired as dataset.control_dir pairs them; a relative path is read from the folder).")


class CaptionOptions(CaptionFolderOptions):
    model_dir: str = option(..., "A transformers image-to-text model's folder (BLIP, GIT, ...).")
    max_new_tokens: int = option(40, "Longest caption, in tokens.", ge=1, le=512)
    num_beams: int = option(1, "Beam search width (1: greedy).", ge=1, le=16)


class TagOptions(CaptionFolderOptions):
    model_dir: str = option(..., "A WD14-style tagger's folder: model.onnx and "
                            "selected_tags.csv.")
    general_threshold: float = option(0.35, "Keep general tags at least this likely.",
                                      ge=0, le=1)
    character_threshold: float = option(0.85, "Keep character tags at least this likely.",
                                        ge=0, le=1)
    exclude_tags: list[str] = option([], "Tags never written.", split=",")
    underscores_to_spaces: bool = option(True, "Write long_tag_names as long tag names.")
    character_tags_first: bool = option(False, "Put character tags before general ones.")
    rating: bool = option(False, "Start with the most likely rating tag.")


# --- validation and the command line ---------------------------------------------------------


class OptionsError(ValueError):
    """Invalid options; ``problems`` holds one line per problem, naming the option."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def _problem(error: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in error["loc"] if not isinstance(p, int))
    msg = error["msg"].removeprefix("Value error, ")
    return msg if not where or msg.startswith(where) else f"{where}: {msg}"


def validate(model: type[ToolOptions], values: dict[str, Any]) -> Any:
    """``model(**values)``, or :class:`OptionsError` naming each bad option."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise OptionsError([_problem(e) for e in exc.errors()]) from None


def help_of(model: type[ToolOptions], name: str) -> str:
    return model.model_fields[name].description or ""


def list_separator(model: type[ToolOptions], name: str) -> str:
    extra = model.model_fields[name].json_schema_extra
    return extra.get("split", "\n") if isinstance(extra, dict) else "\n"


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


def field_kind(model: type[ToolOptions], name: str) -> tuple[str, tuple[Any, ...], bool]:
    """(kind, choices, optional) of an option, kind one of bool, choice, int, float, text,
    list[text] (``list_text``), list[float] (``list_float``): what a form or a parser needs."""
    inner, optional = _unwrap(model.model_fields[name].annotation)
    if typing.get_origin(inner) is list:
        item = typing.get_args(inner)[0]
        return ("list_float" if item is float else "list_text"), (), optional
    if typing.get_origin(inner) is Literal:
        return "choice", typing.get_args(inner), optional
    kinds = {bool: "bool", int: "int", float: "float"}
    return kinds.get(inner, "text"), (), optional


PARSER_TYPES = {"int": int, "float": float, "text": str, "list_text": str, "list_float": float}


def _argument(model: type[ToolOptions], name: str) -> tuple[list[str], dict[str, Any]]:
    info = model.model_fields[name]
    kind, choices, _ = field_kind(model, name)
    kw: dict[str, Any] = {"help": info.description}
    positional = info.is_required()
    if kind.startswith("list_"):
        kw["nargs"] = "+" if positional else "*"
    if kind == "choice":
        kw["choices"] = choices
    elif kind == "bool":
        kw["action"] = argparse.BooleanOptionalAction
    else:
        kw["type"] = PARSER_TYPES[kind]
    if positional:
        return [name], kw
    kw["default"] = info.get_default(call_default_factory=True)
    kw["dest"] = name
    return ["--" + name.replace("_", "-")], kw


def add_arguments(parser: argparse.ArgumentParser, model: type[ToolOptions]) -> None:
    """One argument per option of ``model``; see the module's notes."""
    for name in model.model_fields:
        flags, kw = _argument(model, name)
        parser.add_argument(*flags, **kw)


def from_args(model: type[ToolOptions], args: argparse.Namespace) -> Any:
    return validate(model, {name: getattr(args, name) for name in model.model_fields})
