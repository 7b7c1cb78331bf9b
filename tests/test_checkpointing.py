"""Gradient checkpointing per micro-batch (train/checkpointing.py): `auto` recomputes only the
micro-batches over the token budget (a row longer than it, alone), the update is the one without
checkpointing (float64), and the layers' flags are as they were after each micro-batch."""

from __future__ import annotations

import pytest
import torch
from test_micro_batches import UPDATE_OVERRIDES, UPDATE_REWARDS, _one_update

from tepo_cli.config.validate import load_train_config
from tepo_cli.train import update as update_module
from tepo_cli.train.checkpointing import checkpoint_plan, checkpointed, over_budget


def test_auto_checkpoints_only_the_micro_batches_over_the_budget():
    assert over_budget([500, 1500, 1024, 2048], "auto", 1024) == [False, True, False, True]
    assert over_budget([500, 1500], True, 1024) == [False, False]  # on at load for all
    assert over_budget([500, 1500], False, 1024) == [False, False]
    assert over_budget([500, 1500], "auto", None) == [False, False]  # fixed-count micro-batches


def test_checkpointed_sets_the_layers_flags_for_its_block_only(tiny_model):
    def flags():
        return [
            m.gradient_checkpointing
            for m in tiny_model.modules()
            if hasattr(m, "gradient_checkpointing")
        ]

    assert not any(flags()) and not tiny_model.is_gradient_checkpointing
    with checkpointed(tiny_model, True):
        assert all(flags()) and tiny_model.is_gradient_checkpointing
    assert not any(flags()) and not tiny_model.is_gradient_checkpointing
    assert not any(hasattr(m, "_gradient_checkpointing_func") for m in tiny_model.modules())


def _update_counting_recomputes(cfg, lm, rewards, monkeypatch):
    """`_one_update`, counting the first layer's MLP runs with gradients on (each training forward,
    plus each recomputation in backward; scoring runs without gradients). The layer is marked, and
    the mark survives `_one_update`'s copy of the model."""
    calls: list[bool] = []
    mlp_type = type(lm.model.layers[0].mlp)
    original = mlp_type.forward

    def counted(module, *args, **kwargs):
        if getattr(module, "counted", False):
            calls.append(torch.is_grad_enabled())
        return original(module, *args, **kwargs)

    plans: list[list[bool]] = []

    def recorded(*args):
        plans.append(checkpoint_plan(*args))
        return plans[-1]

    with monkeypatch.context() as patch:
        patch.setattr(mlp_type, "forward", counted)
        patch.setattr(lm.model.layers[0].mlp, "counted", True, raising=False)
        patch.setattr(update_module, "checkpoint_plan", recorded)
        metrics, step = _one_update(cfg, lm, rewards)
    return metrics, step, sum(calls), [flag for plan in plans for flag in plan]


def test_auto_recomputes_the_long_rows_micro_batches_and_keeps_the_update(
    compose_config, tiny_model, monkeypatch
):
    """A 12-token budget: rows of 8 + 5 or 9 + 3 tokens run alone, some over the budget. With
    `auto` exactly those micro-batches recompute their layers in backward (one more grad-enabled
    MLP run each), and the update equals the one without checkpointing."""
    common = [*UPDATE_OVERRIDES, "trainer.micro_batch_tokens=12"]
    rewards = UPDATE_REWARDS
    runs = {}
    for mode in ("false", "auto"):
        cfg = load_train_config(
            compose_config("train", [*common, f"model.gradient_checkpointing={mode}"])
        )
        runs[mode] = _update_counting_recomputes(cfg, tiny_model, rewards, monkeypatch)
    (off, off_step, off_calls, off_flags) = runs["false"]
    (auto, auto_step, auto_calls, auto_flags) = runs["auto"]
    assert not any(off_flags)
    assert len(auto_flags) == len(off_flags)  # the same micro-batches
    assert 0 < sum(auto_flags) < len(auto_flags)  # some micro-batches over the budget, not all
    assert auto_calls == off_calls + sum(auto_flags)  # each of those recomputed once in backward
    assert off_step.norm() > 0
    assert float((auto_step - off_step).norm() / off_step.norm()) < 1e-9
    assert auto["loss"] == pytest.approx(off["loss"], rel=1e-9)
    assert auto["grad_norm"] == pytest.approx(off["grad_norm"], rel=1e-9)
