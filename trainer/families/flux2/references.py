"""FLUX.2's reference images (edit training's controls), as diffusers' ``Flux2KleinPipeline``
and ``Flux2Pipeline`` read them (their ``image`` argument; BFL's ``flux2/sampling.py``
``encode_image_refs`` the same way).

- **Size**: a reference larger than 1024 x 1024 pixels is scaled down to about that area at
  its own aspect; then (every reference) its sides are cut down to multiples of 16 (the VAE's
  8 times the 2x2 latent patches) by a center crop. A smaller one is not scaled up. The
  family's ``ControlSpec`` declares this (``area`` with ``shrink_only``: the data layer's
  ``native`` sizing, trainer/data/control_sizing.py); ``dataset.control_resolution`` sizes
  them otherwise. (BFL's own sampler allows 2024 x 2024 for a single reference;
  musubi-tuner trains each at its target's bucket unless its dataset says otherwise.)
- **Latents**: each reference's VAE mode, patchified 2x2 and normalized with the VAE's
  BatchNorm statistics, exactly as the target's (``encode_latents``), packed one token per
  patch and concatenated after the target's tokens.
- **Position ids**: (T, h, w, 0) with the time coordinate ``10 * (i + 1)`` for the i-th
  reference (the target's is 0), the pipeline's ``_prepare_image_ids``.
- **Output**: the transformer answers for every token; the pipeline keeps the target's
  (``noise_pred[:, :latents.size(1)]``), so the loss sees the target alone.
- **How many**: neither pipeline nor musubi-tuner caps the count; Black Forest Labs state up to
  10 references for FLUX.2 (fewer recommended: 4 for klein, 6 for dev in their API guide), so
  the family takes up to 10 (``FLUX2.controls``), none required (a target alone trains as
  text-to-image). The text encoder does not read them (only dev's optional prompt upsampling
  does, which training has not).
"""

from __future__ import annotations

import torch

TIME_SCALE = 10  # _prepare_image_ids' scale: reference i sits at T = 10 * (i + 1)


def pack_references(references: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Patchified reference latents (one [B, C, h, w] per reference, each its own size) ->
    (their tokens one after another [B, N, C], their position ids [B, N, 4]), as the
    pipeline's ``prepare_image_latents`` (every row of a batch has references of the same
    sizes, so the ids are one row's, repeated)."""
    from diffusers import Flux2KleinPipeline as Pipe

    b = references[0].shape[0]
    tokens = torch.cat([Pipe._pack_latents(r) for r in references], dim=1)
    ids = Pipe._prepare_image_ids([r[:1] for r in references], scale=TIME_SCALE)
    return tokens, ids.expand(b, -1, -1).to(references[0].device)
