"""Word-problem reward: the completion's final answer, compared as a number with the answer.

Which number is the final answer:
  1. the number right after the LAST "the answer is" or "the final answer is" (case-insensitive)
     that has a number after it; only markup may sit between the phrase and the number: spaces,
     ":", "**", "$", "\\boxed{", "(". So "The answer is 14.", "the answer is **14**",
     "The final answer is: $1,234$" read 14, 14 and 1234 (commas dropped, a trailing period is
     punctuation, "14.0" is 14); a stated equation gives its result ("The answer is 21 + 6 =
     27." reads 27);
  2. a completion with no such phrase (none at all, or only one that no number follows, such as
     the prompt's own "The answer is N.") falls back to its last number, as `arith` grades.
The prompt asks the model to end with "The answer is N.", and chain-of-thought completions are
full of intermediate numbers: the phrase, not the last number, is what the model commits to;
the fallback still credits a model that states the result its own way ("... = 14").
"""

from __future__ import annotations

import re

from tepo_cli.rewards.arith_grader import extract_final_number, graded, numeric_grader

_NUMBER = r"[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-−]?\d+(?:\.\d+)?"
_ANSWER = re.compile(
    r"\bthe\s+(?:final\s+)?answer\s+is\s*:?[\s*$(]*(?:\\boxed\{)?[\s*$]*"
    # "The answer is 27 + 27 = 54": the result of the equation is what is stated
    rf"(?:(?:{_NUMBER})(?:\s*[-+*/×x÷]\s*(?:{_NUMBER}))+\s*=\s*[\s*$]*)?"
    rf"(?P<number>{_NUMBER})",
    re.IGNORECASE,
)


def extract_answer(text: str) -> str | None:
    """The final answer of `text` as a normalised number ("1,234" -> "1234"), or None."""
    stated = [match["number"] for match in _ANSWER.finditer(text)]
    return extract_final_number(stated[-1] if stated else text)


def is_correct(completion: str, answer: str) -> tuple[bool, str | None]:
    return graded(extract_answer, completion, answer)


GRADER = numeric_grader("word_math", extract_answer)
