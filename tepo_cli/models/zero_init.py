"""Loading a model already partitioned over the ranks (ZeRO-3), never whole on any of them.

Under `deepspeed=zero3` each rank would otherwise load every weight and DeepSpeed would then
keep 1/world of them: the whole model once per rank at start-up, the high-water mark of a run's
memory. transformers partitions as it loads while an `HfDeepSpeedConfig` with stage 3 is alive
(its `deepspeed.zero.Init` route); a model built in-process (`model=tiny`) is partitioned right
after it is built with `deepspeed.zero.Init(module=...)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn


@contextlib.contextmanager
def partitioned_loading(ds_config: dict[str, Any] | None) -> Iterator[None]:
    """While open, transformers' `from_pretrained` partitions the weights it loads (a no-op with
    None). Closed again before anything else runs: transformers reads the same switch in
    `generate` and elsewhere."""
    if ds_config is None:
        yield
        return
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    alive = HfDeepSpeedConfig(ds_config)  # transformers keeps only a weak reference to it
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del alive


def partition(module: nn.Module, ds_config: dict[str, Any]) -> None:
    """Partition a module built whole (every rank built the same weights)."""
    from tepo_cli.core.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()

    deepspeed.zero.Init(module=module, config_dict_or_path=ds_config)


def is_partitioned(module: nn.Module) -> bool:
    return any(hasattr(p, "ds_id") for p in module.parameters())
