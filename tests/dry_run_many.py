"""Run `tepo` command lines in one process, each with `--dry-run`; one JSON line per command.

tests/test_docs_commands.py keeps one of these per test worker and feeds it the commands of each
documentation page as it reaches them, on stdin: a JSON object a line, `{"cwd": directory,
"args": [arguments]}`. One interpreter for every page's commands, where one process per command
(or per page) would spend most of its time importing torch and transformers. Each command's exit
code and output come back, one line each, in order."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

os.environ["TEPO_DRY_RUN"] = "1"  # as `--dry-run` sets it; kept for every command

from tepo_cli.cli import main  # after TEPO_DRY_RUN


def run(args: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([*args, "--dry-run"])
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except Exception as error:  # a traceback: reported as the command's failure
            code = 99
            err.write(f"{type(error).__name__}: {error}")
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    for line in sys.stdin:
        request = json.loads(line)
        os.chdir(request["cwd"])
        print(json.dumps(run(request["args"])), flush=True)
