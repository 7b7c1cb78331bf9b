"""What a checkpoint holds besides the engine: random-number states and prompt-stream positions."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, TypeVar

import numpy as np
import torch

T = TypeVar("T")


class CountingStream(Iterator[T]):
    """An endless prompt stream that knows how many items it has handed out.

    The streams are deterministic in their seed, so a position is restored by drawing that many
    items again — cheap next to a training step, and exact for generated and dataset tasks alike.
    """

    def __init__(self, items: Iterator[T], skip: int = 0) -> None:
        self._items = items
        self.drawn = 0
        for _ in range(skip):
            next(self)

    def __next__(self) -> T:
        item = next(self._items)
        self.drawn += 1
        return item


def capture_rng(generator: torch.Generator) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "update_generator": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["update_generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
