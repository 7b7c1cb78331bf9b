"""Greedy held-out accuracy of saved models, by tepo's own eval code, one model after another.

    python -m benchstep.evaluate JOB.json TEPO_CONFIG.json OUT.json NAME=MODEL_DIR...

Every model is loaded by tepo's loader with the job's base tokenizer and scored on the job's
held-out problems (tepo's ArithTask eval split) with greedy decoding, the job's max_new_tokens,
batches of 64, and tepo's grader: only the trainer that produced the weights differs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from benchstep.job import Job, load_tepo_config


def evaluate_models(job: Job, config_path: Path, models: dict[str, str]) -> dict[str, dict]:
    from tepo_cli.benchmarks import build_reward, build_task
    from tepo_cli.config.schema import ModelConfig
    from tepo_cli.envs.answer_sampler import Answers
    from tepo_cli.models.loading import load_model, load_tokenizer
    from tepo_cli.rollout import Sampling
    from tepo_cli.rollout.hf import HfBackend

    config = load_tepo_config(config_path)
    problems = build_task(config.benchmark).eval_problems()
    reward = build_reward(config.reward, config.benchmark)
    sampling = Sampling(n=1, greedy=True, max_new_tokens=job.max_new_tokens, batch_size=64)
    device = torch.device(job.device)
    results = {}
    for name, path in models.items():
        model_cfg = ModelConfig(
            name=name, source="hf", path=path, tokenizer=job.model, dtype=job.dtype
        )
        tokenizer = load_tokenizer(model_cfg)
        model = load_model(model_cfg, tokenizer, device)
        backend = HfBackend(model, tokenizer, share_prompts=True)
        began = time.perf_counter()
        batches = Answers(config.benchmark).records(backend, tokenizer, problems, reward, sampling)
        records = [record for batch in batches for record in batch]
        accuracy = sum(r["passed"] for r in records) / max(1, len(records))
        results[name] = {
            "accuracy": accuracy,
            "problems": len(problems),
            "seconds": time.perf_counter() - began,
            "records": records,
        }
        print(f"{name}: greedy accuracy {accuracy:.3f} on {len(problems)} problems")
        del model
    return results


def main(argv: list[str]) -> None:
    job, config_path, out = Job.load(Path(argv[0])), Path(argv[1]), Path(argv[2])
    torch.set_num_threads(job.threads)
    models = dict(item.split("=", 1) for item in argv[3:])
    out.write_text(json.dumps(evaluate_models(job, config_path, models), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
