"""The first thing to run on a GPU node: every path a GPU user takes, a few steps each, one verdict.

    bash scripts/gpu_check.sh [--gpus 8] [--model hf --model-path ID] [--only zero3,vllm]
    bash scripts/gpu_check.sh --device cpu --model tiny --gpus 2   # the same checks on CPU ranks

Each check (plan() lists them) is a short `tepo train` or `tepo eval` on 1 rank and, with more
than one GPU, on all. It passes when the run exits 0 and every step has a finite loss and no
skipped optimizer step. The table (and <out>/gpu_check.json) gives each check's median s/step,
peak memory and speed modes; exit 1 when any check failed, so it can gate a cluster's first job.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, gpucheck, however this is run
from benchlib.report import median
from benchlib.runner import step_records
from gpucheck.table import Outcome, markdown, render


@dataclass(frozen=True)
class Check:
    """One short run: its `tepo` subcommand, overrides and number of ranks."""

    name: str
    ranks: int
    overrides: tuple[str, ...]
    command: str = "train"
    after: str | None = None  # a check whose run directory this one reads (resume, eval)
    skip: str | None = None  # why this check cannot run here (shown, not counted as a failure)
    positive: tuple[str, ...] = ()  # metrics every step must have above 0 (the path really ran)

    @property
    def label(self) -> str:
        return f"{self.name}@{self.ranks}"


def model_overrides(
    model: str, model_path: str | None, dtype: str, tokenizer: str | None = None
) -> list[str]:
    overrides = [f"model={model}", f"model.dtype={dtype}"]
    if model_path:
        overrides.append(f"model.path={model_path}")
    if tokenizer:
        overrides.append(f"model.tokenizer={tokenizer}")
    return overrides


def plan(
    gpus: int, device: str, model: list[str], steps: int, vllm: bool, tiny: bool
) -> list[Check]:
    """The checks, in order: each path on 1 rank, then on `gpus` ranks when there are several."""
    checks: list[Check] = []
    for ranks in sorted({1, gpus}):
        common = (
            *model,
            f"trainer.device={device}",
            f"trainer.nproc={ranks}",
            f"trainer.max_steps={steps}",
            f"trainer.prompts_per_step={2 * ranks}",
            "trainer.progress=false",
            "trainer.eval_before=false",
            "trainer.eval_after=false",
            "trainer.save_every=0",
        )
        paths: list[tuple[str, tuple[str, ...], str | None]] = [
            ("zero2", ("deepspeed=zero2",), None),
            (
                "zero3",
                (
                    "deepspeed=zero3",
                    "trainer.eval_after=true",
                    f"benchmark.eval_size={2 * ranks + 1}",  # uneven held-out shards
                    "rollout.batch_size=1",  # ranks finish decoding at different steps
                ),
                None,
            ),
            ("offload", ("deepspeed=zero2_offload",), None),
            ("lora", ("deepspeed=zero2", "model.lora.r=8"), None),
            (
                "mpo-mtp",
                (
                    "deepspeed=zero2",
                    "algo=mpo",
                    "k=3",
                    "algo.mtp.warmup.steps=2",
                    # MPO has no KL (beta 0): a tiny model that answers nothing right gives every
                    # row a zero advantage, and the default skip would leave no update to check.
                    "trainer.skip_zero_advantage=false",
                ),
                None,
            ),
            ("gae", ("deepspeed=zero2", "advantage=gae", "rollout.n=1"), None),
            (
                "dapo",
                ("deepspeed=zero3", "algo=dapo"),
                "a random tiny model never answers right, so no group has mixed rewards"
                if tiny
                else None,
            ),
            (
                "vllm",
                ("deepspeed=zero2", "rollout=vllm"),
                None
                if vllm
                else "not available on this node: vllm does not import (make install-vllm)",
            ),
            ("save", ("deepspeed=zero3", "trainer.save_every=1"), None),
            (
                "prompt-pass",
                (
                    "deepspeed=zero3",
                    "trainer.micro_batch_tokens=64",  # several micro-batches: a prompt pass
                    "trainer.minibatches=2",  # off-policy: old log-probs scored through one too
                    "algo.beta=0.04",  # the partitioned reference scores through its own
                ),
                None,
            ),
        ]
        for name, extra, skip in paths:
            positive = ("prompt_pass_tokens",) if name == "prompt-pass" else ()
            checks.append(Check(name, ranks, (*common, *extra), skip=skip, positive=positive))
        resume = (*common, "deepspeed=zero3", f"trainer.max_steps={steps + 1}", "resume=true")
        checks.append(Check("resume", ranks, resume, after=f"save@{ranks}"))
    tokenizer = [o for o in model if o.startswith("model.tokenizer=")]  # a node without the GGUF
    evaluate = (*model[:1], *tokenizer, "benchmark=arith", "eval.limit=16")
    checks.append(Check("eval", 1, evaluate, command="eval", after="zero2@1"))
    return checks


def selected(checks: list[Check], only: list[str]) -> list[Check]:
    """The checks named in `only` (a name or name@ranks), with the checks they read."""
    if not only:
        return checks
    wanted = {c.label for c in checks if c.name in only or c.label in only}
    unknown = [o for o in only if not any(o in (c.name, c.label) for c in checks)]
    if unknown:
        names = ", ".join(dict.fromkeys(c.name for c in checks))
        raise ValueError(f"--only: unknown check(s) {', '.join(unknown)}; the checks: {names}")
    by_label = {c.label: c for c in checks}
    for label in list(wanted):
        after = by_label[label].after
        if after:
            wanted.add(after)
    return [c for c in checks if c.label in wanted]


def command_line(check: Check, run_dir: Path, runs: dict[str, Path], tepo: list[str]) -> list[str]:
    if check.command == "eval":
        model_path = runs[check.after] / "final" if check.after else None
        return [*tepo, "eval", f"model.path={model_path}", *check.overrides]
    args = [*tepo, "train", *check.overrides, f"hydra.run.dir={run_dir}"]
    if check.after:
        args[-1] = f"hydra.run.dir={runs[check.after]}"
    return args


def judge(check: Check, returncode: int, records: list[dict[str, Any]], steps: int) -> str:
    """Why the check failed ("" when it passed)."""
    if returncode != 0:
        return f"exit code {returncode}"
    if check.command == "eval":
        return ""
    if len(records) < steps:
        return f"{len(records)} of {steps} steps logged"
    bad = [r["step"] for r in records if not math.isfinite(float(r["loss"]))]
    if bad:
        return f"non-finite loss at step(s) {bad}"
    skipped = max(int(r.get("skipped_optimizer_steps", 0)) for r in records)
    if skipped:
        return f"{skipped} optimizer step(s) skipped (non-finite gradients)"
    for key in check.positive:
        missing = [r["step"] for r in records if not float(r.get(key, 0)) > 0]
        if missing:
            return f"{key} not above 0 at step(s) {missing}: the path did not run"
    return ""


def speed_modes(run_dir: Path) -> dict[str, Any]:
    """What a finished run ran with (its summary.json): TF32 matmuls, and with rollout=vllm the
    engine's CUDA graphs, sleep mode and per-request seeds."""
    path = run_dir / "summary.json"
    if not path.exists():
        return {}
    summary = json.loads(path.read_text())
    modes = {"tf32": summary["tf32"]} if "tf32" in summary else {}
    return {**modes, **summary.get("rollout_engine", {})}


