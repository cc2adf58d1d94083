"""A simulated step as a law of the batch, the latent's sides and the LoRA ranks, so that two
simulations answer for every bucket, batch and rank.

Every tensor a UNet's step creates has a size of the form ``c * batch^a * height^b * width^d *
rank^e * conv_rank^f`` (channels times the batch times the pixels of its level; a LoRA's
inner activations carry the rank; attention's scores would carry the pixels twice, but fused
kernels keep none). Two simulations of the same step, the second with the batch x2, the
latent's height x3 and width x5, the ranks x7 and x11 (:func:`law_from`), give each tensor's
exponents from the ratio of its two sizes (a product of those primes) and its coefficient from
the first (whose values are powers of two: the coefficients are exact). The bytes alive at
each moment are then sums of such terms, and the step's peak for any values is the largest of
the sums at the moments where the count stopped rising. Moments that another exceeds term by
term are dropped, and so are those that are not within 0.2% of the largest anywhere on a grid
of the values the advisor asks about (:data:`BATCHES`, :data:`SIDES`, :data:`RANKS`): tens of
moments are left of thousands. Floating-point operations and parameter counts are laws the
same way.

The two simulations must run the same operations in the same order (else there is no law and
the advisor simulates each case). A batch or a rank of 1 does not: PyTorch views a tensor
with a dimension of 1 where it copies otherwise, so batch 1 has a law of its own
(:mod:`trainer.advisor.law_keys`). A tensor whose two sizes do not differ by such a product
(the VAE's one-pixel pad: height + 1) gets the nearest exponents (``inexact`` counts them).

A transformer's sequence joins the text's tokens to the image's: sizes there are sums, not
products. :func:`pixel_law` fits each size as a polynomial in the pixels through simulations at
three sizes (and at another batch and rank for their exponents).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Optional

VARIABLES = ("batch", "height", "width", "rank", "conv_rank")  # height, width: the latent's
RATIOS = (2, 3, 5, 7, 11)  # the second simulation's factor on each
Exps = tuple[int, ...]
Terms = dict[Exps, float]


@dataclass
class Recording:
    """One simulated step: every storage's bytes in the order they appeared, the timeline
    (``i`` when storage ``i`` appears, ``~i`` when it is freed), the counted operations'
    floating-point work in order (count, multiplier), and named sizes (parameters)."""

    sizes: list[int] = field(default_factory=list)
    timeline: list[int] = field(default_factory=list)
    work: list[tuple[int, float]] = field(default_factory=list)
    named: dict[str, list[int]] = field(default_factory=dict)
    ops: int = 0


def second_values(first: tuple[int, ...], varied: tuple[bool, ...]) -> tuple[int, ...]:
    return tuple(v * r if on else v for v, r, on in zip(first, RATIOS, varied))


def fit(n1: int, n2: int, first: tuple[int, ...], varied: tuple[bool, ...]
        ) -> tuple[Exps, float, bool]:
    """(exponents, coefficient, exact) of the monomial through sizes ``n1`` at ``first`` and
    ``n2`` at the second values."""
    if n1 == 0 or n2 == 0:
        return (0,) * len(first), 0.0, n1 == n2
    ratio = Fraction(n2, n1)
    num, den, exps = ratio.numerator, ratio.denominator, []
    for r, on in zip(RATIOS, varied):
        e = 0
        while on and num % r == 0:
            num //= r
            e += 1
        exps.append(e)
    exact = num == 1 and den == 1
    if not exact:  # the nearest product of the ratios
        target = math.log(n2 / n1)
        ranges = [range(4) if on else range(1) for on in varied]
        exps = list(min(itertools.product(*ranges), key=lambda es: abs(
            target - sum(e * math.log(r) for e, r in zip(es, RATIOS)))))
    scale = math.prod(v ** e for v, e in zip(first, exps))
    return tuple(exps), n1 / scale, exact


def value(terms: Terms, x: tuple[float, ...]) -> float:
    return sum(c * math.prod(v ** e for v, e in zip(x, exps) if e) for exps, c in terms.items())


def _add(terms: Terms, exps: Exps, c: float) -> None:
    if c:
        terms[exps] = terms.get(exps, 0.0) + c


# Where the advisor asks: batches, latent sides (SD: 32-4096 px) and ranks (the schema's range).
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SIDES = (4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 144, 160, 192,
         224, 256, 320, 384, 512)
RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
NEAR = 2e-3  # a candidate within this of the largest somewhere on the grid is kept


def _undominated(candidates: list[Terms], first: tuple[int, ...],
                 varied: tuple[bool, ...]) -> list[Terms]:
    """The candidates that could be the largest where the advisor asks: those no other one
    exceeds term by term, then those within :data:`NEAR` of the largest at some point of a grid
    over :data:`BATCHES`, :data:`SIDES` and :data:`RANKS`."""
    import numpy as np

    keys = sorted({k for t in candidates for k in t})
    vectors = sorted({tuple(t.get(k, 0.0) for k in keys) for t in candidates},
                     key=sum, reverse=True)
    kept: list[tuple[float, ...]] = []
    for v in vectors:
        if not any(all(a <= b * (1 + 1e-12) for a, b in zip(v, k)) for k in kept):
            kept.append(v)
    if len(kept) > 1 and keys:
        axes = [grid if on else (one,) for grid, on, one in zip(
            (BATCHES, SIDES, SIDES, RANKS, RANKS), varied, first)]
        coefficients, exps = np.array(kept).T, np.array(keys, dtype=float)
        near = np.zeros(len(kept), dtype=bool)
        points = np.array(list(itertools.product(*axes)), dtype=float)
        for chunk in np.array_split(points, max(1, len(points) // 20000)):
            sums = np.exp(np.log(chunk) @ exps.T) @ coefficients
            near |= (sums >= sums.max(axis=1, keepdims=True) * (1 - NEAR)).any(axis=0)
        kept = [v for v, on in zip(kept, near) if on]
    return [{k: c for k, c in zip(keys, v) if c} for v in kept]


@dataclass(frozen=True)
class Law:
    """Bytes at the candidate peaks, floating-point work and named sizes, as terms."""

    peaks: tuple[Terms, ...]
    work: Terms
    named: dict[str, Terms]
    ops: int
    inexact: int = 0

    def peak(self, x: tuple[float, ...]) -> float:
        return max((value(t, x) for t in self.peaks), default=0.0)

    def to_json(self) -> dict[str, Any]:
        def enc(terms: Terms) -> dict[str, float]:
            return {",".join(map(str, k)): c for k, c in sorted(terms.items())}
        return {"peaks": [enc(t) for t in self.peaks], "work": enc(self.work),
                "named": {n: enc(t) for n, t in self.named.items()}, "ops": self.ops,
                "inexact": self.inexact}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Law:
        def dec(terms: dict[str, float]) -> Terms:
            return {tuple(int(e) for e in k.split(",")): float(c) for k, c in terms.items()}
        return Law(tuple(dec(t) for t in data["peaks"]), dec(data["work"]),
                   {n: dec(t) for n, t in data["named"].items()}, int(data["ops"]),
                   int(data.get("inexact", 0)))


def _replay(timeline: list[int], storages: list[Terms]) -> list[Terms]:
    """The live bytes as terms at each moment where they stopped rising."""
    live: Terms = {}
    candidates: list[Terms] = []
    rising = False
    for event in timeline:
        terms = storages[event if event >= 0 else ~event]
        if event >= 0:
            for exps, c in terms.items():
                _add(live, exps, c)
            rising = True
            continue
        if rising:
            candidates.append(dict(live))
            rising = False
        for exps, c in terms.items():
            _add(live, exps, -c)
    if rising:
        candidates.append(dict(live))
    return candidates


def _same_operations(records: list[Recording]) -> bool:
    one = records[0]
    return all(r.timeline == one.timeline and len(r.work) == len(one.work) and r.ops == one.ops
               and {n: len(s) for n, s in r.named.items()}
               == {n: len(s) for n, s in one.named.items()} for r in records[1:])


def law_from(one: Recording, two: Recording, first: tuple[int, ...],
             varied: tuple[bool, ...]) -> Optional[Law]:
    """The law through two recordings (``two`` at :func:`second_values`), or None when they
    did not run the same operations."""
    if not _same_operations([one, two]):
        return None
    monomials = [fit(a, b, first, varied) for a, b in zip(one.sizes, two.sizes)]
    inexact = sum(1 for _, c, exact in monomials if not exact and c)
    candidates = _replay(one.timeline, [{exps: c} if c else {} for exps, c, _ in monomials])
    work: Terms = {}
    for (n1, times), (n2, _) in zip(one.work, two.work):
        exps, c, exact = fit(n1, n2, first, varied)
        inexact += 0 if exact else 1
        _add(work, exps, c * times)
    named: dict[str, Terms] = {}
    for name, sizes in one.named.items():
        terms = named.setdefault(name, {})
        for n1, n2 in zip(sizes, two.named[name]):
            exps, c, exact = fit(n1, n2, first, varied)
            inexact += 0 if exact else 1
            _add(terms, exps, c)
    return Law(tuple(_undominated(candidates, first, varied)), work, named, one.ops, inexact)


PIXEL_SIDES = (2, 3, 4)  # the pixel simulations' sides, in units of the first's side / 2


def pixel_law(records: dict[str, Recording], first: tuple[int, ...],
              varied: tuple[bool, ...]) -> Optional[Law]:
    """A law of the bytes where the pixels enter sums (a transformer's sequence: the text's
    tokens and the image's): ``records["base"]`` at ``first``; ``"batch"`` and ``"rank"``
    with that variable at its second value (:data:`RATIOS`); ``"pixels 3"`` and ``"pixels
    4"`` with the sides 3/2 and 2 x the first's. Each tensor's bytes are then the batch's
    and the rank's powers times a polynomial of degree 2 or less in height x width, through
    the three sizes (exact: a fused attention's tensors grow with the sequence at most)."""
    order = ["base", "pixels 3", "pixels 4"] + [n for n, on in (("batch", varied[0]),
                                                                 ("rank", varied[3])) if on]
    if not _same_operations([records[n] for n in order]):
        return None
    half = Fraction(first[1] * first[2], 4)
    areas = [half * k * k for k in PIXEL_SIDES]
    inexact, storages = 0, []
    for i, n0 in enumerate(records["base"].sizes):
        exps = [0] * len(first)
        for name, axis in (("batch", 0), ("rank", 3)):
            if varied[axis]:
                only = tuple(j == axis for j in range(len(first)))
                found, _, exact = fit(n0, records[name].sizes[i], first, only)
                exps[axis], inexact = found[axis], inexact + (0 if exact else 1)
        scale = first[0] ** exps[0] * first[3] ** exps[3]
        ys = [Fraction(records[n].sizes[i], scale) for n in order[:3]]
        terms: Terms = {}
        for degree, c in enumerate(_quadratic(areas, ys)):
            if c:
                terms[(exps[0], degree, degree, exps[3], 0)] = float(c)
        storages.append(terms)
    candidates = _replay(records["base"].timeline, storages)
    return Law(tuple(_undominated(candidates, first, varied)), {}, {}, records["base"].ops,
               inexact)


def _quadratic(xs: list[Fraction], ys: list[Fraction]) -> list[Fraction]:
    """c0, c1, c2 of the parabola through three points (Lagrange, exact)."""
    out = [Fraction(0)] * 3
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        a, b = (x for j, x in enumerate(xs) if j != i)
        d = (xi - a) * (xi - b)
        out[0] += yi * a * b / d
        out[1] -= yi * (a + b) / d
        out[2] += yi / d
    return out
