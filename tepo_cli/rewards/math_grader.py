"""Maths reward: the completion's final answer checked against the reference with math-verify.

Extraction:
  1. a completion with a ``\\boxed``/``\\fbox`` answers with its *last* box only: the content
     of that ``\\boxed{...}`` / ``\\fbox{...}`` (``\\boxed 5`` too), found by brace matching
     (``last_boxed``), parsed by math-verify. When that last box is cut off (``\\boxed{\\frac{3``
     at max_new_tokens), empty or without an argument, the completion has *no* answer: neither an
     earlier box nor any other text stands in for it, so a truncated rollout earns no reward;
  2. only a completion without any box goes to math-verify's own extraction over the whole text
     (anchors such as "final answer is", then the last LaTeX or plain expression).
The reference (``Problem.answer``: the content of the reference solution's last box) is parsed
as ``$<answer>$``, falling back to ``\\boxed{<answer>}``; ``verify(gold, prediction)`` then
decides equivalence (1/2 = 0.5 = \\frac12, sets and intervals, ``x=5`` vs ``5``, ...).

Timeouts. math-verify bounds parsing and comparison with ``signal.alarm``, which only works in
the main thread (elsewhere it raises ``ValueError``) and cancels any alarm the caller had set.
``grade_math`` therefore uses math-verify's timeout (``timeout_s``, whole seconds) only when it
runs in the main thread, and disables it (``parsing_timeout=None``/``timeout_seconds=None``)
in worker threads, where a pathological expression could then run long. To bound such inputs
off the main thread, grade in worker *processes* (each process's main thread gets the alarm).
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import RewardResult
from tepo_cli.rewards import Grader, ScoreMany, one_by_one

DEFAULT_TIMEOUT_S = 5
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_SPACE_ARG = re.compile(r"[^\s$]+")
# Thousands separators as MATH writes them ("5,\\!525", "5{,}525"), which math-verify reads
# as a tuple; only tried when the answer as written does not parse as maths.
_THOUSANDS = re.compile(r"(?<=\d)(?:,\\!|\{,\}|,)(?=\d{3}(?!\d))")


def _braced(text: str, start: int) -> str | None:
    """The content of the group opening at ``text[start] == "{"``, or None when unclosed.

    A backslash escapes the next character, so ``\\{`` and ``\\}`` (literal braces in LaTeX)
    are not counted, and ``\\\\{`` (a line break, then a group) is.
    """
    depth = 0
    index = start
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : index]
        index += 1
    return None


def last_boxed(text: str) -> str | None:
    """The argument of the last ``\\boxed``/``\\fbox`` in `text`, or None.

    ``\\boxed{...}`` may nest braces; ``\\boxed 5`` (no braces) takes the run of characters up to
    the next space or ``$``, without a trailing ``.``/``,``/``;``. When the last box is unclosed
    (a truncated generation), the result is None: an earlier box is not the final answer.
    """
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    position = matches[-1].end()
    while position < len(text) and text[position].isspace():
        position += 1
    if position < len(text) and text[position] == "{":
        return _braced(text, position)
    run = _SPACE_ARG.match(text, position)
    value = run.group(0).rstrip(".,;") if run else ""
    return value or None


def _timeout(timeout_s: int | None) -> int | None:
    """math-verify's signal-based timeout only works in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return timeout_s


def _parse(text: str, timeout_s: int | None) -> list[Any]:
    from math_verify import parse

    return parse(text, parsing_timeout=_timeout(timeout_s))


def _parse_bare(answer: str, timeout_s: int | None) -> list[Any]:
    return _parse(f"${answer}$", timeout_s) or _parse(f"\\boxed{{{answer}}}", timeout_s)


@lru_cache(maxsize=4096)
def _parse_answer(answer: str, timeout_s: int | None) -> tuple[Any, ...]:
    """A bare answer string (no surrounding text) parsed as maths; cached (a reference is
    graded once per sample). When it yields only a string (math-verify could not read it as
    maths), a trailing period and thousands separators are dropped and it is tried again."""
    parsed = _parse_bare(answer, timeout_s)
    if parsed and not isinstance(parsed[0], str):
        return tuple(parsed)
    cleaned = _THOUSANDS.sub("", answer.strip().rstrip(".").rstrip())
    if cleaned != answer:
        retry = _parse_bare(cleaned, timeout_s)
        if retry and not isinstance(retry[0], str):
            return tuple(retry)
    return tuple(parsed)


def is_symbolic(parsed: tuple[Any, ...]) -> bool:
    """Whether a parse holds a maths object (not only the string math-verify fell back to)."""
    return bool(parsed) and not isinstance(parsed[0], str)


def clear_cache() -> None:
    """Forget cached answer parses (for timing runs)."""
    _parse_answer.cache_clear()


def _verify(gold: tuple[Any, ...], prediction: tuple[Any, ...], timeout_s: int | None) -> bool:
    from math_verify import verify

    if not gold or not prediction:
        return False
    return bool(verify(list(gold), list(prediction), timeout_seconds=_timeout(timeout_s)))


def extract_answer(
    completion: str, timeout_s: int | None = DEFAULT_TIMEOUT_S
) -> tuple[str | None, tuple[Any, ...]]:
    """(the extracted answer text, its math-verify parse): the last box when there is one (none
    when it is unclosed or empty), math-verify's extraction over the text when there is none."""
    if _BOX.search(completion) is not None:  # the last box is the answer, or there is none
        boxed = last_boxed(completion)
        if boxed is None or not boxed.strip():
            return None, ()
        return boxed, _parse_answer(boxed, timeout_s)
    parsed = tuple(_parse(completion, timeout_s))
    if not parsed:
        return None, ()
    text = next((item for item in parsed if isinstance(item, str)), str(parsed[0]))
    return text, parsed


def grade_math(
    completion: str,
    reference: str,
    *,
    timeout_s: int | None = DEFAULT_TIMEOUT_S,
    correct: float = 1.0,
    incorrect: float = 0.0,
) -> RewardResult:
    """Reward `correct` when the completion's final answer equals `reference` (a bare answer
    such as ``\\frac{1}{2}``), else `incorrect`. ``extracted`` is the answer text that was
    compared (None when nothing could be extracted)."""
    extracted, prediction = extract_answer(completion, timeout_s)
    ok = _verify(_parse_answer(reference, timeout_s), prediction, timeout_s)
    return RewardResult(correct if ok else incorrect, ok, extracted)


def answers_equivalent(a: str, b: str, timeout_s: int | None = DEFAULT_TIMEOUT_S) -> bool:
    """Whether two bare answers are the same maths (e.g. for grouping majority votes)."""
    if a.strip() == b.strip():
        return True
    return _verify(_parse_answer(a, timeout_s), _parse_answer(b, timeout_s), timeout_s)


def _build(cfg: RewardConfig) -> ScoreMany:
    timeout, correct, incorrect = max(1, round(cfg.timeout_s)), cfg.correct, cfg.incorrect
    return one_by_one(
        lambda c, p: grade_math(
            c, p.answer, timeout_s=timeout, correct=correct, incorrect=incorrect
        )
    )


GRADER = Grader("math", _build, same_answer=answers_equivalent)