def run_check(
    check: Check, out: Path, runs: dict[str, Path], tepo: list[str], steps: int, timeout: float
) -> Outcome:
    run_dir = out / check.label.replace("@", "-")
    outcome = Outcome(check.label, "skip", check.skip or "", run_dir=str(run_dir))
    if check.skip:
        return outcome
    if check.after and check.after not in runs:
        outcome.why = f"{check.after} did not pass"
        return outcome
    log = out / f"{check.label.replace('@', '-')}.log"
    started = time.monotonic()
    try:
        with log.open("w") as stream:
            returncode = subprocess.call(
                command_line(check, run_dir, runs, tepo),
                stdout=stream,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                start_new_session=True,
            )
    except subprocess.TimeoutExpired:
        returncode = -1
    outcome.seconds = time.monotonic() - started
    where = runs.get(check.after, run_dir) if check.command == "train" else run_dir
    records = [r for r in step_records(where) if "loss" in r]  # not MTP warm-up rows
    if check.name == "resume":
        records = records[-1:]  # the step the resumed run took
    outcome.steps = len(records)
    failure = judge(check, returncode, records, 1 if check.name == "resume" else steps)
    if returncode == -1:
        failure = f"timed out after {timeout:.0f} s"
    outcome.verdict = "FAIL" if failure else "pass"
    outcome.why = failure or ""
    if failure:
        outcome.why += f" (log: {log})"
    else:
        runs[check.label] = where
        if check.command == "train":
            outcome.extra.update(speed_modes(where))
            outcome.why = " ".join(name for name, on in outcome.extra.items() if on is True)
    outcome.step_s = median(r.get("step_seconds") for r in records)
    outcome.rollout_s = median(r.get("rollout_seconds") for r in records)
    outcome.update_s = median(r.get("update_seconds") for r in records)
    outcome.peak_rss_mb = max(
        (r["peak_rss_mb"] for r in records if "peak_rss_mb" in r), default=None
    )
    outcome.peak_gpu_mb = max(
        (r["peak_gpu_mb"] for r in records if "peak_gpu_mb" in r), default=None
    )
    return outcome


