"""The DeepSpeed config tepo builds (runtime/engine.py): what each stage gets, and that
`deepspeed.extra` has the last word."""

from __future__ import annotations

import torch

from tepo_cli.config.schema import DeepSpeedConfig
from tepo_cli.runtime.engine import deepspeed_config


def _zero(stage: int, **extra) -> dict:
    cfg = DeepSpeedConfig(stage=stage, extra=extra)
    return deepspeed_config(cfg, 4, 2, 1, 1.0, torch.float32)["zero_optimization"]


def test_zero3_releases_gathered_parameters_without_walking_its_module_record():
    """ZeRO-3's release looks `stage3_max_reuse_distance` ahead through the modules it recorded
    in a step, which in tepo holds every generated token's forward: 0 keeps each release O(1)."""
    assert _zero(3)["stage3_max_reuse_distance"] == 0
    assert all("stage3_max_reuse_distance" not in _zero(stage) for stage in (0, 1, 2))


def test_raw_entries_in_deepspeed_extra_win():
    zero = _zero(3, zero_optimization={"stage3_max_reuse_distance": 10**9, "overlap_comm": True})
    assert zero["stage3_max_reuse_distance"] == 10**9 and zero["overlap_comm"] is True
    assert zero["stage"] == 3
