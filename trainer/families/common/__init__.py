"""What several family folders reuse: the checked safetensors header (``files``), CLIP and T5
prompt tokens (``t5``), and the MMDiT layouts of FLUX.1 and SD 3.x (``mmdit_*``: detection, the
single-file and diffusers-folder loads, the tokenizers, the original-layout writer, the LoRA
file's metadata, the tiny builders). A family folder imports from here, never from another
family's folder (SDXL may extend SD's)."""
