"""One step's experience: DAPO reward shaping and dynamic sampling with refills."""

from __future__ import annotations

import itertools

import pytest
import torch

from tepo_cli.benchmarks import build_reward
from tepo_cli.config.schema import RewardConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import RunError
from tepo_cli.core.records import RewardResult
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.data.arith_problems import ArithTask
from tepo_cli.envs.sampler import Sampler, build_sampler
from tepo_cli.models.policy import Policy
from tepo_cli.rewards import Reward, one_by_one
from tepo_cli.rollout.hf import HfBackend
from tepo_cli.train.advantage_stage import estimate
from tepo_cli.train.experience import Experience, score
from tepo_cli.train.grading import grade
from tepo_cli.train.sampling import rollout_and_grade


def as_reward(function) -> Reward:
    return Reward("test", one_by_one(function), RewardConfig(name="arith"))


@as_reward
def mixed_on_even_answers(completion: str, problem) -> RewardResult:
    """Groups of even-answer problems get mixed outcomes; odd-answer groups are all wrong."""
    correct = int(problem.answer) % 2 == 0 and len(completion) % 2 == 0
    return RewardResult(float(correct), correct, None)


never = as_reward(lambda completion, problem: RewardResult(0.0, False, None))


def sampler(cfg) -> Sampler:
    """The run's sampler, as train/setup.py builds it (answers: these configurations' env)."""
    return build_sampler(cfg.env, cfg.benchmark, cfg.turn_tokens)


def config(compose_config, *overrides: str):
    return load_train_config(
        compose_config("train", ["model=tiny", "rollout.max_new_tokens=8", *overrides])
    )


def test_dapo_shaping_pm1_and_overlong(compose_config):
    cfg = config(compose_config, "algo=dapo", "rollout.n=2", "algo.overlong_cache_len=4")
    problems = ArithTask(cfg.benchmark).eval_problems()[:2]
    rollout = Rollout(
        prompt_ids=torch.zeros(4, 1, dtype=torch.long),
        prompt_mask=torch.ones(4, 1, dtype=torch.long),
        completion_ids=torch.zeros(4, 8, dtype=torch.long),
        completion_mask=torch.arange(8).expand(4, 8) < torch.tensor([[2], [5], [6], [8]]),
        texts=[problems[0].answer, "nope", problems[1].answer, "nope"],
        truncated=torch.tensor([False, False, False, True]),
    )
    graded = grade(cfg, rollout, problems, build_reward(cfg.reward, cfg.benchmark))
    # L_max = max_new_tokens = 8, L_cache = 4: lengths 2, 5, 6, 8 -> 0, -0.25, -0.5, -1.0
    assert graded.overlong.tolist() == [0.0, -0.25, -0.5, -1.0]
    assert graded.correct.tolist() == [True, False, True, False]
    assert graded.rewards.tolist() == [1.0, -1.25, 0.5, -2.0]


def test_dynamic_sampling_keeps_only_mixed_groups(compose_config, tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    cfg = config(compose_config, "algo=dapo", "rollout.n=4", "algo.overlong_penalty=false")
    task = ArithTask(cfg.benchmark)
    stream = task.train_stream(0)
    problems = [next(stream) for _ in range(2)]
    backend = HfBackend(tiny_model, tiny_tokenizer, True)
    result = rollout_and_grade(
        cfg, sampler(cfg), backend, tiny_tokenizer, problems, mixed_on_even_answers, stream
    )
    assert len(result.problems) == 2
    assert all(int(p.answer) % 2 == 0 for p in result.problems)
    groups = result.correct.view(2, 4)
    assert (groups.any(dim=1) & ~groups.all(dim=1)).all()
    assert result.sampled_groups == 2 * (result.refill_rounds + 1)
    assert len(result.batch) == 8 and estimate(cfg, result, None).advantages.shape == (8,)
    # a grader's own reward is kept: DAPO's ±1 is the reward group's correct/incorrect values
    assert result.rewards.tolist() == result.correct.float().tolist()


def test_dynamic_sampling_gives_up_with_a_clear_error(compose_config, tiny_model, tiny_tokenizer):
    cfg = config(compose_config, "algo=dapo", "rollout.n=2", "algo.max_refill_rounds=2")
    stream = ArithTask(cfg.benchmark).train_stream(0)
    problems = list(itertools.islice(stream, 2))
    with pytest.raises(
        RunError, match=r"after 2 refill rounds .* 0 of the 2 groups .* 6 groups sampled"
    ):
        rollout_and_grade(
            cfg,
            sampler(cfg),
            HfBackend(tiny_model, tiny_tokenizer, True),
            tiny_tokenizer,
            problems,
            never,
            stream,
        )


def test_without_dynamic_sampling_every_group_is_kept(compose_config, tiny_model, tiny_tokenizer):
    cfg = config(compose_config, "algo=grpo", "algo.beta=0", "rollout.n=2")
    problems = ArithTask(cfg.benchmark).eval_problems()[:3]
    backend = HfBackend(tiny_model, tiny_tokenizer, True)
    groups = rollout_and_grade(cfg, sampler(cfg), backend, tiny_tokenizer, problems, never)
    scores = score(cfg, Policy(tiny_model, cfg.kernel), None, groups)
    result = Experience.of(groups, scores, estimate(cfg, groups, None))
    assert result.problems == problems and result.refill_rounds == 0
    assert torch.equal(result.advantages, torch.zeros(6))
    assert result.old_logp is None and result.ref_logp is None  # on-policy, no reference


def test_overlong_filter_trains_no_token_of_a_truncated_answer(
    compose_config, tiny_model, tiny_tokenizer
):
    """DAPO's overlong filtering (algo.overlong_filter): a truncated answer's tokens leave the
    trained mask (so the objective, its normaliser, the KL and the entropy), the others keep
    theirs, and the rewards and rollout records are untouched."""
    torch.manual_seed(0)
    problems = ArithTask(config(compose_config).benchmark).eval_problems()[:3]
    backend = HfBackend(tiny_model, tiny_tokenizer, True)
    runs = {}
    for flag in ("false", "true"):
        torch.manual_seed(0)
        knobs = ["rollout.n=2", "algo.beta=0", "rollout.stop=[a]"]  # some end early
        cfg = config(compose_config, *knobs, f"algo.overlong_filter={flag}")
        runs[flag] = rollout_and_grade(cfg, sampler(cfg), backend, tiny_tokenizer, problems, never)
    plain, filtered = runs["false"], runs["true"]
    truncated = filtered.rollout.truncated
    assert truncated.any() and not truncated.all()  # the tiny model ends some answers early
    assert torch.equal(plain.rollout.completion_ids, filtered.rollout.completion_ids)
    mask = filtered.batch.trained_mask
    assert not mask[truncated].any()
    assert torch.equal(mask[~truncated], plain.batch.trained_mask[~truncated])
    assert plain.batch.trained_mask[truncated].any()
    assert torch.equal(filtered.rewards, plain.rewards)
