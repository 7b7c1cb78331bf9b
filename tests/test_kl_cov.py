"""KL-Cov and Clip-Cov (docs/objectives.md §1.6) against a float64 reference written here.

The reference follows verl's `compute_policy_loss_kl_cov` / `_clip_cov` in plain Python over the
valid tokens in row-major order (means, covariance, sort, window, draw); its gradient is written
by hand (d/dℓ of −A·e^(ℓ−ℓ_old) is −A·ρ, of |ℓ − ℓ_old| its sign). It shares no code with
tepo_cli.algos.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from tiny_run import tiny_run

from tepo_cli.algos import policy_loss, resolve_algo
from tepo_cli.algos.covariance import (
    random_in_window,
    selection_count,
    token_covariance,
    top_covariance,
)
from tepo_cli.train.cov_selection import selection_seed

F64 = torch.float64


def batch(seed: int, rows: int = 6, columns: int = 12, padding: str = "right", per_token=False):
    """Random inputs with ratios far enough from 1 that the PPO clip catches some tokens."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = -torch.rand(shape, generator=gen, dtype=F64) * 4 - 0.05
    old = logp + 0.4 * torch.randn(shape, generator=gen, dtype=F64)
    adv_shape = shape if per_token else (rows,)
    adv = 1.5 * torch.randn(adv_shape, generator=gen, dtype=F64)
    lengths = torch.randint(2, columns + 1, (rows,), generator=gen)
    positions = torch.arange(columns)
    if padding == "right":
        mask = positions < lengths[:, None]
    elif padding == "left":
        mask = positions >= columns - lengths[:, None]
    else:  # holes anywhere, at least one valid token per row
        mask = torch.rand(shape, generator=gen) < 0.7
        mask[:, 0] = True
    return logp, old, adv, mask


def _valid(mask: torch.Tensor) -> list[tuple[int, int]]:
    rows, columns = mask.shape
    return [(b, t) for b in range(rows) for t in range(columns) if bool(mask[b, t])]


def _adv(adv: torch.Tensor, b: int, t: int) -> float:
    return float(adv[b]) if adv.dim() == 1 else float(adv[b, t])


def reference_cov(logp, adv, mask) -> dict[tuple[int, int], float]:
    """cov per valid token: (A − mean A)(ℓ − mean ℓ), the means over the valid tokens."""
    tokens = _valid(mask)
    a_mean = sum(_adv(adv, b, t) for b, t in tokens) / len(tokens)
    l_mean = sum(float(logp[b, t]) for b, t in tokens) / len(tokens)
    return {(b, t): (_adv(adv, b, t) - a_mean) * (float(logp[b, t]) - l_mean) for b, t in tokens}


def reference_kl_cov(logp, old, adv, mask, fraction, coef):
    """(loss, gradient [B, T], selected set) of KL-Cov, token-mean over these rows."""
    cov = reference_cov(logp, adv, mask)
    n = max(1, int(fraction * len(cov)))
    chosen = set(sorted(cov, key=lambda key: -cov[key])[:n])
    loss, grad = 0.0, torch.zeros_like(logp)
    for b, t in cov:
        d = float(logp[b, t]) - float(old[b, t])
        a, rho = _adv(adv, b, t), math.exp(d)
        term, slope = -a * rho, -a * rho
        if (b, t) in chosen:
            term += coef * abs(d)
            slope += coef * (1.0 if d > 0 else -1.0 if d < 0 else 0.0)
        loss += term
        grad[b, t] = slope / len(cov)
    return loss / len(cov), grad, chosen


