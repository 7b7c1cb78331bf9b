"""Every objective trains end to end in the real loop (tiny model, 3 steps, one CPU rank)."""

from __future__ import annotations

import pytest
from tiny_run import tiny_run

from tepo_cli.mtp.warmup_size import warmup_size

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo=grpo"],
        ["algo=dapo"],
        ["algo=gspo"],
        ["algo=tepo"],
        ["algo=mpo", "k=4", "algo.mtp.warmup.steps=2"],
        ["algo=mpo_exact", "k=4"],
        ["algo=mpo_disjoint"],
        ["algo=kl_cov", "trainer.minibatches=2"],  # the penalty acts from the second minibatch
        ["algo=clip_cov"],
        # off-policy from the second minibatch, each with one REINFORCE++ advantage
        ["algo=cispo", "advantage=reinforce_pp", "trainer.minibatches=2"],
        ["algo=gmpo", "trainer.minibatches=2"],
        [
            "algo=sapo",
            "advantage=reinforce_pp",
            "advantage.baseline=none",
            "rollout.n=1",
            "trainer.prompts_per_step=8",
            "trainer.minibatches=2",
        ],
        ["algo=dapo", "k=2"],
        ["algo=mpo_exact", "algo.block_weights=geometric:0.5", "algo.tail=renormalise"],
        [
            "algo=mpo",
            "k=3",
            "algo.mtp.head=shared",
            "algo.mtp.aux_coef=0.1",
            "algo.mtp.backbone_grad=false",
            "algo.mtp.warmup.steps=1",
            "trainer.ppo_epochs=2",
            "trainer.micro_batch_tokens=96",
        ],
        ["algo=mpo", "k=2", "algo.mtp.trainable=false", "algo.mtp.warmup.steps=0"],
        ["algo=tepo", "algo.mask_criterion=first_order", "trainer.ppo_epochs=2"],
        ["algo=tepo", "algo.mask_criterion=first_order"],
        ["algo=tepo", "algo.mask_criterion=advantage_only"],
        ["algo=grpo", "advantage=rloo"],
        ["algo=grpo", "advantage=gae", "rollout.n=1", "trainer.prompts_per_step=8"],
        [
            "algo=tepo",
            "advantage=gae",
            "advantage.gamma=0.95",
            "advantage.lam=0.9",
            "rollout.n=2",
            "trainer.ppo_epochs=2",
        ],
        ["algo=mpo", "k=3", "advantage=gae", "rollout.n=1", "algo.mtp.warmup.steps=1"],
        ["algo=mpo_exact", "advantage=grpo", "advantage.scale=none"],
        [
            "algo=grpo",
            "trainer.ppo_epochs=2",
            "trainer.minibatches=2",
            "trainer.micro_batch_tokens=96",
        ],
    ],
    ids=lambda o: " ".join(o),
)
def test_objective_trains_three_steps(compose_config, tmp_path, overrides):
    run = tiny_run(compose_config, tmp_path, overrides, steps=3)
    config, summary, records = run.config, run.summary, run.records
    warmup = [r for r in run.lines if "mtp_warmup_step" in r]
    depths = config.algo.mtp_depths
    settings = config.algo.mtp.warmup
    steps = warmup_size(config).steps  # zero steps draw no batch: no record
    logged = {0, steps, *range(0, steps + 1, settings.log_every)}
    assert [r["mtp_warmup_step"] for r in warmup] == (sorted(logged) if depths and steps else [])
    for depth in range(2, depths + 2):
        assert all(r[f"mtp_nll_d{depth}"] > 0 for r in records if f"mtp_nll_d{depth}" in r)
    if depths:
        assert summary["mtp_parameters"] > 0 and any("mtp_nll_d2" in r for r in records)
        if config.algo.mtp.aux_coef:
            assert all(r["mtp_aux_loss"] > 0 for r in records)
    assert any(r["grad_norm"] > 0 for r in records)
    if config.algo.kl_mask == "tepo":
        # the mask selects some tokens, not none and not all (it then would not be a mask)
        assert any(0.0 < r["kl_mask_frac"] < 1.0 for r in records)
    if config.algo.covariance_selection:  # KL-Cov / Clip-Cov log their pick every step
        assert all("cov_selected" in r and "cov_selected_frac" in r for r in records)
    if config.algo.dynamic_sampling:
        # a dropped group is one whose answers all agree: refills happened exactly when some were
        for r in records:
            assert (r["dropped_group_frac"] > 0) == (r["refill_rounds"] > 0)
    if config.algo.needs_ref:
        assert records[-1]["kl"] > 0  # the policy moved away from the frozen reference
    if config.advantage.needs_critic:
        assert summary["critic_parameters"] > 0
        for record in records:
            assert record["value_loss"] >= 0 and record["critic_grad_norm"] > 0
            assert 0 <= record["value_clip_frac"] <= 1 and "explained_variance" in record
