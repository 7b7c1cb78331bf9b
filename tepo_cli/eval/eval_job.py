"""`tepo eval`: sample, grade and summarise a model on a benchmark; resumable.

Per-sample records are appended to `samples.jsonl` as each generation batch finishes; running the
same command again with `hydra.run.dir=<that dir>` skips the problems already complete there.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tepo_cli.config.added_keys import check_added_keys
from tepo_cli.config.eval_schema import EvalConfig
from tepo_cli.config.validate import load_eval_config
from tepo_cli.core import help_groups, job_dirname  # noqa: F401  (register their resolvers)
from tepo_cli.core.atomic_write import write_text
from tepo_cli.core.dry_run import dry_run
from tepo_cli.core.errors import ConfigError, RunError
from tepo_cli.core.records import Problem
from tepo_cli.core.run_dir import CONFIG, SAMPLES, SUMMARY, discard_if_unused
from tepo_cli.core.whole_table import print_whole
from tepo_cli.rewards import Reward

if TYPE_CHECKING:
    import torch

    from tepo_cli.envs.samples import Sampler


def eval_job(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        refuse_training_sampling_keys(hydra_cfg.overrides.task)
        config = load_eval_config(cfg, hydra_cfg.runtime.choices)
        check_added_keys(hydra_cfg.overrides.task, hydra_cfg.runtime.choices)
        from tepo_cli.benchmarks import check_benchmark
        from tepo_cli.core.user_code import import_plugins
        from tepo_cli.rollout import check_backend

        import_plugins(config.plugins)
        _check_environment(config)
        check_backend(config.rollout)
        check_benchmark(config.benchmark, config.reward)
        if dry_run(config, "eval"):
            discard_if_unused(run_dir)
            return
        from tepo_cli.core.library_warnings import warnings_to_log

        with warnings_to_log("eval"):
            summary = run_eval(config, run_dir)
    except (ConfigError, RunError) as error:
        if isinstance(error, ConfigError):
            discard_if_unused(run_dir)  # refused at start-up: no output left behind
        print(f"tepo eval: {error}", file=sys.stderr)
        sys.exit(2 if isinstance(error, ConfigError) else 1)
    _print_table(summary, run_dir)


def _check_environment(config: EvalConfig) -> None:
    """The environment exists (a plugin's is registered by now) and has a model to take turns."""
    from tepo_cli.envs import environment

    environment(config.env.name)
    if config.env.multi_turn and config.model.source in ("reference", "replay"):
        raise ConfigError(
            f"env={config.env.name} runs episodes in which the model takes turns, but "
            f"model={config.model.source} scores texts given in advance. Evaluate a model "
            "(model.path=... or a model preset) with env=..., or these texts with env=single."
        )


# rollout.* keys of the training rollout; tepo eval's sampling is eval.*'s
_TRAINING_SAMPLING = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "batch_size",
    "truncated_sampling",
)


