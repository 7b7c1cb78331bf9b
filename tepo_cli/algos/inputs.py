"""The per-token inputs an objective declares it reads (`register_policy_loss(name, reads=)`),
beyond logp, old_logp, advantages, mask, token_weights and turns, which every objective gets; what
each scoring pass makes comes from that one declaration (docs/objectives.md §3)."""

from __future__ import annotations

from collections.abc import Callable

from tepo_cli.algos.algo_config import AlgoConfig

SCORED = ("entropy", "entropy_term", "mtp_logp")  # a policy pass's scores besides logp
OLD = "old_"  # the rollout policy's score `name` is the input `old_<name>`
DECLARABLE = frozenset({"ref_logp", "entropy", "mtp_logp", "cov_selected"}) | {
    OLD + name for name in SCORED
}
Reads = frozenset[str] | Callable[[AlgoConfig], frozenset[str]]  # fixed, or from the knobs


def scored(reads: frozenset[str], *, rollout: bool, on_policy: bool = False) -> frozenset[str]:
    """The scores a policy forward makes besides logp for an objective reading `reads`: in the
    score stage's pass (`rollout`) π_old's `old_*` ones; in the update's the current ones, the
    logged entropy and, on-policy, π_old's too (the current ones, detached)."""
    old = {name for name in SCORED if OLD + name in reads}
    if rollout:
        return frozenset(old)
    return frozenset({"entropy", *(reads & set(SCORED)), *(old if on_policy else ())})
