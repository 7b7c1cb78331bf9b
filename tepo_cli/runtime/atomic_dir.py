"""Write a directory whole or not at all (core/atomic_write.py), with the run's message on failure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tepo_cli.core.atomic_write import staged
from tepo_cli.core.errors import RunError


def write_directory(target: Path, write: Callable[[Path], None], failure: str) -> None:
    """Call `write(staging)`, then replace `target` with it; on an OSError nothing partial is left
    and RunError says `could not save {failure} to {target}: {error}` plus what still holds it."""
    try:
        with staged(target) as staging:
            write(staging)
    except OSError as error:
        raise RunError(
            f"could not save {failure} to {target}: {error}. Nothing partial was left behind; "
            f"the checkpoints under {target.parent / 'checkpoints'} still hold the run (free some "
            f"disk space and continue with resume=true)."
        ) from None
