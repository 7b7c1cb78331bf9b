"""Gradient checkpointing per micro-batch (train/recompute.py): `auto` recomputes only the
micro-batches over the token budget (a row longer than it, alone) and the prompt passes, the update
is the one without checkpointing (float64), and the layers' flags are as they were after each
micro-batch."""

from __future__ import annotations

import pytest
import torch
from test_micro_batches import UPDATE_OVERRIDES, UPDATE_REWARDS, _one_update, _recording

from tepo_cli.config.validate import load_train_config
from tepo_cli.train import update as update_module
from tepo_cli.train.recompute import checkpoint_plan, checkpointed, over_budget


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
    passes: list[object] = []

    def recorded(*args):
        plans.append(checkpoint_plan(*args))
        return plans[-1]

    with monkeypatch.context() as patch:
        patch.setattr(mlp_type, "forward", counted)
        patch.setattr(lm.model.layers[0].mlp, "counted", True, raising=False)
        patch.setattr(update_module, "checkpoint_plan", recorded)
        patch.setattr(update_module, "_prompt_pass", _recording(update_module._prompt_pass, passes))
        metrics, step = _one_update(cfg, lm, rewards)
    flags = [flag for plan in plans for flag in plan]
    return metrics, step, sum(calls), flags, len(passes)


def test_auto_recomputes_the_long_rows_micro_batches_and_keeps_the_update(
    compose_config, tiny_model, monkeypatch
):
    """A 6-token budget: answers of 7-9 tokens run alone, over the budget. With `auto` exactly
    those micro-batches recompute their layers in backward (one more grad-enabled MLP run each),
    and so does each minibatch's prompt pass (its prompts run once for all its micro-batches,
    kept from the first to the last); the update equals the one without checkpointing."""
    common = [*UPDATE_OVERRIDES, "trainer.micro_batch_tokens=6"]
    rewards = UPDATE_REWARDS
    runs = {}
    for mode in ("false", "auto"):
        cfg = load_train_config(
            compose_config("train", [*common, f"model.gradient_checkpointing={mode}"])
        )
        runs[mode] = _update_counting_recomputes(cfg, tiny_model, rewards, monkeypatch)
    (off, off_step, off_calls, off_flags, off_passes) = runs["false"]
    (auto, auto_step, auto_calls, auto_flags, auto_passes) = runs["auto"]
    assert not any(off_flags)
    assert len(auto_flags) == len(off_flags)  # the same micro-batches
    assert 0 < sum(auto_flags) < len(auto_flags)  # some micro-batches over the budget, not all
    assert off_passes == auto_passes == 2  # one prompt pass in each of the two minibatches
    # Each checkpointed micro-batch and each prompt pass recomputed once in backward.
    assert auto_calls == off_calls + sum(auto_flags) + auto_passes
    assert off_step.norm() > 0
    assert float((auto_step - off_step).norm() / off_step.norm()) < 1e-9
    assert auto["loss"] == pytest.approx(off["loss"], rel=1e-9)
    assert auto["grad_norm"] == pytest.approx(off["grad_norm"], rel=1e-9)


def test_a_recomputed_layer_applies_lora_dropout_as_its_forward_did(tiny_model, tiny_tokenizer):
    """LoRA dropout acts only in the forward that records gradients, the policy being in eval
    mode otherwise; a layer recomputed in backward must apply the same dropout (same mask: the
    random state is restored) or its gradient is the gradient of another function."""
    from test_shared_prompts import _batch

    from tepo_cli.config.schema import KernelConfig, LoraConfig
    from tepo_cli.models.policy import Policy

    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=2)
    policy = Policy(tiny_model, KernelConfig(backend="torch"), packing=True)
    policy.add_adapters(LoraConfig(r=4, dropout=0.5), base_model=None)
    with torch.no_grad():  # B starts at zero: give the adapters a gradient through A too
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.1)

    def gradients(checkpoint: bool, seed: int = 0) -> dict[str, torch.Tensor]:
        policy.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        with checkpointed(policy, checkpoint):
            policy(batch, 0.7).logp.sum().backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    kept, recomputed, other_mask = gradients(False), gradients(True), gradients(False, seed=1)
    assert kept.keys() == recomputed.keys() and kept
    assert any(not torch.equal(kept[n], other_mask[n]) for n in kept)  # the dropout acts
    for name, grad in recomputed.items():
        torch.testing.assert_close(grad, kept[name], rtol=1e-9, atol=1e-12, msg=name)
