"""`tepo report RUNS_DIR --protocol PROTOCOL.yaml` on a small fake sweep whose verdicts are known.

Two arms (grpo, tepo) × seeds 10, 11, 12; 20 steps; held-out evaluations at steps 0, 10, 20.

- eval_auc (mean of steps 10 and 20): tepo (.44,.46) (.46,.48) (.48,.50) → .45 .47 .49;
  grpo (.29,.31) (.30,.32) (.31,.33) → .30 .31 .32. Welch: δ .16, a = .0004/3, b = .0001/3,
  df = (.0005/3)² / ((.0004/3)²/2 + (.0001/3)²/2) = 2.941176, t = .16/√(.0005/3) = 12.394.
- entropy 1.0 over steps 1-15, then L over 16-20: grpo L .9 .85 .8 (change −.1 −.15 −.2,
  relative the same: the gate's seeds 10, 11 average −.125); tepo L .95 .98 1.0.
- train accuracy constant per run: tepo .5 .6 .7, grpo .4 each: paired differences .1 .2 .3,
  mean .2, se .1/√3, t = 2√3 at 2 df: p = 1/2 − t/(2√(2 + t²)).
- steps to .45 (censored at 20): tepo 20, 10, 10; grpo never (20, 20, 20): restricted means
  13.33 and 20; the exact log-rank p is 1/20 (only the observed split of the 20 puts all three
  reaches in one arm).
- per problem (steps 10 and 20, problems p0-p3): tepo passes p0 p1, grpo p0: d = 0 1 0 0, mean .25,
  se .5/2, t = 1 at 3 df.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.cells import cell_len
from rich.console import Console

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.build_protocol import build_protocol_report

SEEDS = (10, 11, 12)
EVALS = {
    "tepo": {10: (0.44, 0.46), 11: (0.46, 0.48), 12: (0.48, 0.50)},
    "grpo": {10: (0.29, 0.31), 11: (0.30, 0.32), 12: (0.31, 0.33)},
}
LAST_ENTROPY = {"tepo": {10: 0.95, 11: 0.98, 12: 1.0}, "grpo": {10: 0.9, 11: 0.85, 12: 0.8}}
TRAIN_ACCURACY = {"tepo": {10: 0.5, 11: 0.6, 12: 0.7}, "grpo": {10: 0.4, 11: 0.4, 12: 0.4}}
PASSES = {"tepo": {"p0", "p1"}, "grpo": {"p0"}}
WINDOWS = {"first": [1, 5], "last": [16, 20]}


def write_run(root: Path, arm: str, seed: int, state: str = "finished", algo: str | None = None):
    run = root / f"{arm}_seed{seed}"
    (run / ".hydra").mkdir(parents=True)
    overrides = ["recipe=word_math", f"algo={algo or arm}", f"seed={seed}"]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"seed": seed, "algo": {"name": algo or arm}, "trainer": {"max_steps": 20}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    with (run / "metrics.jsonl").open("w") as handle:
        for step in range(1, 21):
            entropy = LAST_ENTROPY[arm][seed] if step > 15 else 1.0
            record = {"step": step, "entropy": entropy, "accuracy": TRAIN_ACCURACY[arm][seed]}
            handle.write(json.dumps(record) + "\n")
    at_10, at_20 = EVALS[arm][seed]
    evals = [(0, 0.2), (10, at_10), (20, at_20)]
    (run / "eval.jsonl").write_text(
        "".join(json.dumps({"step": s, "accuracy": a}) + "\n" for s, a in evals)
    )
    samples = [
        {"step": step, "id": problem, "passed": problem in PASSES[arm]}
        for step in (10, 20)
        for problem in ("p0", "p1", "p2", "p3")
    ]
    (run / "eval_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    status = {"state": state, "pid": 1, "hostname": socket.gethostname()}
    (run / "status.json").write_text(json.dumps(status))


def protocol(path: Path, gate_at_most: float = -0.20, entropy_direction: str = "greater") -> Path:
    data = {
        "name": "claims_test",
        "description": "TEPO against GRPO on a fake sweep",
        "base": ["recipe=word_math"],
        "arms": {"grpo": ["algo=grpo"], "tepo": ["algo=tepo"]},
        "seeds": list(SEEDS),
        "alpha": 0.05,
        "correction": "holm",
        "primaries": [
            {"name": "convergence", "metric": "eval_auc", "treatment": "tepo",
             "control": "grpo", "direction": "greater", "test": "welch"},
            {"name": "entropy", "metric": "entropy_change", "params": WINDOWS,
             "treatment": "tepo", "control": "grpo", "direction": entropy_direction,
             "test": "welch",
             "gate": {"arm": "grpo", "seeds": [10, 11], "metric": "entropy_relative_change",
                      "params": WINDOWS, "at_most": gate_at_most}},
        ],
        "secondaries": [
            {"name": "steps_to_045", "metric": "steps_to_level",
             "params": {"level": 0.45, "consecutive": 1, "censor_at": 20}, "treatment": "tepo",
             "control": "grpo", "direction": "less", "test": "logrank"},
            {"name": "train_accuracy", "metric": "train_accuracy_mean", "treatment": "tepo",
             "control": "grpo", "direction": "greater", "test": "paired"},
            {"name": "per_problem", "metric": "per_problem_paired", "treatment": "tepo",
             "control": "grpo", "direction": "greater", "test": "mcnemar"},
        ],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for seed in SEEDS:
        for arm in ("grpo", "tepo"):
            write_run(root, arm, seed)
    return root


def _mp_t_sf(t: float, df: float) -> float:
    mp = pytest.importorskip("mpmath")
    return float(mp.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True) / 2)


def _mp_t_ppf(probability: float, df: float) -> float:
    """t's quantile, mpmath's root of P(T > t) = 1 − probability (probability > 1/2)."""
    mp = pytest.importorskip("mpmath")
    return float(mp.findroot(lambda t: _mp_t_sf(float(t), df) - (1 - probability), 1.0))


def _welch_p(treatment: list[float], control: list[float]) -> float:
    """One-sided (greater) Welch p from the textbook formulas (float64 sums by hand)."""
    n, m = len(treatment), len(control)
    mean_t, mean_c = sum(treatment) / n, sum(control) / m
    a = sum((x - mean_t) ** 2 for x in treatment) / (n - 1) / n
    b = sum((x - mean_c) ** 2 for x in control) / (m - 1) / m
    df = (a + b) ** 2 / (a * a / (n - 1) + b * b / (m - 1))
    return _mp_t_sf((mean_t - mean_c) / math.sqrt(a + b), df)


def by_name(rows):
    return {row.name: row for row in rows}


def test_the_verdicts_of_a_sweep_whose_answers_are_known(sweep, tmp_path):
    report, files = build_protocol_report(sweep, protocol(tmp_path / "p.yaml"), tmp_path / "out")
    rows = by_name(report.primaries)
    convergence, entropy = rows["convergence"], rows["entropy"]
    p_auc = _welch_p([0.45, 0.47, 0.49], [0.30, 0.31, 0.32])
    csv_lines = (tmp_path / "out" / "report_protocol.csv").read_text().splitlines()
    assert {line.rsplit(",", 1)[-1] for line in csv_lines[1:]} == {"registered"}
    assert convergence.result.estimate == pytest.approx(0.16)
    assert convergence.result.p == pytest.approx(p_auc, rel=1e-8)
    # Holm over the two primaries; the untestable one counts as p = 1: 2 · p_auc
    assert convergence.adjusted_p == pytest.approx(2 * p_auc, rel=1e-8)
    assert convergence.verdict == "supported"
    assert (convergence.result.n_treatment, convergence.result.n_control) == (3, 3)
    # the gate: grpo seeds 10, 11 fell 10 % and 15 % (mean −12.5 %), not the 20 % it needs
    assert entropy.verdict == "untestable (gate)" and entropy.adjusted_p is None
    assert "gate failed" in entropy.gate and "-0.125" in entropy.gate
    assert report.missing == [] and report.unfinished == [] and report.excluded == []
    # detectable with 80 % power at α / 2 = .025 (Holm's first step over two primaries), at the
    # runs' se √(.0005/3) and Welch's df 2.941176: (t₀.₉₇₅ + t₀.₈) · se, quantiles from mpmath
    se, df = math.sqrt(0.0005 / 3), 0.0005**2 / (0.0004**2 / 2 + 0.0001**2 / 2)
    smallest = (_mp_t_ppf(0.975, df) + _mp_t_ppf(0.8, df)) * se
    assert convergence.detectable == pytest.approx(smallest, rel=1e-8)
    markdown = files[0].read_text()
    assert f"| {smallest:.3f} |" in markdown and "detectable: the smallest true" in markdown
    assert "| convergence | eval_auc: tepo − grpo (greater) | welch | +0.160 |" in markdown
    assert "| 3 / 3 |" in markdown and "| untestable (gate) |" in markdown
    assert markdown.index("## Primary claims") < markdown.index("## Exploratory")


def test_a_protocol_whose_seeds_trained_on_two_machines_says_so_under_its_verdicts(sweep, tmp_path):
    for arm in ("grpo", "tepo"):
        for seed in SEEDS:
            cpu = "AMD EPYC" if seed == SEEDS[-1] else "Intel Xeon"
            summary = {"machines": [{"cpu": cpu, "accelerator": None, "from_step": 0}]}
            (sweep / f"{arm}_seed{seed}" / "summary.json").write_text(json.dumps(summary))
    report, files = build_protocol_report(sweep, protocol(tmp_path / "p.yaml"), tmp_path / "out")
    assert report.machines == (
        "The runs started on 2 machines: Intel Xeon (4 runs), AMD EPYC (2 runs). Compare "
        "seconds, tokens/s and MFU only between runs on one machine."
    )
    markdown = files[0].read_text()
    assert f"- {report.machines}" in markdown
    # and each run's machine in the per-run table and CSV
    assert "| run | machine | convergence (eval_auc) |" in markdown
    assert "| tepo_seed12 | AMD EPYC | 0.490 |" in markdown
    assert "| grpo_seed10 | Intel Xeon | 0.300 |" in markdown
    with (tmp_path / "out" / "report_protocol_runs.csv").open(newline="") as handle:
        machines = {row["run"]: row["machine"] for row in csv.DictReader(handle)}
    assert machines["tepo_seed12"] == "AMD EPYC" and machines["grpo_seed11"] == "Intel Xeon"


def test_a_run_that_moved_machine_says_where_and_one_that_recorded_none_says_so(sweep, tmp_path):
    moved = {"machines": [{"cpu": "Intel Xeon", "accelerator": None, "from_step": 0},
                          {"cpu": "AMD EPYC", "accelerator": None, "from_step": 95}]}  # fmt: skip
    (sweep / "grpo_seed10" / "summary.json").write_text(json.dumps(moved))
    report, files = build_protocol_report(sweep, protocol(tmp_path / "p.yaml"), tmp_path / "out")
    rows = {row.run: row.machine for row in report.per_run}
    assert rows["grpo_seed10"] == "Intel Xeon → AMD EPYC from step 95"
    assert rows["grpo_seed11"] is None
    markdown = files[0].read_text()
    assert "| grpo_seed10 | Intel Xeon → AMD EPYC from step 95 |" in markdown
    assert "| grpo_seed11 | not recorded |" in markdown


def test_runs_on_one_machine_or_none_recorded_have_no_machine_column(sweep, tmp_path):
    _, files = build_protocol_report(sweep, protocol(tmp_path / "p.yaml"), tmp_path / "out")
    assert "| run | convergence (eval_auc) |" in files[0].read_text()


def test_the_exploratory_secondaries(sweep, tmp_path):
    report, _ = build_protocol_report(sweep, protocol(tmp_path / "p.yaml"), tmp_path / "out")
    rows = by_name(report.secondaries)
    steps = rows["steps_to_045"].result
    assert steps.estimate == pytest.approx(40 / 3 - 20)
    assert steps.p == pytest.approx(1 / 20)
    train = rows["train_accuracy"].result
    t = 0.2 / (0.1 / math.sqrt(3))
    assert train.estimate == pytest.approx(0.2)
    assert train.p == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), rel=1e-9)
    problems = rows["per_problem"].result
    assert problems.estimate == pytest.approx(0.25)
    assert problems.p == pytest.approx(_mp_t_sf(1.0, 3), rel=1e-9)
    assert all(row.verdict == "" and row.adjusted_p is None for row in report.secondaries)


def test_each_run_s_values_are_the_numbers_the_tests_compared(sweep, tmp_path):
    report, files = build_protocol_report(sweep, protocol(tmp_path / "p.yaml"), tmp_path / "out")
    assert report.columns == [
        "convergence (eval_auc)", "entropy (entropy_change)",
        "entropy gate (entropy_relative_change)", "steps_to_045 (steps_to_level)",
        "train_accuracy (train_accuracy_mean)",
    ]  # fmt: skip
    rows = {row.run: row for row in report.per_run}
    assert [row.run for row in report.per_run][:2] == ["grpo_seed10", "grpo_seed11"]
    auc, change, relative, steps, train = rows["grpo_seed12"].values
    assert (auc, change, relative, train) == pytest.approx((0.32, -0.2, -0.2, 0.4))
    assert (steps.step, steps.event) == (20, False)
    auc, change, relative, steps, train = rows["tepo_seed11"].values
    assert (auc, change, relative, train) == pytest.approx((0.47, -0.02, -0.02, 0.6))
    assert (steps.step, steps.event) == (10, True)
    markdown = files[0].read_text()
    assert "| tepo_seed11 | 0.470 | -0.020 | -0.020 | 10 | 0.600 |" in markdown
    assert "| grpo_seed12 | 0.320 | -0.200 | -0.200 | not by 20 | 0.400 |" in markdown
    assert markdown.index("## Exploratory") < markdown.index("## Per run")
    # held-out accuracy by step per arm: tepo at step 10 is .44 .46 .48, mean ± t(.975, 2) · .02/√3
    half = 4.302652729911275 * 0.02 / math.sqrt(3)
    assert f"| tepo | 0.200 ± 0.000 | 0.460 ± {half:.3f} | 0.480 ± {half:.3f} |" in markdown
    assert "![plot_eval_accuracy](plot_eval_accuracy.png)" in markdown
    assert {"plot_eval_accuracy.png", "plot_entropy.png"} <= {path.name for path in files}
    lines = (tmp_path / "out" / "report_protocol_runs.csv").read_text().splitlines()
    assert lines[0] == (
        "run,arm,seed,convergence (eval_auc),entropy (entropy_change),"
        "entropy gate (entropy_relative_change),steps_to_045 (steps_to_level),"
        "steps_to_045 (steps_to_level) reached,train_accuracy (train_accuracy_mean),machine"
    )
    tepo_10 = next(line for line in lines if line.startswith("tepo_seed10,"))
    assert tepo_10.split(",")[1:3] == ["tepo", "10"] and tepo_10.split(",")[6:8] == ["20", "True"]


def test_a_passed_gate_and_a_claim_the_data_contradict(sweep, tmp_path):
    # gate at −10 %: −12.5 % passes; entropy declared "less" but tepo's change is higher
    path = protocol(tmp_path / "p.yaml", gate_at_most=-0.10, entropy_direction="less")
    report, _ = build_protocol_report(sweep, path, tmp_path / "out")
    rows = by_name(report.primaries)
    p_auc = _welch_p([0.45, 0.47, 0.49], [0.30, 0.31, 0.32])
    p_entropy = 1 - _welch_p([-0.05, -0.02, 0.0], [-0.1, -0.15, -0.2])
    assert rows["entropy"].result.estimate == pytest.approx(-7 / 300 + 0.15)
    assert rows["entropy"].result.p == pytest.approx(p_entropy, rel=1e-8)
    # Holm: sorted p_auc · 2, then max(2 p_auc, p_entropy · 1)
    assert rows["entropy"].adjusted_p == pytest.approx(p_entropy, rel=1e-8)
    assert rows["entropy"].verdict == "not supported"
    assert "gate passed" in rows["entropy"].gate
    assert rows["convergence"].adjusted_p == pytest.approx(2 * p_auc, rel=1e-8)


def test_a_partial_sweep_reports_n_as_it_is_and_names_what_is_missing(tmp_path):
    root = tmp_path / "runs"
    for seed in (10, 11):
        write_run(root, "grpo", seed)
        write_run(root, "tepo", seed)
    write_run(root, "grpo", 12, state="failed")
    write_run(root, "tepo", 12, algo="grpo")  # named tepo, ran grpo: not a tepo run
    path = protocol(tmp_path / "p.yaml")
    report, files = build_protocol_report(root, path, tmp_path / "out", interim=True)
    rows = by_name(report.primaries)
    assert (rows["convergence"].result.n_treatment, rows["convergence"].result.n_control) == (2, 2)
    assert rows["convergence"].result.p == pytest.approx(
        _welch_p([0.45, 0.47], [0.30, 0.31]), rel=1e-8
    )
    assert report.missing == ["tepo_seed12"]
    assert report.unfinished == ["grpo_seed12 (failed)"]
    assert report.excluded == ["tepo_seed12 (its overrides lack algo=tepo)"]
    markdown = files[0].read_text()
    assert "missing (not found): tepo_seed12" in markdown
    assert "not finished (left out): grpo_seed12 (failed)" in markdown
    assert report.label == "INTERIM, 4 of 6 registered runs: not the registered analysis"
    assert f"**{report.label}.**" in markdown


def test_before_every_registered_run_is_in_nothing_is_written_or_shown(tmp_path, capsys):
    """A look at the outcomes before the end is refused unless asked for (--interim), and then
    every table says so: the registered analysis is the one over every registered run."""
    from tepo_cli.eval.report import command

    root, out = tmp_path / "runs", tmp_path / "out"
    for seed in (10, 11):
        write_run(root, "grpo", seed)
        write_run(root, "tepo", seed)
    write_run(root, "grpo", 12, state="interrupted")
    path = protocol(tmp_path / "p.yaml")
    with pytest.raises(ConfigError) as refused:
        build_protocol_report(root, path, out)
    assert str(refused.value).startswith(
        "protocol 'claims_test': 4 of 6 registered runs are finished (not found: tepo_seed12; "
        "not finished: grpo_seed12 (interrupted)). The registered analysis reads the outcomes once"
    )
    assert "--interim" in str(refused.value) and not out.exists()
    assert command.main([str(root), "--protocol", str(path), "--out", str(out)]) == 2
    shown = capsys.readouterr()
    assert "0.45" not in shown.out + shown.err and not out.exists()
    assert command.main([str(root), "--interim", "--out", str(out)]) == 2  # needs --protocol
    assert "needs --protocol" in capsys.readouterr().err
    assert command.main([str(root), "--protocol", str(path), "--out", str(out), "--interim"]) == 0
    assert "INTERIM, 4 of 6 registered runs" in capsys.readouterr().out


def test_a_subset_of_seeds_is_compared_alone_and_labelled_and_gates_read_their_own_seeds(
    sweep, tmp_path, capsys
):
    """--seeds 11,12: the arms compared over those seeds only (a deviation's subset, e.g. the
    seeds whose runs share a machine), every table labelled; the entropy gate still reads grpo's
    registered seeds 10, 11 (mean −0.125, failing ≤ −0.15), not the subset's 11, 12 (−0.175)."""
    from tepo_cli.eval.report import command

    path, out = protocol(tmp_path / "p.yaml", gate_at_most=-0.15), tmp_path / "out"
    report, files = build_protocol_report(sweep, path, out, seeds=[12, 11])
    rows = by_name(report.primaries)
    convergence, entropy = rows["convergence"], rows["entropy"]
    p_auc = _welch_p([0.47, 0.49], [0.31, 0.32])
    assert (convergence.result.n_treatment, convergence.result.n_control) == (2, 2)
    assert convergence.result.estimate == pytest.approx(0.165)
    assert convergence.result.p == pytest.approx(p_auc, rel=1e-8)
    assert convergence.adjusted_p == pytest.approx(2 * p_auc, rel=1e-8)  # Holm over both
    assert (
        entropy.verdict == "untestable (gate)" and "seed 10 -0.100, seed 11 -0.150" in entropy.gate
    )
    assert [row.run for row in report.per_run] == [
        "grpo_seed11", "grpo_seed12", "tepo_seed11", "tepo_seed12"
    ]  # fmt: skip
    label = "SUBSET, seeds 11, 12 of the registered: not the registered analysis"
    assert report.label == label
    markdown = files[0].read_text()
    assert f"**{label}.**" in markdown and f"## Per run ({label})" in markdown
    with (out / "report_protocol.csv").open(newline="") as handle:
        assert {row["look"] for row in csv.DictReader(handle)} == {label}
    # the same through the command; and refused, with nothing written, for a seed the protocol
    # does not register, a single seed, a word, or without --protocol
    assert command.main([str(sweep), "--protocol", str(path), "--out", str(out), "--seeds",
                         "11,12"]) == 0  # fmt: skip
    assert label in capsys.readouterr().out
    for seeds, said in [("11,13", "13 is not one of them"), ("11", "at least two"),
                        ("x", "integers separated by commas")]:  # fmt: skip
        other = tmp_path / f"out_{seeds}"
        args = [str(sweep), "--protocol", str(path), "--out", str(other), "--seeds", seeds]
        assert command.main(args) == 2 and not other.exists()
        assert said in capsys.readouterr().err
    assert command.main([str(sweep), "--seeds", "11,12", "--out", str(tmp_path / "o")]) == 2
    assert "needs --protocol" in capsys.readouterr().err


