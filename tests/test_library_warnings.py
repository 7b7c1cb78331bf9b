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
