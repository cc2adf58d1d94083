"""Caption options: shuffle with keep_tokens, caption and tag dropout, prefix and suffix."""

from __future__ import annotations

import random

from trainer.data.captions import CaptionOptions, apply_caption, split_tags

CAPTION = "sks cat, sitting, on a sofa, red collar, indoor, daylight"


def test_no_options_leave_the_caption_unchanged():
    assert apply_caption(CAPTION, CaptionOptions(), random.Random(0)) == CAPTION


def test_prefix_and_suffix_wrap_the_caption():
    opts = CaptionOptions(prefix="photo of", suffix="best quality")
    assert apply_caption("a cat", opts, random.Random(0)) == "photo of, a cat, best quality"
    assert apply_caption("", opts, random.Random(0)) == "photo of, best quality"


def test_shuffle_keeps_the_first_keep_tokens_and_the_tag_set():
    opts = CaptionOptions(shuffle=True, keep_tokens=2)
    results = {apply_caption(CAPTION, opts, random.Random(seed)) for seed in range(30)}
    assert len(results) > 5  # it really shuffles
    for result in results:
        tags = split_tags(result)
        assert tags[:2] == ["sks cat", "sitting"]
        assert sorted(tags) == sorted(split_tags(CAPTION))


def test_shuffle_is_reproducible_from_the_seed():
    opts = CaptionOptions(shuffle=True)
    first = [apply_caption(CAPTION, opts, random.Random(7)) for _ in range(3)]
    assert len(set(first)) == 1


def test_caption_dropout_empties_the_caption():
    always = CaptionOptions(dropout_rate=1.0, prefix="p")
    assert apply_caption(CAPTION, always, random.Random(0)) == ""
    half = CaptionOptions(dropout_rate=0.5)
    rng = random.Random(1)
    dropped = sum(apply_caption(CAPTION, half, rng) == "" for _ in range(400))
    assert 150 < dropped < 250


def test_tag_dropout_drops_tags_but_never_kept_ones():
    all_gone = CaptionOptions(tag_dropout_rate=1.0, keep_tokens=1)
    assert apply_caption(CAPTION, all_gone, random.Random(0)) == "sks cat"
    half = CaptionOptions(tag_dropout_rate=0.5, keep_tokens=1)
    rng = random.Random(3)
    lengths = [len(split_tags(apply_caption(CAPTION, half, rng))) for _ in range(300)]
    assert 2.8 < sum(lengths) / len(lengths) < 4.2  # 1 kept + about half of 5
    order = split_tags(CAPTION)
    for _ in range(20):
        kept = split_tags(apply_caption(CAPTION, half, rng))
        assert kept == sorted(kept, key=order.index)  # no shuffle: order preserved


def test_is_static():
    assert CaptionOptions(prefix="a", keep_tokens=3).is_static
    assert not CaptionOptions(shuffle=True).is_static
    assert not CaptionOptions(dropout_rate=0.1).is_static
    assert not CaptionOptions(tag_dropout_rate=0.1).is_static
