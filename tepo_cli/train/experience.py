"""One step's experience: prompts -> rollout -> rewards -> group advantages -> no-grad scores.

Every record moves forward only; the update phase reads an `Experience` and never reaches back.
Groups never straddle ranks (each rank owns whole prompts), so group statistics are local.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from transformers import PreTrainedTokenizerBase

from tepo_cli.algos import estimate_advantages, informative_groups
from tepo_cli.algos.gae import gae, token_rewards, whiten, whiten_sums
from tepo_cli.config.errors import RunError
from tepo_cli.config.schema import TrainConfig
from tepo_cli.data.arith import Problem
from tepo_cli.data.prompts import render_prompt
from tepo_cli.models.critic import Critic
from tepo_cli.rewards import Reward
from tepo_cli.rollout import Rollout, RolloutBackend, Sampling
from tepo_cli.rollout.hf import HfBackend
from tepo_cli.train import faults
from tepo_cli.train.grading import Graded, grade
from tepo_cli.train.policy import Policy
from tepo_cli.train.sequences import SequenceBatch


@dataclass
class Experience:
    problems: list[Problem]  # one per group
    rollout: Rollout
    batch: SequenceBatch
    rewards: torch.Tensor  # [N] shaped rewards
    correct: torch.Tensor  # [N] bool
    advantages: torch.Tensor  # [N]
    old_logp: torch.Tensor | None = None  # [N, T]; None when the update is on-policy
    old_entropy: torch.Tensor | None = None
    old_entropy_term: torch.Tensor | None = None  # [N, T] TEPO's first_order mask
    old_mtp_logp: torch.Tensor | None = None  # [N, T, K-1] MPO's MTP depths (future=mtp)
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None  # [N, T] the critic's V at rollout (advantage=gae)
    returns: torch.Tensor | None = None  # [N, T] GAE returns, the critic's targets
    critic_metrics: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    sampled_groups: int = 0  # groups generated this step (more than kept under dynamic sampling)
    refill_rounds: int = 0
    overlong_mean: float = 0.0


def on_policy(cfg: TrainConfig) -> bool:
    """One optimizer step per rollout: π_old = π_θ, so old log-probs are the current ones."""
    return cfg.trainer.ppo_epochs == 1 and cfg.trainer.minibatches == 1


def collect(
    cfg: TrainConfig,
    policy: Policy,
    reference: Policy | None,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    reward: Reward,
    refill: Iterator[Problem] | None = None,
    critic: Critic | None = None,
    backend: RolloutBackend | None = None,
    seed: int | None = None,
) -> Experience:
    """Sample, grade and score one step's groups for this rank.

    `backend` generates (rollout/); None means transformers' generate() on the policy itself.
    `seed` seeds engines that take per-request seeds (rollout_seed below); hf samples from torch's
    generator, which checkpoints restore.

    With `algo.dynamic_sampling` (DAPO), groups whose answers are all right or all wrong are
    dropped and replaced by groups of fresh prompts from `refill`, up to `algo.max_refill_rounds`.
    """
    timer = _Timer()
    if backend is None:
        backend = HfBackend(policy.lm, tokenizer, policy.share_prompts)
    wanted = len(problems)
    kept: list[tuple[Rollout, Graded, list[Problem]]] = []
    kept_groups, sampled, rounds = 0, 0, 0
    batch_problems = problems
    while True:
        with timer("rollout"):
            round_seed = None if seed is None else seed + sampled * cfg.rollout.n
            rollout = _sample(cfg, backend, tokenizer, batch_problems, round_seed)
        faults.maybe_kill("rollout")
        with timer("reward"):
            graded = grade(cfg, rollout, batch_problems, reward)
        sampled += len(batch_problems)
        keep = torch.ones(len(batch_problems), dtype=torch.bool)
        if cfg.algo.dynamic_sampling:
            keep = informative_groups(graded.correct, cfg.rollout.n).cpu()
            keep &= keep.cumsum(0) <= wanted - kept_groups
        if keep.any():
            rows = _group_rows(keep, cfg.rollout.n)
            part = [p for p, k in zip(batch_problems, keep.tolist(), strict=True) if k]
            kept.append((rollout.take(rows), _take_graded(graded, rows), part))
            kept_groups += len(part)
        if kept_groups >= wanted or not _can_refill(cfg, rounds, refill):
            break
        rounds += 1
        batch_problems = [next(refill) for _ in range(wanted)]  # type: ignore[arg-type]
    if not _all_ranks_agree(kept_groups >= wanted):
        raise RunError(_refill_failure(cfg, wanted, kept_groups, sampled, rounds))
    rollout = Rollout.concat([r for r, _, _ in kept], tokenizer.pad_token_id)
    rewards = torch.cat([g.rewards for _, g, _ in kept])
    correct = torch.cat([g.correct for _, g, _ in kept])
    batch = SequenceBatch.from_rollout(rollout)
    estimator = cfg.advantage
    targets = None
    if estimator.needs_critic:
        if critic is None:
            raise ValueError("advantage=gae needs the critic")
        with timer("values"):
            targets = critic_targets(cfg, critic, batch, rewards)
        advantages = targets.advantages
    else:
        advantages = estimate_advantages(
            estimator.name, rewards, cfg.rollout.n, scale=estimator.scale, eps=estimator.eps
        )
    experience = Experience(
        problems=[p for _, _, part in kept for p in part],
        rollout=rollout,
        batch=batch,
        rewards=rewards,
        correct=correct,
        advantages=advantages,
        sampled_groups=sampled,
        refill_rounds=rounds,
        overlong_mean=float(torch.cat([g.overlong for _, g, _ in kept]).mean()),
    )
    if targets is not None:
        experience.old_values, experience.returns = targets.values, targets.returns
        experience.critic_metrics = targets.metrics
    with timer("score"):
        _score(cfg, policy, reference, experience)
    experience.seconds = timer.seconds
    return experience


@dataclass
class CriticTargets:
    """What the critic's rollout pass yields for a step (all [N, T], 0 on padding)."""

    values: torch.Tensor  # V_old
    advantages: torch.Tensor  # GAE, whitened over the step's valid tokens on every rank
    returns: torch.Tensor  # Â + V_old before whitening: the critic's regression targets
    metrics: dict[str, float]


