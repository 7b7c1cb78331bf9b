"""Environments for multi-turn rollouts: the contract (`environment_contract.py`), one module per built-in
environment, and the registry that finds them.

Every module of this package that defines `ENVIRONMENT` (an `Environment` subclass) is one;
a plugin file (`plugins=[...]`) adds more with `register_environment`, which checks the contract
at once. `env=<name>` picks one; `single` is today's one answer per prompt.
"""

from __future__ import annotations

from types import ModuleType

from tepo_cli.core.discovery import Registry
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.envs.environment_contract import Environment, EnvSettings, contract_problem

# What a plugin environment imports (docs/guides/environments.md, "The contract"): the base
# class, its registration, and the types its hooks receive and return.
__all__ = [
    "EnvSettings",
    "Environment",
    "Problem",
    "RewardResult",
    "environment",
    "environments",
    "register_environment",
]


def _defined(module: ModuleType) -> list[type[Environment]]:
    found = getattr(module, "ENVIRONMENT", None)
    return [found] if found is not None else []


_ENVIRONMENTS: Registry[type[Environment]] = Registry(
    __name__,
    _defined,
    lambda cls: cls.name,
    "env.name={name} is not an environment; the environments are: {known}. An environment is a "
    "subclass of tepo_cli.envs.Environment with a `name` and a `respond` method, in a module of "
    "tepo_cli/envs/ (ENVIRONMENT = the class) or passed to register_environment(...) in a file "
    "listed in plugins=[...] (docs/guides/environments.md).",
)


def register_environment(cls: type[Environment]) -> type[Environment]:
    """Add an environment from a plugin file (usable as a class decorator). A class that does
    not keep the contract is refused here, at start-up, with one paragraph."""
    problem = contract_problem(cls)
    if problem is not None:
        raise ConfigError(
            f"register_environment: {problem}. An environment subclasses "
            'tepo_cli.envs.Environment, sets `name = "..."` (the env= value) and implements '
            "`respond(self, turn: str) -> str | None` (docs/guides/environments.md)."
        )
    return _ENVIRONMENTS.register(cls)


environments = _ENVIRONMENTS.all  # every environment by name
environment = _ENVIRONMENTS.get  # the one called `name`, or one paragraph listing them
