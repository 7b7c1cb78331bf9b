"""Import the user's own Python files (custom rewards, objective plugins). User code is trusted."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tepo_cli.core.errors import ConfigError


def import_user_code(spec: str, key: str) -> ModuleType:
    """`spec` is a .py file or an importable module name; `key` names the config key in errors."""
    if spec.endswith(".py") or "/" in spec:
        return _import_file(Path(spec).expanduser(), spec, key)
    try:
        return importlib.import_module(spec)
    except Exception as exc:  # the user's module: say what went wrong, briefly
        raise ConfigError(f"{key}='{spec}' failed to import: {type(exc).__name__}: {exc}") from None


def _import_file(file: Path, spec: str, key: str) -> ModuleType:
    if not file.is_file():
        raise ConfigError(f"{key}='{spec}' is not a file; give a .py file or a module name.")
    name = f"tepo_user_{file.stem}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(file.resolve()):
        return sys.modules[name]  # a multirun imports each plugin once per process
    module_spec = importlib.util.spec_from_file_location(name, file.resolve())
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{key}='{spec}' cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"{key}='{spec}' failed to import: {type(exc).__name__}: {exc}") from None
    return module


def import_plugins(plugins: list[str]) -> None:
    """Import the `plugins=[...]` files or modules (each may register objectives, benchmarks,
    graders) before the config's names are checked against the registries."""
    for plugin in plugins:
        import_user_code(plugin, "plugins")
