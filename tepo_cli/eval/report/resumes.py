"""Which of a report's runs resumed from a checkpoint (summary.json's `resumed_after`, written by
`tepo train` at each resume: tepo_cli/train/setup.py).

Why. A run killed and resumed equals the uninterrupted run where the resume is exact (on the same
machine: docs/guides/resume.md), but a reader of a comparison should not have to take that on
trust: an audit of this project's own word_math sweep found resumed runs its page did not
mention. So a report names each resumed run and the steps it resumed after. The list is the final records'
lineage: a resume from a checkpoint older than an earlier resume replaces that branch's.
"""

from __future__ import annotations

from tepo_cli.eval.report.runs import Run


def resumed_after(run: Run) -> list[int]:
    found = (run.summary or {}).get("resumed_after")
    return [int(step) for step in found] if isinstance(found, list) else []


def resumed_note(run: Run) -> str | None:
    """'resumed after step 40, 70' for a run that resumed (None otherwise)."""
    steps = resumed_after(run)
    return f"resumed after step {', '.join(map(str, steps))}" if steps else None


def resumes_note(runs: list[Run]) -> str | None:
    """One sentence when any run resumed (None when none did, or none recorded it: runs from
    before `resumed_after` existed)."""
    resumed = [run for run in runs if resumed_after(run)]
    if not resumed:
        return None
    listed = "; ".join(f"{run.name} ({', '.join(map(str, resumed_after(run)))})" for run in resumed)
    return (
        f"{len(resumed)} of {len(runs)} runs resumed from a checkpoint (after step): {listed}. "
        "A resume on the machine the run trained on continues it exactly; see Machines for any "
        "that moved."
    )
