"""Each distinct prompt runs once per batch: same log-probs, gradients and samples as one pass per
row (float64, tiny model), and gradient checkpointing really recomputes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tepo_cli.config.schema import KernelConfig
from tepo_cli.core.sequences import SequenceBatch, first_appearance, prompt_labels
from tepo_cli.models.policy import Policy
from tepo_cli.mtp.modules import attach
from tepo_cli.rollout import Sampling
from tepo_cli.rollout.hf import generate

PROMPTS = ["Hi", "What is 7*8? Answer with just the number, please.", "What is 2+2?"]


def distinct_prompts(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return first_appearance(prompt_labels(ids, mask))


def test_distinct_prompts_compares_padding_as_padding_and_keeps_first_appearance():
    pad = 0
    ids = torch.tensor([[5, 6, 7], [pad, 8, 9], [5, 6, 7], [9, 8, 9], [pad, 8, 9]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1], [0, 1, 1]])
    first, owner = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1, 3]
    assert owner.tolist() == [0, 1, 0, 2, 1]
    # A padded row equals an unpadded one only if the padding is padding on both.
    mask_all = torch.ones_like(mask)
    _, owner = distinct_prompts(ids, mask_all)
    assert owner.tolist() == [0, 1, 0, 2, 1]
    ids_pad_is_token = ids.clone()
    ids_pad_is_token[3] = torch.tensor([pad, 8, 9])  # same ids as row 1, but pad is a real token
    _, owner = distinct_prompts(
        ids_pad_is_token, torch.tensor([[1] * 3, [0, 1, 1], [1] * 3, [1] * 3, [0, 1, 1]])
    )
    assert owner.tolist() == [0, 1, 0, 2, 1]


def test_the_prompt_owner_found_once_travels_with_the_rows():
    """A batch's rows keep their prompts' labels through `select`: the distinct prompts of any
    rows, numbered in order of first appearance, equal those found afresh from those rows'
    tokens (what every consumer computed before the owner travelled with the batch)."""
    pad = 0
    ids = torch.tensor([[5, 6, 7, 1], [pad, 8, 9, 2], [5, 6, 7, 3], [9, 8, 9, 4], [pad, 8, 9, 5]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    batch = SequenceBatch(ids, mask, mask.cumsum(1), mask[:, 3:].bool(), 3)
    assert batch.prompt_owner.tolist() == prompt_labels(ids[:, :3], mask[:, :3]).tolist()
    for rows in ([4, 3, 1], [2, 0], [3], [1, 2, 3, 4, 0]):
        rows = torch.tensor(rows)
        fresh = distinct_prompts(ids[rows, :3], mask[rows, :3])
        for carried in (batch.distinct_prompts(rows), batch.select(rows).distinct_prompts()):
            assert [t.tolist() for t in carried] == [t.tolist() for t in fresh]
    assert [t.tolist() for t in batch.distinct_prompts(torch.tensor([4, 3, 1]))] == [
        [0, 1],
        [0, 1, 0],
    ]


def _batch(model, tokenizer, n: int, seed: int = 1) -> SequenceBatch:
    torch.manual_seed(seed)
    rollout = generate(model, tokenizer, PROMPTS, Sampling(n=n, max_new_tokens=6))
    width = rollout.completion_ids.shape[1]
    lengths = torch.tensor([width, 3, 5, 1, 6, 2][: len(PROMPTS) * n] * n)[: len(PROMPTS) * n]
    rollout.completion_mask = torch.arange(width) < lengths[:, None].clamp(max=width)
    return SequenceBatch.from_rollout(rollout)


# transformers' RMSNorm computes in float32 even in a float64 model, so batches of different
# shapes (3 distinct prompts vs 9 rows) agree to float32 rounding in the backward pass: 1e-6
# relative (in norm). A wrong gather or a lost gradient path would be off by O(1).
def assert_same_gradient(grad: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    error = float((grad - expected).norm() / expected.norm().clamp(min=1e-30))
    assert error < 1e-6, f"{name}: relative error {error:.2e}"


def _logp_and_grads(model, batch: SequenceBatch, share: bool):
    model.zero_grad(set_to_none=True)
    policy = Policy(model, KernelConfig(backend="torch"), share_prompts=share)
    scores = policy(batch, 0.7, with_entropy=True)
    logp, entropy = scores.logp, scores.entropy
    weights = torch.linspace(-1.0, 2.0, logp.numel(), dtype=logp.dtype).view_as(logp)
    ((logp * weights).sum() + entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logp.detach(), entropy.detach(), grads


def test_shared_prompt_pass_equals_one_pass_per_row_in_values_and_gradients(
    tiny_model, tiny_tokenizer
):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    assert batch.attention_mask[:, : batch.prompt_width].eq(0).any(), "prompts must be padded"
    shared = _logp_and_grads(tiny_model, batch, share=True)
    separate = _logp_and_grads(tiny_model, batch, share=False)
    torch.testing.assert_close(shared[0], separate[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(shared[1], separate[1], rtol=0, atol=1e-12)
    assert shared[2].keys() == separate[2].keys()
    for name, grad in shared[2].items():
        assert_same_gradient(grad, separate[2][name], name)


def test_one_token_completions_and_rows_that_share_nothing(tiny_model, tiny_tokenizer):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=2)
    rows = torch.tensor([0, 2, 4])  # one row per prompt: nothing to share
    for part in (batch.select(rows), batch.select(torch.tensor([3]))):
        shared = _logp_and_grads(tiny_model, part, share=True)
        separate = _logp_and_grads(tiny_model, part, share=False)
        torch.testing.assert_close(shared[0], separate[0], rtol=0, atol=1e-12)
    one_token = SequenceBatch(
        batch.input_ids[:, : batch.prompt_width + 1],
        batch.attention_mask[:, : batch.prompt_width + 1],
        batch.position_ids[:, : batch.prompt_width + 1],
        torch.ones(len(batch), 1, dtype=torch.bool),
        batch.prompt_width,
    )
    shared = _logp_and_grads(tiny_model, one_token, share=True)
    separate = _logp_and_grads(tiny_model, one_token, share=False)
    torch.testing.assert_close(shared[0], separate[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("batch_size", [12, 4, 5, 2])
def test_shared_prefill_samples_the_same_tokens(tiny_model, tiny_tokenizer, batch_size):
    """Chunks that split a prompt's samples (batch_size not a multiple of n) included."""
    tiny_model.double()
    sampling = Sampling(n=4, temperature=1.0, max_new_tokens=6, batch_size=batch_size)
    rollouts = []
    for share in (True, False):
        torch.manual_seed(3)
        rollouts.append(
            generate(tiny_model, tiny_tokenizer, PROMPTS, sampling, share_prompts=share)
        )
    shared, separate = rollouts
    assert torch.equal(shared.completion_ids, separate.completion_ids)
    assert torch.equal(shared.completion_mask, separate.completion_mask)
    assert torch.equal(shared.prompt_ids, separate.prompt_ids)
    assert len(set(map(tuple, shared.completion_ids[:4].tolist()))) > 1, "samples must differ"


