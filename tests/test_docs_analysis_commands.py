"""Every `tepo report` and `tepo protocol` command the README and the documentation site show
parses as written with the commands' own argument parsers, and the protocol file it names
exists: a flag renamed, or a required argument the page leaves out, fails here before a reader
copies it. A command with a `<placeholder>` for the reader to fill in is not checked.
(`tepo train` and `tepo eval` commands: tests/test_docs_commands.py.)"""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest
from test_docs_commands import CODE_BLOCK, PAGES, ROOT

from tepo_cli.eval.report import command as report_command
from tepo_cli.protocol import arguments as protocol_arguments

COMMAND = re.compile(r"^(?:\$ )?tepo (?P<tool>report|protocol)(?P<args>(?: .*)?)$")
PARSERS = {"report": report_command.parser, "protocol": protocol_arguments.parser}


def documented() -> list[tuple[str, str, list[str]]]:
    """(page, tool, its arguments) for each such command in a code block, comments dropped."""
    found = []
    for page in PAGES:
        for block in CODE_BLOCK.finditer(page.read_text()):
            body = re.sub(r"\\\n\s*", " ", block["body"])
            for line in body.splitlines():
                match = COMMAND.match(line.strip())
                if match and "<" not in match["args"].split("#")[0]:
                    args = shlex.split(match["args"], comments=True)
                    found.append((str(page.relative_to(ROOT)), match["tool"], args))
    return found


COMMANDS = documented()


def test_the_pages_show_such_commands():
    assert {tool for _, tool, _ in COMMANDS} == {"report", "protocol"}


@pytest.mark.parametrize(("page", "tool", "args"), COMMANDS, ids=lambda v: str(v)[:60])
def test_a_documented_analysis_command_parses(page: str, tool: str, args: list[str]) -> None:
    refused = io.StringIO()
    with contextlib.redirect_stderr(refused), contextlib.suppress(SystemExit):
        parsed = PARSERS[tool]().parse_args(args)
    assert not refused.getvalue(), f"{page}: tepo {tool} {shlex.join(args)}: {refused.getvalue()}"
    protocol = parsed.protocol  # both tools read one (a report without it: None)
    assert protocol is None or (ROOT / protocol).is_file(), f"{page}: no {protocol}"
