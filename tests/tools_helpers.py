"""Builders shared by the tools' tests: LoRA files (ours, sd-scripts', LyCORIS'), images, a tiny
BLIP captioner and a tiny WD14-style ONNX tagger, all made here from configs and fixed seeds."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image

from trainer.families.sd.tiny import build_components

UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj",
                "ff.net.2"]
CONV_TARGETS = ["conv1", "conv2", "downsamplers.0.conv", "upsamplers.0.conv"]
TE_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.2, key: str = "lora_"):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if key in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def adapted_tiny(seed: int, rank: int = 4, alpha: float = 2.0, conv: bool = True,
                 te: bool = True) -> dict:
    """The tiny SD 1.x model with random peft LoRA adapters (alpha != rank)."""
    from peft import LoraConfig, inject_adapter_in_model

    comps = build_components()
    targets = UNET_TARGETS + (CONV_TARGETS if conv else [])
    comps["unet"].add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                         init_lora_weights="gaussian"))
    randomize(comps["unet"], seed)
    if te:
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=TE_TARGETS,
                                           init_lora_weights="gaussian"), comps["text_encoder"])
        randomize(comps["text_encoder"], seed + 1)
    return comps


def random_lora(path: Path, seed: int, **kw) -> Path:
    """A LoRA file saved by the studio's exporter (fp32), from :func:`adapted_tiny`."""
    from trainer.config import TrainConfig
    from trainer.export.lora import save_lora
    from trainer.export.metadata import RunFacts

    comps = adapted_tiny(seed, **kw)
    te = comps["text_encoder"] if kw.get("te", True) else None
    facts = RunFacts(steps=7, epoch=1, tag_frequency={"1_circle": {"red": 2, "circle": 1}})
    return save_lora(path, comps["unet"], te, TrainConfig(), facts, torch.float32)


def sd_scripts_metadata(**extra: str) -> dict[str, str]:
    """``ss_*`` metadata as sd-scripts' train_network.py writes it (every value a string)."""
    meta = {
        "ss_session_id": "1234567890", "ss_training_started_at": "1700000000.5",
        "ss_training_finished_at": "1700000600.5", "ss_output_name": "my_lora",
        "ss_learning_rate": "0.0001", "ss_text_encoder_lr": "5e-05", "ss_unet_lr": "0.0001",
        "ss_num_train_images": "40", "ss_num_reg_images": "0", "ss_num_batches_per_epoch": "20",
        "ss_num_epochs": "10", "ss_epoch": "10", "ss_steps": "200", "ss_max_train_steps": "200",
        "ss_batch_size_per_device": "2", "ss_total_batch_size": "2",
        "ss_network_module": "networks.lora", "ss_network_dim": "16",
        "ss_network_alpha": "8.0", "ss_network_args": "{}", "ss_network_dropout": "None",
        "ss_mixed_precision": "fp16", "ss_optimizer": "bitsandbytes.optim.adamw.AdamW8bit",
        "ss_lr_scheduler": "cosine", "ss_base_model_version": "sd_v1", "ss_v2": "False",
        "ss_resolution": "(512, 512)", "ss_seed": "42", "ss_training_comment": "None",
        "ss_sd_model_name": "v1-5-pruned-emaonly.safetensors",
        "ss_sd_model_hash": "81761151", "ss_new_sd_model_hash":
            "cc6cb27103417325ff94f52b7a5d2dde45a7515b25c255d8e396c90014281516",
        "ss_dataset_dirs": json.dumps({"10_sks dog": {"n_repeats": 10, "img_count": 4}}),
        "ss_tag_frequency": json.dumps({"10_sks dog": {"sks dog": 4, "grass": 3, "sky": 1}}),
        "sshs_model_hash": "ab" * 32, "sshs_legacy_hash": "12345678",
    }
    meta.update(extra)
    return meta


