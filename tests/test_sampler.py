"""One sampler chosen once (envs/sampler.py): `env=single` gets answers, every other environment
episodes, and training's rollout, the held-out evaluation and `tepo eval` read what it returns
without asking which it is. Answers are what the back-end generates from the benchmark's
prompts; episodes are graded by their environment and carry their account."""

from __future__ import annotations

import pytest
import torch
from test_eval_env import ScriptedTurns

from tepo_cli.config.schema import RewardConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.records import Problem
from tepo_cli.data.arith_problems import ArithTask
from tepo_cli.data.prompt_templates import render_prompt
from tepo_cli.envs.answer_sampler import Answers
from tepo_cli.envs.episode_sampler import Episodes
from tepo_cli.envs.sampler import build_sampler
from tepo_cli.rewards import make_reward
from tepo_cli.rollout import Sampling
from tepo_cli.rollout.hf import HfBackend
from tepo_cli.train.env_errors import report_env_errors
from tepo_cli.train.step_records import _episode_metrics

PROBLEMS = [Problem("a", "6*7", "42"), Problem("b", "40+2", "42"), Problem("c", "1+1", "2")]


def _config(compose_config, *overrides: str):
    cfg = load_train_config(compose_config("train", ["model=tiny", "benchmark=arith", *overrides]))
    return cfg, build_sampler(cfg.env, cfg.benchmark, cfg.turn_tokens)


@pytest.mark.parametrize(
    ("env", "kind"),
    [("env=single", Answers), ("env=python_tool", Episodes), ("env.name=guess_number", Episodes)],
)
def test_the_sampler_is_chosen_by_the_environment(compose_config, env, kind):
    # guess_number is a plugin's (tests/user_env): any name but `single` plays episodes
    assert type(_config(compose_config, env)[1]) is kind


def test_answers_are_the_back_end_s_generations_of_the_benchmark_prompts(
    compose_config, tiny_model, tiny_tokenizer
):
    cfg, sampler = _config(compose_config, "rollout.n=2")
    backend = HfBackend(tiny_model, tiny_tokenizer, True)
    sampling = Sampling(n=2, greedy=True, max_new_tokens=6)
    samples = sampler.sample(backend, tiny_tokenizer, PROBLEMS[:2], None, sampling)
    prompts = [render_prompt(tiny_tokenizer, cfg.benchmark, p.question) for p in PROBLEMS[:2]]
    direct = backend.generate(prompts, sampling)
    assert samples.rollout.texts == direct.texts and len(direct.texts) == 4
    assert torch.equal(samples.rollout.completion_ids, direct.completion_ids)
    # ungraded (the trainer's reward stage grades them), no account, no sums, no environment
    assert samples.results is None and samples.records == [{}, {}, {}, {}]
    assert samples.sums == {} and samples.errors is None
    assert sampler.summary([]) == {}
    assert sampler.start_line(cfg.trainer, ArithTask(cfg.benchmark)) is None


def test_episodes_are_graded_by_their_environment_and_carry_their_account(
    compose_config, tiny_tokenizer
):
    _, sampler = _config(compose_config, "env=python_tool", "env.max_turns=2")
    backend = ScriptedTurns(tiny_tokenizer, ["```python\nprint(6*7)\n```", "The answer is 42."])
    reward = make_reward(RewardConfig(name="arith"), "arith")
    samples = sampler.sample(backend, tiny_tokenizer, PROBLEMS, reward, Sampling(n=1, greedy=True))
    assert samples.results is not None
    assert [r.correct for r in samples.results] == [True, True, False]  # 1+1 is not 42
    assert [(r["turns"], r["tool_calls"], r["end"]) for r in samples.records] == [
        (2, 1, "answer")
    ] * 3
    assert samples.sums["episodes"] == 3.0 and samples.sums["env_turns"] == 6.0
    assert samples.sums["env_tool_calls"] == 3.0 and samples.errors == []
    # the observations are context: fewer trained tokens than completion tokens
    rollout = samples.rollout
    assert rollout.model_mask is not None
    assert (rollout.trained_mask.sum(1) < rollout.completion_mask.sum(1)).all()


def test_the_held_out_split_of_episodes_is_env_eval_size_and_of_answers_all_of_it(
    compose_config,
):
    _, answers = _config(compose_config, "env.eval_size=2")  # read by episodes only
    cfg, episodes = _config(compose_config, "env=python_tool", "env.eval_size=2")
    task = ArithTask(cfg.benchmark)
    assert answers.held_out_problems(task) == task.eval_problems()
    assert episodes.held_out_problems(task) == task.eval_problems()[:2]
    line = episodes.start_line(cfg.trainer, task)
    assert line is not None and "on each of 2 held-out problems" in line


def test_one_greedy_episode_per_problem_the_padding_not_counted(compose_config, tiny_tokenizer):
    _, sampler = _config(compose_config, "env=python_tool", "env.max_turns=2")
    backend = ScriptedTurns(tiny_tokenizer, ["```python\nprint(6*7)\n```", "The answer is 42."])
    reward = make_reward(RewardConfig(name="arith"), "arith")
    sampling = Sampling(n=1, greedy=True)
    held_out = sampler.held_out(
        backend, tiny_tokenizer, PROBLEMS[1:], PROBLEMS[:1], reward, sampling
    )
    assert (held_out.solved, held_out.problems) == (1.0, 2)  # 40+2 right, 1+1 wrong; 6*7 padding
    assert held_out.answers == [] and held_out.errors == []


def test_greedy_answers_held_out_count_the_real_problems_only(
    compose_config, tiny_model, tiny_tokenizer
):
    _, sampler = _config(compose_config)
    backend = HfBackend(tiny_model, tiny_tokenizer, True)
    reward = make_reward(RewardConfig(name="arith"), "arith")
    sampling = Sampling(n=1, greedy=True, max_new_tokens=4, batch_size=2)
    held_out = sampler.held_out(
        backend, tiny_tokenizer, PROBLEMS[:2], PROBLEMS[:1], reward, sampling
    )
    assert held_out.problems == 2 and [a["id"] for a in held_out.answers] == ["a", "b"]
    assert held_out.solved == sum(a["passed"] for a in held_out.answers)
    assert all("prompt" not in a and "sample" not in a for a in held_out.answers)
    assert held_out.errors is None


def test_answers_keep_no_step_metrics_and_report_no_errors(capsys):
    assert _episode_metrics({}, torch.device("cpu")) == {}
    report_env_errors(None, "step 1", None)
    assert capsys.readouterr() == ("", "")
