"""Refuse command-line settings that say one thing twice, differently, before anything loads.

Without this, which of two values wins is an accident of the composition order: `k=3 algo.k=2`
trained with K = 3 (the shorthand is applied after composition), `resume=RUN hydra.run.dir=OTHER`
trained from scratch in OTHER. One key typed twice is not a conflict: Hydra keeps the last value,
as programs that append to a command line expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tepo_cli.core.errors import ConfigError

_FLAGS = ("true", "false", "1", "0", "null", "none", "")


@dataclass(frozen=True)
class Setting:
    key: str
    value: str  # as typed; a sweep's values joined by commas


def command_line_settings(arguments: list[str]) -> list[Setting]:
    """Each `key=value` override as typed (groups, `+key` and Hydra's own keys included)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    candidates = [a for a in arguments if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except HydraException:
        return []  # malformed syntax: Hydra reports it with its own parser's message
    return [
        Setting(override.key_or_group, _typed_value(override))
        for override in overrides
        if not override.is_delete()
    ]


def _typed_value(override: Any) -> str:
    """The value as typed; a sweep's (`k=2,4`) is its text, which has no single element."""
    if override.is_sweep_override():
        return str(override.input_line).split("=", 1)[1]
    return str(override.get_value_element_as_str())


def check_conflicts(config_name: str, arguments: list[str]) -> None:
    if config_name != "train":
        return
    given = {s.key: s.value for s in command_line_settings(arguments)}  # the last value wins
    _block_size(given)
    _resume_directory(given)


def _block_size(given: dict[str, str]) -> None:
    """`k=K` is the shorthand for algo.unit=block algo.k=K (conf/train.yaml)."""
    if "k" not in given or given["k"].lower() in ("null", "none"):
        return
    k = given["k"]
    if "algo.k" in given and given["algo.k"] != k:
        raise ConfigError(
            f"k={k} and algo.k={given['algo.k']} both set the block size K: the top-level k is "
            f"the shorthand for algo.unit=block algo.k=K and would win. Give one of them "
            f"(k={given['algo.k']} or algo.k={given['algo.k']}). Nothing was run."
        )
    if "algo.unit" in given and given["algo.unit"] != "block":
        raise ConfigError(
            f"k={k} makes the action unit K-token blocks (algo.unit=block), but "
            f"algo.unit={given['algo.unit']} asks for another unit. Drop k (for token or sequence "
            f"units) or algo.unit (for blocks of {k} tokens). Nothing was run."
        )


def _resume_directory(given: dict[str, str]) -> None:
    resume, run_dir = given.get("resume"), given.get("hydra.run.dir")
    if resume is None or run_dir is None or resume.lower() in _FLAGS:
        return
    if Path(resume).expanduser().resolve() != Path(run_dir).expanduser().resolve():
        raise ConfigError(
            f"resume={resume} continues that run in its own directory, but hydra.run.dir="
            f"{run_dir} names another one. Give resume=<run dir> alone, or hydra.run.dir=<run dir> "
            f"with resume=true. Nothing was run."
        )
