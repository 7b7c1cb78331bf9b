"""`tepo report` on a 120-column terminal: long group labels become G1, G2, ... with a legend,
no word is broken, and columns that say the same thing in every row are said once instead.

Four groups of two seeds, every swept key differing between groups, so each label is four long
`key=value` words. Every run: 4 steps of 1 s, training accuracy .5 at every step (so "steps to
accuracy ≥ 0.5" is 1.0 for all), rewards .1·step + .01·group; held-out .2 before training, then
seed 0: .3 at step 2 and .4 + .05·group at step 4, seed 1: .5 and .6. The reference (group 0)
has means .4 at step 2 and .5 at step 4: best .5, so the 50 % level is .25, which every run
reaches at step 2 (constant: said once), and the 90 % level .45, which group 0's seed 0 never
reaches (.4) while the others do (kept).
"""

from __future__ import annotations

import io
import json
import re
import socket
from pathlib import Path

import pytest
import yaml
from rich.cells import cell_len
from rich.console import Console

from tepo_cli.eval.report import Options, build_report

LABELS = [
    f"algo.mask_criterion=criterion_{g} algo.kl_mask=mask_number_{g} trainer.minibatches={g} "
    f"algo.tepo_entropy_coefficient_with_a_long_name=0.{g}"
    for g in range(4)
]


def write_run(root: Path, group: int, seed: int, held_out: list[float]) -> None:
    run = root / f"g{group}-s{seed}"
    (run / ".hydra").mkdir(parents=True)
    overrides = [*LABELS[group].split(), f"seed={seed}"]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "trainer": {"max_steps": 4}}))
    lines = [
        {"step": s, "step_seconds": 1.0, "reward_mean": 0.1 * s + 0.01 * group, "accuracy": 0.5}
        for s in (1, 2, 3, 4)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    evals = zip((0, 2, 4), ("before", "every", "after"), held_out, strict=True)
    (run / "eval.jsonl").write_text(
        "".join(json.dumps({"step": s, "when": w, "accuracy": a}) + "\n" for s, w, a in evals)
    )
    status = {"state": "finished", "pid": 1, "hostname": socket.gethostname()}
    (run / "status.json").write_text(json.dumps(status))


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for group in range(4):
        write_run(root, group, 0, [0.2, 0.3, 0.4 + 0.05 * group])
        write_run(root, group, 1, [0.2, 0.5, 0.6])
    return root


def rendered(sweep: Path, tmp_path: Path, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    options = Options(last=2, reference=LABELS[0], fractions=(0.5, 0.9))
    build_report(sweep, tmp_path / "out", options, plots=False, console=console)
    return console.file.getvalue()


def test_at_120_columns_every_line_fits_and_no_word_is_broken(sweep, tmp_path):
    text = rendered(sweep, tmp_path, 120)
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= 120
    legend = lines.index("Groups:")  # under the first table: a label per group, whole words
    entries = " ".join(line.strip() for line in lines[legend + 1 : legend + 9]).split()
    said = " ".join(entries)
    for number, label in enumerate(LABELS, start=1):
        assert f"G{number} {label}" in said
    rows = [line for line in lines if line.startswith("│")]
    assert sum(1 for row in rows if row.startswith("│ G1 ")) >= 3  # groups, dynamics, curve
    words = {word for label in LABELS for word in label.split()}
    pieces = {p for row in rows for p in re.findall(r"[A-Za-z_.=]{4,}[\w.=]*", row)}
    broken = {p for p in pieces if p not in words and any(w.startswith(p) for w in words)}
    assert not broken  # no fragment of a label's word in any table row


def test_columns_the_same_in_every_row_are_said_once(sweep, tmp_path):
    text = rendered(sweep, tmp_path, 120)
    flat = " ".join(text.split())
    headers = [line for line in text.splitlines() if line.startswith("┃")]
    assert not any("accuracy" in line for line in headers)  # "steps to accuracy ≥ 0.5" dropped
    said = "not shown: runs: 2 finished; acc. before: 0.200; steps to accuracy ≥ 0.5: 1.0; "
    assert said + "seconds to accuracy ≥ 0.5: 1.0;" in flat
    # "it" said in full once its "steps to" column is left out
    assert "steps to 50% (0.250): 2.0; seconds to 50% (0.250): 2;" in flat
    assert "steps to 90% (0.450), censored (n): 3.0 ± 12.7;" in flat
    assert "state: finished; steps: 4/4;" in flat and "notes: none" in flat
    # differs between groups: kept (its header wrapped to the numbers' width)
    assert any("90%" in line for line in headers) and "3.0 ± 12.7" in text


def test_a_wide_terminal_keeps_the_full_labels(sweep, tmp_path):
    text = rendered(sweep, tmp_path, 400)
    assert "G1 " not in text and all(label in text for label in LABELS)


def test_a_table_too_wide_for_the_terminal_is_split_and_each_part_says_what_it_is():
    from tepo_cli.eval.report.terminal import Spec, print_fitted

    rows = [
        {"group": f"algo=a{i} tags=[dim]", "x": f"{i}.{i}{i} ± 0.123", "s": f"{i}{i}.5"}
        for i in range(3)
    ]
    columns = [("group", lambda r: r["group"]), ("steps to 90% (0.216)", lambda r: r["x"])]
    columns += [("seconds to it", lambda r: r["s"]), ("CPU s to it", lambda r: r["s"])]
    console = Console(width=40, file=io.StringIO(), color_system=None)
    print_fitted(console, [Spec("Dynamics", columns, rows, "legend")], [r["group"] for r in rows])
    wide = Console(width=200, file=io.StringIO(), color_system=None)
    print_fitted(wide, [Spec("Dynamics", columns, rows, "legend")], [r["group"] for r in rows])
    assert "│ algo=a1 tags=[dim] │" in wide.file.getvalue()  # a label is text, not rich markup
    text = console.file.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= 40
    assert "Dynamics (1/2)" in text and "Dynamics (2/2)" in text
    second = text[text.index("Dynamics (2/2)") :]
    headers = " ".join(line.strip("┃ ") for line in second.splitlines() if line.startswith("┃"))
    assert "to 90%" in headers and "to it" not in headers  # its "steps to" column is in part 1
    assert all(f"│ G{i} " in second for i in (1, 2, 3))  # each part names its rows
    assert "G2   algo=a1 tags=[dim]" in text
    assert text.count("legend") == 1 and text.index("legend") > text.index("Dynamics (2/2)")