def refuse_training_sampling_keys(overrides: list[str]) -> None:
    """`tepo eval rollout.n=8` would be read by nothing: say which eval.* key does it."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        field = key.removeprefix("rollout.")
        if key.startswith("rollout.") and field in _TRAINING_SAMPLING:
            instead = {
                "top_k": "tepo eval has no top_k",
                "truncated_sampling": "nothing is trained on tepo eval's samples: no bias to accept",
            }.get(field, f"here: eval.{field}")
            raise ConfigError(
                f"{key} sets the training rollout's sampling; tepo eval samples with eval.n, "
                f"eval.greedy, eval.temperature, eval.top_p, eval.max_new_tokens and "
                f"eval.batch_size ({instead}). In tepo eval, rollout=<name> picks the "
                f"generation back-end, rollout.engine.* configures it and rollout.stop, "
                f"rollout.stop_at and rollout.stop_pattern say where answers end."
            )


def run_eval(config: EvalConfig, run_dir: Path) -> dict[str, Any]:
    from tepo_cli.benchmarks import build_reward, build_task, get_benchmark
    from tepo_cli.core.machine import describe  # torch: after the checks that can refuse
    from tepo_cli.envs.sampler import build_sampler
    from tepo_cli.eval.summary import summarize
    from tepo_cli.rollout import Sampling, stop_rule

    options, benchmark = config.eval, config.benchmark
    problems = build_task(benchmark).eval_problems(options.limit)
    reward = build_reward(config.reward, benchmark)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(OmegaConf.to_yaml(config.model_dump(mode="json")))
    done = _completed_records(run_dir / SAMPLES, options.n)
    todo = [p for p in problems if p.id not in done]
    sampling = Sampling(
        n=options.n,
        greedy=options.greedy,
        temperature=options.temperature,
        top_p=options.top_p,
        max_new_tokens=options.max_new_tokens or benchmark.max_new_tokens,
        batch_size=options.batch_size,
        seed=config.seed,
        stop=stop_rule(config.rollout),
    )
    sampler = build_sampler(config.env, benchmark, config.turn_tokens)  # answers or episodes
    start = time.perf_counter()
    replay_note: dict[str, Any] = {}
    # the machine that generated the answers (greedy answers in bf16 differ between CPUs): this
    # invocation's when it generates any, else the last one's; None for recorded answers
    machine = _earlier(run_dir).get("machine")
    if todo and config.model.source in ("reference", "replay"):  # recorded answers, no model
        batch, replay_note = _offline_records(config, todo, reward, options.n)
        _append(run_dir / SAMPLES, batch, done)
    elif todo:
        device = _eval_device()
        machine = describe(device)
        for batch in _model_records(config, sampler, todo, reward, sampling, device):
            _append(run_dir / SAMPLES, batch, done)
    seconds = time.perf_counter() - start
    records = [r for p in problems for r in done[p.id]]
    summary = {
        "model": config.model.path or config.model.name,
        "benchmark": benchmark.name,
        "split": "held-out" if get_benchmark(benchmark.name).task else benchmark.split,
        "grader": reward.name if reward.name != "gsm8k" else f"gsm8k-{config.reward.mode}",
        "prompt": benchmark.prompt,
        "system_prompt": benchmark.system_prompt,
        "chat_template": benchmark.chat_template,
        "sampling": {**options.model_dump(), "max_new_tokens": sampling.max_new_tokens},
        **summarize(records, problems, options.n, options.pass_k, reward.name, reward.cfg),
        "resumed_problems": len(problems) - len(todo),
        "seconds": seconds,
        "samples_per_second": len(todo) * options.n / seconds if todo and seconds else None,
        **({"replay": replay_note} if replay_note else {}),
        "machine": machine,
    }
    summary.update(sampler.summary(records))  # an environment's: its episodes' turns and ends
    _write_json(run_dir / SUMMARY, summary)
    return summary


def _eval_device() -> torch.device:
    """tepo eval has no device knob: trainer.device=auto's rule, applied as training applies it."""
    import torch

    from tepo_cli.runtime.device_choice import apply_device_choice, choose_device

    choice = choose_device("auto")
    apply_device_choice(choice)
    return torch.device(choice.type)


def _model_records(
    config: EvalConfig,
    sampler: Sampler,
    todo: list[Any],
    reward: Any,
    sampling: Any,
    device: torch.device,
) -> Iterator[list[dict[str, Any]]]:
    """The graded samples of the model itself, batch by batch, from the rollout back-end."""
    import torch

    from tepo_cli.models.loading import load_model, load_tokenizer
    from tepo_cli.models.precision import precision_line
    from tepo_cli.rollout import build_backend
    from tepo_cli.rollout.vllm_modes import without_updates
    from tepo_cli.runtime import thread_wait

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    print(f"tepo eval: {precision_line(config.model.dtype, device.type)}", file=sys.stderr)
    busy = thread_wait.start_line(os.environ)
    if busy:
        print(f"tepo eval: {busy}", file=sys.stderr)
    tokenizer = load_tokenizer(config.model)
    model = load_model(config.model, tokenizer, device)
    rollout = config.rollout.model_copy(update={"engine": without_updates(config.rollout.engine)})
    backend = build_backend(rollout, model, tokenizer, config.model.share_prompts, device)
    with contextlib.closing(backend):
        yield from sampler.records(backend, tokenizer, todo, reward, sampling)


