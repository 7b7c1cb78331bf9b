"""Library warnings go to the run's log file, not the terminal, where they would interleave
with tepo's own lines (a deprecation inside transformers, a FutureWarning from torch.distributed)
and read as if something were wrong with the run.

Python's warnings are captured into the `py.warnings` logger, which writes to the run's log file
(train.log, eval.log: Hydra's file handler), counted. Python's own filter already keeps the
first occurrence per place. At the end, one tepo line says how many went to the file.
`TEPO_VERBOSE=1` (or `tepo train --verbose`) keeps them on the terminal as well.

DeepSpeed writes to the terminal two more ways: its own logger (a stdout handler: "You are using
ZeRO with an untested optimizer", which tepo's guarded AdamW is by design) and bare `print()` (its
bf16 optimizer's memory report at start-up, its checkpoint loader's progress on a resume). While a
run's warnings go to its log, DeepSpeed's logger does too, and `library_prints_to_log` sends what
a DeepSpeed call prints there as well.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout

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


DEEPSPEED_LOGGER = "DeepSpeed"


class _LinesToFiles:
    """A stdout stand-in: each line written becomes one INFO record in the given log files."""

    def __init__(self, files: list[logging.FileHandler], source: str) -> None:
        self.files, self.source, self.pending = files, source, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if line.strip():
                _to(self.files, logging.LogRecord(self.source, logging.INFO, "", 0, line, (), None))
        return len(text)

    def flush(self) -> None:
        for handler in self.files:
            handler.flush()


class _ToFiles(logging.Filter):
    """On a logger: its records go to the given log files instead of the logger's handlers."""

    def __init__(self, files: list[logging.FileHandler]) -> None:
        super().__init__()
        self.files = files

    def filter(self, record: logging.LogRecord) -> bool:
        _to(self.files, record)
        return False


def _to(files: list[logging.FileHandler], record: logging.LogRecord) -> None:
    for handler in files:
        handler.handle(record)


def _log_files() -> list[logging.FileHandler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


@contextmanager
def library_prints_to_log(source: str = DEEPSPEED_LOGGER) -> Iterator[None]:
    """While open, what is printed to stdout goes to the run's log files as `source`'s lines;
    with no such file, or TEPO_VERBOSE=1, to the terminal as before. For a library call that
    prints (DeepSpeed's), never around tepo's own lines."""
    files = _log_files()
    if not files or verbose():
        yield
        return
    writer = _LinesToFiles(files, source)
    try:
        with redirect_stdout(writer):  # type: ignore[type-var]
            yield
    finally:
        writer.write("\n")  # a last line without its newline, even when the call raised


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes")


@contextmanager
def warnings_to_log(command: str) -> Iterator[None]:
    """While open, Python warnings go to the root logger's log files only (every handler of
    the root that writes a file); with no such file (a rank launched with job_logging=stdout),
    or with TEPO_VERBOSE=1, they also reach the terminal as before."""
    logger = logging.getLogger("py.warnings")
    files = _log_files()
    quiet = bool(files) and not verbose()
    counter = _Counter()
    added: list[logging.Handler] = [counter, *(files if quiet else [])]
    logging.captureWarnings(True)
    for handler in added:
        logger.addHandler(handler)
    logger.propagate = not quiet
    deepspeed = logging.getLogger(DEEPSPEED_LOGGER)
    divert = _ToFiles(files)
    if quiet:
        deepspeed.addFilter(divert)  # a filter: DeepSpeed adds its stdout handler on import
    try:
        yield
    finally:
        for handler in added:
            logger.removeHandler(handler)
        logger.propagate = True
        logging.captureWarnings(False)
        deepspeed.removeFilter(divert)
        if quiet and counter.count and os.environ.get("RANK", "0") == "0":
            where = ", ".join(os.path.basename(h.baseFilename) for h in files)
            print(
                f"tepo {command}: {counter.count} library warning(s) went to {where} (the first: "
                f"{counter.first}); {VERBOSE_ENV}=1 or --verbose shows them here.",
                file=sys.stderr,
            )
