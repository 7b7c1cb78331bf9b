"""An unknown config-group choice (`algo=foo`) is refused before Hydra with one paragraph: the
group, its public choices, the closest one and how to add one (tepo_cli/config/group_choices.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tepo_cli.cli import main


def _refusal(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    assert stop.value.code == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "Could not find" not in message
    return message


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["train", "algo=foo"],
            [
                "algo=foo: there is no algo preset 'foo'",
                "the choices of algo are: cispo, clip_cov, dapo, gmpo, grpo, gspo, kl_cov, mpo, mpo_disjoint, mpo_exact, sapo, tepo.",
                "register_policy_loss",
                "hydra.searchpath=[file://my_conf]",
            ],
        ),
        (
            ["train", "benchmark=gsm9k"],
            [
                "Did you mean benchmark=gsm8k?",
                "register_benchmark",
                "arith, custom, gsm8k, humaneval",
            ],
        ),
        (
            ["train", "env=myenv"],
            [
                "the choices of env are: code_feedback, python_tool, single.",
                "is chosen with env.name=myenv, not env=myenv",
            ],
        ),
        (["eval", "model=tinyy"], ["Did you mean model=tiny?", "my_conf/model/NAME.yaml"]),
        (["train", "-m", "algo=grpo,mpoo"], ["algo=mpoo", "Did you mean algo=mpo?"]),
    ],
)
def test_an_unknown_choice_gets_one_paragraph(capsys, args, fragments):
    message = _refusal(capsys, *args)
    for fragment in fragments:
        assert fragment in message, message
    assert "_base" not in message  # internals are not choices


def test_a_choice_from_the_users_search_path_counts(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_conf" / "algo").mkdir(parents=True)
    (tmp_path / "my_conf" / "algo" / "reinforce.yaml").write_text("defaults: [grpo]\n")
    message = _refusal(capsys, "train", "hydra.searchpath=[file://my_conf]", "algo=reinforcee")
    assert (
        "mpo_exact, reinforce, sapo, tepo." in message and "Did you mean algo=reinforce?" in message
    )
    from tepo_cli.config.group_choices import check_group_choice

    check_group_choice("algo", ["reinforce"], ["hydra.searchpath=[file://my_conf]"])
    check_group_choice("algo", ["reinforce"], ["--config-dir", "my_conf"])


@pytest.mark.slow
def test_the_command_exits_2_and_writes_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", "algo=foo"],
        cwd=tmp_path,
        env=dict(os.environ, HYDRA_FULL_ERROR="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("tepo train: algo=foo: there is no algo preset 'foo'")
    assert "Traceback" not in result.stderr and "search path" not in result.stderr
    assert list(tmp_path.iterdir()) == []
