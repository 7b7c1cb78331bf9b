#!/usr/bin/env python
"""Acceptance check of the benchmark loaders and graders on the references themselves.

    python scripts/check_references.py [--skip-code] [--limit 100]   # prepares what is missing
    python scripts/check_references.py --smoke         # CI: the first 5 of each, code included

Every reference must score correct through the grader a model is scored with: GSM8K's solutions
in its three modes, MATH's and MATH-500's through the maths grader (misses listed), HumanEval's
canonical solutions pass in the sandbox and its bare prompts fail, MBPP's code against test_list.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from tepo_cli.benchmarks import load_problems
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.data.prepare import prepare
from tepo_cli.rewards.code import CodeProblem, grade_many
from tepo_cli.rewards.gsm8k_grader import MODES, grade_gsm8k
from tepo_cli.rewards.math_grader import clear_cache, extract_answer, grade_math, is_symbolic


def _report(label: str, passed: int, total: int, seconds: float) -> None:
    share = 100.0 * passed / total if total else 0.0
    print(f"{label:<46} {passed:>5}/{total:<5} ({share:6.2f} %)  {seconds:7.1f} s")


def _grade_texts(
    problems: list[Problem],
    text: Callable[[Problem], str],
    grade: Callable[[str, Problem], RewardResult],
) -> tuple[int, list[tuple[Problem, RewardResult]], float]:
    start = time.perf_counter()
    misses = []
    for problem in problems:
        result = grade(text(problem), problem)
        if not result.correct:
            misses.append((problem, result))
    return len(problems) - len(misses), misses, time.perf_counter() - start


def _list_misses(misses: list[tuple[Problem, RewardResult]], limit: int = 30) -> None:
    for problem, result in misses[:limit]:
        print(
            f"    miss {problem.id}: reference {problem.answer!r}, extracted {result.extracted!r}"
        )
    if len(misses) > limit:
        print(f"    ... and {len(misses) - limit} more")


def check_gsm8k(limit: int | None) -> bool:
    problems = load_problems("gsm8k", limit=limit)
    ok = True
    for mode in MODES:
        passed, misses, seconds = _grade_texts(
            problems,
            lambda p: p.extra["solution"],
            lambda c, p, mode=mode: grade_gsm8k(c, p.answer, mode=mode),
        )
        _report(f"gsm8k reference solutions ({mode})", passed, len(problems), seconds)
        _list_misses(misses)
        ok = ok and not misses
    return ok


def check_math(name: str, limit: int | None) -> bool:
    problems = load_problems(name, limit=limit)
    clear_cache()  # MATH-500 is a subset of MATH: time it without MATH's cached parses
    passed, misses, seconds = _grade_texts(
        problems, lambda p: p.extra["solution"], lambda c, p: grade_math(c, p.answer)
    )
    _report(f"{name} reference solutions (math-verify)", passed, len(problems), seconds)
    _list_misses(misses)
    # A reference answer math-verify reads only as a string is compared by exact string match.
    strings = [p for p in problems if not is_symbolic(extract_answer(p.extra["solution"])[1])]
    _report(
        f"{name} answers parsed as maths (not strings)",
        len(problems) - len(strings),
        len(problems),
        0.0,
    )
    for problem in strings:
        print(f"    string-only {problem.id}: {problem.answer!r}")
    return passed >= 0.995 * len(problems)


def check_code(name: str, limit: int | None, workers: int) -> bool:
    problems = load_problems(name, limit=limit)
    items = [(p.answer, CodeProblem.from_record(p.extra)) for p in problems]
    start = time.perf_counter()
    grades = grade_many(items, extract=False, max_workers=workers)
    passed = sum(g.correct for g in grades)
    _report(
        f"{name} canonical solutions (sandbox)", passed, len(problems), time.perf_counter() - start
    )
    for problem, grade in zip(problems, grades, strict=True):
        if not grade.correct:
            print(f"    fail {problem.id}: {grade.reason}")
    ok = passed == len(problems)
    if name == "humaneval":
        start = time.perf_counter()
        bare = grade_many([("", cp) for _, cp in items], extract=False, max_workers=workers)
        leaked = sum(g.correct for g in bare)
        _report(
            f"{name} bare prompts (must be 0)", leaked, len(problems), time.perf_counter() - start
        )
        ok = ok and leaked == 0
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each")
    parser.add_argument("--skip-code", action="store_true", help="skip HumanEval and MBPP")
    parser.add_argument("--workers", type=int, default=None, help="sandbox workers")
    parser.add_argument("--smoke", action="store_true", help="CI: --limit 5 (every benchmark)")
    args = parser.parse_args()
    if args.smoke:
        args.limit = 5
    names = ["gsm8k", "math", "math500"] + ([] if args.skip_code else ["humaneval", "mbpp"])
    start = time.perf_counter()
    for result in prepare(names):
        print(f"data {result.name:<10} {result.rows:>5} rows  {result.status:<12} {result.path}")
    print()
    results = {
        "gsm8k": check_gsm8k(args.limit),
        "math": check_math("math", args.limit),
        "math500": check_math("math500", args.limit),
    }
    if not args.skip_code:
        results["humaneval"] = check_code("humaneval", args.limit, args.workers)
        results["mbpp"] = check_code("mbpp", args.limit, args.workers)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")
    failed = [name for name, ok in results.items() if not ok]
    print("acceptance:", "PASS" if not failed else f"FAIL ({', '.join(failed)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
