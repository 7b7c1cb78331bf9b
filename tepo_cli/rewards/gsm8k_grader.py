"""GSM8K reward: lm-evaluation-harness's own ``gsm8k`` metrics, or a numeric comparison.

``strict`` and ``flexible`` are lm-eval's ``strict-match`` and ``flexible-extract``, reimplemented
from EleutherAI/lm-evaluation-harness ``lm_eval/tasks/gsm8k/gsm8k.yaml`` (filters and metric
settings), ``lm_eval/filters/extraction.py`` (``RegexFilter``) and ``lm_eval/api/metrics.py``
(``exact_match_hf_evaluate``), so a tepo score in these modes is lm-eval's score of the same text:

- ``strict``: the *first* match of ``#### (\\-?[0-9\\.\\,]+)`` (``group_select: 0``);
- ``flexible``: the *last* match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)`` (``group_select: -1``),
  its first non-empty group;
- no match: lm-eval's fallback ``[invalid]`` is the prediction (``extracted`` is None);
- then exact match as strings: ``,``, ``$``, everything up to the last ``#### `` and one trailing
  ``.`` removed (``re.sub``, in that order) from prediction and reference, both lower-cased. So
  ``#### 1,600`` and ``#### $1600.`` match ``1600``, but ``#### 12.0``, ``#### 012`` and
  ``#### 0.50`` do not match ``12``, ``12`` and ``0.5``.

``numeric`` is tepo's earlier ``strict``: the same ``#### `` number, compared as an exact
rational after removing commas, ``$`` and a trailing ``.`` (``12.0`` = ``12`` = ``012``); an
upper bound on lm-eval's strict-match, not the same metric.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Literal

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import RewardResult
from tepo_cli.rewards import Grader, ScoreMany, one_by_one

Mode = Literal["strict", "flexible", "numeric"]
MODES: tuple[Mode, ...] = ("strict", "flexible", "numeric")

# lm_eval/tasks/gsm8k/gsm8k.yaml: filter_list (regex, group_select) and exact_match's settings.
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_GROUP_SELECT = {"strict": 0, "flexible": -1}
INVALID = "[invalid]"  # RegexFilter's fallback when the pattern does not match
IGNORED = tuple(re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$"))


def regex_filter(text: str, pattern: re.Pattern[str], group_select: int) -> str | None:
    """lm-eval's ``RegexFilter`` on one response: ``findall``, the match at `group_select`, a
    tuple's first non-empty group, stripped; None where lm-eval falls back to ``[invalid]``."""
    matches = pattern.findall(text)
    if not matches:
        return None
    match = matches[group_select]
    if isinstance(match, tuple):
        match = next((group for group in match if group), None)
        if match is None:
            return None
    return match.strip()


def exact_match_form(text: str) -> str:
    """A side of lm-eval's exact match: ``regexes_to_ignore`` removed in order, lower-cased
    (``ignore_case: true``, ``ignore_punctuation: false``)."""
    for pattern in IGNORED:
        text = pattern.sub("", text)
    return text.lower()


def lm_eval_match(prediction: str | None, reference: str) -> bool:
    """lm-eval's exact match of a filtered prediction (None: ``[invalid]``) and a reference."""
    filtered = INVALID if prediction is None else prediction
    return exact_match_form(filtered) == exact_match_form(reference)


def normalise_number(text: str) -> str:
    """``"$1,234."`` -> ``"1234"``; ``"−5"`` -> ``"-5"``; ``"18.00"`` stays (see `same_number`)."""
    return text.strip().replace(",", "").replace("$", "").replace("−", "-").rstrip(".")


def same_number(a: str, b: str) -> bool:
    """``numeric`` mode's comparison: exact rationals; strings that are not numbers as strings."""
    a, b = normalise_number(a), normalise_number(b)
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError):
        return a == b


def extract(text: str, mode: Mode = "strict") -> str | None:
    """The answer `mode` reads from `text`: lm-eval's filtered response (as written, e.g.
    ``"$1,234."``) for strict/flexible, the normalised ``#### `` number for numeric."""
    if mode == "numeric":
        number = regex_filter(text, STRICT, 0)
        return None if number is None else (normalise_number(number) or None)
    if mode not in _GROUP_SELECT:
        raise ValueError(f"GSM8K mode must be one of {MODES}, got {mode!r}")
    return regex_filter(text, STRICT if mode == "strict" else FLEXIBLE, _GROUP_SELECT[mode])


def same_answer_under(mode: Mode) -> Callable[[str, str], bool]:
    """How `mode` compares two answers (an extracted one and the reference, or two votes)."""
    return same_number if mode == "numeric" else lm_eval_match


def reference_answer(solution: str) -> str:
    """The reference of a GSM8K solution as lm-eval compares it: the text after its last ``#### ``
    with commas, ``$`` and a trailing period removed (``"...\\n#### 1,018"`` -> ``"1018"``).
    [our reading] Surrounding whitespace is stripped first (lm-eval would keep a final newline)."""
    if STRICT.search(solution) is None:
        raise ValueError("GSM8K solution has no '#### <number>' line")
    return exact_match_form(solution.strip())


def grade_gsm8k(
    completion: str,
    reference: str,
    *,
    mode: Mode = "strict",
    correct: float = 1.0,
    incorrect: float = 0.0,
) -> RewardResult:
    extracted = extract(completion, mode)
    if mode == "numeric":
        ok = extracted is not None and same_number(extracted, reference)
    else:
        ok = lm_eval_match(extracted, reference)
    return RewardResult(correct if ok else incorrect, ok, extracted)


def _build(cfg: RewardConfig) -> ScoreMany:
    mode, correct, incorrect = cfg.mode, cfg.correct, cfg.incorrect
    return one_by_one(
        lambda c, p: grade_gsm8k(c, p.answer, mode=mode, correct=correct, incorrect=incorrect)
    )


GRADER = Grader("gsm8k", _build, same_answer_for=lambda cfg: same_answer_under(cfg.mode))
