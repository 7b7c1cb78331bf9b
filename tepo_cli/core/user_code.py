"""Import the user's own Python files (custom rewards, objective plugins, environments). User
code is trusted. A file's own folder goes on the import path, so it imports the modules beside
it as a script would."""

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
    _beside(file)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"{key}='{spec}' failed to import: {type(exc).__name__}: {exc}") from None
    return module


def _beside(file: Path) -> None:
    """The file's folder on the import path, first, as Python puts a script's own folder:
    a plugin file imports the modules beside it (`import helper` of helper.py) as it would
    when run as a script. Added once; it stays for the process (a module imported later, in
    a hook, finds its siblings too)."""
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def import_plugins(plugins: list[str]) -> None:
    """Import the `plugins=[...]` files or modules (each may register objectives, benchmarks,
    graders) before the config's names are checked against the registries."""
    for plugin in plugins:
        import_user_code(plugin, "plugins")
