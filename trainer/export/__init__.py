"""What the trainer writes, in the formats the ecosystem reads.

- :mod:`trainer.export.lora`: kohya LoRA safetensors (``lora_unet_*`` / ``lora_te_*``) from peft.
- :mod:`trainer.export.metadata`: sd-scripts' ``ss_*`` keys and ``modelspec.*`` (RunFacts).
- :mod:`trainer.export.hashes`: ``sshs_model_hash`` / ``sshs_legacy_hash`` and file hashes.
- :mod:`trainer.export.embedding`: textual-inversion embeddings (``emb_params``).
- :mod:`trainer.export.safe_write`: atomic writes (temporary file, then ``os.replace``).

The submodules are imported where they are used: ``lora`` pulls in peft, which the config and
data code that only write files atomically must not pay for.
"""
