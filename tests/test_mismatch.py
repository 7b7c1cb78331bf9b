"""Rollout–training mismatch correction (docs/objectives.md §0.8, invariant 12): float64
references for truncated IS and the sequence mask, the exact no-op when the engine's log-probs
are the trainer's, and the correction inside a real update."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tepo_cli.algos import policy_loss
from tepo_cli.algos.advantage import group_advantages
from tepo_cli.algos.mismatch import MismatchTally, correction_weights
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.policy import Policy
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.runtime.engine import build_engine
from tepo_cli.train import experience as exp
from tepo_cli.train.update import accumulation_steps, update

CAP = 3.0


def _logps(rows: int = 4, width: int = 6, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3
    rollout = old + torch.randn(rows, width, generator=generator, dtype=torch.float64) * 1.5
    mask = torch.ones(rows, width, dtype=torch.bool)
    mask[1, 4:] = False  # right padding
    mask[2, :2] = False  # left padding
    mask[3, :] = False  # nothing generated
    return old, rollout, mask


def test_token_tis_matches_a_float64_reference():
    old, rollout, mask = _logps()
    weights = correction_weights(old, rollout, mask, "token_tis", CAP)
    for b in range(old.shape[0]):
        for t in range(old.shape[1]):
            expected = min(math.exp(old[b, t] - rollout[b, t]), CAP) if mask[b, t] else 0.0
            assert math.isclose(float(weights[b, t]), expected, rel_tol=1e-15, abs_tol=0)
    assert (weights[mask] < CAP).any() and (weights[mask] == CAP).any()  # both sides exercised


def test_seq_mask_keeps_responses_whose_geometric_mean_weight_lies_in_the_band():
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[2, 2] = False
    old = torch.zeros(4, 3, dtype=torch.float64)
    gaps = torch.tensor(  # old - rollout, per token
        [[0.5, -0.5, 1.0], [1.2, 1.2, 1.2], [-1.0, -1.0, 9.0], [math.log(3), 0.0, 0.0]],
        dtype=torch.float64,
    )
    weights = correction_weights(old, old - gaps, mask, "seq_mask", CAP)
    expected_keep = []
    for b in range(4):
        valid = [float(gaps[b, t]) for t in range(3) if mask[b, t]]
        mean = math.exp(sum(valid) / len(valid))
        expected_keep.append(1.0 / CAP <= mean <= CAP)
    # row 0: e^(1/3) -> kept; row 1: e^1.2 > 3 -> masked; row 2: the padded 9.0 is ignored,
    # e^-1 > 1/3 -> kept; row 3: e^(log 3 / 3) -> kept
    assert expected_keep == [True, False, True, True]
    for b, keep in enumerate(expected_keep):
        assert torch.equal(weights[b], mask[b].double() * float(keep))
    tally = MismatchTally()
    tally.add(old, old - gaps, mask, weights, "seq_mask", CAP)
    metrics = MismatchTally.metrics(tally.as_tensor(), tally.abs_max)
    valid_gaps = gaps[mask].abs()
    assert metrics["mismatch_masked_frac"] == 0.25
    # 0-or-1 weights: the effective sample size is the share of tokens kept (8 of the 11)
    assert math.isclose(metrics["mismatch_ess"], 8 / 11, rel_tol=1e-12)
    assert math.isclose(metrics["mismatch_weight_mean"], 8 / 11, rel_tol=1e-12)
    assert math.isclose(metrics["mismatch_abs_mean"], float(valid_gaps.mean()), rel_tol=1e-15)
    assert metrics["mismatch_abs_max"] == 1.2  # the padded 9.0 is not a token


def test_token_tis_tally_counts_the_truncated_tokens():
    old, rollout, mask = _logps()
    weights = correction_weights(old, rollout, mask, "token_tis", CAP)
    tally = MismatchTally()
    tally.add(old, rollout, mask, weights, "token_tis", CAP)
    metrics = MismatchTally.metrics(tally.as_tensor(), tally.abs_max)
    truncated = sum(
        1 for b, t in mask.nonzero().tolist() if math.exp(old[b, t] - rollout[b, t]) > CAP
    )
    assert metrics["mismatch_truncated_frac"] == truncated / int(mask.sum()) > 0
    assert metrics["mismatch_masked_frac"] == 0.0
    # KL(π_roll ‖ π_old) by k3 on the sampled tokens, x = ℓ^old − ℓ^roll, clamped as §0.6's
    k3 = [
        min(math.exp(x) - x - 1, 10.0)
        for x in (float(old[b, t] - rollout[b, t]) for b, t in mask.nonzero().tolist())
    ]
    assert math.isclose(metrics["mismatch_kl"], sum(k3) / len(k3), rel_tol=1e-12)
    assert any(value == 10.0 for value in k3)  # the clamp exercised
    applied = [float(weights[b, t]) for b, t in mask.nonzero().tolist()]
    mean = sum(applied) / len(applied)
    ess = sum(applied) ** 2 / (len(applied) * sum(w * w for w in applied))
    assert math.isclose(metrics["mismatch_weight_mean"], mean, rel_tol=1e-12)
    assert math.isclose(metrics["mismatch_ess"], ess, rel_tol=1e-12) and 0 < ess < 1


def test_token_mis_keeps_each_weight_up_to_the_cap_and_zeroes_the_rest():
    old, rollout, mask = _logps()
    weights = correction_weights(old, rollout, mask, "token_mis", CAP)
    for b in range(old.shape[0]):
        for t in range(old.shape[1]):
            w = math.exp(old[b, t] - rollout[b, t])
            expected = (w if w <= CAP else 0.0) if mask[b, t] else 0.0
            assert math.isclose(float(weights[b, t]), expected, rel_tol=1e-15, abs_tol=0)
    assert (weights[mask] == 0).any() and (weights[mask] > 1).any()  # both sides exercised
    tally = MismatchTally()
    tally.add(old, rollout, mask, weights, "token_mis", CAP)
    metrics = MismatchTally.metrics(tally.as_tensor(), tally.abs_max)
    zeroed = int(((weights == 0) & mask).sum())
    assert metrics["mismatch_truncated_frac"] == zeroed / int(mask.sum()) > 0


@pytest.mark.parametrize("mode", ["seq_tis", "seq_mis"])
def test_sequence_modes_weigh_every_token_by_the_responses_product(mode):
    """W = exp(Σ_t log w_t) over the valid tokens: truncated at C (seq_tis) or, above C, 0
    (seq_mis); a product past float64's range is C or 0, never inf or NaN."""
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[2, 2] = False
    mask[4, :] = False  # nothing generated
    old = torch.zeros(5, 3, dtype=torch.float64)
    gaps = torch.tensor(  # old - rollout, per token
        [[0.5, -0.5, 0.3], [0.6, 0.6, 0.6], [-1.0, 0.5, 9.0], [400.0, 400.0, 0.0], [5.0, 5.0, 5.0]],
        dtype=torch.float64,
    )
    weights = correction_weights(old, old - gaps, mask, mode, CAP)
    products = []
    for b in range(5):
        total = sum(float(gaps[b, t]) for t in range(3) if mask[b, t])
        products.append(math.exp(total) if total < 700 else math.inf)
    # row 0: e^0.3 kept; row 1: e^1.8 > 3; row 2: the padded 9.0 is ignored, e^-0.5; row 3: inf
    assert [p <= CAP for p in products[:4]] == [True, False, True, False]
    for b, product in enumerate(products[:4]):
        expected = min(product, CAP) if mode == "seq_tis" else (product if product <= CAP else 0.0)
        assert torch.allclose(weights[b], mask[b].double() * expected, rtol=1e-15, atol=0)
    assert torch.equal(weights[4], torch.zeros(3, dtype=torch.float64))
    tally = MismatchTally()
    tally.add(old, old - gaps, mask, weights, mode, CAP)
    metrics = MismatchTally.metrics(tally.as_tensor(), tally.abs_max)
    assert metrics["mismatch_masked_frac"] == 0.5  # rows 1 and 3 of the four with tokens
    assert metrics["mismatch_truncated_frac"] == 0.0


