"""Build the policy (and tokenizer) a `model` config group describes.

Rule: `model.path`, when set, always wins (a saved run's `final/` directory, a hub id or a local
checkpoint; a LoRA adapter directory is merged into the base model it names); otherwise `source`
says where the weights come from.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from tepo_cli.config.schema import ModelConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.models.gguf_convert import converted_checkpoint
from tepo_cli.models.lora import recompute_context
from tepo_cli.models.precision import resolve_dtype
from tepo_cli.models.zero_init import is_partitioned, partition, partitioned_loading

ADAPTER_CONFIG = "adapter_config.json"  # peft's: a directory holding a LoRA adapter


def checkpoint_dir(cfg: ModelConfig) -> str | None:
    """Where `from_pretrained` reads this model from (None for the in-process tiny model)."""
    if cfg.path:
        return cfg.path
    if cfg.source == "gguf_package":
        assert cfg.package and cfg.gguf_file  # guaranteed by ModelConfig validation
        return str(converted_checkpoint(cfg.name, cfg.package, cfg.gguf_file))
    if cfg.source == "hf":
        return cfg.path
    return None


def weights_location(cfg: ModelConfig) -> str | None:
    """`checkpoint_dir`, a local directory made absolute (what a LoRA adapter records as its
    base model)."""
    source = checkpoint_dir(cfg)
    if source is not None and Path(source).is_dir():
        return str(Path(source).resolve())
    return source


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    source = _tokenizer_source(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=cfg.trust_remote_code)
    except OSError as exc:
        raise ConfigError(
            f"Cannot load a tokenizer from '{source}' (model '{cfg.name}'): {exc}"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # prompts are left-padded so completions start at one column
    return tokenizer


def load_model(
    cfg: ModelConfig,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
    zero3: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """`zero3`: a ZeRO-3 DeepSpeed config to load the weights partitioned over the ranks with
    (models/zero_init.py); ignored for a LoRA adapter directory, merged whole."""
    dtype = resolve_dtype(cfg.dtype, device)
    if device.type == "cpu":
        _grouped_query_attention_without_copies()
    source = checkpoint_dir(cfg)
    if source is None:
        model = _tiny_model(cfg, tokenizer)
        model.to(device=device, dtype=dtype)
        if zero3 is not None:
            partition(model, zero3)
    elif (Path(source) / ADAPTER_CONFIG).is_file():
        model = _merged_adapter(cfg, Path(source), dtype)
    else:
        with partitioned_loading(zero3):
            model = _pretrained(cfg, source, dtype)
    if not is_partitioned(model):
        model.to(device=device, dtype=dtype)
    if model.generation_config is not None:
        # Sampling settings come from the rollout config only, never from a checkpoint's defaults.
        model.generation_config.top_k = None
        model.generation_config.top_p = None
        model.generation_config.temperature = None
    if cfg.gradient_checkpointing is True:  # auto: per micro-batch (train/recompute.py)
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={
                "use_reentrant": False,
                "context_fn": recompute_context(model),  # LoRA dropout as in the forward
            }
        )
    model.config.use_cache = True
    return model


def _pretrained(cfg: ModelConfig, source: str, dtype: torch.dtype) -> PreTrainedModel:
    try:
        return AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, trust_remote_code=cfg.trust_remote_code
        )
    except OSError as exc:
        raise ConfigError(
            f"Cannot load model '{cfg.name}' from '{source}': {exc}. Set model.path to a "
            f"directory written by save_pretrained (e.g. <run dir>/final) or a hub id."
        ) from None


def _merged_adapter(cfg: ModelConfig, adapter: Path, dtype: torch.dtype) -> PreTrainedModel:
    """A peft LoRA adapter directory (a LoRA run's final/): its base model with it merged in."""
    from peft import PeftModel

    base = json.loads((adapter / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ConfigError(
            f"model.path={adapter} is a LoRA adapter whose base model has no saved weights (it "
            f"was trained on a model built in-process, model=tiny): load {adapter / 'merged'}, "
            "the model with the adapter merged in, instead."
        )
    model = _pretrained(cfg, base, dtype)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


def _grouped_query_attention_without_copies() -> None:
    """Let SDPA read the shared key/value heads in place on CPU.

    With a padding mask, transformers copies every key/value head once per query head before
    calling SDPA (repeat_kv), because CUDA's fused kernels cannot take a mask and grouped heads
    together. torch's CPU kernel can (`enable_gqa`), with identical results; the copies cost a
    decode step time and, kept for backward, activation memory in every training step.
    transformers reads this switch at every attention call; a user's own setting wins.
    """
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")


def _tokenizer_source(cfg: ModelConfig) -> str:
    name = cfg.tokenizer
    if name is None:
        source = checkpoint_dir(cfg)
        if source is None:
            raise ConfigError(
                f"model '{cfg.name}' has no weights to take a tokenizer from: set model.tokenizer."
            )
        return source
    if Path(name).is_dir():
        return name
    preset = resources.files("tepo_cli.conf") / "model" / f"{name}.yaml"
    if preset.is_file():
        # A model preset name, e.g. the embedded model's tokenizer for `model=tiny`.
        data = OmegaConf.to_container(OmegaConf.create(preset.read_text()))
        other = ModelConfig.model_validate(data)
        return _tokenizer_source(other)
    return name  # a hub id


def _tiny_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.init_seed)
        return LlamaForCausalLM(config)
