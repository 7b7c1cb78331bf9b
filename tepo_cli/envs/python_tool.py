"""`env=python_tool`: tool-integrated reasoning on a maths task.

A turn stops at its first closed fenced Python block (`turn_end`), which runs in tepo's sandbox
(the code grader's isolation and limits, with `env.timeout_s`); what it printed — stdout, then
its own traceback, cut to `env.max_observation_tokens` by the rollout — comes back as the next
message, in an ```output fence. A turn without a block is the answer: the episode is over, and
the task's own grader reads that last turn. Each run is a fresh program: nothing carries over
from one block to the next (the model re-states what it needs, as in ToRA-style prompts).
"""

from __future__ import annotations

import re

from tepo_cli.envs.environment_contract import Environment
from tepo_cli.rewards.sandbox import SandboxConfig, SandboxLimits, run_program

_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.S | re.I)


def last_code_block(text: str) -> str | None:
    """The last closed fenced block of `text` tagged python (or untagged), else None."""
    blocks = _BLOCK.findall(text)
    return blocks[-1] if blocks else None


def first_block_end(text: str) -> int | None:
    """The offset just after the first closed Python (or untagged) fenced block, else None."""
    match = _BLOCK.search(text)
    return None if match is None else match.end()


def program_traceback(stderr: str) -> str:
    """`stderr` with a traceback cut to the program's own frames: the sandbox's launcher frames
    before the first frame of `main.py` (the program) say nothing to the model."""
    lines = stderr.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if 'main.py", line' in line), None)
    if first is None or not any(line.startswith("Traceback") for line in lines[:first]):
        return stderr
    start = max(i for i, line in enumerate(lines[:first]) if line.startswith("Traceback"))
    return "".join(lines[: start + 1] + lines[first:])


class PythonTool(Environment):
    """Runs the turn's last code block; the answer is the first turn without one."""

    name = "python_tool"
    instructions = (
        "You can run Python: end your message with a ```python code block and you will see what "
        "it prints. When you know the answer, reply without a code block."
    )

    def turn_end(self, text: str) -> int | None:
        return first_block_end(text)

    def respond(self, turn: str) -> str | None:
        code = last_code_block(turn)
        if code is None:
            return None
        limits = SandboxLimits(wall_time_s=self.settings.timeout_s)
        result = run_program(code, config=SandboxConfig(limits=limits))
        self.count_call(None if result.passed else result.reason)
        output = (result.stdout + program_traceback(result.stderr)).strip()
        if result.reason == "timeout":
            output += f"\n(timed out after {self.settings.timeout_s:g} s)"
        return f"```output\n{output}\n```"


ENVIRONMENT = PythonTool
