"""Config validation: every bad value stops the run with one paragraph naming key, value, rule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tepo_cli.config.errors import ConfigError
from tepo_cli.config.validate import load_eval_config, load_train_config


def test_default_train_config_is_valid(compose_config):
    config = load_train_config(compose_config("train"))
    assert config.algo.name == "grpo"
    assert config.algo.beta == pytest.approx(0.04)
    assert config.rollout.n == 8
    assert config.model.name == "smollm2_135m"
    assert config.trainer.lr == pytest.approx(1e-5)


def test_default_eval_config_is_valid(compose_config):
    config = load_eval_config(compose_config("eval"))
    assert config.eval.greedy and config.eval.n == 1


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("rollout.n=1", ["rollout.n=1", "greater than or equal to 2", "conf/rollout/hf.yaml"]),
        (
            "algo.eps_low=-1",
            ["algo.eps_low=-1", "greater than or equal to 0", "conf/algo/grpo.yaml"],
        ),
        ("trainer.lr=abc", ["trainer.lr='abc'", "valid number", "conf/train.yaml"]),
        ("trainer.lr=0", ["trainer.lr=0", "greater than 0"]),
        ("algo.unit=blocks", ["algo.unit='blocks'", "'token', 'block' or 'sequence'"]),
        ("algo.loss_agg=mean", ["algo.loss_agg='mean'", "'token-mean'"]),
        ("+trainer.lrr=1", ["unknown key 'trainer.lrr'", "Did you mean 'trainer.lr'?"]),
        ("+foo=1", ["unknown key 'foo'", "at the top level"]),
        ("deepspeed.stage=4", ["deepspeed.stage=4", "less than or equal to 3"]),
        ("k=0", ["k=0", "greater than or equal to 1"]),
        ("trainer.prompts_per_step=3 trainer.nproc=2", ["multiple of trainer.nproc"]),
    ],
)
def test_bad_values_name_key_value_and_rule(compose_config, override, expected):
    with pytest.raises(ConfigError) as caught:
        load_train_config(
            compose_config("train", override.split()), {"algo": "grpo", "rollout": "hf"}
        )
    message = str(caught.value)
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message, message


def test_several_problems_are_reported_together(compose_config):
    with pytest.raises(ConfigError, match=r"\(2 problems\)"):
        load_train_config(compose_config("train", ["rollout.n=1", "trainer.lr=abc"]))


@pytest.mark.parametrize("algo", ["grpo", "dapo", "gspo", "tepo", "mpo"])
def test_top_level_k_makes_any_objective_block_level(compose_config, algo):
    config = load_train_config(compose_config("train", [f"algo={algo}", "k=4"]))
    assert (config.algo.unit, config.algo.k, config.algo.block_size) == ("block", 4, 4)


def test_mpo_defaults_to_blocks_of_four(compose_config):
    config = load_train_config(compose_config("train", ["algo=mpo"]))
    assert (config.algo.unit, config.algo.k) == ("block", 4)


def test_cross_field_errors_name_the_group_not_its_whole_dict(compose_config):
    with pytest.raises(ConfigError) as caught:
        load_train_config(compose_config("train", ["algo.unit=block"]), {"algo": "grpo"})
    message = str(caught.value)
    assert message.startswith("Invalid configuration: algo: ") and "{" not in message


def _tepo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["train", "algo=nope"], "Could not find 'algo/nope'"),
        (["train", "rollout.n=1"], "rollout.n=1 is not allowed"),
        (["train", "algo.eps_low=-1"], "algo.eps_low=-1 is not allowed"),
        (["train", "trainer.lr=abc"], "trainer.lr='abc' is not allowed"),
        (
            ["train", "badkey=1"],
            "unknown key 'badkey' in `tepo train`; the keys allowed at the top",
        ),
        (["train", "-m", "trainer.lrr=1,2"], "Did you mean 'trainer.lr'?"),
        (["train", "+badkey=1"], "unknown key 'badkey'"),
        (["eval", "eval.n=4"], "eval.n > 1 needs sampling"),
        (["frobnicate"], "unknown command 'frobnicate'"),
    ],
)
def test_cli_rejects_bad_input_without_traceback(tmp_path, args, fragment):
    result = _tepo(*args, cwd=tmp_path)
    assert result.returncode != 0
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "outputs" / "train").exists() or not any(
        (tmp_path / "outputs").rglob("metrics.jsonl")
    )


@pytest.mark.slow
def test_cli_help_and_cfg_job(tmp_path):
    top = _tepo("--help", cwd=tmp_path)
    assert top.returncode == 0 and "tepo train" in top.stdout
    hydra_help = _tepo("train", "--help", cwd=tmp_path)
    assert hydra_help.returncode == 0 and "algo: dapo, grpo, gspo, mpo, tepo" in hydra_help.stdout
    job = _tepo("train", "algo.eps_high=0.28", "--cfg", "job", cwd=tmp_path)
    assert job.returncode == 0 and "eps_high: 0.28" in job.stdout
