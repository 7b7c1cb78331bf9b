"""Registries by discovery: every module of a package, imported, so that each extension point
(rollout back-ends, graders, benchmarks) is one module that names itself; a plugin file
(`plugins=[...]`) adds more with the registry's `register`."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Generic, TypeVar

from tepo_cli.core.errors import ConfigError

T = TypeVar("T")


def package_modules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """The modules of `package` (its `__name__` and `__path__`), imported, in name order."""
    return [
        importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(path)
    ]


class Registry(Generic[T]):
    """One extension point: the entries its package's modules define (its `__path__` as it is
    when asked), then the registered ones.

    `defined(module)` gives a module's entries, `name_of(entry)` an entry's name, and `unknown`
    the one-paragraph refusal of a name that is none of them (a template of `{name}`, `{known}`).
    """

    def __init__(
        self,
        package: str,
        defined: Callable[[ModuleType], Iterable[T]],
        name_of: Callable[[T], str],
        unknown: str,
    ) -> None:
        self._package = package
        self._defined, self._name_of, self._unknown = defined, name_of, unknown
        self._registered: dict[str, T] = {}

    def register(self, entry: T) -> T:
        """Add an entry from outside the package (a plugin file)."""
        self._registered[self._name_of(entry)] = entry
        return entry

    def all(self) -> dict[str, T]:
        """Every entry by name; a registered one replaces a defined one of the same name."""
        found = {
            self._name_of(entry): entry
            for module in package_modules(self._package, sys.modules[self._package].__path__)
            for entry in self._defined(module)
        }
        return {**found, **self._registered}

    def get(self, name: str) -> T:
        """The entry called `name`, or ConfigError listing the known names."""
        known = self.all()
        if name not in known:
            raise ConfigError(self._unknown.format(name=name, known=", ".join(sorted(known))))
        return known[name]


def _self_named(module: ModuleType) -> list[ModuleType]:
    return [module] if isinstance(module.__dict__.get("NAME"), str) else []


class ModuleRegistry(Registry[ModuleType]):
    """A registry whose entries are modules that name themselves (`NAME`) and have `build()`:
    rollout back-ends and experiment trackers. `kind` names them in the refusal of a bad one."""

    def __init__(self, package: str, kind: str, unknown: str) -> None:
        super().__init__(package, _self_named, lambda module: module.NAME, unknown)
        self._kind = kind

    def register(self, entry: ModuleType) -> ModuleType:
        """Add a module from a plugin file (ending in `register_...(sys.modules[__name__])`)."""
        name = getattr(entry, "NAME", None)
        if not (isinstance(name, str) and callable(getattr(entry, "build", None))):
            raise ConfigError(
                f"{entry.__name__} is not {self._kind}: it needs NAME (a string) and build()"
            )
        return super().register(entry)
