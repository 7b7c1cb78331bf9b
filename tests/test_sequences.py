"""The training forward: hidden states -> kernel path log-probs equal the model's own logits."""

from __future__ import annotations

import pytest
import torch

from tepo_cli.config.schema import KernelConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.policy import Policy
from tepo_cli.rollout import Sampling
from tepo_cli.rollout.hf import generate


@pytest.fixture()
def batch(tiny_model, tiny_tokenizer) -> SequenceBatch:
    torch.manual_seed(1)
    prompts = ["Hi", "What is 7*8? Answer with just the number, please."]  # different lengths
    rollout = generate(tiny_model, tiny_tokenizer, prompts, Sampling(n=2, max_new_tokens=7))
    # A random model rarely says EOS: cut the completions to uneven lengths, as EOS would.
    width = rollout.completion_ids.shape[1]
    rollout.completion_mask = torch.arange(width) < torch.tensor([[width], [3], [5], [1]])
    return SequenceBatch.from_rollout(rollout)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_policy_logprobs_match_the_models_full_logits(tiny_model, batch, temperature):
    tiny_model.double()
    policy = Policy(tiny_model, KernelConfig(backend="torch", chunk_size=5))
    scores = policy(batch, temperature, with_entropy=True)
    logp, entropy = scores.logp, scores.entropy
    logits = tiny_model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
    ).logits.double()
    width = batch.completion_mask.shape[1]
    scores = torch.log_softmax(logits[:, batch.prompt_width - 1 : -1] / temperature, dim=-1)
    expected = scores.gather(-1, batch.completion_ids[..., None])[..., 0][:, :width]
    expected_entropy = -(scores.exp() * scores).sum(-1)[:, :width]
    valid = batch.completion_mask
    torch.testing.assert_close(logp[valid], expected[valid], rtol=0, atol=1e-9)
    torch.testing.assert_close(entropy[valid], expected_entropy[valid], rtol=0, atol=1e-9)
    assert torch.equal(logp[~valid], torch.zeros_like(logp[~valid]))


def test_padding_tokens_do_not_change_values_or_gradients(tiny_model, batch):
    masked = ~batch.completion_mask
    assert masked.any(), "the fixture must contain padded completion positions"

    def grads(sequences: SequenceBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
        tiny_model.zero_grad()
        logp = Policy(tiny_model, KernelConfig(backend="torch"))(sequences, 1.0).logp
        logp.sum().backward()
        return logp.detach(), [p.grad.clone() for p in tiny_model.parameters()]

    logp, reference = grads(batch)
    scrambled_ids = batch.input_ids.clone()
    completion = scrambled_ids[:, batch.prompt_width :]
    completion[masked] = torch.randint(3, 1000, (int(masked.sum()),))
    scrambled = SequenceBatch(
        scrambled_ids,
        batch.attention_mask,
        batch.position_ids,
        batch.completion_mask,
        batch.prompt_width,
    )
    scrambled_logp, scrambled_grads = grads(scrambled)
    assert torch.equal(logp, scrambled_logp)
    assert all(torch.equal(a, b) for a, b in zip(reference, scrambled_grads, strict=True))


def test_select_trims_to_the_longest_completion(batch):
    rows = torch.tensor([0, 3])
    part = batch.select(rows)
    lengths = batch.completion_mask[rows].sum(dim=1)
    assert part.completion_mask.shape[1] == int(lengths.max())
    assert torch.equal(
        part.input_ids, batch.input_ids[rows, : batch.prompt_width + int(lengths.max())]
    )