def test_a_subset_waits_for_every_registered_run_as_the_registered_analysis_does(tmp_path):
    root = tmp_path / "runs"
    for seed in SEEDS:
        write_run(root, "grpo", seed)
    for seed in (10, 11):
        write_run(root, "tepo", seed)  # tepo_seed12 not yet in: seeds 10, 11 are complete
    with pytest.raises(ConfigError, match="5 of 6 registered runs are finished"):
        build_protocol_report(root, protocol(tmp_path / "p.yaml"), tmp_path / "out", seeds=[10, 11])
    assert not (tmp_path / "out").exists()
    report, _ = build_protocol_report(
        root, protocol(tmp_path / "p.yaml"), tmp_path / "out", interim=True, seeds=[10, 11]
    )
    assert report.label == (
        "INTERIM, 5 of 6 registered runs; SUBSET, seeds 10, 11 of the registered: not the "
        "registered analysis"
    )


def test_fewer_than_two_runs_an_arm_is_untestable(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "grpo", 10)
    write_run(root, "tepo", 10)
    path = protocol(tmp_path / "p.yaml")
    report, _ = build_protocol_report(root, path, tmp_path / "out", interim=True)
    convergence = by_name(report.primaries)["convergence"]
    assert convergence.verdict == "untestable (n < 2)"
    assert convergence.result.estimate == pytest.approx(0.15)  # .45 − .30, shown, not tested


