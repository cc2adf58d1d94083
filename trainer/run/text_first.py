"""Text first: a LoRA run on a FLUX.1 / SD 3.x single file whose text-encoder outputs are all
cached encodes every caption, lets the frozen text encoders go, and only then builds the
transformer, so the two largest parts are never in memory together (FLUX.1-dev's
fp8 transformer is 11.9 GB, T5-XXL 4.9 GB in fp8, 9.5 GB in bf16; sd-scripts likewise caches
the outputs before it loads the denoiser).

It applies where nothing later needs a text encoder: LoRA (or LyCORIS) mode, which saves the
adapters only; no text encoder trained; no sample prompts, validation images or class images
(they encode prompts during the run); one process; and a precision known before the load
(``mixed_precision = "auto"`` on the CPU probes the denoiser). Elsewhere the run loads as before.
A released encoder is left on the meta device: the model keeps its shape, not its memory.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from trainer.models.memory import released  # noqa: F401 - what the run asks of an encoder


def applies(cfg: Any, method: Any, data: Any, backend: str) -> bool:
    """Whether this run encodes its captions before the transformer is built."""
    from trainer.data.text_cache import text_first_applies

    return text_first_applies(cfg, backend, method.trains_t5, data.text_cache_blocker)


def encode_and_release(s: Any, out: Any) -> bool:
    """With the transformer not built yet: every caption encoded (each text encoder on the
    device for it), the frozen encoders released, then the transformer built. False (nothing
    done) when the loader built the transformer already."""
    from trainer.families import family_of
    from trainer.run.caches import fill_text_cache

    model = s.model
    if model.denoiser is not None:
        return False
    encoders = family_of(model).text_encoders(model)
    for _, encoder, _ in encoders:
        encoder.to(s.accelerator.device)  # in the dtype it was built in (T5 may be fp8)
    fill_text_cache(s, out, eager=True)
    freed = 0
    for _, encoder, _ in encoders:
        freed += sum(t.numel() * t.element_size() for t in encoder.parameters())  # tied once
        encoder.to("meta")
    gc.collect()
    out.log(f"Text encoders released once every caption was encoded "
            f"({', '.join(n for n, _, _ in encoders)}: {freed / 2**30:.2f} GiB); building the "
            f"transformer")
    start = time.time()
    model.denoiser = model.build_denoiser(s.dtype)
    model.build_denoiser = None
    out.log(f"Transformer built from the file in {time.time() - start:.0f}s")
    return True

