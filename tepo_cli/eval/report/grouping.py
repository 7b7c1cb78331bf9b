"""Group runs by the keys the sweep varied; seeds are the repeats inside a group.

A key is swept when its value differs between runs. The keys come from each job's command-line
overrides (`.hydra/overrides.yaml`: `algo=grpo`, `k=4`, `trainer.lr=1e-5`), which name the
experiment as it was typed; when a run has no overrides file, the flattened resolved configs are
compared instead (keeping one key per way of splitting the runs). `seed`, `resume` (a sweep's jobs
continued after an interruption are the same runs), the keys that change what a run records but
not what it trains (an evaluation before or after training, checkpoints, the console: a
pre-registered protocol evaluates step 0 in its first run only) and Hydra's own settings
(`hydra.*`, `hydra/launcher=...`) never define a group.

A group's label names what its runs typed, plus only those untyped values that tell it apart from
a group it would otherwise read the same as. Once `algo.mask_criterion` is swept among TEPO's runs,
every other group also has a value for it (its config's), but "algo=dapo
algo.mask_criterion=covariance" would read as if DAPO had run with a mask; on-policy GRPO beside
`algo=grpo trainer.minibatches=4` still reads "algo=grpo trainer.minibatches=1". Labels stay
unique; every value stays in the group's `values` (and the CSV's columns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tepo_cli.eval.report.runs import Run

_NOT_SWEPT = {"seed", "run_dir", "model.path", "resume"}
_NOT_SWEPT |= {f"trainer.{key}" for key in ("eval_before", "eval_after", "progress")}
_NOT_SWEPT |= {f"trainer.{key}" for key in ("save_every", "keep_checkpoints", "save_final")}
_NOT_SWEPT |= {"trainer.time_limit_minutes"}  # each allocation's own, runs differ in nothing
_MISSING = "(default)"
# A top-level shorthand a run did not type shows the value it sets (conf/train.yaml: `k=K` is
# algo.unit=block algo.k=K; an MPO run that did not type it has k null and algo.k 5).
_SHORTHANDS = {"k": "algo.k"}


@dataclass
class Group:
    label: str  # "algo=grpo k=4"; "all runs" when nothing was swept
    values: dict[str, str]  # swept key -> value
    runs: list[Run]


def group_runs(runs: list[Run]) -> tuple[list[str], list[Group]]:
    """(swept keys, groups in order of first appearance)."""
    by_overrides = all(run.overrides is not None for run in runs)
    settings = [_override_settings(run) if by_overrides else _config_settings(run) for run in runs]
    keys: list[str] = []
    for setting in settings:
        keys.extend(key for key in setting if key not in keys)
    pairs = list(zip(runs, settings, strict=True))
    columns = {key: tuple(_value(run, setting, key) for run, setting in pairs) for key in keys}
    swept = [key for key, column in columns.items() if len(set(column)) > 1]
    if not by_overrides:
        swept = _without_redundant(swept, columns)
    groups: dict[tuple[str, ...], Group] = {}
    typed: dict[tuple[str, ...], set[str]] = {}
    for run, setting in pairs:
        values = {key: _value(run, setting, key) for key in swept}
        identity = tuple(values.values())
        if identity not in groups:
            groups[identity] = Group("", values, [])
            typed[identity] = set()
        groups[identity].runs.append(run)
        typed[identity].update(setting if by_overrides else swept)
    for identity, group in groups.items():
        keys = _label_keys(group, typed[identity], swept, list(groups.values()))
        group.label = " ".join(f"{k}={group.values[k]}" for k in keys) or "all runs"
    return swept, list(groups.values())


def _label_keys(group: Group, typed: set[str], swept: list[str], groups: list[Group]) -> list[str]:
    """The swept keys the group's runs typed; then, for each other group that agrees with it on
    those, the keys where the two differ. Two groups never share a label: if one's keys do not
    tell them apart, it adds a key on which they differ."""
    keys = {key for key in swept if key in typed}
    for other in groups:
        if other is not group and all(group.values[k] == other.values[k] for k in keys):
            keys.update(key for key in swept if group.values[key] != other.values[key])
    return [key for key in swept if key in keys]


def _without_redundant(swept: list[str], columns: dict[str, tuple[str, ...]]) -> list[str]:
    """Keep one key per way of splitting the runs: with `algo=grpo,mpo` the configs also differ in
    algo.unit, algo.eps_high, ..., which split the runs exactly as algo.name does."""
    kept: list[str] = []
    partitions: set[tuple[int, ...]] = set()
    for key in swept:
        first_seen: dict[str, int] = {}
        partition = tuple(first_seen.setdefault(v, len(first_seen)) for v in columns[key])
        if partition not in partitions:
            partitions.add(partition)
            kept.append(key)
    return kept


def _override_settings(run: Run) -> dict[str, str]:
    settings: dict[str, str] = {}
    for override in run.overrides or []:
        key, sep, value = override.partition("=")
        key = key.lstrip("+~")
        if not sep or _ignored(key):
            continue
        settings[key] = value
    return settings


def _config_settings(run: Run) -> dict[str, str]:
    return {key: _text(value) for key, value in run.config.items() if not _ignored(key)}


def _ignored(key: str) -> bool:
    return key in _NOT_SWEPT or key == "hydra" or key.startswith(("hydra.", "hydra/"))


def _value(run: Run, setting: dict[str, str], key: str) -> str:
    """The run's value of a swept key; a run that did not set it shows its config's value."""
    if key in setting:
        return setting[key]
    if key in _SHORTHANDS and run.config.get(key) is None:
        key = _SHORTHANDS[key]
    for name in (key, f"{key}.name"):  # a config group (algo=...) is named by its .name
        if name in run.config:
            return _text(run.config[name])
    return _MISSING


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)
