"""Parts of the base model that nothing later in the run uses, let go once the run knows it.

The VAE's decoder (with its ``post_quant_conv``) is 60% of SD's and FLUX.1's autoencoder (49 M of
84 M parameters; 0.19 GiB in fp32) and only samples, class images and a DreamBooth checkpoint
use it. A LoRA, LyCORIS or textual-inversion run with no sample prompts saves no VAE and
decodes nothing once the class images exist, so its decoder is replaced, after them, by a
stand-in that holds no weight and says what happened if anything calls it. The encoder stays
where the latent cache, or on the CPU the first epoch, encodes with it; a text-first run
(trainer/run/text_first.py) encodes every image before its transformer is built and nothing
after, so there the encoder goes too, once the cache is full.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from trainer.system.heap import give_back_free_memory

DECODES_NOTHING = "this run was set up to decode nothing (no sample prompts, a method that " \
    "saves no VAE)"
ENCODES_NOTHING = "every image was encoded before the transformer was built and nothing in " \
    "this run encodes later"


class Released(torch.nn.Module):
    """Where a module was let go: no weights; calling it says why."""

    def __init__(self, what: str, why: str = DECODES_NOTHING):
        super().__init__()
        self.what, self.why = what, why

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.what} was released: {self.why}")


def decoder_unused(cfg: Any) -> bool:
    """Whether nothing after the class images decodes latents in a run of ``cfg``."""
    sm = cfg.sampling
    return cfg.mode != "dreambooth" and not (sm.sample_prompts or sm.sample_prompts_file)


def _release(vae: Any, names: tuple[str, ...], why: str) -> int:
    """The VAE's modules ``names`` (those it has, not let go yet) replaced by stand-ins that
    say ``why``; the bytes freed."""
    parts = [name for name in names if isinstance(getattr(vae, name, None), torch.nn.Module)
             and not isinstance(getattr(vae, name), Released)]
    freed = sum(t.numel() * t.element_size() for name in parts
                for t in getattr(vae, name).state_dict().values())
    for name in parts:
        setattr(vae, name, Released(f"the VAE's {name}", why))
    gc.collect()
    give_back_free_memory()
    return freed


def release_decoder(s: Any, out: Any) -> None:
    """The VAE's decoder let go where :func:`decoder_unused` (see the module's notes)."""
    vae = getattr(s.model, "vae", None)
    if vae is None or not decoder_unused(s.cfg) or isinstance(vae.decoder, Released):
        return
    freed = _release(vae, ("decoder", "post_quant_conv"), DECODES_NOTHING)
    out.log(f"VAE decoder released: nothing in this run decodes ({freed / 2**20:.0f} MiB)")


def release_encoder(s: Any, out: Any) -> None:
    """The VAE's encoder let go once a text-first run's latent cache is full (see the module's
    notes; the caller knows the run is one)."""
    vae = getattr(s.model, "vae", None)
    freed = _release(vae, ("encoder", "quant_conv"), ENCODES_NOTHING) if vae is not None else 0
    if freed:
        out.log(f"VAE encoder released: every image is in the latent cache "
                f"({freed / 2**20:.0f} MiB)")