def reference_clip_cov(logp, old, adv, mask, fraction, eps, window, seed):
    """(loss, gradient, selected set, candidates) of Clip-Cov, token-mean over these rows: the
    draw is `randperm(len(candidates))` from a generator seeded with `seed`, candidates in
    row-major order (verl's draw, with the generator the docstring of random_in_window names)."""
    cov = reference_cov(logp, adv, mask)
    low, high = eps
    lower, upper = window
    clipped, candidates = set(), []
    for b, t in cov:  # row-major
        rho, a = math.exp(float(logp[b, t]) - float(old[b, t])), _adv(adv, b, t)
        if -a * min(max(rho, 1 - low), 1 + high) > -a * rho:
            clipped.add((b, t))
        elif lower < cov[(b, t)] < upper:
            candidates.append((b, t))
    n = min(max(1, int(fraction * len(cov))), len(candidates))
    order = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))
    chosen = {candidates[i] for i in order[:n].tolist()}
    loss, grad = 0.0, torch.zeros_like(logp)
    for b, t in cov:
        if (b, t) in chosen:
            continue  # dropped: no term, no gradient
        rho, a = math.exp(float(logp[b, t]) - float(old[b, t])), _adv(adv, b, t)
        if (b, t) in clipped:
            loss += -a * min(max(rho, 1 - low), 1 + high)  # constant in ℓ
        else:
            loss += -a * rho
            grad[b, t] = -a * rho / len(cov)
    return loss / len(cov), grad, chosen, candidates, clipped


def loss_and_grad(algo, logp, old, adv, mask, **kwargs):
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(algo, leaf, old, adv, mask, **kwargs)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss, grad, metrics


CASES = [
    (0, "right", False),
    (1, "left", False),
    (2, "holes", False),
    (3, "right", True),
    (4, "holes", True),
]


# KL-Cov ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seed", "padding", "per_token"), CASES)
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.2, 0.5])
def test_kl_cov_loss_and_gradient_match_the_float64_reference(seed, padding, per_token, fraction):
    logp, old, adv, mask = batch(seed, padding=padding, per_token=per_token)
    coef = 0.7
    loss, grad, metrics = loss_and_grad(
        "kl_cov", logp, old, adv, mask, cov_fraction=fraction, cov_coef=coef
    )
    ref_loss, ref_grad, chosen = reference_kl_cov(logp, old, adv, mask, fraction, coef)
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)
    valid = int(mask.sum())
    assert metrics["cov_selected"] == len(chosen) == max(1, int(fraction * valid))
    assert metrics["cov_selected_frac"] == pytest.approx(len(chosen) / valid)
    cov = reference_cov(logp, adv, mask)
    assert metrics["cov_selected_mean"] == pytest.approx(sum(cov[k] for k in chosen) / len(chosen))
    assert metrics["clip_frac"] == 0.0  # KL-Cov has no PPO clip


def test_kl_cov_picks_the_top_tokens_by_covariance():
    logp, _, adv, mask = batch(5, rows=8, columns=20, padding="holes")
    cov = token_covariance(adv, logp, mask)
    ref = reference_cov(logp, adv, mask)
    for (b, t), value in ref.items():
        assert float(cov[b, t]) == pytest.approx(value, rel=1e-12, abs=1e-15)
    assert torch.all(cov[~mask] == 0)
    pick = top_covariance(cov, mask, 0.1)
    picked = set(map(tuple, torch.nonzero(pick.selected).tolist()))
    n = max(1, int(0.1 * len(ref)))
    ordered = sorted(ref.values(), reverse=True)
    assert len(picked) == n and ordered[n - 1] > ordered[n]  # no tie at the boundary
    assert min(ref[k] for k in picked) == ordered[n - 1]
    assert not bool((pick.selected & ~mask).any())


def test_kl_cov_penalty_is_zero_where_pi_equals_pi_old():
    """On-policy (π = π_old) the penalty |ℓ − ℓ_old| is 0 with a zero (sub)gradient: KL-Cov's
    first optimizer step of a rollout is the plain unclipped −A·ρ (docs §1.6)."""
    logp, _, adv, mask = batch(6)
    _, grad, metrics = loss_and_grad("kl_cov", logp, logp, adv, mask, cov_fraction=0.5)
    plain = torch.where(mask, -adv[:, None].expand_as(logp), 0.0) / int(mask.sum())
    torch.testing.assert_close(grad, plain, rtol=1e-12, atol=1e-15)
    assert metrics["cov_loss"] == 0.0 and metrics["cov_selected"] > 0


