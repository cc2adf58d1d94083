"""The latent and text-encoder caches of a run, filled before the first step or as it goes.

On a GPU every image and caption is encoded before the first step, in batches sized to memory
(trainer/data/cache_batches.py), so that the VAE and the frozen text encoders can leave the
device for the whole of training (T5-XXL alone is 9.5 GB in bf16). On the CPU nothing leaves:
the encoders stay in the same RAM either way, so encoding everything first only delays the
first step (16 images and captions of an SD 1.5-size run cost 2.4 s of a 7.6 s
start). The exception is a text-first run (trainer/run/text_first.py), whose transformer is not
built yet when the caches fill: there every image is encoded first on the CPU too, so the VAE's
encode never shares the memory with the transformer and its encoder is let go before the
transformer is built (nothing in such a run encodes later), and every step of the first epoch
is a training step only (its time, and the ETA read from it, is what the later epochs take).
Elsewhere on the CPU the caches are lazy: each image and caption is encoded alone the first time a
batch of the first epoch needs it, and kept (in memory, or written to the disk cache) for every
later epoch; a run shorter than an epoch encodes only what it trains on. Encoding each one
alone keeps its latent independent of which images shared its batch, so a resumed run reads
the same latents as the run it continues.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from trainer.families import family_of
from trainer.run.step import encode_captions, encode_images
from trainer.run.unused import release_encoder


def lazy(s: Any) -> bool:
    """Whether this run's caches fill as the first epoch goes (the CPU) or before it."""
    return s.device_info.backend == "cpu"


def fill_latent_cache(s: Any, out: Any) -> None:
    """Fill (or, on the CPU, set up) the latent cache if the config asks for it. The run calls
    it with the VAE on the device and the rest of the model not yet there, as sd-scripts
    does: on a GPU the encode has the memory the denoiser takes later (an SDXL-size UNet in
    bf16 is 4.8 GiB beside a 1024 px image's 2.5 GiB encode)."""
    from trainer.data import cache_batches

    ds, model = s.cfg.dataset, s.model
    # text first (the transformer not built yet): the images are encoded now on the CPU too,
    # before the transformer takes the memory, and the encoder is let go (see the module notes)
    first = model.denoiser is None
    later = lazy(s) and not first
    family = family_of(model)  # a family may encode its latents its own way
    if s.data.controls:  # edit training: checked again with the loaded model's family
        s.data.use_controls(s.data.controls, model.version)
        check_variant_controls(s.data, family, model)
    if ds.cache_latents:
        start = time.time()
        # hashing the VAE's weights is only worth it for a cache that outlives the run
        vae_id = model.vae_id if ds.cache_latents_to_disk else "in-memory"
        backend = s.device_info.backend  # batches sized to memory, bf16 where it is
        with torch.no_grad():
            encoded = s.data.cache_latents(
                cache_batches.latent_encoder(lambda px: encode_images(model.vae, px, family),
                                             backend, s.dtype),
                cache_batches.latent_id(vae_id, backend, s.dtype),
                to_disk=ds.cache_latents_to_disk,
                cache_dir=Path(ds.cache_dir) if ds.cache_dir else None,
                batch_size=cache_batches.latent_batches(model.vae.config,
                                                        cache_batches.budget(s.device_info)),
                lazy=later)
        if later:
            out.log(f"Latent cache: {encoded} image(s) to encode, each when the first epoch "
                    f"reaches it" + (", the rest read from disk" if ds.cache_latents_to_disk
                                     else ""))
        else:
            out.log(f"Latent cache ready: {encoded} image(s) encoded in "
                    f"{time.time() - start:.1f}s")
        if not s.cfg.sampling.sample_prompts and not later:
            model.vae.to("cpu")  # not needed on the device any more
        if first:  # nothing encodes later in a text-first run (trainer/run/text_first.py)
            release_encoder(s, out)


def check_variant_controls(data: Any, family: Any, model: Any) -> None:
    """The loaded variant's own limits on the controls, where its family has some (one family
    can hold a text-to-image model and its edit models: Qwen-Image and Qwen-Image-Edit)."""
    from trainer.data.errors import DatasetError

    check = getattr(family, "control_problems", None)
    if check is None:
        return
    problems = check(model, [len(c.images) for c, e in zip(data.controls, data.entries)
                             if c is not None and not e.is_reg])
    if problems:
        raise DatasetError(problems)


def fill_text_cache(s: Any, out: Any, eager: bool = False) -> None:
    """Fill (or, on the CPU, set up) the text-encoder cache where it applies; on a GPU the
    frozen text encoders then leave the device. ``eager``: filled now on the CPU too (the
    encoders are let go next: trainer/run/text_first.py)."""
    from trainer.data import cache_batches

    ds, model, later = s.cfg.dataset, s.model, lazy(s) and not eager
    if caches_text(s):
        start, disk = time.time(), ds.cache_text_encoder_outputs_to_disk
        identity = _text_identity(s) if disk else ""
        with torch.no_grad():
            encoded = s.data.cache_text(
                lambda caps, controls=None: encode_captions(
                    model, caps, s.cfg.model.clip_skip,
                    **({"controls": controls} if controls else {})), to_disk=disk,
                cache_dir=Path(ds.cache_dir) if ds.cache_dir else None, identity=identity,
                batch_size=cache_batches.text_batch(
                    cache_batches.text_encoder_configs(model), cache_batches.budget(
                        s.device_info), cache_batches.element_size(model.text_encoder)),
                lazy=later)
        if later:
            out.log(f"Text-encoder cache: {encoded} caption(s) to encode, each when the first "
                    f"epoch reaches it" + (", the rest read from disk" if disk else ""))
        elif disk or eager:
            out.log(f"Text-encoder cache ready: {encoded} caption(s) encoded in "
                    f"{time.time() - start:.1f}s, the rest read from disk")
        if not later and not eager:
            _release_text_encoders(s, out)


def _text_identity(s: Any) -> str:
    """What the disk text cache's files are keyed by besides the caption."""
    from trainer.data.text_store import encoder_id
    from trainer.families import family_of

    model = s.model
    encoders = [encoder for _, encoder, _ in family_of(model).text_encoders(model)]
    return encoder_id(encoders, {"family": model.version, "clip_skip": s.cfg.model.clip_skip,
                                 "t5_max_length": model.t5_max_length,
                                 "prompt": str(model.prompt_options)})


def _release_text_encoders(s: Any, out: Any) -> None:
    """With every caption's outputs cached, the frozen text encoders are not needed on the
    device (T5-XXL alone is 9.5 GB in bf16); samples bring them back while they run."""
    from trainer.families import family_of

    if s.device_info.backend == "cpu":
        return
    moved = [name for name, encoder, _ in family_of(s.model).text_encoders(s.model)
             if not any(p.requires_grad for p in encoder.parameters())]
    for name in moved:
        getattr(s.model, name).to("cpu")
    if moved:
        out.log(f"Text encoder outputs cached: {', '.join(moved)} moved off the device")


def caches_text(s: Any) -> bool:
    """On: prepare_dataset refused it where it is not valid. Unset: wherever the outputs cannot
    change, since encoding each caption once is the same run, faster (the text encoder is a
    large part of a small-resolution step)."""
    from trainer.data.text_cache import text_cache_allowed

    wanted = s.cfg.dataset.cache_text_encoder_outputs
    if wanted is None:
        return text_cache_allowed(s.cfg, s.method.trains_text_encoder)[0] \
            and not s.data.text_cache_blocker
    return wanted
