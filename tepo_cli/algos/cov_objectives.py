"""KL-Cov and Clip-Cov (Cui et al., arXiv 2505.22617), as verl ships them (docs/objectives.md §1.6).

Both are token-level policy gradients that act on the few tokens with a large covariance between
advantage and log-prob (algos/covariance.py), the tokens whose update drives the entropy down:
- `kl_cov`: −A·ρ on every token, no PPO clip, plus `cov_coef`·|ℓ − ℓ_old| on the top
  `cov_fraction` of the tokens by covariance (a penalty against the old policy, not the
  reference model).
- `clip_cov`: the PPO clipped surrogate max(−Aρ, −A·clip(ρ)), except on a random
  `cov_fraction` of the not-yet-clipped tokens with `cov_lb` < cov < `cov_ub`, whose term is
  dropped (no gradient).
Aggregation is the `loss_agg` knob (the presets: token-mean, verl's default); a `beta` > 0 adds
tepo's usual KL term (§0.6) on top.

Which tokens are picked: a `cov_selected` mask in the batch (the trainer's pick over the
optimizer step's rows, train/cov_selection.py), else a pick among the rows of this call, made
as verl makes it per micro-batch: cov from the current log-probs (detached), Clip-Cov's
already-clipped test from the current ratio, its draw from the batch's generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.covariance import (
    CovSelection,
    random_in_window,
    token_covariance,
    top_covariance,
)
from tepo_cli.algos.objectives import (
    _masked_mean,
    clip_metrics,
    clipped_tokens,
    kl_term,
    kl_term_reads,
    token_ratios,
    unit_advantages,
)
from tepo_cli.algos.registry import register_policy_loss


def cov_reads(cfg: AlgoConfig) -> frozenset[str]:
    return kl_term_reads(cfg) | {"cov_selected"}  # the trainer's pick, and the KL term's inputs


@register_policy_loss("kl_cov", reads=cov_reads)
def kl_cov_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """−A·ρ on every valid token (no clip), + `cov_coef`·|ℓ − ℓ_old| on the selected tokens.

    Not registered as advantage-proportional: the penalty has a gradient on a selected token of
    a zero-advantage row once π has moved away from π_old (a later minibatch or epoch)."""
    ratio = token_ratios(batch, cfg)
    advantages = unit_advantages(batch.advantages, batch.mask, cfg, batch.turns)
    surrogate = -ratio * advantages
    if batch.token_weights is not None:  # mismatch correction (algos/mismatch.py), policy term only
        surrogate = surrogate * batch.token_weights.to(surrogate.dtype)
    pick = _pick(batch, cfg, clipped=None)
    distance = (batch.logp - batch.old_logp).abs()
    penalty = torch.where(pick.selected, cfg.cov_coef * distance, 0.0)
    pg_loss = aggregate(surrogate, batch.mask, cfg.loss_agg, **batch.normalisers)
    cov_loss = aggregate(penalty, batch.mask, cfg.loss_agg, **batch.normalisers)
    kl_loss, kl_metrics = kl_term(batch, cfg)
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "cov_loss": float(cov_loss.detach()),
        "cov_abs_kl": _masked_mean(distance.detach(), batch.mask),
        "clip_frac": 0.0,  # no PPO clip: the key every objective reports, for reports and plots
        "ratio_mean": _masked_mean(ratio.detach(), batch.mask, empty=1.0),
        **_pick_metrics(batch, pick),
        **kl_metrics,
    }
    return pg_loss + cov_loss + kl_loss, metrics


@register_policy_loss("clip_cov", reads=cov_reads, advantage_proportional=True)
def clip_cov_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """max(−Aρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)) on every valid token but the selected ones,
    whose term is dropped: they get exactly zero gradient."""
    surrogate, flags, ratio = clipped_tokens(batch, cfg)
    clipped = flags.low | flags.high | flags.dual  # where the surrogate is already constant
    pick = _pick(batch, cfg, clipped=clipped)
    kept = torch.where(pick.selected, 0.0, surrogate)
    pg_loss = aggregate(kept, batch.mask, cfg.loss_agg, **batch.normalisers)
    kl_loss, kl_metrics = kl_term(batch, cfg)
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        **clip_metrics(flags, ratio, batch.mask),
        "cov_abs_kl": _masked_mean((batch.logp - batch.old_logp).abs().detach(), batch.mask),
        **_pick_metrics(batch, pick),
        **kl_metrics,
    }
    return pg_loss + kl_loss, metrics


def _pick(batch: PolicyBatch, cfg: AlgoConfig, clipped: Tensor | None) -> CovSelection:
    """The batch's `cov_selected`, or a pick among these rows (KL-Cov without `clipped`)."""
    if batch.cov_selected is not None:
        selected = batch.cov_selected
        return CovSelection(selected, int(batch.mask.sum()), None, 0.0)
    cov = token_covariance(batch.advantages, batch.logp, batch.mask)
    if clipped is None:
        return top_covariance(cov, batch.mask, cfg.cov_fraction)
    generator = batch.generator or torch.Generator().manual_seed(0)
    return random_in_window(
        cov, batch.mask, clipped, cfg.cov_lb, cfg.cov_ub, cfg.cov_fraction, generator
    )


def _pick_metrics(batch: PolicyBatch, pick: CovSelection) -> dict[str, float]:
    """The pick's metrics when it was made here; a pick passed in is reported by its maker."""
    return {} if batch.cov_selected is not None else pick.metrics()
