"""Regional compilation: ``training.compile_scope = "regional"`` compiles each
repeated block of the denoiser (one compiled code object, reused by every copy of the block)
instead of the whole model, as diffusers' ``ModelMixin.compile_repeated_blocks`` does with the
class's ``_repeated_blocks``; the rest of the model runs eager. The blocks are compiled in place
(``Module.compile``), after the adapters are injected, so names and saved files are unchanged.
"""

from __future__ import annotations

from typing import Any

# denoisers whose diffusers class names no repeated blocks (diffusers 0.42: SD 3.5)
FALLBACK_BLOCKS = {"SD3Transformer2DModel": ("JointTransformerBlock",)}


def repeated_block_names(model: Any) -> tuple[str, ...]:
    names = tuple(getattr(model, "_repeated_blocks", None) or ())
    return names or FALLBACK_BLOCKS.get(type(model).__name__, ())


def compile_regional(model: Any, options: dict[str, Any]) -> int:
    """Compile every repeated block of ``model`` in place; returns how many. Raises
    ValueError when the model has none (the whole-model compile is then the choice)."""
    names = repeated_block_names(model)
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"training.compile_scope = 'regional': {type(model).__name__} has no "
                         f"repeated blocks to compile; set it to 'model'")
    for block in blocks:
        block.compile(**options)
    return len(blocks)
