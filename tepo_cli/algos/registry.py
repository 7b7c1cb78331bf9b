"""The loss-plugin registry: a name → a function `(PolicyBatch, AlgoConfig) → (loss, metrics)`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import Tensor

from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.config import AlgoConfig

PolicyLossFn = Callable[[PolicyBatch, AlgoConfig], tuple[Tensor, dict[str, float]]]
F = TypeVar("F", bound=PolicyLossFn)

_REGISTRY: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator: make `fn` the loss of objective `name` (the `name` key of an algo config).

    A name can be registered once; registering it again raises ValueError (two plugins silently
    shadowing each other would change an experiment without a trace).
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"a policy loss needs a non-empty name, got {name!r}")

    def decorate(fn: F) -> F:
        if name in _REGISTRY:
            raise ValueError(f"policy loss {name!r} is already registered ({_REGISTRY[name]!r})")
        _REGISTRY[name] = fn
        return fn

    return decorate


def get_policy_loss(name: str) -> PolicyLossFn:
    """The registered loss of objective `name`; ValueError listing the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise ValueError(
            f"no policy loss registered under name {name!r}; registered: {known}"
        ) from None


def registered_policy_losses() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))