def test_the_command_prints_the_verdicts(sweep, tmp_path):
    """As the sweeps guide writes it: the runs default to runs/ beside the protocol file, where
    `tepo protocol run` publishes them."""
    path = protocol(tmp_path / "p.yaml")
    assert sweep == tmp_path / "runs"
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "report", "--protocol", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "primary claims" in result.stdout and "Exploratory" in result.stdout
    assert "supported" in result.stdout and "untestable (gate)" in result.stdout
    assert "Per run" in result.stdout and "not by 20" in result.stdout  # grpo's censored times
    assert (sweep / "report_protocol.md").is_file() and (sweep / "report_protocol.csv").is_file()


@pytest.mark.parametrize("width", [120, 100])
def test_on_a_narrow_terminal_the_tables_fit_and_no_word_is_folded(sweep, tmp_path, width):
    """The verdict and exploratory tables at the width of the terminal: each line within it,
    every metric's name, test and verdict word whole in the rows, the parts of a table too wide
    each naming their claims, and the text columns wider than their widest word where they fit."""
    console = Console(width=width, file=io.StringIO(), color_system=None)
    build_protocol_report(sweep, protocol(tmp_path / "p.yaml"), tmp_path / "out", console)
    text = console.file.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= width
    rows = " ".join(line for line in text.splitlines() if line.startswith("│"))
    words = [
        "convergence", "eval_auc:", "entropy_change:", "steps_to_level:", "train_accuracy_mean:",
        "per_problem_paired:", "(greater)", "supported", "(gate)", "logrank",
    ]  # fmt: skip
    for word in words:
        assert f" {word} " in rows, word
    assert "not shown: test: welch; n per arm: 3 / 3." in " ".join(text.split())  # both primaries'
    names = ("convergence", "entropy", "steps_to_045", "train_accuracy", "per_problem")
    for part in re.split(r"\n(?=\S.*\(\d/\d\)\n)", text):  # a split table's parts
        if "┏" in part:
            table = [line for line in part.splitlines() if line.startswith("│")]
            assert any(name in line for line in table for name in names)


def test_a_metric_the_report_does_not_compute_is_refused_before_anything_is_written(
    sweep, tmp_path
):
    path = protocol(tmp_path / "p.yaml")
    data = yaml.safe_load(path.read_text())
    data["primaries"][0]["metric"] = "eval_aucc"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="metric 'eval_aucc' is not a metric the report"):
        build_protocol_report(sweep, path, out)
    assert not out.exists()
    data["primaries"][0].update(metric="steps_to_level", test="welch", params={"level": 0.3})
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="test 'welch' does not apply to steps_to_level"):
        build_protocol_report(sweep, path, out)
    data["primaries"][0].update(metric="step_mean", test="welch", params={"window": [1, 5]})
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"step_mean needs params.key \(the metrics.jsonl key"):
        build_protocol_report(sweep, path, out)
    data["primaries"][0].update(metric="eval_auc", test="welch", params={})
    data["primaries"][1]["gate"]["params"] = {"first": 5, "last": [16, 20]}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"gate.params.first=5 is not allowed: it is an incl"):
        build_protocol_report(sweep, path, out)
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "report", str(sweep), "--protocol", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Nothing was written" in result.stderr
    assert not (sweep / "report_protocol.md").exists()
