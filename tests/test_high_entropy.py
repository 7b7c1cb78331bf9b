"""`top_entropy_quantile` (docs/objectives.md §0.11) against a float64 reference written here.

The reference sorts the valid tokens by entropy in plain Python, keeps the first ceil(ρ·N) (at
least one), and sums −min(ρ_t·A, clip(ρ_t)·A) over the kept tokens only, divided by every valid
token (token-mean); its gradient is written by hand. It shares no code with tepo_cli.algos.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from tiny_run import tiny_run

from tepo_cli.algos import policy_loss, resolve_algo
from tepo_cli.algos.high_entropy import high_entropy_tokens, kept_count

F64 = torch.float64
EPS = 0.2


def batch(seed: int, rows: int = 5, columns: int = 9):
    """Random inputs, right padding, ratios near 1 (some clipped), entropies all distinct."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = -torch.rand(shape, generator=gen, dtype=F64) * 3 - 0.05
    old = logp + 0.25 * torch.randn(shape, generator=gen, dtype=F64)
    adv = 1.5 * torch.randn(rows, generator=gen, dtype=F64)
    lengths = torch.randint(2, columns + 1, (rows,), generator=gen)
    mask = torch.arange(columns) < lengths[:, None]
    entropy = 3 * torch.rand(shape, generator=gen, dtype=F64)
    return logp, old, adv, mask, entropy


def reference_kept(entropy, mask, quantile: float) -> set[tuple[int, int]]:
    valid = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    count = max(1, math.ceil(quantile * len(valid) - 1e-9))
    ranked = sorted(valid, key=lambda bt: -float(entropy[bt]))
    return set(ranked[:count])


def reference_loss(logp, old, adv, mask, kept) -> tuple[float, dict[tuple[int, int], float]]:
    """Token-mean clipped surrogate over the kept tokens, N = every valid token; d/dℓ by hand."""
    valid = int(mask.sum())
    total, grads = 0.0, {}
    for b, t in kept:
        ratio = math.exp(float(logp[b, t]) - float(old[b, t]))
        a = float(adv[b])
        clipped = min(max(ratio, 1 - EPS), 1 + EPS)
        unclipped_wins = ratio * a <= clipped * a
        total -= min(ratio * a, clipped * a)
        grads[(b, t)] = -a * ratio / valid if unclipped_wins else 0.0
    return total / valid, grads


@pytest.mark.parametrize(
    ("quantile", "valid", "count"),
    [
        (0.2, 100, 20),
        (0.2, 36, 8),  # 7.2 rounds up
        (0.07, 100, 7),  # 7.000000000000001 in floats: the authors' rounding keeps 7
        (0.01, 5, 1),  # at least one token
        (0.0, 40, 1),  # TRL's 0: the one token of highest entropy
        (1.0, 7, 7),
        (0.5, 0, 0),
    ],
)
def test_kept_count_rounds_up_as_the_authors_code(quantile, valid, count):
    assert kept_count(quantile, valid) == count


@pytest.mark.parametrize("quantile", [0.05, 0.2, 0.5, 0.8])
def test_the_pick_is_the_highest_entropy_valid_tokens(quantile):
    _, _, _, mask, entropy = batch(1)
    entropy[~mask] = 99.0  # padding never picked, whatever it holds
    kept, metrics = high_entropy_tokens(entropy, mask, quantile)
    expected = reference_kept(entropy, mask, quantile)
    assert {tuple(x) for x in kept.nonzero().tolist()} == expected
    assert metrics["entropy_kept_frac"] == len(expected) / int(mask.sum())
    assert metrics["entropy_threshold"] == min(float(entropy[bt]) for bt in expected)


@pytest.mark.parametrize("quantile", [0.1, 0.3, 0.7])
def test_the_loss_and_gradient_are_the_kept_tokens_over_every_token(quantile):
    logp, old, adv, mask, entropy = batch(2)
    logp.requires_grad_(True)
    loss, metrics = policy_loss(
        "grpo",
        logp,
        old,
        adv,
        mask,
        old_entropy=entropy,
        beta=0.0,
        loss_agg="token-mean",
        top_entropy_quantile=quantile,
    )
    kept = reference_kept(entropy, mask, quantile)
    expected, grads = reference_loss(logp.detach(), old, adv, mask, kept)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    (grad,) = torch.autograd.grad(loss, logp)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            assert float(grad[b, t]) == pytest.approx(grads.get((b, t), 0.0), abs=1e-15)
    assert metrics["entropy_kept_frac"] == len(kept) / int(mask.sum())


