"""Covariance token selection of Cui et al.'s KL-Cov and Clip-Cov (docs/objectives.md §1.6).

Cui et al. ("The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617) show that a
token's contribution to the entropy change is its covariance cov_t = (A_t − Ā)(ℓ_t − ℓ̄): tokens
with a large positive cov (a positive advantage on a token the policy already likes) are the ones
whose update makes the policy more certain. KL-Cov penalises the top share of them; Clip-Cov
takes a random share of those inside a covariance window out of the gradient. This module picks
the tokens; `cov_objectives.py` turns a pick into a loss, and `train/cov_selection.py` makes one
pick per optimizer step.

The selection size is a fraction f ∈ [0, 1] of the set's N valid tokens with an explicit
minimum of one: n = max(1, int(f · N)) (verl's formula; 0 when N = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CovSelection:
    """The tokens one selection picked ([B, T] bool, never padding) and what the metrics report.

    `candidates` is Clip-Cov's eligible count (None for KL-Cov, whose candidates are every
    valid token); `selected_cov_sum` the sum of cov over the picked tokens.
    """

    selected: Tensor
    valid: int
    candidates: int | None
    selected_cov_sum: float

    def metrics(self) -> dict[str, float]:
        """cov_selected (count), cov_selected_frac (of the valid tokens), cov_selected_mean
        (mean cov over the picked tokens, 0 without any) and, for Clip-Cov, cov_candidates."""
        count = int(self.selected.sum())
        metrics = {
            "cov_selected": float(count),
            "cov_selected_frac": count / self.valid if self.valid else 0.0,
            "cov_selected_mean": self.selected_cov_sum / count if count else 0.0,
        }
        if self.candidates is not None:
            metrics["cov_candidates"] = float(self.candidates)
        return metrics


def selection_count(fraction: float, valid: int) -> int:
    """n = max(1, int(fraction · valid)) tokens to pick out of `valid`; 0 when there are none.

    `int` truncates the float product as verl does (int(0.29 · 100) = 28), so a run here and a
    run in verl pick the same number of tokens from the same set."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"the selection fraction must be in [0, 1], got {fraction}")
    if valid <= 0:
        return 0
    return max(1, int(fraction * valid))


def token_covariance(advantages: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """[B, T] cov_t = (A_t − Ā)(ℓ_t − ℓ̄) in float64, with Ā and ℓ̄ the means over the valid
    tokens of these rows (detached; 0 on padding).

    `advantages` is [B] (one per response: every token of the row takes it) or [B, T]. Float64,
    so that the top-k order does not depend on the training dtype's rounding."""
    mask = mask.bool()
    adv = advantages.detach().to(torch.float64)
    adv = adv.unsqueeze(1).expand(mask.shape) if adv.dim() == 1 else adv
    ell = logp.detach().to(torch.float64)
    count = int(mask.sum())
    if count == 0:
        return torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    adv_mean = torch.where(mask, adv, 0.0).sum() / count
    ell_mean = torch.where(mask, ell, 0.0).sum() / count
    return torch.where(mask, (adv - adv_mean) * (ell - ell_mean), 0.0)


def top_covariance(cov: Tensor, mask: Tensor, fraction: float) -> CovSelection:
    """KL-Cov's pick: the n = max(1, int(f · N)) valid tokens with the largest cov (N: the
    valid tokens). Ties fall as `torch.topk` breaks them."""
    mask = mask.bool()
    valid = int(mask.sum())
    count = selection_count(fraction, valid)
    selected = torch.zeros_like(mask)
    if count:
        flat = torch.nonzero(mask.reshape(-1), as_tuple=True)[0]
        top = torch.topk(cov.reshape(-1)[flat], count, largest=True).indices
        selected.view(-1)[flat[top]] = True
    return CovSelection(selected, valid, None, _cov_sum(cov, selected))


def random_in_window(
    cov: Tensor,
    mask: Tensor,
    clipped: Tensor | None,
    lower: float,
    upper: float,
    fraction: float,
    generator: torch.Generator,
) -> CovSelection:
    """Clip-Cov's pick: n = max(1, int(f · N)) tokens (N: the valid tokens, as verl counts them)
    drawn uniformly at random, without replacement, among the candidates: valid tokens not
    already clipped by the PPO clip (`clipped`, None = none) with lower < cov < upper; all of
    them when there are fewer than n.

    The draw is `torch.randperm(candidates, generator=generator)` over the candidates in
    row-major order (verl's draw, with a generator of our own instead of the global one), so a
    seeded generator gives the same tokens on every run."""
    mask = mask.bool()
    valid = int(mask.sum())
    eligible = mask & (cov > lower) & (cov < upper)
    if clipped is not None:
        eligible = eligible & ~clipped.bool()
    flat = torch.nonzero(eligible.reshape(-1), as_tuple=True)[0]
    count = min(selection_count(fraction, valid), len(flat))
    order = torch.randperm(len(flat), generator=generator, device=generator.device)
    selected = torch.zeros_like(mask)
    selected.view(-1)[flat[order[:count].to(flat.device)]] = True
    return CovSelection(selected, valid, len(flat), _cov_sum(cov, selected))


def _cov_sum(cov: Tensor, selected: Tensor) -> float:
    return float(torch.where(selected, cov, 0.0).sum())
