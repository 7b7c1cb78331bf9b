"""`tepo protocol run PROTOCOL.yaml`: train a pre-registered experiment's runs, one at a time.

Each run is a `tepo train` subprocess with the protocol's overrides, `resume=true` and its own
`hydra.run.dir=RUNS_DIR/RUN`, so the same command after any interruption (kill -9, a reboot, a
failed run) picks up where the experiment stopped: a run already published is skipped, the
unfinished one resumes from its newest checkpoint, the rest start in the registered order. Runs
train one after another because they share the CPU (vLLM on a small CPU slows several-fold when
shared). A finished run's records — never its weights — are published into RESULTS_DIR/RUN and its
checkpoints deleted; every start, resume, finish and failure is a line of RESULTS_DIR/journal.jsonl.
"""

from __future__ import annotations

import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tepo_cli.core.atomic_write import staged
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.run_dir import (
    CHECKPOINTS,
    CONFIG,
    EVAL_SAMPLES,
    EVALS,
    HYDRA,
    METRICS,
    SAMPLES,
    STATUS,
    SUMMARY,
)
from tepo_cli.core.run_status import effective_state
from tepo_cli.protocol.arguments import Options, parse
from tepo_cli.protocol.early_stop import declared_stop
from tepo_cli.protocol.journal import (
    EXPERIMENT,
    JOURNAL,
    Checkout,
    CpuShare,
    Journal,
    code_checkout,
    file_digest,
    read_entries,
    tries_by_run,
)
from tepo_cli.protocol.pilot import run_pilots
from tepo_cli.protocol.rerun import rerun
from tepo_cli.protocol.reuse import reused_runs
from tepo_cli.protocol.run_progress import (
    earlier_tries,
    last_step,
    newest_checkpoint,
    print_status,
    published,
    step_records,
)
from tepo_cli.protocol.spec import Protocol, Run, load_protocol, published_dir
from tepo_cli.runtime.time_limit import TimeLimit

# What a run leaves that the results need (the same list scripts/word_math_claims.sh publishes).
RECORDS = (CONFIG, METRICS, EVALS, EVAL_SAMPLES, SAMPLES, STATUS, SUMMARY, "train.log")
CONSOLE = "console.log"
MINIMUM_SECONDS = (
    60.0  # --time-limit: no run starts with less (its model alone takes longer to load)
)


def main(argv: list[str]) -> int:
    options = parse(argv)
    try:
        return run_protocol(options)
    except ConfigError as error:
        print(f"tepo protocol run: {error}", file=sys.stderr)
        return 2


def run_protocol(options: Options) -> int:
    protocol = load_protocol(options.protocol)
    runs = _selected(protocol, options.only)
    reused = reused_runs(protocol, options.protocol)
    runs_dir = options.runs_dir or Path("multirun") / protocol.name
    results_dir = options.results_dir or published_dir(options.protocol)
    runs = _not_stopped(protocol, runs, results_dir)
    if options.list_only:
        for name, overrides in runs:
            source = (
                f"  # reused: {reused[name].parent}, not trained here" if name in reused else ""
            )
            print(f"{name}: {' '.join(overrides)}{source}")
        return 0
    if options.status:
        return print_status(runs, runs_dir, results_dir, reused)
    awaited = [name for name, _ in runs if name in reused and not published(reused[name])]
    runs = _trained_here(runs, reused)
    if options.dry_run:
        return _dry_run(runs)
    checkout = code_checkout()
    mismatch = _commit_mismatch(protocol, checkout, options)
    journal = Journal(results_dir, checkout, file_digest(options.protocol))
    _check_unchanged(journal, options)
    if options.rerun is not None:  # trains no run of the experiment: its line has the commit
        run = _one(protocol, options.rerun)
        where = reused.get(run.name, results_dir / run.name)
        return rerun(run, where, runs_dir / ".rerun", journal, options.rerun_steps)
    if mismatch:
        journal.write(EXPERIMENT, "commit_mismatch", pinned=protocol.commit)
        print(f"tepo protocol run: {mismatch}", file=sys.stderr)
    if options.pilot is not None:
        return run_pilots(protocol, runs, runs_dir, journal, options.pilot)
    code = _train_runs(runs, runs_dir, results_dir, journal, options.time_limit)
    if code != 0:
        return code
    print(f"== every run of {protocol.name} is published in {results_dir}", flush=True)
    if awaited:
        print(
            f"== reused runs that their own protocol has not published yet: {', '.join(awaited)} "
            f"(in {reused[awaited[0]].parent}); the report waits for them",
            flush=True,
        )
    return 0


