"""`tepo eval --help` lists the config groups `tepo eval` accepts, not every folder of conf/.

Hydra's help lists every config group it can see ($APP_CONFIG_GROUPS), and `tepo eval` sees the
whole conf/ tree, so its help offered algo, advantage, deepspeed and recipe, which it refuses.
conf/eval.yaml's help template asks this resolver for its own groups instead.
"""

from __future__ import annotations

from importlib import resources

from omegaconf import OmegaConf

RESOLVER = "tepo_config_groups"


def group_lines(groups: str) -> str:
    """'model,benchmark' -> one `group: option, option` line per group, options as in conf/."""
    conf = resources.files("tepo_cli.conf")
    lines = []
    for group in (name.strip() for name in groups.split(",") if name.strip()):
        options = sorted(
            entry.name.removesuffix(".yaml")
            for entry in conf.joinpath(group).iterdir()
            if entry.name.endswith(".yaml") and not entry.name.startswith("_")
        )
        lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, group_lines)