@pytest.mark.parametrize("floor", [None, 0.5])
@pytest.mark.parametrize(
    "mode", ["none", "token_tis", "token_mis", "seq_tis", "seq_mis", "seq_mask"]
)
def test_equal_log_probs_give_weights_of_exactly_one(mode, floor):
    old, _, mask = _logps()
    weights = correction_weights(old, old.clone(), mask, mode, CAP, floor)
    assert torch.equal(weights, mask.double())


FLOOR = 0.5


def _bounded(weight: float, mode: str) -> float:
    """A weight w (token) or W (response) under the cap and the floor, as TRL bounds them."""
    if mode in ("token_tis", "seq_tis"):
        return min(max(weight, FLOOR), CAP)
    return weight if FLOOR <= weight <= CAP else 0.0


@pytest.mark.parametrize("mode", ["token_tis", "token_mis", "seq_tis", "seq_mis", "seq_mask"])
def test_a_floor_bounds_each_weight_from_below_as_a_float64_reference_does(mode):
    """rollout.correction_floor F (TRL's clip_min): *_tis raise a weight below F to F, *_mis zero
    it, seq_mask keeps responses whose geometric-mean weight lies in [F, C] (not [1/C, C])."""
    old, rollout, mask = _logps(rows=6, width=5, seed=4)
    weights = correction_weights(old, rollout, mask, mode, CAP, FLOOR)
    for b in range(old.shape[0]):
        gaps = [float(old[b, t] - rollout[b, t]) for t in range(old.shape[1]) if mask[b, t]]
        for t in range(old.shape[1]):
            if not mask[b, t]:
                expected = 0.0
            elif mode.startswith("token"):
                expected = _bounded(math.exp(float(old[b, t] - rollout[b, t])), mode)
            elif mode == "seq_mask":
                expected = float(FLOOR <= math.exp(sum(gaps) / len(gaps)) <= CAP)
            else:
                expected = _bounded(math.exp(sum(gaps)), mode)
            assert math.isclose(float(weights[b, t]), expected, rel_tol=1e-14, abs_tol=0)
    unfloored = correction_weights(old, rollout, mask, mode, CAP)
    assert (weights != unfloored).any()  # the floor acted on these log-probs
    tally = MismatchTally()
    tally.add(old, rollout, mask, weights, mode, CAP, FLOOR)
    metrics = MismatchTally.metrics(tally.as_tensor(), tally.abs_max)
    if mode.startswith("token"):
        outside = [
            not FLOOR <= math.exp(float(old[b, t] - rollout[b, t])) <= CAP
            for b, t in mask.nonzero().tolist()
        ]
        assert metrics["mismatch_truncated_frac"] == sum(outside) / len(outside) > 0
    else:
        rows = [b for b in range(old.shape[0]) if mask[b].any()]
        left_out = [
            not FLOOR <= math.exp(float((old[b] - rollout[b])[mask[b]].sum())) <= CAP
            if mode != "seq_mask"
            else not (weights[b] > 0).any()
            for b in rows
        ]
        assert metrics["mismatch_masked_frac"] == sum(left_out) / len(rows) > 0


