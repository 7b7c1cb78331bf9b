"""The update phase: μ epochs x minibatches of the objective, through the DeepSpeed engine.

Loss normalisers are the global counts of the whole optimizer step (all micro-batches, all ranks),
so gradient accumulation and data parallelism give the same objective as one big batch
(docs/objectives.md §0.5). DeepSpeed averages gradients over ranks, hence the loss is scaled by the
world size, and its own 1/accumulation scaling is turned off.

Micro-batches are planned by token budget (`trainer.micro_batch_tokens`, train/micro_batches.py),
so their number varies from one optimizer step to the next: the accumulation boundary is set by
hand on each engine (`set_gradient_accumulation_boundary`, True on the last micro-batch only), which
is what DeepSpeed's reductions (ZeRO-0/1/2 at the boundary, ZeRO-2/3 reduce-scatter buckets) and its
`step()` read, at every stage.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from tepo_cli.algos.aggregate import aggregate
from tepo_cli.algos.gae import value_loss
from tepo_cli.algos.mismatch import MismatchTally
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.prompt_pass import MinibatchPrompts, reads_prompt_pass, through_engine
from tepo_cli.runtime.guards import skipped_optimizer_steps
from tepo_cli.runtime.hooks import NO_HOOKS, RunHooks
from tepo_cli.train.cov_selection import selection_seed
from tepo_cli.train.experience import Experience, on_policy
from tepo_cli.train.flops import ModelShape, policy_shape, update_work
from tepo_cli.train.learner import Learner
from tepo_cli.train.left_out_entropy import left_out_entropy
from tepo_cli.train.micro_batch_objective import (
    forward_scores,
    micro_batch_objective,
    objective_batch,
)
from tepo_cli.train.micro_batches import Plan, micro_batches_for
from tepo_cli.train.recompute import checkpoint_plan, checkpointed, prompt_pass_checkpointed
from tepo_cli.train.token_picks import StepPicks, step_picks
from tepo_cli.train.zero_advantage import may_skip, rows_with_gradient


def additive(metric: str) -> bool:
    """Whether a micro-batch's metric is its rank's part of a sum under the step's global
    normalisers, summed over the micro-batches of an optimizer step (the others are token-weighted
    means, see _Tally): the loss and its terms, which every objective, attached module and the
    critic name `*loss` (`pg_loss`, `kl_loss`, `cov_loss`, `value_loss`, ...)."""
    return metric.endswith("loss")


def accumulation_steps(cfg: TrainConfig) -> int:
    """Micro-batches per optimizer step in the fixed-count mode, per rank: DeepSpeed's nominal
    gradient_accumulation_steps (its batch-size bookkeeping). The update sets each accumulation
    boundary itself, so a token-budget plan with another count steps at the right place too."""
    per_minibatch = (
        cfg.trainer.prompts_per_step // cfg.trainer.nproc * cfg.rollout.n // cfg.trainer.minibatches
    )
    return -(-per_minibatch // cfg.trainer.micro_batch_size)


@dataclass
class _Tally:
    """What the micro-batches of a step add up: metric sums (averaged over optimizer steps at the
    end), seconds (summed), gradient norms per optimizer step, and the mismatch statistics.

    Each optimizer step's metric is independent of how its minibatch was split: the additive
    ones (`additive`: loss terms under global normalisers) are summed over its micro-batches, the
    others (fractions, means) weighted by each micro-batch's share of the minibatch's valid
    tokens on this rank. `prompt_pass_tokens`: the tokens of this rank's prompt pass (0 without
    one), per optimizer step. `update_flops` and `trained_tokens`: the needed work of the rows
    this rank ran, over the whole update (train/flops.py; step_records.py sums them over ranks)."""

    shape: ModelShape

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # whole step
    optimizer_steps: int = 0
    entropy_steps: int = 0  # minibatches whose entropy is logged: the optimizer steps and those
    # the zero-advantage skip left out whole (train/left_out_entropy.py)
    grad_norms: list[float] = field(default_factory=list)
    critic_norms: list[float] = field(default_factory=list)
    mismatch: MismatchTally | None = None
    update_flops: float = 0.0
    trained_tokens: float = 0.0

    def count_work(self, batch: SequenceBatch, rows: torch.Tensor) -> None:
        flops, tokens = update_work(self.shape, batch, rows)
        self.update_flops += flops
        self.trained_tokens += tokens

    def metrics(self, experience: Experience) -> dict[str, float]:
        empty = self.sums.pop("empty_minibatches", 0.0)
        result = {key: value / max(1, self.optimizer_steps) for key, value in self.sums.items()}
        if "entropy" in self.sums:  # = optimizer_steps unless a whole minibatch was left out
            result["entropy"] = self.sums["entropy"] / max(1, self.entropy_steps)
        result["empty_minibatches"] = empty
        result.update(self.counts)
        result.update(self.seconds)
        result.update(update_flops=self.update_flops, trained_tokens=self.trained_tokens)
        if self.grad_norms:
            result["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        if self.critic_norms:
            result["critic_grad_norm"] = sum(self.critic_norms) / len(self.critic_norms)
        result.update(experience.advantage_metrics)
        if self.mismatch is not None:
            result.update(_mismatch_metrics(self.mismatch))
        return result


def update(
    cfg: TrainConfig,
    engine: Any,
    experience: Experience,
    generator: torch.Generator,
    critic_engine: Any = None,
    step: int = 0,
    hooks: RunHooks = NO_HOOKS,
) -> dict[str, float]:
    """μ epochs × minibatches of the objective (and, with advantage=gae, of the critic's loss:
    its own engine, stepped at the same accumulation boundaries). Returns the step's metrics,
    with the optimizer steps the guard skipped (a non-finite loss or gradient). `step` (the
    training step) seeds Clip-Cov's draw (train/cov_selection.py). In the first
    `advantage.critic_warmup` steps only the critic learns."""
    skipped_before = skipped_optimizer_steps(engine)
    policy_learns = not (critic_engine is not None and 0 < step <= cfg.advantage.critic_warmup)
    rows = len(experience.batch)
    mismatch = MismatchTally() if experience.rollout.logprobs is not None else None
    tally = _Tally(policy_shape(engine.module), mismatch=mismatch)
    for epoch in range(cfg.trainer.ppo_epochs):
        order = (  # host row indices; the generator is a CPU one
            torch.arange(rows, device="cpu")
            if on_policy(cfg)
            else torch.randperm(rows, generator=generator, device="cpu")
        )
        for index, minibatch in enumerate(order.chunk(cfg.trainer.minibatches)):
            seed = selection_seed(cfg.seed, step, epoch, index)
            _optimizer_step(
                cfg, engine, critic_engine, experience, minibatch, tally, epoch == 0, seed, hooks,
                policy_learns,
            )  # fmt: skip
    result = tally.metrics(experience)
    result["skipped_optimizer_steps"] = skipped_optimizer_steps(engine) - skipped_before
    return result


def _optimizer_step(
    cfg: TrainConfig,
    engine: Any,
    critic_engine: Any,
    experience: Experience,
    minibatch: torch.Tensor,
    tally: _Tally,
    first_epoch: bool,
    seed: int,
    hooks: RunHooks,
    policy_learns: bool = True,
) -> None:
    """One minibatch: its micro-batches' forward and backward, then the optimizer step DeepSpeed
    takes at the accumulation boundary, the critic's alongside (alone in its warm-up). KL-Cov,
    Clip-Cov (seeded with `seed`) and `top_entropy_quantile` pick first (train/token_picks.py)."""
    num_tokens = _global_sum(experience.batch.trained_mask[minibatch].sum().item(), engine.device)
    num_seqs = _global_sum(float(len(minibatch)), engine.device)
    counts = (num_tokens, num_seqs, collective.world_size())
    # The picks are over all the minibatch's rows, before any is skipped
    picks = step_picks(cfg.algo, experience, minibatch, seed) if num_tokens > 0 else StepPicks()
    everything = minibatch
    minibatch = _rows_to_train(cfg, critic_engine, experience, minibatch, num_tokens, tally)
    left_sum, left_tokens = left_out_entropy(
        cfg, engine, critic_engine, experience, everything, minibatch, num_tokens
    )
    if minibatch is None:
        if num_tokens > 0:  # left out whole: its entropy is still logged (train/left_out_entropy)
            tally.sums["entropy"] += left_sum / left_tokens if left_tokens else 0.0
            tally.entropy_steps += 1
        return
    for key, value in picks.metrics.items():  # per optimizer step taken, as the others
        tally.sums[key] += value
    plan, checkpoint = _plan(cfg, engine, experience, minibatch)
    mismatch = tally.mismatch if first_epoch else None  # each row counted once

    def policy_micro_batch(prompts: MinibatchPrompts, index: int) -> dict[str, float]:
        with checkpointed(engine.module, checkpoint[index]):  # a row over the token budget
            return _forward_backward(
                cfg, engine, experience, prompts, index, *counts, tally.seconds, hooks,
                mismatch, picks,
            )  # fmt: skip

    def critic_micro_batch(prompts: MinibatchPrompts, index: int) -> dict[str, float]:
        return _critic_backward(cfg, critic_engine, experience, prompts, index, *counts)

    rounding = cfg.seed if cfg.model.weight_rounding == "stochastic" else None
    learners: list[Learner] = []
    if policy_learns:  # not in the critic's warm-up
        tally.count_work(experience.batch, minibatch)
        learners.append(Learner(engine, policy_micro_batch, tally.grad_norms, rounding))
    if critic_engine is not None:
        learners.append(Learner(critic_engine, critic_micro_batch, tally.critic_norms, rounding))
    for learner in learners:
        learner.prompts = _prompt_pass(
            cfg, learner.engine, experience, minibatch, plan, tally.seconds
        )
    _accumulate(learners, plan, experience, minibatch, (left_sum, left_tokens), tally, hooks)
    for learner in learners:
        learner.keep_norm()


def _accumulate(
    learners: list[Learner],
    plan: Plan,
    experience: Experience,
    minibatch: torch.Tensor,
    left_out: tuple[float, int],
    tally: _Tally,
    hooks: RunHooks,
) -> None:
    """Each micro-batch of the plan through every learner, then each learner's step (DeepSpeed
    steps the optimizer at the last micro-batch's boundary only); the metrics tallied per
    optimizer step. `left_out`: (Σ entropy, tokens) of the rows the zero-advantage skip left
    out, so the logged entropy covers every row of the minibatch."""
    prompts = learners[0].prompts
    tally.sums["prompt_pass_tokens"] += prompts.tokens
    mask = experience.batch.trained_mask
    own_tokens = int(mask[minibatch].sum())
    left_sum, left_tokens = left_out
    seen_tokens = own_tokens + left_tokens  # the entropy's: every row of the minibatch
    if left_tokens:
        tally.sums["entropy"] += left_sum / seen_tokens
    for index, rows in enumerate(plan.rows):
        boundary = prompts.last(index)
        metrics: dict[str, float] = {}
        for learner in learners:
            learner.engine.set_gradient_accumulation_boundary(boundary)
            metrics.update(learner.micro_batch(learner.prompts, index))
        share = int(mask[rows].sum()) / own_tokens if own_tokens else 1 / len(plan.rows)
        entropy_share = int(mask[rows].sum()) / seen_tokens if seen_tokens else share
        for key, value in metrics.items():
            weight = entropy_share if key == "entropy" else share
            tally.sums[key] += value if additive(key) else value * weight
        hooks.reached("update")
        began = time.perf_counter()
        for learner in learners:
            learner.step(boundary)
        tally.seconds["optimizer_seconds"] += time.perf_counter() - began
    tally.optimizer_steps += 1
    tally.entropy_steps += 1


def _rows_to_train(
    cfg: TrainConfig,
    critic_engine: Any,
    experience: Experience,
    minibatch: torch.Tensor,
    num_tokens: float,
    tally: _Tally,
) -> torch.Tensor | None:
    """The minibatch's rows the update runs (its normalisers are counted over all of them).
    None leaves the whole accumulation cycle out, so the weights, AdamW moments and DeepSpeed's
    micro-step count all stay as they were: only empty completions on every rank (no token to
    learn from), or no row with a gradient on any rank (train/zero_advantage.py)."""
    if num_tokens == 0:
        tally.sums["empty_minibatches"] += 1
        return None
    if critic_engine is not None or not may_skip(cfg):
        return minibatch
    moving = rows_with_gradient(experience.advantages, experience.batch.trained_mask, minibatch)
    tally.counts["zero_advantage_rows"] += len(minibatch) - (0 if moving is None else len(moving))
    tally.counts["zero_advantage_minibatches"] += int(moving is None)
    return moving


def _plan(
    cfg: TrainConfig, engine: Any, experience: Experience, minibatch: torch.Tensor
) -> tuple[Plan, list[bool]]:
    """The minibatch's micro-batches (by token budget, train/micro_batches.py, with a prompt
    pass where the policy reads one) and which of them recompute their layers in backward
    (train/recompute.py)."""
    plan = micro_batches_for(cfg, experience.batch, minibatch, engine.module)
    budget = cfg.trainer.micro_batch_tokens
    checkpoint = checkpoint_plan(plan, cfg.model.gradient_checkpointing, budget)
    return plan, checkpoint


def _prompt_pass(
    cfg: TrainConfig,
    engine: Any,
    experience: Experience,
    minibatch: torch.Tensor,
    plan: Plan,
    seconds: dict[str, float],
) -> MinibatchPrompts:
    """The minibatch's distinct prompts through `engine`'s model once, for all its micro-batches
    (models/prompt_pass.py), when the plan has a prompt pass and the model reads one."""
    if engine is None or not (plan.prompt_pass and reads_prompt_pass(engine.module)):
        return MinibatchPrompts(None, plan.rows)
    began = time.perf_counter()
    with checkpointed(engine.module, prompt_pass_checkpointed(cfg.model.gradient_checkpointing)):
        prompts = plan.prompts(through_engine(engine), experience.batch)
    seconds["forward_seconds"] += time.perf_counter() - began
    return prompts


def _mismatch_metrics(tally: MismatchTally) -> dict[str, float]:
    """The step's mismatch metrics over every rank's rows."""
    sums = tally.as_tensor()
    largest = torch.tensor([tally.abs_max], dtype=torch.float64, device="cpu")
    sums, largest = collective.all_sum(sums), collective.all_max(largest)
    return MismatchTally.metrics(sums.cpu(), float(largest.item()))


def _forward_backward(
    cfg: TrainConfig,
    engine: Any,
    experience: Experience,
    prompts: MinibatchPrompts,
    index: int,
    num_tokens: float,
    num_seqs: float,
    world: int,
    seconds: dict[str, float],
    hooks: RunHooks,
    tally: MismatchTally | None = None,
    picks: StepPicks | None = None,
) -> dict[str, float]:
    """The objective on micro-batch `index` of the minibatch (plus the attached modules' terms) and
    its backward; its answers read the minibatch's prompt pass where there is one. `picks`: the
    tokens picked over the step's rows (train/token_picks.py)."""
    began = time.perf_counter()
    rows = prompts.micro_batch_rows[index]
    part = experience.batch.select(rows)
    make = forward_scores(cfg, experience)
    scores = engine(part, cfg.rollout.temperature, make=make, prompts=prompts.read(index))
    batch = objective_batch(cfg, experience, rows, part, scores, num_tokens, num_seqs, tally, picks)
    loss, metrics = micro_batch_objective(cfg, batch, scores, engine.module.attached)
    loss = hooks.loss(loss)
    loss = prompts.carry_grads(index, loss)
    forward_done = time.perf_counter()
    seconds["forward_seconds"] += forward_done - began
    engine.backward(loss * world, scale_wrt_gas=False)
    seconds["backward_seconds"] += time.perf_counter() - forward_done
    valid = part.trained_mask
    metrics["loss"] = float(loss.detach())
    if scores.entropy is not None:
        entropy = scores.entropy.detach()
        metrics["entropy"] = float((entropy * valid).sum() / valid.sum().clamp(min=1))
    return metrics


def _critic_backward(
    cfg: TrainConfig,
    critic_engine: Any,
    experience: Experience,
    prompts: MinibatchPrompts,
    index: int,
    num_tokens: float,
    num_seqs: float,
    world: int,
) -> dict[str, float]:
    """The critic's value-clipped loss on micro-batch `index`, aggregated as the policy term
    (§0.1); `prompts`: the critic's own prompt pass of the minibatch."""
    rows = prompts.micro_batch_rows[index]
    part = experience.batch.select(rows)
    width = part.completion_mask.shape[1]
    values = critic_engine(part, prompts=prompts.read(index))
    per_token, clipped = value_loss(
        values,
        experience.old_values[rows, :width],
        experience.returns[rows, :width],
        cfg.advantage.value_clip,
    )
    mask = part.trained_mask
    loss = aggregate(
        per_token,
        mask,
        cfg.algo.loss_agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_len=cfg.completion_tokens,
    )
    loss = prompts.carry_grads(index, loss)
    critic_engine.backward(loss * world, scale_wrt_gas=False)
    count = int(mask.sum())
    return {
        "value_loss": float(loss.detach()),
        "value_clip_frac": int((clipped & mask).sum()) / count if count else 0.0,
    }


def _global_sum(value: float, device: torch.device) -> float:
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    return float(collective.all_sum(tensor).item())
