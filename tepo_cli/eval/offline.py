"""Completions that need no model: the dataset's own references, or completions made elsewhere.

`model=reference` answers each problem with the dataset's reference solution, so the graders are
checked end to end on real data (every reference should pass). `model=replay
model.path=<file.jsonl>` grades completions produced by another system (e.g. a vLLM server):
one JSON object per line, `{"id": <problem id>, "completion": <text>}`, optionally with
`"sample": <0-based index>`; HumanEval completions are the function body that follows the
prompt, as in OpenAI's format (a fenced ```python block with the whole function works too).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from tepo_cli.benchmarks import get_benchmark
from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem


def reference_completion(benchmark: BenchmarkConfig, problem: Problem) -> str:
    """The benchmark's reference answer to `problem` as a completion (tepo_cli/benchmarks/)."""
    return get_benchmark(benchmark.name).reference(problem)


def replay_completions(path: str, problems: list[Problem], n: int) -> dict[str, list[str]]:
    """The first `n` completions of every problem, from a JSONL file; clear errors otherwise."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"model.path='{path}' is not a file; model=replay reads a JSONL file.")
    found: dict[str, list[tuple[int, str]]] = defaultdict(list)
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                key, text = str(row["id"]), str(row["completion"])
            except (ValueError, KeyError, TypeError):
                raise ConfigError(
                    f"{path}, line {number}: each line must be a JSON object with 'id' and "
                    f"'completion' (and optionally 'sample')."
                ) from None
            found[key].append((int(row.get("sample", len(found[key]))), text))
    missing = [p.id for p in problems if len(found.get(p.id, [])) < n]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ConfigError(
            f"{path} has fewer than eval.n={n} completions for {len(missing)} of the "
            f"{len(problems)} problems (e.g. {shown}); problem ids look like '{problems[0].id}'."
        )
    return {key: [text for _, text in sorted(rows)[:n]] for key, rows in found.items()}
