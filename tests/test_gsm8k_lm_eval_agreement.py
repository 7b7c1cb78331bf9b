"""GSM8K strict / flexible agree with lm-eval's gsm8k metrics on adversarial completions.

Each row is graded three ways: (1) by hand (the expected booleans in the table), (2) by
`lm_eval_gsm8k` below, an independent and deliberately literal rewrite of lm-eval's pipeline
(EleutherAI/lm-evaluation-harness: lm_eval/tasks/gsm8k/gsm8k.yaml, lm_eval/filters/extraction.py
RegexFilter, lm_eval/api/metrics.py exact_match_hf_evaluate) that shares nothing with tepo's code,
and (3) by tepo's grader, through the GSM8K loader's mapping (the reference is the dataset's
whole solution text, as lm-eval's `doc_to_target: "{{answer}}"`). All three must agree in the
lm-eval modes; `numeric` (tepo's own comparison) is pinned by hand on the same rows.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tepo_cli.benchmarks import get_benchmark
from tepo_cli.config.schema import RewardConfig
from tepo_cli.rewards import make_reward

# lm_eval/tasks/gsm8k/gsm8k.yaml, as written there.
STRICT_MATCH = (r"#### (\-?[0-9\.\,]+)", 0)
FLEXIBLE_EXTRACT = (r"(-?[$0-9.,]{2,})|(-?[0-9]+)", -1)
REGEXES_TO_IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]


def lm_eval_gsm8k(completion: str, solution: str, mode: str) -> bool:
    """regex filter (findall, group_select, first non-empty group, fallback) -> take_first ->
    exact_match(ignore_case=True, ignore_punctuation=False, regexes_to_ignore)."""
    pattern, group_select = STRICT_MATCH if mode == "strict" else FLEXIBLE_EXTRACT
    found = re.findall(pattern, completion)
    if not found:
        filtered = "[invalid]"
    else:
        chosen = found[group_select]
        if isinstance(chosen, tuple):
            non_empty = [group for group in chosen if group]
            chosen = non_empty[0] if non_empty else "[invalid]"
        filtered = chosen.strip()
    responses = [[filtered]]
    prediction = responses[0][0]  # take_first
    predictions, references = np.array([prediction]), np.array([solution])
    for ignored in REGEXES_TO_IGNORE:
        predictions = np.array([re.sub(ignored, "", text) for text in predictions])
        references = np.array([re.sub(ignored, "", text) for text in references])
    predictions, references = np.char.lower(predictions), np.char.lower(references)
    return bool(np.mean(predictions == references) == 1.0)


EGGS = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
    "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.\n#### 18"
)
COST = "It costs 2 * 800 = <<2*800=1600>>1,600 dollars.\n#### 1,600"
DROP = "It drops 5 - 8 = <<5-8=-3>>-3 degrees.\n#### -3"
HALF = "Half of one is 1 / 2 = <<1/2=0.5>>0.5\n#### 0.5"


def ref(number: str) -> str:
    return f"The solution, worked.\n#### {number}"


# (completion, reference solution, strict, flexible, numeric), every boolean written by hand.
TABLE: list[tuple[str, str, bool, bool, bool]] = [
    ("#### 18", EGGS, True, True, True),
    ("The answer is 18.\n#### 18", EGGS, True, True, True),
    ("#### 18.", EGGS, True, True, True),  # one trailing period is ignored
    ("#### 18.0", EGGS, False, False, True),  # lm-eval compares strings
    ("#### 018", EGGS, False, False, True),
    ("#### 18.00", EGGS, False, False, True),
    ("#### $18", EGGS, False, True, False),  # strict's regex takes no '$'
    ("#### 1,600", COST, True, True, True),
    ("#### 1600", COST, True, True, True),
    ("#### 1.600", COST, False, False, False),
    ("#### 16,00", COST, True, True, True),  # commas are removed wherever they are
    ("#### $1,600.00", COST, False, False, False),
    ("#### -3", DROP, True, True, True),
    ("#### - 3", DROP, False, False, False),
    ("#### −3", DROP, False, False, False),  # U+2212 is not '-' to lm-eval's regexes
    ("The loss is -3 dollars.", DROP, False, True, False),
    ("#### 3", DROP, False, False, False),
    ("#### 7\n#### 9", ref("7"), True, False, True),  # strict: first; flexible: last
    ("#### 9\n#### 7", ref("7"), False, True, False),
    ("#### 7 apples, then 3 more", ref("7"), True, False, True),
    ("So 7.\n#### 7\nCheck: 7 + 0 = 7", ref("7"), True, True, True),
    ("#### 7\nBonus: 2 * 4 = 8", ref("7"), True, False, True),  # a number after the answer
    ("The answer is 18", EGGS, False, True, False),  # no '#### ' line
    ("The answer is $18.", EGGS, False, True, False),
    ("The answer is 18.5", EGGS, False, False, False),
    ("no numbers here", EGGS, False, False, False),
    ("[invalid]", EGGS, False, False, False),  # lm-eval's fallback text, written by the model
    ("[invalid] #### 18", EGGS, True, True, True),
    ("#### 18 [invalid]", EGGS, True, True, True),
    ("The answer is [invalid]", EGGS, False, False, False),
    ("#### 0.50", HALF, False, False, True),
    ("#### .5", HALF, False, False, True),
    ("#### 0.5", HALF, True, True, True),
    ("#### 1/2", HALF, False, False, False),
    ("#### 18,000", ref("18000"), True, True, True),
    ("#### 18,000", EGGS, False, False, False),
    ("#### 18, 19", EGGS, True, False, True),  # strict takes '18,'; flexible the last '19'
    ("####  18", EGGS, False, True, False),  # two spaces
    ("####18", EGGS, False, True, False),
    ("####\t18", EGGS, False, True, False),
    ("#### 18\n", EGGS, True, True, True),
    ("Answer: 18 #### 18", EGGS, True, True, True),
    ("#### 18 dollars, or 1800 cents", EGGS, True, False, True),
    ("#### 18.\n\n", EGGS, True, True, True),
    ("The total is 1,234,567.\n#### 1,234,567", ref("1234567"), True, True, True),
    ("#### 1,234,567.", ref("1,234,567"), True, True, True),
    ("#### 12.5.", ref("12.5"), True, True, True),
    ("#### 12..", ref("12"), False, False, True),  # only one trailing period goes
    ("#### ...", EGGS, False, False, False),
    ("The answer is 18. Hope that helps...", EGGS, False, False, False),  # '...' is last
    ("It costs $5.50 per item, so 18 in all", EGGS, False, True, False),
    ("#### -18", EGGS, False, False, False),
    ("#### --18", EGGS, False, False, False),
    ("#### 18\n#### 18.0", EGGS, True, False, True),
    ("#### 18.0\n#### 18", EGGS, False, True, True),
    ("The answer is 2 + 16 = 18", EGGS, False, True, False),
    ("18 is the answer, not 19", EGGS, False, False, False),
    ("#### 1,6,0,0", COST, True, True, True),
    ("#### $1,600", COST, False, True, False),
    ("#### 1 600", COST, False, False, False),
    ("#### 16OO", COST, False, False, False),  # letters O, not zeros
    ("#### 0", ref("0"), True, True, True),
    ("#### -0", ref("0"), False, False, True),
    ("#### 00", ref("0"), False, False, True),
    ("#### 3.0", ref("3"), False, False, True),
    ("#### 5\n\nQuestion: What is 2+2?\nAnswer: 4", ref("5"), True, False, True),
    ("#### 10%", ref("10"), True, True, True),
    ("#### 1e3", ref("1000"), False, False, False),
    ("#### ,18", EGGS, True, True, True),
    ("#### 18,", EGGS, True, True, True),
    ("#### 18.,", EGGS, True, True, True),  # ',' goes first, then the now trailing '.'
    ("#### 18 #### 19", EGGS, True, False, True),
    ("#### -", EGGS, False, False, False),
    ("", EGGS, False, False, False),
    ("18", EGGS, False, True, False),
    ("8", EGGS, False, False, False),
    ("#### 8", ref("8"), True, True, True),  # one digit: flexible's second group
    ("Total: 2,125 dollars\n#### 2,125.", ref("2125"), True, True, True),
]
MODES = ("strict", "flexible", "numeric")


def tepo_grades(completion: str, solution: str, mode: str) -> bool:
    """tepo's path: the loader maps the dataset record, the configured grader scores it."""
    to_problem = get_benchmark("gsm8k").to_problem
    assert to_problem is not None
    problem = to_problem({"question": "q", "answer": solution}, 0, "gsm8k/test/0")
    reward = make_reward(RewardConfig(name="gsm8k", mode=mode), "gsm8k")  # type: ignore[arg-type]
    return reward(completion, problem).correct


