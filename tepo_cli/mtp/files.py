"""The MTP modules beside a run's `final/` model, and the check that a model can carry them.

`final/` stays a plain Hugging Face model (transformers and vLLM load it as is); the modules,
which the paper drops at inference, go to `<run dir>/mtp_modules.safetensors` with their settings
in the file's metadata, for a later run or an analysis that wants them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.atomic_write import staged
from tepo_cli.core.errors import RunError
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.engine import consolidated_state_dict

FILE = "mtp_modules.safetensors"  # in the run directory, beside final/ (core/run_dir.py)
METADATA_KEY = "tepo_mtp"
PREFIX = "mtp."  # the modules' keys in the policy's state dict (MtpStack.state_prefix)


def save_mtp_modules(engine: Any, cfg: TrainConfig, target: Path, topo: Topology) -> None:
    """Collective under ZeRO-3 (every rank calls it); rank 0 writes `target` atomically."""
    policy = engine.module
    consolidated = consolidated_state_dict(engine)
    if not topo.is_main:
        return
    state = policy.attached.state_dict() if consolidated is None else _own(consolidated)
    settings = {
        "format": "tepo-mtp-1",
        "depths": cfg.algo.mtp_depths,
        "model_type": str(getattr(policy.lm.config, "model_type", "")),
        "hidden_size": policy.lm.config.hidden_size,
        "block_weights": cfg.algo.block_weights,
        "mtp": cfg.algo.mtp.model_dump(mode="json"),
    }
    # One entry: safetensors keeps metadata in a hash map whose order changes from process to
    # process, and the file must be the same bytes whenever the modules are.
    metadata = {METADATA_KEY: json.dumps(settings, sort_keys=True)}
    tensors = {key: value.detach().cpu().contiguous() for key, value in state.items()}
    try:
        with staged(target) as staging:
            save_file(tensors, staging, metadata=metadata)
    except OSError as error:
        raise RunError(
            f"could not save the MTP modules to {target}: {error}. final/ is complete; the "
            f"checkpoints under {target.parent / 'checkpoints'} still hold the modules."
        ) from None


def _own(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The modules' entries of the policy's (consolidated) state dict, keys without the prefix."""
    return {
        key[len(PREFIX) :]: value for key, value in state_dict.items() if key.startswith(PREFIX)
    }


def load_mtp_modules(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, settings) of a saved MTP file."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        settings = json.loads(handle.metadata()[METADATA_KEY])
    return load_file(path), settings


def mtp_unsupported_message(cfg: TrainConfig, problem: str) -> str:
    return (
        f"algo.future=mtp attaches MTP modules to the policy, but model '{cfg.model.name}' cannot "
        f"carry them: {problem}. Use algo.future=exact (or algo=mpo_exact), which needs no "
        "modules, or a supported model."
    )


def early_mtp_problem(cfg: TrainConfig) -> str | None:
    """Why the configured model cannot carry MTP modules, read from its config alone (no
    weights), or None when it can or when that cannot be told before loading it."""
    if cfg.algo.mtp_depths == 0:
        return None
    from tepo_cli.mtp.support import mtp_support_problem

    if cfg.model.path is None and cfg.model.source in ("tiny", "gguf_package"):
        return mtp_support_problem("llama")  # built in-process / converted as Llama
    try:
        from transformers import AutoConfig

        from tepo_cli.models.loading import checkpoint_dir

        source = checkpoint_dir(cfg.model)
        config = AutoConfig.from_pretrained(source, trust_remote_code=cfg.model.trust_remote_code)
    except Exception:
        return None
    return mtp_support_problem(getattr(config, "model_type", None))
