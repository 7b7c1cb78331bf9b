"""DeepSpeed is imported without its autotuner's MLflow import (tepo_cli/core/deepspeed_import.py),
and MLflow stays importable afterwards for logger=[mlflow]."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

needs_mlflow = pytest.mark.skipif(
    os.environ.get("TEPO_REQUIRE_TRACKERS") != "1" and importlib.util.find_spec("mlflow") is None,
    reason="mlflow (make install-trackers) is not installed",
)

PROBE = """
import json, sys
from tepo_cli.core.deepspeed_import import import_deepspeed
deepspeed = import_deepspeed()
from deepspeed.autotuning import autotuner
after_import = "mlflow" in sys.modules
import mlflow
from mlflow.tracking import MlflowClient
print(json.dumps({
    "deepspeed": deepspeed.__name__,
    "again": import_deepspeed() is deepspeed,
    "mlflow_loaded_by_deepspeed": after_import,
    "autotuner_has_mlflow": autotuner.has_mlflow,
    "mlflow_after": mlflow.__version__,
}))
"""


@needs_mlflow
def test_deepspeed_does_not_import_mlflow_and_mlflow_still_imports():
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["deepspeed"] == "deepspeed" and probe["again"]
    assert probe["mlflow_loaded_by_deepspeed"] is False
    assert probe["autotuner_has_mlflow"] is False  # the autotuner, which tepo never runs
    assert probe["mlflow_after"]  # logger=[mlflow] imports it as usual
