"""LoRA adapters on the policy's LM, through peft (`model.lora.r > 0`).

peft's layers are injected into the transformers model in place (`inject_adapter_in_model`): the
LM keeps its class, its forward and its generation, every weight it had is frozen, and each
targeted linear layer computes W x + (alpha / r) B A x with A, B the only trainable weights.
Three things tepo needs from that model besides training it:
- the frozen reference of the KL term is the same model with its adapters switched off
  (`adapters_off`): no second copy of the weights;
- a rollout engine that holds its own copy (vLLM) receives the merged weights W + (alpha / r) B A
  under the model's plain parameter names (`merged_weights`);
- LoRA dropout acts only in the passes that train (`dropout_in_training`), never in sampling or
  scoring, so that sampling and the old log-probs see one function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from tepo_cli.config.schema import LoraConfig
from tepo_cli.core.errors import ConfigError

ADAPTER = "default"  # peft's name for a model's one adapter
_BASE, _ADAPTER_WEIGHTS = ".base_layer.", (".lora_A.", ".lora_B.")


def add_adapters(lm: nn.Module, settings: LoraConfig, base_model: str | None) -> None:
    """Inject LoRA layers into `lm` (in place) and freeze everything else. `base_model` (where the
    LM's weights came from, None for the in-process tiny model) is recorded in the adapter's
    config so that peft and `tepo eval` can find the weights it adapts."""
    import peft

    config = peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )
    try:
        peft.inject_adapter_in_model(config, lm, adapter_name=ADAPTER)
    except ValueError as error:
        raise ConfigError(
            f"model.lora.target_modules={settings.target_modules!r}: {error}. Give 'all-linear' "
            "(every linear layer but the LM head) or names of the model's linear modules, e.g. "
            "'[q_proj,k_proj,v_proj,o_proj]'."
        ) from None
    kernel_reads = (
        ("LM head", lm.get_output_embeddings()),
        ("embeddings", lm.get_input_embeddings()),
    )
    for which, module in kernel_reads:
        if is_adapted(module):
            raise ConfigError(
                f"model.lora.target_modules={settings.target_modules!r} puts an adapter on the "
                f"{which}: tepo's log-prob kernel reads that weight directly, so the adapter "
                "would not act. Target the attention and MLP projections ('all-linear')."
            )


def is_adapted(module: nn.Module | None) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)


def lora_layers(lm: nn.Module) -> list[nn.Module]:
    return [module for module in lm.modules() if is_adapted(module)]


@contextlib.contextmanager
def adapters_off(lm: nn.Module) -> Iterator[None]:
    """`lm` computes its base model's function meanwhile (peft's own switch, as
    `PeftModel.disable_adapter` uses it)."""
    layers = lora_layers(lm)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def recompute_context(model: nn.Module) -> Callable[[], tuple[Any, Any]]:
    """`context_fn` for torch's non-reentrant checkpoint of a layer of `model`: the layer that
    runs again in backward sees every dropout module in the mode it had in the forward.

    LoRA dropout acts only in the forward that records gradients (`dropout_in_training`: train
    mode there, eval mode again after it), so a layer recomputed in backward would otherwise
    run without it and differ from its forward — a wrong gradient, silently (checkpoint
    restores the random state, not the modules' modes). The modules are looked up at each
    forward: adapters may be added after checkpointing is set up (`model.gradient_checkpointing
    =true` at load)."""

    def context_fn() -> tuple[Any, Any]:
        dropouts = [module for module in model.modules() if isinstance(module, nn.Dropout)]
        return contextlib.nullcontext(), _modes(dropouts, [m.training for m in dropouts])

    return context_fn


@contextlib.contextmanager
def _modes(modules: list[nn.Module], modes: list[bool]) -> Iterator[None]:
    before = [module.training for module in modules]
    for module, mode in zip(modules, modes, strict=True):
        module.training = mode
    try:
        yield
    finally:
        for module, mode in zip(modules, before, strict=True):
            module.training = mode


def lora_dropouts(lm: nn.Module) -> list[nn.Module]:
    """The adapters' dropout modules (none with model.lora.dropout = 0: peft puts an Identity)."""
    return [
        module
        for layer in lora_layers(lm)
        for module in layer.lora_dropout.values()
        if isinstance(module, nn.Dropout)
    ]


@contextlib.contextmanager
def dropout_in_training(dropouts: list[nn.Module]) -> Iterator[None]:
    """`dropouts` (from `lora_dropouts`) in training mode while gradients are recorded (the
    policy otherwise stays in eval mode: no dropout anywhere)."""
    if not dropouts or not torch.is_grad_enabled():
        yield
        return
    for module in dropouts:
        module.train()
    try:
        yield
    finally:
        for module in dropouts:
            module.eval()


def merged_weights(
    lm: nn.Module,
    gathered: Callable[[list[nn.Parameter]], AbstractContextManager[object]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter of `lm` under the name it has without adapters, a LoRA layer's weight
    merged (W + (alpha / r) B A, by peft's `get_delta_weight`). `gathered(params)` makes the
    parameters whole meanwhile (ZeRO-3; a tensor from inside it is copied out). Tied parameters
    come under each of their names."""
    layers = {name: module for name, module in lm.named_modules() if is_adapted(module)}
    for name, param in lm.named_parameters(remove_duplicate=False):
        if any(part in name for part in _ADAPTER_WEIGHTS):
            continue
        owner, _, leaf = name.rpartition(_BASE)
        plain = f"{owner}.{leaf}" if owner else name
        if owner and leaf == "weight":
            layer = layers[owner]
            adapter = [layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight]
            with gathered([param, *adapter]), torch.no_grad():
                yield plain, param.detach() + layer.get_delta_weight(ADAPTER)
            continue
        # Any other parameter (a base layer's bias included: LoRA leaves it as it is).
        with gathered([param]):
            yield plain, param.detach().clone() if hasattr(param, "ds_id") else param.detach()


def trainable_parameters(module: nn.Module) -> int:
    return sum(full_numel(p) for p in module.parameters() if p.requires_grad)


def full_numel(param: nn.Parameter) -> int:
    """A parameter's element count, also while ZeRO-3 partitions it (`ds_numel`)."""
    return getattr(param, "ds_numel", param.numel())
