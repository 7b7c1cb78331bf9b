"""Registries by discovery: every module of a package, imported, so that each extension point
(rollout back-ends, graders, benchmarks) is one module that names itself."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from types import ModuleType


def package_modules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """The modules of `package` (its `__name__` and `__path__`), imported, in name order."""
    return [
        importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(path)
    ]
