"""Resuming a run: which directory, whether its config still describes the same run, its logs.

`resume=<run dir>` continues that directory; `resume=true` continues the directory given by
`hydra.run.dir` when set, otherwise the newest unfinished run under outputs/train. In a multirun,
`resume=true` makes every job continue its own directory (same `hydra.sweep.dir`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tepo_cli.core.errors import ConfigError
from tepo_cli.core.run_dir import CONFIG, LOG_FILES
from tepo_cli.core.run_status import effective_state

RUNS_ROOT = Path("outputs/train")

# Keys that may change between the interrupted run and its continuation: they change what is
# logged, saved or how long the run goes on, not what a step computes.
HARMLESS = (
    "resume",
    "logger",
    "trainer.max_steps",
    "trainer.progress",
    "trainer.samples_per_step",
    "trainer.save_every",
    "trainer.keep_checkpoints",
    "trainer.max_bad_steps",
    "trainer.skip_zero_advantage",  # the same gradient (a step with none left: no AdamW step)
    "trainer.collective_timeout_s",
    "trainer.time_limit_minutes",  # a new allocation brings a new limit
    "trainer.eval_every",
    "trainer.eval_before",
    "trainer.eval_after",
    "trainer.save_final",
    "trainer.num_threads",
    "trainer.device",
    "trainer.mmap_threshold_kb",
    "trainer.host_allocator",
    "kernel.backend",
    "kernel.chunk_size",
    "kernel.lean_layers",
    "rollout.engine.sleep",  # where the engine's weights wait during the update, not their values
)
_PLAIN_PATH = re.compile(r"^[\w./~-]+$")


def run_dir_overrides(overrides: list[str]) -> list[str]:
    """Add `hydra.run.dir=` for a single run that resumes, before Hydra picks a fresh directory."""
    value = _last_value(overrides, "resume")
    if value is None or value.lower() in ("false", "null", "none", "0"):
        return overrides
    multirun = any(arg in ("-m", "--multirun") for arg in overrides)
    is_flag = value.lower() in ("true", "1")
    if multirun:
        if not is_flag:
            raise ConfigError(
                f"resume={value} names one run directory, but this is a multirun; re-run the same "
                f"sweep command (same hydra.sweep.dir) with resume=true to continue every job."
            )
        return overrides
    if _last_value(overrides, "hydra.run.dir") is not None:
        return overrides
    target = newest_unfinished(RUNS_ROOT) if is_flag else Path(value).expanduser()
    if target is None:
        raise ConfigError(
            f"resume=true found no unfinished run under {RUNS_ROOT.resolve()}; pass the run "
            f"directory itself (resume=<run dir>) or set hydra.run.dir=<run dir>."
        )
    if not (target / CONFIG).is_file():
        raise ConfigError(
            f"resume={value}: {target} is not a tepo train run directory (it has no config.yaml); "
            f"pass the directory that holds config.yaml, metrics.jsonl and checkpoints/."
        )
    text = str(target)
    quoted = text if _PLAIN_PATH.match(text) else "'" + text.replace("'", "\\'") + "'"
    return [*overrides, f"hydra.run.dir={quoted}"]


def newest_unfinished(root: Path) -> Path | None:
    runs = [p.parent for p in root.glob("*/*/config.yaml")]
    runs.sort(key=lambda p: (p / CONFIG).stat().st_mtime, reverse=True)
    return next((run for run in runs if effective_state(run) != "finished"), None)


def check_same_run(previous: dict[str, Any], current: dict[str, Any], run_dir: Path) -> None:
    """Refuse a continuation whose config would compute different steps than the original. A
    run saved before a key existed resumes when the key has its default now (`with_defaults`)."""
    old, new = _flatten(with_defaults(previous)), _flatten(current)
    changed = sorted(
        key
        for key in old.keys() | new.keys()
        if old.get(key) != new.get(key) and not _harmless(key)
    )
    if changed:
        shown = "; ".join(f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in changed[:8])
        more = f" (and {len(changed) - 8} more)" if len(changed) > 8 else ""
        raise ConfigError(
            f"cannot resume {run_dir}: the config differs from the run's own config.yaml in keys "
            f"that change what the run computes — {shown}{more}. Resume with the original "
            f"settings (only {', '.join(HARMLESS)} may change), or start a new run."
        )


def with_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved run config with every key tepo has gained since at its default: the config as
    this version reads it. A config this version cannot read at all is returned as it is (the
    comparison then names what differs)."""
    from pydantic import ValidationError

    from tepo_cli.config.schema import TrainConfig

    try:
        return TrainConfig.model_validate(saved).model_dump(mode="json")
    except (ValidationError, ValueError, TypeError):
        return saved


def read_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CONFIG
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text()) or {}


def truncate_logs(run_dir: Path, lengths: dict[str, int]) -> None:
    """Cut each log back to its length at the checkpoint: no step is recorded twice."""
    for name in LOG_FILES:
        path = run_dir / name
        if path.is_file():
            length = lengths.get(name, 0)
            if path.stat().st_size > length:
                with path.open("r+b") as handle:
                    handle.truncate(length)


def log_lengths(run_dir: Path) -> dict[str, int]:
    return {
        name: (run_dir / name).stat().st_size if (run_dir / name).is_file() else 0
        for name in LOG_FILES
    }


def _harmless(key: str) -> bool:
    return any(key == h or key.startswith(h + ".") for h in HARMLESS)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat.update(_flatten(value, f"{prefix}{key}." if isinstance(value, dict) else prefix + key))
    return flat


def _last_value(overrides: list[str], key: str) -> str | None:
    value = None
    for arg in overrides:
        name, sep, rest = arg.partition("=")
        if sep and name.lstrip("+~") == key:
            value = rest.strip("'\"")
    return value
