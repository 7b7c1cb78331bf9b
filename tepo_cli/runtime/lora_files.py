"""A LoRA run's final/: the adapter in peft's own format, and final/merged, the model with the
adapter merged in (`model.lora.save_merged`).

final/ loads with `PeftModel.from_pretrained(<base model>, final)` (its adapter_config.json names
the base: the embedded model's cached checkpoint, model.path, or the hub id) and with
`tepo eval model.path=<run>/final`; final/merged is a plain transformers model directory, which
any tool loads. The merge is peft's own (`merge_and_unload`) on a fresh copy of the base weights,
so the merged model is built from exactly what final/ holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tepo_cli.config.schema import TrainConfig
from tepo_cli.models.loading import load_model
from tepo_cli.models.lora import ADAPTER
from tepo_cli.models.policy import Policy
from tepo_cli.runtime.atomic_dir import write_directory
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.engine import consolidated_state_dict

MERGED = "merged"
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # the file name peft reads
PEFT_PREFIX = "base_model.model."


def save_adapter(
    cfg: TrainConfig, engine: Any, tokenizer: Any, target: Path, topo: Topology
) -> dict[str, str]:
    """Collective under ZeRO-3 (every rank calls it); rank 0 writes `target` through a staging
    directory. Returns the summary's paths."""
    from peft import get_peft_model_state_dict

    policy: Policy = engine.module
    consolidated = consolidated_state_dict(engine)
    merged = target / MERGED if cfg.model.lora.save_merged else None
    saved = {"final_adapter": str(target), "final_model": str(merged or target)}
    if not topo.is_main:
        return saved
    state = None if consolidated is None else policy.hf_state_dict(consolidated)
    weights = get_peft_model_state_dict(policy.lm, state_dict=state, adapter_name=ADAPTER)
    # Keys as `PeftModel.save_pretrained` writes them (the adapter wraps the model it adapts).
    weights = {
        PEFT_PREFIX + name: tensor.detach().contiguous().cpu() for name, tensor in weights.items()
    }

    def write(staging: Path) -> None:
        policy.lm.peft_config[ADAPTER].save_pretrained(staging)
        save_file(weights, staging / ADAPTER_WEIGHTS)
        tokenizer.save_pretrained(staging)
        if merged is not None:
            write_merged(cfg, staging, staging / MERGED, tokenizer, topo.device)

    write_directory(target, write, "the final adapter")
    return saved


def write_merged(
    cfg: TrainConfig, adapter: Path, target: Path, tokenizer: Any, device: torch.device
) -> None:
    """The base model loaded afresh, the adapter at `adapter` merged into it, saved to `target`."""
    from peft import PeftModel

    base = load_model(cfg.model, tokenizer, device)
    model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
