"""The shipped objectives (docs/objectives.md §1), each a registered plugin built from the shared parts.

All five are the same composition, driven by the knobs of their preset:
ratio per unit (§0.2) → routing (§0.3) → clipped surrogate (§0.4) → aggregation (§0.5) → + KL
(§0.6), so each name in `SHIPPED` registers `clipped_policy_loss`. They are registered under their
own names so that one can later get code of its own (a decorated function, taken out of `SHIPPED`)
without touching the others; a new objective is one more decorated function.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.clip import ClipFlags, clipped_surrogate
from tepo_cli.algos.kl import importance_weighted, kl_estimate
from tepo_cli.algos.ratio import RATIO_KNOBS, route_ratio, unit_log_ratio, unit_ratio
from tepo_cli.algos.registry import register_policy_loss
from tepo_cli.algos.tepo_mask import tepo_kl_mask
from tepo_cli.kernels.units import unit_view


def unit_advantages(
    advantages: Tensor, mask: Tensor, cfg: AlgoConfig, turns: Tensor | None = None
) -> Tensor:
    """The advantage each token's surrogate uses (§0.1), [B, 1] or [B, T].

    One advantage per response ([B]) is every token's. Token-level advantages ([B, T], e.g. GAE)
    [our reading]: a token unit and an MPO window (named by its anchor, the paper's Â_{i,t}) take
    their own token's; with `route=token` each token keeps its own too (GSPO-token's definition);
    a disjoint block or sequence clipped as one action (`route=unit`) takes the mean over its
    tokens, so the whole unit shares one clip decision.
    """
    if advantages.dim() == 1:
        return advantages.unsqueeze(1)
    own = cfg.unit == "token" or cfg.layout == "sliding" or cfg.route == "token"
    if own:
        return advantages
    view = unit_view(mask, cfg.unit, cfg.k, turns)
    return view.broadcast(view.mean(advantages))


def token_ratios(batch: PolicyBatch, cfg: AlgoConfig) -> Tensor:
    """[B, T] the ratio each token's surrogate uses: its unit's ρ_u, routed per `cfg.route`."""
    future = None
    if cfg.mtp_depths and batch.mtp_logp is not None and batch.old_mtp_logp is not None:
        future = batch.mtp_logp - batch.old_mtp_logp
    knobs = {name: getattr(cfg, name) for name in RATIO_KNOBS}
    log_ratio = unit_log_ratio(
        batch.logp, batch.old_logp, batch.mask, **knobs, future_log_ratio=future, turns=batch.turns
    )
    return route_ratio(unit_ratio(log_ratio), batch.logp, cfg.route)


def clipped_tokens(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, ClipFlags, Tensor]:
    """Per token: the clipped surrogate (mismatch-weighted), which clip acted, and the ratio."""
    ratio = token_ratios(batch, cfg)
    advantages = unit_advantages(batch.advantages, batch.mask, cfg, batch.turns)
    surrogate, flags = clipped_surrogate(
        ratio, advantages, cfg.eps_low, cfg.eps_high, cfg.dual_clip
    )
    if batch.token_weights is not None:  # mismatch correction (algos/mismatch.py)
        surrogate = surrogate * batch.token_weights.to(surrogate.dtype)
    return surrogate, flags, ratio


def clip_metrics(flags: ClipFlags, ratio: Tensor, mask: Tensor) -> dict[str, float]:
    """Shares of the valid tokens each clip acted on, and the mean ratio."""
    return {
        "clip_frac": _share(flags.low | flags.high, mask),
        "clip_frac_low": _share(flags.low, mask),
        "clip_frac_high": _share(flags.high, mask),
        "dual_clip_frac": _share(flags.dual, mask),
        "ratio_mean": _masked_mean(ratio.detach(), mask, empty=1.0),
    }


def policy_term(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """The clipped surrogate aggregated over the batch, and its clip / ratio metrics."""
    surrogate, flags, ratio = clipped_tokens(batch, cfg)
    loss = aggregate(surrogate, batch.mask, cfg.loss_agg, **batch.normalisers)
    return loss, {"pg_loss": float(loss.detach()), **clip_metrics(flags, ratio, batch.mask)}


def kl_term(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """β · agg(M ⊙ D): over all valid tokens with the policy term's aggregation; masked-out
    tokens count in the normaliser, so an empty mask gives exactly 0 (§0.6).

    The `kl` metric is the plain token mean of D (unmasked) whenever the target is available,
    even with β = 0; 0.0 when it is not. TEPO's mask is built from the inputs `kl_term_reads` names.
    """
    target = batch.ref_logp if cfg.kl_target == "ref" else batch.old_logp
    metrics: dict[str, float] = {"kl": 0.0, "kl_loss": 0.0}
    zero = batch.logp.new_zeros(())
    mask = batch.mask
    kl_mask = mask
    if cfg.kl_mask == "tepo" and (cfg.needs_old_entropy or cfg.mask_criterion == "advantage_only"):
        kl_mask = tepo_kl_mask(batch, cfg.mask_criterion)
        metrics["kl_mask_frac"] = _share(kl_mask, mask)
    if target is None:
        return zero, metrics
    if cfg.beta == 0:
        with torch.no_grad():
            metrics["kl"] = _masked_mean(kl_estimate(batch.logp, target, cfg.kl_estimator), mask)
        return zero, metrics
    divergence = kl_estimate(batch.logp, target, cfg.kl_estimator)
    metrics["kl"] = _masked_mean(divergence.detach(), mask)
    if cfg.kl_bias_correction:  # the loss's estimate only; the `kl` metric stays the plain D
        divergence = importance_weighted(divergence, batch.logp, batch.old_logp)
    masked = torch.where(kl_mask, divergence, 0.0)
    loss = cfg.beta * aggregate(masked, mask, cfg.loss_agg, **batch.normalisers)
    metrics["kl_loss"] = float(loss.detach())
    return loss, metrics


def kl_term_reads(cfg: AlgoConfig) -> frozenset[str]:
    """`kl_term`'s inputs: the reference's log-probs when the KL targets it (the `kl` metric reads
    them even at β = 0, where a run has none), π_old's entropies as TEPO's mask needs them."""
    needed = {"ref_logp": cfg.kl_target == "ref", "old_entropy": cfg.needs_old_entropy}
    needed |= {"entropy": cfg.needs_entropy, "old_entropy_term": cfg.needs_old_entropy_term}
    return frozenset(name for name, read in needed.items() if read)


def clipped_reads(cfg: AlgoConfig) -> frozenset[str]:
    """`clipped_policy_loss`'s inputs: the KL term's, and MPO's MTP log-probs."""
    return kl_term_reads(cfg) | ({"mtp_logp", "old_mtp_logp"} if cfg.mtp_depths else set())


