"""Objective plugins from the user's own files, and the start-up check of `algo.name`."""

from __future__ import annotations

from tepo_cli.config.errors import ConfigError
from tepo_cli.config.user_code import import_user_code


def load_objectives(plugins: list[str], name: str) -> None:
    """Import `plugins` (each registers objectives), then make sure `name` is registered."""
    from tepo_cli.algos import registered_policy_losses

    for plugin in plugins:
        import_user_code(plugin, "plugins")
    known = registered_policy_losses()
    if name not in known:
        raise ConfigError(
            f"algo.name='{name}' is not a registered objective; the registered ones are: "
            f"{', '.join(known)}. A new objective is a function decorated with "
            f"@register_policy_loss('{name}') in a file listed in plugins=[...]."
        )
