"""`benchmark=custom`: your own problems from a file, no code. Each record's question and answer
are read from the fields `benchmark.question_key` and `benchmark.answer_key` name (dotted for a
nested field, e.g. verl's `reward_model.ground_truth`), from a local .jsonl/.json/.parquet file or
directory (`benchmark.path`) or a hub dataset (`benchmark.hub_id`); math-verify grades it
(`reward=auto`), or any other grader (`reward=gsm8k`, `reward=custom`, ...).

A problem's id is its `id_key` field or, without one, a digest of its question: a training
problem that also appears in the held-out split is then left out of the held-out evaluation (as
for every dataset benchmark), whatever its position in either file.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any, Literal

from pydantic import Field

from tepo_cli.benchmarks import Benchmark
from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.config.strict import Strict
from tepo_cli.core.records import Problem
from tepo_cli.data.benchmark_records import DataError, Record, load_records
from tepo_cli.data.tasks import DatasetTask
from tepo_cli.rewards.gsm8k_grader import reference_answer
from tepo_cli.rewards.math_grader import last_boxed

NAME = "custom"


class CustomOptions(Strict):
    """benchmark=custom's own knobs (conf/benchmark/custom.yaml says what each does)."""

    question_key: str = Field(default="question", min_length=1)
    answer_key: str = Field(default="answer", min_length=1)
    answer_in: Literal["value", "last_boxed", "after_hashes"] = "value"
    id_key: str | None = Field(default=None, min_length=1)


def to_problem(options: CustomOptions, record: Record, index: int) -> Problem:
    """One record as a Problem (its id filled in by `problems`). extra["fields"]: the record's
    fields (a reward function reads any of them); extra["solution"]: the answer field whole,
    where the answer is cut from it (the reference completion of `model=reference`)."""
    question = _question(_field(record, index, options.question_key), index, options)
    value = _field(record, index, options.answer_key)
    extra: dict[str, Any] = {"fields": dict(record)}  # every column, for a reward function
    if options.answer_in == "value":
        answer = _plain(value)
    else:
        solution = str(value)
        answer = _cut(solution, options.answer_in, index)
        extra["solution"] = solution
    problem_id = "" if options.id_key is None else str(_field(record, index, options.id_key))
    return Problem(problem_id, question, answer, extra)


def problems(options: CustomOptions, records: list[Record], split: str) -> list[Problem]:
    """The split's problems with unique ids: `id_key`'s (a repeated one is refused: per-problem
    results are keyed by id) or `custom/<digest of the question>`, a repeated question numbered."""
    made = [to_problem(options, record, i) for i, record in enumerate(records)]
    if options.id_key is not None:
        repeated = [key for key, n in Counter(p.id for p in made).items() if n > 1]
        if repeated:
            raise DataError(
                f"benchmark.id_key={options.id_key}: the {split} split repeats the id(s) "
                f"{', '.join(repeated[:5])}; each problem needs its own (per-problem results "
                "are kept by id). Fix the file, or drop benchmark.id_key to number problems by "
                "their question."
            )
        return made
    seen: Counter[str] = Counter()
    unique = []
    for problem in made:
        digest = hashlib.sha256(problem.question.encode()).hexdigest()[:16]
        seen[digest] += 1
        suffix = "" if seen[digest] == 1 else f"#{seen[digest]}"
        unique.append(replace(problem, id=f"{NAME}/{digest}{suffix}"))
    return unique


def _field(record: Record, index: int, key: str) -> Any:
    """`record`'s value at the dotted `key`; a paragraph naming what the record has if absent."""
    value: Any = record
    for depth, part in enumerate(key.split(".")):
        if not isinstance(value, Mapping) or value.get(part) is None:
            where = ".".join(key.split(".")[:depth]) or "the record"
            present = sorted(value) if isinstance(value, Mapping) else []
            raise DataError(
                f"benchmark=custom record {index} has no '{key}' value (missing or null); "
                f"the fields of {where} are {', '.join(map(str, present)) or 'none'}. Name the "
                "fields with benchmark.question_key / benchmark.answer_key (dotted for a nested "
                "one, e.g. reward_model.ground_truth), or fix or remove that record: a benchmark "
                "is scored whole, so tepo does not skip records silently."
            )
        value = value[part]
    return value


def _question(value: Any, index: int, options: CustomOptions) -> str:
    """The question text; a chat-message list (verl's `prompt` field) gives its one user message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, Mapping) for m in value):
        roles = [m.get("role") for m in value]
        if roles == ["user"]:
            return str(value[0].get("content", ""))
        raise DataError(
            f"benchmark.question_key={options.question_key}: record {index} holds chat messages "
            f"with roles {roles}; benchmark=custom takes one user message (the question). Put a "
            "system message in benchmark.system_prompt and the instructions around the question "
            "in benchmark.prompt ('{question}' marks where it goes)."
        )
    raise DataError(
        f"benchmark.question_key={options.question_key}: record {index} holds "
        f"{type(value).__name__} {str(value)[:80]!r}, not the question's text."
    )


def _plain(value: Any) -> str:
    """An answer field as the reference text: a whole float without its '.0' (13.0 -> '13')."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cut(solution: str, answer_in: str, index: int) -> str:
    """The answer inside a worked solution: its last \\boxed{} or the text after '####'."""
    if answer_in == "last_boxed":
        answer = last_boxed(solution)
        if answer:
            return answer
        raise DataError(
            f"benchmark.answer_in=last_boxed: record {index}'s answer field has no \\boxed{{}} "
            "answer. Use answer_in=value for a bare answer or after_hashes for '#### <answer>'."
        )
    try:
        return reference_answer(solution)
    except ValueError:
        raise DataError(
            f"benchmark.answer_in=after_hashes: record {index}'s answer field has no "
            "'#### <answer>' line. Use answer_in=value for a bare answer or last_boxed."
        ) from None


def _load(
    cfg: BenchmarkConfig, options: CustomOptions, split: str, limit: int | None
) -> list[Problem]:
    records = load_records(NAME, split, cfg.path, cfg.hub_id, None, (), limit)
    return problems(options, records, split)


def custom_task(cfg: BenchmarkConfig) -> DatasetTask:
    """Its knobs validated once, before any record is read (a wrong one is refused here)."""
    return DatasetTask(cfg, partial(_load, cfg, cfg.own(CustomOptions)))


def reference_completion(problem: Problem) -> str:
    """The worked solution the answer was cut from, else the bare answer."""
    return str(problem.extra.get("solution", problem.answer))


BENCHMARK = Benchmark(
    NAME,
    grader="math",
    reference=reference_completion,
    task=custom_task,
    options=CustomOptions,
)
