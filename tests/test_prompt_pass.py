"""The prompt pass (models/prompt_pass.py): each distinct prompt of a minibatch run once for all its
micro-batches. Split into micro-batches that read the prompt pass — leaves before the last, the
accumulated gradients carried into the prompt pass by the last — the log-probs, entropies, MTP
depths and every parameter's gradient equal one packed pass over the whole batch (float64), with
the prompt pass's layers checkpointed or not."""

from __future__ import annotations

import pytest
import torch
from test_shared_prompts import _batch, assert_same_gradient

from tepo_cli.algos.algo_config import MtpConfig
from tepo_cli.config.schema import KernelConfig
from tepo_cli.core.sequences import SequenceBatch, widen
from tepo_cli.models.critic import Critic
from tepo_cli.models.policy import Policy
from tepo_cli.models.prompt_pass import MinibatchPrompts
from tepo_cli.mtp.modules import attach
from tepo_cli.train.recompute import checkpointed

# Micro-batches of the 9 rows (3 prompts x 3 answers): mixed prompts, a single row, and a last
# micro-batch that holds answers of one prompt only (the others reach the prompt pass through
# their leaves' gradients alone).
SPLIT = [[0, 4, 8], [1, 2, 5], [3], [6, 7]]


def _weights(like: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.linspace(-1.0, 2.0, like.numel(), dtype=like.dtype).view_as(like) * scale


def _objective(scores, width: int, rows: list[int]) -> torch.Tensor:
    """A loss that weighs every row's log-probs, entropies and MTP depths differently."""
    logp = widen(scores.logp, width)
    loss = (logp * _weights(torch.zeros(9, width, dtype=logp.dtype), 1.0)[rows]).sum()
    loss = loss + (widen(scores.entropy, width) * 0.5).sum()
    if scores.mtp_logp is not None:
        loss = loss + (widen(scores.mtp_logp, width) * 0.3).sum()
    return loss


def _whole(policy: Policy, batch: SequenceBatch, with_mtp: bool):
    policy.zero_grad(set_to_none=True)
    scores = policy(batch, 0.7, with_entropy=True, make=("mtp_logp",) if with_mtp else ())
    width = batch.completion_mask.shape[1]
    _objective(scores, width, list(range(9))).backward()
    return _results(policy, [scores], width, list(range(9)))


def _split(policy: Policy, batch: SequenceBatch, with_mtp: bool, checkpoint: bool):
    policy.zero_grad(set_to_none=True)
    width = batch.completion_mask.shape[1]
    every = torch.arange(len(batch))
    split = [torch.tensor(rows) for rows in SPLIT]
    with checkpointed(policy, checkpoint):
        prompts = MinibatchPrompts.run(policy.prompt_pass, batch, every, split, enabled=True)
    parts = []
    for index, rows in enumerate(SPLIT):
        scores = policy(
            batch.select(split[index]),
            0.7,
            with_entropy=True,
            make=("mtp_logp",) if with_mtp else (),
            prompts=prompts.read(index),
        )
        prompts.carry_grads(index, _objective(scores, width, rows)).backward()
        parts.append(scores)
    return _results(policy, parts, width, [row for rows in SPLIT for row in rows])


def _results(policy: Policy, parts, width: int, order: list[int]):
    back = torch.argsort(torch.tensor(order))
    joined = {}
    for name in ("logp", "entropy", "mtp_logp"):
        values = [getattr(s, name) for s in parts]
        if values[0] is not None:
            joined[name] = torch.cat([widen(v.detach(), width) for v in values])[back]
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return joined, grads


@pytest.mark.parametrize(
    ("with_mtp", "checkpoint"),
    [(False, False), (False, True), (True, True)],  # MTP depths read states, however computed
    ids=["backbone-kept", "backbone-checkpointed", "mtp-checkpointed"],
)
def test_micro_batches_reading_a_prompt_pass_equal_one_packed_pass(
    tiny_model, tiny_tokenizer, with_mtp, checkpoint
):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    assert batch.attention_mask[:, : batch.prompt_width].eq(0).any(), "prompts must be padded"
    torch.manual_seed(0)
    depths = 2 if with_mtp else 0
    kernel = KernelConfig(backend="torch")
    modules = attach(depths, MtpConfig()) if depths else None
    policy = Policy(tiny_model, kernel, attach=modules, packing=True).double()
    expected_values, expected_grads = _whole(policy, batch, with_mtp)
    # The first layer's forwards, seen by its MLP: a checkpointed prompt pass runs it once more.
    # (Not a hook on the layer itself: transformers >= 5.23 recomputes the layer's `forward`,
    # inside its `__call__` and its hooks.)
    calls = []
    hook = tiny_model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    values, grads = _split(policy, batch, with_mtp, checkpoint)
    hook.remove()
    assert len(calls) == 1 + len(SPLIT) + checkpoint
    for name, value in values.items():
        torch.testing.assert_close(value, expected_values[name], rtol=0, atol=1e-12, msg=name)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert_same_gradient(grad, expected_grads[name], name)


def test_a_micro_batch_without_answer_tokens_runs_its_prompts_instead(tiny_model, tiny_tokenizer):
    """Row 3 alone is a micro-batch of SPLIT; with an empty answer there is nothing to pack but
    its prompt, which then runs in its own row (every rank runs one forward per micro-batch:
    ZeRO-3 gathers), and the result is still the one-pass one."""
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    width = batch.prompt_width
    batch.completion_mask[3] = False
    batch.attention_mask[3, width:] = 0
    policy = Policy(tiny_model, KernelConfig(backend="torch"), packing=True).double()
    expected_values, expected_grads = _whole(policy, batch, False)
    values, grads = _split(policy, batch, False, checkpoint=False)
    for name, value in values.items():
        torch.testing.assert_close(value, expected_values[name], rtol=0, atol=1e-12, msg=name)
    for name, grad in grads.items():
        assert_same_gradient(grad, expected_grads[name], name)


def test_the_prompt_pass_holds_each_distinct_prompt_once(tiny_model, tiny_tokenizer):
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    policy = Policy(tiny_model, KernelConfig(backend="torch"), packing=True)
    with torch.no_grad():
        prompts = policy.prompt_pass(batch, torch.arange(len(batch)))
    width = batch.prompt_width
    first, owner = batch.distinct_prompts()
    assert len(first) == 3 and len(batch) == 9  # three prompts, three answers each
    lengths = batch.attention_mask[first, :width].sum(dim=1).tolist()
    assert len(set(lengths)) > 1, "the prompts must differ in length"
    assert prompts.leaves is None  # no gradient recorded: nothing to accumulate
    assert prompts.outputs[-1].shape[0] == sum(lengths)  # each distinct prompt once
    layers = tiny_model.config.num_hidden_layers
    assert prompts.layers == layers and len(prompts.outputs) == 2 * layers + 1
    heads = tiny_model.config.num_key_value_heads
    assert prompts.outputs[0].shape[:2] == (heads, sum(lengths))
    # Each row starts where its prompt does; the prompts lie one after another.
    starts = [0, lengths[0], lengths[0] + lengths[1]]
    assert [prompts.start_of_row[row] for row in range(9)] == [starts[o] for o in owner.tolist()]


def test_critic_micro_batches_reading_a_prompt_pass_equal_one_packed_pass(
    tiny_model, tiny_tokenizer
):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    critic = Critic.from_policy(tiny_model, packing=True).double()
    width = batch.completion_mask.shape[1]
    weights = _weights(torch.zeros(9, width, dtype=torch.float64), 1.0)
    values = critic(batch)
    (values * weights).sum().backward()
    expected = values.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()}
    critic.zero_grad(set_to_none=True)
    split = [torch.tensor(rows) for rows in SPLIT]
    every = torch.arange(len(batch))
    prompts = MinibatchPrompts.run(critic.prompt_pass, batch, every, split, enabled=True)
    parts = []
    for index, rows in enumerate(SPLIT):
        part = critic(batch.select(split[index]), prompts=prompts.read(index))
        loss = (widen(part, width) * weights[rows]).sum()
        prompts.carry_grads(index, loss).backward()
        parts.append(widen(part.detach(), width))
    back = torch.argsort(torch.tensor([row for rows in SPLIT for row in rows]))
    torch.testing.assert_close(torch.cat(parts)[back], expected[0], rtol=0, atol=1e-12)
    for name, param in critic.named_parameters():
        assert_same_gradient(param.grad, expected[1][name], name)


def test_only_the_last_micro_batch_carries_the_gradients_and_no_pass_reads_nothing():
    rows = [torch.tensor([0, 1]), torch.tensor([2])]
    loss = torch.tensor(1.5, requires_grad=True)
    without = MinibatchPrompts(None, rows)
    assert without.tokens == 0 and without.read(0) is None and without.read(1) is None
    assert without.carry_grads(1, loss) is loss
    assert [without.last(i) for i in range(2)] == [False, True]
