"""The prompt pass (models/prompt_pass.py) on two ZeRO-3 ranks with uneven work: the same step as
with the prompts in every micro-batch.

Under ZeRO-3 every forward and every recomputation in backward gathers each layer's parameters
from all ranks, so the prompt pass must run on every rank or on none, and its backward (inside
the last micro-batch's) on every rank exactly once. Two CPU ranks (gloo), a budget that splits
each rank's rows into several micro-batches, answers of different lengths on the two ranks, a KL
reference (a ZeRO-3 inference engine scoring through its own prompt pass), two minibatches
(off-policy: old log-probs scored through the prompt pass too), the prompt pass checkpointed
(`auto`): the run finishes, and its step equals the one without a prompt pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow

# Longer answers on rank 1: the ranks plan different micro-batches and agree on their count.
UNEVEN_REWARD = """
import os

def score(completion, problem):
    return float(len(completion) % 3 == int(os.environ.get("RANK", "0")))
"""


def _run(tmp_path: Path, name: str, *overrides: str) -> Path:
    reward = tmp_path / "uneven.py"
    reward.write_text(UNEVEN_REWARD)
    run_dir = tmp_path / name
    args = [
        "model=tiny",
        "trainer.nproc=2",
        "deepspeed=zero3",
        "trainer.progress=false",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.max_steps=1",
        "trainer.prompts_per_step=4",
        "trainer.minibatches=2",
        "trainer.micro_batch_tokens=24",
        # Adam's step linear in the gradients (eps far above them), no clipping: equal steps
        # exactly when the gradients are (float32 AdamW's first step, ~lr x sign(g), would flip
        # with the rounding of near-zero gradients).
        "trainer.lr=1.0",
        "trainer.adam_eps=1000",
        "trainer.grad_clip=0",
        "rollout.n=4",
        "rollout.max_new_tokens=10",
        "algo.beta=0.04",
        "reward=custom",
        f"reward.path={reward}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run_dir


def test_zero3_two_ranks_with_a_prompt_pass_take_the_step_without_one(tmp_path, compose_config):
    with_pass = _run(tmp_path, "prompt_pass")
    without = _run(tmp_path, "prompts_in_rows", "model.prompt_pass=false")
    (record,) = [json.loads(line) for line in (with_pass / "metrics.jsonl").open()]
    (reference,) = [json.loads(line) for line in (without / "metrics.jsonl").open()]
    assert record["reward_mean"] == reference["reward_mean"]  # the same samples
    assert record["prompt_pass_tokens"] > 0 and reference["prompt_pass_tokens"] == 0
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        assert record[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-7), key
    assert record["grad_norm"] > 0
    start = _initial_weights(compose_config)
    steps = [
        torch.cat([(w - start[n]).flatten() for n, w in _final(run).items()])
        for run in (with_pass, without)
    ]
    assert steps[1].norm() > 0
    # Float32 ranks, the prompt's gradient summed in another order: rounding, not O(1).
    assert float((steps[0] - steps[1]).norm() / steps[1].norm()) < 1e-4


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    return {name: p.detach() for name, p in model.named_parameters()}


def _initial_weights(compose_config) -> dict[str, torch.Tensor]:
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.models.loading import load_model, load_tokenizer

    config = load_train_config(compose_config("train", ["model=tiny"])).model
    model = load_model(config, load_tokenizer(config), torch.device("cpu"))
    return {name: p.detach() for name, p in model.named_parameters()}
