"""`tepo protocol run PROTOCOL.yaml --pilot N`: each arm's command for N steps before its turn.

A pre-registered experiment spends hours of a machine per run; an arm that crashes at its first
step, or runs out of memory, or takes three times the planned time, is better found before its
turn. A pilot trains the arm's first run exactly as registered, with two changes: a seed that no
registered run uses (`pilot_seed`), and no held-out evaluation or checkpoint (the registered
runs' evaluations are the outcomes; a pilot reads none). It is stopped (SIGKILL to its process
group) once N training steps are logged, its directory is deleted, and what it says is only
seconds and memory: a warm-up before the first step (MPO's modules'), each step's seconds, the
peak RSS. Its console (rewards included) goes to a file that is deleted with it, kept only when
the pilot fails. Each pilot is a line of the journal, so the results page can say that one ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tepo_cli.core.run_dir import METRICS
from tepo_cli.protocol.journal import EXPERIMENT, Journal
from tepo_cli.protocol.run_progress import duration, step_records
from tepo_cli.protocol.spec import Protocol, Run

# Overrides a pilot replaces: the seed, and nothing evaluated or saved while it runs.
QUIET = {
    "trainer.eval_before": "false",
    "trainer.eval_every": "0",
    "trainer.save_every": "0",
    "trainer.progress": "false",
}


def pilot_seed(protocol: Protocol) -> int:
    """A seed no registered run uses, and no later one likely will (a sixth pair takes max + 1)."""
    return max(protocol.seeds) + 1000


def pilot_overrides(run: Run, seed: int, run_dir: Path) -> list[str]:
    """The run's overrides with QUIET's keys, its seed and its directory replaced (Hydra refuses
    a key given twice, so a replaced key is dropped from where it stood)."""
    replaced = {**QUIET, "seed": str(seed), "hydra.run.dir": str(run_dir)}
    kept = [o for o in run.overrides if o.split("=", 1)[0].lstrip("+~") not in replaced]
    return [*kept, *(f"{key}={value}" for key, value in replaced.items())]


def run_pilots(
    protocol: Protocol, runs: list[Run], runs_dir: Path, journal: Journal, steps: int
) -> int:
    """One pilot per arm among `runs` (its first run's command), one after another; 0 when all
    logged `steps` steps, else the first failure's exit code (the others still run)."""
    seed = pilot_seed(protocol)
    arm_of = {protocol.run_name(a, s): a for a in protocol.arms for s in protocol.seeds}
    firsts: dict[str, Run] = {}
    for run in runs:
        firsts.setdefault(arm_of[run.name], run)
    failed = 0
    paces: dict[str, float] = {}
    for arm, run in firsts.items():
        code, found = _pilot(run, seed, runs_dir / ".pilot" / arm, steps)
        journal.write(EXPERIMENT, "pilot", arm=arm, of_run=run.name, seed=seed, steps=steps,
                      exit_code=code, **found)  # fmt: skip
        if code != 0:
            failed = failed or code
            continue
        paces[arm] = found["median_step_seconds"]
        print(f"{arm}: {_measured_said(run.name, seed, found)}", flush=True)
    print(_estimate(runs, arm_of, paces), flush=True)
    with contextlib.suppress(OSError):  # empty unless a failed pilot's console is kept there
        (runs_dir / ".pilot").rmdir()
    return failed


def _pilot(run: Run, seed: int, run_dir: Path, steps: int) -> tuple[int, dict[str, float]]:
    """Train until `steps` step records are logged, then kill; (exit code, what it measured)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    console = run_dir.parent / f"{run_dir.name}.console.log"
    command = [sys.executable, "-m", "tepo_cli", "train", *pilot_overrides(run, seed, run_dir)]
    print(f"== pilot of {run.name} at seed {seed}, {steps} steps: tepo train "
          f"{' '.join(command[4:])}", flush=True)  # fmt: skip
    code = train_until(command, run_dir, steps, console)
    records, found = step_records(run_dir), _measured(run_dir)
    if len(records) >= steps or (code == 0 and records):  # killed at N, or a shorter run ended
        shutil.rmtree(run_dir, ignore_errors=True)
        console.unlink()
        return 0, found
    code = 128 - code if code < 0 else code or 1  # a shell's numbers; 1: ended with no step
    print(
        f"tepo protocol run --pilot: the pilot of {run.name} ended (exit {code}) after "
        f"{len(records)} of {steps} steps. Its console: {console}\n{error_lines(console)}",
        file=sys.stderr,
        flush=True,
    )
    return code, found


def train_until(command: list[str], run_dir: Path, steps: int, console: Path) -> int:
    """Run the `tepo train` `command` (its console into `console`, never shown) until `run_dir`'s
    metrics.jsonl holds `steps` step records, then SIGKILL its process group; its exit code."""
    with console.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while process.poll() is None and len(step_records(run_dir)) < steps:
                time.sleep(1.0)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
    return code


def _measured(run_dir: Path) -> dict[str, float]:
    """Seconds and memory from metrics.jsonl, nothing else of it: a warm-up's seconds (the records
    before the first step, with a `..._warmup_seconds` key counted cumulatively), each step's
    seconds and the highest peak RSS."""
    path = run_dir / METRICS
    lines = path.read_text().splitlines() if path.is_file() else []
    records = [json.loads(line) for line in lines if line.strip()]
    warmup = [
        value
        for record in records
        if "step" not in record
        for key, value in record.items()
        if key.endswith("warmup_seconds")
    ]
    seconds = [r["step_seconds"] for r in records if "step" in r and "step_seconds" in r]
    rss = [r["peak_rss_mb"] for r in records if "peak_rss_mb" in r]
    found = {"warmup_seconds": max(warmup)} if warmup else {}
    if seconds:
        found |= {"median_step_seconds": statistics.median(seconds), "min_step_seconds":
                  min(seconds), "max_step_seconds": max(seconds)}  # fmt: skip
    return found | ({"peak_rss_mb": max(rss)} if rss else {})


def _measured_said(name: str, seed: int, found: dict[str, float]) -> str:
    parts = [f"pilot of {name} at seed {seed}"]
    if "warmup_seconds" in found:
        parts.append(f"warm-up {found['warmup_seconds']:.0f} s")
    low, high = found["min_step_seconds"], found["max_step_seconds"]
    spread = f"{low:.0f}–{high:.0f} s" if round(low) != round(high) else f"{low:.0f} s"
    parts.append(f"a step {spread} (median {found['median_step_seconds']:.0f} s)")
    if "peak_rss_mb" in found:
        parts.append(f"peak RSS {found['peak_rss_mb'] / 1024:.1f} GB")
    return "; ".join(parts)


def _estimate(runs: list[Run], arm_of: dict[str, str], paces: dict[str, float]) -> str:
    """The selected runs' training steps at their arm's pilot pace, where both are known."""
    total, counted = 0.0, 0
    for run in runs:
        planned = [o.split("=", 1)[1] for o in run.overrides if o.startswith("trainer.max_steps=")]
        if arm_of[run.name] in paces and planned:
            total += paces[arm_of[run.name]] * int(planned[-1])
            counted += 1
    if not counted:
        return (
            "tepo protocol run --pilot: no estimate (no pilot finished, or no run sets "
            "trainer.max_steps)"
        )
    return (
        f"tepo protocol run --pilot: at these paces, {counted} of the {len(runs)} selected runs "
        f"need {duration(total)} of training steps (evaluations and warm-ups aside). "
        "A pilot's steps are the untrained model's: later steps are longer where answers grow."
    )


def error_lines(console: Path) -> str:
    """The console's error lines (a refusal's paragraph, an exception's last line), never its
    step lines (they carry rewards)."""
    lines = console.read_text(errors="replace").splitlines() if console.is_file() else []
    wanted = [
        line
        for line in lines
        if line.startswith("tepo train:") or "Error" in line or "Killed" in line
    ]
    return "\n".join(wanted[-12:])
