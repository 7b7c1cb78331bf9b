"""The inputs an objective declares it reads (`register_policy_loss(name, reads=)`), beyond those
every objective gets; what each scoring pass makes comes from that one declaration (§3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PER_TOKEN, PolicyBatch

OLD = "old_"  # the rollout policy's score `name` is the input `old_<name>`
SCORED = frozenset(name.removeprefix(OLD) for name, spec in PER_TOKEN.items() if spec["scored"])
"""A policy pass's scores besides logp: the `scored` inputs of `PolicyBatch`, `old_` removed."""
GIVEN = {"logp", "old_logp", "advantages", "mask", "token_weights", "turns", "generator"}
# PolicyBatch fields every objective gets
GIVEN |= {"num_tokens", "num_seqs", "max_len", "entropy_kept", "sampling_logp"}
DECLARABLE = frozenset(f.name for f in fields(PolicyBatch)) - GIVEN  # the others, if declared
Reads = frozenset[str] | Callable[[AlgoConfig], frozenset[str]]  # fixed, or from the knobs


def scored(reads: frozenset[str], *, rollout: bool, on_policy: bool = False) -> frozenset[str]:
    """The scores a policy forward makes besides logp for an objective reading `reads`: in the
    score stage's pass (`rollout`) π_old's `old_*` ones; in the update's the current ones, the
    logged entropy and, on-policy, π_old's too (the current ones, detached)."""
    old = {name for name in SCORED if OLD + name in reads}
    if rollout:
        return frozenset(old)
    return frozenset({"entropy", *(reads & SCORED), *(old if on_policy else ())})
