"""Write a directory whole or not at all: into `<target>.tmp`, then renamed into place."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tepo_cli.core.errors import RunError


def write_directory(target: Path, write: Callable[[Path], None], failure: str) -> None:
    """Call `write(staging)`, then replace `target` with it; on an OSError nothing partial is left
    and RunError says `could not save {failure} to {target}: {error}` plus what still holds it."""
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise RunError(
            f"could not save {failure} to {target}: {error}. Nothing partial was left behind; "
            f"the checkpoints under {target.parent / 'checkpoints'} still hold the run (free some "
            f"disk space and continue with resume=true)."
        ) from None
