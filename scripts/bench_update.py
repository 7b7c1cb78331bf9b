"""The update phase alone: tepo's `update` (every micro-batch's forward and backward through the
DeepSpeed engine, then the optimizer step) on the long job's step-1 batch (ANSWERS, PROMPTS:
random ids, fixed rewards), in variants that differ by config overrides, each in its own process.

    python scripts/bench_update.py [--repeats 3] [--variants prompt-pass,...] [--profile]
    python scripts/bench_update.py --smoke          # model=tiny, small shapes (CI)

Per variant: the update's seconds (best of --repeats after a warm-up; --rounds alternates), its
split, micro-batches, peak RSS, GFLOP/s on answer tokens beside a matmul of the model's MLP shape
in the model's precision (`model.dtype`; auto: bf16 on a CPU with AMX or AVX-512 BF16), timed in
each variant's process (benchlib/measure.py), and the update's MFU with the step records' work
count (tepo_cli/train/flops.py). The table divides every row by the best matmul rate of the run's
processes in that precision: one process's probe can read 25 % low on a busy machine.
--profile splits the operators' time (benchlib/measure.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from benchlib.measure import op_line
from benchlib.report import table
from benchlib.runner import child_json

# variant -> tepo config overrides on top of the job's
VARIANTS = {
    "prompts-in-every-micro-batch": ["model.prompt_pass=false"],
    "prompt-pass": [],  # tepo's defaults: trainer.host_allocator=auto (jemalloc where installed)
    # float32 where `model.dtype=auto` chooses bf16 (a CPU with AMX or AVX-512 BF16), and back
    "prompt-pass-float32": ["model.dtype=float32"],
    "prompt-pass-bf16": ["model.dtype=bfloat16"],
    "prompt-pass-tcmalloc": ["trainer.host_allocator=tcmalloc"],
    "prompt-pass-jemalloc": ["trainer.host_allocator=jemalloc"],
    # mimalloc from its wheel (cmeel-mimalloc): the reusing allocator pip alone installs
    "prompt-pass-mimalloc": ["trainer.host_allocator=mimalloc"],
    # the same pip-only set-up in float32, where `auto` would choose bf16
    "prompt-pass-mimalloc-float32": ["trainer.host_allocator=mimalloc", "model.dtype=float32"],
    # mimalloc keeping freed pages 1 s before handing them back (its default: 10 ms; VARIANT_ENV)
    "prompt-pass-mimalloc-purge-1s": ["trainer.host_allocator=mimalloc"],
    # glibc's malloc with tepo's fixed mmap threshold (trainer.mmap_threshold_kb=512): every
    # freed buffer over 512 KiB goes back to the OS, every new one faults in fresh pages
    "prompt-pass-glibc": ["trainer.host_allocator=glibc"],
    # glibc's own adaptive mmap threshold: freed buffers reused from the heap (no fresh page
    # faults), at the price of the heap's drift (tepo_cli/runtime/host_memory.py)
    "prompt-pass-glibc-heap-reuse": [
        "trainer.host_allocator=glibc",
        "trainer.mmap_threshold_kb=null",
    ],
    # glibc with a fixed threshold between the two: buffers up to 1, 2, 4 or 32 MiB (glibc's
    # largest) reused from the heap, larger ones mapped fresh; the heap's top trimmed only past
    # twice the threshold (tepo_cli/runtime/host_memory.py), as glibc's adaptive rule does
    "prompt-pass-glibc-1mib": ["trainer.host_allocator=glibc", "trainer.mmap_threshold_kb=1024"],
    "prompt-pass-glibc-2mib": ["trainer.host_allocator=glibc", "trainer.mmap_threshold_kb=2048"],
    "prompt-pass-glibc-4mib": ["trainer.host_allocator=glibc", "trainer.mmap_threshold_kb=4096"],
    "prompt-pass-glibc-32mib": [
        "trainer.host_allocator=glibc",
        "trainer.mmap_threshold_kb=32768",
    ],
    # glibc with tepo's threshold, its malloc asking for transparent huge pages (VARIANT_ENV)
    "prompt-pass-glibc-huge-pages": ["trainer.host_allocator=glibc"],
}
# variant -> environment of its process (read by glibc at start: it cannot be a config key)
VARIANT_ENV = {
    "prompt-pass-glibc-huge-pages": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "prompt-pass-mimalloc-purge-1s": {"MIMALLOC_PURGE_DELAY": "1000"},
}
# The long job's step 1 at 8e581ec (docs/results/bench_step_long): answer lengths, prompt lengths.
ANSWERS = [512, 111, 512, 512, 17, 78, 512, 214, 25, 111, 243, 512, 108, 405, 147, 398]
PROMPTS = [373, 80]
JOB = [
    "algo=grpo",
    "algo.beta=0",
    "rollout.n=8",
    "trainer.prompts_per_step=2",
    "rollout.max_new_tokens=512",
    "rollout.temperature=1.0",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model preset")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=1, help="run the variants A, B, A, B, ...: best of each"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--output", type=Path, default=Path("bench_update.json"))
    parser.add_argument("--smoke", action="store_true", help="model=tiny, short answers, 1 repeat")
    parser.add_argument("--profile", action="store_true", help="split each variant's time by op")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # one child's run
    args = parser.parse_args()
    if args.smoke:
        args.model, args.repeats = "tiny", 1
    if args.variant:
        print(json.dumps(_run(args)))
        return
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    args.output.parent.mkdir(parents=True, exist_ok=True)  # before the minutes of measuring
    names, missing = _installed(names)
    for name, why in missing.items():
        print(f"bench_update: variant {name} skipped: {why}", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    for _ in range(max(1, args.rounds)):  # alternated: a slow spell of the machine hits both
        for name in names:
            command = [sys.executable, __file__, *sys.argv[1:], "--variant", name]
            run = child_json(command, VARIANT_ENV.get(name))
            if name not in results or run["update_seconds"] < results[name]["update_seconds"]:
                results[name] = run
    _report(results)
    args.output.write_text(json.dumps(results, indent=2) + "\n")


def _installed(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The variants whose `trainer.host_allocator` this machine has, and why each other one is
    left out (its library is not installed)."""
    from tepo_cli.core import host_allocator
    from tepo_cli.core.errors import ConfigError

    kept, missing = [], {}
    for name in names:
        choices = [o.split("=", 1)[1] for o in VARIANTS[name] if o.startswith("trainer.host_alloc")]
        try:
            for choice in choices:
                host_allocator.resolve(choice)
            kept.append(name)
        except ConfigError as error:
            missing[name] = str(error)
    return kept, missing


