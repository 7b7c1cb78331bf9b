"""A run's terminal holds tepo's lines only: library warnings go to its log file, counted in one
line (tepo_cli/core/library_warnings.py); TEPO_VERBOSE=1 shows them on the terminal too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WARNING_REWARD = """
import warnings

def score(completion, problem):
    warnings.warn("a library's deprecation notice", FutureWarning)
    return False
"""


def run(tmp_path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    reward = tmp_path / "reward.py"
    reward.write_text(WARNING_REWARD)
    return subprocess.run(
        [
            sys.executable, "-m", "tepo_cli", "train", "model=tiny", "trainer.max_steps=1",
            "trainer.progress=false", "benchmark.eval_size=4", "trainer.save_final=false",
            "reward=custom", f"reward.path={reward}", "reward.function=score",
            f"hydra.run.dir={tmp_path / 'run'}", *extra,
        ],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_warnings_go_to_the_log_file_counted_and_verbose_shows_them(tmp_path):
    quiet = run(tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    lines = quiet.stderr.splitlines()
    others = [line for line in lines if not line.startswith("tepo train: ")]
    assert not [line for line in others if "Warning" in line or "warnings.warn" in line], lines
    summary = [line for line in lines if "library warning(s) went to train.log" in line]
    assert len(summary) == 1 and "(the first: " in summary[0]
    assert "a library's deprecation notice" in summary[0]
    log = (tmp_path / "run" / "train.log").read_text()
    assert "FutureWarning: a library's deprecation notice" in log
    # Python keeps the first occurrence per place: one line although every answer warned.
    assert log.count("FutureWarning: a library's deprecation notice") == 1

    loud = run(tmp_path, "resume=true", "trainer.max_steps=2", "--verbose")
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert "FutureWarning: a library's deprecation notice" in loud.stderr + loud.stdout
    assert "went to train.log" not in loud.stderr


@pytest.fixture
def run_log(tmp_path, monkeypatch):
    """A root logger with one log file, as Hydra sets up a run's train.log."""
    import logging

    monkeypatch.delenv("TEPO_VERBOSE", raising=False)
    path = tmp_path / "train.log"
    handler = logging.FileHandler(path)
    root = logging.getLogger()
    root.addHandler(handler)
    yield path
    root.removeHandler(handler)
    handler.close()


def test_deepspeed_prints_and_log_records_go_to_the_log_file(run_log, capsys):
    import logging

    from tepo_cli.core.library_warnings import library_prints_to_log, warnings_to_log

    deepspeed = logging.getLogger("DeepSpeed")
    terminal = logging.StreamHandler(sys.stdout)  # DeepSpeed's logger as its import leaves it
    deepspeed.addHandler(terminal)
    propagate, deepspeed.propagate = deepspeed.propagate, False
    try:
        with warnings_to_log("train"):
            with library_prints_to_log():
                print("begin bf16_optimizer")
                print("MA 1.02 GB ", end="")
                print("Max_MA 1.02 GB")
            deepspeed.warning("You are using ZeRO with an untested optimizer")
            print("tepo's own line")
        deepspeed.warning("after the run")
    finally:
        deepspeed.removeHandler(terminal)
        deepspeed.propagate = propagate
    out = capsys.readouterr().out
    assert out.splitlines() == ["tepo's own line", "after the run"]
    log = run_log.read_text().splitlines()
    assert log == [
        "begin bf16_optimizer",
        "MA 1.02 GB Max_MA 1.02 GB",
        "You are using ZeRO with an untested optimizer",
    ]


def test_verbose_keeps_deepspeed_prints_on_the_terminal(run_log, capsys, monkeypatch):
    from tepo_cli.core.library_warnings import library_prints_to_log

    monkeypatch.setenv("TEPO_VERBOSE", "1")
    with library_prints_to_log():
        print("begin bf16_optimizer")
    assert capsys.readouterr().out == "begin bf16_optimizer\n"
    assert run_log.read_text() == ""


QUIETED = """
import logging, sys
from tepo_cli.cli import _quiet_libraries
_quiet_libraries()
from huggingface_hub.utils import logging as hub_logging
from datasets.utils import logging as datasets_logging
from transformers.utils import logging as hf_logging
hub_logging.get_logger("huggingface_hub.utils._http").warning("hub: retrying a HEAD request")
datasets_logging.get_logger("datasets.load").warning("datasets: no README")
hf_logging.get_logger("transformers.modeling_utils").warning("transformers: unused weights")
print("tepo's line", file=sys.stderr)
"""


@pytest.mark.parametrize("user_set", [False, True])
def test_the_hugging_face_libraries_warn_only_where_the_user_asked(tmp_path, user_set):
    """`tepo`'s commands set the three libraries' verbosity variables to errors before importing
    them (tepo_cli/cli.py): an offline hub download's retries stay off the console, where tepo's
    own paragraph says what failed; a variable the user set wins."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("VERBOSITY")}
    if user_set:
        env.update(HF_HUB_VERBOSITY="warning", DATASETS_VERBOSITY="warning")
        env.update(TRANSFORMERS_VERBOSITY="warning")
    result = subprocess.run(
        [sys.executable, "-c", QUIETED], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1] == "tepo's line"
    for message in ("hub: retrying a HEAD", "datasets: no README", "transformers: unused weights"):
        assert any(message in line for line in lines) == user_set, (message, lines)
    assert len(lines) == (4 if user_set else 1), lines
