"""`tepo protocol stop` (tepo_cli/protocol/early_stop.py) on the fake sweep of
test_report_protocol.py, seed 12 never trained: the stop is refused until it keeps whole finished
seeds and says why; then the report compares the kept seeds (10, 11) without --interim, every
table labelled, and the runner trains no run of the dropped seed.

Seeds 10, 11: eval_auc tepo .45 .47, grpo .30 .31 (Welch, one-sided greater), the numbers
test_a_partial_sweep_reports_n_as_it_is_and_names_what_is_missing checks as an interim look."""

from __future__ import annotations

import json

import pytest
from test_report_protocol import _welch_p, protocol, write_run

from tepo_cli.cli import main as tepo
from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.build_protocol import build_protocol_report
from tepo_cli.protocol.early_stop import stop_experiment
from tepo_cli.protocol.journal import JOURNAL
from tepo_cli.protocol.protocol_runner import main as run_main

REASON = "seed 12 needs longer than the machine is kept."


@pytest.fixture()
def two_seeds(tmp_path):
    root = tmp_path / "runs"
    for seed in (10, 11):
        for arm in ("grpo", "tepo"):
            write_run(root, arm, seed)
    write_run(root, "grpo", 12, state="interrupted")
    return root, protocol(tmp_path / "p.yaml")


def stop_lines(root):
    path = root / JOURNAL
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line["event"] == "stop"]


def stop_command(path, root, seeds: str) -> int:
    """`tepo protocol stop` from the command line: its exit code."""
    with pytest.raises(SystemExit) as ended:
        tepo(["protocol", "stop", str(path), "--seeds", seeds, "--reason", REASON,
              "--results-dir", str(root)])  # fmt: skip
    return ended.value.code


@pytest.mark.parametrize(
    ("seeds", "reason", "says"),
    [
        ([10, 11, 12], REASON, "keeps some, not all, of the seeds"),
        ([10, 99], REASON, "99 is not one of them"),
        ([10, 11], "  ", "and says why"),
        ([10, 12], REASON, "not yet: grpo_seed12, tepo_seed12"),
    ],
)
def test_a_stop_keeps_whole_finished_seeds_and_says_why(two_seeds, seeds, reason, says):
    root, path = two_seeds
    with pytest.raises(ConfigError) as refused:
        stop_experiment(path, seeds, reason, root)
    assert says in str(refused.value) and str(refused.value).endswith("Nothing was written.")
    assert stop_lines(root) == []


def test_after_a_stop_the_report_compares_the_kept_seeds_as_registered(two_seeds, tmp_path):
    root, path = two_seeds
    with pytest.raises(ConfigError, match="4 of 6 registered runs are finished"):
        build_protocol_report(root, path, tmp_path / "before")
    stop = stop_experiment(path, [11, 10], REASON, root)
    (line,) = stop_lines(root)
    assert (line["run"], line["protocol"], line["seeds"], line["dropped"]) == (
        "*", "claims_test", [10, 11], [12],
    )  # fmt: skip
    assert line["reason"] == REASON and line["time"] == stop.time

    report, files = build_protocol_report(root, path, tmp_path / "out")  # no --interim needed
    convergence = next(row for row in report.primaries if row.name == "convergence")
    assert (convergence.result.n_treatment, convergence.result.n_control) == (2, 2)
    p = _welch_p([0.45, 0.47], [0.30, 0.31])
    assert convergence.result.p == pytest.approx(p, rel=1e-8)
    assert convergence.adjusted_p == pytest.approx(2 * p, rel=1e-8)  # Holm over the two
    assert (report.registered, report.finished, report.unfinished) == (4, 4, [])
    when = stop.time[:16].replace("T", " ")
    assert report.label == (
        f"STOPPED EARLY at seeds 10, 11 of the registered 10, 11, 12 (`tepo protocol stop`, "
        f"{when} UTC)"
    )
    markdown = files[0].read_text()
    assert f"**{report.label}.**" in markdown and f"## Per run ({report.label})" in markdown
    assert "not the registered analysis" not in markdown
    assert (
        f"{when} UTC: the experiment stopped early, keeping seeds [10, 11] and dropping [12] in "
        f"every arm (`tepo protocol stop`): {REASON}"
    ) in markdown
    assert [row.run for row in report.per_run] == [
        "grpo_seed10", "grpo_seed11", "tepo_seed10", "tepo_seed11",
    ]  # fmt: skip

    with pytest.raises(ConfigError, match="already stopped: STOPPED EARLY at seeds 10, 11"):
        stop_experiment(path, [10], REASON, root)
    assert len(stop_lines(root)) == 1


def test_the_runner_trains_no_run_of_a_dropped_seed(two_seeds, capsys):
    root, path = two_seeds
    assert stop_command(path, root, "10,11") == 0
    assert "STOPPED EARLY at seeds 10, 11 of the registered 10, 11, 12" in capsys.readouterr().out
    assert run_main(["run", str(path), "--results-dir", str(root), "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].endswith("; not trained: grpo_seed12, tepo_seed12")
    assert [line.split(":")[0] for line in listed[1:]] == [
        "grpo_seed10", "tepo_seed10", "grpo_seed11", "tepo_seed11",
    ]  # fmt: skip


def test_a_stop_the_command_refuses_exits_2_with_one_paragraph(two_seeds, capsys):
    root, path = two_seeds
    assert stop_command(path, root, "10,12") == 2
    error = capsys.readouterr().err
    assert error.startswith("tepo protocol stop: --seeds 10,12: a stop keeps whole seeds")
    assert error.count("\n") == 1 and stop_lines(root) == []