def _train_runs(
    runs: list[Run], runs_dir: Path, results_dir: Path, journal: Journal, minutes: float | None
) -> int:
    """Each run not yet published, in order, until one does not finish (its exit code) or, with
    --time-limit `minutes`, too little time is left to start the next (143, as for SIGTERM)."""
    clock = TimeLimit(minutes) if minutes else None
    for run in runs:
        if published(results_dir / run.name):
            print(f"== {run.name}: finished and published already, skipped", flush=True)
            continue
        limit = _minutes_left(clock, runs, results_dir, run.name)
        if limit is not None and limit <= 0:
            return 128 + signal.SIGTERM
        code = _train(run, runs_dir, results_dir, journal, limit)
        if code != 0:
            print(
                f"tepo protocol run: {run.name} did not finish (exit {code}); the runs after it "
                f"did not start. Run the same command again to resume it "
                f"(journal: {journal.path}).",
                file=sys.stderr,
            )
            return code
    return 0


def _trained_here(runs: list[Run], reused: dict[str, Path]) -> list[Run]:
    """The runs this protocol trains: a reused run trains under the protocol it comes from."""
    own = [run for run in runs if run.name not in reused]
    if runs and not own:
        raise ConfigError(
            f"the runs selected ({', '.join(run.name for run in runs)}) are all reused from "
            f"another protocol ({reused[runs[0].name].parent}): they train there, not here. "
            "Nothing was run."
        )
    return own


def _one(protocol: Protocol, name: str) -> Run:
    runs = {run.name: run for run in protocol.runs()}
    if name not in runs:
        raise ConfigError(
            f"--rerun {name!r} is not one of the protocol's runs ({', '.join(runs)}). "
            "Nothing was run."
        )
    return runs[name]


def _not_stopped(protocol: Protocol, runs: list[Run], results_dir: Path) -> list[Run]:
    """The runs an early stop (protocol/early_stop.py) has not dropped; names the dropped."""
    stop = declared_stop([read_entries(results_dir / JOURNAL)], protocol)
    if stop is None:
        return runs
    dropped = stop.dropped_runs(protocol)
    named = ", ".join(run.name for run in runs if run.name in dropped) or "none selected"
    print(f"== {stop.label}; not trained: {named}", flush=True)
    return [run for run in runs if run.name not in dropped]


def _selected(protocol: Protocol, only: str | None) -> list[Run]:
    runs = protocol.runs()
    if only is None:
        return runs
    try:
        pattern = re.compile(only)
    except re.error as error:
        raise ConfigError(f"--only {only!r} is not a regular expression: {error}.") from None
    chosen = [run for run in runs if pattern.search(run.name)]
    if not chosen:
        raise ConfigError(
            f"--only {only!r} matches none of the protocol's runs "
            f"({', '.join(run.name for run in runs)}). Nothing was run."
        )
    return chosen


def _commit_mismatch(protocol: Protocol, checkout: Checkout, options: Options) -> str | None:
    """A paragraph when the code is not at the protocol's pinned commit; refused unless allowed."""
    pinned = protocol.commit
    if pinned is None or (checkout.commit or "").startswith(pinned):
        return None
    found = checkout.commit or "no git checkout"
    message = (
        f"{options.protocol} pins commit {pinned}, but the code that would train is at {found}. "
        "Every run of a pre-registered experiment is made at one commit: run from a checkout of "
        f"it (git worktree add ../{protocol.name} {pinned}, then install that checkout)"
    )
    if not options.allow_commit_mismatch:
        raise ConfigError(
            message + ", or pass --allow-commit-mismatch to journal the deviation. Nothing was run."
        )
    return message + "; --allow-commit-mismatch: going on, journaled as a deviation."


def _check_unchanged(journal: Journal, options: Options) -> None:
    """A protocol edited after its runs started is no longer what was registered: refused, or
    with --allow-protocol-change journaled (old and new digest) as the deviation it is."""
    entries = journal.entries()
    latest = next((e for e in reversed(entries) if e.get("protocol_sha256")), None)
    if latest is None or latest["protocol_sha256"] == journal.protocol_sha256:
        return
    if options.allow_protocol_change:
        journal.write(EXPERIMENT, "protocol_changed", previous_sha256=latest["protocol_sha256"])
        return
    first = next(e for e in entries if e.get("protocol_sha256"))
    raise ConfigError(
        f"{options.protocol} changed since its runs started ({first['time']}, journal "
        f"{journal.path}): a pre-registered protocol is not edited once it runs. Restore it "
        "(git checkout) and list deviations in protocol.md beside it, or pass "
        "--allow-protocol-change to go on with the change journaled as a deviation. "
        "Nothing was run."
    )