def environment(device: str) -> str:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
        gpus = f"{torch.cuda.device_count()} x {', '.join(sorted(names))}"
    else:
        gpus = "no GPU"
    return f"tepo gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}), {gpus}"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--gpus", type=int, default=None, help="ranks of the multi-rank checks")
    parser.add_argument("--model", default=None, help="model preset (default smollm2_135m; tiny)")
    parser.add_argument("--model-path", default=None, help="model.path: a hub id or directory")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="model.tokenizer: a tokenizer directory (a node without the embedded model's GGUF)",
    )
    parser.add_argument(
        "--dtype", default=None, help="model.dtype (bfloat16 on cuda, else float32)"
    )
    parser.add_argument("--steps", type=int, default=3, help="training steps per check")
    parser.add_argument("--only", default="", help="comma-separated check names (or name@ranks)")
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_check"))
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per check")
    parser.add_argument("--markdown", type=Path, help="also write the table here as Markdown")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for all checks: a check that would start later is not run (the table and "
        "JSON are still written)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check --device cuda: torch cannot use CUDA here (torch.cuda.is_available() is "
            f"False; torch {torch.__version__} built for CUDA {torch.version.cuda}). Install a "
            "CUDA build of torch that matches the driver (nvidia-smi shows its CUDA version), or "
            "run the same checks on CPU ranks with --device cpu --model tiny.",
            file=sys.stderr,
        )
        return 2
    gpus = args.gpus or (torch.cuda.device_count() if args.device == "cuda" else 1)
    model = args.model or ("smollm2_135m" if args.device == "cuda" else "tiny")
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    vllm = importlib.util.find_spec("vllm") is not None
    checks = plan(
        gpus,
        args.device,
        model_overrides(model, args.model_path, dtype, args.tokenizer),
        args.steps,
        vllm,
        tiny=model == "tiny",
    )
    try:
        checks = selected(checks, [name for name in args.only.split(",") if name])
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    # The interpreter running this script runs tepo too: a `tepo` on PATH may be another
    # environment's (a node's kit is on PYTHONPATH, not installed).
    tepo = [sys.executable, "-m", "tepo_cli"]
    args.out.mkdir(parents=True, exist_ok=True)
    header = f"{environment(args.device)}; model {model} ({dtype}); {args.steps} steps per check"
    print(header, flush=True)
    runs: dict[str, Path] = {}
    outcomes = []
    started = time.monotonic()
    for check in checks:
        left = args.budget - (time.monotonic() - started) if args.budget else args.timeout
        if left < 10:
            # Out of time: the check is shown as not run, and the table still gets written.
            outcome = Outcome(check.label, "skip", f"not run: --budget {args.budget:.0f} s spent")
        else:
            outcome = run_check(check, args.out, runs, tepo, args.steps, min(args.timeout, left))
        print(f"{outcome.label:<12} {outcome.verdict:<5} {outcome.why}", flush=True)
        outcomes.append(outcome)
    render(outcomes, header)
    if args.markdown:
        args.markdown.write_text(markdown(outcomes, header))
    report = {"header": header, "checks": [asdict(o) for o in outcomes]}
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    failed = [o.label for o in outcomes if o.verdict == "FAIL"]
    print(
        f"{len(outcomes) - len(failed)} of {len(outcomes)} checks did not fail; "
        f"failed: {', '.join(failed) or 'none'} — rows in {args.out / 'gpu_check.json'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
