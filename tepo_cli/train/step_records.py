"""What one step leaves in the run's logs: its metrics record (reduced over ranks) and samples."""

from __future__ import annotations

import resource
from typing import Any

import torch

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.runtime.clock import StepClock
from tepo_cli.train.cpu_peak import raise_peak
from tepo_cli.train.experience import Experience
from tepo_cli.train.flops import peak_flops


def step_record(
    cfg: TrainConfig,
    step: int,
    engine: Any,
    experience: Experience,
    update_metrics: dict[str, float],
    clock: StepClock,
) -> dict[str, Any]:
    """The step's metrics over every rank's rows: rewards, accuracy, lengths, groups, learning
    rate, each phase's seconds (`<phase>_seconds`), peak memory, and the update's metrics."""
    seconds = clock.elapsed()
    sums = _summed_over_ranks(cfg, experience)
    total, total_sq, correct, length, truncated, count, flat_groups, group_count = sums[:8]
    sampled, overlong, solved_groups, all_correct_groups = sums[8:]
    mean = total / count
    record: dict[str, Any] = {
        "step": step,
        "reward_mean": mean,
        "reward_std": max(0.0, total_sq / count - mean**2) ** 0.5,
        "accuracy": correct / count,
        "response_length": length / count,
        "truncated_frac": truncated / count,
        "zero_std_group_frac": flat_groups / group_count,
        "solved_group_frac": solved_groups / group_count,  # a group with a right answer
        "all_correct_group_frac": all_correct_groups / group_count,
        "dropped_group_frac": 1.0 - group_count / sampled,
        "refill_rounds": experience.refill_rounds,
        "overlong_penalty_mean": overlong / count,
        "lr": float(engine.get_lr()[0]),
        "step_seconds": seconds,
        "step_cpu_seconds": clock.cpu_elapsed(),  # this rank's process, every thread
        "tokens_per_second": length / seconds,
        # ru_maxrss is in KiB on Linux: this process's high-water mark so far.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if engine.device.type == "cuda":
        # This rank's high-water mark of tensors allocated on its GPU (torch's caching
        # allocator reserves more: `torch.cuda.memory_summary` has both).
        record["peak_gpu_mb"] = torch.cuda.max_memory_allocated(engine.device) / 2**20
    record.update({f"{phase}_seconds": v for phase, v in clock.seconds.items()})
    record.update(update_metrics)
    record.update(_throughput(engine, record))
    record.update(_episode_metrics(experience.env_sums, engine.device))
    record.update(_reward_term_means(experience.reward_terms, engine.device))
    return record


def _reward_term_means(terms: dict[str, torch.Tensor], device: torch.device) -> dict[str, float]:
    """`reward_term_<name>_mean`: each reward term's unweighted value over every rank's rows. One
    collective, entered by every rank of a run with reward.terms (the same on every rank)."""
    if not terms:
        return {}
    names = sorted(terms)
    rows = next(iter(terms.values())).numel()
    sums = [float(terms[name].double().sum()) for name in names] + [float(rows)]
    totals = collective.all_sum(torch.tensor(sums, dtype=torch.float64, device=device)).tolist()
    return {
        f"reward_term_{name}_mean": total / totals[-1]
        for name, total in zip(names, totals, strict=False)
    }


def _episode_metrics(sums: dict[str, float], device: torch.device) -> dict[str, float]:
    """The multi-turn metrics over every rank's episodes (envs/episode_sampler.py), each per
    episode: means (`env_*_mean`: turns, tool calls, failed and timed-out tool calls, observation
    tokens, observations cut) and shares of episodes by how they ended (`env_end_*_frac`). One
    collective, entered by every rank of a multi-turn run each step; none for answers, whose
    sampler keeps no sums (the same on every rank)."""
    if not sums:
        return {}
    names = sorted(sums)
    totals = collective.all_sum(
        torch.tensor([sums[name] for name in names], dtype=torch.float64, device=device)
    ).tolist()
    summed = dict(zip(names, totals, strict=True))
    episodes = max(summed.pop("episodes", 0.0), 1.0)
    suffix = {True: "_frac", False: "_mean"}
    return {
        f"{name}{suffix[name.startswith('env_end_')]}": v / episodes for name, v in summed.items()
    }


def _throughput(engine: Any, record: dict[str, Any]) -> dict[str, float]:
    """The update's needed FLOPs and trained tokens over every rank (what each rank's update
    counted of the rows it ran, train/flops.py; `record` holds this rank's and the update's
    seconds), trained tokens per second and MFU. One collective, entered by every rank each
    step."""
    dtype = next(engine.module.lm.parameters()).dtype  # the matmuls' dtype: the model's
    peak = peak_flops(engine.device, dtype)
    sums = torch.tensor(
        [
            record["update_flops"],
            record["trained_tokens"],
            peak or 0.0,
            0.0 if peak is None else 1.0,
        ],
        dtype=torch.float64,
        device=engine.device,
    )
    world = collective.world_size()
    flops, tokens, peaks, known = collective.all_sum(sums).tolist()
    result = {"update_flops": flops, "trained_tokens": tokens}
    seconds = record.get("update_seconds")
    if not seconds:
        return result
    result["trained_tokens_per_second"] = tokens / seconds
    if known != world:
        return result
    if flops > seconds * peaks and engine.device.type == "cpu":
        # Faster than the cached peak (measured while the machine was busier): each rank raises
        # its peak to at least its share of the achieved rate, so the sum covers the update.
        # Every rank sees the same sums, so every rank enters the collective.
        peak = raise_peak(dtype, flops / seconds / world)
        peaks = collective.all_sum(
            torch.tensor([peak], dtype=torch.float64, device=engine.device)
        ).item()
    result["update_mfu"] = min(1.0, flops / (seconds * peaks))  # 1 at most: float rounding
    result["peak_flops"] = peaks
    return result


def _summed_over_ranks(cfg: TrainConfig, experience: Experience) -> list[float]:
    """Sums over every rank's rows (float64), in this order: rewards, their squares, correct
    answers, lengths, truncations, rows, groups with one reward for all, kept groups, sampled
    groups, the overlong penalty, groups with a right answer and groups with only right ones."""
    rewards, lengths = experience.rewards, experience.rollout.lengths.float()
    groups = rewards.view(-1, cfg.rollout.n)
    correct_groups = experience.correct.bool().view(-1, cfg.rollout.n)
    here = rewards.device  # the step's device: the counts are stacked with its tensors
    stats = torch.stack(
        [
            rewards.sum(),
            (rewards**2).sum(),
            experience.correct.float().sum(),
            lengths.sum(),
            experience.rollout.truncated.float().sum(),
            torch.tensor(float(rewards.numel()), device=here),
            (groups.max(dim=1).values == groups.min(dim=1).values).float().sum(),
            torch.tensor(float(groups.shape[0]), device=here),
            torch.tensor(float(experience.sampled_groups), device=here),
            torch.tensor(experience.overlong_mean * rewards.numel(), device=here),
            correct_groups.any(dim=1).float().sum(),
            correct_groups.all(dim=1).float().sum(),
        ]
    ).double()
    return collective.all_sum(stats).tolist()


def step_samples(cfg: TrainConfig, step: int, experience: Experience) -> list[dict[str, Any]]:
    """The rows samples.jsonl keeps (`_logged_rows`); a multi-turn row adds its episode's
    account as eval's records have it (turns, tool calls, tool failures, end, error)."""
    samples = []
    for index in _logged_rows(cfg, experience):
        problem = experience.problems[index // cfg.rollout.n]
        samples.append(
            {
                "step": step,
                "question": problem.question,
                "answer": problem.answer,
                "completion": experience.rollout.texts[index],
                "reward": float(experience.rewards[index]),
                **_term_values(experience.reward_terms, index),
                "advantage": response_advantage(experience, index),
                **experience.episode_records[index],
            }
        )
    return samples


def _term_values(terms: dict[str, torch.Tensor], index: int) -> dict[str, Any]:
    """A logged row's reward terms, unweighted (none without reward.terms)."""
    return {"reward_terms": {n: float(v[index]) for n, v in terms.items()}} if terms else {}


def _logged_rows(cfg: TrainConfig, experience: Experience) -> list[int]:
    """The first `trainer.samples_per_step` rows; and, when none of them holds an environment
    error but another row does, the first such row too: samples.jsonl shows what failed."""
    rows = list(range(min(cfg.trainer.samples_per_step, len(experience.rollout.texts))))
    failed = [i for i, r in enumerate(experience.episode_records) if r.get("error") is not None]
    if failed and not any(i in rows for i in failed) and cfg.trainer.samples_per_step > 0:
        rows.append(failed[0])
    return rows


def response_advantage(experience: Experience, index: int) -> float:
    """One number per response: its advantage, or (token-level, from a critic) their mean."""
    advantages = experience.advantages[index]
    if advantages.dim() == 0:
        return float(advantages)
    mask = experience.batch.trained_mask[index]
    return float(advantages[mask].mean()) if mask.any() else 0.0
