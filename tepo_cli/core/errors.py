"""The one exception type for bad user input, and how it is shown."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration or input mistake the user can fix; shown as one paragraph, no traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class RunError(RuntimeError):
    """A run cannot go on for a reason the user can act on (not a bug); shown without traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class StopRequested(Exception):
    """SIGINT/SIGTERM stopped a run after a checkpoint; the job exits with 128 + the signal."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


def describe_value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
