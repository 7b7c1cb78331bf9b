"""The per-token inputs an objective reads, by name (docs/objectives.md §4).

Each registered objective declares which of `DECLARABLE` it reads under a config
(`register_policy_loss(name, reads=...)`); every objective also gets logp, old_logp, the
advantages, the mask, the mismatch weights and the turns. From that one declaration come the
quantities each scoring pass makes (`scored`), so adding an objective that reads a new per-token
quantity touches the objective and the scorer that makes it (models/policy.py), not the layers
between: the score stage keeps what it made by name, and the update builds the `PolicyBatch` from
that mapping.
"""

from __future__ import annotations

from collections.abc import Callable

from tepo_cli.algos.algo_config import AlgoConfig

SCORED = ("entropy", "entropy_term", "mtp_logp")
"""What a policy scoring pass can make besides `logp` (models/policy.py, `Policy.forward(make=)`);
an objective reads the rollout policy's as `old_<name>`."""

OLD = "old_"

DECLARABLE = frozenset({"ref_logp", *SCORED, *(OLD + name for name in SCORED), "cov_selected"}) - {
    "entropy_term"
}
"""The inputs an objective may declare (PolicyBatch fields): the current entropy and MTP
log-probs, the rollout policy's scores, the reference's log-probs and KL-Cov's pick."""

Reads = frozenset[str] | Callable[[AlgoConfig], frozenset[str]]
"""A declaration: the names read, fixed or as a function of the objective's knobs."""


def scored(reads: frozenset[str], *, rollout: bool, on_policy: bool = False) -> frozenset[str]:
    """The quantities a policy forward makes (besides logp) for an objective that reads `reads`.

    rollout: the score stage's no-grad pass, which makes π_old's `old_<name>` inputs.
    Otherwise the update's forward: every input read of the current policy, the entropy
    always (the step's logged `entropy`), and on-policy also the `old_<name>` ones (π_old is the
    current policy, its scores detached, train/micro_batch_objective.py)."""
    old = {name for name in SCORED if OLD + name in reads}
    if rollout:
        return frozenset(old)
    return frozenset({"entropy", *(reads & set(SCORED)), *(old if on_policy else ())})
