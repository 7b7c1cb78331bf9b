"""Library warnings go to the run's log file, not the terminal, where they would interleave
with tepo's own lines (a deprecation inside transformers, a FutureWarning from torch.distributed)
and read as if something were wrong with the run.

Python's warnings are captured into the `py.warnings` logger, which writes to the run's log file
(train.log, eval.log: Hydra's file handler), counted. Python's own filter already keeps the
first occurrence per place. At the end, one tepo line says how many went to the file.
`TEPO_VERBOSE=1` (or `tepo train --verbose`) keeps them on the terminal as well.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

VERBOSE_ENV = "TEPO_VERBOSE"


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if self.first is None:
            message = record.getMessage().strip().splitlines()
            self.first = message[0] if message else ""


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes")


@contextmanager
def warnings_to_log(command: str) -> Iterator[None]:
    """While open, Python warnings go to the root logger's log files only (every handler of
    the root that writes a file); with no such file (a rank launched with job_logging=stdout),
    or with TEPO_VERBOSE=1, they also reach the terminal as before."""
    logger = logging.getLogger("py.warnings")
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    quiet = bool(files) and not verbose()
    counter = _Counter()
    added: list[logging.Handler] = [counter, *(files if quiet else [])]
    logging.captureWarnings(True)
    for handler in added:
        logger.addHandler(handler)
    logger.propagate = not quiet
    try:
        yield
    finally:
        for handler in added:
            logger.removeHandler(handler)
        logger.propagate = True
        logging.captureWarnings(False)
        if quiet and counter.count and os.environ.get("RANK", "0") == "0":
            where = ", ".join(os.path.basename(h.baseFilename) for h in files)
            print(
                f"tepo {command}: {counter.count} library warning(s) went to {where} (the first: "
                f"{counter.first}); {VERBOSE_ENV}=1 or --verbose shows them here.",
                file=sys.stderr,
            )