def _earlier(run_dir: Path) -> dict[str, Any]:
    """The summary an earlier invocation wrote into `run_dir` ({} if none or unreadable)."""
    try:
        return json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return {}


def _append(path: Path, batch: list[dict[str, Any]], done: dict[str, list[dict[str, Any]]]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        for record in batch:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            done.setdefault(record["id"], []).append(record)


def _offline_records(
    config: EvalConfig, problems: list[Problem], reward: Reward, n: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records for model=reference (the dataset's solutions) or model=replay (a JSONL file),
    and for replay how its file was read (also said on stderr)."""
    from tepo_cli.eval.offline import reference_completions, replay_completions

    note: dict[str, Any] = {}
    if config.model.source == "replay":
        assert config.model.path  # ModelConfig validation
        replay = replay_completions(config.model.path, problems, n)
        print(f"tepo eval: {replay.line(n)}", file=sys.stderr)
        texts, note = replay.completions, replay.note()
    else:
        texts = reference_completions(config.benchmark, problems, n)
    owners = [p for p in problems for _ in range(n)]
    completions = [text for p in problems for text in texts[p.id]]
    results = reward.score_many(completions, owners)
    records = [
        {
            "id": problem.id,
            "sample": index % n,
            "completion": text,
            "answer": problem.answer,
            "extracted": result.extracted,
            "reward": result.reward,
            "passed": result.correct,
            "length": None,
            "truncated": False,
        }
        for index, (problem, text, result) in enumerate(
            zip(owners, completions, results, strict=True)
        )
    ]
    return records, note


def _completed_records(path: Path, n: int) -> dict[str, list[dict[str, Any]]]:
    """Records of problems with all n samples already written; a torn last line is dropped."""
    if not path.exists():
        return {}
    by_id: dict[str, list[dict[str, Any]]] = {}
    good_bytes = 0
    with path.open("rb") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                break
            by_id.setdefault(record["id"], []).append(record)
            good_bytes += len(line)
    with path.open("r+b") as handle:
        handle.truncate(good_bytes)
    complete = {key: rows for key, rows in by_id.items() if len(rows) >= n}
    if len(complete) != len(by_id):  # rewrite without the incomplete problems' samples
        kept = [row for rows in complete.values() for row in rows]
        write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    return complete


def _write_json(path: Path, data: object) -> None:
    write_text(path, json.dumps(data, indent=2))


def _print_table(summary: dict[str, Any], run_dir: Path) -> None:
    table = Table(title=f"tepo eval: {summary['benchmark']} ({summary['grader']} grader)")
    metrics = [k for k in summary if k.startswith(("pass@", "maj@"))]
    columns = ["model", "problems", "samples", "accuracy", *metrics, "mean length", "median length"]
    columns.append("samples/s")
    for column in columns:
        table.add_column(column)
    rate = summary["samples_per_second"]
    table.add_row(
        Text(str(summary["model"])),  # a path as it is: never markup
        str(summary["problems"]),
        str(summary["samples"]),
        f"{summary['accuracy']:.3f}",
        *(f"{summary[m]:.3f}" for m in metrics),
        "-" if summary["mean_length"] is None else f"{summary['mean_length']:.1f}",
        "-" if summary["median_length"] is None else f"{summary['median_length']:.1f}",
        f"{rate:.2f}" if rate else "-",
    )
    console = Console()
    print_whole(console, table)  # the model's path whole in a log
    if "env" in summary:
        env = summary["env"]
        ended = ", ".join(f"{end} {share:.0%}" for end, share in env["ends"].items() if share)
        console.print(
            f"env={env['name']}: {env['turns_mean']:.2f} turns and {env['tool_calls_mean']:.2f} "
            f"tool calls per episode; ended by {ended}",
            soft_wrap=True,
        )
    paths = f"summary: {run_dir / SUMMARY}   per-sample records: {run_dir / SAMPLES}"
    console.print(paths, highlight=False, markup=False, soft_wrap=True)  # to copy: never folded
