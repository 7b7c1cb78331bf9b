"""The critic of advantage=gae (tepo_cli/models/critic.py): values where the policy scores,
zero on padding, the same with prompt sharing, and a save that loads back bit for bit."""

from __future__ import annotations

import torch

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
