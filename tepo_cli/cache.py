"""tepo's on-disk cache (converted models, prepared benchmark data) and file checksums."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """`$TEPO_CACHE`, default `~/.cache/tepo`."""
    return Path(os.environ.get("TEPO_CACHE") or Path.home() / ".cache" / "tepo")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
