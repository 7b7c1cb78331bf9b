"""The commands the documentation shows with their output (a code block after `<!-- output -->`:
`$ tepo ...` lines, each followed by what it prints) run as written, and print what the page says.
Line breaks and runs of spaces are not compared (the pages wrap long lines); `...` and `…` in the
page stand for any text."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"<!-- output -->\n```[a-z]*\n(?P<body>.*?)```", re.S)


def examples() -> list[tuple[str, str, str]]:
    """(page, command line, expected output) of every output block under docs/."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for block in BLOCK.finditer(page.read_text()):
            for chunk in re.split(r"^\$ ", block["body"], flags=re.M)[1:]:
                command, _, output = chunk.partition("\n")
                found.append((str(page.relative_to(DOCS)), command, output))
    return found


def _pattern(expected: str) -> re.Pattern[str]:
    words = expected.split()
    parts = [".*?" if word in ("...", "…") else re.escape(word) for word in words]
    return re.compile(r"\s+".join(parts).replace(r"\s+.*?\s+", r".*?"), re.S)


def test_the_docs_show_commands_with_their_output():
    pages = {page for page, _, _ in examples()}
    assert "concepts.md" in pages and len(examples()) >= 2


@pytest.mark.parametrize(("page", "command", "expected"), examples(), ids=lambda v: str(v)[:40])
def test_a_documented_command_prints_what_the_page_says(tmp_path, page, command, expected):
    args = shlex.split(command)
    assert args[0] == "tepo", f"{page}: only tepo commands are run: {command}"
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    printed = " ".join((result.stdout + result.stderr).split())
    assert _pattern(expected).search(printed), f"{page}: `{command}` printed:\n{printed[-2000:]}"
    assert result.returncode != 0 or "Nothing was run" not in expected
    assert not list(tmp_path.iterdir()), "a refused command leaves no output behind"
