"""Arithmetic reward: the last number in the completion, compared exactly with the answer.

Small models answer "12 + 35 = 47", "The answer is 47." or "**47**", so a strict whole-string
match scores 0; the final number is what the model commits to.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.rewards import Grader, ScoreMany, one_by_one

# A number: optional sign, digits with optional thousands separators, optional decimals.
_NUMBER = re.compile(r"(?<![\w.])[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])[-−]?\d+(?:\.\d+)?")


def extract_final_number(text: str) -> str | None:
    """The last number in `text`, normalised ("1,234" -> "1234", "−5" -> "-5", "47.0" -> "47")."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    raw = matches[-1].replace(",", "").replace("−", "-")
    value = Fraction(raw)
    return str(value.numerator) if value.denominator == 1 else raw


def graded(
    extract: Callable[[str], str | None], completion: str, answer: str
) -> tuple[bool, str | None]:
    """(right, what was read): the number `extract` reads from `completion`, compared with
    `answer` as a number (14.0 = 14), never as a string."""
    extracted = extract(completion)
    if extracted is None:
        return False, None
    return Fraction(extracted) == Fraction(answer), extracted


def numeric_grader(name: str, extract: Callable[[str], str | None]) -> Grader:
    """A grader scoring the number `extract` reads from each completion (arith, word_math)."""

    def build(cfg: RewardConfig) -> ScoreMany:
        def score(completion: str, problem: Problem) -> RewardResult:
            ok, extracted = graded(extract, completion, problem.answer)
            return RewardResult(cfg.correct if ok else cfg.incorrect, ok, extracted)

        return one_by_one(score)

    return Grader(name, build, same_answer=lambda a, b: Fraction(a) == Fraction(b))


def is_correct(completion: str, answer: str) -> tuple[bool, str | None]:
    return graded(extract_final_number, completion, answer)


GRADER = numeric_grader("arith", extract_final_number)
