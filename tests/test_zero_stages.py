"""The training loop in-process through each DeepSpeed ZeRO stage (one CPU rank, gloo)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tepo_cli.config.validate import load_train_config
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.train.recipe import train

pytestmark = pytest.mark.slow
BUDGET = "trainer.micro_batch_tokens=64"  # several micro-batches of the 16 rows


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


@pytest.fixture(scope="module")
def zero0_step(compose_config, tmp_path_factory) -> tuple[dict, dict[str, torch.Tensor]]:
    """One step without ZeRO: the metrics and weights every stage must reproduce."""
    from tepo_cli.models.loading import load_model, load_tokenizer

    run_dir = tmp_path_factory.mktemp("zero0")
    train_tiny(compose_config, run_dir, "zero0", "trainer.max_steps=1", "trainer.lr=1e-3", BUDGET)
    record, weights = _one_step(run_dir)
    model_cfg = load_train_config(compose_config("train", ["model=tiny"])).model
    initial = dict(
        load_model(model_cfg, load_tokenizer(model_cfg), torch.device("cpu")).named_parameters()
    )
    moved = max((weights[k] - initial[k]).abs().max().item() for k in weights)
    assert moved > 1e-4  # the step moved the weights: comparing them is not vacuous
    return record, weights


def _one_step(run_dir) -> tuple[dict, dict[str, torch.Tensor]]:
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    saved = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    return record, {name: p.detach().clone() for name, p in saved.named_parameters()}


@pytest.mark.parametrize("preset", ["zero1", "zero2", "zero3", "zero2_offload"])
def test_every_zero_stage_takes_the_same_step_as_no_zero(
    compose_config, tmp_path, preset, zero0_step
):
    """Same seed, same samples, same loss and gradient norm, and after one AdamW step (lr 1e-3,
    large enough to move every weight) the same weights within float32 rounding: partitioning
    the optimizer state, the gradients or the parameters changes where numbers live, not what
    they are. Both sides run micro-batches of at most 64 real tokens: several, the accumulation
    boundary set by hand on the last (float64 equality with the fixed-count path:
    tests/test_micro_batches.py; float32 AdamW's first step, ~lr x sign(g), is too sensitive to
    compare different splits here)."""
    summary = train_tiny(
        compose_config, tmp_path, preset, "trainer.max_steps=1", "trainer.lr=1e-3", BUDGET
    )
    assert summary["steps"] == 1
    record, weights = _one_step(tmp_path)
    reference_record, reference = zero0_step
    assert record["reward_mean"] == reference_record["reward_mean"]
    assert record["pg_loss"] == pytest.approx(reference_record["pg_loss"], rel=1e-5, abs=1e-7)
    assert record["grad_norm"] == pytest.approx(reference_record["grad_norm"], rel=1e-4)
    assert weights.keys() == reference.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("preset", ["zero0", "zero2", "zero3"])
def test_mpo_mtp_modules_train_and_are_saved_beside_final_in_zero_stages(
    compose_config, tmp_path, preset
):
    """The MTP modules live in the DeepSpeed engine (partitioned under ZeRO-3, gathered to save)
    and leave final/ a plain Hugging Face model."""
    from safetensors import safe_open

    from tepo_cli.mtp.files import load_mtp_modules

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


def _lora_step(compose_config, run_dir, preset: str) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    train_tiny(
        compose_config, run_dir, preset, "model.lora.r=4", "trainer.max_steps=1", "trainer.lr=1e-2"
    )
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return record, load_file(run_dir / "final" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def lora_zero0_step(compose_config, tmp_path_factory) -> tuple[dict, dict[str, torch.Tensor]]:
    record, adapter = _lora_step(compose_config, tmp_path_factory.mktemp("lora0"), "zero0")
    assert len(adapter) == 28 and all(t.abs().max() > 1e-4 for t in adapter.values())  # B moved
    return record, adapter


@pytest.mark.parametrize("preset", ["zero1", "zero2", "zero3"])
def test_lora_takes_the_same_step_in_every_zero_stage(
    compose_config, tmp_path, preset, lora_zero0_step
):
    """LoRA (the base frozen, the KL reference the base through the same partitioned modules)
    through each stage: the same loss, gradient norm and adapter weights as without ZeRO."""
    record, adapter = _lora_step(compose_config, tmp_path, preset)
    reference_record, reference = lora_zero0_step
    assert record["pg_loss"] == pytest.approx(reference_record["pg_loss"], rel=1e-5, abs=1e-7)
    assert record["kl"] == pytest.approx(reference_record["kl"], abs=1e-7)
    assert record["grad_norm"] == pytest.approx(reference_record["grad_norm"], rel=1e-4)
    assert adapter.keys() == reference.keys()
    for name, tensor in adapter.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6, msg=name)
