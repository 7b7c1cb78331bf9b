"""tepo: reinforcement learning from verifiable rewards for language models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"


def _config_tree_of_a_source_checkout() -> None:
    """Make the repository's conf/ the module `tepo_cli.conf` when tepo runs uninstalled.

    Installs map conf/ to `tepo_cli.conf` (setup.py), where Hydra and the config checks read it. A
    checkout put on PYTHONPATH, as on a GPU node that reaches no package index
    (scripts/device_check.sh), has no such module; this gives it the same one, from the same files.
    """
    name = f"{__name__}.conf"
    if importlib.util.find_spec(name) is not None:
        return
    conf = Path(__file__).resolve().parent.parent / "conf"
    if not (conf / "__init__.py").is_file():
        return
    spec = importlib.util.spec_from_file_location(
        name, conf / "__init__.py", submodule_search_locations=[str(conf)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_config_tree_of_a_source_checkout()
