"""The word_math grader (tepo_cli/rewards/word_math_grader.py): its extraction rules, and its verdicts on
real completions of the embedded model."""

from __future__ import annotations

import pytest
from test_word_math import word_math

from tepo_cli.benchmarks import build_reward
from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import Problem
from tepo_cli.rewards.word_math_grader import extract_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 14.", "14"),
        ("so the answer is **14**.", "14"),
        ("The final answer is: $1,234$", "1234"),
        ("THE ANSWER IS 14.0 apples", "14"),
        ("The answer is \\boxed{7}.", "7"),
        ("The answer is 3. Wait, 3 + 4 = 7. The answer is 7.", "7"),  # the last phrase
        ('End with "The answer is N." Here 5 + 2 = 7.', "7"),  # phrase without a number
        ("12 + 5 = 17, then 17 - 3 = 14", "14"),  # no phrase: the last number
        ("The answer is -3.", "-3"),
        ("no number at all", None),
    ],
)
def test_extraction_rules(text, expected):
    assert extract_answer(text) == expected


# Real greedy completions of the embedded model (SmolLM2-135M-Instruct), copied verbatim from
# `<run dir>/samples.jsonl` of `tepo eval benchmark=word_math rollout=vllm eval.limit=100` (the
# default held-out split; held-out/<i> is the record's id), with the problem's answer, what the
# grader must read from the completion and whether that is right.
REAL_COMPLETIONS = [
    (  # held-out/12: states the sum, then the phrase
        (
            "Yuki starts with 6 balloons. She buys 5 more, so she now has 6 + 5 = 11 balloons.\n"
            "The answer is 11.\n"
            "\n"
            "The answer is 11."
        ),
        "11",
        "11",
        True,
    ),
    (  # held-out/7: "The final answer is"
        (
            "To solve this problem, we need to break it down step by step. First, we need to find the total number of boxes with 2 toy cars. There are 3 boxes with 2 cars each. So, the total number of boxes with 2 cars is 3 * 2 = 6 boxes.\n"
            "\n"
            "Now, we need to find the number of boxes with 2 cars. There are 3 boxes with 2 cars each. So, the number of boxes with 2 cars is 3 * 2 = 6 boxes.\n"
            "\n"
            "The answer is 6.\n"
            "\n"
            "The final answer is 6.\n"
            "\n"
            "The step-by-step breakdown is: 3 boxes with 2 cars each, 6 boxes, and 2 cars each."
        ),
        "6",
        "6",
        True,
    ),
    (  # held-out/22: the prompt's literal "The answer is N.": the last number
        (
            "Priya has 6 pencils. Leo gives her 3 pencils. So, Priya now has 6 + 3 = 9 pencils.\n"
            "The answer is N."
        ),
        "9",
        "9",
        True,
    ),
    (  # held-out/3: cut off at 320 tokens repeating "The answer is N.": the last number
        (
            "Leo has 10 jars with 2 books in each jar, which means he has 10 x 2 = 20 books.\n"
            "He has now 20 books.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is"
        ),
        "20",
        "20",
        True,
    ),
    (  # held-out/13: "The answer is N, which is 9." then "the answer is 9."
        (
            "To solve this problem, we need to break it down step by step. First, we calculate Sam's initial amount of 3 pencils: 3 pencils = 3 * 2 = 6 pencils.\n"
            "\n"
            "Next, Sam loses 2 of the original pencils. So, Sam loses 2 * 2 = 4 pencils.\n"
            "\n"
            "Now, we add the remaining 2 pencils back to Sam's original amount of 3 pencils. So, Sam has 3 + 6 = 9 pencils now.\n"
            "\n"
            "The answer is N, which is 9.\n"
            "\n"
            "So, the answer is 9."
        ),
        "1",
        "9",
        False,
    ),
    (  # held-out/30: an equation after the phrase: its result, not the 27 before it
        (
            "Yuki buys 3 times as many as before, so she buys 3 * 7 = 21 stickers.\n"
            "Next, she buys 6 more, so she buys 21 + 6 = 27 stickers.\n"
            "The total number of stickers Yuki has now is the sum of the number of stickers she has before and the number of stickers she has now.\n"
            "The answer is 27 + 27 = 54.\n"
            "The answer is N.\n"
            "\n"
            "Yuki has now 5 stickers."
        ),
        "27",
        "54",
        False,
    ),
    (  # held-out/52: an equation, then only literal N's
        (
            "Priya has 2 books, so she has 2 * 2 = 4 books.\n"
            "She buys more books, so she has 2 * 4 = 8 more books.\n"
            "The answer is 2 * 8 = 16 books.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N.\n"
            "The answer is N."
        ),
        "4",
        "16",
        False,
    ),
    (  # held-out/5: the last phrase, not the last number (1, of a list cut off)
        (
            "To solve this problem, Mia starts with 12 stamps and splits them into 3 equal piles. She then sells 2 of those piles, which means she sold 2 * 3 = 6 stamps.\n"
            "\n"
            "Mia now has 12 - 6 = 6 stamps left.\n"
            "\n"
            "The final answer is 12 + 6 = 18.\n"
            "\n"
            "The answer is 18.\n"
            "\n"
            "The step-by-step reasoning process is:\n"
            "1. Mia starts with 12 stamps.\n"
            "2. She splits the 12 into 3 equal piles.\n"
            "3. She sells 2 of those piles, which means she sold 2 * 3 = 6 stamps.\n"
            "4. She now has 18 - 6 = 12 stamps left.\n"
            "\n"
            "The final answer is 12 + 12 = 24.\n"
            "\n"
            "The answer is 24.\n"
            "\n"
            "The step-by-step reasoning process is:\n"
            "1. Mia starts with 12 stamps.\n"
            "2. She splits the 12 into 3 equal piles.\n"
            "3. She sells 2 of those piles, which means she sold 2 * 3 = 6 stamps.\n"
            "4. She now has 18 - 6 = 12 stamps left.\n"
            "\n"
            "The final answer is 12 + 12 = 24.\n"
            "\n"
            "The answer is 24.\n"
            "\n"
            "The step-by-step reasoning process is:\n"
            "1"
        ),
        "5",
        "24",
        False,
    ),
    (  # held-out/0: a decimal answer
        (
            "To solve this problem, we need to break it down step by step. First, we need to find the total number of seashells Nora has. We can do this by adding the number of seashells she has to the number of seashells she has now. So, 3 + 2 = 5.\n"
            "\n"
            "Now, we need to find the number of seashells she has now. We can do this by dividing the number of seashells she has now by the number of seashells she has. So, 5 / 3 = 1.5.\n"
            "\n"
            "So, the answer is 1.5."
        ),
        "2",
        "1.5",
        False,
    ),
]


@pytest.mark.parametrize(("completion", "answer", "expected", "correct"), REAL_COMPLETIONS)
def test_grader_on_real_completions(completion, answer, expected, correct):
    reward = build_reward(RewardConfig(name="auto", incorrect=-1.0), word_math())
    result = reward(completion, Problem(id="p", question="q", answer=answer))
    assert (result.extracted, result.correct) == (expected, correct)
    assert result.reward == (1.0 if correct else -1.0)
