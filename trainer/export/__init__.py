"""What the trainer writes, in the formats the ecosystem reads.

- :mod:`trainer.export.lora`: kohya LoRA safetensors (``lora_unet_*`` / ``lora_te_*``) from peft.
- :mod:`trainer.export.metadata`: sd-scripts' ``ss_*`` keys and ``modelspec.*`` (RunFacts).
- :mod:`trainer.export.hashes`: ``sshs_model_hash`` / ``sshs_legacy_hash`` and file hashes.
- :mod:`trainer.export.embedding`: textual-inversion embeddings (``emb_params``).
- :mod:`trainer.export.lycoris`: LyCORIS files (``lycoris.kohya``);
  :mod:`trainer.export.lycoris_args`: their network arguments;
  :mod:`trainer.export.flow_lycoris`: a transformer family's (``lycoris_<diffusers path>``).
- :mod:`trainer.export.names`: module names as the files name them, shared by the writers.

What is one family's own (its single-file checkpoint, its LoRA key forms) is in that family's
folder: ``trainer/families/<folder>/checkpoint.py`` and ``lora.py``.

Files are written atomically through :mod:`trainer.system.safe_write`.

The submodules are imported where they are used: ``lora`` pulls in peft, which code that only
writes a file must not pay for.
"""