def lora_pair(name: str, out: int, inp: int, rank: int, alpha: float, seed: int,
              kernel: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    """One module's fp16 tensors as sd-scripts saves them (alpha a 0-d fp16 tensor)."""
    gen = torch.Generator().manual_seed(seed)
    up_shape = (out, rank, 1, 1) if kernel else (out, rank)
    return {f"{name}.lora_down.weight": torch.randn(rank, inp, *kernel, generator=gen).half(),
            f"{name}.lora_up.weight": (torch.randn(*up_shape, generator=gen) * 0.1).half(),
            f"{name}.alpha": torch.tensor(alpha).half()}


def images_folder(root: Path, colors=((220, 30, 30), (30, 40, 220), (30, 200, 40)),
                  sizes=((48, 32), (32, 32), (20, 40))) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, (color, size) in enumerate(zip(colors, sizes)):
        Image.new("RGB", size, color).save(root / f"img{i}.png")
    return root


def tiny_blip(folder: Path) -> Path:
    """A BLIP captioner with random weights, saved as a folder the pipeline loads."""
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]
    words += "a red blue green circle square photo of the on".split()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(folder / "vocab.txt"), bos_token="[DEC]")
    torch.manual_seed(0)
    config = BlipConfig(
        text_config=dict(vocab_size=len(words), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=32,
                         bos_token_id=5, pad_token_id=0, sep_token_id=3, eos_token_id=3),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=16)
    BlipForConditionalGeneration(config).save_pretrained(folder)
    processor = BlipProcessor(image_processor=BlipImageProcessor(
        size={"height": 32, "width": 32}), tokenizer=tokenizer)
    processor.save_pretrained(folder)
    return folder


# (name, category, weights on the mean B, G, R of the image, bias): sigmoid(w . mean + b)
TAGGER_TAGS = [
    ("general", 9, (0, 0, 0), 1.0), ("sensitive", 9, (0, 0, 0), 0.0),
    ("red_theme", 0, (0, 0, 0.1), -20.0), ("blue_theme", 0, (0.1, 0, 0), -20.0),
    ("^_^", 0, (0, 0, 0), 5.0), ("long_hair", 0, (0, 0, 0), 0.0),
    ("hatsune_miku", 4, (0, 0, 0), 0.405),
]


