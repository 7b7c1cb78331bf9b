"""The loss-plugin registry: a name → a function `(PolicyBatch, AlgoConfig) → (loss, metrics)`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import Tensor

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch
from tepo_cli.algos.inputs import DECLARABLE, Reads

PolicyLossFn = Callable[[PolicyBatch, AlgoConfig], tuple[Tensor, dict[str, float]]]
F = TypeVar("F", bound=PolicyLossFn)

_REGISTRY: dict[str, PolicyLossFn] = {}
_READS: dict[str, Reads] = {}  # what each objective reads (algos/inputs.py)
# Objectives whose policy term is a multiple of each token's advantage (train/zero_advantage.py).
_ADVANTAGE_PROPORTIONAL: set[str] = set()


def register_policy_loss(
    name: str, *, reads: Reads = frozenset(), advantage_proportional: bool = False
) -> Callable[[F], F]:
    """Decorator: make `fn` the loss of objective `name` (the `name` key of an algo config).

    `reads` declares the inputs of `tepo_cli.algos.inputs.DECLARABLE` that `fn` reads, fixed or
    from the config: the trainer scores and passes those, every other one is None.

    `advantage_proportional=True` declares that, the KL term aside, a response whose advantages
    are all 0 adds nothing to the loss's gradient: the update may then leave such rows out
    (trainer.skip_zero_advantage). A name can be registered once; registering it again raises
    ValueError (two plugins silently shadowing each other would change an experiment without a
    trace).
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"a policy loss needs a non-empty name, got {name!r}")

    def decorate(fn: F) -> F:
        if name in _REGISTRY:
            raise ValueError(f"policy loss {name!r} is already registered ({_REGISTRY[name]!r})")
        _REGISTRY[name] = fn
        _READS[name] = reads
        if advantage_proportional:
            _ADVANTAGE_PROPORTIONAL.add(name)
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


def advantage_proportional(name: str) -> bool:
    """Whether objective `name` was registered as a multiple of the advantages (its KL aside)."""
    return name in _ADVANTAGE_PROPORTIONAL


def objective_reads(cfg: AlgoConfig) -> frozenset[str]:
    """The inputs objective `cfg.name` declared it reads under `cfg` (an unknown name: the
    ValueError of `get_policy_loss`); for any objective, π_old's entropies when
    `top_entropy_quantile` < 1 picks tokens by them (algos/high_entropy.py) and the current ones
    when the entropy bonus reads them (algos/entropy_bonus.py)."""
    declared = _READS[cfg.name] if cfg.name in _READS else get_policy_loss(cfg.name)
    reads = frozenset(declared(cfg) if callable(declared) else declared)
    reads |= {"old_entropy"} if cfg.entropy_selection else set()
    reads |= {"entropy"} if cfg.entropy_coef != 0 else set()
    if unknown := ", ".join(sorted(reads - DECLARABLE)):
        raise ValueError(
            f"objective {cfg.name!r} declares unknown inputs {unknown}; known: "
            f"{', '.join(sorted(DECLARABLE))}"
        )
    return reads
