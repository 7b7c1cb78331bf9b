"""The GSM8K grader: lm-eval's strict-match / flexible-extract filters and exact match, and the
numeric mode. Agreement with lm-eval on many completions: test_gsm8k_lm_eval_agreement.py."""

from __future__ import annotations

import pytest

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.eval.summary import summarize
from tepo_cli.rewards import make_reward
from tepo_cli.rewards.gsm8k_grader import (
    exact_match_form,
    extract,
    grade_gsm8k,
    reference_answer,
    same_number,
)


@pytest.mark.parametrize(
    ("text", "strict", "flexible", "numeric"),
    [
        ("She makes 9 * 2 = $18 a day.\n#### 18", "18", "18", "18"),
        ("#### 1,600", "1,600", "1,600", "1600"),  # as written; the comparison drops commas
        ("Total: 2,125 dollars\n#### 2,125.", "2,125.", "2,125.", "2125"),
        ("It drops by 10.\n#### -10", "-10", "-10", "-10"),
        ("#### 3.50", "3.50", "3.50", "3.50"),
        ("The answer is $1,234.50.", None, "$1,234.50.", None),
        ("So the answer is 42.", None, "42.", None),
        ("First 3 apples, then 5 pears, so 8 fruits in all", None, "8", None),
        ("Hope that helps...", None, "...", None),  # flexible's first group takes '...'
        ("####18", None, "18", None),  # lm-eval's strict regex needs the space
        ("#### $18", None, "$18", None),  # ... and no dollar sign
        ("#### 7\nor maybe\n#### 9", "7", "9", "7"),  # strict: the first; flexible: the last
        ("no number", None, None, None),
        ("#### ...", "...", "...", None),
    ],
)
def test_extraction(
    text: str, strict: str | None, flexible: str | None, numeric: str | None
) -> None:
    assert extract(text, "strict") == strict
    assert extract(text, "flexible") == flexible
    assert extract(text, "numeric") == numeric


def test_exact_match_form_removes_lm_evals_ignored_patterns_in_order() -> None:
    assert exact_match_form("$1,234.") == "1234"
    assert exact_match_form("18.,") == "18"  # the comma goes first, then the trailing period
    assert exact_match_form("12..") == "12."  # one trailing period only
    assert exact_match_form("work\n#### 5\n#### 1,018") == "1018"  # up to the last '#### '
    assert exact_match_form("[INVALID]") == "[invalid]"


def test_numeric_comparison() -> None:
    assert same_number("18", "18.00")
    assert same_number("$1,600", "1600")
    assert same_number("-10", "-10.")
    assert not same_number("18", "18.5")
    assert not same_number("1.2.3", "123")  # not numbers: compared as strings


def test_the_three_modes() -> None:
    completion = "Janet sells 9 eggs at $2, so she makes $18."
    assert grade_gsm8k(completion, "18", mode="strict") == RewardResult(0.0, False, None)
    assert grade_gsm8k(completion, "18", mode="flexible") == RewardResult(1.0, True, "$18.")
    assert grade_gsm8k(completion, "18", mode="numeric") == RewardResult(0.0, False, None)
    assert grade_gsm8k(completion + "\n#### 18", "18") == RewardResult(1.0, True, "18")
    padded = "#### 18.0"  # the same number, not the same string
    assert grade_gsm8k(padded, "18", mode="strict") == RewardResult(0.0, False, "18.0")
    assert grade_gsm8k(padded, "18", mode="numeric") == RewardResult(1.0, True, "18.0")
    wrong = grade_gsm8k("#### 17", "18", correct=1.0, incorrect=-0.5)
    assert wrong == RewardResult(-0.5, False, "17")
    with pytest.raises(ValueError, match="mode"):
        grade_gsm8k("#### 1", "1", mode="lenient")  # type: ignore[arg-type]


def test_reference_and_protocol() -> None:
    solution = "16 - 3 - 4 = <<16-3-4=9>>9\n9 * 2 = $<<9*2=18>>18\n#### 1,018"
    assert reference_answer(solution) == "1018"
    assert reference_answer("#### 5.\n") == "5"
    with pytest.raises(ValueError):
        reference_answer("no marker")
    problem = Problem("g", "q", reference_answer(solution), {"solution": solution})
    strict = make_reward(RewardConfig(name="gsm8k"), "gsm8k")
    flexible = make_reward(RewardConfig(name="gsm8k", mode="flexible"), "gsm8k")
    numeric = make_reward(RewardConfig(name="gsm8k", mode="numeric"), "gsm8k")
    assert strict(solution, problem) == RewardResult(1.0, True, "1,018")
    assert strict("so 1018", problem) == RewardResult(0.0, False, None)
    assert flexible("so 1018", problem) == RewardResult(1.0, True, "1018")
    assert numeric("#### 1018.00", problem) == RewardResult(1.0, True, "1018.00")


def _vote(sample: int, extracted: str, passed: bool) -> dict:
    return {
        "id": "g",
        "sample": sample,
        "extracted": extracted,
        "passed": passed,
        "length": 3,
        "truncated": False,
    }


def test_majority_vote_compares_answers_as_the_mode_grades_them() -> None:
    """maj@3 of '12.0', '12.0', '12' for 12: lm-eval's strict sees two votes for a wrong string;
    numeric sees three votes for 12 (and grades each sample correct)."""
    problems = [Problem("g", "q", "12")]
    strict = [_vote(0, "12.0", False), _vote(1, "12.0", False), _vote(2, "12", True)]
    numeric = [dict(record, passed=True) for record in strict]
    for records, mode, majority in ((strict, "strict", 0.0), (numeric, "numeric", 1.0)):
        cfg = RewardConfig(name="auto", mode=mode)  # type: ignore[arg-type]
        summary = summarize(records, problems, 3, [1], "gsm8k", cfg)
        assert summary["maj@3"] == majority
