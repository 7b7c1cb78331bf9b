"""Training across turns (docs/objectives.md §0.2): the objective acts on the model's own tokens
only, and no K-block or window spans an observation. Float64 references: an episode's units are
its turns' units taken as separate responses; observation tokens get exactly zero gradient; an
episode's loss through the policy equals one plain pass over the same tokens with the same mask."""

from __future__ import annotations

import pytest
import torch
from test_units import masks_from_rows, unit_groups

from tepo_cli.algos import policy_loss
from tepo_cli.algos.ratio import unit_log_ratio
from tepo_cli.config.schema import KernelConfig
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch, turn_index
from tepo_cli.kernels.units import unit_view
from tepo_cli.models.policy import Policy

F64 = torch.float64
# Row 0: three turns (4, 3 and 2 tokens) with observations between them; row 1: one turn.
EPISODES = masks_from_rows(["xxxx..xxx...xx.", "xxxxxxx........"])


def turns_as_rows(mask: torch.Tensor) -> list[tuple[int, list[int]]]:
    """(row, columns) of each turn: each run of True in a row."""
    found = []
    for b in range(mask.shape[0]):
        run: list[int] = []
        for t in range(mask.shape[1] + 1):
            if t < mask.shape[1] and mask[b, t]:
                run.append(t)
            elif run:
                found.append((b, run))
                run = []
    return found


