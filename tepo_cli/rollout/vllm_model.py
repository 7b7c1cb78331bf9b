"""What the colocated vLLM engine is built from and fed: the model files it starts from (config
only: no weights, no tokenizer), its sequence length, and the trainer's weights for each sync."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import PreTrainedModel

from tepo_cli.config.schema import EngineConfig
from tepo_cli.models.lora import merged_weights


def engine_length(cfg: EngineConfig, lm: PreTrainedModel) -> int:
    """`rollout.engine.max_model_len`, never past the model's own context
    (`max_position_embeddings`, which vLLM refuses to exceed): an auto length of 2,048 prompt
    tokens plus the answers may ask for more than a small model was built for."""
    if cfg.max_model_len == "auto":
        raise ValueError(
            "rollout.engine.max_model_len=auto reached the engine unresolved: the job's config "
            "resolves it from the answer length (config.schema.resolve_engine_length)"
        )
    context = getattr(lm.config, "max_position_embeddings", None)
    return min(cfg.max_model_len, context) if isinstance(context, int) else cfg.max_model_len


def write_model_config(lm: PreTrainedModel, directory: Path) -> None:
    """The files vLLM builds the model from: config.json (architecture, shapes) and the generation
    config. No weights (they arrive through `sync`), no tokenizer (prompts arrive as ids)."""
    config = copy.deepcopy(lm.config)
    config.architectures = [type(lm).__name__]
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF source's; the weights synced are plain tensors
    config.save_pretrained(directory)
    if lm.generation_config is not None:
        lm.generation_config.save_pretrained(directory)


def policy_weights(lm: PreTrainedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's parameters by their transformers names, one at a time; with LoRA, each
    adapted layer's weight merged (the engine holds the plain model). ZeRO-3 partitions are
    gathered (a collective: every rank syncs, in the same order) and copied out before the next
    is gathered.

    Tied parameters are sent under each of their names (`lm_head.weight` beside
    `model.embed_tokens.weight`): vLLM reloads layer by layer, and a layer that receives nothing
    keeps its dummy values — with SmolLM2 the LM head would sample near-uniformly.
    """
    return merged_weights(lm, _gathered)


def _gathered(params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager[object]:
    if not any(hasattr(param, "ds_id") for param in params):
        return contextlib.nullcontext()
    from tepo_cli.core.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()

    return deepspeed.zero.GatheredParameters(params)