def test_without_a_floor_the_sequence_mask_band_is_one_over_c_to_c():
    """F unset keeps each peer's default: no lower bound for TRL's modes, 1/C for seq_mask."""
    old = torch.zeros(3, 2, dtype=torch.float64)
    mask = torch.ones(3, 2, dtype=torch.bool)
    means = torch.tensor([0.4, 0.3, 2.0], dtype=torch.float64)  # geometric-mean weights
    rollout = old - means.log()[:, None]
    assert correction_weights(old, rollout, mask, "seq_mask", CAP).tolist() == [
        [1.0, 1.0],  # 0.4 >= 1/3
        [0.0, 0.0],  # 0.3 < 1/3
        [1.0, 1.0],
    ]
    floored = correction_weights(old, rollout, mask, "seq_mask", CAP, 0.25)
    assert floored[:, 0].tolist() == [1.0, 1.0, 1.0]
    tiny = correction_weights(old, old + 30.0, mask, "token_tis", CAP)  # w = e^-30, unbounded
    assert math.isclose(float(tiny[0, 0]), math.exp(-30.0), rel_tol=1e-14)
    with pytest.raises(ValueError, match=r"floor F must lie in \(0, 1\)"):
        correction_weights(old, rollout, mask, "token_tis", CAP, 1.0)


