"""The tiny twins' Qwen tokenizer: a byte-level BPE in Qwen2's form (the ``Ġ`` space marker, no
end-of-word suffix), over the tiny models' word list, with the special tokens and the chat
template the Qwen-based families' pipelines use (``<|im_start|>``, ``<|im_end|>``, the vision
markers, ``<think>``). Built in code with a fixed merge order, offline: Qwen's real vocabulary
(151k tokens) cannot ship in a test. What the families read from a tokenizer is the same:
``apply_chat_template`` with ``enable_thinking`` (Qwen3, Z-Image and FLUX.2 klein), plain
``__call__`` with padding and the attention mask (Qwen-Image's template string)."""

from __future__ import annotations

import collections

from trainer.families.sd.tiny import _CORPUS, _merge, bytes_to_unicode

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
            "<|vision_end|>", "<|image_pad|>", "<|vision_pad|>", "<think>", "</think>")
NUM_MERGES = 160
# Qwen3's template reduced to what the families send: plain-text turns, an open assistant turn,
# and the empty think block that ``enable_thinking=False`` adds
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}")


def _learn(words: list[str], num_merges: int) -> list[tuple[str, str]]:
    """Byte-pair merges of words in Qwen2's byte-level form (a leading space as ``Ġ``)."""
    b2u = bytes_to_unicode()
    seqs: dict[tuple[str, ...], int] = {}
    for word, count in sorted(collections.Counter(words).items()):
        seqs[tuple(b2u[b] for b in (" " + word).encode("utf-8"))] = count
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for seq, count in seqs.items():
            for pair in zip(seq, seq[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        merges.append(best)
        seqs = {_merge(seq, best): count for seq, count in seqs.items()}
    return merges


def vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The tiny vocabulary (the 256 byte symbols, the merges, then the special tokens)."""
    merges = _learn(_CORPUS, NUM_MERGES)
    tokens = list(bytes_to_unicode().values()) + ["".join(m) for m in merges] + list(SPECIALS)
    return {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}, merges


def build_qwen_tokenizer(model_max_length: int = 131072):
    """A ``Qwen2Tokenizer`` (the class of Qwen2.5-VL's and Qwen3's tokenizers) over the tiny
    vocabulary: pads with ``<|endoftext|>``, ends chat turns with ``<|im_end|>``."""
    from transformers import Qwen2Tokenizer

    vocab, merges = vocab_and_merges()
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges,
                               unk_token=None, eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", model_max_length=model_max_length,
                               additional_special_tokens=list(SPECIALS[1:]))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
