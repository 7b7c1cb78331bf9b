"""Rollout: completion masks (EOS kept, padding dropped) and group layout."""

from __future__ import annotations

import torch

from tepo_cli.rollout import Sampling
from tepo_cli.rollout.backend import completion_mask
from tepo_cli.rollout.hf import generate


def test_completion_mask_keeps_first_eos_and_drops_the_rest():
    eos = 2
    ids = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 9], [5, 6, 7, 8, 9]])
    mask, truncated = completion_mask(ids, [eos])
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, False, False, False],
        [True, True, True, True, True],
    ]
    assert truncated.tolist() == [False, False, True]


def test_completion_mask_with_several_eos_ids():
    mask, truncated = completion_mask(torch.tensor([[4, 9, 1, 3]]), [3, 9])
    assert mask.tolist() == [[True, True, False, False]]
    assert truncated.tolist() == [False]


def test_generate_groups_samples_and_pads_across_chunks(tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    prompts = ["What is 1+1?", "What is 2*3? Answer with just the number."]
    sampling = Sampling(n=3, temperature=1.0, max_new_tokens=6, batch_size=4)
    rollout = generate(tiny_model, tiny_tokenizer, prompts, sampling)
    assert rollout.prompt_ids.shape[0] == 6 and rollout.completion_ids.shape[0] == 6
    assert rollout.completion_ids.shape[1] <= 6
    # Group layout: rows 0-2 share prompt 0, rows 3-5 prompt 1 (left-padded to one width).
    assert torch.equal(rollout.prompt_ids[0], rollout.prompt_ids[2])
    assert not torch.equal(rollout.prompt_ids[2], rollout.prompt_ids[3])
    assert rollout.prompt_mask[0, 0] == 0 and rollout.prompt_mask[3, 0] == 1
    lengths = rollout.completion_mask.sum(dim=1)
    assert torch.equal(lengths, rollout.lengths)
    assert all(1 <= int(n) <= 6 for n in lengths)
    assert len(rollout.texts) == 6


def test_greedy_generation_is_deterministic(tiny_model, tiny_tokenizer):
    sampling = Sampling(n=1, greedy=True, max_new_tokens=5)
    first = generate(tiny_model, tiny_tokenizer, ["What is 3+4?"], sampling)
    second = generate(tiny_model, tiny_tokenizer, ["What is 3+4?"], sampling)
    assert torch.equal(first.completion_ids, second.completion_ids)


def test_take_and_concat_repad_prompts_left_and_completions_right():
    from tepo_cli.core.rollout_record import Rollout

    short = Rollout(
        prompt_ids=torch.tensor([[7, 8]]),
        prompt_mask=torch.tensor([[1, 1]]),
        completion_ids=torch.tensor([[5, 2]]),
        completion_mask=torch.tensor([[True, True]]),
        texts=["a"],
        truncated=torch.tensor([False]),
    )
    long = Rollout(
        prompt_ids=torch.tensor([[6, 7, 8], [0, 7, 9]]),
        prompt_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]),
        completion_ids=torch.tensor([[4, 4, 4], [3, 2, 0]]),
        completion_mask=torch.tensor([[True, True, True], [True, True, False]]),
        texts=["b", "c"],
        truncated=torch.tensor([True, False]),
    )
    merged = Rollout.concat([short, long.take(torch.tensor([1, 0]))], pad_id=0)
    assert merged.prompt_ids.tolist() == [[0, 7, 8], [0, 7, 9], [6, 7, 8]]
    assert merged.prompt_mask.tolist() == [[0, 1, 1], [0, 1, 1], [1, 1, 1]]
    assert merged.completion_ids.tolist() == [[5, 2, 0], [3, 2, 0], [4, 4, 4]]
    assert merged.lengths.tolist() == [2, 2, 3]
    assert merged.texts == ["a", "c", "b"]
    assert merged.truncated.tolist() == [False, False, True]
