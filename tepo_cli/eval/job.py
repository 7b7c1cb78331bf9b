"""`tepo eval`: score a model on a benchmark's held-out problems and write the results."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from tepo_cli.config.errors import ConfigError
from tepo_cli.config.validate import load_eval_config


def eval_job(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        config = load_eval_config(cfg, hydra_cfg.runtime.choices)
        from tepo_cli.data.arith import ArithTask
        from tepo_cli.eval.accuracy import evaluate
        from tepo_cli.models.loading import load_model, load_tokenizer
        from tepo_cli.rewards import build_reward
        from tepo_cli.rollout.hf import Sampling

        task = ArithTask(config.benchmark)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = load_tokenizer(config.model)
        model = load_model(config.model, tokenizer, device)
        options = config.eval
        sampling = Sampling(
            n=options.n,
            greedy=options.greedy,
            temperature=options.temperature,
            top_p=options.top_p,
            max_new_tokens=options.max_new_tokens,
            batch_size=options.batch_size,
        )
        problems = task.eval_problems(options.limit)
        result = evaluate(
            model, tokenizer, problems, config.benchmark, build_reward(config.reward), sampling
        )
    except ConfigError as error:
        print(f"tepo eval: {error}", file=sys.stderr)
        sys.exit(2)
    summary = {
        "model": config.model.path or config.model.name,
        "benchmark": config.benchmark.name,
        "prompt": config.benchmark.prompt,
        "sampling": config.eval.model_dump(),
        **result.summary(),
    }
    _write_jsonl(run_dir / "samples.jsonl", result.records)
    _write_json(run_dir / "summary.json", summary)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(config.model_dump(mode="json")))
    _print_table(summary, run_dir)


def _write_json(path: Path, data: object) -> None:
    staging = path.with_suffix(path.suffix + ".tmp")
    staging.write_text(json.dumps(data, indent=2))
    os.replace(staging, path)


def _write_jsonl(path: Path, records: list[dict]) -> None:
    staging = path.with_suffix(path.suffix + ".tmp")
    with staging.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(staging, path)


def _print_table(summary: dict, run_dir: Path) -> None:
    table = Table(title=f"tepo eval: {summary['benchmark']}")
    for column in ("model", "problems", "samples", "accuracy", "samples/s"):
        table.add_column(column)
    table.add_row(
        str(summary["model"]),
        str(summary["problems"]),
        str(summary["samples"]),
        f"{summary['accuracy']:.3f}",
        f"{summary['samples_per_second']:.1f}",
    )
    console = Console()
    console.print(table)
    console.print(f"results: {run_dir}/summary.json, per-sample: {run_dir}/samples.jsonl")
