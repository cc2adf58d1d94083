"""Weighted captions: ``(word:1.2)``, ``(word)``, ``[word]`` as sd-scripts reads them.

sd-scripts' ``--weighted_captions`` (library/strategy_base.py, ``TokenizeStrategy.
_get_weighted_input_ids``) takes AUTOMATIC1111's attention syntax:

- ``(text)`` multiplies the weight of ``text`` by 1.1, ``[text]`` divides it by 1.1;
- ``(text:w)`` multiplies it by ``w``; brackets nest and their factors multiply;
- an unclosed bracket still applies its factor to the rest of the text;
- ``\\(``, ``\\)``, ``\\[``, ``\\]`` and ``\\\\`` are the literal characters.

Each piece is tokenized on its own (without BOS/EOS), every token gets its piece's weight, and the
row is cut to the length, then wrapped in BOS ... EOS and padded (weights 1.0 outside the text).
The text encoder's hidden state of each token is then multiplied by its weight
(trainer/families/sd/long_prompts.py), without sd-scripts' older mean-restoring rescale, as its
current strategy code does.
"""

from __future__ import annotations

import re
from typing import Any

ROUND, SQUARE = 1.1, 1 / 1.1

# one lexeme of the syntax: an escape, a bracket, ':w)' (a weight closing a round bracket),
# a plain run of text, or a stray ':'
_LEXEME = re.compile(r"\\[()\[\]\\]|\\|\(|\[|:([+-]?[.\d]+)\)|\)|]|[^\\()\[\]:]+|:")


def parse_weights(text: str) -> list[tuple[str, float]]:
    """``text`` as (piece, weight) pairs, neighbours of equal weight merged; an empty text is
    ``[("", 1.0)]``. E.g. ``"an (important) word"`` -> ``[("an ", 1.0), ("important", 1.1),
    (" word", 1.0)]``."""
    pieces: list[list[Any]] = []
    opened: dict[str, list[int]] = {"(": [], "[": []}

    def scale(start: int, factor: float) -> None:
        for piece in pieces[start:]:
            piece[1] *= factor

    for match in _LEXEME.finditer(text):
        lexeme, weight = match.group(0), match.group(1)
        if lexeme.startswith("\\"):
            pieces.append([lexeme[1:], 1.0])
        elif lexeme in opened:
            opened[lexeme].append(len(pieces))
        elif weight is not None and opened["("]:
            scale(opened["("].pop(), float(weight))
        elif lexeme == ")" and opened["("]:
            scale(opened["("].pop(), ROUND)
        elif lexeme == "]" and opened["["]:
            scale(opened["["].pop(), SQUARE)
        else:
            pieces.append([lexeme, 1.0])
    for start in opened["("]:
        scale(start, ROUND)
    for start in opened["["]:
        scale(start, SQUARE)
    return _merge(pieces)


def _merge(pieces: list[list[Any]]) -> list[tuple[str, float]]:
    merged: list[list[Any]] = []
    for piece in pieces:
        if merged and merged[-1][1] == piece[1]:
            merged[-1][0] += piece[0]
        else:
            merged.append(list(piece))
    return [(p, w) for p, w in merged] or [("", 1.0)]


def weighted_ids(tokenizer: Any, text: str, length: int) -> tuple[list[int], list[float]]:
    """Token ids and per-token weights of ``text``, ``length`` long with BOS and EOS: the text's
    tokens cut to ``length - 2``, then padded with the tokenizer's pad token (weight 1.0)."""
    ids: list[int] = []
    weights: list[float] = []
    for piece, weight in parse_weights(text):
        tokens = tokenizer(piece, verbose=False).input_ids[1:-1]  # without BOS / EOS
        ids += tokens
        weights += [weight] * len(tokens)
        if len(ids) > length - 2:
            break
    ids, weights = ids[: length - 2], weights[: length - 2]
    pad = length - 2 - len(ids)
    ids = [tokenizer.bos_token_id] + ids + [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * pad
    return ids, [1.0] + weights + [1.0] * (pad + 1)