def _off_policy_batch(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    rows, width = 4, 7
    mask = torch.ones(rows, width, dtype=torch.bool)
    mask[0, 5:] = False
    mask[3, :2] = False
    old = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 2
    logp = old + torch.randn(rows, width, generator=generator, dtype=torch.float64) * 0.3
    ref = old + torch.randn(rows, width, generator=generator, dtype=torch.float64) * 0.1
    entropy = torch.rand(rows, width, generator=generator, dtype=torch.float64) * 2
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    return logp.requires_grad_(), old, ref, entropy, advantages, mask


@pytest.mark.parametrize(
    "algo", ["grpo", "dapo", "gspo", "tepo", "mpo_exact", "mpo_disjoint", "cispo", "sapo", "gmpo"]
)
def test_weights_of_one_leave_every_objective_unchanged(algo):
    """Invariant 12: with ℓ^roll = ℓ^old the corrected loss and gradient are the uncorrected ones,
    bit for bit."""
    logp, old, ref, entropy, advantages, mask = _off_policy_batch()
    weights = correction_weights(old, old.clone(), mask, "token_tis", CAP)
    common = dict(ref_logp=ref, entropy=entropy.clone(), old_entropy=entropy, num_tokens=20.0)
    plain, _ = policy_loss(algo, logp, old, advantages, mask, **common)
    (plain_grad,) = torch.autograd.grad(plain, logp)
    corrected, _ = policy_loss(algo, logp, old, advantages, mask, token_weights=weights, **common)
    (corrected_grad,) = torch.autograd.grad(corrected, logp)
    assert torch.equal(plain, corrected) and torch.equal(plain_grad, corrected_grad)


@pytest.mark.parametrize("algo", ["grpo", "dapo", "gspo", "mpo_exact", "cispo", "sapo", "gmpo"])
def test_a_masked_response_contributes_nothing_but_still_counts(algo):
    """seq_mask: weight 0 on a response = that response with no policy term, same normalisers."""
    logp, old, _, _, advantages, mask = _off_policy_batch()
    weights = mask.double()
    weights[1] = 0.0
    beta0 = dict(beta=0.0, num_tokens=float(mask.sum()), num_seqs=4.0)
    corrected, _ = policy_loss(algo, logp, old, advantages, mask, token_weights=weights, **beta0)
    silenced = advantages.clone()
    silenced[1] = 0.0
    expected, _ = policy_loss(algo, logp, old, silenced, mask, **beta0)
    assert math.isclose(float(corrected), float(expected), rel_tol=1e-14, abs_tol=1e-16)
    (grad,) = torch.autograd.grad(corrected, logp)
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))


def test_token_weights_scale_each_tokens_policy_term():
    logp, old, _, _, advantages, mask = _off_policy_batch()
    weights = torch.rand(
        mask.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    count = float(mask.sum())
    corrected, _ = policy_loss(
        "grpo",
        logp,
        old,
        advantages,
        mask,
        token_weights=weights,
        beta=0.0,
        loss_agg="token-mean",
        num_tokens=count,
    )
    ratio = torch.exp(logp.detach() - old)
    surrogate = -torch.minimum(
        ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None]
    )
    expected = float((surrogate * weights)[mask].sum()) / count
    assert math.isclose(float(corrected), expected, rel_tol=1e-13)


def test_correction_settings_are_checked(compose_config):
    cfg = load_train_config(compose_config("train", ["model=tiny"]))
    assert cfg.rollout.correction_mode == "none"  # hf: the trainer generates
    with pytest.raises(ConfigError, match=r"rollout\.correction=token_tis"):
        load_train_config(compose_config("train", ["model=tiny", "rollout.correction=token_tis"]))
    with pytest.raises(ConfigError, match="correction_cap"):
        load_train_config(compose_config("train", ["model=tiny", "rollout.correction_cap=1.0"]))
    with pytest.raises(ValueError, match="mode must be one of"):
        correction_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "tis", CAP)
    with pytest.raises(ConfigError, match=r"rollout\.correction_floor=0\.5 .* resolves to none"):
        load_train_config(compose_config("train", ["model=tiny", "rollout.correction_floor=0.5"]))
    vllm = ["model=tiny", "rollout=vllm", "rollout.correction_floor=0.5"]
    with pytest.raises(ConfigError, match=r"rollout=vllm, rollout\.correction=none"):
        load_train_config(compose_config("train", [*vllm, "rollout.correction=none"]))
    assert load_train_config(compose_config("train", vllm)).rollout.correction_floor == 0.5
    with pytest.raises(ConfigError, match="correction_floor"):
        load_train_config(compose_config("train", [*vllm, "rollout.correction_floor=1.0"]))