def _minutes_left(
    clock: TimeLimit | None, runs: list[Run], results_dir: Path, name: str
) -> float | None:
    """With --time-limit, the minutes left for the next run (its trainer.time_limit_minutes), or
    0 when too little is left to start one: less than two steps at the median pace of the
    published runs' steps, and less than a minute in any case. None without a limit."""
    if clock is None or clock.seconds is None:
        return None
    left = clock.seconds - clock.elapsed()
    paces = [
        record["step_seconds"]
        for run in runs
        for record in step_records(results_dir / run.name)
        if isinstance(record.get("step_seconds"), int | float)
    ]
    need = max(MINIMUM_SECONDS, 2 * statistics.median(paces) if paces else 0.0)
    if left > need:
        return left / 60
    short = (
        f"{left / 60:.1f} min left, less than {need / 60:.1f} min (two steps at the published "
        "runs' median pace, a minute at least)"
        if left > 0
        else "no time left"
    )
    print(
        f"== --time-limit {clock.seconds / 60:g}: {short}: {name} and the runs after it wait "
        "for the next invocation (the same command)",
        flush=True,
    )
    return 0.0


def _train(
    run: Run, runs_dir: Path, results_dir: Path, journal: Journal, limit: float | None = None
) -> int:
    """Start, resume or publish `run` (journaled); `limit`: its trainer.time_limit_minutes."""
    run_dir = runs_dir / run.name
    limited = {"time_limit_minutes": round(limit, 2)} if limit is not None else {}
    before = effective_state(run_dir) if run_dir.is_dir() else None
    after_step = newest_checkpoint(run_dir)
    if before is None:
        earlier = tries_by_run(journal.entries())[run.name]
        if earlier:  # its directory went with a machine, or the runs are looked for elsewhere
            print(
                f"== {run.name}: no run directory in {runs_dir}, though the journal has "
                f"{earlier_tries(earlier)} of it: its checkpoints are gone (another machine, or "
                "another --runs-dir?). Training it again from step 0; the journal says so.",
                flush=True,
            )
        journal.write(
            run.name, "start", **({"earlier_tries": earlier} if earlier else {}), **limited
        )
    elif before == "finished":
        journal.write(run.name, "publish", note="finished before, not yet published")
    else:
        journal.write(run.name, "resume", after_step=after_step or 0, state=before, **limited)
    runs_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "tepo_cli",
        "train",
        *run.overrides,
        "resume=true",
        *([f"trainer.time_limit_minutes={limit:.4f}"] if limit is not None else []),
        f"hydra.run.dir={run_dir}",
    ]
    print(f"== {run.name}: tepo train {' '.join(command[4:])}", flush=True)
    cpu = CpuShare()
    console = runs_dir / f"{run.name}.{CONSOLE}"
    code = _stream(command, console)
    state = effective_state(run_dir)
    shared = {"others_cores": cpu.others(), "cpus": cpu.cpus, "paused_seconds": cpu.paused_seconds}
    if code == 0 and state == "finished":
        shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
        _publish(run_dir, console, results_dir / run.name)
        journal.write(run.name, "finish", steps=last_step(run_dir), **shared)
        return 0
    journal.write(
        run.name,
        "fail",
        exit_code=code,
        state=state,
        last_checkpoint=newest_checkpoint(run_dir),
        **shared,
    )
    return code or 1


def _stream(command: list[str], console: Path) -> int:
    """Run `command`, its output on this terminal and appended to `console`; its exit code as a
    shell reports it (128 + N for a signal). Ctrl-C reaches the run too (same process group): it
    checkpoints and exits, and this waits for it."""
    with console.open("a") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert process.stdout is not None
        while True:
            try:
                for line in process.stdout:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    log.write(line)
                    log.flush()  # a kill of this process loses no line of the run's console
                break
            except KeyboardInterrupt:
                continue  # the run got it too: it checkpoints and exits; keep its last words
        code = process.wait()
    return 128 - code if code < 0 else code


def _publish(run_dir: Path, console: Path, destination: Path) -> None:
    """Copy the run's records into `destination` whole or not at all (a staging folder renamed),
    so a run is skipped next time only when every record is there."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with staged(destination) as staging:
        staging.mkdir()
        if (run_dir / HYDRA).is_dir():
            shutil.copytree(run_dir / HYDRA, staging / HYDRA)
        for name in RECORDS:
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, staging / name)
        shutil.copy2(console, staging / CONSOLE)


def _dry_run(runs: list[Run]) -> int:
    """Every run's config validated by `tepo train --dry-run` in a scratch run directory."""
    failed = []
    with tempfile.TemporaryDirectory(prefix="tepo-protocol-") as scratch:
        for name, overrides in runs:
            command = [
                sys.executable,
                "-m",
                "tepo_cli",
                "train",
                *overrides,
                f"hydra.run.dir={Path(scratch) / name}",
                "--dry-run",
            ]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode == 0:
                print(f"{name}: valid")
            else:
                failed.append(name)
                print(f"{name}: invalid (exit {result.returncode})\n{result.stderr.strip()}")
    if failed:
        print(
            f"tepo protocol run --dry-run: {len(failed)} of {len(runs)} runs have an invalid "
            f"config ({', '.join(failed)}). Nothing was run.",
            file=sys.stderr,
        )
        return 2
    print(f"tepo protocol run --dry-run: all {len(runs)} runs are valid; nothing was trained.")
    return 0
