"""A file or a directory written whole or not at all: staged beside its target, then one rename.

A reader, or the next start of a run killed meanwhile, finds the old version or the new one,
never half of one. Every such write in tepo goes through here (checkpoints, final/ and what sits
beside it, prepared data, the converted GGUF cache, the run's status, the eval's records, the
protocol's published runs, the small caches).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


def staging_path(target: Path, unique: bool = False) -> Path:
    """`<target>.tmp`, left over only by a killed process and replaced by the next write; with
    `unique`, `<target>.<pid>.tmp`: processes writing one target at once (ranks, parallel jobs)
    each stage their own."""
    suffix = f".{os.getpid()}.tmp" if unique else ".tmp"
    return target.with_name(target.name + suffix)


def replace(staging: Path, target: Path, durable: bool = False) -> None:
    """Put `staging` (a file or a directory) in `target`'s place. A directory already there is
    moved aside first and removed after: a rename cannot replace a non-empty directory. `durable`:
    every file and directory staged is fsynced before the rename and the parent after it, so the
    rename and what it names survive a crash of the machine (checkpoints)."""
    if durable:
        for path in [*staging.rglob("*"), staging] if staging.is_dir() else [staging]:
            _fsync(path)
    old = None
    if staging.is_dir() and target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        _remove(old)
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        _remove(old)
    if durable:
        _fsync(target.parent)


@contextlib.contextmanager
def staged(target: Path, unique: bool = False) -> Iterator[Path]:
    """The path to write instead of `target` (a file; or a directory, which the caller makes). It
    takes `target`'s place when the block ends; when the block raises, it is removed and `target`
    is left as it was."""
    staging = staging_path(target, unique)
    _remove(staging)
    try:
        yield staging
        replace(staging, target)
    except BaseException:
        _remove(staging)
        raise


def write_text(target: Path, text: str, unique: bool = False) -> None:
    """`target.write_text(text)` (UTF-8), whole or not at all."""
    with staged(target, unique) as staging:
        staging.write_text(text, encoding="utf-8")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
