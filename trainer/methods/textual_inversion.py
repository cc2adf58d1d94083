"""Textual inversion: new tokens in the tokenizer, and only their embedding rows learn.

``network.token_string`` becomes ``num_vectors_per_token`` tokens, named as diffusers and
AUTOMATIC1111 expand an embedding of several vectors: the token, then ``<token>_1``,
``<token>_2``, ... Their rows start from ``network.init_word`` (vector i from the word's token i,
repeated or cut to fit, as sd-scripts does), or from the mean embedding when it is unset, or
from an embedding file (``network.embedding_weights``, sd-scripts' ``--weights``). The
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


# Keys of an embedding file per text encoder: SDXL's (sd-scripts' sdxl_train_textual_inversion
# and ours) name each encoder's vectors; one-encoder files hold a single tensor under any name
SDXL_KEYS = ("clip_l", "clip_g")


def _tensors_of(path: Path) -> dict[str, Any]:
    """The tensors of an embedding file: safetensors, or a torch file of tensors only
    (``weights_only``: nothing else is unpickled)."""
    if path.suffix.lower() == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a pickle of more than tensors, or not a torch file
        raise TokenError(f"network.embedding_weights = {str(path)!r}: cannot be read as "
                         f"tensors only ({type(exc).__name__}); save it as .safetensors") \
            from None
    if isinstance(data, dict) and isinstance(data.get("string_to_param"), dict):
        data = data["string_to_param"]  # AUTOMATIC1111's .pt embeddings
    if not isinstance(data, dict):
        raise TokenError(f"network.embedding_weights = {str(path)!r} holds a "
                         f"{type(data).__name__}, not a dict of tensors")
    return data


def embedding_file_vectors(path_text: str, widths: list[int], count: int) -> list[torch.Tensor]:
    """The vectors [count, width] for each text encoder of the model (``widths``: their
    embedding widths) from an embedding file, as sd-scripts' ``load_weights`` reads it: SD
    1.x / 2.x take the file's first tensor (``emb_params``, AUTOMATIC1111's ``*``, diffusers'
    ``<token>``), SDXL ``clip_l`` and ``clip_g``. A file of another family, another width or
    another number of vectors is refused, naming both."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise TokenError(f"network.embedding_weights = {path_text!r}: no such file")
    data = {k: v for k, v in _tensors_of(path).items() if isinstance(v, torch.Tensor)}
    if not data:
        raise TokenError(f"network.embedding_weights = {path_text!r} holds no tensor")
    if len(widths) == 2:
        missing = [k for k in SDXL_KEYS if k not in data]
        if missing:
            raise TokenError(f"network.embedding_weights = {path_text!r} has no "
                             f"{' / '.join(missing)} vectors: an SDXL embedding holds clip_l "
                             f"and clip_g (this one has {', '.join(sorted(data))})")
        tensors = [data[k] for k in SDXL_KEYS]
    else:
        if any(k in data for k in SDXL_KEYS):
            raise TokenError(f"network.embedding_weights = {path_text!r} is an SDXL embedding "
                             f"(clip_l / clip_g); this model has one text encoder")
        tensors = [data.get("emb_params", next(iter(data.values())))]
    out = []
    for tensor, width in zip(tensors, widths):
        vectors = tensor.detach().float()
        vectors = vectors.unsqueeze(0) if vectors.dim() == 1 else vectors
        if vectors.dim() != 2 or vectors.shape[1] != width:
            raise TokenError(f"network.embedding_weights = {path_text!r} has vectors of shape "
                             f"{tuple(tensor.shape)}; this model's text encoder is {width} "
                             f"wide (another model family's embedding?)")
        if vectors.shape[0] != count:
            raise TokenError(f"network.embedding_weights = {path_text!r} has "
                             f"{vectors.shape[0]} vectors, network.num_vectors_per_token = "
                             f"{count}: set them equal")
        out.append(vectors)
    return out


class _Table:
    """The input-embedding matrix of one text encoder: the new rows, and a copy of the rest."""

    def __init__(self, name: str, encoder: Any, tokenizer: Any, names: list[str], net: Any,
                 start: Optional[torch.Tensor] = None):
        if start is None:  # from the vocabulary as it was, before the new rows
            start = init_rows(tokenizer, encoder.get_input_embeddings().weight, net.init_word,
                              len(names))
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
        from trainer.families import family_of

        net = self.cfg.network
        names = token_names(net.token_string, net.num_vectors_per_token)
        encoders = family_of(model).text_encoders(model)
        for _, _, tokenizer in encoders:
            taken = known_tokens(tokenizer, names)
            if taken:
                raise TokenError(f"network.token_string = {net.token_string!r}: the tokenizer "
                                 f"already knows {', '.join(taken)}; choose a new word such "
                                 f"as '<my-{net.token_string.strip('<>').lower()}>'")
        starts: list[Optional[torch.Tensor]] = [None] * len(encoders)
        if net.embedding_weights:  # sd-scripts' --weights: the file's vectors replace init_word's
            widths = [enc.get_input_embeddings().weight.shape[1] for _, enc, _ in encoders]
            starts = list(embedding_file_vectors(net.embedding_weights, widths, len(names)))
        self.tables = [_Table(name, enc, tok, names, net, start)
                       for (name, enc, tok), start in zip(encoders, starts)]
        for module in (model.denoiser, model.vae, *(enc for _, enc, _ in encoders)):
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
