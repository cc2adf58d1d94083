"""What the trainer writes, in the formats the ecosystem reads.

- :mod:`trainer.export.lora`: kohya LoRA safetensors (``lora_unet_*`` / ``lora_te_*``) from peft.
- :mod:`trainer.export.metadata`: sd-scripts' ``ss_*`` keys and ``modelspec.*`` (RunFacts).
- :mod:`trainer.export.hashes`: ``sshs_model_hash`` / ``sshs_legacy_hash`` and file hashes.
- :mod:`trainer.export.embedding`: textual-inversion embeddings (``emb_params``).
- :mod:`trainer.export.safe_write`: atomic writes (temporary file, then ``os.replace``).
"""

from trainer.export.embedding import save_embedding
from trainer.export.lora import kohya_state_dict, save_lora
from trainer.export.metadata import RunFacts, build_lora_metadata, count_tags
from trainer.export.safe_write import atomic_path, save_safetensors_atomic

__all__ = [
    "RunFacts",
    "atomic_path",
    "build_lora_metadata",
    "count_tags",
    "kohya_state_dict",
    "save_embedding",
    "save_lora",
    "save_safetensors_atomic",
]
