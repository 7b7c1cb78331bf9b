"""`reward.terms`: functions of the user's whose weighted values are added to the grader's
reward in training, logged per term; the grader alone says which answers are right."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from tepo_cli.benchmarks import build_reward
from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError, RunError
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.data.arith_problems import ArithTask
from tepo_cli.train.grading import grade

TERMS = """
def shows_work(completion, problem):
    return "=" in completion


def length(completion, problem):
    return len(completion)


def broken(completion, problem):
    return "high" if len(completion) > 3 else 0.5
"""


@pytest.fixture
def terms_file(tmp_path):
    path = tmp_path / "shaping.py"
    path.write_text(TERMS)
    return path


def config(compose_config, *overrides: str):
    base = ["model=tiny", "rollout.max_new_tokens=8", "rollout.n=2"]
    return load_train_config(compose_config("train", [*base, *overrides]))


def rollout_of(texts: list[str]) -> Rollout:
    rows = len(texts)
    return Rollout(
        prompt_ids=torch.zeros(rows, 1, dtype=torch.long),
        prompt_mask=torch.ones(rows, 1, dtype=torch.long),
        completion_ids=torch.zeros(rows, 8, dtype=torch.long),
        completion_mask=torch.ones(rows, 8, dtype=torch.bool),
        texts=texts,
        truncated=torch.zeros(rows, dtype=torch.bool),
    )


def test_the_reward_is_the_grader_s_plus_each_weighted_term(compose_config, terms_file):
    work, length = f"+reward.terms.work.path={terms_file}", f"+reward.terms.len.path={terms_file}"
    cfg = config(
        compose_config, "algo=dapo", "algo.overlong_penalty=false",  # DAPO's ±1 grader values
        work, "+reward.terms.work.function=shows_work", "+reward.terms.work.weight=0.25",
        length, "+reward.terms.len.function=length", "+reward.terms.len.weight=-0.01",
    )  # fmt: skip
    problems = ArithTask(cfg.benchmark).eval_problems()[:2]
    texts = [problems[0].answer, "1+1=2", "x=1", "nope"]
    graded = grade(cfg, rollout_of(texts), problems, build_reward(cfg.reward, cfg.benchmark))
    assert graded.correct.tolist() == [True, False, False, False]  # the grader's, terms aside
    assert graded.terms["work"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert graded.terms["len"].tolist() == [float(len(t)) for t in texts]
    expected = [
        (1.0 if right else -1.0) + 0.25 * work - 0.01 * len(text)
        for right, work, text in zip([True, False, False, False], [0, 1, 1, 0], texts, strict=True)
    ]  # float64 reference
    assert graded.rewards.tolist() == pytest.approx(expected, abs=1e-6)
    assert graded.base.tolist() == [1.0, -1.0, -1.0, -1.0]  # the grader's, before the terms
    kept = graded.take(torch.tensor([2, 3]))
    assert kept.terms["work"].tolist() == [1.0, 0.0] and kept.rewards.shape == (2,)
    assert kept.base.tolist() == [-1.0, -1.0]


def test_a_term_that_returns_no_number_stops_the_run_naming_it(compose_config, terms_file):
    cfg = config(
        compose_config, f"+reward.terms.odd.path={terms_file}", "+reward.terms.odd.function=broken"
    )
    problems = ArithTask(cfg.benchmark).eval_problems()[:1]
    reward = build_reward(cfg.reward, cfg.benchmark)
    with pytest.raises(
        RunError,
        match=rf"reward.terms.odd \(broken of {terms_file}\) returned 'high' \(str\) .* problem {re.escape(problems[0].id)}; a reward term returns a finite number or a bool",
    ):
        grade(cfg, rollout_of(["1", "long answer"]), problems, reward)


def test_bad_terms_are_refused_before_anything_loads(terms_file):
    with pytest.raises(ValueError, match=r"reward.terms.2x: a term's name is a metric's name"):
        RewardConfig(name="auto", terms={"2x": {"path": str(terms_file)}})
    with pytest.raises(ValueError, match=r"weight must be a finite number, got inf"):
        RewardConfig(name="auto", terms={"x": {"path": str(terms_file), "weight": "inf"}})
    missing = RewardConfig(name="auto", terms={"x": {"path": str(terms_file), "function": "nope"}})
    with pytest.raises(
        ConfigError,
        match=r"reward.terms.x.function='nope' is not a function .* broken, length, shows_work",
    ):
        build_reward(missing, _arith())
    gone = RewardConfig(name="auto", terms={"x": {"path": "no_such.py"}})
    with pytest.raises(ConfigError, match=r"reward.terms.x.path='no_such.py' is not a file"):
        build_reward(gone, _arith())


def _arith() -> BenchmarkConfig:
    return BenchmarkConfig(name="arith")


@pytest.mark.slow
def test_a_run_logs_each_term_and_its_samples_and_keeps_the_accuracy(tmp_path, terms_file):
    args = [
        "model=tiny", "trainer.max_steps=2", "trainer.eval_before=false", "trainer.eval_after=false",
        f"+reward.terms.work.path={terms_file}", "+reward.terms.work.function=shows_work",
        "+reward.terms.work.weight=0", f"+reward.terms.len.path={terms_file}",
        "+reward.terms.len.function=length", "+reward.terms.len.weight=-0.01",
        "advantage.aggregation=normalize_then_sum",  # each component apart (GDPO): runs through
    ]  # fmt: skip
    command = [sys.executable, "-m", "tepo_cli", "train", *args]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    (metrics,) = tmp_path.rglob("metrics.jsonl")
    (samples,) = tmp_path.rglob("samples.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    logged = [json.loads(line) for line in samples.read_text().splitlines()]
    for record in records:
        assert record["reward_term_len_mean"] > 0 and "reward_term_work_mean" in record
        # the grader scores the tiny model's answers 0: the reward is the length cost alone
        assert record["accuracy"] == 0.0
        assert record["reward_mean"] == pytest.approx(
            -0.01 * record["reward_term_len_mean"], rel=1e-5
        )
    for sample in logged:
        assert sample["reward_terms"]["len"] == len(sample["completion"])
        assert sample["reward"] == pytest.approx(-0.01 * len(sample["completion"]), abs=1e-6)
