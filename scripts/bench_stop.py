"""What `rollout.stop` saves: the same word_math job with and without a stop rule, one after the
other, each `tepo train` in a process of its own, no evaluation or checkpoints; steps 2-N of each
run pooled (the first warms up).

    python scripts/bench_stop.py --model-path DIR [--steps 4 --out OUT] [OVERRIDE...]
    python scripts/bench_stop.py --smoke --out OUT     # CI: model=tiny, rollout=hf, 2 steps

A model that has learnt the answer format (a trained run's `final/`) shows what the rule cuts:
the untrained model rarely writes "The answer is". OUT/results.md is the table, OUT/results.json
every step's record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchlib.report import median, table
from benchlib.runner import log_tail, parse_timed_steps, run_child, step_records

REPO = Path(__file__).resolve().parent.parent
# word_math's answer line ("The answer is 12.") ends the answer; "The answer is N." (the
# untrained model's echo of its instructions) does not: a number must follow the string
ANSWER_LINE = [
    "rollout.stop=[The answer is,the answer is]",
    "rollout.stop_at=line",
    "rollout.stop_pattern=\\d",
]
ARMS = {"free": [], "stop": ANSWER_LINE}
QUIET = [
    "trainer.eval_before=false",
    "trainer.eval_after=false",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.save_final=false",
    "trainer.progress=false",
]
SMOKE = ["model=tiny", "rollout=hf", "trainer.prompts_per_step=2", "rollout.max_new_tokens=16"]
SMOKE_ARMS = {"free": [], "stop": ["rollout.stop=[e]"]}  # the random tiny model writes an "e"
KEYS = ("step_seconds", "rollout_seconds", "score_seconds", "update_seconds", "response_length")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", help="the policy to start from (model.path)")
    p.add_argument("--out", type=Path, help="results directory (default outputs/bench_stop/<time>)")
    p.add_argument("overrides", nargs="*", help="more tepo train overrides for both arms")
    return parse_timed_steps(p, argv)


def run_arm(args: argparse.Namespace, name: str, arm: list[str], out: Path) -> dict[str, Any]:
    job = SMOKE if args.smoke else ["recipe=word_math"]
    model = [f"model.path={args.model_path}"] if args.model_path else []
    run_dir = out / "runs" / name
    overrides = [*job, *model, f"trainer.max_steps={args.steps}", *QUIET, *arm, *args.overrides]
    command = [sys.executable, "-m", "tepo_cli", "train", *overrides, f"hydra.run.dir={run_dir}"]
    print(f"bench_stop: {name}: tepo train {' '.join(overrides)}", flush=True)
    child = run_child(command, out / f"{name}.log", cwd=REPO)
    if child.returncode != 0:
        sys.exit(f"bench_stop: {name} failed (exit {child.returncode}):\n{log_tail(child.log)}")
    steps = step_records(run_dir)
    timed = steps[1:]
    row: dict[str, Any] = {key: median(s.get(key) for s in timed) for key in KEYS}
    row["truncated_frac"] = median(s.get("truncated_frac") for s in timed)
    row["reward_mean"] = median(s.get("reward_mean") for s in timed)
    return {"name": name, "overrides": overrides, "summary": row, "steps": steps}


def render(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    cols = [*KEYS, "truncated_frac", "reward_mean"]
    rows = [[run["name"], *(_fmt(run["summary"][c]) for c in cols)] for run in runs]
    free, stop = (run["summary"] for run in runs)
    rows.append(["stop / free", *(_fmt(_ratio(stop[c], free[c])) for c in KEYS), "", ""])
    title = (
        f"medians of steps 2-{args.steps} of each run"
        f"{' (smoke: numbers meaningless)' if args.smoke else ''}; model.path="
        f"{args.model_path or 'the preset'}"
    )
    return title + "\n\n" + table(["", *cols], rows) + "\n"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}" if abs(value) < 1e-2 else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or REPO / "outputs" / "bench_stop" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    arms = SMOKE_ARMS if args.smoke else ARMS
    runs = [run_arm(args, name, arm, out) for name, arm in arms.items()]
    text = render(runs, args)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(runs, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
