"""Low-rank approximation by the singular value decomposition: the math of resize and extract.

By the Eckart-Young-Mirsky theorem, the best rank-k approximation of a matrix in the Frobenius
norm keeps its k largest singular values, and its error is the norm of the discarded ones:
``|M - M_k|_F = sqrt(sum_{i>k} s_i^2)``. Both tools rest on it.

A LoRA's update ``up @ down`` has rank at most r, so its SVD needs no [out, in] matrix: with
QR factorizations ``up = Q_u R_u`` and ``down^T = Q_d R_d``, ``up @ down = Q_u (R_u R_d^T)
Q_d^T``, and the SVD of the r x r core ``R_u R_d^T = U' S V'^T`` gives ``U = Q_u U'``,
``V = Q_d V'`` (the standard route for a product of thin factors; Golub & Van Loan,
"Matrix Computations", 4th ed., 2.5 and 5.2).

How many singular values to keep (:func:`choose_rank`), per sd-scripts' ``resize_lora.py``
options; here each is the smallest k that meets its target:

    sv_ratio       s_i >= s_1 / param             (largest / smallest kept <= param)
    sv_fro         sqrt(sum_{i<=k} s_i^2) / |S|_2 >= param   (share of the Frobenius norm)
    sv_cumulative  sum_{i<=k} s_i / sum_i s_i >= param        (share of the nuclear norm)

(sd-scripts keeps one singular value more than that smallest k.)
"""

from __future__ import annotations

from typing import Optional

import torch

MIN_SV = 1e-7  # relative to the largest: below this a singular value counts as zero


def lowrank_svd(up: torch.Tensor, down: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SVD ``(U, S, Vh)`` of ``up @ down`` ([out, r] @ [r, in]) through the r x r core; the
    factors are thin (r columns / rows)."""
    q_up, r_up = torch.linalg.qr(up.double())
    q_down, r_down = torch.linalg.qr(down.double().T)
    u, s, vh = torch.linalg.svd(r_up @ r_down.T)
    return (q_up @ u).float(), s.float(), (vh @ q_down.T).float()


def full_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of a 2-D matrix, in fp32."""
    return torch.linalg.svd(matrix.float(), full_matrices=False)


def _smallest_reaching(shares: torch.Tensor, target: float) -> int:
    """1 + the first index where the cumulative share reaches ``target`` (tolerating
    rounding), or all of them."""
    reached = (shares >= target - 1e-6).nonzero()
    return int(reached[0]) + 1 if len(reached) else len(shares)


def choose_rank(s: torch.Tensor, max_rank: int, method: Optional[str] = None,
                param: Optional[float] = None) -> int:
    """How many singular values ``s`` (descending) to keep: ``max_rank`` (or all of ``s`` if
    fewer), or fewer by the dynamic ``method``, which keeps no zero singular value; 1 for a
    zero matrix, as sd-scripts does."""
    s = s.double()
    if not len(s) or s[0] <= 0:
        return 1
    k = min(max_rank, len(s))
    if method is None:
        return max(1, k)
    nonzero = int((s > s[0] * MIN_SV).sum())
    if method == "sv_ratio":
        k = int((s >= s[0] / param).sum())
    elif method == "sv_fro":
        k = _smallest_reaching((s.pow(2).cumsum(0) / s.pow(2).sum()).sqrt(), param)
    elif method == "sv_cumulative":
        k = _smallest_reaching(s.cumsum(0) / s.sum(), param)
    else:
        raise ValueError(f"unknown dynamic method {method!r}")
    return max(1, min(k, max_rank, nonzero))


def kept_energy(s: torch.Tensor, k: int) -> tuple[float, float]:
    """(share of the Frobenius norm, share of the sum of singular values) kept by ``k``."""
    s = s.double()
    fro = s.pow(2).sum().sqrt()
    total = s.sum()
    if total == 0:
        return 1.0, 1.0
    return float(s[:k].pow(2).sum().sqrt() / fro), float(s[:k].sum() / total)


def discarded_norm(s: torch.Tensor, k: int) -> float:
    """The Frobenius error of the rank-``k`` truncation (Eckart-Young-Mirsky)."""
    return float(s[k:].double().pow(2).sum().sqrt())


def split_factors(u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(up [out, k], down [k, in]) with ``up @ down`` the rank-``k`` truncation; each factor
    takes sqrt(s), so both have the same scale (kinder to fp16 than all of s on one side)."""
    root = s[:k].sqrt()
    return u[:, :k] * root, root[:, None] * vh[:k]


def clamp_quantile(up: torch.Tensor, down: torch.Tensor, quantile: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Clamp both factors' values to +- the ``quantile`` of their joined values, as
    sd-scripts' extractor does against outliers (it changes the product a little)."""
    values = torch.cat([up.flatten(), down.flatten()]).float()
    if values.numel() > 2**24:  # torch.quantile's limit: estimate from a strided sample
        values = values[:: values.numel() // 2**24 + 1]
    hi = torch.quantile(values, quantile)
    return up.clamp(-hi, hi), down.clamp(-hi, hi)
