"""The training loop in-process through each DeepSpeed ZeRO stage (one CPU rank, gloo)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tepo_cli.config.validate import load_train_config
from tepo_cli.train.distributed import setup_topology, teardown
from tepo_cli.train.loop import train

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("preset", ["zero0", "zero1", "zero2", "zero3", "zero2_offload"])
def test_one_step_in_every_zero_stage(compose_config, tmp_path, preset):
    (tmp_path / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2\n"
    )
    overrides = [
        "model=tiny",
        "reward=custom",
        f"reward.path={tmp_path / 'parity.py'}",
        f"deepspeed={preset}",
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.progress=false",
        "rollout.max_new_tokens=6",
    ]
    config = load_train_config(compose_config("train", overrides))
    topo = setup_topology(num_threads=None)
    try:
        summary = train(config, tmp_path, topo)
    finally:
        teardown()
    assert summary["steps"] == 1
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["grad_norm"] > 0
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert all(torch.isfinite(p).all() for p in saved.parameters())
