"""Rollout and reward for one step: sample `rollout.n` completions per prompt and grade them.

With `algo.dynamic_sampling` (DAPO), groups whose answers are all right or all wrong are dropped
and replaced by groups of fresh prompts from the refill stream, up to `algo.max_refill_rounds`.
Groups never straddle ranks (each rank owns whole prompts), so group statistics are local.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from tepo_cli.algos import informative_groups
from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.errors import RunError
from tepo_cli.core.records import Problem
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.data.prompt_templates import render_prompt
from tepo_cli.envs.sampler import Sampler
from tepo_cli.envs.samples import Samples
from tepo_cli.rewards import Reward
from tepo_cli.rollout import RolloutBackend, Sampling, stop_rule
from tepo_cli.runtime.clock import StepClock
from tepo_cli.runtime.hooks import NO_HOOKS, RunHooks
from tepo_cli.train.grading import Graded, grade


@dataclass
class Groups:
    """The step's kept groups, `rollout.n` rows each, laid out group by group."""

    problems: list[Problem]  # one per group
    rollout: Rollout
    batch: SequenceBatch  # the rollout as the trainer scores it
    rewards: torch.Tensor  # [N] shaped rewards
    correct: torch.Tensor  # [N] bool
    overlong_mean: float  # mean overlong term included in the rewards (0 when off)
    reward_terms: dict[str, torch.Tensor]  # reward.terms by name: [N] unweighted values
    base_rewards: torch.Tensor  # [N] the grader's reward with the overlong term, before the terms
    sampled_groups: int  # groups generated (more than kept under dynamic sampling)
    refill_rounds: int
    env_sums: dict[str, float] = dataclasses.field(default_factory=dict)  # episodes' metrics
    # Each kept row's account from the sampler (an episode's `episode_fields`, {} for an
    # answer), and every environment error of the step's rounds (dropped groups' too), one
    # line each; None where the sampler has no environment (`Samples.errors`).
    episode_records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    env_errors: list[str] | None = None


def rollout_and_grade(
    cfg: TrainConfig,
    sampler: Sampler,
    backend: RolloutBackend,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    reward: Reward,
    refill: Iterator[Problem] | None = None,
    seed: int | None = None,
    clock: StepClock | None = None,
    hooks: RunHooks = NO_HOOKS,
) -> Groups:
    """Sample and grade this rank's groups, refilling dropped ones under dynamic sampling. `seed`
    seeds engines with per-request seeds (`rollout_seed`); hf draws from torch's generator.
    `sampler` (envs/sampler.py) makes the rows: answers or episodes."""
    clock = clock or StepClock()
    wanted = len(problems)
    kept = _Kept()
    batch_problems = problems
    after_turn = functools.partial(hooks.reached, "episode")  # the kill tests' mid-episode point
    for round_index in itertools.count():
        if batch_problems:
            with clock("rollout"):
                round_seed = None if seed is None else seed + kept.sampled * cfg.rollout.n
                sampling = training_sampling(cfg, round_seed)
                samples = sampler.sample(
                    backend, tokenizer, batch_problems, reward, sampling, after_turn
                )
                kept.count_round(samples)
            hooks.reached("rollout")
            with clock("reward"):
                graded = grade(cfg, samples.rollout, batch_problems, reward, samples.results)
            keep = _keep(cfg, graded, len(batch_problems), wanted - kept.groups)
            kept.add(samples, graded, batch_problems, keep, cfg.rollout.n)
        else:
            with clock("rollout"):
                _idle_round(cfg, backend, tokenizer, problems)
        # The ranks decide together (one collective a round): another round while any rank
        # still needs groups and refills are left; a rank already full generates alongside.
        everyone_full = _all_ranks_agree(kept.groups >= wanted)
        if everyone_full or not _can_refill(cfg, round_index, refill):
            break
        refilling = kept.groups < wanted
        kept.rounds += refilling
        batch_problems = [next(refill) for _ in range(wanted)] if refilling else []  # type: ignore[arg-type]
    if not everyone_full:
        raise RunError(_refill_failure(cfg, wanted, kept.groups, kept.sampled, kept.rounds))
    return kept.as_groups(tokenizer.pad_token_id, cfg.algo.overlong_filter)


