"""The documentation site (mkdocs.yml, docs/): the configuration reference is generated from the
code and current, every key has its comment, `--help` points into it, and the site builds with
`mkdocs build --strict` (no broken link, anchor or page)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tepo_cli import reference_page as reference

ROOT = Path(__file__).resolve().parents[1]


def test_every_key_of_every_group_has_a_comment():
    """docs/design.md: each group's YAML documents its knobs, a comment per key. A key added to the
    schema without one fails here, naming it."""
    assert reference.uncommented() == []


def test_the_committed_reference_page_is_what_the_code_renders():
    """docs/reference/configuration.md is generated (`make docs` rewrites it): it must not go
    stale when a key, default or comment changes."""
    assert reference.PAGE.read_text() == reference.render(), (
        "docs/reference/configuration.md is stale: run `make docs` (or "
        '`python -c "from tepo_cli import reference_page; reference_page.write()"`) and commit it'
    )


def test_the_reference_holds_each_keys_schema_facts_and_yaml_comment():
    page = reference.render()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines() if "| `" in line}
    assert rows["trainer.micro_batch_tokens"].startswith(
        "| `trainer.micro_batch_tokens` | int or null | `1024` | ≥ 1 | real tokens per"
    )
    assert (
        "| choice | `seq-mean-token-mean` | token-mean, seq-mean-token-mean,"
        in rows["algo.loss_agg"]
    )  # the composed default (conf/algo/_base.yaml), not the schema's
    assert "| `auto` | auto, true, false |" in rows["rollout.engine.sleep"]
    assert "the next sync, which rebuilds the weights" in rows["rollout.engine.sleep"]  # wrapped
    assert "| `[1, 5, 10]` |" in rows["eval.pass_k"]
    keys = [name for group in reference.GROUPS for name, _ in reference.group_schema_keys(group)]
    assert len(keys) == len(set(keys)) and all(key in rows for key in keys)


def test_yaml_comments_follow_nesting_wrapping_and_quotes(tmp_path):
    path = tmp_path / "group.yaml"
    path.write_text(
        "# the file's own header\n"
        "defaults:\n"
        "  - _base\n"
        "outer:                # a mapping\n"
        "  inner: 3            # first line\n"
        "                      # and its continuation\n"
        '  prompt: "a # b"     # the # in quotes is data\n'
        "plain: 1\n"
        "# a top-level comment that belongs to no key\n"
        "last: x  # end\n"
    )
    assert reference.yaml_comments(path, "g") == {
        "g.defaults": "",
        "g.outer": "a mapping",
        "g.outer.inner": "first line and its continuation",
        "g.outer.prompt": "the # in quotes is data",
        "g.plain": "",
        "g.last": "end",
    }


@pytest.mark.parametrize("command", ["train", "eval"])
def test_help_points_to_the_reference_section_of_each_group(command):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    anchors = re.findall(r"docs/reference/configuration\.md#([\w-]+)", result.stdout)
    headings = re.findall(r"^## (.+)$", reference.render(), re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
    groups = {"train": 10, "eval": 7}[command]
    assert len(anchors) == groups and set(anchors) <= slugs


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    """`mkdocs build --strict`, as `make docs` runs it: any broken link or anchor, or a page
    missing from the nav, fails the build."""
    if os.environ.get("TEPO_REQUIRE_DOCS") != "1":
        pytest.importorskip("mkdocs", reason="the site needs `make install-docs`")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "reference" / "configuration" / "index.html").exists()
    assert (tmp_path / "guides" / "extending" / "index.html").exists()


def test_every_relative_link_of_the_readme_resolves():
    """The README is not part of the site's strict build: its links into docs/ are checked here
    (a page, or a heading of it)."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    relative = [link for link in links if not link.startswith("http")]
    assert len(relative) >= 20
    assert [link for link in relative if not (ROOT / link).exists()] == []
