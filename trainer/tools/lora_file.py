"""Reading LoRA and LyCORIS files: their modules, each module's update, the model family.

A file holds, per adapted module, tensors named ``<module>.<suffix>`` where ``<module>`` is the
kohya name (``lora_unet_...``, ``lora_te_...``, ``lora_te1_`` / ``lora_te2_`` for SDXL; see
:mod:`trainer.export.lora`). The suffixes say the network type, as sd-scripts and LyCORIS write
them and ComfyUI / AUTOMATIC1111 read them:

    LoRA / LoCon   lora_down.weight [r, in(, k, k)], lora_up.weight [out, r(, 1, 1)], alpha;
                   lora_mid.weight [r, r, k, k] for LoCon's Tucker form (down and up are 1x1)
    LoHa           hada_w1_a [out, r], hada_w1_b [r, in*k*k], hada_w2_a, hada_w2_b, alpha
    LoKr           lokr_w1 or lokr_w1_a @ lokr_w1_b, lokr_w2 or lokr_w2_a @ lokr_w2_b, alpha
    full           diff (the whole update), diff_b (the bias's)
    (IA)^3         weight, on_input (a scale, not an update: inspected, not merged)

and the update of the module's weight (:meth:`LoraModule.delta`) is

    LoRA   up @ down * alpha / r                          (LoRA paper, Hu et al. 2021)
    LoHa   (w1_a @ w1_b) * (w2_a @ w2_b) * alpha / r      (Hadamard product, FedPara)
    LoKr   kron(w1, w2) * alpha / r, r the inner size of a factored w2 (else w1); 1 if neither

A missing alpha means alpha = r (scale 1), as sd-scripts reads it. diffusers' peft format
(``unet.<path>.lora_A.weight`` / ``lora_B``, ``text_encoder.<path>...``) is read too, under the
kohya names of the same modules, with scale 1; such a module keeps its key prefix
(``peft_key``), so that a tool writes it back in the form it was read (SD 3.5's
``transformer.*`` files: :mod:`trainer.families.sd3.lora`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from trainer.export.lora import kohya_module_name, text_encoder_module_path
from trainer.tools.common import ToolError, existing_file

KINDS = {  # suffix -> network type
    "lora_down.weight": "lora", "lora_up.weight": "lora", "lora_mid.weight": "lora",
    "hada_w1_a": "loha", "hada_w1_b": "loha", "hada_w2_a": "loha", "hada_w2_b": "loha",
    "hada_t1": "loha", "hada_t2": "loha",
    "lokr_w1": "lokr", "lokr_w1_a": "lokr", "lokr_w1_b": "lokr", "lokr_w2": "lokr",
    "lokr_w2_a": "lokr", "lokr_w2_b": "lokr", "lokr_t2": "lokr",
    "diff": "full", "diff_b": "full", "on_input": "ia3",
    "alpha": None, "dora_scale": None,
}
PEFT_SUFFIXES = {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight"}
PEFT_PREFIXES = {"unet.": "lora_unet", "text_encoder.": "lora_te", "text_encoder_2.": "lora_te2",
                 "transformer.": "lora_transformer",  # transformer.*: SD 3.5 (export/sd3_lora)
                 "diffusion_model.": "lora_unet"}  # ComfyUI's dotted twin of lora_unet_
# FLUX.1 (BFL names, export/flux_lora) and SD3 (sd-scripts' joint_blocks) transformers first
PARTS = (("lora_unet_double_blocks_", "transformer"), ("lora_unet_single_blocks_", "transformer"),
         ("lora_unet_joint_blocks_", "transformer"), ("lora_transformer_", "transformer"),
         ("lycoris_", "transformer"),  # a transformer's LyCORIS (trainer/export/flow_lycoris)
         ("lora_unet_transformer_blocks_", "transformer"),  # Qwen-Image (diffusers' names)
         ("lora_unet_", "unet"), ("lora_te1_", "te1"), ("lora_te2_", "te2"), ("lora_te3_", "te3"),
         ("lora_te_", "te"))
EMBEDDING_KEYS = ({"emb_params"}, {"clip_l", "clip_g"})


@dataclass
class LoraModule:
    """One adapted module of a file: its kohya name and tensors by suffix."""

    name: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    peft_key: str = ""  # read from the peft form: its key prefix (``transformer.<path>``)

    @property
    def kind(self) -> str:
        kinds = {KINDS[s] for s in self.tensors if KINDS.get(s)}
        if "weight" in self.tensors and "on_input" in self.tensors:
            kinds.add("ia3")
        return kinds.pop() if len(kinds) == 1 else "unknown"

    @property
    def part(self) -> str:
        """unet, te (SD 1.x/2.x), te1 or te2 (SDXL), transformer and te3 (T5: FLUX.1,
        SD 3.5), or other."""
        return next((part for prefix, part in PARTS if self.name.startswith(prefix)), "other")

    @property
    def alpha(self) -> Optional[float]:
        t = self.tensors.get("alpha")
        return None if t is None else float(t.float().item())

    @property
    def rank(self) -> Optional[int]:
        t = self.tensors
        if self.kind == "lora":
            return t["lora_down.weight"].shape[0]
        if self.kind == "loha":
            return t["hada_w1_b"].shape[0]
        if self.kind == "lokr":
            inner = t.get("lokr_w2_b", t.get("lokr_w1_b"))
            return None if inner is None else inner.shape[0]
        return None

    @property
    def scale(self) -> float:
        rank, alpha = self.rank, self.alpha
        return 1.0 if rank is None or alpha is None else alpha / rank

    @property
    def is_conv(self) -> bool:
        """A convolution with a kernel over 1x1 (LoCon's conv_dim modules)."""
        t = self.tensors
        weight = t.get("lora_down.weight", t.get("diff", t.get("lokr_w2")))
        return (weight is not None and weight.dim() == 4 and tuple(weight.shape[2:]) != (1, 1)
                ) or "lora_mid.weight" in t or "hada_t1" in t or "lokr_t2" in t

    def product(self) -> torch.Tensor:
        """A LoRA module's ``up @ down`` (Tucker: with its core) in fp32, without the scale."""
        return _lora_delta({k: v.float() for k, v in self.tensors.items()})

    def delta(self) -> torch.Tensor:
        """The update of the module's weight, in fp32 and scaled; see the module's notes.
        LoHa and LoKr give it flattened to [out, in*k*k]: reshape to the weight's shape."""
        maker = {"lora": _lora_delta, "loha": _loha_delta, "lokr": _lokr_delta,
                 "full": lambda t: t["diff"].float()}.get(self.kind)
        if maker is None:
            raise ToolError(f"{self.name}: a {self.kind} module has no weight update to apply")
        if "dora_scale" in self.tensors:
            raise ToolError(f"{self.name}: DoRA modules rescale the merged weight; not "
                            f"supported")
        delta = maker({k: v.float() for k, v in self.tensors.items()})
        return delta if self.kind == "full" else delta * self.scale

    def norm(self) -> float:
        """Frobenius norm of :meth:`delta`; for plain LoRA from the r x r Gram matrices:
        ``|U D|_F^2 = sum((U^T U) * (D D^T))``, without forming the update."""
        t = self.tensors
        if self.kind == "lora" and "lora_mid.weight" not in t:
            up = t["lora_up.weight"].float().flatten(1)
            down = t["lora_down.weight"].float().flatten(1)
            gram = ((up.T @ up) * (down @ down.T)).sum().clamp_min(0)
            return float(gram.sqrt()) * abs(self.scale)
        try:
            return float(self.delta().norm())
        except ToolError:
            return float("nan")


def _lora_delta(t: dict[str, torch.Tensor]) -> torch.Tensor:
    up, down = t["lora_up.weight"], t["lora_down.weight"]
    if "lora_mid.weight" in t:  # Tucker: 1x1 up and down around an r x r x k x k core
        return torch.einsum("or,rskl,si->oikl", up.flatten(1), t["lora_mid.weight"],
                            down.flatten(1))
    return (up.flatten(1) @ down.flatten(1)).reshape(up.shape[0], *down.shape[1:])


def _loha_delta(t: dict[str, torch.Tensor]) -> torch.Tensor:
    if "hada_t1" in t:
        raise ToolError("LoHa with Tucker cores (hada_t1/hada_t2) is not supported")
    return (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"])


def _lokr_delta(t: dict[str, torch.Tensor]) -> torch.Tensor:
    if "lokr_t2" in t:
        raise ToolError("LoKr with a Tucker core (lokr_t2) is not supported")
    w1 = t["lokr_w1"] if "lokr_w1" in t else t["lokr_w1_a"] @ t["lokr_w1_b"]
    w2 = t["lokr_w2"] if "lokr_w2" in t else t["lokr_w2_a"] @ t["lokr_w2_b"]
    return torch.kron(w1.flatten(1), w2.flatten(1))


def split_key(key: str) -> Optional[tuple[str, str]]:
    """(module name, suffix) of a tensor key; peft keys get their kohya name; None when the
    key is no adapter tensor."""
    for peft, suffix in PEFT_SUFFIXES.items():
        if key.endswith("." + peft):
            module = key[: -len(peft) - 1]
            for prefix, kohya in PEFT_PREFIXES.items():
                if module.startswith(prefix):
                    path = module[len(prefix):]
                    path = text_encoder_module_path(path) if kohya.startswith("lora_te") else path
                    return kohya_module_name(kohya, path), suffix
    module, _, suffix = key.partition(".")
    if suffix in KINDS or suffix in ("weight", "bias"):
        return module, suffix
    return None


@dataclass
class LoraFile:
    path: Path
    metadata: dict[str, str]
    modules: dict[str, LoraModule]
    embedding: dict[str, torch.Tensor]  # textual inversion vectors, when it is an embedding
    unknown: list[str]  # keys that are neither

    @property
    def dtype(self) -> Optional[torch.dtype]:
        for module in self.modules.values():
            for name, t in module.tensors.items():
                if name != "alpha" and t.is_floating_point():
                    return t.dtype
        return None


def group_modules(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, LoraModule], list[str]]:
    modules: dict[str, LoraModule] = {}
    unknown = []
    for key, tensor in tensors.items():
        split = split_key(key)
        if split is None:
            unknown.append(key)
            continue
        module, suffix = split
        entry = modules.setdefault(module, LoraModule(module))
        entry.tensors[suffix] = tensor
        for peft in PEFT_SUFFIXES:
            if key.endswith("." + peft):
                entry.peft_key = key[: -len(peft) - 1]
    return modules, unknown


def read_lora(path: str | Path) -> LoraFile:
    """A LoRA, LyCORIS or embedding file with its metadata."""
    from safetensors import safe_open

    from trainer.families.common.files import ModelFileError, read_safetensors_header

    if Path(path).expanduser().exists() and str(path).lower().endswith(".safetensors"):
        try:  # a file from a stranger: its header checked against the file before reading
            read_safetensors_header(path)
        except ModelFileError as exc:
            raise ToolError(f"LoRA file {exc}") from None
    path = existing_file(path, "LoRA file")
    try:
        with safe_open(str(path), "pt") as f:
            metadata = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds
        raise ToolError(f"{path}: not a readable safetensors file ({exc})") from None
    if any(set(tensors) == keys for keys in EMBEDDING_KEYS):
        return LoraFile(path, metadata, {}, tensors, [])
    modules, unknown = group_modules(tensors)
    if not modules:
        raise ToolError(f"{path}: no LoRA, LyCORIS or embedding tensors in it "
                        f"(keys such as {sorted(tensors)[:3]})")
    return LoraFile(path, metadata, modules, {}, unknown)


def in_own_form(lora: LoraFile, family: str) -> LoraFile:
    """The file with its modules in its family's own form: what the family's lora role's
    ``own_form_tensors`` makes of the peers' forms (their fused layers, peft keys); as it is for
    a family without one, and for an embedding."""
    from trainer.families import FAMILIES, role

    convert = getattr(role(family, "lora"), "own_form_tensors", None) \
        if family in FAMILIES else None
    if convert is None or lora.embedding:
        return lora
    tensors = {}
    for module in lora.modules.values():
        for suffix, tensor in module.tensors.items():
            peft = {v: k for k, v in PEFT_SUFFIXES.items()}.get(suffix)
            key = f"{module.peft_key}.{peft}" if module.peft_key and peft else \
                f"{module.name}.{suffix}"
            tensors[key] = tensor
    modules, unknown = group_modules(convert(tensors))
    return LoraFile(lora.path, lora.metadata, modules, {}, lora.unknown + unknown)
