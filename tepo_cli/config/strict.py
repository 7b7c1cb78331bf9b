"""The base of every config model: an unknown key is an error, never silently ignored."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def without(data: dict[str, Any], keys: Any) -> dict[str, Any]:
    """A model's dump less `keys`: the knobs that do not apply to the chosen variant, left out so
    a run's config.yaml holds what applies and validates again."""
    return {key: value for key, value in data.items() if key not in keys}
