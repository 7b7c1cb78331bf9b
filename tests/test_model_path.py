"""A local model.path that cannot be a model gets one sentence saying why, before anything loads
(tepo_cli/config/model_path.py); hub ids pass untouched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tepo_cli.config.model_path import local_reason, model_path_problem


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", False),
        ("gpt2", False),
        ("/no/such/dir", True),
        ("./model", True),
        ("~/models/x", True),
        ("outputs/train/run/final", True),
        ("outputs/final", False),  # no outputs/ here: a hub namespace
        (".hidden", True),
    ],
)
def test_what_reads_as_a_local_path(path, local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (local_reason(path) is not None) is local


def test_an_existing_first_part_makes_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_reason("outputs/final") is None
    (tmp_path / "outputs").mkdir()
    assert local_reason("outputs/final") is not None
    assert "its first part outputs/ is a directory here" in (
        model_path_problem("outputs/final") or ""
    )


def test_each_problem_is_named(tmp_path):
    missing = model_path_problem(str(tmp_path / "nope"))
    assert missing is not None and "no such directory" in missing and "namespace/name" in missing
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"x")
    assert "is a file, not a directory" in (model_path_problem(str(file)) or "")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    empty = model_path_problem(str(run)) or ""
    assert "holds no config.json" in empty and "its trained model is in final/" in empty
    assert "holds metrics.jsonl" in empty
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert "has a config but no weights" in (model_path_problem(str(model)) or "")
    (model / "model.safetensors").write_bytes(b"x")
    assert model_path_problem(str(model)) is None
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"x")
    assert model_path_problem(str(adapter)) is None
    assert model_path_problem("Qwen/Qwen2.5-0.5B-Instruct") is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["train", "model=hf", "model.path=/no/such/dir"],
            "model.path=/no/such/dir: no such directory",
        ),
        (["train", "model=hf"], "model=hf needs model.path"),
        # every preset that loads weights, not only model=hf; train, eval and a dry run alike
        (["train", "model.path=/no/such/dir"], "model.path=/no/such/dir: no such directory"),
        (["train", "model=tiny", "model.path=./gone"], "model.path=./gone: no such directory"),
        (
            ["eval", "model.path=outputs/train/d/t/final"],
            "model.path=outputs/train/d/t/final: no such directory",
        ),
        (
            ["eval", "model.path=outputs/train/d/t/final", "--dry-run"],
            "read as a local path because it has more than one '/'",
        ),
    ],
)
def test_the_cli_refuses_before_loading(tmp_path, args, fragment):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args],
        cwd=tmp_path,
        env=dict(os.environ, HYDRA_FULL_ERROR="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert fragment in result.stderr and "Repo id" not in result.stderr
    assert "Traceback" not in result.stderr
