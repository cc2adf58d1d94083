"""FLUX.2's last single-stream block without the rows nobody reads.

The transformer drops the text tokens after its last single-stream block
(``Flux2Transformer2DModel.forward``: ``hidden_states[:, num_txt_tokens:]``), so that block's
outputs for the text rows are never read: only their keys and values matter, for the image
rows' attention. diffusers computes the whole block for every row. :func:`live_rows_only`
gives the last block a forward that computes, for the text rows, only the key and value
columns of the fused input projection (trainer/families/common/columns.py: those rows of the
weight where the layer is a frozen Linear or a lean LoRA layer, else the whole layer and a
slice), and the queries, attention, SwiGLU and output projection for the image rows alone.
The image rows are diffusers' to float rounding (a product over fewer rows or columns may
round differently); the text rows it returns are its inputs, which the transformer drops.

On klein 4B's widths that is, per text row, 0.85 of the block's matrix products (the fused
projection's 21504 query and MLP columns of 27648, and the output projection), forward and
backward: at 256 px (512 text + 256 image tokens) 0.57 of the last block's work, at 1024 px
(4096 image tokens) a tenth of it; one block of 25 in the released model.

Where the call is not the plain one (a KV cache, attention kwargs or a mask, the blocks' split
output, per-token modulation, another attention processor, a tensor-parallel projection), the
block runs diffusers' own forward.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Optional

import torch


def live_rows_only(transformer: Any) -> bool:
    """Give the last single-stream block of ``transformer`` (a ``Flux2Transformer2DModel``,
    or a module holding one) the forward above, once; a pre-hook on the transformer tells it
    each call's text length. Returns whether it was installed now."""
    model = next((m for m in transformer.modules()
                  if hasattr(m, "single_transformer_blocks")), None)
    if model is None or not len(model.single_transformer_blocks) \
            or getattr(model, "_live_rows_only", False):
        return False
    last = model.single_transformer_blocks[-1]
    last._text_rows = None
    last._diffusers_forward = last.forward
    last.forward = types.MethodType(_forward, last)
    model.register_forward_pre_hook(functools.partial(_note_text_rows, last), with_kwargs=True)
    model._live_rows_only = True
    return True


def _note_text_rows(last: Any, module: Any, args: tuple, kwargs: dict) -> None:
    """The text length of this call, or None where the call is not the plain one (the
    block then runs diffusers' forward)."""
    text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
    plain = len(args) <= 2 and kwargs.get("kv_cache") is None \
        and kwargs.get("kv_cache_mode") is None and not kwargs.get("joint_attention_kwargs")
    last._text_rows = text.shape[1] if plain and text is not None and text.dim() == 3 else None


def _plain_call(block: Any, hidden: torch.Tensor, text: Any, temb_mod: torch.Tensor,
                rotary: Any, kwargs: Any, split: bool) -> Optional[int]:
    """The text length where this call can skip its dead rows, else None."""
    from diffusers.models.transformers.transformer_flux2 import Flux2ParallelSelfAttnProcessor

    rows, attn = block._text_rows, block.attn
    expected = 3 * attn.inner_dim + attn.mlp_hidden_dim * attn.mlp_mult_factor
    if (not rows or text is not None or split or kwargs or rotary is None
            or temb_mod.dim() != 2 or hidden.dim() != 3 or hidden.shape[1] <= rows
            or type(attn.processor) is not Flux2ParallelSelfAttnProcessor
            or getattr(attn.to_qkv_mlp_proj, "out_features", None) != expected):
        return None
    return rows


def _forward(self: Any, hidden_states: torch.Tensor,
             encoder_hidden_states: Optional[torch.Tensor] = None,
             temb_mod: Optional[torch.Tensor] = None, image_rotary_emb: Any = None,
             joint_attention_kwargs: Optional[dict] = None, split_hidden_states: bool = False,
             text_seq_len: Optional[int] = None) -> Any:
    t = _plain_call(self, hidden_states, encoder_hidden_states, temb_mod, image_rotary_emb,
                    joint_attention_kwargs, split_hidden_states)
    if t is None:
        return self._diffusers_forward(hidden_states, encoder_hidden_states, temb_mod,
                                       image_rotary_emb, joint_attention_kwargs,
                                       split_hidden_states, text_seq_len)
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_flux2 import Flux2Modulation

    from trainer.families.common.columns import linear_columns

    attn = self.attn
    inner = attn.inner_dim
    shift, scale, gate = Flux2Modulation.split(temb_mod, 1)[0]
    x = (1 + scale) * self.norm(hidden_states) + shift
    image = attn.to_qkv_mlp_proj(x[:, t:])                                # every column
    text_kv = linear_columns(attn.to_qkv_mlp_proj, x[:, :t], inner, 3 * inner)
    q, k, v, mlp = torch.split(image, [inner, inner, inner, image.shape[-1] - 3 * inner], -1)
    text_k, text_v = text_kv.chunk(2, dim=-1)

    def heads(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.unflatten(-1, (-1, attn.head_dim))

    query = attn.norm_q(heads(q))
    key = attn.norm_k(heads(torch.cat([text_k, k], dim=1)))
    value = heads(torch.cat([text_v, v], dim=1))
    cos, sin = image_rotary_emb
    query = apply_rotary_emb(query, (cos[t:], sin[t:]), sequence_dim=1)
    key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
    out = dispatch_attention_fn(query, key, value, attn_mask=None,
                                backend=attn.processor._attention_backend,
                                parallel_config=attn.processor._parallel_config)
    out = out.flatten(2, 3).to(query.dtype)
    out = attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))
    image_rows = hidden_states[:, t:] + gate * out
    if image_rows.dtype == torch.float16:
        image_rows = image_rows.clip(-65504, 65504)
    return torch.cat([hidden_states[:, :t], image_rows], dim=1)
