"""`env=code_feedback`: code with execution feedback, on HumanEval and MBPP.

After each turn the program the code grader would run (`tepo_cli/rewards/code.py`'s
`extract_code`, the prompt kept in front) runs in the sandbox against the *visible* tests only —
MBPP's first test (the one its prompt shows), HumanEval's docstring examples — and the failures
(which check, what it got, or the traceback, a timeout) come back as the next message. When the
visible tests pass, or at the turn limit, the episode is over, and the reward is the task's
grader on the last turn: the hidden tests (every MBPP test, HumanEval's `check`), which the
model never sees.
"""

from __future__ import annotations

import doctest
import secrets

from tepo_cli.core.records import Problem
from tepo_cli.envs.environment_contract import Environment
from tepo_cli.rewards.code import extract_code
from tepo_cli.rewards.sandbox import SandboxConfig, SandboxLimits, run_program

_RUNNER = """

__TEPO_FAILED = 0
for __tepo_statement, __tepo_shown in {checks!r}:
    try:
        exec(__tepo_statement, globals())
    except AssertionError as __tepo_error:
        __TEPO_FAILED += 1
        print("failed: " + __tepo_shown + (" (" + str(__tepo_error) + ")" if str(__tepo_error) else ""))
    except Exception as __tepo_error:
        __TEPO_FAILED += 1
        print("error: " + __tepo_shown + ": " + type(__tepo_error).__name__ + ": " + str(__tepo_error))
if __TEPO_FAILED == 0:
    print({marker!r})
"""


def visible_checks(problem: Problem) -> list[tuple[str, str]]:
    """(statement, what the model is shown) for each visible test of a code problem."""
    extra = problem.extra
    if extra.get("test_list"):  # MBPP: the test in its prompt
        first = str(extra["test_list"][0]).strip()
        return [(first, first)]
    checks = []
    for example in doctest.DocTestParser().get_examples(str(extra.get("prompt", ""))):
        # The example's expected output runs to a blank line: the docstring's closing quotes
        # may be part of it.
        want = example.want.split('"""')[0].split("'''")[0].strip()
        source = example.source.strip()
        if not want:
            continue
        statement = (
            f"__tepo_got = {source}\nassert repr(__tepo_got) == {want!r}, 'got ' + repr(__tepo_got)"
        )
        checks.append((statement, f"{source} == {want}"))
    return checks


class CodeFeedback(Environment):
    """Runs the turn's program against the visible tests; the failures are the observation."""

    name = "code_feedback"
    instructions = (
        "Your function will be run against the test shown; if it fails you will see the failure "
        "and can send a corrected version."
    )

    def respond(self, turn: str) -> str | None:
        extra = self.problem.extra
        checks = visible_checks(self.problem)
        if not checks:
            return None  # nothing visible to run: the answer stands
        entry_point = str(extra.get("entry_point", "")) or None
        marker = f"TEPO-VISIBLE-PASSED-{secrets.token_hex(8)}"
        setup = str(extra.get("test_setup_code", "") or "")
        program = (
            setup
            + "\n"
            + str(extra.get("prompt", ""))
            + extract_code(turn, entry_point)
            + _RUNNER.format(checks=checks, marker=marker)
        )
        limits = SandboxLimits(wall_time_s=self.settings.timeout_s)
        result = run_program(program, config=SandboxConfig(limits=limits), success_marker=marker)
        # The program ran to its end but a check failed: the tests', not the sandbox's, verdict.
        reason = "tests-failed" if result.reason == "marker-missing" else result.reason
        self.count_call(None if result.passed else reason)
        if result.passed:
            return None
        if result.reason == "timeout":
            return f"The visible tests timed out after {self.settings.timeout_s:g} s."
        feedback = "\n".join(
            part for part in (result.stdout.strip(), _traceback_tail(result.stderr)) if part
        )
        return f"The visible tests failed:\n{feedback or result.reason}"


def _traceback_tail(stderr: str, lines: int = 6) -> str:
    """The last lines of a traceback: where it failed and why."""
    return "\n".join(stderr.strip().splitlines()[-lines:])


ENVIRONMENT = CodeFeedback
