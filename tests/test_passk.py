"""pass@k against hand-computed values; maj@k with ties and grader-decided equivalence."""

from __future__ import annotations

from math import comb

import pytest

from tepo_cli.eval.passk import (
    maj_at_k,
    majority_answer,
    mean_pass_at_k,
    normalise_answer,
    pass_at_k,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, 7 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 5, 1.0),  # C(3,5) = 0
        (5, 2, 3, 9 / 10),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),
        (5, 5, 5, 1.0),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomials_and_is_stable() -> None:
    for n, c, k in [(20, 3, 4), (100, 17, 10), (64, 1, 8)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), rel=1e-12)
    assert 0.0 < pass_at_k(2000, 1, 1000) < 1.0  # C(2000, 1000) overflows a float


def test_pass_at_k_checks_arguments() -> None:
    for n, c, k in [(5, 2, 6), (5, 2, 0), (5, 6, 1), (5, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


def test_mean_pass_at_k() -> None:
    assert mean_pass_at_k([(5, 2), (5, 0), (5, 5)], 1) == pytest.approx((0.4 + 0 + 1) / 3)
    assert mean_pass_at_k([(5, 2), (5, 0)], 2) == pytest.approx(0.35)


def test_majority_answer_and_ties() -> None:
    assert majority_answer(["3", "4", "4", "3", "4"]) == "4"
    # 2-2 tie: the answer whose first vote came first wins, whatever its value.
    assert majority_answer(["7", "2", "2", "7"]) == "7"
    assert majority_answer(["2", "7", "7", "2"]) == "2"
    # Only the first k samples vote.
    assert majority_answer(["1", "1", "5", "5", "5"], k=2) == "1"
    # Unparsed samples do not vote; nothing parsed -> None.
    assert majority_answer([None, "9", None, None]) == "9"
    assert majority_answer([None, None]) is None
    with pytest.raises(ValueError):
        majority_answer(["1"], k=2)


def test_majority_groups_by_normalised_string_and_equivalence() -> None:
    assert normalise_answer(r"\left( 1, 2 \right)") == normalise_answer("(1,2)")
    assert normalise_answer(r"\dfrac{1}{2}.") == r"\frac{1}{2}"
    answers = [r"\frac{1}{2}", "3", "0.5", "3", r"\dfrac12"]
    # By spelling alone "3" wins (2 votes against 1+1+1) ...
    assert majority_answer(answers) == "3"
    # ... but the grader knows 1/2 = 0.5 = \dfrac12 (3 votes): the first spelling is returned.
    numeric = {r"\frac{1}{2}": 0.5, "0.5": 0.5, r"\dfrac12": 0.5, "3": 3.0}
    same = lambda a, b: numeric[a] == numeric[b]  # noqa: E731
    assert majority_answer(answers, equivalent=same) == r"\frac{1}{2}"


def test_maj_at_k_mean() -> None:
    answers = [["4", "4", "5"], ["1", "2", "2"], [None, None, None]]
    references = ["4", "1", "0"]
    grade = lambda i, answer: answer == references[i]  # noqa: E731
    assert maj_at_k(answers, 3, grade) == pytest.approx(1 / 3)
    assert maj_at_k(answers, 1, grade) == pytest.approx(2 / 3)
