"""Arms a protocol takes from another protocol's published runs (`reuse:` in protocol.yaml).

A follow-up arm is often compared with a control an earlier protocol has already trained (an
entropy method or another objective against the decisive test's GRPO runs). Training that control
again costs hours for a second copy of the same runs, but reading the earlier runs is sound only
if they are the runs this protocol would have made: the same pinned commit and, run by run, the
same overrides. That is checked once, when the protocol is read, so the runner never trains a
reused run and the report reads each from where its own protocol published it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tepo_cli.core.errors import ConfigError
from tepo_cli.protocol.spec import Protocol, load_protocol, override_difference, published_dir


def reused_runs(protocol: Protocol, path: Path) -> dict[str, Path]:
    """Run name -> the directory its records are published in, for every run of a reused arm
    (through a chain of protocols that reuse in turn); ConfigError, one paragraph, where a source
    cannot be read or would not have made the same run."""
    return _reused(protocol, Path(path), (Path(path).resolve(),))


def _reused(protocol: Protocol, path: Path, seen: tuple[Path, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    mine = {run.name: run.overrides for run in protocol.runs()}
    for arm, named in protocol.reuse.items():
        where = f"{path}: reuse.{arm}={named}"
        source_path = Path(os.path.normpath(path.parent / named))  # no a/../b in what it says
        if source_path.resolve() in seen:
            raise ConfigError(
                f"{where} leads back to {source_path}, which reuses from it in turn: a reused "
                "arm's runs must be trained by some protocol. Nothing was run."
            )
        try:
            source = load_protocol(source_path)
        except ConfigError as error:
            raise ConfigError(f"{where}: the protocol it names cannot be used. {error}") from None
        _same_commit(where, protocol.commit, source.commit)
        if arm not in source.arms:
            raise ConfigError(
                f"{where}: that protocol has no arm {arm!r} (its arms: {', '.join(source.arms)}). "
                "Nothing was run."
            )
        theirs = {run.name: run.overrides for run in source.runs()}
        upstream = _reused(source, source_path, (*seen, source_path.resolve()))
        for seed in protocol.seeds:
            name = protocol.run_name(arm, seed)
            if name not in theirs:
                raise ConfigError(
                    f"{where}: seed {seed} is not one of its seeds ({', '.join(map(str, source.seeds))}), "
                    f"so it has no run {name} to reuse. Nothing was run."
                )
            _same_overrides(where, name, mine[name], theirs[name])
            found[name] = upstream.get(name, published_dir(source_path) / name)
    return found


def _same_commit(where: str, mine: str | None, theirs: str | None) -> None:
    if mine is None and theirs is None:
        return
    if (
        mine is not None
        and theirs is not None
        and (mine.startswith(theirs) or theirs.startswith(mine))
    ):
        return
    raise ConfigError(
        f"{where}: this protocol pins commit {mine or '(none)'} and that one {theirs or '(none)'}; "
        "reused runs must come from the commit this protocol's own runs train at, or the code "
        "is a difference between the arms besides their overrides. Nothing was run."
    )


def _same_overrides(where: str, name: str, mine: list[str], theirs: list[str]) -> None:
    difference = override_difference(mine, theirs, ("here", "there"))
    if difference is None:
        return
    raise ConfigError(
        f"{where}: its run {name} was not made as this protocol would make it ({difference}). "
        "A reused run must have the same base, arm and per-run overrides in both protocols. "
        "Nothing was run."
    )
