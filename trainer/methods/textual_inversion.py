"""Textual inversion: new tokens in the tokenizer, and only their embedding rows learn.

``network.token_string`` becomes ``num_vectors_per_token`` tokens, named as diffusers and
AUTOMATIC1111 expand an embedding of several vectors: the token, then ``<token>_1``,
``<token>_2``, ... Their rows start from ``network.init_word`` (vector i from the word's token i,
repeated or cut to fit, as sd-scripts does), or from the mean embedding when it is unset. The
optimizer sees the whole input-embedding matrix; after every step the rows of every other token
are put back exactly as they were (Gal et al. 2022; the way diffusers' and sd-scripts' scripts
keep them), so nothing else of the text encoder, the UNet or the VAE changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from trainer.config import TrainConfig
from trainer.methods.base import MethodBase


class TokenError(ValueError):
    """A token string or init word that cannot be used; the message names the setting."""


def token_names(token: str, num_vectors: int) -> list[str]:
    """``<tok>``, ``<tok>_1``, ... ``<tok>_{n-1}``."""
    return [token] + [f"{token}_{i}" for i in range(1, num_vectors)]


def known_tokens(tokenizer: Any, names: list[str]) -> list[str]:
    """The names the tokenizer already reads as one token of its own: an added token, or a word
    of its vocabulary such as 'shape' (stored as 'shape</w>' in CLIP's BPE, so a plain lookup
    misses it). Adding such a name would hijack that word in every prompt."""
    vocab = tokenizer.get_vocab()
    taken = []
    for name in names:
        ids = tokenizer.encode(name, add_special_tokens=False)
        if name in vocab or (len(ids) == 1 and ids[0] != tokenizer.unk_token_id):
            taken.append(name)
    return taken


def check_read_back(tokenizer: Any, token: str, names: list[str]) -> None:
    """Refuse an embedding of several vectors whose added tokens the tokenizer reads as other
    text: CLIP lower-cases prompts, so diffusers' pipelines (their ``maybe_convert_prompt``, and
    with them this studio's samples) would find '<mycat>' for '<MyCat>' and use one vector only."""
    if len(names) < 2:
        return
    read = [tokenizer.tokenize(n) for n in names]
    if any(pieces != [n] for pieces, n in zip(read, names)):
        shown = " ".join(read[0])
        raise TokenError(f"network.token_string = {token!r}: the tokenizer reads it as "
                         f"{shown!r}, so pipelines would not find its other vectors; write it "
                         f"as the tokenizer does, e.g. {shown!r}")


def init_rows(tokenizer: Any, weight: torch.Tensor, init_word: Optional[str],
              num_vectors: int) -> torch.Tensor:
    """The starting vectors [num_vectors, dim]: the init word's token embeddings, cycled."""
    if init_word is None:
        return weight.detach().float().mean(0, keepdim=True).repeat(num_vectors, 1)
    ids = tokenizer.encode(init_word, add_special_tokens=False)
    if not ids:
        raise TokenError(f"network.init_word = {init_word!r} gives no tokens; use a word "
                         f"such as 'cat' or 'painting'")
    return torch.stack([weight[ids[i % len(ids)]].detach().float() for i in range(num_vectors)])


class _Table:
    """The input-embedding matrix of one text encoder: the new rows, and a copy of the rest."""

    def __init__(self, name: str, encoder: Any, tokenizer: Any, names: list[str], net: Any):
        start = init_rows(tokenizer, encoder.get_input_embeddings().weight, net.init_word,
                          len(names))  # from the vocabulary as it was, before the new rows
        tokenizer.add_tokens(names)
        check_read_back(tokenizer, net.token_string, names)
        self.name, self.token_ids = name, tokenizer.convert_tokens_to_ids(names)
        encoder.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        weight = encoder.get_input_embeddings().weight
        with torch.no_grad():
            weight[self.token_ids] = start.to(weight.device, weight.dtype)
        self.original = weight.detach().clone()
        self.keep = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
        self.keep[self.token_ids] = False

    def weight(self, model: Any) -> torch.nn.Parameter:
        return getattr(model, self.name).get_input_embeddings().weight

    def restore(self, model: Any) -> None:
        weight = self.weight(model)
        with torch.no_grad():
            weight[self.keep] = self.original[self.keep].to(weight.dtype)


class TextualInversionMethod(MethodBase):
    """SD 1.x/2.x: one table; SDXL: the token is learnt in both text encoders."""

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.trains_text_encoder = True  # the gradient flows through it to the embeddings
        self.tables: list[_Table] = []

    def prepare(self, model: Any) -> list[dict[str, Any]]:
        from trainer.models.conditioning import family_of

        net = self.cfg.network
        names = token_names(net.token_string, net.num_vectors_per_token)
        encoders = family_of(model).text_encoders(model)
        for _, _, tokenizer in encoders:
            taken = known_tokens(tokenizer, names)
            if taken:
                raise TokenError(f"network.token_string = {net.token_string!r}: the tokenizer "
                                 f"already knows {', '.join(taken)}; choose a new word such "
                                 f"as '<my-{net.token_string.strip('<>').lower()}>'")
        self.tables = [_Table(name, enc, tok, names, net) for name, enc, tok in encoders]
        for module in (model.unet, model.vae, *(enc for _, enc, _ in encoders)):
            module.requires_grad_(False)
        weights = [table.weight(model) for table in self.tables]
        for weight in weights:
            weight.requires_grad_(True)
        return [{"params": weights, "lr": self.cfg.optimizer.learning_rate,
                 "name": "embeddings"}]

    @property
    def token_ids(self) -> list[int]:
        """The new tokens' ids in the (first) tokenizer."""
        return self.tables[0].token_ids

    def embeddings(self, model: Any) -> list[torch.Tensor]:
        """The trained vectors [num_vectors, dim] of each text encoder."""
        return [t.weight(model)[t.token_ids] for t in self.tables]

    def after_step(self, model: Any, step: int) -> Optional[str]:
        for table in self.tables:
            table.restore(model)
        return None

    def save(self, path: Path, model: Any, facts: Any, final: bool = True) -> Path:
        from trainer.export.embedding import save_embedding

        net = self.cfg.network
        extra = {
            "ti_token_string": net.token_string,
            "ti_num_vectors": str(net.num_vectors_per_token),
            "ti_init_word": str(net.init_word),
            "ti_base_model_hash": str(facts.base_model_hash),
            "ss_output_name": self.cfg.saving.output_name,
            "ss_steps": str(facts.steps),
            "ss_epoch": str(facts.epoch),
            "ss_sd_model_name": Path(model.source).name,
        }
        vectors = self.embeddings(model)
        return save_embedding(path, vectors[0], vectors_g=vectors[1] if len(vectors) > 1
                              else None, cfg=self.cfg, facts=facts, dtype=self.save_dtype,
                              extra=extra)