# Clip-Cov ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seed", "padding", "per_token"), CASES)
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3, 1.0])
def test_clip_cov_loss_and_gradient_match_the_float64_reference(seed, padding, per_token, fraction):
    logp, old, adv, mask = batch(seed, padding=padding, per_token=per_token)
    window, eps = (0.05, 2.0), (0.2, 0.28)
    generator_seed = 100 + seed
    loss, grad, metrics = loss_and_grad(
        "clip_cov",
        logp,
        old,
        adv,
        mask,
        cov_fraction=fraction,
        cov_lb=window[0],
        cov_ub=window[1],
        eps_low=eps[0],
        eps_high=eps[1],
        generator=torch.Generator().manual_seed(generator_seed),
    )
    ref_loss, ref_grad, chosen, candidates, clipped = reference_clip_cov(
        logp, old, adv, mask, fraction, eps, window, generator_seed
    )
    assert clipped and candidates  # both masks are exercised
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)
    valid = int(mask.sum())
    assert metrics["cov_candidates"] == len(candidates)
    assert (
        metrics["cov_selected"]
        == len(chosen)
        == min(max(1, int(fraction * valid)), len(candidates))
    )
    cov = reference_cov(logp, adv, mask)
    for key in chosen:  # inside the window, not clipped, and exactly zero gradient
        assert window[0] < cov[key] < window[1] and key not in clipped
        assert grad[key] == 0.0
    # every other unclipped valid token keeps its gradient
    moving = [k for k in cov if k not in chosen and k not in clipped and _adv(adv, *k) != 0]
    assert all(grad[k] != 0.0 for k in moving)


def test_clip_cov_draw_is_deterministic_given_the_seed():
    logp, _, adv, mask = batch(7, rows=10, columns=30)
    cov = token_covariance(adv, logp, mask)

    def draw(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return random_in_window(cov, mask, None, -100.0, 100.0, 0.05, generator).selected

    assert torch.equal(draw(3), draw(3))
    assert any(not torch.equal(draw(3), draw(seed)) for seed in (4, 5, 6))
    assert int(draw(3).sum()) == max(1, int(0.05 * int(mask.sum())))


def test_clip_cov_with_no_candidate_drops_nothing():
    """A window no token reaches (the tiny model's usual case at verl's 1 < cov < 5) picks
    nothing: Clip-Cov is then the PPO clipped surrogate (DAPO's loss with eps 0.2 / 0.2)."""
    logp, old, adv, mask = batch(8)
    loss, grad, metrics = loss_and_grad("clip_cov", logp, old, adv, mask, cov_lb=50.0, cov_ub=60.0)
    ppo, ppo_grad, _ = loss_and_grad("dapo", logp, old, adv, mask, eps_high=0.2)
    assert metrics["cov_candidates"] == 0 and metrics["cov_selected"] == 0
    assert torch.equal(loss, ppo) and torch.equal(grad, ppo_grad)


# the selection size --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fraction", "valid", "count"),
    [
        (0.0, 100, 1),
        (2e-4, 1000, 1),
        (2e-3, 4480, 8),
        (0.02, 4480, 89),
        (0.29, 100, 28),
        (1.0, 37, 37),
        (0.5, 0, 0),
    ],
)
def test_selection_count_is_max_1_int_fraction_times_n(fraction, valid, count):
    assert (
        selection_count(fraction, valid) == count == (max(1, int(fraction * valid)) if valid else 0)
    )


def test_selection_count_refuses_a_fraction_outside_0_1():
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        selection_count(1.5, 10)


