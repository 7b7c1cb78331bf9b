"""Train each objective with the same budget (one Hydra multirun) and print a comparison table.

    python scripts/compare_objectives.py --out runs/compare [OVERRIDE...]   # given to every job
    python scripts/compare_objectives.py --out runs/smoke --smoke    # CI: grpo and gspo, tiny

<out>/comparison.md: per objective, accuracy before -> after, the last five steps' mean reward,
median s/step, DAPO's dropped-group share; a failed run is listed as failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib.report import table
from benchlib.runner import read_jsonl

OBJECTIVES = ("grpo", "dapo", "gspo", "tepo", "mpo", "mpo_exact", "mpo_disjoint")
# --smoke: the multirun and the table on two objectives (each objective's training has its own
# tests), the tiny model, one step, a 10-problem evaluation.
SMOKE_OBJECTIVES = "grpo,gspo"
HEADER = [
    "objective",
    "held-out accuracy before → after",
    "reward, last 5 steps",
    "median s/step",
    "dropped groups",
]
SMOKE_OVERRIDES = ["model=tiny", "trainer.max_steps=1", "benchmark.eval_size=10"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the multirun directory to write")
    parser.add_argument("--objectives", help="comma-separated presets (default: all)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"CI smoke run: {SMOKE_OBJECTIVES}, " + " ".join(SMOKE_OVERRIDES),
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every job")
    args = parser.parse_args()
    if args.smoke:
        args.overrides = [*SMOKE_OVERRIDES, *args.overrides]
    if args.objectives is None:
        args.objectives = SMOKE_OBJECTIVES if args.smoke else ",".join(OBJECTIVES)
    command = [
        sys.executable,
        "-m",
        "tepo_cli",
        "train",
        "-m",
        f"algo={args.objectives}",
        f"hydra.sweep.dir={args.out.resolve()}",
        "hydra.sweep.subdir=${algo.name}",
        "trainer.progress=false",
        *args.overrides,
    ]
    print(" ".join(command[2:]), flush=True)
    code = subprocess.call(command)
    table = comparison_table(args.out, args.objectives.split(","))
    (args.out / "comparison.md").write_text(table + "\n")
    print(table)
    return code


def comparison_table(root: Path, objectives: list[str]) -> str:
    rows = []
    for name in objectives:
        run = root / name
        summary_file = run / "summary.json"
        if not summary_file.is_file():
            rows.append([name, f"failed or unfinished (see {run})", "", "", ""])
            continue
        summary = json.loads(summary_file.read_text())
        metrics = [
            m for m in read_jsonl(run / "metrics.jsonl") if "reward_mean" in m
        ]  # steps, not MPO's MTP warm-up rows
        last = metrics[-5:]
        reward = statistics.mean(m["reward_mean"] for m in last)
        dropped = statistics.mean(m.get("dropped_group_frac", 0.0) for m in metrics)
        before, after = summary.get("eval_before"), summary.get("eval_after")
        accuracy = (
            f"{before:.2f} → {after:.2f} ({(after - before) * 100:+.0f})"
            if before is not None and after is not None
            else "-"
        )
        step = summary["median_step_seconds"]
        rows.append([name, accuracy, f"{reward:.2f}", f"{step:.1f}", f"{dropped:.0%}"])
    return table(HEADER, rows)


if __name__ == "__main__":
    sys.exit(main())