@pytest.fixture()
def two_engines(compose_config, tiny_model):
    """Two DeepSpeed engines over identical copies of the tiny policy, and the config."""
    cfg = load_train_config(
        compose_config(
            "train",
            [
                "model=tiny",
                "rollout.n=4",
                "trainer.prompts_per_step=2",
                "trainer.lr=1e-3",
                "algo.beta=0",
                # A row with its advantage zeroed runs as the masked row does: the same
                # micro-batches, so the two updates agree to rounding (train/zero_advantage.py
                # would leave it out, a different summation order).
                "trainer.skip_zero_advantage=false",
            ],
        )
    )
    # The check on rollout=hf is a config rule; the update itself corrects whatever log-probs
    # a rollout carries, with the mode an engine of its own gets by default.
    cfg.rollout.correction = "seq_mask"
    setup_topology(num_threads=None)
    try:
        steps = accumulation_steps(cfg)
        first = build_engine(Policy(copy.deepcopy(tiny_model), cfg.kernel), cfg, steps, 1)
        second = build_engine(Policy(tiny_model, cfg.kernel), cfg, steps, 1)
        yield first, second, cfg
    finally:
        teardown()


def _experience(cfg, engine, rollout_logp_shift: float | None, shifted_row: int = 5):
    generator = torch.Generator().manual_seed(0)
    rows, width = 8, 5
    completion_mask = torch.ones(rows, width, dtype=torch.bool)
    completion_mask[2, 3:] = False
    rollout = Rollout(
        prompt_ids=torch.randint(3, 60, (rows, 4), generator=generator),
        prompt_mask=torch.ones(rows, 4, dtype=torch.long),
        completion_ids=torch.randint(3, 60, (rows, width), generator=generator),
        completion_mask=completion_mask,
        texts=[""] * rows,
        truncated=torch.zeros(rows, dtype=torch.bool),
    )
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    batch = SequenceBatch.from_rollout(rollout)
    if rollout_logp_shift is not None:
        with torch.no_grad():
            logp = engine.module(batch, cfg.rollout.temperature).logp
        logp = torch.where(batch.completion_mask, logp, 0.0)
        logp[shifted_row] += rollout_logp_shift * batch.completion_mask[shifted_row]
        rollout.logprobs = logp
    advantages = group_advantages(rewards, 4)
    return exp.Experience([], rollout, batch, rewards, rewards.bool(), advantages)


def test_update_with_the_trainers_own_log_probs_is_the_uncorrected_update(two_engines):
    first, second, cfg = two_engines
    plain = update(cfg, first, _experience(cfg, first, None), torch.Generator().manual_seed(0))
    corrected = update(cfg, second, _experience(cfg, second, 0.0), torch.Generator().manual_seed(0))
    # The same weights scored without and with autograd agree to float32 rounding only; the
    # sequence mask's weights are then exactly 1.
    assert corrected["mismatch_abs_max"] < 1e-5
    assert corrected["mismatch_masked_frac"] == 0.0
    assert corrected["loss"] == plain["loss"]
    for a, b in zip(first.module.parameters(), second.module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_update_leaves_out_a_response_the_engine_sampled_too_differently(two_engines):
    """Row 5's engine log-probs are 2 nats below the trainer's on every token: w = e^2 > C, so
    the sequence mask drops it, which is the update with row 5's advantage set to 0."""
    first, second, cfg = two_engines
    masked = _experience(cfg, first, -2.0)
    result = update(cfg, first, masked, torch.Generator().manual_seed(0))
    assert result["mismatch_masked_frac"] == 1 / 8
    assert math.isclose(result["mismatch_abs_max"], 2.0, rel_tol=1e-6)
    silenced = _experience(cfg, second, 0.0)
    silenced.advantages = silenced.advantages.clone()
    assert silenced.advantages[5] != 0  # the mask does change this update
    silenced.advantages[5] = 0.0
    update(cfg, second, silenced, torch.Generator().manual_seed(0))
    for a, b in zip(first.module.parameters(), second.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


def test_a_floor_leaves_out_a_response_the_engine_found_likelier(two_engines):
    """Row 5's engine log-probs are 1 nat above the trainer's: its geometric-mean weight e^-1 ≈
    0.37 lies inside the default band [1/3, 3], below a floor of 0.5."""
    first, second, cfg = two_engines
    kept = update(cfg, first, _experience(cfg, first, 1.0), torch.Generator().manual_seed(0))
    assert kept["mismatch_masked_frac"] == 0.0
    cfg.rollout.correction_floor = 0.5
    left_out = update(cfg, second, _experience(cfg, second, 1.0), torch.Generator().manual_seed(0))
    assert left_out["mismatch_masked_frac"] == 1 / 8