def _shapes(smoke: bool) -> tuple[list[int], list[int]]:
    if smoke:
        return [9, 1, 4, 12, 2, 8, 3, 6, 12, 5, 7, 1, 2, 11, 4, 3], [14, 9]
    return ANSWERS, PROMPTS


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from tepo_cli.cli import start_with_host_allocator

    smoke = ["trainer.micro_batch_tokens=24"] if args.smoke else []  # several micro-batches
    overrides = [f"model={args.model}", *JOB, *smoke, *VARIANTS[args.variant]]
    start_with_host_allocator("train", overrides)  # as `tepo train` starts: the same allocator

    import torch
    from benchlib.measure import matmul_gflops, profiled_shares
    from hydra import compose, initialize_config_module

    from tepo_cli.algos.advantage import group_advantages
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.core.host_allocator import release_free_memory
    from tepo_cli.core.machine import cpu_model
    from tepo_cli.core.sequences import SequenceBatch
    from tepo_cli.kernels.lean_layers import make_lean
    from tepo_cli.models.loading import load_model, load_tokenizer
    from tepo_cli.runtime.distributed import setup_topology, teardown
    from tepo_cli.runtime.engine import build_engine
    from tepo_cli.runtime.host_memory import set_up_host_memory
    from tepo_cli.train.experience import Experience
    from tepo_cli.train.setup import build_policy
    from tepo_cli.train.update import accumulation_steps, update

    if args.threads:
        torch.set_num_threads(args.threads)
    with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
        cfg = load_train_config(compose(config_name="train", overrides=overrides))
    allocator = set_up_host_memory(cfg.trainer.mmap_threshold_kb)  # as `tepo train` does
    answers, prompts = _shapes(args.smoke)
    tokenizer = load_tokenizer(cfg.model)
    lm = load_model(cfg.model, tokenizer, torch.device("cpu"))
    if cfg.kernel.lean_layers:
        make_lean(lm)
    rollout = _rollout(answers, prompts, lm.config.vocab_size)
    batch = SequenceBatch.from_rollout(rollout)
    rewards = torch.tensor([float(i % 3 == 0) for i in range(len(answers))], device="cpu")
    advantages = group_advantages(rewards, cfg.rollout.n)
    experience = Experience([], rollout, batch, rewards, rewards.bool(), advantages)
    # The matmul rate in the model's precision before and after the updates, the better of the two
    # (as bench_step does).
    dtype = str(next(lm.parameters()).dtype).removeprefix("torch.")
    before = matmul_gflops(2048, lm.config.hidden_size, lm.config.intermediate_size, dtype=dtype)
    setup_topology(num_threads=None)
    try:
        policy = build_policy(cfg, lm)
        engine = build_engine(policy, cfg, accumulation_steps(cfg), 1)
        generator = torch.Generator(device="cpu").manual_seed(0)
        update(cfg, engine, experience, generator)  # warm-up: allocator, oneDNN, AdamW state
        runs = []
        for _ in range(args.repeats):
            release_free_memory()  # as the loop does before each update (train/recipe.py)
            began = time.perf_counter()
            metrics = update(cfg, engine, experience, generator)
            runs.append((time.perf_counter() - began, metrics))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # before the profiler's
        shares = (
            profiled_shares(lambda: update(cfg, engine, experience, generator), top=8)
            if args.profile
            else {}
        )
    finally:
        teardown()
    seconds, metrics = min(runs, key=lambda run: run[0])
    params = sum(p.numel() for p in lm.parameters())
    hidden, inner = lm.config.hidden_size, lm.config.intermediate_size
    after = matmul_gflops(2048, hidden, inner, dtype=dtype)
    matmul = max(before, after, key=lambda m: m["gflops"])
    gflops = 6.0 * params * sum(answers) / seconds / 1e9
    # MFU as every step record gives it (tepo_cli/train/flops.py): the needed FLOPs the update
    # counted (each distinct prompt once, attention included) over its seconds x the rate above
    needed = metrics["update_flops"]
    return {
        "update_seconds": seconds,
        "forward_seconds": metrics["forward_seconds"],
        "backward_seconds": metrics["backward_seconds"],
        "optimizer_seconds": metrics["optimizer_seconds"],
        "micro_batches": _micro_batches(cfg, batch),
        "peak_rss_gb": peak,
        "answer_tokens": sum(answers),
        "prompt_tokens": sum(prompts),
        "params": params,
        "update_gflops": gflops,
        "matmul_gflops": matmul["gflops"],
        "of_matmul_rate": gflops / matmul["gflops"],
        "update_mfu": needed / seconds / (matmul["gflops"] * 1e9),
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),  # the share of page faults differs by processor
        "host_allocator": allocator,
        **shares,
    }


