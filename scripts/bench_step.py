"""tepo vs TRL's GRPOTrainer on one job, each trainer in its own process (benchstep/).

    python scripts/bench_step.py                 # the CPU job (benchstep/job.py), 30 steps
    python scripts/bench_step.py --rounds 2      # tepo, TRL, tepo, TRL: steps 2-N pooled
    python scripts/bench_step.py --gpu           # GPU preset (bf16, Qwen2.5-0.5B-Instruct)
    python scripts/bench_step.py --job long      # long answers (benchstep/long_job.py)
    python scripts/bench_step.py --job long --sides tepo-vllm-bf16,trl,trl-bf16   # -bf16: bf16
    python scripts/bench_step.py --job long --update-every-step   # tepo updates on every step
    python scripts/bench_step.py --smoke [--job long]   # CI: model=tiny, 2 steps (long: 1)

OUT/results.md is the table (s/step and its split, peak RSS, reward, accuracy before → after,
tepo/TRL), OUT/results.json every step's numbers, OUT/<side>/round<r>.log the logs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from benchlib.report import gb, s, trl_version, version, versions
from benchlib.runner import (
    child_env,
    exit_on_sigterm,
    log_tail,
    python_module,
    read_jsonl,
    run_child,
)
from benchstep import report
from benchstep.job import (
    ISSUE_PROMPT,
    Job,
    compose_tepo_config,
    describe,
    resolve_model,
    save_tiny_model,
)
from benchstep.long_job import LongSettings, run_long, tepo_command, trl_command
from benchstep.options import CPU_DEFAULTS, check_device, parse_args

from tepo_cli.data.required import require_prepared


def make_job(args: argparse.Namespace, out: Path) -> Job:
    if args.smoke and args.model == CPU_DEFAULTS["model"]:
        model = save_tiny_model(out / "tiny_model")
    else:
        model = resolve_model(args.model)
    # every Job field the options and presets set, its default otherwise
    options = {f.name: getattr(args, f.name, None) for f in fields(Job)}
    options = {name: value for name, value in options.items() if value is not None}
    return Job(**{**options, "model": model})


def run_round(side: str, job: Job, out: Path, round_index: int) -> dict[str, Any]:
    """One trainer's round in its own process (tepo_side or trl_side): its steps and peaks."""
    run_dir = out / side / f"round{round_index}"
    probes, cuda = run_dir.with_suffix(".probes.jsonl"), run_dir.with_suffix(".cuda.json")
    if side == "tepo":
        command = tepo_command(probes, job.tepo_overrides(), run_dir)
    else:
        command = trl_command(out, run_dir)
    result = run_child(
        command, run_dir.with_suffix(".log"), child_env(job.threads, job.device, cuda)
    )
    if result.returncode != 0:
        sys.exit(
            f"bench_step: {side} failed (exit {result.returncode}); {result.log}:\n"
            + log_tail(result.log)
        )
    if side == "tepo":
        steps = report.tepo_steps(read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(probes))
    else:
        steps = report.trl_steps(read_jsonl(run_dir / "timings.jsonl"))
    return {
        "side": side,
        "run_dir": str(run_dir),
        "model_dir": str(run_dir / "final"),
        "steps": steps,
        "peak_rss_bytes": result.peak_rss_bytes,
        "peak_cuda_bytes": json.loads(cuda.read_text())["max_allocated_bytes"]
        if cuda.exists()
        else None,
        "wall_seconds": result.wall_seconds,
        "returncode": result.returncode,
    }


def train_all(job: Job, args: argparse.Namespace, out: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"tepo": [], "trl": []}
    for round_index in range(args.rounds):
        for side in args.sides:
            print(f"[round {round_index + 1}/{args.rounds}] {side}: training …", flush=True)
            run = run_round(side, job, out, round_index)
            runs[side].append(run)
            median = report.summarize([run])["median_s"]
            print(
                f"  {len(run['steps'])} steps, median {s(median)} s/step (steps 2–), "
                f"peak RSS {gb(run['peak_rss_bytes'])}, wall {run['wall_seconds']:.0f} s",
                flush=True,
            )
    return runs


def evaluate_all(job: Job, runs: dict[str, list[dict[str, Any]]], out: Path) -> float | None:
    """Score the base model and every trained one in one process; fill accuracy_after."""
    trained = {
        f"{run['side']}{i}": run for side_runs in runs.values() for i, run in enumerate(side_runs)
    }
    models = {"base": job.model, **{name: run["model_dir"] for name, run in trained.items()}}
    print(f"evaluating {len(models)} models on {job.eval_size} held-out problems …", flush=True)
    files = [str(out / name) for name in ("job.json", "tepo_config.json", "eval.json")]
    command = python_module(sys.executable, "benchstep.evaluate", *files)
    command += [f"{name}={path}" for name, path in models.items()]
    result = run_child(command, out / "eval.log", child_env(job.threads, job.device))
    if result.returncode != 0:
        sys.exit(f"bench_step: evaluation failed; {result.log}:\n" + log_tail(result.log))
    scores = json.loads((out / "eval.json").read_text())
    for name, run in trained.items():
        run["accuracy_after"] = scores[name]["accuracy"]
    return scores["base"]["accuracy"]


def main_long(args: argparse.Namespace, job: Job, out: Path, trl: str | None) -> int:
    """The long-answer job (benchstep/long_job.py)."""
    exit_on_sigterm()
    settings = LongSettings(
        sides=tuple(args.sides),
        memory_limit_bytes=int(args.memory_limit_gb * 1e9),
        trl_generation=args.trl_generation,
        host_allocator=args.host_allocator,
        tepo_overrides=tuple(args.tepo_overrides),
    )
    print(f"model: {job.model}\nresults: {out}", flush=True)
    return run_long(
        job,
        settings,
        out,
        child_env(job.threads, job.device),
        {**versions(trl), "vllm": version("vllm")},
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    check_device(args)
    if args.tepo_overrides and args.job != "long":
        sys.exit("bench_step: --tepo-override applies to the long job only (--job long).")
    if args.job == "long":  # before any side starts: each would fail on it seconds later
        require_prepared([("math500", "train")], "bench_step.py --job long")
    trl = trl_version(sys.executable) if any(s.startswith("trl") for s in args.sides) else None
    out = (args.out or Path("outputs/bench_step") / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    if out.exists() and any(out.iterdir()):
        sys.exit(f"bench_step: {out} is not empty; give a new --out directory.")
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if args.device == "cpu" else "cuda")
    out.mkdir(parents=True, exist_ok=True)
    job = make_job(args, out)
    if args.job == "long":
        return main_long(args, job, out, trl)
    config = compose_tepo_config(job)
    if config.benchmark.prompt != ISSUE_PROMPT:
        print(
            f"bench_step: warning: tepo's arith prompt is {config.benchmark.prompt!r}, not the issue's"
        )
    job.save(out / "job.json")
    (out / "tepo_config.json").write_text(config.model_dump_json(indent=2) + "\n")
    print(f"model: {job.model}\nresults: {out}", flush=True)
    runs = train_all(job, args, out)
    before = None if args.no_eval else evaluate_all(job, runs, out)
    summaries = {side: report.summarize(side_runs) for side, side_runs in runs.items()}
    table = report.markdown(
        describe(job), summaries["tepo"], summaries["trl"], before, versions(trl)
    )
    (out / "results.md").write_text(table)
    results = {
        "job": describe(job),
        "versions": versions(trl),
        "accuracy_before": before,
        "summary": summaries,
        "ratios_tepo_over_trl": report.ratios(summaries["tepo"], summaries["trl"]),
        "runs": runs,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
