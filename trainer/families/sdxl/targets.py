"""SDXL's LoRA files as the tools (inspect, merge, resize, extract) read and write them: the UNet
under the original SGM (Stability) layout's names, diffusers' paths as aliases
(:mod:`trainer.tools.targets`)."""

SGM_NAMES = True  # its LoRA files name the UNet's layers by the SGM layout (sd-scripts')