@torch.no_grad()
def critic_targets(
    cfg: TrainConfig, critic: Critic, batch: SequenceBatch, rewards: torch.Tensor
) -> CriticTargets:
    """V_old in micro-batches, the sequence reward on each last token, GAE (γ, λ), returns, and
    the advantages whitened over every valid token of the step, on all ranks (docs §0.1)."""
    settings = cfg.advantage
    width = batch.response_mask.shape[1]
    parts = [
        _widen(critic(batch.select(rows)), width)
        for rows in torch.arange(len(batch)).split(cfg.trainer.micro_batch_size)
    ]
    values = torch.cat(parts).to(torch.float32)
    mask = batch.response_mask
    advantages, returns = gae(
        token_rewards(rewards.to(values.dtype), mask), values, mask, settings.gamma, settings.lam
    )
    sums = _all_ranks_sum(whiten_sums(advantages, mask))
    if settings.whiten:
        advantages = whiten(advantages, mask, sums)
    residual = _all_ranks_sum(whiten_sums(returns - values, mask))
    target = _all_ranks_sum(whiten_sums(returns, mask))
    metrics = {
        "value_mean": _mean(_all_ranks_sum(whiten_sums(values, mask))),
        "return_mean": _mean(target),
        "explained_variance": 1.0 - _variance(residual) / max(_variance(target), 1e-12),
    }
    return CriticTargets(values, advantages, returns, metrics)


def _all_ranks_sum(sums: torch.Tensor) -> torch.Tensor:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return sums
    device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    total = sums.to(device)
    dist.all_reduce(total)
    return total.cpu()


def _mean(sums: torch.Tensor) -> float:
    count, total, _ = sums.tolist()
    return total / count if count else 0.0


def _variance(sums: torch.Tensor) -> float:
    count, total, squares = sums.tolist()
    if count == 0:
        return 0.0
    mean = total / count
    return max(squares / count - mean * mean, 0.0)


