"""Benchmark scripts check their prepared data up front (tepo_cli/data/required.py): one
paragraph naming the missing file and the `tepo data prepare` command, exit 2, nothing run."""

from __future__ import annotations

import json

import pytest

from tepo_cli.cli import main
from tepo_cli.data import sources
from tepo_cli.data.prepare import FORMAT, MANIFEST, sha256_file
from tepo_cli.data.required import missing_data, require_prepared


def _fake_prepared(cache, name: str) -> None:
    """A prepared directory that passes problem_with's checks: the pinned wheel's hash, each
    split's row count, each file's size and hash."""
    source = sources.SOURCES[name]
    folder = cache / "data" / name
    folder.mkdir(parents=True)
    files = {}
    for split, rows in source.rows.items():
        path = folder / f"{split}.jsonl"
        path.write_text("{}\n" * rows)
        files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path), "rows": rows}
    manifest = {"format": FORMAT, "source": {"sha256": source.wheel.sha256}, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_the_paragraph_names_each_missing_file_and_one_command(tmp_path, monkeypatch):
    monkeypatch.setenv("TEPO_CACHE", str(tmp_path))
    needed = [("math500", "train"), ("mbpp", "test")]
    message = missing_data(needed, "bench.py") or ""
    assert message.startswith("bench.py: the prepared data it needs is not on this machine: ")
    assert f"{tmp_path}/data/math500/train.jsonl (math500's train split: not prepared)" in message
    assert f"{tmp_path}/data/mbpp/test.jsonl (mbpp's test split: not prepared)" in message
    assert "`tepo data prepare benchmark=math500,mbpp`" in message and "\n" not in message
    _fake_prepared(tmp_path, "math500")
    message = missing_data(needed, "bench.py") or ""
    assert "math500" not in message and "`tepo data prepare benchmark=mbpp`" in message
    _fake_prepared(tmp_path, "mbpp")
    assert missing_data(needed, "bench.py") is None
    require_prepared(needed, "bench.py")  # all there: returns
    (tmp_path / "data" / "mbpp" / "test.jsonl").write_text("{}\n")  # torn after preparing
    with pytest.raises(SystemExit) as stop:
        require_prepared(needed, "bench.py")
    assert stop.value.code == 2


def test_tepo_data_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TEPO_CACHE", str(tmp_path))
    with pytest.raises(SystemExit) as stop:
        main(["data", "check", "mbpp", "math500:train", "--for", "multi_turn_bench.sh"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("multi_turn_bench.sh: the prepared data it needs is not on this machine")
    assert "`tepo data prepare benchmark=mbpp,math500`" in err
    _fake_prepared(tmp_path, "mbpp")
    with pytest.raises(SystemExit) as stop:
        main(["data", "check", "mbpp"])
    assert stop.value.code == 0
    with pytest.raises(SystemExit) as stop:
        main(["data", "check", "arith"])
    assert stop.value.code == 2 and "arith is not a benchmark" in capsys.readouterr().err
