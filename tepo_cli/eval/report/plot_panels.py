"""Which groups share a panel: one panel while a reader can still tell the lines apart, small
multiples beyond that.

Up to `ONE_PANEL` groups are drawn together. With more, a figure of one panel per *reference
comparison* is drawn when the report has a reference group (`--reference`): the reference plus
one other group per panel, because the report's claims are all of the form "this group against
the reference" (the steps-to-level columns and the "Against the reference" table), so each panel
shows exactly one claim's two curves, and the reference looks the same in every panel. Without a
reference there is no claim to lay out by, so the groups are split by the value of the first
swept key that puts some of them together (`algo=mpo` with its `k=...` variants in one panel),
else taken in order, at most `ONE_PANEL` per panel.
"""

from __future__ import annotations

from dataclasses import dataclass

from tepo_cli.eval.report.grouping import Group

ONE_PANEL = 6  # more lines than this in one panel (each with its band) are not read


@dataclass(frozen=True)
class Panel:
    title: str
    groups: list[Group]


def panels(groups: list[Group], reference: str | None = None) -> list[Panel]:
    """The panels of one figure, in the groups' order; `reference`: the reference group's label."""
    if len(groups) <= ONE_PANEL:
        return [Panel("", list(groups))]
    anchor = next((g for g in groups if g.label == reference), None)
    if anchor is not None:
        others = [g for g in groups if g is not anchor]
        return [Panel(f"{g.label}\nagainst {anchor.label}", [anchor, g]) for g in others]
    keys = [key for key in groups[0].values if _splits(groups, key)]
    by_value: dict[str, list[Group]] = {}
    for group in groups:
        name = f"{keys[0]}={group.values[keys[0]]}" if keys else ""
        by_value.setdefault(name, []).append(group)
    result: list[Panel] = []
    for name, members in by_value.items():
        for number, chunk in enumerate(_chunks(members), start=1):
            if not name:
                title = f"groups {members.index(chunk[0]) + 1}-{members.index(chunk[-1]) + 1}"
            else:
                title = name if len(chunk) == len(members) else f"{name} ({number})"
            result.append(Panel(title, chunk))
    return result


def _splits(groups: list[Group], key: str) -> bool:
    """Whether `key` puts some groups together (fewer values than groups) and takes more than
    one value: a key with a value per group would give a panel per group."""
    values = {group.values.get(key) for group in groups}
    return 1 < len(values) < len(groups)


def _chunks(members: list[Group]) -> list[list[Group]]:
    """`members` in order, in the fewest panels of at most ONE_PANEL, their sizes within one."""
    count = -(-len(members) // ONE_PANEL)
    size = -(-len(members) // count)
    return [members[i : i + size] for i in range(0, len(members), size)]
