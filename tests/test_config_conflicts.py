"""Command-line settings that say one thing twice, differently, are refused before anything loads
(tepo_cli/config/conflicts.py); the same thing said twice alike, or once, passes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tepo_cli.config.conflicts import check_conflicts
from tepo_cli.core.errors import ConfigError


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (["k=3", "algo.k=2"], ["k=3 and algo.k=2 both set the block size K", "k=2 or algo.k=2"]),
        (["algo=mpo", "k=4", "algo.unit=token"], ["algo.unit=token asks for another unit"]),
        (
            ["resume=outputs/train/a", "hydra.run.dir=outputs/train/b"],
            ["resume=outputs/train/a continues", "hydra.run.dir=outputs/train/b names another"],
        ),
    ],
)
def test_conflicting_settings_are_one_paragraph_naming_both(arguments, fragments):
    with pytest.raises(ConfigError) as caught:
        check_conflicts("train", arguments)
    message = str(caught.value)
    assert all(fragment in message for fragment in fragments), message
    assert message.endswith("Nothing was run.") and "\n" not in message


@pytest.mark.parametrize(
    "arguments",
    [
        ["k=4", "algo.k=4"],  # the same K twice
        ["k=4", "algo.unit=block"],
        ["algo=mpo", "k=2"],
        ["-m", "algo=grpo,mpo", "k=2,4"],
        ["resume=true", "hydra.run.dir=outputs/train/a"],
        ["resume=outputs/train/a", "hydra.run.dir=outputs/train/a/"],
        ["resume=outputs/train/a"],
        ["trainer.lr=1e-5", "trainer.lr=2e-5"],  # one key twice: Hydra's last value wins
        ["k=null", "algo.k=2"],
    ],
)
def test_one_thing_said_once_or_alike_passes(arguments):
    check_conflicts("train", arguments)


def test_eval_has_no_such_pairs():
    check_conflicts("eval", ["k=3", "algo.k=2"])  # not eval's keys: check_override_keys says so


@pytest.mark.slow
def test_the_cli_exits_2_and_writes_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", "model=tiny", "k=3", "algo.k=2"],
        cwd=tmp_path,
        env=dict(os.environ, HYDRA_FULL_ERROR="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("tepo train: k=3 and algo.k=2 both set the block size K")
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
