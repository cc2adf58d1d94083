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
