"""Load a user's reward function from a Python file (`reward=custom`). User code, trusted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tepo_cli.core.errors import ConfigError
from tepo_cli.core.user_code import import_user_code


def load_user_function(path: str, name: str) -> Callable[..., Any]:
    module = import_user_code(path, "reward.path")
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(
            f"reward.function='{name}' is not a function in {path}; the functions there are: "
            f"{', '.join(found) or 'none'}."
        )
    return function
