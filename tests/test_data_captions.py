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


def test_wildcards_draw_a_line_and_an_option_of_each_group():
    from trainer.data.captions import expand_wildcards

    text = "a {red|blue|green} cat, {{literal}}\nthe {big|small} dog"
    drawn = {expand_wildcards(text, random.Random(seed)) for seed in range(200)}
    assert drawn == {f"a {c} cat, {{literal}}" for c in ("red", "blue", "green")} | {
        f"the {s} dog" for s in ("big", "small")}
    assert expand_wildcards(text, None) == "a red cat, {literal}"  # validation: the first


def test_wildcards_come_before_the_shuffle_and_reach_the_prefix():
    opts = CaptionOptions(wildcard="random", shuffle=True, keep_tokens=1,
                          prefix="{photo|drawing} of")
    seen = {apply_caption("sks, {a|b}, c", opts, random.Random(seed)) for seed in range(100)}
    assert all(s.split(", ")[:2] in (["photo of", "sks"], ["drawing of", "sks"]) for s in seen)
    assert {frozenset(split_tags(s)[2:]) for s in seen} == {frozenset({"a", "c"}),
                                                            frozenset({"b", "c"})}
    assert not CaptionOptions(wildcard="random").is_static
    assert CaptionOptions(wildcard="first").is_static
    assert apply_caption("x\ny", CaptionOptions(), random.Random(0)) == "x\ny"  # off: as read


def test_a_wildcard_dataset_trains_every_line_of_its_caption_files(tmp_path):
    from train_helpers import one_image_dataset, small_config

    from trainer.data import prepare_dataset
    from trainer.data.text_cache import text_cache_blocker

    data = one_image_dataset(tmp_path / "data", caption="first {one|two}")
    (data / "1_circle" / "circle.txt").write_text("first {one|two}\n\nsecond line\n")
    cfg = small_config(tmp_path, data, dataset={"enable_wildcard": True})
    trained = prepare_dataset(cfg, lambda _: None)
    captions = {c for epoch in range(1, 40) for b in trained.epoch(epoch, 1, seed=0)
                for c in b.captions}
    assert captions == {"first one", "first two", "second line"}
    assert "dataset.enable_wildcard" in text_cache_blocker(cfg)
    plain = prepare_dataset(small_config(tmp_path, data), lambda _: None)
    assert [b.captions for b in plain.epoch(1, 1, seed=0)] == [["first {one|two}"]]
