"""MPO's warm-up sized to what it can learn (mtp/warmup_size.py): none on a random backbone,
never more sequences than the RL run samples and at most 30 otherwise, an integer always wins;
and a 2-step tiny MPO run that skips it and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tepo_cli.config.validate import load_train_config
from tepo_cli.mtp.prediction_loss import worse_than_uniform
from tepo_cli.mtp.warmup_size import (
    AUTO_MOST,
    random_backbone,
    settle_warmup_steps,
    warmup_line,
    warmup_size,
)


def _config(compose_config, *overrides: str):
    return load_train_config(compose_config("train", ["algo=mpo", *overrides]))


@pytest.mark.parametrize(
    ("overrides", "steps"),
    [
        (["model=tiny"], 0),  # random weights: nothing to learn
        (["model=tiny", "trainer.max_steps=500"], 0),  # however long the run
        ([], AUTO_MOST),  # the default: 30 steps x 2 prompts x 8 = 480 answers = 30 x 16
        (["trainer.max_steps=2"], 2),  # 2 x 2 x 8 = 32 answers: 2 steps of 16
        (["trainer.max_steps=2", "algo.mtp.warmup.batch_size=5"], 6),  # 32 // 5
        (["trainer.max_steps=2", "trainer.prompts_per_step=4", "rollout.n=3"], 1),  # 24 // 16
        (["trainer.max_steps=1", "trainer.prompts_per_step=1", "rollout.n=8"], 0),  # 8 < 16
        (["trainer.max_steps=0"], 0),  # evaluations only
        (["trainer.max_steps=29"], 29),  # 464 // 16
        (["model=tiny", "algo.mtp.warmup.steps=7"], 7),  # an integer wins, even on tiny
        (["algo.mtp.warmup.steps=0"], 0),
        (["trainer.max_steps=2", "algo.mtp.warmup.steps=40"], 40),
    ],
)
def test_auto_sizes_the_warmup_and_an_integer_wins(compose_config, overrides, steps):
    config = _config(compose_config, *overrides)
    assert warmup_size(config).steps == steps


def test_the_choice_is_settled_into_the_config_and_said(compose_config):
    config = _config(compose_config, "model=tiny")
    assert config.algo.mtp.warmup.steps == "auto" and random_backbone(config.model)
    assert not random_backbone(config.model.model_copy(update={"path": "outputs/x/final"}))
    size = settle_warmup_steps(config)
    assert size is not None and config.algo.mtp.warmup.steps == 0
    line = warmup_line(size, 16)
    assert line.startswith("MTP warm-up: none (auto: model=tiny has random weights")
    assert "algo.mtp.warmup.steps=N" in line
    short = _config(compose_config, "trainer.max_steps=2")
    assert warmup_line(settle_warmup_steps(short), 16) == (
        "MTP warm-up: 2 steps of 16 sequences (auto: no more sequences than the run's 32 "
        "answers (2 steps x 2 prompts x 8) at 16 a step)"
    )
    given = _config(compose_config, "algo.mtp.warmup.steps=1")
    assert warmup_line(settle_warmup_steps(given), 16) == (
        "MTP warm-up: 1 step of 16 sequences (algo.mtp.warmup.steps=1)"
    )
    # Objectives without MTP modules have no warm-up to settle or say.
    assert settle_warmup_steps(_config(compose_config, "algo=mpo_exact")) is None
    assert settle_warmup_steps(load_train_config(compose_config("train", []))) is None


@pytest.mark.slow
def test_a_two_step_tiny_mpo_run_skips_the_warmup_and_says_so(tmp_path: Path):
    """... and says so once when its modules predict worse than a uniform guess: at lr 0.1 the
    first update throws the random modules far off the policy's tokens (a parity reward gives
    the groups mixed rewards, so the update runs)."""
    run_dir = tmp_path / "run"
    (tmp_path / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2 == 0\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tepo_cli",
            "train",
            "model=tiny",
            "algo=mpo",
            "trainer.max_steps=2",
            "trainer.eval_before=false",
            "trainer.eval_after=false",
            "trainer.progress=false",
            "trainer.save_final=false",
            "reward=custom",
            f"reward.path={tmp_path / 'parity.py'}",
            "rollout.temperature=0.1",
            "trainer.lr=0.1",
            "trainer.warmup_steps=0",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=dict(os.environ, HYDRA_FULL_ERROR="0"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tepo train: MTP warm-up: none (auto: model=tiny has random weights" in result.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if "mtp_warmup_step" in r]  # not even a measuring batch
    assert max(r["step"] for r in records if "step" in r) == 2
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["algo"]["mtp"]["warmup"]["steps"] == 0  # the settled number, not auto
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mtp_warmup_steps"] == 0
    assert summary["mtp_parameters"] > 0  # the modules are there all the same
    steps = [r for r in records if "step" in r]
    assert not worse_than_uniform(steps[0], 49_152) and worse_than_uniform(steps[1], 49_152)
    said = [line for line in result.stderr.splitlines() if "MTP modules predicted" in line]
    assert len(said) == 1 and said[0].startswith("tepo train: step 2: MPO's MTP modules")
    assert "were not warmed up (algo.mtp.warmup.steps=0)" in said[0]
