"""The protocol report's registration sentence: the protocol file's first commit against the first
start in its own journal, and the commits that changed the file after that (tepo_cli/eval/report/
registration.py), in a git repository built here with fixed commit dates."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tepo_cli.eval.report.registration import registration


def git(repo: Path, *args: str, when: str = "2026-11-28T03:00:00+00:00") -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit(repo: Path, path: Path, text: str, when: str) -> str:
    path.write_text(text)
    git(repo, "add", path.name)
    git(repo, "commit", "-q", "-m", "protocol", when=when)
    return git(repo, "rev-parse", "--short=7", "HEAD")


def start(time: str, text: str, run: str = "grpo_seed10", event: str = "start") -> dict:
    sha = hashlib.sha256(text.encode()).hexdigest()
    return {"time": f"2026-11-28T{time}+00:00", "run": run, "event": event, "protocol_sha256": sha}


def test_a_file_outside_git_or_never_committed_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # wherever /tmp lies
    path = tmp_path / "protocol.yaml"
    path.write_text("name: p\n")
    assert registration(path, []) == (
        f"Registration unknown: {path} is not in a git repository's history."
    )
    git(tmp_path, "init", "-q")
    assert registration(path, []) == f"Not registered: {path} has never been committed."


def test_committed_before_its_first_run_and_what_changed_after(tmp_path):
    git(tmp_path, "init", "-q")
    path = tmp_path / "protocol.yaml"
    first = commit(tmp_path, path, "name: p\n", "2026-11-28T03:00:00+00:00")
    edit = commit(tmp_path, path, "name: p  # seeds fixed\n", "2026-11-28T03:30:00+00:00")
    text = path.read_text()
    reused = [start("01:00:00", "another protocol")]  # a reused arm's journal: not this one's
    own = [start("04:00:00", text), start("05:00:00", text, event="resume")]
    assert edit != first
    assert registration(path, [reused, own]) == (
        f"Registered by commit {first} (2026-11-28 03:00 UTC), before its first run started "
        "(2026-11-28 04:00 UTC); unchanged since."
    )
    after = commit(tmp_path, path, "name: p  # metric changed\n", "2026-11-28T06:00:00+00:00")
    own.append({**start("06:01:00", path.read_text(), run="*"), "event": "protocol_changed"})
    assert registration(path, [reused, own]) == (
        f"Registered by commit {first} (2026-11-28 03:00 UTC), before its first run started "
        f"(2026-11-28 04:00 UTC); changed after that by commit {after} (each a deviation)."
    )


def test_a_run_before_the_first_commit_is_no_pre_registration(tmp_path):
    git(tmp_path, "init", "-q")
    path = tmp_path / "protocol.yaml"
    first = commit(tmp_path, path, "name: p\n", "2026-11-28T03:00:00+00:00")
    assert registration(path, [[start("02:59:00", path.read_text())]]) == (
        "NOT A PRE-REGISTRATION: the first run started 2026-11-28 02:59 UTC, before the "
        f"protocol's first commit {first} (2026-11-28 03:00 UTC)."
    )


def test_no_run_yet_an_uncommitted_edit_and_a_journal_of_another_text(tmp_path):
    git(tmp_path, "init", "-q")
    path = tmp_path / "protocol.yaml"
    first = commit(tmp_path, path, "name: p\n", "2026-11-28T03:00:00+00:00")
    said = f"Registered by commit {first} (2026-11-28 03:00 UTC)"
    assert registration(path, []) == said + "; no run has started (the journal has no start)."
    path.write_text("name: q\n")
    edited = [start("04:00:00", "name: q\n")]
    assert registration(path, [edited]) == (
        f"{said}, before its first run started (2026-11-28 04:00 UTC); its file now differs from "
        "its last commit."
    )
    assert registration(path, [[start("04:00:00", "name: p\n")]]) == (
        f"{said}; no journal beside its runs carries this text of the file (changed since?)."
    )
