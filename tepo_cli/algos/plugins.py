"""Objective plugins from the user's own files, and the start-up check of `algo.name`."""

from __future__ import annotations

from tepo_cli.core.errors import ConfigError
from tepo_cli.core.user_code import import_plugins


def load_objectives(plugins: list[str], name: str) -> None:
    """Import `plugins` (each registers objectives), then make sure `name` is registered."""
    from tepo_cli.algos import registered_policy_losses

    import_plugins(plugins)
    known = registered_policy_losses()
    if name == "???":  # conf/algo/_base.yaml's mandatory value, chosen as if it were a preset
        from tepo_cli.algos.presets import preset_names

        raise ConfigError(
            f"algo=_base holds the default of every objective knob, which each preset starts "
            f"from; it names no objective. Choose a preset (algo={', algo='.join(preset_names())}) "
            f"or set algo.name to a registered objective ({', '.join(known)})."
        )
    if name not in known:
        raise ConfigError(
            f"algo.name='{name}' is not a registered objective; the registered ones are: "
            f"{', '.join(known)}. A new objective is a function decorated with "
            f"@register_policy_loss('{name}') in a file listed in plugins=[...]."
        )
