"""The score stage (`Scores`) and the record a step's stages make together: its `Experience`,
which the update reads.

Every record moves forward only: sampling's `Groups`, the no-grad `Scores` (which the KL in the
reward reads, before the advantage) and the `Advantages` go in, and the update never reaches back.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from tepo_cli.algos import objective_reads
from tepo_cli.algos.inputs import OLD, scored
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.records import Problem
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch, widen
from tepo_cli.models.policy import Policy
from tepo_cli.models.prompt_pass import MinibatchPrompts
from tepo_cli.models.reference import Reference
from tepo_cli.runtime.clock import StepClock
from tepo_cli.train.advantage_stage import Advantages
from tepo_cli.train.micro_batches import micro_batches_for
from tepo_cli.train.sampling import Groups


@dataclass
class Scores:
    """The score stage's no-grad passes over the step's rows (every field is Experience's)."""

    # π_old's scores by input name (old_logp, the declared old_* ones); empty when on-policy
    old: dict[str, torch.Tensor] = field(default_factory=dict)
    # On-policy, π_old's scores for what is read before the update's forwards (old_logp for
    # KL-Cov / Clip-Cov and the KL in the reward, old_entropy for top_entropy_quantile);
    # off-policy they are in `old`
    selection: dict[str, torch.Tensor] = field(default_factory=dict)
    ref_logp: torch.Tensor | None = None

    def before_update(self, name: str) -> torch.Tensor | None:
        """[N, T] π_old's score `name` (old_logp, old_entropy) as the score stage made it, for
        what is read before the update's forwards: from `old` off-policy, `selection` on-policy."""
        return self.old.get(name, self.selection.get(name))


@dataclass
class Experience:
    """One step's rows on this rank, everything the update's objective reads."""

    problems: list[Problem]  # one per group
    rollout: Rollout
    batch: SequenceBatch
    rewards: torch.Tensor  # [N] shaped rewards
    correct: torch.Tensor  # [N] bool
    advantages: torch.Tensor  # [N], or [N, T] from a critic
    # π_old's scores by input name (old_logp, the declared old_* ones); empty when on-policy
    old: dict[str, torch.Tensor] = field(default_factory=dict)
    # On-policy, π_old's scores for what is read before the update's forwards (Scores)
    selection: dict[str, torch.Tensor] = field(default_factory=dict)
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None  # [N, T] the critic's V at rollout (advantage=gae)
    returns: torch.Tensor | None = None  # [N, T] GAE returns, the critic's targets
    advantage_metrics: dict[str, float] = field(default_factory=dict)  # the critic's, KL's
    sampled_groups: int = 0  # groups generated this step (more than kept under dynamic sampling)
    refill_rounds: int = 0
    overlong_mean: float = 0.0
    reward_terms: dict[str, torch.Tensor] = field(default_factory=dict)  # [N] values by name
    base_rewards: torch.Tensor | None = None  # [N] the rewards before reward.terms
    env_sums: dict[str, float] = field(default_factory=dict)  # episodes' metric sums
    episode_records: list[dict[str, Any]] = field(default_factory=list)  # per row, the sampler's
    env_errors: list[str] | None = None  # the step's environment errors (None: no environment)

    @property
    def old_logp(self) -> torch.Tensor | None:
        """[N, T] π_old's log-probs from the score stage; None when the update is on-policy."""
        return self.old.get("old_logp")

    def before_update(self, name: str) -> torch.Tensor | None:
        """π_old's score `name` as the score stage made it (`Scores.before_update`)."""
        return self.old.get(name, self.selection.get(name))

    @classmethod
    def of(cls, groups: Groups, scores: Scores, advantages: Advantages) -> Experience:
        """The step's record from its stages' records, their tensors not copied."""
        return cls(**_fields_of(groups), **_fields_of(scores), **_fields_of(advantages))


def on_policy(cfg: TrainConfig) -> bool:
    """One optimizer step per rollout: π_old = π_θ, so old log-probs are the current ones."""
    return cfg.trainer.ppo_epochs == 1 and cfg.trainer.minibatches == 1


@torch.no_grad()
def score(
    cfg: TrainConfig,
    policy: Policy,
    reference: Reference | None,
    groups: Groups,
    clock: StepClock | None = None,
) -> Scores:
    """The step's `Scores`: old-policy scores (when off-policy: log-probs and what the objective
    reads besides — entropies, TEPO's first-order term, MPO's prediction depths) and reference
    log-probs, in micro-batches, without gradient."""
    scores = Scores()
    with (clock or StepClock())("score"):
        _add_scores(cfg, policy, reference, groups.batch, scores)
    return scores


def _fields_of(record: Groups | Scores | Advantages) -> dict[str, object]:
    """A record's fields by name, not copied (every one of them is also a field of Experience)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _add_scores(
    cfg: TrainConfig,
    policy: Policy,
    reference: Reference | None,
    batch: SequenceBatch,
    scores: Scores | Experience,
) -> None:
    """`batch`'s scores into `scores` (its old, selection and ref_logp fields)."""
    algo, need_old = cfg.algo, not on_policy(cfg)
    # On-policy, KL-Cov / Clip-Cov and top_entropy_quantile pick by π_old's log-probs or
    # entropies before the update's forwards (train/token_picks.py), and the KL in the reward
    # reads π_old's log-probs before the advantage: scored here, kept apart from old_logp, which
    # stays None so that the objective's π_old is the current forward's, detached, as for every
    # on-policy objective.
    read_early = algo.covariance_selection or algo.entropy_selection or algo.kl_reward_coef > 0
    need_selection = not need_old and read_early
    if not need_old and not need_selection and reference is None:
        return
    width = batch.completion_mask.shape[1]
    make = scored(objective_reads(cfg.algo), rollout=True)
    parts: dict[str, list[torch.Tensor]] = defaultdict(list)
    all_rows = torch.arange(len(batch), device="cpu")
    plan = micro_batches_for(cfg, batch, all_rows, policy)
    # Each distinct prompt once for all the micro-batches (models/prompt_pass.py), per model.
    old_prompts = ref_prompts = MinibatchPrompts(None, plan.rows)
    if need_old or need_selection:
        old_prompts = plan.prompts(policy.prompt_pass, batch)
    if reference is not None:
        ref_prompts = plan.prompts(reference.prompt_pass, batch)
    for index, rows in enumerate(plan.rows):
        part = batch.select(rows)
        if need_old or need_selection:
            made = policy(part, cfg.rollout.temperature, make=make, prompts=old_prompts.read(index))
            for name, value in made.items():
                parts[OLD + name].append(widen(value, width))
        if reference is not None:
            made = reference(part, cfg.rollout.temperature, prompts=ref_prompts.read(index))
            parts["ref_logp"].append(widen(made.logp, width))
    joined = {name: plan.in_row_order(values) for name, values in parts.items()}
    scores.ref_logp = joined.pop("ref_logp", None)
    if need_old:
        scores.old = joined
    else:
        scores.selection = joined