def tiny_tagger(folder: Path, size: int = 8, batch: int | str = "N") -> Path:
    """A WD14-style tagger: [N, size, size, 3] BGR -> mean colour -> linear -> sigmoid, written
    with onnx's helper API, and its selected_tags.csv."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.array([t[2] for t in TAGGER_TAGS], dtype=np.float32).T  # [3, tags]
    bias = np.array([t[3] for t in TAGGER_TAGS], dtype=np.float32)
    nodes = [helper.make_node("ReduceMean", ["input_1:0"], ["mean"], axes=[1, 2], keepdims=0),
             helper.make_node("MatMul", ["mean", "w"], ["logits"]),
             helper.make_node("Add", ["logits", "b"], ["scores"]),
             helper.make_node("Sigmoid", ["scores"], ["predictions_sigmoid"])]
    graph = helper.make_graph(
        nodes, "tiny_tagger",
        [helper.make_tensor_value_info("input_1:0", TensorProto.FLOAT, [batch, size, size, 3])],
        [helper.make_tensor_value_info("predictions_sigmoid", TensorProto.FLOAT,
                                       [batch, len(TAGGER_TAGS)])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    rows = ["tag_id,name,category,count"] + [f"{i},{name},{cat},100"
                                             for i, (name, cat, _, _) in enumerate(TAGGER_TAGS)]
    (folder / "selected_tags.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


# --- the peers' LoRA files of the newer flow families (tests/test_tools_peer_forms.py) ----------
# The original layout (ComfyUI's native names for Z-Image, Black Forest Labs' for FLUX.2 and
# Chroma, diffusers' own for Qwen-Image) as diffusers' layers: a fused layer's rows are its parts'
# in this order (ComfyUI's ``z_image_to_diffusers``; diffusers' readers
# ``convert_flux2_transformer_checkpoint_to_diffusers`` and
# ``convert_chroma_transformer_checkpoint_to_diffusers``). Written here from those rules, not
# taken from the trainer's tables.
ZIMAGE_PARTS = {"attention.qkv": ("attention.to_q", "attention.to_k", "attention.to_v"),
                "attention.out": ("attention.to_out.0",),
                "feed_forward.w1": ("feed_forward.w1",), "feed_forward.w2": ("feed_forward.w2",),
                "feed_forward.w3": ("feed_forward.w3",),
                "adaLN_modulation.0": ("adaLN_modulation.0",)}
BFL_DOUBLE = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
              "img_attn.proj": ("attn.to_out.0",),
              "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
              "txt_attn.proj": ("attn.to_add_out",)}
FLUX2_DOUBLE = {**BFL_DOUBLE, "img_mlp.0": ("ff.linear_in",), "img_mlp.2": ("ff.linear_out",),
                "txt_mlp.0": ("ff_context.linear_in",), "txt_mlp.2": ("ff_context.linear_out",)}
FLUX2_SINGLE = {"linear1": ("attn.to_qkv_mlp_proj",), "linear2": ("attn.to_out",)}
CHROMA_DOUBLE = {**BFL_DOUBLE, "img_mlp.0": ("ff.net.0.proj",), "img_mlp.2": ("ff.net.2",),
                 "txt_mlp.0": ("ff_context.net.0.proj",), "txt_mlp.2": ("ff_context.net.2",)}
CHROMA_SINGLE = {"linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
                 "linear2": ("proj_out",)}
# family -> ((original block, diffusers block, parts), ...)
FLOW_BLOCKS = {
    "zimage": (("layers", "layers", ZIMAGE_PARTS),
               ("noise_refiner", "noise_refiner", ZIMAGE_PARTS),
               ("context_refiner", "context_refiner", ZIMAGE_PARTS)),
    "flux2": (("double_blocks", "transformer_blocks", FLUX2_DOUBLE),
              ("single_blocks", "single_transformer_blocks", FLUX2_SINGLE)),
    "chroma": (("double_blocks", "transformer_blocks", CHROMA_DOUBLE),
               ("single_blocks", "single_transformer_blocks", CHROMA_SINGLE)),
}
# the peers that train a fused layer of the original layout as one LoRA (musubi-tuner's FLUX.2,
# sd-scripts' and ai-toolkit's BFL models): one lora_down for all its rows
DENSE_FUSED = ("flux2", "chroma")


def flow_units(family: str, transformer: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """Original module path -> the diffusers layers it is, for every block layer the model has
    (Qwen-Image: every Linear of ``transformer_blocks``, its original names being diffusers')."""
    names = {n for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    if family == "qwen_image":
        return {n: (n,) for n in sorted(names) if n.startswith("transformer_blocks.")}
    out = {}
    for original, block, parts in FLOW_BLOCKS[family]:
        n = 0
        while any(p.startswith(f"{block}.{n}.") for p in names):
            for part, modules in parts.items():
                paths = tuple(f"{block}.{n}.{m}" for m in modules)
                if all(p in names for p in paths):
                    out[f"{original}.{n}.{part}"] = paths
            n += 1
    return out


def _zimage_musubi(unit: str) -> bool:  # musubi-tuner: the main layers, not the modulations
    return unit.startswith("layers.") and "adaLN" not in unit


def _example_attention(unit: str) -> bool:  # the examples' to_q/to_k/to_v/to_out.0
    return unit.endswith(("attention.qkv", "attention.out", "img_attn.qkv", "img_attn.proj",
                          "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "linear1",
                          "linear2"))


def _every(unit: str) -> bool:
    return True


# family -> form -> (how its file names a layer, which layers the peer trains); "ours" is the
# family's own form: kohya names of the original layout, a fused layer block-diagonal, + alpha
PEER_FORMS = {
    "zimage": {"musubi": ("kohya_split", _zimage_musubi),
               "ai-toolkit": ("peft_split:diffusion_model.", lambda u: u.startswith("layers.")),
               "diffusers": ("peft_split:transformer.", _example_attention),
               "ours": ("ours", _zimage_musubi)},
    "qwen_image": {"musubi": ("kohya_split", _every),
                   "ai-toolkit": ("peft_split:diffusion_model.", _every),
                   "diffusers": ("peft_split:transformer.", _example_attention),
                   "ours": ("ours", _every)},
    "flux2": {"musubi": ("kohya_fused", _every), "ai-toolkit": ("peft_fused", _every),
              "diffusers": ("peft_split:transformer.", _example_attention),
              "ours": ("ours", _every)},
    "chroma": {"sd-scripts": ("kohya_fused", _every), "ai-toolkit": ("peft_fused", _every),
               "diffusers": ("peft_split:transformer.", _every), "ours": ("ours", _every)},
}


class PeerLora:
    """One random LoRA (rank ``rank``, ``alpha``) over a flow model's block layers, written in
    each peer's form with the same update of every diffusers layer."""

    def __init__(self, family: str, transformer: torch.nn.Module, rank: int = 4,
                 alpha: float = 2.0, seed: int = 5):
        self.family, self.rank, self.alpha = family, rank, alpha
        self.units = flow_units(family, transformer)
        gen = torch.Generator().manual_seed(seed)
        self.parts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # path -> (down, up)
        for paths in self.units.values():
            layers = [transformer.get_submodule(p) for p in paths]
            if family in DENSE_FUSED:  # one down, each part its rows of one up
                down = torch.randn(rank, layers[0].in_features, generator=gen) * 0.3
                up = torch.randn(sum(m.out_features for m in layers), rank, generator=gen) * 0.3
                for path, rows in zip(paths, up.split([m.out_features for m in layers])):
                    self.parts[path] = (down, rows)
            else:
                for path, m in zip(paths, layers):
                    self.parts[path] = (torch.randn(rank, m.in_features, generator=gen) * 0.3,
                                        torch.randn(m.out_features, rank, generator=gen) * 0.3)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def chosen(self, form: str) -> dict[str, tuple[str, ...]]:
        keep = PEER_FORMS[self.family][form][1]
        return {u: p for u, p in self.units.items() if keep(u)}

    def deltas(self, form: str) -> dict[str, torch.Tensor]:
        """diffusers path -> the update the form's file adds to its weight."""
        return {p: self.scale * self.parts[p][1] @ self.parts[p][0]
                for paths in self.chosen(form).values() for p in paths}

    def own_names(self, form: str) -> set[str]:
        """The kohya names of the family's own form (what ComfyUI maps) of the form's layers."""
        return {"lora_unet_" + u.replace(".", "_") for u in self.chosen(form)}

    def tensors(self, form: str) -> dict[str, torch.Tensor]:
        writer = PEER_FORMS[self.family][form][0]
        out: dict[str, torch.Tensor] = {}
        for unit, paths in self.chosen(form).items():
            kohya = "lora_unet_" + unit.replace(".", "_")
            downs = [self.parts[p][0] for p in paths]
            ups = [self.parts[p][1] for p in paths]
            if writer == "kohya_split":
                for p, d, u in zip(paths, downs, ups):
                    out.update(_kohya("lora_unet_" + p.replace(".", "_"), d, u, self.alpha))
            elif writer.startswith("peft_split:"):
                prefix = writer.split(":", 1)[1]
                for p, d, u in zip(paths, downs, ups):
                    out.update(_peft(prefix + p, d, u * self.scale))
            elif writer == "kohya_fused":
                out.update(_kohya(kohya, downs[0], torch.cat(ups), self.alpha))
            elif writer == "peft_fused":
                out.update(_peft("diffusion_model." + unit, downs[0], torch.cat(ups) * self.scale))
            else:  # ours: the parts' down stacked, their up block-diagonal
                out.update(_kohya(kohya, torch.cat(downs), torch.block_diag(*ups),
                                  self.alpha * len(paths)))
        return {k: v.clone().contiguous() for k, v in out.items()}

    def save(self, form: str, path: Path, metadata: dict[str, str] | None = None) -> Path:
        from safetensors.torch import save_file

        save_file(self.tensors(form), str(path), metadata=metadata)
        return path


def _kohya(name: str, down, up, alpha: float) -> dict[str, torch.Tensor]:
    return {f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up,
            f"{name}.alpha": torch.tensor(float(alpha))}


def _peft(name: str, down, up) -> dict[str, torch.Tensor]:
    return {f"{name}.lora_A.weight": down, f"{name}.lora_B.weight": up}


def file_modules(tensors: dict[str, torch.Tensor]) -> set[str]:
    """The module names of a LoRA file's keys (kohya: before the first dot; peft: before
    ``.lora_A`` / ``.lora_B``)."""
    out = set()
    for key in tensors:
        if ".lora_A." in key or ".lora_B." in key:
            out.add(key.rsplit(".lora_", 1)[0])
        else:
            out.add(key.split(".", 1)[0])
    return out