def split_rows(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each turn as its own response row (left-aligned), and that layout's mask."""
    turns = turns_as_rows(mask)
    width = max(len(columns) for _, columns in turns)
    rows = torch.zeros(len(turns), width, dtype=values.dtype)
    rows_mask = torch.zeros(len(turns), width, dtype=torch.bool)
    for index, (b, columns) in enumerate(turns):
        rows[index, : len(columns)] = values[b, columns]
        rows_mask[index, : len(columns)] = True
    return rows, rows_mask


def gather_back(split: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The turn-rows' values placed back at their episode columns."""
    out = torch.zeros(mask.shape, dtype=split.dtype)
    for index, (b, columns) in enumerate(turns_as_rows(mask)):
        out[b, columns] = split[index, : len(columns)]
    return out


def test_turn_index_counts_runs():
    assert turn_index(EPISODES)[0].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2]
    assert turn_index(EPISODES)[1].tolist() == [0] * 15


def test_blocks_start_again_at_each_turn():
    view = unit_view(EPISODES, "block", 3, turn_index(EPISODES))
    assert unit_groups(view, EPISODES) == [
        [[0, 1, 2], [3], [6, 7, 8], [12, 13]],
        [[0, 1, 2], [3, 4, 5], [6]],
    ]
    # without turns, blocks run on across the observations
    assert unit_groups(unit_view(EPISODES, "block", 3), EPISODES)[0][1] == [3, 6, 7]
    # a sequence is still the whole episode
    assert (
        len(unit_groups(unit_view(EPISODES, "sequence", None, turn_index(EPISODES)), EPISODES)[0])
        == 1
    )


@pytest.mark.parametrize(
    "knobs",
    [
        {"unit": "block", "k": 3, "layout": "disjoint", "ratio_norm": "mean"},
        {"unit": "block", "k": 2, "layout": "disjoint", "ratio_norm": "sum"},
        {"unit": "block", "k": 3, "layout": "sliding", "block_weights": "decay:0.1,0.8"},
        {
            "unit": "block",
            "k": 4,
            "layout": "sliding",
            "block_weights": "uniform",
            "tail": "renormalise",
        },
    ],
)
def test_an_episode_s_units_are_its_turns_units_as_separate_responses(knobs):
    generator = torch.Generator().manual_seed(3)
    logp = -torch.rand(EPISODES.shape, generator=generator, dtype=F64)
    old = -torch.rand(EPISODES.shape, generator=generator, dtype=F64)
    episode = unit_log_ratio(logp, old, EPISODES, **knobs, turns=turn_index(EPISODES))
    split_logp, split_mask = split_rows(logp, EPISODES)
    split_old, _ = split_rows(old, EPISODES)
    separate = unit_log_ratio(split_logp, split_old, split_mask, **knobs)
    torch.testing.assert_close(episode, gather_back(separate, EPISODES), rtol=0, atol=1e-15)


@pytest.mark.parametrize("layout", ["disjoint", "sliding"])
def test_one_turn_per_row_changes_nothing(layout):
    mask = masks_from_rows(["xxxxxxx..", "..xxxxxxx", "x........"])
    logp, old = -torch.rand(mask.shape, dtype=F64), -torch.rand(mask.shape, dtype=F64)
    knobs = {"unit": "block", "k": 3, "layout": layout}
    plain = unit_log_ratio(logp, old, mask, **knobs)
    with_turns = unit_log_ratio(logp, old, mask, **knobs, turns=turn_index(mask))
    assert torch.equal(plain, with_turns)


PRESETS = [
    ("grpo", {}),
    ("dapo", {}),
    ("gspo", {}),
    ("tepo", {}),
    ("mpo", {"k": 3}),
    ("mpo_exact", {"k": 2}),
    ("kl_cov", {"cov_fraction": 0.3}),
    ("clip_cov", {"cov_fraction": 0.3, "cov_lb": -10.0}),
    ("cispo", {}),
    ("sapo", {}),
    ("gmpo", {}),
]


@pytest.mark.parametrize(("algo", "knobs"), PRESETS, ids=[p[0] for p in PRESETS])
def test_observation_tokens_get_exactly_zero_gradient(algo, knobs):
    generator = torch.Generator().manual_seed(5)
    present = torch.ones(EPISODES.shape, dtype=torch.bool)  # every column is in the context
    logp = (-torch.rand(present.shape, generator=generator, dtype=F64)).requires_grad_()
    # near the current policy, so no ratio is clipped and every model token has a gradient
    old = logp.detach() + 0.01 * torch.rand(present.shape, generator=generator, dtype=F64)
    entropy = torch.rand(present.shape, generator=generator, dtype=F64)
    advantages = torch.tensor([1.0, -0.5], dtype=F64)
    extra = {}
    if algo.startswith("mpo") and knobs.get("k", 0) and algo == "mpo":
        depths = knobs["k"] - 1
        extra["mtp_logp"] = -torch.rand((*present.shape, depths), generator=generator, dtype=F64)
        extra["old_mtp_logp"] = extra["mtp_logp"] - 0.01
    loss, _ = policy_loss(
        algo,
        logp,
        old,
        advantages,
        EPISODES,
        ref_logp=old - 0.1,
        entropy=entropy,
        old_entropy=entropy + 0.05,
        old_entropy_term=entropy * 0.1,
        turns=turn_index(EPISODES),
        **extra,
        **knobs,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    observations = present & ~EPISODES
    assert grad[observations].abs().max().item() == 0.0
    assert grad[EPISODES].abs().max().item() > 0.0


def test_an_episode_scored_by_the_policy_equals_one_plain_float64_pass(tiny_model, tiny_tokenizer):
    """The episode row (prompt, turns, observations) through the policy's scoring path — with
    packing, and without — then the objective on the model's tokens, equals a plain forward of
    the whole sequence with log-softmax, and the same objective on the same mask."""
    tiny_model.double()
    generator = torch.Generator().manual_seed(7)
    vocab = tiny_model.config.vocab_size
    prompt = torch.randint(5, vocab, (2, 6), generator=generator)
    completion = torch.randint(5, vocab, EPISODES.shape, generator=generator)
    rollout = Rollout(
        prompt,
        torch.ones_like(prompt),
        completion,
        torch.ones(EPISODES.shape, dtype=torch.bool),
        ["", ""],
        torch.zeros(2, dtype=torch.bool),
        None,
        EPISODES.clone(),
    )
    batch = SequenceBatch.from_rollout(rollout)
    assert torch.equal(batch.trained_mask, EPISODES)
    ids = torch.cat([prompt, completion], dim=1)
    logits = tiny_model(input_ids=ids).logits.double()
    plain = (
        torch.log_softmax(logits[:, 5:-1], dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    )
    old = plain.detach() - 0.02
    advantages = torch.tensor([1.0, -1.0], dtype=F64)
    turns = turn_index(EPISODES)
    expected, _ = policy_loss("mpo_exact", plain, old, advantages, EPISODES, turns=turns, k=3)
    for packing in (False, True):
        policy = Policy(tiny_model, KernelConfig(backend="torch"), packing=packing)
        scores = policy(batch, 1.0)
        got, _ = policy_loss(
            "mpo_exact", scores.logp, old, advantages, batch.trained_mask, turns=batch.turns, k=3
        )
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