def test_the_table_is_large_and_adversarial_in_both_directions() -> None:
    assert len(TABLE) >= 60
    for column in (2, 3, 4):  # each mode has both outcomes
        assert {row[column] for row in TABLE} == {True, False}
    assert sum(row[2] != row[4] for row in TABLE) == 10  # where strict and numeric differ


@pytest.mark.parametrize("mode", ["strict", "flexible"])
def test_hand_written_outcomes_are_lm_evals(mode: str) -> None:
    """The hand-written booleans are what the literal rewrite of lm-eval computes."""
    column = MODES.index(mode) + 2
    disagreements = [row[:2] for row in TABLE if lm_eval_gsm8k(row[0], row[1], mode) != row[column]]
    assert disagreements == []


@pytest.mark.parametrize("mode", MODES)
def test_tepo_agrees_with_the_table(mode: str) -> None:
    column = MODES.index(mode) + 2
    disagreements = [row[:2] for row in TABLE if tepo_grades(row[0], row[1], mode) != row[column]]
    assert disagreements == []


@pytest.mark.parametrize("mode", ["strict", "flexible"])
def test_tepo_agrees_with_lm_eval_row_by_row(mode: str) -> None:
    disagreements = [
        row[:2]
        for row in TABLE
        if tepo_grades(row[0], row[1], mode) != lm_eval_gsm8k(row[0], row[1], mode)
    ]
    assert disagreements == []
