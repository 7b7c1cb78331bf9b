"""`tepo protocol run PROTOCOL.yaml --rerun RUN`: a published run trained again for its first
steps and compared with its records.

A pre-registered result rests on runs no reader watched being made. What a reader can check is
that a published run comes out the same when trained again from its own published overrides at
the pinned commit. The rerun trains in a scratch directory until it has logged STEPS steps, is
killed (SIGKILL to its process group), and its records are compared with the published ones:
every record of metrics.jsonl up to step STEPS (keys that measure time, rates or memory aside),
the logged answers of those steps, and any held-out evaluation both reached. It says how many are
equal and, where one differs, which keys — never a value: the records are outcomes, and the
experiment's analysis may still be ahead. Each rerun is a journal line, so the report lists it.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tepo_cli.core.errors import ConfigError
from tepo_cli.core.run_dir import EVAL_SAMPLES, EVALS, HYDRA, METRICS, SAMPLES
from tepo_cli.protocol.journal import EXPERIMENT, Journal
from tepo_cli.protocol.pilot import error_lines, train_until
from tepo_cli.protocol.run_progress import published, step_records
from tepo_cli.protocol.spec import Run, override_difference

# Keys whose values depend on the machine's speed or load, not on what the run computed.
TIMES = re.compile(r"seconds|per_second|mfu|peak_flops|rss|memory")
DEFAULT_STEPS = 3
# Overrides the runner adds to a run's command besides the protocol's: none changes a record.
_RUNNER_ONLY = ("resume", "trainer.progress", "trainer.time_limit_minutes")


def untimed(record: dict) -> dict:
    """The record without its times, inside nested records too (a summary's warm-up record)."""
    return {
        key: untimed(value) if isinstance(value, dict) else value
        for key, value in record.items()
        if not TIMES.search(key)
    }


def rerun(run: Run, published_in: Path, scratch: Path, journal: Journal, steps: int) -> int:
    """Train `run` again from `published_in`'s overrides until `steps` steps and compare; 0 when
    every compared record is equal, 1 when one differs, the run's exit code when it died first."""
    if not published(published_in):
        raise ConfigError(
            f"--rerun {run.name}: it is not published in {published_in} yet; a rerun is compared "
            "with a finished run's records. Nothing was run."
        )
    made = _published_overrides(run, published_in)
    run_dir, console = scratch / run.name, scratch / f"{run.name}.console.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "tepo_cli", "train", *made, f"hydra.run.dir={run_dir}"]
    print(f"== rerun of {run.name} until step {steps}: tepo train {' '.join(command[4:])}",
          flush=True)  # fmt: skip
    code = train_until(command, run_dir, steps, console)
    trained = len(step_records(run_dir))
    if trained < steps and (code != 0 or not trained):  # it died first (0: a shorter run ended)
        code = 128 - code if code < 0 else code or 1
        print(f"tepo protocol run --rerun: {run.name}'s rerun ended (exit {code}) before step "
              f"{steps}. Its console: {console}\n{error_lines(console)}", file=sys.stderr)  # fmt: skip
        journal.write(EXPERIMENT, "rerun", of_run=run.name, steps=steps, at=_at(journal),
                      outcome=f"exit {code}")  # fmt: skip
        return code
    steps = min(steps, trained)
    found = compare(published_in, run_dir, steps)
    equal = all(agreement.equal == agreement.compared for agreement in found.values())
    said = "; ".join(
        _said(name, agreement) for name, agreement in found.items() if agreement.compared
    )
    print(f"{run.name}, rerun of steps 1–{steps}: {said}", flush=True)
    outcome = "every compared record equal" if equal else "records differed"
    journal.write(EXPERIMENT, "rerun", of_run=run.name, steps=steps, at=_at(journal),
                  outcome=outcome)  # fmt: skip
    if equal:
        shutil.rmtree(run_dir)
        console.unlink()
        return 0
    print(f"tepo protocol run --rerun: {run.name}'s rerun differs from its published records; "
          f"the rerun is kept in {run_dir}.", file=sys.stderr)  # fmt: skip
    return 1


def _at(journal: Journal) -> str:
    """The code the rerun trained with, as the report names it."""
    return (journal.checkout.commit or "")[:7] or "(no git checkout)"


def _published_overrides(run: Run, published_in: Path) -> list[str]:
    """The overrides the run was made with (its .hydra/overrides.yaml) less `resume` and a
    --time-limit's, and the console's progress line off; a note where they are not the protocol's for it."""
    path = published_in / HYDRA / "overrides.yaml"
    try:
        made = [str(o) for o in yaml.safe_load(path.read_text()) or []]
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(
            f"--rerun {run.name}: cannot read the overrides it was made with ({path}: {error}); "
            "a rerun trains from them. Nothing was run."
        ) from None
    made = [o for o in made if o.split("=", 1)[0] not in _RUNNER_ONLY]
    difference = override_difference(made, run.overrides, ("made", "registered"))
    if difference is not None:
        print(f"== note: {run.name} was made with overrides the protocol does not give it "
              f"({difference}); the rerun uses what it was made with", flush=True)  # fmt: skip
    return [*made, "trainer.progress=false"]


@dataclass(frozen=True)
class Agreement:
    """One file's records of a rerun beside the published ones, compared on the keys both have
    (code at another commit may log keys the published run's did not)."""

    compared: int  # records both have
    equal: int  # of them, equal in every key both have
    keys: int  # the distinct keys compared
    differing: tuple[str, ...]  # the first unequal record's keys whose values differ
    only_published: tuple[str, ...]  # keys of published records that their rerun's lack
    only_rerun: tuple[str, ...]


def compare(before: Path, after: Path, steps: int) -> dict[str, Agreement]:
    """File -> how its records up to step `steps` that both runs have agree."""
    found = {}
    for name in (METRICS, SAMPLES, EVALS, EVAL_SAMPLES):
        published, again = (_up_to(run / name, steps, name == METRICS) for run in (before, after))
        pairs = list(zip(published, again, strict=False))
        shared = [x.keys() & y.keys() for x, y in pairs]
        unequal = [sorted(k for k in x.keys() & y.keys() if x[k] != y[k]) for x, y in pairs]
        found[name] = Agreement(
            len(pairs),
            sum(not keys for keys in unequal),
            len(set().union(*shared)),
            tuple(next((keys for keys in unequal if keys), [])),
            tuple(sorted({k for x, y in pairs for k in x if k not in y})),
            tuple(sorted({k for x, y in pairs for k in y if k not in x})),
        )
    return found


def _up_to(path: Path, steps: int, through_last: bool) -> list[dict]:
    """The file's records (times aside) of steps up to `steps`; `through_last` (metrics.jsonl):
    every record up to the one of step `steps`, those before the first step included (a warm-up)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    records = [untimed(json.loads(line)) for line in lines if line.strip()]
    if not through_last:
        return [r for r in records if int(r.get("step", 0)) <= steps]
    kept = []
    for record in records:
        kept.append(record)
        if record.get("step") == steps:
            break
    return kept


def _said(name: str, found: Agreement) -> str:
    what = {METRICS: "records", SAMPLES: "answers"}.get(name, "rows")
    text = (
        f"{name} {found.equal} of {found.compared} {what} equal in the {found.keys} keys both have"
    )
    extra = [f"the first that differs: {', '.join(found.differing)}"] if found.differing else []
    for side, keys in (("published", found.only_published), ("rerun", found.only_rerun)):
        if keys:
            extra.append(f"keys only the {side} records have: {', '.join(keys)}")
    return text + (f" ({'; '.join(extra)})" if extra else "")
