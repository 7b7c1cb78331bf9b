"""The environments guide's worked example (docs/guides/environments.md) runs exactly as written,
on the tiny model: its plugin file is written out and its command trains, with the episode
metrics in the run's records."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs_examples import BLOCK, QUICK

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "environments.md"

pytestmark = pytest.mark.slow


def test_the_guide_s_environment_trains(tmp_path):
    section = PAGE.read_text().split("## A worked example", 1)[1].split("\n## ", 1)[0]
    blocks = list(BLOCK.finditer(section))
    files = {m["file"]: m["body"] for m in blocks if m["file"]}
    commands = [shlex.split(m["body"]) for m in blocks if not m["file"]]
    assert list(files) == ["guess.py"] and len(commands) == 1
    (tmp_path / "guess.py").write_text(files["guess.py"])
    args = commands[0]
    assert args[:2] == ["tepo", "train"]
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args[1:], *QUICK, "hydra.run.dir=run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["env_turns_mean"] >= 1.0
    ends = sum(value for key, value in record.items() if key.startswith("env_end_"))
    assert ends == pytest.approx(1.0)


def test_a_plugin_breaking_the_contract_is_refused_at_start(tmp_path):
    (tmp_path / "broken.py").write_text(
        "from tepo_cli.envs import Environment, register_environment\n\n"
        "@register_environment\nclass Broken(Environment):\n    name = 'broken'\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tepo_cli",
            "train",
            "plugins=[broken.py]",
            "env.name=broken",
            *QUICK,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "does not implement respond" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists() or not any(
        (tmp_path / "outputs").rglob("metrics.jsonl")
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.name=chess", "env.name=chess is not an environment; the environments are:"),
        ("env=chess", "is chosen with env.name=chess, not env=chess"),
    ],
)
def test_an_unknown_environment_lists_the_known_ones(tmp_path, override, message):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", override, *QUICK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert message in result.stderr and "python_tool" in result.stderr


def test_hf_episodes_under_zero3_on_several_ranks_are_refused(compose_config):
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.core.errors import ConfigError

    cfg = compose_config(
        "train", ["env=python_tool", "deepspeed=zero3", "trainer.nproc=2", "model=tiny"]
    )
    with pytest.raises(
        ConfigError, match=r"rollout=vllm .one engine per rank., or deepspeed=zero2"
    ):
        load_train_config(cfg)
