"""`AutoBool`: a knob that is `auto` (tepo decides for the device) or a plain true/false.

One validator instead of pydantic's union, so a bad value is one problem that names what is
allowed ("must be auto, true or false"), not one per member of the union."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator


def _auto_or_bool(value: Any) -> Any:
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError(f"must be auto, true or false, not {value!r}")


AutoBool = Annotated[Literal["auto"] | bool, BeforeValidator(_auto_or_bool)]
