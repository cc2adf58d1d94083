"""The tiny twins' Mistral tokenizer: a byte-level BPE (the ``tokenizers`` library's, as
Mistral's Tekken vocabulary is one, converted to ``tokenizer.json``) over the tiny models' word
list (the merges of :mod:`trainer.families.common.tiny_qwen`), with Mistral's control tokens
first, as Tekken numbers them (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``[INST]`` 3, ``[/INST]``
4, ``[IMG]`` 10, ``<pad>`` 11, ``[IMG_BREAK]`` 12, ``[IMG_END]`` 13, ``[SYSTEM_PROMPT]`` 17,
``[/SYSTEM_PROMPT]`` 18), and a chat template reduced to what FLUX.2 [dev]'s pipeline sends:
a system turn and a user turn whose contents are lists of text blocks, rendered as
``<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]`` (ComfyUI's literal form, BOS added).
Padding is on the left, as ComfyUI pads the dev context.

diffusers' ``Flux2Pipeline`` names a ``PixtralProcessor`` as its tokenizer, which needs
torchvision (not a dependency here); for text the processor renders the same template and hands
the text to this tokenizer without special tokens, so the tokenizer itself is what the family
passes (``apply_chat_template`` with padding, truncation and ``return_dict``)."""

from __future__ import annotations

from typing import Any

from trainer.families.common.tiny_qwen import vocab_and_merges

# Tekken's control tokens at their ids (the unused ones as placeholders)
CONTROL = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
           "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]",
           "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
           "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{%- if loop.first -%}{{- bos_token -}}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[INST]' + text + '[/INST]' -}}"
    "{%- else -%}{{- text + eos_token -}}{%- endif -%}"
    "{%- endfor -%}")


def vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The control tokens, then the byte symbols and merges of the tiny BPE."""
    vocab, merges = vocab_and_merges()
    tokens = list(CONTROL) + [t for t in vocab if not t.startswith("<|")
                              and t not in ("<think>", "</think>")]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}, merges


def build_mistral_tokenizer(model_max_length: int = 131072) -> Any:
    """A fast tokenizer over the tiny vocabulary: BOS ``<s>``, EOS ``</s>``, pad ``<pad>``
    on the left, Mistral's chat markers as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab, merges = vocabulary()
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", padding_side="left", model_max_length=model_max_length,
        additional_special_tokens=[t for t in CONTROL[3:] if t != "<pad>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