def test_gradient_checkpointing_recomputes_the_layers_and_keeps_the_gradients(
    tiny_model, tiny_tokenizer
):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=2)
    plain = _logp_and_grads(tiny_model, batch, share=True)
    tiny_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls = []
    layer = tiny_model.model.layers[0]
    handle = layer.mlp.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    try:
        checkpointed = _logp_and_grads(tiny_model, batch, share=True)
    finally:
        handle.remove()
        tiny_model.gradient_checkpointing_disable()
    assert len(calls) == 2, "the first layer's MLP must run again during backward"
    assert not layer.training and not tiny_model.training, "the policy stays in eval mode"
    torch.testing.assert_close(checkpointed[0], plain[0], rtol=0, atol=1e-12)
    for name, grad in checkpointed[2].items():
        assert_same_gradient(grad, plain[2][name], name)


@pytest.mark.parametrize("with_mtp", [False, True])
def test_shared_prompt_gradients_are_bit_identical_run_after_run(
    tiny_model, tiny_tokenizer, with_mtp: bool, all_cores: int
):
    """The rows of one prompt add their gradients into its single prompt pass. torch's CPU
    backward of advanced indexing adds with parallel atomics once a tensor passes 32,768 entries
    (any real model's KV cache), so the sum's order — and its rounding — changed from run to run,
    and a resumed run no longer matched the uninterrupted one bit for bit. Gathers through
    index_select add in a fixed order."""
    if all_cores < 2:
        pytest.skip("the atomic path needs more than one thread")
    from tepo_cli.algos.algo_config import MtpConfig

    prompts = [
        ("Please compute this sum step by step and then reply: " * 4) + str(i) for i in (1, 2, 3)
    ]
    torch.manual_seed(0)
    rollout = generate(tiny_model, tiny_tokenizer, prompts, Sampling(n=16, max_new_tokens=4))
    batch = SequenceBatch.from_rollout(rollout)
    policy = Policy(
        tiny_model,
        KernelConfig(backend="torch"),
        True,
        attach=attach(2, MtpConfig()) if with_mtp else None,
    )
    keys_per_layer = len(batch) * 2 * batch.prompt_width * 16  # rows x kv heads x P x head dim
    assert keys_per_layer > 32_768
    gradients = []
    # Another busy process varies the threads' timing, as a loaded machine does between a run
    # and its resumed copy; without it one process tends to repeat the same interleaving.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for _ in range(20):
            policy.zero_grad(set_to_none=True)
            scores = policy(batch, 0.7, make=("mtp_logp",) if with_mtp else ())
            total = scores.logp.sum() + (scores.mtp_logp.sum() if with_mtp else 0)
            total.backward()
            gradients.append(torch.cat([p.grad.flatten() for p in policy.lm.parameters()]))
    finally:
        busy.kill()
        busy.wait()
    assert all(torch.equal(gradients[0], other) for other in gradients[1:])