def clipped_policy_loss(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor, dict[str, float]]:
    """Policy term + KL term, everything set by the knobs of `cfg`."""
    pg_loss, pg_metrics = policy_term(batch, cfg)
    kl_loss, kl_metrics = kl_term(batch, cfg)
    return pg_loss + kl_loss, {**pg_metrics, **kl_metrics}


SHIPPED: dict[str, str] = {
    "grpo": "GRPO (§1.1): token ratios, symmetric clip, seq-mean-token-mean, k3 KL to the reference",
    "dapo": "DAPO (§1.2): clip-higher, token-mean, no KL; sampling and reward knobs act in the loop",
    "gspo": "GSPO (§1.3): one length-normalised ratio per response; GSPO-token with route=token",
    "tepo": "TEPO (§1.4): sequence ratio routed to tokens, token-mean, k3 KL on TEPO's token mask",
    "mpo": "MPO (§1.5): one window of the next K tokens per position (or disjoint K-blocks, the "
    "ablation), each window's weighted log-ratio clipped as one action; future terms from the "
    "backbone (future=exact) or from the MTP modules (future=mtp)",
}
"""The shipped objectives and what their presets' knobs make of `clipped_policy_loss`."""

for _name in SHIPPED:  # every term but the KL is (clipped ratio) x advantage
    register_policy_loss(_name, reads=clipped_reads, advantage_proportional=True)(
        clipped_policy_loss
    )


def _share(flags: Tensor, mask: Tensor) -> float:
    """Fraction of the valid tokens where `flags` holds (0.0 without valid tokens)."""
    count = int(mask.sum())
    return int((flags & mask).sum()) / count if count else 0.0


def _masked_mean(values: Tensor, mask: Tensor, empty: float = 0.0) -> float:
    count = int(mask.sum())
    if count == 0:
        return empty
    return float(torch.where(mask, values, 0).sum() / count)
