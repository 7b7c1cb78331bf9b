"""The GSM8K grader: lm-eval's strict `#### n` extraction and the flexible last number."""

from __future__ import annotations

import pytest

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.rewards import make_reward
from tepo_cli.rewards.gsm8k import (
    extract_flexible,
    extract_strict,
    grade_gsm8k,
    reference_answer,
    same_number,
)


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("She makes 9 * 2 = $18 a day.\n#### 18", "18", "18"),
        ("#### 1,600", "1600", "1600"),
        ("Total: 2,125 dollars\n#### 2,125.", "2125", "2125"),
        ("It drops by 10.\n#### -10", "-10", "-10"),
        ("#### 3.50", "3.50", "3.50"),
        ("The answer is $1,234.50.", None, "1234.50"),
        ("So the answer is 42.", None, "42"),
        ("First 3 apples, then 5 pears, so 8 fruits in all", None, "8"),
        ("The temperature fell to −5 degrees.", None, "-5"),
        ("####18", None, "18"),  # lm-eval's strict regex needs the space
        ("#### $18", None, "18"),  # ... and no dollar sign
        ("#### 7\nor maybe\n#### 9", "7", "9"),  # strict: the first, as lm-eval
        ("no number", None, None),
        ("etc.,", None, None),
    ],
)
def test_extraction(text: str, strict: str | None, flexible: str | None) -> None:
    assert extract_strict(text) == strict
    assert extract_flexible(text) == flexible


def test_numeric_comparison() -> None:
    assert same_number("18", "18.00")
    assert same_number("$1,600", "1600")
    assert same_number("-10", "-10.")
    assert not same_number("18", "18.5")
    assert not same_number("1.2.3", "123")  # not numbers: compared as strings


def test_strict_and_flexible_modes() -> None:
    completion = "Janet sells 9 eggs at $2, so she makes $18."
    assert not grade_gsm8k(completion, "18", mode="strict").correct
    flexible = grade_gsm8k(completion, "18", mode="flexible")
    assert flexible.correct and flexible.reward == 1.0 and flexible.extracted == "18"
    strict = grade_gsm8k(completion + "\n#### 18", "18")
    assert strict.correct and strict.extracted == "18"
    wrong = grade_gsm8k("#### 17", "18", correct=1.0, incorrect=-0.5)
    assert wrong.reward == -0.5 and not wrong.correct and wrong.extracted == "17"
    with pytest.raises(ValueError, match="mode"):
        grade_gsm8k("#### 1", "1", mode="lenient")  # type: ignore[arg-type]


def test_reference_and_protocol() -> None:
    solution = "16 - 3 - 4 = <<16-3-4=9>>9\n9 * 2 = <<9*2=18>>18\n#### 1,018"
    assert reference_answer(solution) == "1018"
    with pytest.raises(ValueError):
        reference_answer("no marker")
    problem = Problem("g", "q", reference_answer(solution), {"solution": solution})
    strict = make_reward(RewardConfig(name="gsm8k"), "gsm8k")
    flexible = make_reward(RewardConfig(name="gsm8k", mode="flexible"), "gsm8k")
    assert strict(solution, problem) == RewardResult(1.0, True, "1018")
    assert strict("so 1018", problem).correct is False
    assert flexible("so 1018", problem) == RewardResult(1.0, True, "1018")
