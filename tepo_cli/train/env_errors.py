"""Environment errors made visible: a counter alone (`env_end_env_error_frac`) tells a user that
their environment failed, not where or why.

Each episode that an environment's hook ended (an exception, a wrong type, a timeout) carries one
line naming the environment, the hook and the message (`envs.episodes.failure_line`). Per step
(or held-out evaluation), every rank's lines are gathered on rank 0, which writes every one into
the run's train.log and prints the first on the console with the count, so that a faulty
environment is seen at once without flooding the terminal with one line per episode.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tepo_cli.core import collective
from tepo_cli.runtime.metrics import RunLog

LOG_FILE = "train.log"
# Hydra's own file format (its default job_logging), so the lines read like the file's others.
_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
_logger = logging.getLogger("tepo_cli.envs.errors")
_logger.propagate = False  # the file only: the console gets one line per step, below
_logger.setLevel(logging.WARNING)


def report_env_errors(errors: list[str] | None, where: str, log: RunLog | None) -> None:
    """Gather every rank's `errors` (each rank enters: a collective on several ranks); on rank 0
    (the one with the run's `log`) write each into the run directory's train.log and print the
    first with their count. `where` names the moment ("step 3", "eval before (step 0)"). None
    (a sampler without environments, the same on every rank): nothing to gather."""
    if errors is None:
        return
    every = [line for rank in collective.from_every_rank(errors) for line in rank]
    if log is None or not every:
        return
    _to_file(log.run_dir / LOG_FILE)
    for line in every:
        _logger.warning("%s: %s", where, line)
    more = f" ({len(every) - 1} more, every one in {LOG_FILE})" if len(every) > 1 else ""
    # One line whatever the width (soft_wrap), the user's message as it is (no markup).
    log.console.print(
        f"{where}: {len(every)} episode(s) ended by an environment error: {every[0]}{more}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _to_file(path: Path) -> None:
    """The error logger writes to `path`: the root's file handler on it (Hydra's, in a
    one-process run), or one of its own (a rank of a multi-rank run, whose parent holds the
    file: appended lines stay whole)."""
    target = str(path.resolve())
    if any(getattr(h, "baseFilename", None) == target for h in _logger.handlers):
        return
    for handler in list(_logger.handlers):  # another run's file (a multirun): not this one's
        _logger.removeHandler(handler)
        if handler not in logging.getLogger().handlers:
            handler.close()
    for handler in logging.getLogger().handlers:
        if getattr(handler, "baseFilename", None) == target:
            _logger.addHandler(handler)
            return
    handler = logging.FileHandler(target, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter(_FORMAT))
    _logger.addHandler(handler)
