"""How each run of a pre-registered experiment went, from its journal (RUNS_DIR/journal.jsonl,
which `tepo protocol run` appends to: tepo_cli/protocol/journal.py), for `tepo report --protocol`.

Why. A pre-registered result is read with its interruptions: a run resumed from a checkpoint, a
run trained again from step 0 because an earlier try's checkpoints were lost, a try at a commit
other than the pinned one or under an earlier text of the protocol, a machine shared with other
work while it trained. The records a run publishes show none of these; the journal shows them
all, so the report states them under the verdicts and a results page cannot leave one out.

A try begins at a `start` line (from step 0) or a `resume` line (after its newest checkpoint; from
step 0 again where it had none) and ends at the run's next `fail` or `finish` line. A try followed by another begin with no end
between ended without a record: the runner itself stopped (it was killed, or its machine went
down), so what that try did is not known from the journal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tepo_cli.protocol.journal import EXPERIMENT, JOURNAL, TRY_BEGINS, read_entries

END = ("fail", "finish")
EXPERIMENT_EVENTS = {
    "protocol_changed": "the protocol file changed after its runs had started "
    "(--allow-protocol-change)",
    "commit_mismatch": "runs went on at a commit other than the protocol's "
    "(--allow-commit-mismatch)",
    "pilot": "a pilot of arm {arm}: {of_run}'s command at seed {seed} until step {steps}, not "
    "evaluated, only its seconds and memory read (--pilot; exit {exit_code})",
    "rerun": "{of_run} trained again from its published overrides until step {steps} at "
    "commit {at} and compared with its records (--rerun): {outcome}",
    "stop": "the experiment stopped early, keeping seeds {seeds} and dropping {dropped} in every "
    "arm (`tepo protocol stop`): {reason}",
}
NONE = "—"


@dataclass(frozen=True)
class RunHistory:
    run: str
    tries: int
    fresh_starts: int  # tries from step 0: more than one means an earlier try was thrown away
    resumed_after: tuple[int, ...]  # the checkpoint step of each resume from a checkpoint
    failed: tuple[str, ...]  # each recorded end short of the finish
    unrecorded: int  # tries that ended with no line
    open: bool  # the last try has no end yet: still training, or stopped without a record
    others_cores: float | None  # the most cores other processes kept busy over one ended try
    paused_seconds: float | None  # stopped (SIGSTOP) over its recorded tries; None: not journaled
    finished: str | None  # when, UTC to the minute
    commits: tuple[str, ...]  # short hashes of the tries' code, in order of first use
    off_commit: int  # tries at a commit other than the protocol's
    dirty: int  # tries from a checkout whose tracked files differed from its commit
    earlier_text: int  # tries under an earlier protocol text than its journal's newest line's


def read_journals(root: Path, run_dirs: list[Path]) -> list[list[dict[str, Any]]]:
    """The journal beside the runs (`root`'s) and the one beside each run reached through a link:
    a follow-up arm's report gathers two protocols' runs in one folder of links."""
    places = dict.fromkeys([root.resolve(), *(run.resolve().parent for run in run_dirs)])
    return [entries for place in places if (entries := read_entries(place / JOURNAL))]


def reused_journals(reused: dict[str, Path], arms: set[str]) -> list[list[dict[str, Any]]]:
    """For runs another protocol published (`reuse:`, of `arms`), their lines of that protocol's
    journal and its experiment-wide lines but the pilots of its other arms: not its other runs,
    which this protocol does not compare. (A change of its text is a line of its own, so the
    newest line kept still carries the newest text.)"""
    journals = []
    for place in dict.fromkeys(path.resolve().parent for path in reused.values()):
        kept = [
            entry
            for entry in read_entries(place / JOURNAL)
            if entry.get("run") in reused
            or (entry.get("run") == EXPERIMENT and entry.get("arm", next(iter(arms))) in arms)
        ]
        if kept:
            journals.append(kept)
    return journals


def run_histories(
    journals: list[list[dict[str, Any]]], order: list[str], commit: str | None
) -> list[RunHistory]:
    """Each run named in the journals, registered runs first in `order`; `commit`: the protocol's
    pinned commit (None: not pinned). A try's protocol text is compared with its own journal's
    newest line, which carries the text its runner was last allowed to go on with."""
    events: dict[str, list[tuple[dict[str, Any], bool]]] = {}
    for entries in journals:
        latest = entries[-1].get("protocol_sha256")
        for entry in entries:
            if entry.get("run") != EXPERIMENT:
                earlier = entry.get("protocol_sha256") != latest
                events.setdefault(str(entry.get("run")), []).append((entry, earlier))
    names = [name for name in order if name in events]
    names += [name for name in events if name not in order]
    return [_history(name, events[name], commit) for name in names]


def _history(run: str, events: list[tuple[dict[str, Any], bool]], commit: str | None) -> RunHistory:
    begins: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []
    unrecorded, open_, earlier_text = 0, False, 0
    for entry, earlier in sorted(events, key=lambda pair: str(pair[0].get("time"))):
        if entry["event"] in TRY_BEGINS:
            unrecorded += open_
            begins.append(entry)
            earlier_text += earlier
            open_ = True
        elif entry["event"] in END:
            ends.append(entry)
            open_ = False
    finish = next((e for e in reversed(ends) if e["event"] == "finish"), None)
    cores = [float(e["others_cores"]) for e in ends if e.get("others_cores") is not None]
    paused = [float(e["paused_seconds"]) for e in ends if e.get("paused_seconds") is not None]
    codes = [str(e.get("commit") or "unknown")[:7] for e in begins]
    # a resume with no checkpoint to resume from (after step 0) trains from step 0 again
    after = [int(e.get("after_step") or 0) if e["event"] == "resume" else 0 for e in begins]
    return RunHistory(
        run=run,
        tries=len(begins),
        fresh_starts=after.count(0),
        resumed_after=tuple(step for step in after if step),
        failed=tuple(_failure(e) for e in ends if e["event"] == "fail"),
        unrecorded=unrecorded,
        open=open_,
        others_cores=max(cores) if cores else None,
        paused_seconds=sum(paused) if paused else None,
        finished=_minute(finish["time"]) if finish else None,
        commits=tuple(dict.fromkeys(codes)),
        off_commit=sum(not str(e.get("commit") or "").startswith(commit or "") for e in begins),
        dirty=sum(bool(e.get("dirty")) for e in begins),
        earlier_text=earlier_text,
    )


def _failure(entry: dict[str, Any]) -> str:
    saved = entry.get("last_checkpoint")
    checkpoint = "no checkpoint" if saved is None else f"saved step {saved}"
    return f"exit {entry.get('exit_code')} ({entry.get('state')}, {checkpoint})"


def _minute(time: str) -> str:
    """'2026-11-29T07:54:29+00:00' -> '2026-11-29 07:54'."""
    return time[:16].replace("T", " ")


def experiment_events(journals: list[list[dict[str, Any]]]) -> list[str]:
    """The journals' lines about a whole experiment (its deviations and pilots), one sentence
    each."""
    return [
        f"{_minute(e['time'])} UTC: {EXPERIMENT_EVENTS.get(e['event'], e['event']).format_map(e)}"
        for entries in journals
        for e in entries
        if e.get("run") == EXPERIMENT
    ]


def _ended_short(row: RunHistory) -> str:
    parts = list(row.failed) + ([f"no record ×{row.unrecorded}"] if row.unrecorded else [])
    return "; ".join(parts) or NONE


def _code(row: RunHistory) -> str:
    marks = [
        f"{count} {what}"
        for count, what in (
            (row.off_commit, "not at the protocol's commit"),
            (row.dirty, "with changed files"),
            (row.earlier_text, "under an earlier protocol text"),
        )
        if count
    ]
    return ", ".join(row.commits) + (f" ({'; '.join(marks)})" if marks else "")


def history_columns() -> list[tuple[str, Callable[[RunHistory], str]]]:
    return [
        ("run", lambda r: r.run),
        ("tries", lambda r: str(r.tries)),
        ("from step 0", lambda r: str(r.fresh_starts)),
        ("resumed after step", lambda r: ", ".join(map(str, r.resumed_after)) or NONE),
        ("ended short", _ended_short),
        ("others' cores", lambda r: NONE if r.others_cores is None else f"{r.others_cores:.2f}"),
        (
            "paused (min)",
            lambda r: NONE if r.paused_seconds is None else f"{r.paused_seconds / 60:.1f}",
        ),
        ("finished (UTC)", lambda r: r.finished or ("not yet" if r.open else NONE)),
        ("code", _code),
    ]


HISTORY_LEGEND = (
    "From the journal `tepo protocol run` keeps beside the records (journal.jsonl). tries: starts "
    "from step 0 and resumes after a checkpoint; from step 0 more than once: an earlier try was "
    "thrown away (its checkpoints lost) and the run trained again. ended short: each try that "
    "ended before the run finished, with its exit code, state and newest checkpoint; no record: "
    "tries the runner itself did not outlive (killed, or its machine went down). others' cores: "
    "the most cores other processes kept busy, on average, over one recorded try (0: the run had "
    "the machine; outside its pauses where the journal counts them). paused: the minutes its "
    "processes were stopped (SIGSTOP, to give the machine to other work) over its recorded "
    "tries; a paused run computes nothing, so only its wall-clock times show it (—: a journal "
    "from before pauses were counted, 2026-12-01). code: the commits the tries ran, and how many "
    "were not at the protocol's commit, had changed files, or ran under an earlier text of their "
    "protocol file."
)