def _sample(
    cfg: TrainConfig,
    backend: RolloutBackend,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    seed: int | None,
) -> Rollout:
    rollout_cfg = cfg.rollout
    prompts = [render_prompt(tokenizer, cfg.benchmark, p.question) for p in problems]
    sampling = Sampling(
        n=rollout_cfg.n,
        temperature=rollout_cfg.temperature,
        top_p=rollout_cfg.top_p,
        top_k=rollout_cfg.top_k,
        max_new_tokens=rollout_cfg.max_new_tokens,
        batch_size=rollout_cfg.batch_size,
        seed=seed,
    )
    return backend.generate(prompts, sampling)


def rollout_seed(run_seed: int, step: int, rank: int) -> int:
    """The first request seed of a step on a rank: a 40-bit hash of the three, so steps and ranks
    draw apart and a resumed run draws what the uninterrupted one would have."""
    digest = hashlib.sha256(f"{run_seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:5], "big")


def _group_rows(keep: torch.Tensor, group_size: int) -> torch.Tensor:
    """Row indices of the kept groups (rows are laid out group by group)."""
    return torch.arange(keep.numel() * group_size).view(-1, group_size)[keep].reshape(-1)


def _take_graded(graded: Graded, rows: torch.Tensor) -> Graded:
    return Graded(graded.rewards[rows], graded.correct[rows], graded.overlong[rows])


def _can_refill(cfg: TrainConfig, rounds: int, refill: Iterator[Problem] | None) -> bool:
    return cfg.algo.dynamic_sampling and refill is not None and rounds < cfg.algo.max_refill_rounds


def _all_ranks_agree(ok: bool) -> bool:
    """Every rank learns whether any rank failed, so no rank waits forever in a collective."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return ok
    flag = torch.tensor([0.0 if ok else 1.0])
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() == 0.0)


def _refill_failure(cfg: TrainConfig, wanted: int, kept: int, sampled: int, rounds: int) -> str:
    return (
        f"DAPO dynamic sampling could not fill the step: after {rounds} refill rounds "
        f"(algo.max_refill_rounds={cfg.algo.max_refill_rounds}) only {kept} of the {wanted} groups "
        f"this rank needs had mixed correctness, out of {sampled} groups sampled. The task is too "
        f"easy or too hard for the model at this point: raise algo.max_refill_rounds, raise "
        f"rollout.n (more chances of a mixed group), or turn it off with "
        f"algo.dynamic_sampling=false."
    )


@torch.no_grad()
def _score(
    cfg: TrainConfig, policy: Policy, reference: Policy | None, experience: Experience
) -> None:
    """Old-policy scores (when off-policy: log-probs, and what the objective reads besides —
    entropies, TEPO's first-order term, MPO's MTP depths) and reference log-probs, in
    micro-batches, without gradient."""
    need_old = not on_policy(cfg)
    if not need_old and reference is None:
        return
    batch, width = experience.batch, experience.batch.response_mask.shape[1]
    parts: dict[str, list[torch.Tensor]] = {
        "logp": [],
        "entropy": [],
        "entropy_term": [],
        "mtp_logp": [],
        "ref": [],
    }
    for rows in torch.arange(len(batch)).split(cfg.trainer.micro_batch_size):
        part = batch.select(rows)
        if need_old:
            scores = policy(
                part,
                cfg.rollout.temperature,
                with_entropy=cfg.algo.needs_old_entropy,
                with_entropy_term=cfg.algo.needs_old_entropy_term,
                with_mtp=cfg.algo.mtp_depths > 0,
            )
            for name in ("logp", "entropy", "entropy_term", "mtp_logp"):
                value = getattr(scores, name)
                if value is not None:
                    parts[name].append(_widen(value, width))
        if reference is not None:
            parts["ref"].append(_widen(reference(part, cfg.rollout.temperature).logp, width))
    joined = {name: torch.cat(values) if values else None for name, values in parts.items()}
    experience.old_logp = joined["logp"]
    experience.old_entropy = joined["entropy"]
    experience.old_entropy_term = joined["entropy_term"]
    experience.old_mtp_logp = joined["mtp_logp"]
    experience.ref_logp = joined["ref"]


def _widen(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pad the token axis (dim 1) of [N, t] or [N, t, D] values to `width` columns."""
    missing = width - values.shape[1]
    return torch.nn.functional.pad(
        values, (0, 0, 0, missing) if values.dim() == 3 else (0, missing)
    )


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str) -> _Timer:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self._name] = (
            self.seconds.get(self._name, 0.0) + time.perf_counter() - self._start
        )
