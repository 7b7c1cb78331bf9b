"""Whether a saved run config still describes the run (tepo_cli/runtime/resume.py): a run saved
before a key existed resumes when the key has its default; a changed setting is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.runtime.resume import check_same_run


def dumped(compose_config, *overrides: str) -> dict:
    """The run config as a run directory's config.yaml holds it."""
    return load_train_config(compose_config("train", ["model=tiny", *overrides])).model_dump(
        mode="json"
    )


def test_a_run_saved_before_a_key_existed_resumes_with_its_default(compose_config):
    current = dumped(compose_config)
    older = {key: value for key, value in current.items() if key != "env"}  # before `env` existed
    check_same_run(older, current, Path("run"))


def test_a_new_key_set_away_from_its_default_is_still_a_different_run(compose_config):
    older = {key: value for key, value in dumped(compose_config).items() if key != "env"}
    current = dumped(compose_config, "env=python_tool")
    with pytest.raises(ConfigError, match=r"env\.name: 'single' -> 'python_tool'"):
        check_same_run(older, current, Path("run"))