@dataclass
class _Kept:
    """What a step's rounds kept (groups in the order kept, their rows' sampler accounts) and
    what they cost (groups sampled, refill rounds, the episodes' sums and errors of every round,
    dropped groups' included)."""

    parts: list[tuple[Rollout, Graded, list[Problem]]] = dataclasses.field(default_factory=list)
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    groups: int = 0
    sampled: int = 0
    rounds: int = 0
    env_sums: dict[str, float] = dataclasses.field(default_factory=dict)
    errors: list[str] | None = None

    def count_round(self, samples: Samples) -> None:
        _add_sums(self.env_sums, samples.sums)
        self.errors = _with_errors(self.errors, samples)

    def add(
        self,
        samples: Samples,
        graded: Graded,
        problems: list[Problem],
        keep: torch.Tensor,
        group_size: int,
    ) -> None:
        """The round's `keep` groups of `problems`, sampled and graded."""
        self.sampled += len(problems)
        if not keep.any():
            return
        rows = _group_rows(keep, group_size)
        part = [p for p, k in zip(problems, keep.tolist(), strict=True) if k]
        self.parts.append((samples.rollout.take(rows), graded.take(rows), part))
        self.records += [samples.records[row] for row in rows.tolist()]
        self.groups += len(part)

    def as_groups(self, pad_token_id: int, overlong_filter: bool = False) -> Groups:
        """The kept groups as one batch; with `overlong_filter` (DAPO's overlong filtering), a
        truncated answer trains no token (it still counts in its group's advantage and metrics)."""
        rollout = Rollout.concat([r for r, _, _ in self.parts], pad_token_id)
        graded = [g for _, g, _ in self.parts]
        batch = SequenceBatch.from_rollout(rollout)
        if overlong_filter:
            kept = batch.trained_mask & ~rollout.truncated[:, None].to(batch.trained_mask.device)
            batch = dataclasses.replace(batch, model_mask=kept)
        return Groups(
            problems=[p for _, _, part in self.parts for p in part],
            rollout=rollout,
            batch=batch,
            rewards=torch.cat([g.rewards for g in graded]),
            correct=torch.cat([g.correct for g in graded]),
            overlong_mean=float(torch.cat([g.overlong for g in graded]).mean()),
            reward_terms={
                name: torch.cat([g.terms[name] for g in graded]) for name in graded[0].terms
            },
            base_rewards=torch.cat([g.base for g in graded]),
            sampled_groups=self.sampled,
            refill_rounds=self.rounds,
            env_sums=self.env_sums,
            episode_records=self.records,
            env_errors=self.errors,
        )


def _keep(cfg: TrainConfig, graded: Graded, groups: int, room: int) -> torch.Tensor:
    """Which of a round's groups are kept: all, or under dynamic sampling the informative ones
    (mixed correctness), at most `room` of them."""
    if not cfg.algo.dynamic_sampling:
        return torch.ones(groups, dtype=torch.bool, device="cpu")
    keep = informative_groups(graded.correct, cfg.rollout.n).cpu()
    return keep & (keep.cumsum(0) <= room)


def _idle_round(
    cfg: TrainConfig,
    backend: RolloutBackend,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
) -> None:
    """A refill round of a rank that already holds its groups while another rank refills: under
    ZeRO-3 every generate() is a collective, so it generates as many rows as the others, in as
    many calls, and keeps nothing. Greedy, so it draws no random numbers, and its refill stream
    stays where it is: what a rank samples does not depend on the other ranks' luck."""
    sampling = dataclasses.replace(training_sampling(cfg), greedy=True)
    prompts = [render_prompt(tokenizer, cfg.benchmark, p.question) for p in problems]
    backend.generate(prompts, sampling)


def rollout_seed(run_seed: int, step: int, rank: int) -> int:
    """The first request seed of a step on a rank: a 40-bit hash of the three, so steps and ranks
    draw apart and a resumed run draws what the uninterrupted one would have."""
    digest = hashlib.sha256(f"{run_seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:5], "big")


def _add_sums(env_sums: dict[str, float], sums: dict[str, float]) -> None:
    """A round's metric sums into the step's (answers have none)."""
    for key, value in sums.items():
        env_sums[key] = env_sums.get(key, 0.0) + value


def _with_errors(errors: list[str] | None, samples: Samples) -> list[str] | None:
    """The step's environment errors so far, and the round's (None while there are none to
    have: a sampler without environments)."""
    if samples.errors is None:
        return errors
    return [*(errors or []), *samples.errors]


def training_sampling(cfg: TrainConfig, seed: int | None = None) -> Sampling:
    """The rollout's sampling settings (`rollout.*`), as the training steps draw."""
    knobs = {"n", "temperature", "top_p", "top_k", "max_new_tokens", "batch_size"}
    stop = stop_rule(cfg.rollout)
    return Sampling(**cfg.rollout.model_dump(include=knobs), seed=seed, stop=stop)


def _group_rows(keep: torch.Tensor, group_size: int) -> torch.Tensor:
    """Row indices of the kept groups (rows are laid out group by group)."""
    return (
        torch.arange(keep.numel() * group_size, device="cpu").view(-1, group_size)[keep].reshape(-1)
    )


def _can_refill(cfg: TrainConfig, rounds: int, refill: Iterator[Problem] | None) -> bool:
    return cfg.algo.dynamic_sampling and refill is not None and rounds < cfg.algo.max_refill_rounds


def _all_ranks_agree(ok: bool) -> bool:
    """Every rank learns whether any rank failed, so no rank waits forever in a collective."""
    return collective.every_rank(ok)


def _refill_failure(cfg: TrainConfig, wanted: int, kept: int, sampled: int, rounds: int) -> str:
    return (
        f"DAPO dynamic sampling could not fill the step: after {rounds} refill rounds "
        f"(algo.max_refill_rounds={cfg.algo.max_refill_rounds}) only {kept} of the {wanted} groups "
        f"this rank needs had mixed correctness, out of {sampled} groups sampled. The task is too "
        f"easy or too hard for the model at this point: raise algo.max_refill_rounds, raise "
        f"rollout.n (more chances of a mixed group), or turn it off with "
        f"algo.dynamic_sampling=false."
    )
