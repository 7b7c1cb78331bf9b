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


def train_tiny(compose_config, tmp_path, preset: str, *overrides: str) -> dict:
    """The tiny model on a parity reward through DeepSpeed `preset`, in this process."""
    (tmp_path / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2\n"
    )
    base = [
        "model=tiny",
        "reward=custom",
        f"reward.path={tmp_path / 'parity.py'}",
        f"deepspeed={preset}",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.progress=false",
        "rollout.max_new_tokens=6",
    ]
    config = load_train_config(compose_config("train", [*base, *overrides]))
    topo = setup_topology(num_threads=None)
    try:
        return train(config, tmp_path, topo)
    finally:
        teardown()


@pytest.mark.parametrize("preset", ["zero0", "zero1", "zero2", "zero3", "zero2_offload"])
def test_one_step_in_every_zero_stage(compose_config, tmp_path, preset):
    summary = train_tiny(compose_config, tmp_path, preset, "trainer.max_steps=1")
    assert summary["steps"] == 1
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["grad_norm"] > 0
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert all(torch.isfinite(p).all() for p in saved.parameters())


@pytest.mark.parametrize("preset", ["zero0", "zero2", "zero3"])
def test_mpo_mtp_modules_train_and_are_saved_beside_final_in_zero_stages(
    compose_config, tmp_path, preset
):
    """The MTP modules live in the DeepSpeed engine (partitioned under ZeRO-3, gathered to save)
    and leave final/ a plain Hugging Face model."""
    from safetensors import safe_open

    from tepo_cli.train.mtp_files import load_mtp_modules

    summary = train_tiny(
        compose_config,
        tmp_path,
        preset,
        "algo=mpo",
        "k=3",
        "algo.mtp.warmup.steps=1",
        "algo.mtp.warmup.batch_size=4",
        "trainer.max_steps=2",
    )
    tensors, settings = load_mtp_modules(tmp_path / "mtp_modules.safetensors")
    assert (settings["depths"], settings["mtp"]["head"], settings["model_type"]) == (
        2,
        "copy",
        "llama",
    )
    assert sum(t.numel() for t in tensors.values()) == summary["mtp_parameters"]
    assert {key.split(".")[1] for key in tensors} == {"0", "1"}
    assert all(torch.isfinite(t).all() for t in tensors.values())
    size = 64  # the tiny model's hidden size: the projection has left [I, 0] in training
    projection = tensors["depths.0.project.weight"]
    assert not torch.equal(projection[:, :size], torch.eye(size))
    with safe_open(tmp_path / "final" / "model.safetensors", framework="pt") as handle:
        names = handle.keys()
    assert names and not any("mtp" in name for name in names)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert all(torch.isfinite(p).all() for p in saved.parameters())


@pytest.mark.parametrize("preset", ["zero0", "zero3"])
def test_gae_critic_trains_and_is_saved_in_zero_stages(compose_config, tmp_path, preset):
    """The critic is a second engine (partitioned under ZeRO-3, gathered to save)."""
    from tepo_cli.models.critic import Critic

    summary = train_tiny(
        compose_config,
        tmp_path,
        preset,
        "advantage=gae",
        "advantage.save_critic=true",
        "rollout.n=1",
        "trainer.prompts_per_step=4",
        "trainer.max_steps=2",
    )
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["critic_grad_norm"] > 0 and r["value_loss"] > 0 for r in records)
    critic = Critic.from_path(str(tmp_path / "critic"), torch.float32, torch.device("cpu"))
    assert sum(p.numel() for p in critic.parameters()) == summary["critic_parameters"]
    assert all(torch.isfinite(p).all() for p in critic.parameters())
