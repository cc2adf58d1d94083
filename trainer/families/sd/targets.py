"""SD 1.x / 2.x's LoRA files as the tools (inspect, merge, resize, extract) read and write them:
the UNet under diffusers' module paths, the SGM (Stability) names as aliases
(:mod:`trainer.tools.targets`)."""

SGM_NAMES = False  # its LoRA files name the UNet's layers by diffusers' paths
