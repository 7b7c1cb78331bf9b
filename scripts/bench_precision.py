"""word_math step seconds in bfloat16 against float32, alternating, each run its own process.

    python scripts/bench_precision.py [--rounds 2 --steps 6 --out DIR] [OVERRIDE...]
    python scripts/bench_precision.py --smoke               # CI: model=tiny, rollout=hf, 2 steps

The same job once per precision a round (float32 first), no evaluation or checkpoints; steps 2-N
pooled per precision. Read the ratio bf16 / float32, not the seconds (`others_cores`: how busy the
rest of the machine was). OUT/results.md is the table, OUT/results.json every step's record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib.report import median, table
from benchlib.runner import parse_timed_steps, run_child, step_records

REPO = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "bfloat16")
SPLIT = ("step_seconds", "rollout_seconds", "score_seconds", "update_seconds")
QUALITY = ("mismatch_abs_mean", "mismatch_abs_max", "update_mfu", "entropy", "grad_norm")
SMOKE = (
    "model=tiny",
    "rollout=hf",
    "trainer.prompts_per_step=2",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "trainer.warmup_steps=0",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=1, help="float32, bf16 alternations (default 1)")
    p.add_argument(
        "--out", type=Path, help="results directory (default outputs/bench_precision/<time>)"
    )
    p.add_argument("overrides", nargs="*", help="more tepo train overrides for both sides")
    return parse_timed_steps(p, argv)


def job_overrides(args: argparse.Namespace, dtype: str, run_dir: Path) -> list[str]:
    base = [
        "recipe=word_math",
        f"model.dtype={dtype}",
        f"trainer.max_steps={args.steps}",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "trainer.save_final=false",
        f"hydra.run.dir={run_dir}",
    ]
    return [*base, *(SMOKE if args.smoke else ()), *args.overrides]


def busy_cores() -> float:
    """Cores the whole machine kept busy since boot, read now (for a before/after difference)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + values[4]
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


def run_one(args: argparse.Namespace, dtype: str, run_dir: Path, log: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "tepo_cli", "train", *job_overrides(args, dtype, run_dir)]
    busy = busy_cores()
    child = run_child(command, log, cwd=REPO)
    others = max(0.0, (busy_cores() - busy - child.cpu_seconds) / child.wall_seconds)
    return {
        "dtype": dtype,
        "exit": child.returncode,
        "wall_s": child.wall_seconds,
        "others_cores": others,
        "steps": step_records(run_dir),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per precision: medians over the pooled steps 2..N of every round."""
    found: dict[str, dict[str, float]] = {}
    for dtype in DTYPES:
        steps = [s for run in runs if run["dtype"] == dtype for s in run["steps"][1:]]
        if not steps:
            continue
        row = {key: statistics.median(s.get(key, float("nan")) for s in steps) for key in SPLIT}
        # tokens_per_second is the step's generated tokens over its seconds: per rollout second
        rollout = [
            s["tokens_per_second"] * s["step_seconds"] / s["rollout_seconds"]
            for s in steps
            if s.get("rollout_seconds")
        ]
        row["rollout_tokens_per_s"] = statistics.median(rollout) if rollout else float("nan")
        for key in QUALITY:
            value = median(s.get(key) for s in steps)
            row[key] = float("nan") if value is None else value
        row["steps"] = len(steps)
        row["others_cores"] = max(run["others_cores"] for run in runs if run["dtype"] == dtype)
        found[dtype] = row
    return found


def render(summary: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    cols = [*SPLIT, "rollout_tokens_per_s", *QUALITY, "steps", "others_cores"]
    lines = [
        f"word_math step seconds by precision: {args.steps} steps a run (the first left out), "
        f"{args.rounds} round(s){' (smoke: numbers meaningless)' if args.smoke else ''}",
    ]
    rows = [[dtype, *(_fmt(row[c]) for c in cols)] for dtype, row in summary.items()]
    if len(summary) == 2:
        f32, b16 = summary["float32"], summary["bfloat16"]
        ratios = [_fmt(b16[c] / f32[c]) if f32[c] else "" for c in cols[:5]]
        rows.append(["bf16 / float32", *ratios, *[""] * (len(cols) - 5)])
    return "\n".join([*lines, "", table(["", *cols], rows)]) + "\n"


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return ""
    return f"{value:.3g}" if abs(value) < 1e-2 else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or REPO / "outputs" / "bench_precision" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for round_index in range(1, args.rounds + 1):
        for dtype in DTYPES:
            run_dir = out / "runs" / f"{dtype}-round{round_index}"
            if run_dir.exists():
                subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            print(f"bench_precision: round {round_index}, {dtype} ...", flush=True)
            run = run_one(args, dtype, run_dir, out / f"{dtype}-round{round_index}.log")
            runs.append(run)
            if run["exit"] != 0:
                print(
                    f"bench_precision: {dtype} failed (exit {run['exit']}); see its log",
                    file=sys.stderr,
                )
                return 1
    summary = summarize(runs)
    text = render(summary, args)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
