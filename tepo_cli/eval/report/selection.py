"""`tepo report --groups`: the groups a report draws and tables.

The value is either group labels separated by commas, each exactly as the report prints it
(`algo=dapo,algo=mpo k=2`), or else one regular expression searched for in every label
(`'algo=(grpo|tepo)'`): names first, because a label holds `.` and `=` that a regular expression
would read loosely, and a comma is rare in a pattern. The reference group named by `--reference`
is kept even when not chosen: the steps-to-level columns and the comparisons are all against it.
"""

from __future__ import annotations

import re

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.grouping import Group


def select_groups(groups: list[Group], wanted: str | None) -> list[Group]:
    """The groups `wanted` names or matches, in the report's order; all of them for None.

    Raises ConfigError (one paragraph, the labels listed) when it chooses none or is neither a
    list of labels nor a valid regular expression."""
    if wanted is None:
        return groups
    labels = [group.label for group in groups]
    names = [name.strip() for name in wanted.split(",")]
    if all(name in labels for name in names):
        return [group for group in groups if group.label in names]
    try:
        pattern = re.compile(wanted)
    except re.error as error:
        raise ConfigError(
            f"--groups {wanted!r} names no group (labels: {_listed(labels)}) and is not a "
            f"regular expression ({error}). Give labels separated by commas, or a pattern such "
            "as 'algo=(grpo|tepo)'. Nothing was written."
        ) from None
    chosen = [group for group in groups if pattern.search(group.label)]
    if not chosen:
        raise ConfigError(
            f"--groups {wanted!r} chooses no group: it is not a list of labels, and as a regular "
            f"expression it matches none of {_listed(labels)}. Nothing was written."
        )
    return chosen


def _listed(labels: list[str]) -> str:
    return ", ".join(repr(label) for label in labels)
