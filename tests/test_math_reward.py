"""The maths grader: boxed-answer extraction, math-verify equivalences, threads."""

from __future__ import annotations

import threading

import pytest

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.rewards import make_reward
from tepo_cli.rewards.math_grader import (
    answers_equivalent,
    extract_answer,
    grade_math,
    last_boxed,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so $\boxed{42}$.", "42"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"\boxed{\left\{ x \mid x^{2} > 1 \right\}}", r"\left\{ x \mid x^{2} > 1 \right\}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not counted
        (r"\boxed{a\\{b}}", r"a\\{b}"),  # \\ is a line break; the { after it opens a group
        (r"first \boxed{1}, then \boxed{2}, finally \boxed{3}", "3"),
        (r"\fbox{7}", "7"),
        (r"\boxed{1} and \fbox{9}", "9"),
        (r"The answer is $\boxed 5$.", "5"),
        (r"The answer is \boxed 5.", "5"),
        (r"\boxed {12}", "12"),
        (r"\boxed{\text{(C)}}", r"\text{(C)}"),
        ("no box here: 5", None),
        (r"\boxed{12", None),  # unclosed (truncated): not an answer
        (r"\boxed{1} then \boxed{2", None),  # the last box is unclosed: earlier ones don't count
        (r"\boxedx{3}", None),  # another macro
        ("", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{\frac12}", "0.5"),
        (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{1/2}", r"\frac12"),
        (r"\boxed{x=5}", "5"),
        (r"\boxed{5}", "x=5"),
        (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}"),
        (r"\boxed{(1, 2]}", r"(1,2]"),
        (r"\boxed{[-\infty, 3)}", r"(-\infty,3)"),  # math-verify tolerates the bracket at infinity
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\pi/2)"),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"),
        (r"\boxed{1,\!000}", "1000"),
        (r"\boxed{\frac{12}{5525}}", r"\frac{12}{5,\!525}"),  # MATH's thousands separator
        (r"\boxed{\text{Devon}}", r"\text{Devon}"),
        (r"We get $x = 3$. The final answer is $3$.", "3"),  # fallback: no box
    ],
)
def test_equivalent_answers_are_correct(completion: str, reference: str) -> None:
    result = grade_math(completion, reference)
    assert result == RewardResult(1.0, True, result.extracted)
    assert result.extracted is not None


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        (r"\boxed{0.51}", r"\frac{1}{2}"),
        (r"\boxed{(1, 2)}", r"[1,2)"),
        (r"\boxed{\{1, 2\}}", r"\{1,2,3\}"),
        (r"\boxed{x=6}", "5"),
        (r"the answer is \boxed{2} ... no wait, \boxed{3}", "2"),  # the last box counts
        ("I don't know.", "5"),
        (r"\boxed{12", "12"),  # truncated box, and no other answer in the text
    ],
)
def test_wrong_answers_are_incorrect(completion: str, reference: str) -> None:
    result = grade_math(completion, reference, correct=2.0, incorrect=-1.0)
    assert result.reward == -1.0 and not result.correct


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        (r"\boxed{1} then \boxed{2", "1"),  # an earlier, closed box does not stand in
        (r"Try x = 7: no. So the answer is \boxed{\frac{3", "7"),  # nor "the answer is" / a value
        (r"The answer is 7 \boxed{\frac{1}{2}", r"\frac{1}{2}"),  # nor the cut-off content itself
        (r"The final answer is $7$. \boxed{7", "7"),
        (r"\boxed{7} so \fbox{", "7"),
        (r"$x = 7$, hence \boxed", "7"),  # cut off before the brace
        (r"$x = 7$, hence \boxed ", "7"),
        (r"$x = 7$, hence \boxed{\sqrt{2}+\frac{1}{2}", "7"),  # an inner group closed, the box not
        (r"x = 7, so $\boxed{}$", "7"),  # an empty final box is no answer either
        (r"\boxed{\left\{ 7 \right\}", "7"),  # escaped braces do not close the box
    ],
)
def test_a_cut_off_final_box_is_no_answer(completion: str, reference: str) -> None:
    """A rollout truncated inside its final box (max_new_tokens) earns no reward: no earlier box,
    "the answer is X" or last value is taken instead (math-verify would find one)."""
    assert grade_math(completion, reference) == RewardResult(0.0, False, None)
    assert extract_answer(completion) == (None, ())


@pytest.mark.parametrize(
    ("completion", "reference", "extracted"),
    [
        (r"\boxed{\frac{1}{2}}", "1/2", r"\frac{1}{2}"),  # nested braces closed: the whole box
        (r"\boxed{1} then \boxed{\frac{1}{2}}", "0.5", r"\frac{1}{2}"),
        (r"$\boxed{2}$ wait \{ no", "2", "2"),  # braces after a closed box do not reopen it
        (
            r"The answer is \boxed{\sqrt{2}+\frac{1}{2}}.",
            r"\frac{1}{2}+\sqrt{2}",
            r"\sqrt{2}+\frac{1}{2}",
        ),
    ],
)
def test_a_closed_final_box_is_the_answer(completion: str, reference: str, extracted: str) -> None:
    assert grade_math(completion, reference) == RewardResult(1.0, True, extracted)


def test_extraction_prefers_the_box_and_reports_it() -> None:
    assert extract_answer(r"so x = 4 and \boxed{\frac{3}{4}}. Also 7.")[0] == r"\frac{3}{4}"
    assert extract_answer("no maths at all")[0] is None


def test_the_math_grader_reads_the_problems_answer() -> None:
    """reward=math through the grader registry: the reference is `problem.answer`, the rewards
    are the reward group's."""
    problem = Problem("p", "What is half of one?", r"\frac{1}{2}", {"solution": "..."})
    reward = make_reward(RewardConfig(name="math", correct=2.0, incorrect=-1.0), "math")
    assert reward.score_many([r"It is $\boxed{0.5}$.", r"It is $\boxed{2}$."], [problem] * 2) == [
        RewardResult(2.0, True, "0.5"),
        RewardResult(-1.0, False, "2"),
    ]


def test_answers_equivalent() -> None:
    assert answers_equivalent("0.5", r"\frac{1}{2}")
    assert answers_equivalent(r"\{1,2\}", r"\{2,1\}")
    assert not answers_equivalent("2", "3")


def test_grading_works_off_the_main_thread() -> None:
    """math-verify's signal timeout would raise in a thread; the grader turns it off there."""
    results: list[RewardResult] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(grade_math(r"\boxed{\frac{2}{4}}", "0.5"))
            results.append(grade_math(r"\boxed{3}", "4"))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors
    assert [r.correct for r in results] == [True, False]
