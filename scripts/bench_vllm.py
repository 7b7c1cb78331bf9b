"""rollout=vllm vs rollout=hf, the same job on both back-ends, each run in its own process.

    python scripts/bench_vllm.py eval [--limit 20]  # tepo eval: GSM8K (first 100) and arith
    python scripts/bench_vllm.py step [--steps 5]   # bench_step.py's training job, 30 steps
    python scripts/bench_vllm.py {step,eval} --smoke   # CI: model=tiny, a step or two

`eval` reads each `tepo eval` run's summary.json (samples/s from model load, accuracy, length);
`step` runs benchstep.tepo_side per back-end: median s/step over steps 2-N and its split, peak
RSS, the rollout-trainer log-prob gap. OUT/results.md is the table, OUT/results.json the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchlib.report import median, table
from benchlib.runner import child_env, log_tail, python_module, run_child, step_records
from benchstep.job import Job, resolve_model, save_tiny_model

from tepo_cli.data.required import require_prepared

BACKENDS = ("hf", "vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", choices=["eval", "step"])
    p.add_argument("--model", default="smollm2_135m", help="embedded model, a directory or hub id")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--limit", type=int, default=100, help="eval: GSM8K problems (default 100)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="eval: GSM8K answer limit")
    p.add_argument("--batch-size", type=int, default=64, help="eval: prompts per engine call")
    p.add_argument("--steps", type=int, default=30, help="step: optimizer steps (default 30)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    p.add_argument("--backends", default="hf,vllm", help="which back-ends (default hf,vllm)")
    p.add_argument("--out", type=Path, help="results directory (default outputs/bench_vllm/<time>)")
    p.add_argument("--smoke", action="store_true", help="CI: model=tiny, 2 steps or 2 problems")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.limit, args.max_new_tokens = 2, 2, 16
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not args.backends or not set(args.backends) <= set(BACKENDS):
        p.error("--backends takes hf, vllm or hf,vllm")
    args.threads = args.threads or len(os.sched_getaffinity(0))
    return args


def run(command: list[str], log: Path, args: argparse.Namespace) -> Any:
    result = run_child(command, log, child_env(args.threads, args.device))
    if result.returncode != 0:
        sys.exit(f"bench_vllm: exit {result.returncode}; {log}:\n{log_tail(log)}")
    return result


def model_dir(args: argparse.Namespace, out: Path) -> str:
    """The job's model directory: --smoke saves tepo's tiny model (model=tiny) as one."""
    if args.smoke:
        return save_tiny_model(out / "tiny_model")
    return resolve_model(args.model)


def eval_runs(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    model = ["model=hf", f"model.path={model_dir(args, out)}", f"model.dtype={args.dtype}"]
    settings = {
        "gsm8k": [
            "benchmark=gsm8k",
            f"eval.limit={args.limit}",
            f"eval.max_new_tokens={args.max_new_tokens}",
        ],
        "arith (held-out)": ["benchmark=arith"] + (["benchmark.eval_size=10"] * args.smoke),
    }
    rows = []
    for benchmark, overrides in settings.items():
        for backend in args.backends:
            name = f"{benchmark.split()[0]}_{backend}"
            print(f"tepo eval {benchmark} rollout={backend} …", flush=True)
            command = python_module(
                sys.executable,
                "tepo_cli",
                "eval",
                *model,
                *overrides,
                f"rollout={backend}",
                f"eval.batch_size={args.batch_size}",
                f"num_threads={args.threads}",
                f"hydra.run.dir={out / name}",
            )
            result = run(command, out / f"{name}.log", args)
            summary = json.loads((out / name / "summary.json").read_text())
            rows.append(
                {
                    "benchmark": benchmark,
                    "backend": backend,
                    "samples": summary["samples"],
                    "accuracy": summary["accuracy"],
                    "mean_length": summary["mean_length"],
                    "samples_per_second": summary["samples_per_second"],
                    "eval_seconds": summary["seconds"],
                    "wall_seconds": result.wall_seconds,
                    "peak_rss_bytes": result.peak_rss_bytes,
                }
            )
            print(
                f"  accuracy {summary['accuracy']:.3f}, {summary['samples_per_second']:.3f} "
                f"samples/s, wall {result.wall_seconds:.0f} s",
                flush=True,
            )
    return rows


def step_runs(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    job = Job(
        model=model_dir(args, out),
        steps=args.steps,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
    )
    rows = []
    for backend in args.backends:
        run_dir = out / f"step_{backend}"
        overrides = [f"rollout={backend}" if o == "rollout=hf" else o for o in job.tepo_overrides()]
        print(f"tepo train (bench_step job) rollout={backend} …", flush=True)
        command = python_module(
            sys.executable,
            "benchstep.tepo_side",
            str(out / f"step_{backend}.probes.jsonl"),
            *overrides,
            f"hydra.run.dir={run_dir}",
        )
        result = run(command, out / f"step_{backend}.log", args)
        steps = [m for m in step_records(run_dir) if "step_seconds" in m][1:]  # 1 warms up
        rows.append(
            {
                "backend": backend,
                "steps": len(steps) + 1,
                "median_step_seconds": median(m.get("step_seconds") for m in steps),
                "rollout_seconds": median(m.get("rollout_seconds") for m in steps),
                "sync_seconds": median(m.get("sync_seconds") for m in steps),
                "update_seconds": median(m.get("update_seconds") for m in steps),
                "scoring_seconds": median(m.get("score_seconds") for m in steps),
                "mismatch_abs_max": max((m.get("mismatch_abs_max", 0.0) for m in steps), default=0),
                "final_reward_mean": statistics.mean(m["reward_mean"] for m in steps[-10:]),
                "wall_seconds": result.wall_seconds,
                "peak_rss_bytes": result.peak_rss_bytes,
            }
        )
        print(f"  median {rows[-1]['median_step_seconds']:.2f} s/step", flush=True)
    return rows


def results_table(rows: list[dict[str, Any]]) -> str:
    return table(list(rows[0]), ([_cell(k, v) for k, v in row.items()] for row in rows))


def ratios(rows: list[dict[str, Any]], key: str, group: str | None) -> list[str]:
    """vllm / hf of `key` within each group (benchmark) of rows."""
    out = []
    groups = sorted({r[group] for r in rows}) if group else [None]
    for name in groups:
        part = {r["backend"]: r for r in rows if group is None or r[group] == name}
        if {"hf", "vllm"} <= set(part) and part["hf"][key]:
            label = f"{name}: " if name else ""
            out.append(f"{label}{key} vllm/hf = {part['vllm'][key] / part['hf'][key]:.2f}x")
    return out


def _cell(key: str, value: Any) -> str:
    if key.endswith("_bytes"):
        return f"{value / 1e9:.2f} GB"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 else f"{value:.3f}"
    return str(value)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.mode == "eval":  # its GSM8K rows read the prepared test split
        require_prepared([("gsm8k", "test")], "bench_vllm.py eval")
    out = args.out or Path("outputs/bench_vllm") / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "eval":
        rows = eval_runs(args, out)
        notes = ratios(rows, "samples_per_second", "benchmark")
    else:
        rows = step_runs(args, out)
        notes = ratios(rows, "median_step_seconds", None) + ratios(rows, "rollout_seconds", None)
    text = f"{results_table(rows)}\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(text)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, default=str))


if __name__ == "__main__":
    main()