def _rollout(answers: list[int], prompts: list[int], vocab: int) -> Any:
    """Left-padded prompts (each repeated for its answers), right-padded answers, random ids."""
    import torch

    from tepo_cli.core.rollout_record import Rollout

    generator = torch.Generator(device="cpu").manual_seed(0)
    n = len(answers) // len(prompts)
    width, longest = max(prompts), max(answers)
    prompt_ids = torch.randint(1, vocab, (len(prompts), width), generator=generator)
    prompt_mask = torch.arange(width, device="cpu")[None] >= width - torch.tensor(prompts)[:, None]
    answer_ids = torch.randint(1, vocab, (len(answers), longest), generator=generator)
    answer_mask = torch.arange(longest, device="cpu")[None] < torch.tensor(answers)[:, None]
    return Rollout(
        prompt_ids=prompt_ids.repeat_interleave(n, dim=0),
        prompt_mask=prompt_mask.long().repeat_interleave(n, dim=0),
        completion_ids=answer_ids * answer_mask,
        completion_mask=answer_mask,
        texts=[""] * len(answers),
        truncated=torch.tensor(answers, device="cpu") >= longest,
    )


def _micro_batches(cfg: Any, batch: Any) -> int:
    import torch

    from tepo_cli.train.micro_batches import micro_batches

    rows = torch.arange(len(batch), device="cpu")
    trainer = cfg.trainer
    plan = micro_batches(
        batch, rows, trainer.micro_batch_tokens, trainer.micro_batch_size, cfg.model.prompt_pass
    )
    return len(plan.rows)


def _report(results: dict[str, dict[str, Any]]) -> None:
    first = next(iter(results.values()))
    print("## The update alone on the long job's step-1 batch (scripts/bench_update.py)\n")
    print(f"`python scripts/bench_update.py {' '.join(sys.argv[1:])}`\n")
    print(
        f"{first['answer_tokens']} answer tokens, {first['prompt_tokens']} prompt tokens, "
        f"{first['params'] / 1e6:.1f} M parameters, {first['threads']} threads on "
        f"{first.get('cpu', 'an unnamed CPU')}; peak RSS of each variant's process (load, "
        "warm-up and timed updates); matmul rate: the best of the run's processes in that "
        "precision\n"
    )
    header = ["variant", "dtype", "allocator", "update s (forward / backward / optimizer)"]
    header += [
        "micro-batches",
        "peak RSS GB",
        "GFLOP/s on answer tokens",
        "/ matmul rate",
        "update MFU",
    ]
    # the rate each process measures varies with the machine's spells (143 and 191 GFLOP/s in one
    # float32 run): the best of the run's processes, per precision, is every row's denominator
    best: dict[str, float] = {}
    for run in results.values():
        dtype = run.get("dtype", "float32")
        best[dtype] = max(best.get(dtype, 0.0), run["matmul_gflops"])
    rows = [
        (
            name,
            run.get("dtype", "float32"),
            run["host_allocator"],
            f"{run['update_seconds']:.2f} ({run['forward_seconds']:.2f} / "
            f"{run['backward_seconds']:.2f} / {run['optimizer_seconds']:.2f})",
            run["micro_batches"],
            f"{run['peak_rss_gb']:.2f}",
            f"{run['update_gflops']:.1f}",
            f"{run['update_gflops'] / best[run.get('dtype', 'float32')]:.2f} "
            f"(of {best[run.get('dtype', 'float32')]:.1f})",
            f"{run['update_mfu'] * run['matmul_gflops'] / best[run.get('dtype', 'float32')]:.2f}",
        )
        for name, run in results.items()
    ]
    print(table(header, rows) + "\n")
    for name, run in results.items():
        if "matmul_share" in run:
            print(f"- {name}: {op_line(run)}")
    names = list(results)
    for name in names[1:]:
        ratio = results[names[0]]["update_seconds"] / results[name]["update_seconds"]
        print(f"- {name}: {ratio:.2f}x the speed of {names[0]}")


if __name__ == "__main__":
    main()
