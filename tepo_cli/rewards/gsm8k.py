"""GSM8K reward: a final number compared numerically with the reference.

Two extraction modes, as lm-evaluation-harness's ``gsm8k`` task reports them:

- ``strict``: the number after ``#### `` (lm-eval's regex ``#### (\\-?[0-9\\.\\,]+)``, first
  match, as lm-eval's ``group_select: 0``); a completion without that line scores 0.
- ``flexible``: the last number anywhere in the completion (``$1,234.50``, ``-3``, ``.5``).

Both sides are normalised (commas, ``$`` and a trailing ``.`` removed; ``−`` read as ``-``) and
compared as exact rationals, so ``18``, ``18.00`` and ``$18.`` are equal; strings that are not
numbers are compared as strings.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import RewardResult
from tepo_cli.rewards import Grader, ScoreMany, one_by_one

Mode = Literal["strict", "flexible"]
MODES: tuple[Mode, ...] = ("strict", "flexible")

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(?<![\w.])[-−]?\$?(?:\d[\d,]*(?:\.\d*)?|\.\d+)")


def normalise_number(text: str) -> str:
    """``"$1,234."`` -> ``"1234"``; ``"−5"`` -> ``"-5"``; ``"18.00"`` stays (see `same_number`)."""
    return text.strip().replace(",", "").replace("$", "").replace("−", "-").rstrip(".")


def extract_strict(text: str) -> str | None:
    match = STRICT.search(text)
    if match is None:
        return None
    return normalise_number(match.group(1)) or None


def extract_flexible(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    for raw in reversed(matches):
        value = normalise_number(raw)
        if any(char.isdigit() for char in value):
            return value
    return None


def extract(text: str, mode: Mode = "strict") -> str | None:
    if mode == "strict":
        return extract_strict(text)
    if mode == "flexible":
        return extract_flexible(text)
    raise ValueError(f"GSM8K extraction mode must be one of {MODES}, got {mode!r}")


def same_number(a: str, b: str) -> bool:
    a, b = normalise_number(a), normalise_number(b)
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError):
        return a == b


def reference_answer(solution: str) -> str:
    """The reference number of a GSM8K solution (the text after its ``####``)."""
    value = extract_strict(solution)
    if value is None:
        raise ValueError("GSM8K solution has no '#### <number>' line")
    return value


def grade_gsm8k(
    completion: str,
    reference: str,
    *,
    mode: Mode = "strict",
    correct: float = 1.0,
    incorrect: float = 0.0,
) -> RewardResult:
    extracted = extract(completion, mode)
    ok = extracted is not None and same_number(extracted, reference)
    return RewardResult(correct if ok else incorrect, ok, extracted)


def _build(cfg: RewardConfig) -> ScoreMany:
    mode, correct, incorrect = cfg.mode, cfg.correct, cfg.incorrect
    return one_by_one(
        lambda c, p: grade_gsm8k(c, p.answer, mode=mode, correct=correct, incorrect=incorrect)
    )


GRADER = Grader("gsm8k", _build, same_answer=same_number)
