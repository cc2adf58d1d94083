"""SDXL's keys in a kohya_ss GUI config, as the importer (``trainer/importers/kohya/``) reads
them: the switch (``sdxl`` in the LoRA and DreamBooth tabs, ``sdxl_checkbox`` in the finetune
tab; with both, ``sdxl`` decides), the learning rate of each text encoder and the block-wise
rates (the finetune tab's "Block LR") that ``sdxl_train.py`` reads in DreamBooth and
fine-tuning."""

from __future__ import annotations

SWITCHES = {"sdxl": ("sdxl", "sdxl_checkbox")}  # family -> the kohya_ss keys that pick it
# DreamBooth: (the kohya_ss rate, our switch of the encoder, our rate), one per text encoder
TEXT_ENCODER_RATES = (
    ("learning_rate_te1", "network.train_text_encoder", "optimizer.text_encoder_lr"),
    ("learning_rate_te2", "network.train_text_encoder_2", "optimizer.text_encoder_2_lr"))
BLOCK_LR = True  # sdxl_train.py reads --block_lr: 23 rates, one per UNet block
