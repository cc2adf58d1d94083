"""What the advisor's preset tests share: a GPU card of a size, and the check that a preset is
the cheapest combination that fits its card."""

from __future__ import annotations

from trainer.advisor.advice import FITS_BELOW, GIB
from trainer.system.device import DeviceInfo


def card(gb: int) -> DeviceInfo:
    return DeviceInfo("cuda", "NVIDIA GeForce RTX", "cuda:0", gb * GIB, True, True, "2.13")


def assert_cheapest_fit(cfg, gb: int, side: tuple[int, int] = (1024, 1024)) -> None:
    """``cfg`` (a preset, its files set) is what the advisor recommends for a ``gb`` card: the
    cheapest option that fits (base precision, block swap, batch), nothing left to advise, and
    the text encoder fits the card while the captions are encoded."""
    from trainer.advisor.estimate import advise
    from trainer.advisor.flow_advice import cheapest_fit, flow_transformer_config

    tr = cfg.training
    option, memory = cheapest_fit(flow_transformer_config(cfg.model), cfg, side, gb * GIB,
                                  tr.train_batch_size)
    assert (option.base, option.swap, option.batch) == (
        cfg.model.base_precision, tr.blocks_to_swap, tr.train_batch_size)
    advice = advise(cfg, card(gb))
    assert not advice.problems, advice.problems
    assert not advice.recommendations or all(not r.changes for r in advice.recommendations)
    assert advice.memory.peak == memory.peak < gb * GIB * FITS_BELOW
    text = next(p for p in advice.phases if p.name == "text cache")
    assert text.device < gb * GIB * FITS_BELOW
