"""Load a user's reward function from a Python file (`reward=custom`). User code, trusted."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tepo_cli.config.errors import ConfigError


def load_user_function(path: str, name: str) -> Callable[..., Any]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(
            f"reward.path='{path}' is not a file; it must be a .py file defining {name}."
        )
    spec = importlib.util.spec_from_file_location(f"tepo_user_reward_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"reward.path='{path}' cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: report what went wrong, briefly
        raise ConfigError(
            f"reward.path='{path}' failed to import: {type(exc).__name__}: {exc}"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(
            f"reward.function='{name}' is not a function in {path}; the functions there are: "
            f"{', '.join(found) or 'none'}."
        )
    return function
