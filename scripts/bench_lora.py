"""LoRA vs full fine-tuning on the embedded default job (`tepo train`), each run in its own process.

    python scripts/bench_lora.py [--vllm]   # learning runs (30 steps), memory runs (5 steps);
                                            # --vllm: also each weight sync's seconds
    python scripts/bench_lora.py --smoke    # CI: every run on model=tiny, 1 step each

Learning runs: full vs `model.lora.r=8`, accuracy before -> after, s/step, trainable parameters,
peak RSS. Memory runs: each with and without the KL term (algo.beta=0 loads no reference), so the
reference's cost reads off as a difference. OUT/results.md and OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchlib.report import median
from benchlib.runner import log_tail, run_child, step_records

LORA = ["model.lora.r=8"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="learning runs' steps (default 30)")
    p.add_argument("--memory-steps", type=int, default=5, help="memory runs' steps (default 5)")
    p.add_argument("--vllm", action="store_true", help="also time rollout=vllm's weight sync")
    p.add_argument("--out", type=Path, help="results directory (default outputs/bench_lora/<time>)")
    p.add_argument("--smoke", action="store_true", help="model=tiny, 1 step per run (CI)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.memory_steps = 1, 1
    return args


SMOKE = ["model=tiny", "benchmark.eval_size=10"]


def train(out: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """One `tepo train` in a child process; its summary and per-step records."""
    run_dir = out / name
    command = [sys.executable, "-m", "tepo_cli", "train", *overrides, "trainer.progress=false"]
    result = run_child([*command, f"hydra.run.dir={run_dir}"], out / f"{name}.log")
    if result.returncode != 0:
        sys.exit(f"{name} failed ({result.returncode}):\n{log_tail(result.log)}")
    steps = step_records(run_dir)
    timed = steps[1:] or steps  # the first step warms up
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "name": name,
        "overrides": overrides,
        "wall_seconds": result.wall_seconds,
        "trainable_parameters": summary["trainable_parameters"],
        "policy_parameters": summary["policy_parameters"],
        "eval_before": summary.get("eval_before"),
        "eval_after": summary.get("eval_after"),
        **{
            f"median_{key}": median(r[key] for r in timed)
            for key in ("step_seconds", "sync_seconds", "rollout_seconds", "update_seconds")
        },
        "peak_rss_mb": max(r["peak_rss_mb"] for r in steps),
    }


def runs(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    learning = [f"trainer.max_steps={args.steps}"]
    quiet = [
        f"trainer.max_steps={args.memory_steps}",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.save_final=false",
        "trainer.save_every=0",
    ]
    plan = [
        ("full", learning),
        ("lora_r8", [*learning, *LORA]),
        ("full_kl", quiet),
        ("full_no_kl", [*quiet, "algo.beta=0"]),
        ("lora_r8_kl", [*quiet, *LORA]),
        ("lora_r8_no_kl", [*quiet, *LORA, "algo.beta=0"]),
    ]
    if args.vllm:
        vllm = ["rollout=vllm", "trainer.max_steps=3", *quiet[1:]]
        plan += [("full_vllm", vllm), ("lora_r8_vllm", [*vllm, *LORA])]
    if args.smoke:
        plan = [(name, [*SMOKE, *overrides]) for name, overrides in plan]
    for name, overrides in plan:
        print(f"{name}: tepo train {' '.join(overrides)}", flush=True)
    # Measured runs go one at a time (each alone on the machine); a smoke run's numbers mean
    # nothing, so its runs go two at a time.
    with ThreadPoolExecutor(max_workers=2 if args.smoke else 1) as pool:
        return list(pool.map(lambda item: train(out, *item), plan))


def table(results: list[dict[str, Any]]) -> str:
    by = {r["name"]: r for r in results}
    full, lora = by["full"], by["lora_r8"]
    lines = [
        "| | full fine-tuning | LoRA r=8 (`model.lora.r=8`) | LoRA / full |",
        "|---|---|---|---|",
        f"| trainable parameters | {full['trainable_parameters']:,} | "
        f"{lora['trainable_parameters']:,} | "
        f"{lora['trainable_parameters'] / full['trainable_parameters']:.4f} |",
        f"| held-out accuracy, before -> after | {full['eval_before']:.3f} -> "
        f"{full['eval_after']:.3f} | {lora['eval_before']:.3f} -> {lora['eval_after']:.3f} | |",
        _ratio_row("median s/step", full, lora, "median_step_seconds", "{:.2f}"),
        _ratio_row("  of which rollout (s)", full, lora, "median_rollout_seconds", "{:.2f}"),
        _ratio_row("  of which update (s)", full, lora, "median_update_seconds", "{:.2f}"),
        _ratio_row("peak RSS (MB), learning run", full, lora, "peak_rss_mb", "{:,.0f}"),
        _ratio_row(
            "peak RSS (MB), KL term on", by["full_kl"], by["lora_r8_kl"], "peak_rss_mb", "{:,.0f}"
        ),
        _ratio_row(
            "peak RSS (MB), algo.beta=0",
            by["full_no_kl"],
            by["lora_r8_no_kl"],
            "peak_rss_mb",
            "{:,.0f}",
        ),
        f"| the reference's cost (MB: KL on - off) | "
        f"{by['full_kl']['peak_rss_mb'] - by['full_no_kl']['peak_rss_mb']:,.0f} | "
        f"{by['lora_r8_kl']['peak_rss_mb'] - by['lora_r8_no_kl']['peak_rss_mb']:,.0f} | |",
    ]
    if "full_vllm" in by:
        lines.append(
            _ratio_row(
                "rollout=vllm: median sync (s)",
                by["full_vllm"],
                by["lora_r8_vllm"],
                "median_sync_seconds",
                "{:.3f}",
            )
        )
    return "\n".join(lines) + "\n"


def _ratio_row(label: str, full: dict, lora: dict, key: str, fmt: str) -> str:
    return (
        f"| {label} | {fmt.format(full[key])} | {fmt.format(lora[key])} | "
        f"{lora[key] / full[key]:.2f} |"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out or Path("outputs/bench_lora") / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    results = runs(args, out)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    text = table(results)
    (out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
