"""§0.1 REINFORCE++ (`advantage=reinforce_pp`) against a float64 loop written from verl's
`reinforce_plus_plus(_baseline)` outcome estimators: rewards tiled over the tokens, group-centred
or not, then whitened over every valid token of the step."""

from __future__ import annotations

import math

import pytest
import torch

from tepo_cli.algos import reinforce_pp_advantages
from tepo_cli.algos.gae import whiten_sums

F64 = torch.float64
G = 4
LENGTHS = [5, 3, 1, 2, 4, 5, 2, 3, 6, 1, 2, 2]  # three groups of four, response token counts


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0.5, 0, 2, 0], dtype=F64)
    mask = torch.zeros(len(LENGTHS), 7, dtype=torch.bool)
    for row, length in enumerate(LENGTHS):
        if row % 2:
            mask[row, 7 - length :] = True  # left padding
        else:
            mask[row, :length] = True
    return rewards, mask


def _reference(rewards: torch.Tensor, baseline: str) -> list[float]:
    """One value per token, mean and Bessel variance over all tokens, then (x − m)/√(v + 1e-8)."""
    values = [float(r) for r in rewards]
    if baseline == "group":
        for start in range(0, len(values), G):
            group = values[start : start + G]
            mean = sum(group) / G
            values[start : start + G] = [v - mean for v in group]
    tokens = [v for v, n in zip(values, LENGTHS, strict=True) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    variance = sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1)
    return [(v - mean) / math.sqrt(variance + 1e-8) for v in values]


@pytest.mark.parametrize("baseline", ["group", "none"])
def test_advantages_match_the_token_level_whitening_by_hand(baseline: str) -> None:
    rewards, mask = _batch()
    got = reinforce_pp_advantages(rewards, mask, G, baseline)
    assert got.shape == rewards.shape and got.dtype == F64
    torch.testing.assert_close(got, torch.tensor(_reference(rewards, baseline), dtype=F64))
    if baseline == "group":  # a group of equal rewards is centred to 0, then shifted by the mean
        assert len(set(got[4:8].tolist())) == 1 and got[4] != 0


def test_statistics_summed_over_ranks_equal_one_big_batch() -> None:
    """Two ranks with two and one group: each whitens with both ranks' (count, Σ, Σ²)."""
    rewards, mask = _batch()
    whole = reinforce_pp_advantages(rewards, mask, G)
    first, second = slice(0, 8), slice(8, 12)

    def other_rank(rows: slice):
        centred = rewards[rows].reshape(-1, G) - rewards[rows].reshape(-1, G).mean(1, keepdim=True)
        tokens = centred.reshape(-1)[:, None].expand(mask[rows].shape)
        return whiten_sums(tokens, mask[rows])

    parts = [
        reinforce_pp_advantages(rewards[a], mask[a], G, reduce=lambda s, b=b: s + other_rank(b))
        for a, b in ((first, second), (second, first))
    ]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=0, atol=1e-12)
    assert not torch.allclose(reinforce_pp_advantages(rewards[first], mask[first], G), whole[first])


def test_bad_shapes_and_baselines_are_refused() -> None:
    rewards, mask = _batch()
    with pytest.raises(ValueError, match="rewards must be"):
        reinforce_pp_advantages(rewards, mask[:3], G)
    with pytest.raises(ValueError, match="baseline must be"):
        reinforce_pp_advantages(rewards, mask, G, "mean")  # type: ignore[arg-type]
