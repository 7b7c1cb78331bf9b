"""`tepo --help` names each command's flags: every one it names is a flag that command takes."""

from __future__ import annotations

import argparse
import re

import pytest

from tepo_cli.cli import USAGE
from tepo_cli.eval.report.command import parser as report_parser
from tepo_cli.protocol.arguments import parser as protocol_parser


def _usage_block(command: str) -> str:
    """The lines of USAGE that describe `command` (its line and the indented ones after it)."""
    match = re.search(rf"^  {command} .*\n(?:^ {{6,}}.*\n)*", USAGE, re.MULTILINE)
    assert match, command
    return match.group(0)


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


@pytest.mark.parametrize(
    ("command", "options", "must_name"),
    [
        ("report", lambda: [report_parser()], {"--protocol"}),  # a protocol's verdicts
        (
            "protocol",
            lambda: [_subcommand(protocol_parser(), name) for name in ("run", "power", "stop")],
            {"--status", "--from", "--seeds"},
        ),
    ],
)
def test_every_flag_the_top_help_names_is_one_the_command_takes(
    command, options, must_name
) -> None:
    named = set(re.findall(r"--[a-z][a-z-]*", _usage_block(command)))
    taken = {flag for parser in options() for flag in parser._option_string_actions}
    assert named <= taken, named - taken
    assert must_name <= named
