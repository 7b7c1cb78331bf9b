"""scripts/bench_step.py's command line: its options, the presets that fill in the job (the CPU
or GPU mode, the long job, the smoke run; the rest are benchstep.job.Job's defaults), and the
checks made before anything runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from benchstep.long_job import SIDES as LONG_SIDES

CPU_DEFAULTS: dict[str, Any] = {"model": "smollm2_135m", "device": "cpu", "dtype": "float32"}
# GPU mode: untested here (no GPU on the development machine).
GPU_DEFAULTS: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "device": "cuda",
    "dtype": "bfloat16",
    "max_new_tokens": 128,
    "prompts_per_step": 8,
    "generations": 8,
    "digits": 3,
    "eval_size": 100,
}


LONG_DEFAULTS: dict[str, Any] = {
    "steps": 4,
    "max_new_tokens": 512,
    "temperature": 1.0,
    "sides": "tepo-hf,tepo-vllm,trl",
    # TRL at its own defaults for memory (GRPOConfig: per_device_train_batch_size 8, gradient
    # checkpointing on): with the whole batch in one forward it runs out of memory.
    "trl_micro_batch": 8,
    "trl_gradient_checkpointing": True,
}
SMOKE_DEFAULTS: dict[str, Any] = {"steps": 2, "max_new_tokens": 8, "eval_size": 10}
LONG_SMOKE_DEFAULTS: dict[str, Any] = {
    "steps": 1,
    "max_new_tokens": 24,
    "generations": 4,
    "trl_micro_batch": 4,  # two TRL micro-batches: its accumulation path runs too
    # the tiny model answers nothing right, so every advantage is 0: the update runs anyway,
    # for the smoke to check its columns (benchstep.job.Job.skip_zero_advantage)
    "skip_zero_advantage": False,
}


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """bench_step.py's options, with the presets of the job, mode and smoke run filled in."""
    p = _parser(description)
    args = p.parse_args(argv)
    presets = [SMOKE_DEFAULTS] if args.smoke else []
    if args.job == "long":
        presets = [LONG_SMOKE_DEFAULTS] * args.smoke + [LONG_DEFAULTS]
    presets += [
        GPU_DEFAULTS if args.gpu else CPU_DEFAULTS,
        {"threads": len(os.sched_getaffinity(0))},
    ]
    for preset in presets:
        for key, value in preset.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
    if args.sides is None:
        args.sides = "tepo,trl"
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    allowed = set(LONG_SIDES) if args.job == "long" else {"tepo", "trl"}
    if not set(args.sides) <= allowed or not args.sides:
        p.error(f"--sides of --job {args.job} takes a comma-separated subset of {sorted(allowed)}")
    if args.memory_limit_gb is None:
        args.memory_limit_gb = min(20.0, 0.85 * available_memory_gb())
    if args.memory_limit_gb <= 0:
        p.error("--memory-limit-gb must be positive (GB of resident memory per side)")
    return args


def _parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--job", choices=["short", "long"], default="short", help="(default short)")
    p.add_argument(
        "--smoke", action="store_true", help="CI smoke run: model=tiny, 2 steps (long job: 1)"
    )
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        help="long job: resident memory per side (default 20, or 85%% of the memory available "
        "at start where that is less, so a side cannot take the machine down)",
    )
    p.add_argument(
        "--trl-generation",
        choices=["auto", "vllm", "generate"],
        default="auto",
        help="long job: TRL's colocated vLLM, its generate, or auto (vLLM, generate if it fails)",
    )
    p.add_argument(
        "--host-allocator",
        choices=["auto", "glibc", "jemalloc", "tcmalloc", "mimalloc"],
        help="long job: tepo's trainer.host_allocator (default: tepo's own, auto)",
    )
    p.add_argument(
        "--update-every-step",
        dest="skip_zero_advantage",
        action="store_const",
        const=False,
        help="tepo updates on every step, rows without a gradient included, as TRL does\n"
        "(trainer.skip_zero_advantage=false): the update's speed and MFU on steps whose answers\n"
        "are all wrong, as a small model's long answers mostly are (default: tepo's own skip)",
    )
    p.add_argument(
        "--tepo-override",
        dest="tepo_overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="long job: one more `tepo train` override for every tepo side, repeatable\n"
        "(e.g. rollout.engine.enforce_eager=false: vLLM's compiled engine)",
    )
    p.add_argument("--steps", type=int, help="optimizer steps per run (default 30; long: 4)")
    p.add_argument("--rounds", type=int, default=1, help="tepo, TRL alternations (default 1)")
    p.add_argument("--out", type=Path, help="results directory (default outputs/bench_step/<time>)")
    p.add_argument(
        "--sides",
        help="trainers to run (default tepo,trl; long: tepo-hf,tepo-vllm,trl, each also with "
        "-bf16 to train it in bfloat16, e.g. tepo-vllm-bf16,trl,trl-bf16)",
    )
    p.add_argument("--gpu", action="store_true", help="GPU mode preset: " + _preset(GPU_DEFAULTS))
    p.add_argument("--model", help="smollm2_135m (embedded), a model directory or a hub id")
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--no-eval", action="store_true", help="skip the accuracy evaluation")
    return p


def available_memory_gb() -> float:
    """MemAvailable of /proc/meminfo in GB (inf where there is none)."""
    meminfo = Path("/proc/meminfo")
    for line in meminfo.read_text().splitlines() if meminfo.exists() else []:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("inf")


def _preset(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def check_device(args: argparse.Namespace) -> None:
    """GPU mode needs a GPU; bfloat16 on a CPU would only measure slow bf16 matmuls."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "bench_step: --device cuda (or --gpu) needs a CUDA GPU and torch with CUDA; "
            f"this machine has none (torch {torch.__version__}). Run the CPU job without --gpu."
        )
    if args.device == "cpu" and args.dtype != "float32":
        sys.exit("bench_step: --gpu's bfloat16 is for --device cuda; the CPU job is float32.")
