"""`tepo protocol power PROTOCOL.yaml --from DIR`: a protocol's detectable differences before its
runs, at the spread of runs made earlier — numbers worked by hand on test_report_protocol's fake
sweep (two arms × seeds 10, 11, 12), t quantiles from mpmath.

- eval_auc: tepo .45 .47 .49 (variance .0004), grpo .30 .31 .32 (.0001): pooled over the two
  groups √((2·.0004 + 2·.0001) / 4) = √.00025; at 3 runs an arm se = √.00025 · √(2/3), df 4,
  level .05 / 2 primaries (Holm's first step, one-sided).
- train_accuracy_mean (paired): tepo .5 .6 .7, grpo .4 .4 .4 at seeds 10, 11, 12: seed
  differences .1 .2 .3, their SD .1; se = .1 / √3, df 2 (seed pairs − 1), level .05 (a
  secondary, uncorrected).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from test_report_protocol import SEEDS, _mp_t_ppf, protocol, write_run

from tepo_cli.cli import main as tepo
from tepo_cli.eval.report.design_power import (
    Spread,
    columns,
    design_power,
    design_se,
    paired_sd,
    pooled_sd,
    prior_runs,
    seeds_for,
)
from tepo_cli.eval.report.inference import detectable_at, power_at
from tepo_cli.eval.report.render import markdown_table
from tepo_cli.eval.report.stats import seeds_for_power
from tepo_cli.protocol.spec import load_protocol


@pytest.fixture()
def prior(tmp_path):
    root = tmp_path / "prior"
    for seed in SEEDS:
        for arm in ("grpo", "tepo"):
            write_run(root, arm, seed)
    write_run(root / "older", "tepo", 10, state="failed")  # not finished: no part of the spread
    return root


def _power(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        tepo(["protocol", "power", *args])
    shown = capsys.readouterr()
    return stop.value.code, shown.out, shown.err


def test_the_pooled_spread_is_within_groups_and_skips_a_group_of_one():
    spread = pooled_sd([[1.0, 2.0, 3.0], [10.0, 12.0], [50.0]])
    assert spread.sd == pytest.approx(math.sqrt((2.0 + 2.0) / 3))  # squares 2 and 2, df 2 + 1
    assert (spread.runs, spread.groups) == (6, 2)
    assert pooled_sd([[1.0], [2.0]]).sd is None


def test_the_paired_spread_is_of_the_differences_at_the_seeds_two_groups_share():
    """differences −.5 −.4 −.7 (seed 4 only in the second group): around their mean −.5333,
    squares .0011 + .0178 + .0278 = .046667 over 2 df."""
    first, second = {1: 1.0, 2: 2.0, 3: 3.0}, {1: 1.5, 2: 2.4, 3: 3.7, 4: 9.0}
    spread = paired_sd([first, second, {5: 0.0}])
    assert spread.sd == pytest.approx(math.sqrt(0.046667 / 2), rel=1e-4)
    assert (spread.groups, spread.runs, spread.of) == (1, 8, "seed differences")
    assert paired_sd([first, {4: 1.0, 5: 2.0}]).sd is None  # no seed shared
    se, df = design_se("paired", spread, 5)
    assert (se, df) == (pytest.approx(spread.sd / math.sqrt(5)), 4)


def test_at_the_detectable_difference_the_power_is_eighty_percent_and_so_are_the_seeds():
    se, df = design_se("welch", Spread(1.0, 10, 2), 5)
    assert (se, df) == (pytest.approx(math.sqrt(0.4)), 8)
    assert design_se("paired", Spread(1.0, 10, 2), 5) == (pytest.approx(math.sqrt(0.4)), 4)  # ρ 0
    smallest = detectable_at(se, df, 0.025, "greater")
    unit = Spread(1.0, 10, 2)
    assert smallest == pytest.approx((_mp_t_ppf(0.975, 8) + _mp_t_ppf(0.8, 8)) * se, rel=1e-6)
    assert power_at(smallest, se, df, 0.025, "less") == pytest.approx(0.8, abs=1e-9)
    assert power_at(2 * smallest, se, df, 0.025, "greater") > 0.99
    assert power_at(0.0, se, df, 0.025, "greater") == pytest.approx(0.025, abs=1e-9)  # α
    assert seeds_for(smallest * 1.001, unit, "welch", 0.025, "greater") == 5
    assert seeds_for(smallest * 0.999, unit, "welch", 0.025, "greater") == 6
    assert seeds_for(1e-4, unit, "welch", 0.025, "greater") is None  # beyond 1,000 runs an arm


@pytest.mark.parametrize("delta", [0.3, 0.5, 1.0, 1.7])
def test_the_seeds_agree_with_the_tables_two_sided_sample_size(delta):
    """stats.seeds_for_power (tabled quantiles, n ≥ 2 (t₀.₉₇₅ + t₀.₈)² s² / δ²) against the
    search over power_at (computed quantiles) for the same two-sided 5 % two-sample test."""
    unit = Spread(1.0, 10, 2)
    assert seeds_for(delta, unit, "welch", 0.05, "two-sided") == seeds_for_power(delta, 1.0)


def test_each_claim_of_a_protocol_at_the_spread_of_a_prior_sweep(prior, tmp_path):
    spec = load_protocol(protocol(tmp_path / "p.yaml"))
    rows = {row.name: row for row in design_power(spec, prior_runs([prior]), {})}
    auc = rows["convergence"]
    assert (auc.kind, auc.n, auc.alpha) == ("primary", 3, pytest.approx(0.025))
    assert auc.spread.sd == pytest.approx(math.sqrt(0.00025))
    assert (auc.spread.runs, auc.spread.groups) == (6, 2)
    se = math.sqrt(0.00025) * math.sqrt(2 / 3)
    assert auc.detectable == pytest.approx((_mp_t_ppf(0.975, 4) + _mp_t_ppf(0.8, 4)) * se, 1e-6)
    accuracy = rows["train_accuracy"]
    assert (accuracy.kind, accuracy.alpha, accuracy.test) == ("secondary", 0.05, "paired")
    assert accuracy.spread.of == "seed differences" and accuracy.spread.sd == pytest.approx(0.1)
    se = 0.1 / math.sqrt(3)
    expected = (_mp_t_ppf(0.95, 2) + _mp_t_ppf(0.8, 2)) * se
    assert accuracy.detectable == pytest.approx(expected, rel=1e-6)
    for name in ("steps_to_045", "per_problem"):  # log-rank, McNemar: no run-level spread
        assert rows[name].spread is None and rows[name].detectable is None


def test_the_command_prints_each_claim_and_the_power_at_a_named_effect(prior, tmp_path, capsys):
    path = protocol(tmp_path / "p.yaml")
    code, out, err = _power(
        [str(path), "--from", str(prior), "--effect", "convergence=0.05", "--markdown"], capsys
    )
    assert (code, err) == (0, "")
    se = math.sqrt(0.00025) * math.sqrt(2 / 3)
    smallest = (_mp_t_ppf(0.975, 4) + _mp_t_ppf(0.8, 4)) * se
    row = next(line for line in out.splitlines() if line.startswith("| convergence |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[4:] == ["3", "0.025", "0.016 (6 runs, 2 groups)", f"{smallest:.3f}", "+0.050",
                         f"{power_at(0.05, se, 4, 0.025, 'greater'):.2f}", "3"]  # fmt: skip
    assert "| per_problem |" in out and "not computed (mcnemar)" in out
    assert "what 3 runs per arm can detect" in out and "detectable at 80 %: the smallest" in out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--effect", "convergence=-0.05"], "registered as 'greater'"),
        (["--effect", "speed=0.05"], "a claim of the protocol (convergence, entropy,"),
        (["--effect", "convergence=fast"], "give CLAIM=VALUE"),
    ],
)
def test_a_bad_effect_is_refused_in_one_paragraph(prior, tmp_path, capsys, args, said):
    path = protocol(tmp_path / "p.yaml")
    code, out, err = _power([str(path), "--from", str(prior), *args], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("tepo protocol power: --effect") and said in err
    assert err.strip().endswith("Nothing was computed.") and err.count("\n") == 1


def test_prior_runs_that_are_missing_or_unfinished_are_refused(prior, tmp_path, capsys):
    path = protocol(tmp_path / "p.yaml")
    code, out, err = _power([str(path), "--from", str(tmp_path / "nowhere")], capsys)
    assert (code, out) == (2, "") and "not a directory" in err
    unfinished = tmp_path / "unfinished"
    write_run(unfinished, "grpo", 10, state="crashed")
    code, out, err = _power([str(path), "--from", str(unfinished)], capsys)
    assert (code, out) == (2, "") and "no finished run there" in err


def test_the_protocol_help_lists_power(capsys):
    with pytest.raises(SystemExit):
        tepo(["protocol", "--help"])
    assert "power" in capsys.readouterr().out


def test_the_guides_example_is_what_the_command_says_at_the_published_runs():
    """docs/guides/protocols.md's table: claims100_beta0 at claims100's published runs' spread."""
    root = Path(__file__).parents[1]
    guide = (root / "docs" / "guides" / "protocols.md").read_text()
    spec = load_protocol(root / "docs" / "results" / "claims100_beta0" / "protocol.yaml")
    runs = prior_runs([root / "docs" / "results" / "claims100" / "runs"])
    effects = {"kl_free_grpo_loses_entropy": -0.14}
    rows = design_power(spec, runs, effects)
    shown = [column for column in columns(True) if column[0] != "runs per arm"]
    lines = markdown_table(shown, rows).splitlines()
    quoted = [line for line in lines[2:] if line in guide]
    assert len(quoted) == 3, "\n".join(lines)  # the two primaries and the first secondary


@pytest.mark.parametrize("command", ["power", "report", "status"])
def test_the_protocol_commands_load_neither_torch_nor_transformers(tmp_path, command):
    """Reading runs and protocols needs no model: `tepo protocol power`, `tepo report --protocol`
    and `tepo protocol run --status` answer in well under a second without torch (about 2.5 s
    of imports otherwise, core/machine.py)."""
    runs = tmp_path / "runs"
    for seed in SEEDS:
        for arm in ("grpo", "tepo"):
            write_run(runs, arm, seed)
    path = protocol(tmp_path / "p.yaml")
    args = {
        "power": ["protocol", "power", str(path), "--from", str(runs)],
        "report": ["report", str(runs), "--protocol", str(path), "--out", str(tmp_path / "out")],
        "status": ["protocol", "run", str(path), "--status", "--results-dir", str(runs)],
    }[command]
    line = [sys.executable, "-X", "importtime", "-m", "tepo_cli", *args]
    result = subprocess.run(line, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines}
    assert "tepo_cli.protocol.spec" in imported  # the record is the command's own
    assert not imported & {"torch", "transformers", "deepspeed"}
