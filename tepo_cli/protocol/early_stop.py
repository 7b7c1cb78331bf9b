"""`tepo protocol stop PROTOCOL.yaml --seeds S,S,... --reason TEXT`: end a pre-registered
experiment early, at the seeds whose runs are all in, as a journaled deviation.

A protocol's runs can outlast what the experiment can spend (a run longer than its machine is
kept, a budget cut). Stopping after whole seeds (every arm's run of each kept seed finished)
keeps the arms paired by seed, which is why runs train interleaved. The journal line (when,
the seeds kept and dropped, why) is the declaration: it goes in before the outcomes are read,
because `tepo report --protocol` shows none until every registered run is in, and the stop is
what changes "every". After it, `tepo protocol run` trains no run of a dropped seed, and the
report compares the kept seeds as the registered analysis, each table saying so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tepo_cli.core.errors import ConfigError
from tepo_cli.protocol.arguments import parse_stop
from tepo_cli.protocol.journal import EXPERIMENT, JOURNAL, Journal, code_checkout, file_digest
from tepo_cli.protocol.reuse import reused_runs
from tepo_cli.protocol.run_progress import published
from tepo_cli.protocol.spec import Protocol, load_protocol, published_dir

STOP = "stop"


@dataclass(frozen=True)
class Stop:
    """A declared early stop: the seeds kept, in the registered order, and the journal's line."""

    time: str
    kept: tuple[int, ...]
    dropped: tuple[int, ...]
    reason: str

    def applied(self, protocol: Protocol) -> Protocol:
        """The protocol with the kept seeds only: the runs its report waits for and compares."""
        return protocol.model_copy(update={"seeds": list(self.kept)})

    def dropped_runs(self, protocol: Protocol) -> set[str]:
        return {protocol.run_name(arm, seed) for arm in protocol.arms for seed in self.dropped}

    @property
    def label(self) -> str:
        every = ", ".join(map(str, sorted(self.kept + self.dropped)))
        return (
            f"STOPPED EARLY at seeds {', '.join(map(str, self.kept))} of the registered {every} "
            f"(`tepo protocol stop`, {self.time[:16].replace('T', ' ')} UTC)"
        )


def declared_stop(journals: list[list[dict[str, Any]]], protocol: Protocol) -> Stop | None:
    """The first stop the journals declare for this protocol (by name: a report may gather two
    protocols' journals), or None."""
    for entries in journals:
        for entry in entries:
            if entry.get("event") == STOP and entry.get("protocol") == protocol.name:
                kept = tuple(int(seed) for seed in entry["seeds"])
                dropped = tuple(int(seed) for seed in entry["dropped"])
                return Stop(str(entry["time"]), kept, dropped, str(entry.get("reason", "")))
    return None


def stop_experiment(
    protocol_path: Path, seeds: list[int], reason: str, results_dir: Path | None = None
) -> Stop:
    """Journal the stop after `seeds`, once each of their runs is published in every arm."""
    protocol = load_protocol(protocol_path)
    results_dir = results_dir or published_dir(protocol_path)
    journal = Journal(results_dir, code_checkout(), file_digest(protocol_path))
    earlier = declared_stop([journal.entries()], protocol)
    registered = [int(seed) for seed in protocol.seeds]
    foreign = [seed for seed in seeds if seed not in registered]
    kept = [seed for seed in registered if seed in seeds]
    where = f"--seeds {','.join(map(str, seeds))}"
    if earlier is not None:
        raise ConfigError(f"{protocol.name} already stopped: {earlier.label}. Nothing was written.")
    if foreign or not kept or len(kept) == len(registered) or not reason.strip():
        raise ConfigError(
            f"{where} --reason {reason!r}: a stop keeps some, not all, of the seeds "
            f"{protocol_path} registers ({', '.join(map(str, registered))}), and says why"
            + (f"; {', '.join(map(str, foreign))} is not one of them" if foreign else "")
            + ". Nothing was written."
        )
    reused = reused_runs(protocol, protocol_path)
    names = [protocol.run_name(arm, seed) for seed in kept for arm in protocol.arms]
    waiting = [name for name in names if not published(reused.get(name, results_dir / name))]
    if waiting:
        raise ConfigError(
            f"{where}: a stop keeps whole seeds, each arm's run finished and published in "
            f"{results_dir}; not yet: {', '.join(waiting)}. Finish them (`tepo protocol run "
            f"{protocol_path}`) or keep fewer seeds. Nothing was written."
        )
    dropped = [seed for seed in registered if seed not in kept]
    line = journal.write(
        EXPERIMENT, STOP, protocol=protocol.name, seeds=kept, dropped=dropped, reason=reason
    )
    return Stop(line["time"], tuple(kept), tuple(dropped), reason)


def main(argv: list[str]) -> int:
    args = parse_stop(argv)
    try:
        stop = stop_experiment(args.protocol, args.seeds, args.reason, args.results_dir)
    except ConfigError as error:
        print(f"tepo protocol stop: {error}", file=sys.stderr)
        return 2
    where = (args.results_dir or published_dir(args.protocol)) / JOURNAL
    print(f"tepo protocol stop: {stop.label}: {stop.reason} Journaled in {where}.")
    return 0
