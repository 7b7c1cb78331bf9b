"""The critic of advantage=gae (tepo_cli/models/critic.py): values where the policy scores,
zero on padding, the same with prompt sharing, a save that loads back bit for bit, and its
warm-up (`advantage.critic_warmup`), in which the policy waits."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_run import tiny_run

from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.critic import Critic
from tepo_cli.rollout import Sampling
from tepo_cli.rollout.hf import generate

PROMPTS = ["Hi", "What is 7*8? Answer with just the number, please.", "What is 2+2?"]


def _batch(model, tokenizer) -> SequenceBatch:
    torch.manual_seed(4)
    rollout = generate(model, tokenizer, PROMPTS, Sampling(n=2, max_new_tokens=6))
    width = rollout.completion_ids.shape[1]
    lengths = torch.tensor([width, 3, 5, 1, 6, 2])
    rollout.completion_mask = torch.arange(width) < lengths[:, None].clamp(max=width)
    return SequenceBatch.from_rollout(rollout)


def test_values_at_the_policys_positions_zero_on_padding(tiny_model, tiny_tokenizer):
    model = tiny_model.double()
    batch = _batch(model, tiny_tokenizer)
    critic = Critic.from_policy(model, share_prompts=False)
    values = critic(batch)
    assert values.shape == batch.completion_mask.shape and values.dtype == torch.float32
    assert (
        torch.all(values[~batch.completion_mask] == 0)
        and values[batch.completion_mask].abs().sum() > 0
    )
    hidden = model.model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
    ).last_hidden_state  # the state at column P - 1 + t emits completion token t
    start = batch.prompt_width - 1
    expected = critic.value_head(hidden[:, start : start + values.shape[1]]).squeeze(-1).float()
    torch.testing.assert_close(values, torch.where(batch.completion_mask, expected, 0.0))
    shared = Critic.from_policy(model, share_prompts=True)
    shared.load_state_dict(critic.state_dict())
    torch.testing.assert_close(shared(batch), values, rtol=0, atol=1e-6)
    assert not any(p is q for p in critic.parameters() for q in model.parameters())  # a copy


def test_saved_critic_loads_back_identical(tiny_model, tiny_tokenizer, tmp_path):
    batch = _batch(tiny_model, tiny_tokenizer)
    critic = Critic.from_policy(tiny_model)
    with torch.no_grad():
        critic.value_head.bias.fill_(0.25)
    critic.save(tmp_path / "critic")
    loaded = Critic.from_path(str(tmp_path / "critic"), torch.float32, torch.device("cpu"))
    assert torch.equal(loaded(batch), critic(batch))
    fresh = Critic.from_path(str(tmp_path / "critic"), torch.float32, torch.device("cpu"))
    assert float(fresh.value_head.bias) == 0.25  # the head came from value_head.safetensors


def _weights(checkpoint: Path, tag: str) -> dict[str, torch.Tensor]:
    saved = torch.load(checkpoint / tag / "mp_rank_00_model_states.pt", weights_only=False)
    return saved["module"]


def test_in_the_critic_s_warm_up_only_the_critic_learns(compose_config, tmp_path):
    """advantage.critic_warmup=2: steps 1 and 2 leave the policy's weights as they were and step
    the critic; step 3 moves the policy. The warm-up steps log the critic's metrics only."""
    knobs = ["advantage=gae", "rollout.n=1", "trainer.prompts_per_step=4", "algo.beta=0"]
    warm = ["advantage.critic_warmup=2", "trainer.save_every=1", "trainer.keep_checkpoints=3"]
    records = tiny_run(compose_config, tmp_path, [*knobs, *warm], steps=3).records
    steps = [tmp_path / f"checkpoints/step_{step:08d}" for step in (1, 2, 3)]
    policies = [_weights(step, "engine") for step in steps]
    critics = [_weights(step, "critic") for step in steps]
    assert all(torch.equal(policies[0][k], policies[1][k]) for k in policies[0])
    assert not all(torch.equal(policies[1][k], policies[2][k]) for k in policies[1])
    assert not all(torch.equal(critics[0][k], critics[1][k]) for k in critics[0])
    for record in records[:2]:
        assert "value_loss" in record and "critic_grad_norm" in record
        assert "pg_loss" not in record and "grad_norm" not in record
        assert record["trained_tokens"] == 0
    assert "pg_loss" in records[2] and records[2]["trained_tokens"] > 0