def test_one_keeps_every_token_bit_for_bit_and_reads_no_entropy():
    logp, old, adv, mask, entropy = batch(3)
    plain, plain_metrics = policy_loss("tepo", logp, old, adv, mask, old_entropy=entropy, beta=0)
    same, metrics = policy_loss(
        "tepo", logp, old, adv, mask, old_entropy=entropy, beta=0, top_entropy_quantile=1.0
    )
    assert torch.equal(plain, same) and metrics == plain_metrics
    assert "entropy_kept_frac" not in metrics
    assert not resolve_algo("grpo").entropy_selection


def test_the_kl_term_and_the_mismatch_weights_are_kept_apart():
    """The KL term covers every token still; a mismatch weight multiplies the kept tokens'."""
    logp, old, adv, mask, entropy = batch(4)
    ref = logp - 0.3
    args = ("grpo", logp, old, adv, mask)
    every = dict(ref_logp=ref, old_entropy=entropy, beta=0.04)
    _, full = policy_loss(*args, **every)
    _, picked = policy_loss(*args, **every, top_entropy_quantile=0.25)
    assert picked["kl_loss"] == full["kl_loss"] and picked["kl"] == full["kl"]
    assert picked["pg_loss"] != full["pg_loss"]
    weights = 0.5 + torch.rand(mask.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    kept, _ = high_entropy_tokens(entropy, mask, 0.25)
    weighted, _ = policy_loss(
        *args, beta=0.0, token_weights=weights, old_entropy=entropy, top_entropy_quantile=0.25
    )
    by_hand, _ = policy_loss(*args, beta=0.0, token_weights=weights * kept)
    assert torch.equal(weighted, by_hand)


def test_micro_batches_under_the_steps_pick_sum_to_the_whole_batch():
    """Picked once over the step's rows (`entropy_kept`), two micro-batches under the global
    normaliser give the loss of the whole batch picking among all its rows."""
    logp, old, adv, mask, entropy = batch(5, rows=6)
    whole, _ = policy_loss(
        "dapo", logp, old, adv, mask, old_entropy=entropy, top_entropy_quantile=0.3
    )
    kept, _ = high_entropy_tokens(entropy, mask, 0.3)
    tokens = float(mask.sum())
    parts = [
        policy_loss(
            "dapo",
            logp[r],
            old[r],
            adv[r],
            mask[r],
            entropy_kept=kept[r],
            num_tokens=tokens,
            top_entropy_quantile=0.3,
        )[0]
        for r in (slice(0, 2), slice(2, 6))
    ]
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-12)
    alone = policy_loss(
        "dapo",
        logp[:2],
        old[:2],
        adv[:2],
        mask[:2],
        old_entropy=entropy[:2],
        num_tokens=tokens,
        top_entropy_quantile=0.3,
    )[0]
    assert float(alone) != pytest.approx(float(parts[0]))  # a pick among 2 rows differs


@pytest.mark.parametrize("value", [-0.1, 1.5, 2.0])
def test_a_quantile_outside_zero_one_is_refused(value):
    with pytest.raises(ValidationError, match="top_entropy_quantile"):
        resolve_algo("grpo", {"top_entropy_quantile": value})


def test_without_entropies_the_call_names_what_to_pass():
    logp, old, adv, mask, _ = batch(6)
    with pytest.raises(ValueError, match=r"old_entropy is required: top_entropy_quantile=0\.2"):
        policy_loss("grpo", logp, old, adv, mask, beta=0, top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match=r"entropy_kept must be \[B, T\]"):
        policy_loss(
            "grpo", logp, old, adv, mask, beta=0, entropy_kept=mask[:, :2], top_entropy_quantile=0.2
        )


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["algo=tepo", "trainer.minibatches=2"]], ids=["on", "off"])
def test_two_training_steps_log_the_pick(compose_config, tmp_path, extra):
    run = tiny_run(compose_config, tmp_path, [*extra, "algo.top_entropy_quantile=0.2"])
    config, records = run.config, run.records
    rows = config.trainer.prompts_per_step * config.rollout.n // config.trainer.minibatches
    for record in records:
        assert record["grad_norm"] > 0 and record["entropy_threshold"] > 0
        if record["truncated_frac"] == 1.0:  # every answer 8 tokens: N is known exactly
            tokens = 8 * rows
            assert record["entropy_kept_frac"] == kept_count(0.2, tokens) / tokens
        else:
            assert 0.2 <= record["entropy_kept_frac"] < 0.3
