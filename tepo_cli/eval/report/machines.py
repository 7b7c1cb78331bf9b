"""Which machines a report's runs trained on (summary.json's `machines`, tepo_cli/core/machine.py)
and in which precision.

Seconds, tokens/s and MFU compare only between runs on one kind of processor, and a run that
moved continues on other arithmetic (bf16 rounds differently on AMX than on AVX-512 BF16), so a
report says when its runs did not all train on one machine, and which run moved where. Runs that
typed the same command can also have trained in different precisions (`model.dtype=auto` settles
per machine, tepo_cli/models/precision.py; config.yaml keeps what it settled), so a report says
when a group's seeds did.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tepo_cli.eval.report.runs import Run


def _label(machine: dict[str, Any]) -> str:
    """A processor as a reader tells them apart: its name, and the GPU where there is one."""
    accelerator = machine.get("accelerator")
    return f"{machine.get('cpu', '?')}" + (f" + {accelerator}" if accelerator else "")


def _machines(run: Run) -> list[dict[str, Any]]:
    found = (run.summary or {}).get("machines")
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def run_machine(run: Run) -> str | None:
    """The machine a run trained on, as a table cell ("A → B from step 95" for one that moved);
    None when it recorded none (runs from before `machines` existed)."""
    machines = _machines(run)
    if not machines:
        return None
    cells = [_label(machines[0])]
    cells += [f"{_label(m)} from step {m.get('from_step', 0)}" for m in machines[1:]]
    return " → ".join(cells)


def moved_note(run: Run) -> str | None:
    """'trained on A, then on B after step 95' for a run that changed machine (None otherwise)."""
    machines = _machines(run)
    if len({_label(m) for m in machines}) < 2:
        return None
    parts = [f"{_label(m)} after step {m.get('from_step', 0)}" for m in machines[1:]]
    return f"trained on {_label(machines[0])}, then on " + ", then on ".join(parts)


def machines_note(runs: list[Run]) -> str | None:
    """One sentence when the runs trained on more than one machine (None when they share one, or
    none recorded it: runs from before `machines` existed)."""
    counts = Counter(_label(m) for run in runs for m in _machines(run)[:1])
    moved = [run.name for run in runs if moved_note(run)]
    if len(counts) < 2 and not moved:
        return None
    unrecorded = sum(1 for run in runs if not _machines(run))
    listed = ", ".join(
        f"{label} ({count} run{'s' * (count > 1)})" for label, count in counts.items()
    )
    sentence = f"The runs started on {len(counts)} machine{'s' * (len(counts) > 1)}: {listed}"
    sentence += f"; {unrecorded} did not record one" if unrecorded else ""
    sentence += f"; moved during training: {', '.join(moved)}" if moved else ""
    return sentence + ". Compare seconds, tokens/s and MFU only between runs on one machine."


def precisions_note(groups: dict[str, list[Run]]) -> str | None:
    """One sentence when the runs of a group (label -> its runs) trained in more than one
    precision, naming them (None when every group trained in one). A run that recorded `auto`
    is from before the settled dtype was written: its precision is not known, so not compared."""
    mixed = []
    for label, runs in groups.items():
        by_dtype: dict[str, list[str]] = {}
        for run in runs:
            if (dtype := run.config.get("model.dtype")) not in (None, "auto"):
                by_dtype.setdefault(str(dtype), []).append(run.name)
        if len(by_dtype) > 1:
            each = "; ".join(f"{dtype}: {', '.join(names)}" for dtype, names in by_dtype.items())
            mixed.append(f"{label} ({each})")
    if not mixed:
        return None
    return (
        f"Runs of one group trained in different precisions (model.dtype as each run settled "
        f"it): {'; '.join(mixed)}. Their spread includes the precision's."
    )


def setup_note(runs: list[Run], groups: dict[str, list[Run]]) -> str | None:
    """What a reader must know of where and in what the runs trained: the two notes above."""
    notes = [note for note in (machines_note(runs), precisions_note(groups)) if note]
    return " ".join(notes) or None
