"""`tepo report`'s plots: a (colour, line style) per group that never repeats within a figure,
small multiples past six groups, and `--groups` choosing what is drawn and tabled."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from test_report_dynamics import OPTIONS, write_run

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report import build_report
from tepo_cli.eval.report.grouping import Group, group_runs
from tepo_cli.eval.report.plot_panels import panels
from tepo_cli.eval.report.plot_styles import DISTINCT_PAIRS, style_of
from tepo_cli.eval.report.plots import curve_figure, figure_styles
from tepo_cli.eval.report.runs import find_runs, load_run
from tepo_cli.eval.report.selection import select_groups


def groups_of(*labels: str) -> list[Group]:
    """Groups labelled `key=value ...`, their values parsed from the label (no runs)."""
    return [Group(label, dict(p.split("=", 1) for p in label.split()), []) for label in labels]


def test_no_colour_and_line_style_pair_repeats_within_seventy_groups():
    pairs = [(style_of(i).colour, style_of(i).line_style) for i in range(DISTINCT_PAIRS)]
    assert DISTINCT_PAIRS == 70 and len(set(pairs)) == 70
    assert (
        style_of(0).colour != style_of(1).colour
        and style_of(0).line_style != style_of(1).line_style
    )
    # past 70 the marker keeps the triple unique
    triples = [(s.colour, s.line_style, s.marker) for s in map(style_of, range(3 * 70))]
    assert len(set(triples)) == 3 * 70


def test_the_reference_is_black_and_no_other_group_shares_its_colour():
    groups = groups_of(*(f"algo=a{i}" for i in range(13)))
    styles = figure_styles(groups, "algo=a3")
    assert styles["algo=a3"].colour == "black" and styles["algo=a3"].note == " (reference)"
    others = [styles[g.label] for g in groups if g.label != "algo=a3"]
    assert "black" not in {s.colour for s in others}
    assert len({(s.colour, s.line_style) for s in others}) == 12
    assert others[0] == style_of(0)  # the cycle starts again without the reference


@pytest.mark.parametrize("count", [1, 5, 6])
def test_six_groups_or_fewer_share_one_panel(count):
    layout = panels(groups_of(*(f"algo=a{i}" for i in range(count))), "algo=a0")
    assert len(layout) == 1 and len(layout[0].groups) == count


def test_past_six_groups_one_panel_per_comparison_with_the_reference():
    groups = groups_of(*(f"algo=a{i}" for i in range(13)))
    layout = panels(groups, "algo=a2")
    assert len(layout) == 12
    assert all(p.groups[0].label == "algo=a2" and len(p.groups) == 2 for p in layout)
    assert [p.groups[1].label for p in layout] == [g.label for g in groups if g.label != "algo=a2"]


def test_past_six_groups_without_a_reference_one_panel_per_first_key_at_most_six_each():
    labels = ["algo=dapo", "algo=grpo mb=4", "algo=grpo mb=1", "algo=mpo k=2", "algo=mpo k=4"]
    labels += ["algo=mpo k=8", "algo=mpo k=5", "algo=tepo mb=1"]
    layout = panels(groups_of(*labels))  # no reference (none named, or the default ambiguous)
    assert [(p.title, len(p.groups)) for p in layout] == [
        ("algo=dapo", 1), ("algo=grpo", 2), ("algo=mpo", 4), ("algo=tepo", 1)
    ]  # fmt: skip
    one_key = panels(groups_of(*(f"lr=1e-{i}" for i in range(13))))
    assert [len(p.groups) for p in one_key] == [5, 5, 3]  # a value per group: taken in order
    assert [p.title for p in one_key] == ["groups 1-5", "groups 6-10", "groups 11-13"]
    seven_mpo = panels(groups_of(*(f"algo=mpo k={k}" for k in range(7)), "algo=grpo k=5"))
    assert [(p.title, len(p.groups)) for p in seven_mpo] == [
        ("algo=mpo (1)", 4), ("algo=mpo (2)", 3), ("algo=grpo", 1)
    ]  # fmt: skip


@pytest.fixture()
def eight_groups(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for number, algo in enumerate(["grpo", "tepo", "gspo", "dapo", "mpo", "a5", "a6", "a7"]):
        for seed in (0, 1):
            masked = {"kl_mask_frac": [0.1, 0.2, 0.3, 0.4]} if algo == "tepo" else {}
            write_run(root, algo, seed, [0.2, 0.3 + 0.05 * number, 0.2 + 0.1 * seed], **masked)
    return root


def test_the_figure_of_eight_groups_has_seven_panels_and_a_legend_outside(eight_groups):
    runs = [load_run(path, eight_groups) for path in find_runs(eight_groups)]
    _, groups = group_runs(runs)
    figure = curve_figure(groups, "algo=grpo", "evals", "accuracy", "acc")
    assert figure is not None
    drawn = [axes for axes in figure.axes if axes.get_visible()]
    assert len(drawn) == 7 and all(len(axes.lines) == 2 for axes in drawn)
    assert all(axes.get_legend() is None for axes in figure.axes)  # no legend over the data
    (legend,) = figure.legends
    assert legend.get_texts()[0].get_text() == "algo=grpo (reference)"
    assert len(legend.get_texts()) == 8
    lines = [line for axes in drawn for line in axes.lines]
    pairs = {(line.get_color(), str(line.get_linestyle()), line.get_label()) for line in lines}
    assert len({(c, s) for c, s, _ in pairs}) == 8  # eight groups, eight (colour, style) pairs


def test_a_curve_only_some_groups_logged_gets_panels_for_those_only(eight_groups):
    runs = [load_run(path, eight_groups) for path in find_runs(eight_groups)]
    _, groups = group_runs(runs)
    figure = curve_figure(groups, "algo=grpo", "metrics", "kl_mask_frac", "mask")
    assert figure is not None
    (axes,) = [axes for axes in figure.axes if axes.get_visible()]
    (line,) = axes.lines
    assert list(line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3, 0.4])  # both seeds' mean
    assert line.get_color() == figure_styles(groups, "algo=grpo")["algo=tepo"].colour
    assert curve_figure(groups, "algo=grpo", "metrics", "kl", "KL") is None  # nobody logged it


def test_select_groups_by_names_or_a_regular_expression():
    groups = groups_of("algo=grpo", "algo=tepo k=2", "algo=tepo k=4", "algo=mpo")
    assert [g.label for g in select_groups(groups, None)] == [g.label for g in groups]
    chosen = select_groups(groups, "algo=mpo, algo=tepo k=2")
    assert [g.label for g in chosen] == ["algo=tepo k=2", "algo=mpo"]  # the report's order
    assert [g.label for g in select_groups(groups, "tepo|mpo")] == [g.label for g in groups[1:]]
    assert [g.label for g in select_groups(groups, r"k=\d$")] == ["algo=tepo k=2", "algo=tepo k=4"]
    with pytest.raises(ConfigError, match=r"chooses no group.*'algo=grpo', 'algo=tepo k=2'"):
        select_groups(groups, "algo=gspo")
    with pytest.raises(ConfigError, match="not a regular expression"):
        select_groups(groups, "algo=(grpo")


def test_groups_choose_the_tables_and_keep_the_named_reference(eight_groups, tmp_path):
    options = OPTIONS.__class__(**{**OPTIONS.__dict__, "groups": "algo=(tepo|mpo)"})
    report = build_report(eight_groups, tmp_path / "out", options, plots=False)
    assert [row.group.label for row in report.groups] == ["algo=grpo", "algo=mpo", "algo=tepo"]
    assert {row.group for row in report.runs} == {"algo=grpo", "algo=mpo", "algo=tepo"}
    assert report.reference is not None and report.reference.label == "algo=grpo"


def test_cli_groups_filters_and_refuses_a_choice_of_none(eight_groups, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "tepo_cli", "report", str(eight_groups), "--out", str(out)]
    result = subprocess.run([*command, "--groups", "algo=dapo,algo=a7", "--no-plots",
                             "--reference", "none"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    with (out / "report.csv").open() as handle:
        assert [row["group"] for row in csv.DictReader(handle)] == [
            "algo=a7",
            "algo=dapo",
        ]  # the report's order
    refused = subprocess.run([*command, "--groups", "algo=ppo"], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.startswith("tepo report: --groups 'algo=ppo'")
    assert "Traceback" not in refused.stderr
