"""Off-policy sequence masking `algo.off_policy_mask` (docs/objectives.md §0.13) against float64
by hand: each response's drift mean_t(ℓ^samp − ℓ) in plain Python, the responses with Â < 0 and a
drift above δ out of the policy term, every valid token still in the token-mean's normaliser."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from tiny_run import tiny_run

from tepo_cli.algos import policy_loss, resolve_algo

F64 = torch.float64
EPS = 0.2


def batch(seed: int, rows: int = 6, columns: int = 8):
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = -torch.rand(shape, generator=gen, dtype=F64) * 3 - 0.05
    old = logp + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    adv = torch.tensor([1.0, -1.0, -0.5, 0.7, -2.0, -0.1], dtype=F64)[:rows]
    lengths = torch.randint(2, columns + 1, (rows,), generator=gen)
    mask = torch.arange(columns) < lengths[:, None]
    return logp, old, adv, mask


def drifts(sampling, logp, mask) -> list[float]:
    out = []
    for b in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[b, t]]
        out.append(sum(float(sampling[b, t]) - float(logp[b, t]) for t in valid) / len(valid))
    return out


def reference(logp, old, adv, mask, sampling, delta) -> tuple[float, float]:
    """(token-mean clipped surrogate over the kept rows / every valid token, dropped share)."""
    drift = drifts(sampling, logp, mask)
    valid = int(mask.sum())
    total, dropped = 0.0, 0
    for b in range(mask.shape[0]):
        tokens = [t for t in range(mask.shape[1]) if mask[b, t]]
        if float(adv[b]) < 0 and drift[b] > delta:
            dropped += len(tokens)
            continue
        for t in tokens:
            ratio = math.exp(float(logp[b, t]) - float(old[b, t]))
            clipped = min(max(ratio, 1 - EPS), 1 + EPS)
            total -= min(ratio * float(adv[b]), clipped * float(adv[b]))
    return total / valid, dropped / valid


@pytest.mark.parametrize("delta", [0.0, 0.05, 0.2])
@pytest.mark.parametrize("engine", [False, True], ids=["pi_old", "engine"])
def test_the_negative_far_responses_leave_the_policy_term(delta, engine):
    logp, old, adv, mask = batch(0)
    sampling = old + 0.1 if engine else old  # an engine's own log-probs, a little apart
    extra = {"sampling_logp": sampling} if engine else {}
    loss, metrics = policy_loss(
        "dapo", logp, old, adv, mask, eps_high=EPS, off_policy_mask=delta, **extra
    )
    expected, dropped = reference(logp, old, adv, mask, sampling, delta)
    assert float(loss) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert metrics["off_policy_masked_frac"] == pytest.approx(dropped)


def test_the_mask_acts_here_on_some_rows_and_not_others():
    """The fixture is one where δ = 0.05 drops some negative rows and keeps others: the test
    above is not vacuous."""
    logp, old, adv, mask = batch(0)
    drift = drifts(old, logp, mask)
    dropped = [float(a) < 0 and d > 0.05 for a, d in zip(adv, drift, strict=True)]
    kept_negative = [float(a) < 0 and d <= 0.05 for a, d in zip(adv, drift, strict=True)]
    assert any(dropped) and any(kept_negative)
    assert any(float(a) >= 0 and d > 0.05 for a, d in zip(adv, drift, strict=True))


def test_per_token_advantages_are_tested_token_by_token():
    logp, old, adv, mask = batch(1)
    per_token = adv[:, None].expand(mask.shape).clone()
    per_token[:, ::2] *= -1  # every other token flips sign
    logp.requires_grad_(True)
    loss, _ = policy_loss("dapo", logp, old, per_token, mask, off_policy_mask=0.0)
    (grad,) = torch.autograd.grad(loss, logp)
    drift = drifts(old, logp.detach(), mask)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t] and float(per_token[b, t]) < 0 and drift[b] > 0:
                assert float(grad[b, t]) == 0.0
    assert bool((grad[mask] != 0).any())


def test_off_is_the_plugin_bit_for_bit_and_a_huge_delta_drops_nothing():
    logp, old, adv, mask = batch(2)
    plain, plain_metrics = policy_loss("grpo", logp, old, adv, mask, beta=0)
    same, metrics = policy_loss("grpo", logp, old, adv, mask, beta=0, off_policy_mask=None)
    assert torch.equal(plain, same) and metrics == plain_metrics
    wide, wide_metrics = policy_loss("grpo", logp, old, adv, mask, beta=0, off_policy_mask=1e9)
    assert torch.equal(plain, wide) and wide_metrics["off_policy_masked_frac"] == 0.0


def test_a_negative_delta_is_refused():
    with pytest.raises(ValidationError, match="off_policy_mask"):
        resolve_algo("grpo", {"off_policy_mask": -0.1})


@pytest.mark.slow
def test_two_off_policy_training_steps_log_the_mask(compose_config, tmp_path):
    """Four minibatches a rollout: the later ones train a policy that has moved from π_old."""
    overrides = ["algo=grpo", "algo.off_policy_mask=0.0", "trainer.minibatches=4"]
    records = tiny_run(compose_config, tmp_path, [*overrides, "trainer.lr=1e-2"]).records
    assert all(0.0 <= r["off_policy_masked_frac"] <= 1.0 for r in records)
    assert any(r["off_policy_masked_frac"] > 0 for r in records)


@pytest.mark.parametrize("delta", [None, 0.1])
def test_the_trainer_measures_the_drift_from_the_engines_own_log_probs(
    compose_config, tiny_model, delta
):
    """With an engine's log-probs in the rollout (vLLM's), the micro-batch's PolicyBatch carries
    them as `sampling_logp` when the mask is on, and nothing when it is off."""
    import dataclasses

    from small_experience import ROWS, small_experience

    import tepo_cli.train.experience as exp
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.models.policy import Policy
    from tepo_cli.train.micro_batch_objective import forward_scores, objective_batch

    overrides = ["model=tiny", "rollout.n=4", "trainer.prompts_per_step=2", "algo=dapo"]
    overrides += [f"algo.off_policy_mask={'null' if delta is None else delta}"]
    cfg = load_train_config(compose_config("train", overrides))
    torch.manual_seed(0)
    policy = Policy(tiny_model, cfg.kernel)
    experience = small_experience(torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]))
    engine_logp = -torch.rand(experience.rollout.completion_mask.shape)
    experience.rollout = dataclasses.replace(experience.rollout, logprobs=engine_logp)
    exp._add_scores(cfg, policy, None, experience.batch, experience)
    rows = torch.arange(ROWS)
    part = experience.batch.select(rows)
    scores = policy(part, cfg.rollout.temperature, make=forward_scores(cfg, experience))
    tokens = float(part.trained_mask.sum())
    batch = objective_batch(cfg, experience, rows, part, scores, tokens, float(ROWS), None)
    if delta is None:
        assert batch.sampling_logp is None
    else:
        mask = batch.mask
        assert torch.equal(batch.sampling_logp[mask], engine_logp[:, : mask.shape[1]][mask])
        assert bool((batch.sampling_logp[~mask] == 0).all())