# a pick made over more rows than the call's (the trainer's optimizer step) ------------------------
@pytest.mark.parametrize("algo", ["kl_cov", "clip_cov"])
def test_micro_batches_with_the_step_pick_sum_to_the_one_batch_loss(algo):
    logp, old, adv, mask = batch(9, rows=8)
    cov = token_covariance(adv, logp, mask)
    if algo == "kl_cov":
        selected = top_covariance(cov, mask, 0.2).selected
    else:
        generator = torch.Generator().manual_seed(1)
        selected = random_in_window(cov, mask, None, 0.05, 2.0, 0.3, generator).selected
    knobs = {"cov_coef": 0.5, "cov_selected": selected}
    whole, whole_grad, metrics = loss_and_grad(algo, logp, old, adv, mask, **knobs)
    assert "cov_selected" not in metrics  # a pick passed in is reported by its maker
    counts = {"num_tokens": int(mask.sum()), "num_seqs": 8}
    leaf = logp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    for rows in (slice(0, 3), slice(3, 8)):
        part, _ = policy_loss(
            algo,
            leaf[rows],
            old[rows],
            adv[rows],
            mask[rows],
            cov_coef=0.5,
            cov_selected=selected[rows],
            **counts,
        )
        total = total + part
    (grad,) = torch.autograd.grad(total, leaf)
    torch.testing.assert_close(total, whole, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(grad, whole_grad, rtol=1e-13, atol=1e-15)
    if algo == "clip_cov":
        assert torch.all(whole_grad[selected] == 0)


def test_selection_seed_is_a_pure_function_of_run_step_epoch_minibatch():
    seeds = {
        selection_seed(0, step, epoch, mb) for step in (1, 2) for epoch in (0, 1) for mb in (0, 1)
    }
    assert len(seeds) == 8
    assert selection_seed(3, 7, 0, 1) == selection_seed(3, 7, 0, 1) != selection_seed(4, 7, 0, 1)
    assert all(0 <= seed < 2**63 for seed in seeds)


# configuration -------------------------------------------------------------------------------------
def test_presets_and_their_knobs():
    kl, clip = resolve_algo("kl_cov"), resolve_algo("clip_cov")
    assert (kl.name, kl.unit, kl.loss_agg, kl.beta) == ("kl_cov", "token", "token-mean", 0.0)
    assert (kl.cov_fraction, kl.cov_coef) == (0.02, 1.0)
    assert (clip.name, clip.loss_agg, clip.beta, clip.eps_low, clip.eps_high) == (
        "clip_cov",
        "token-mean",
        0.0,
        0.2,
        0.2,
    )
    assert (clip.cov_fraction, clip.cov_lb, clip.cov_ub) == (0.01, 1.0, 5.0)
    assert kl.covariance_selection and clip.covariance_selection
    assert not resolve_algo("grpo").covariance_selection


@pytest.mark.parametrize(
    ("algo", "overrides", "message"),
    [
        ("kl_cov", {"unit": "block", "k": 4}, "kl_cov selects single tokens"),
        ("clip_cov", {"unit": "sequence"}, "needs unit=token"),
        ("clip_cov", {"cov_lb": 5.0, "cov_ub": 1.0}, "cov_lb .* must be smaller than cov_ub"),
        ("kl_cov", {"cov_fraction": 1.5}, "cov_fraction"),
        ("kl_cov", {"cov_coef": -1.0}, "cov_coef"),
    ],
)
def test_bad_knobs_are_refused_with_what_to_change(algo, overrides, message):
    with pytest.raises(ValidationError, match=message):
        resolve_algo(algo, overrides)


def test_a_cov_selected_of_the_wrong_shape_is_refused():
    logp, old, adv, mask = batch(0)
    with pytest.raises(ValueError, match=r"cov_selected must be \[B, T\]"):
        policy_loss("kl_cov", logp, old, adv, mask, cov_selected=mask[:, :3])


# end to end --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        (
            "kl_cov",
            ["trainer.minibatches=2", "algo.cov_fraction=0.1"],
        ),  # off-policy: the penalty acts
        (
            "clip_cov",
            ["algo.cov_lb=-100", "algo.cov_fraction=0.1"],
        ),  # on-policy: experience.selection
    ],
)
def test_two_training_steps_log_the_selection(compose_config, tmp_path, algo, extra):
    run = tiny_run(compose_config, tmp_path, [f"algo={algo}", *extra])
    config, records = run.config, run.records
    trainer = config.trainer
    rows = trainer.prompts_per_step * config.rollout.n // trainer.minibatches
    for record in records:
        assert record["grad_norm"] > 0
        tokens = record["response_length"] * rows  # the tokens of one optimizer step
        assert record["cov_selected"] >= 1
        assert record["cov_selected_frac"] * tokens == pytest.approx(record["cov_selected"])
        if record["truncated_frac"] == 1.0:  # every answer 8 tokens: N is known exactly
            n = max(1, int(0.1 * tokens))
            expected = n if algo == "kl_cov" else min(n, record["cov_candidates"])
            assert record["cov_selected"] == expected
        if algo == "clip_cov":
            assert record["cov_candidates"] >= record["cov_selected"]
        else:
            assert "cov_candidates" not in record and record["cov_abs_kl"] > 0
