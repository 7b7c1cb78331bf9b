"""`+group.key=value` is refused where the chosen preset does not use the key
(tepo_cli/config/added_keys.py): Hydra's "use +key" advice would otherwise make it a no-op."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tepo_cli.config.added_keys import check_added_keys, preset_keys
from tepo_cli.core.errors import ConfigError


def test_a_preset_includes_the_files_it_builds_on():
    assert {"engine", "n", "temperature"} <= set(preset_keys("rollout", "vllm"))  # vllm over hf
    assert "k" in preset_keys("algo", "mpo") and "beta" in preset_keys("algo", "grpo")  # _base


@pytest.mark.parametrize(
    ("override", "choices", "fragments"),
    [
        (
            "+benchmark.hub_id=owner/data",
            {"benchmark": "arith"},
            [
                "benchmark=arith does not use benchmark.hub_id",
                "benchmark=gsm8k, benchmark=humaneval",
            ],
        ),
        (
            "+rollout.engine.kv_cache_gib=4",
            {"rollout": "hf"},
            [
                "rollout=hf does not use rollout.engine.kv_cache_gib",
                "presets that use it: rollout=vllm",
            ],
        ),
        ("+model.hidden_size=32", {"model": "hf"}, ["model=hf does not use", "model=tiny"]),
        ("+advantage.gamma=0.9", {"advantage": "grpo"}, ["advantage=gae"]),
    ],
)
def test_an_added_key_the_preset_ignores_is_refused(override, choices, fragments):
    with pytest.raises(ConfigError) as caught:
        check_added_keys([override], choices)
    message = str(caught.value)
    assert all(fragment in message for fragment in fragments), message
    assert message.endswith("Nothing was run.")


@pytest.mark.parametrize(
    ("overrides", "choices"),
    [
        (["+model.hidden_size=32"], {"model": "tiny"}),  # tiny.yaml has it
        (["benchmark.hub_id=x"], {"benchmark": "arith"}),  # no '+': Hydra's own error applies
        (["++benchmark.hub_id=x"], {"benchmark": "gsm8k"}),  # force-add: the user insists
        (["+trainer.lr=1e-5"], {"benchmark": "arith"}),  # not a group: the schema checks it
        # deepspeed.extra is {}: raw DeepSpeed entries, at any depth, as documented
        (["+deepspeed.extra.steps_per_print=5"], {"deepspeed": "zero3"}),
        (
            ["+deepspeed.extra.zero_optimization.stage3_max_reuse_distance=0"],
            {"deepspeed": "zero3"},
        ),
    ],
)
def test_keys_the_preset_uses_and_other_forms_pass(overrides, choices):
    check_added_keys(overrides, choices)


@pytest.mark.slow
def test_the_cli_refuses_before_loading(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", "model=tiny", "+benchmark.hub_id=owner/data"],
        cwd=tmp_path, env=dict(os.environ, HYDRA_FULL_ERROR="0"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "benchmark=arith does not use benchmark.hub_id" in result.stderr
    assert list(tmp_path.iterdir()) == []
