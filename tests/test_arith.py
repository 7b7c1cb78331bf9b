"""The embedded task: problem generation, the held-out split, and answer extraction."""

from __future__ import annotations

import itertools
import re

import pytest

from tepo_cli.benchmarks import build_reward
from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.arith_problems import ArithTask
from tepo_cli.rewards.arith_grader import extract_final_number, is_correct


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12 + 35 = 47", "47"),
        ("The answer is 47.", "47"),
        ("**47**", "47"),
        ("47.0", "47"),
        ("3.50", "3.50"),
        ("1,234 apples", "1234"),
        ("x = −5.", "-5"),
        ("3 - 5 = -2", "-2"),
        ("12-5=7", "7"),
        ("7*8 = 56\n\nThis is a classic example", "56"),
        ("v2 gives 9", "9"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_final_number(text, expected):
    assert extract_final_number(text) == expected


def test_is_correct_compares_numbers_not_strings():
    assert is_correct("so 56.0", "56") == (True, "56")
    assert is_correct("it is 1,000", "1000") == (True, "1000")
    assert is_correct("55", "56") == (False, "55")
    assert is_correct("fifty-six", "56") == (False, None)


def test_reward_values_follow_config():
    reward = build_reward(
        RewardConfig(name="auto", correct=1.0, incorrect=-1.0), BenchmarkConfig(name="arith")
    )
    problem = Problem(id="7*8", question="7*8", answer="56")
    assert reward("7*8=56", problem).reward == 1.0
    assert reward("7*8=54", problem).reward == -1.0
    assert reward("7*8=54", problem).extracted == "54"


def test_problems_are_correct_and_cover_the_operations():
    task = ArithTask(
        BenchmarkConfig(name="arith", operations=["+", "-", "*"], digits=2, eval_size=50)
    )
    problems = list(itertools.islice(task.train_stream(seed=0), 500))
    for problem in problems:
        assert str(eval(problem.question)) == problem.answer
    assert {op for p in problems for op in "+-*" if op in p.question[1:]} == {"+", "-", "*"}
    assert any(int(n) >= 10 for p in problems for n in re.findall(r"\d+", p.question))


def test_held_out_split_is_fixed_distinct_and_never_trained_on():
    cfg = BenchmarkConfig(name="arith", operations=["+", "*"], digits=1, eval_size=100)
    task = ArithTask(cfg)
    held_out = {p.question for p in task.eval_problems()}
    assert len(held_out) == 100
    assert held_out == {p.question for p in ArithTask(cfg).eval_problems()}
    for seed in (0, 1, 2):
        trained = {p.question for p in itertools.islice(task.train_stream(seed), 2000)}
        assert not trained & held_out
        assert len(trained) == 100  # the 200-problem space minus the 100 held out
    assert task.eval_problems(limit=7) == task.eval_problems()[:7]


def test_train_stream_depends_on_seed_only():
    task = ArithTask(BenchmarkConfig(name="arith", digits=2))
    first = [p.question for p in itertools.islice(task.train_stream(3), 20)]
    assert first == [p.question for p in itertools.islice(task.train_stream(3), 20)]
    assert first != [p.question for p in itertools.islice(task.train_stream(4), 20)]


def test_too_small_a_space_is_a_config_error():
    with pytest.raises(ConfigError, match=r"benchmark\.eval_size=100"):
        ArithTask(BenchmarkConfig(name="arith", operations=["+"], digits=1, eval_size=100))
