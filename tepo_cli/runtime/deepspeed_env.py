"""`tepo deepspeed-env`: write the variables tepo's ranks need into DeepSpeed's `.deepspeed_env`.

A `deepspeed --hostfile H ...` launch over ssh (pdsh) starts the other nodes' ranks with an
environment of its own: it forwards only variables named NCCL*, PYTHON*, MLFLOW*, UCX*, MV2*
and the lines of `.deepspeed_env` (read from the home directory and the working directory,
one `KEY=VALUE` a line). tepo cannot add to that from inside `tepo train`: by then every node's
rank has started. So this command, run once on the launching node before `deepspeed`, merges
the variables that change what a rank reads or where (TEPO_*, HF_*, TRANSFORMERS_*) into the
file; lines for other variables are kept. (With `--no_ssh` each node's launcher is started in
that node's own shell and passes its environment through: the file is not read, nor needed.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from tepo_cli.core.errors import ConfigError

FORWARDED_PREFIXES = ("TEPO_", "HF_", "TRANSFORMERS_")
USAGE = "usage: tepo deepspeed-env [--file PATH]   (default: ./.deepspeed_env)"


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` the other nodes' ranks need, sorted by name."""
    chosen = {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES)}
    for key, value in chosen.items():
        if "\n" in value or "\r" in value:
            raise ConfigError(
                f"{key} holds a line break, which a .deepspeed_env line cannot carry (DeepSpeed "
                f"reads one KEY=VALUE a line); set it without one."
            )
    return dict(sorted(chosen.items()))


def merge_env_file(path: Path, variables: Mapping[str, str]) -> list[str]:
    """Write `variables` into the `.deepspeed_env` at `path`, keeping its lines for other keys;
    return the keys written. The file is private (0600): HF_TOKEN may be among them."""
    kept: list[str] = []
    if path.is_file():
        for line in path.read_text().splitlines():
            key = line.split("=", 1)[0].strip()
            # DeepSpeed's reader splits every line at '=': a blank or comment line breaks it
            if "=" in line and key not in variables:
                kept.append(line)
    lines = [*kept, *(f"{key}={value}" for key, value in variables.items())]
    path.write_text("".join(f"{line}\n" for line in lines))
    path.chmod(0o600)
    return list(variables)


def deepspeed_env_command(arguments: list[str], environ: Mapping[str, str] = os.environ) -> int:
    if arguments and not (len(arguments) == 2 and arguments[0] == "--file"):
        print(USAGE, file=sys.stderr)
        return 2
    path = Path(arguments[1] if arguments else ".deepspeed_env")
    try:
        written = merge_env_file(path, forwarded(environ))
    except ConfigError as error:
        print(f"tepo deepspeed-env: {error}", file=sys.stderr)
        return 2
    names = ", ".join(written) if written else "none (no TEPO_*, HF_* or TRANSFORMERS_* is set)"
    print(
        f"tepo deepspeed-env: {path}: {names}. DeepSpeed's ssh (pdsh) launch reads it from this "
        f"directory or your home directory and exports these variables on every node."
    )
    return 0
