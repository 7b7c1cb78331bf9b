"""bf16 weights rounded stochastically from their float32 masters (runtime/weight_rounding.py):
each weight one of its master's two bf16 neighbours, equal to it in expectation, the same draw
on a repeat of the step, at every ZeRO stage; and an update below half a bf16 spacing, which
rounding to nearest loses, moves the weights."""

from __future__ import annotations

from pathlib import Path

import deepspeed
import pytest
import torch
from deepspeed.utils import safe_get_full_fp32_param
from test_resume_faults import base_args, killed_resumed_as_uninterrupted

from tepo_cli.config.validate import load_train_config
from tepo_cli.models.precision import precision_line
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.runtime.engine import build_engine
from tepo_cli.runtime.weight_rounding import round_stochastically, round_weights

LOW = 1 << 16


def _neighbours(master: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 values either side of each float32 (toward zero, away from zero), as float32."""
    bits = master.view(torch.int32)
    lower = (bits & -LOW).view(torch.float32)
    upper = ((bits & -LOW) + LOW).view(torch.float32)
    return lower, upper


def test_each_draw_is_a_neighbour_and_the_mean_is_the_master():
    generator = torch.Generator().manual_seed(0)
    master = (torch.randn(64, generator=generator, dtype=torch.float64) * 0.05).float()
    master[:4] = torch.tensor([1.0, -0.5, 0.0, 3.0e-3])  # exact in bf16 for the first three
    draws = 20_000
    out = torch.empty(draws, 64, dtype=torch.bfloat16)
    round_stochastically(master.expand(draws, 64).contiguous(), out, seed=3)
    lower, upper = _neighbours(master)
    got = out.float()
    assert bool(((got == lower) | (got == upper)).all())
    assert torch.equal(got[:, :3], master[:3].expand(draws, 3))  # representable: never moved
    spacing = (upper - lower).double()
    bias = (got.double().mean(0) - master.double()) / spacing
    assert float(bias.abs().max()) < 0.02  # sd of the mean here is at most 0.0036 spacings
    upper_share = (got == upper).double().mean(0)[3:]
    expected = ((master - lower).double() / spacing)[3:]
    torch.testing.assert_close(upper_share, expected, atol=0.02, rtol=0)


def test_inf_nan_and_chunks():
    master = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0 + 2.0**-10])
    out = torch.empty(4, dtype=torch.bfloat16)
    round_stochastically(master, out, seed=1)
    assert out[0] == float("inf") and out[1] == float("-inf") and bool(out[2].isnan())
    big = torch.full((5_000_000,), 1.0 + 2.0**-9)  # halfway: more than one chunk
    rounded = torch.empty(big.shape, dtype=torch.bfloat16)
    round_stochastically(big, rounded, seed=2)
    assert abs(float(rounded.float().mean()) - (1.0 + 2.0**-9)) < 1e-5


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_updates_below_half_a_spacing_move_the_weights(compose_config, tiny_model, stage):
    """lr 1e-5 moves most masters by a tenth of a bf16 spacing: rounded to nearest (DeepSpeed's
    own), the weights the model computes with keep a fraction of that movement; rounded
    stochastically, each weight is a neighbour of its master and their movement is the masters'
    in expectation. A repeat of the same step draws the same weights (a resume's)."""
    cfg = load_train_config(
        compose_config(
            "train",
            ["model=tiny", f"deepspeed=zero{stage}", "trainer.grad_clip=0", "trainer.lr=1e-5"],
        )
    )
    setup_topology(num_threads=None)
    try:
        model = tiny_model.to(torch.bfloat16)
        engine = build_engine(model, cfg, accumulation=1, world=1)
        weight = engine.module.model.layers[0].mlp.up_proj.weight
        with deepspeed.zero.GatheredParameters([weight]):
            before = weight.detach().float().clone()
        ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        master = safe_get_full_fp32_param(weight).clone()
        with deepspeed.zero.GatheredParameters([weight]):
            nearest = weight.detach().float().clone()
        lower, upper = _neighbours(master)
        moved = master - before
        assert float(moved.abs().max()) > 0

        def kept(weights: torch.Tensor) -> float:
            """The share of the masters' movement the weights made."""
            return float(((weights - before) * moved.sign()).sum() / moved.abs().sum())

        round_weights(engine, seed=7)
        with deepspeed.zero.GatheredParameters([weight]):
            rounded = weight.detach().float().clone()
        assert bool(((rounded == lower) | (rounded == upper)).all())
        assert kept(nearest) < 0.5 and 0.85 < kept(rounded) < 1.15, (kept(nearest), kept(rounded))
        round_weights(engine, seed=7)  # the same step again: the same draw (a resume's)
        with deepspeed.zero.GatheredParameters([weight]):
            assert torch.equal(weight.detach().float(), rounded)
    finally:
        teardown()


def test_the_start_line_says_how_bf16_weights_are_rounded():
    assert precision_line("bfloat16", "cpu", "stochastic").endswith(
        "the bfloat16 weights rounded stochastically from the masters after each step"
    )
    assert "rounded to nearest" in precision_line("bfloat16", "cuda", "nearest")
    assert "rounded" not in precision_line("float32", "cpu", "stochastic")
    assert "rounded" not in precision_line("bfloat16", "cpu")  # tepo eval trains nothing


def bf16_args(tmp: Path, run_dir: Path) -> list[str]:
    """bf16 weights rounded stochastically from their masters after every step: the draw is
    seeded by the step, so a resume must draw what the uninterrupted run drew."""
    return [*base_args(tmp, run_dir), "model.dtype=bfloat16", "model.weight_rounding=stochastic"]


@pytest.mark.slow
def test_a_bf16_run_killed_then_resumed_rounds_as_the_uninterrupted_one(tmp_path, tmp_path_factory):
    _, resumed = killed_resumed_as_uninterrupted(tmp_path, tmp_path_factory, bf16_args, "update:3")
    assert "weights rounded stochastically" in resumed.stderr


def test_the_rounding_is_the_high_half_of_the_pattern_plus_the_seeds_draws(monkeypatch):
    """Bit for bit against numpy: the bf16 pattern is the high 16 bits of the float32 pattern
    plus 16 bits of PCG64DXSM(seed)'s draws in element order (four per 64-bit draw), across
    chunks (eight of 4 here, the last a partial one) as in one piece."""
    import numpy as np

    from tepo_cli.runtime import weight_rounding

    master = torch.randn(29, generator=torch.Generator().manual_seed(5)) * 0.05
    master[:3] = torch.tensor([float("inf"), -3.0e38, -0.0])
    bits = master.numpy().view(np.int32).astype(np.int64)
    noise = np.random.PCG64DXSM(11).random_raw(8).view(np.uint16)[:29].astype(np.int64)
    expected = (((bits + noise) & 0xFFFFFFFF) >> 16).astype(np.uint16).view(np.int16)
    for chunk in (1 << 22, 4):
        monkeypatch.setattr(weight_rounding, "CHUNK", chunk)
        out = torch.empty(29, dtype=torch.bfloat16)
        round_stochastically(master, out, seed=11)
        assert np.array_equal(out.view(torch.int16).numpy(), expected)
    assert float(out[0]) == float("inf") and float(out[2]) == 0.0
