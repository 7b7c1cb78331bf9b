"""`tepo report`'s learning dynamics on hand-written runs, every number computed by hand here.

Each run: 4 steps of 1 s, held-out evaluations at steps 0 (before), 2 and 4; last = 2.

grpo seed 0: held-out .2 .4 .6; entropy 1.0 .8 .6 .4 (first 2: .9, last 2: .5)
grpo seed 1: held-out .2 .6 .4; entropy 1.0 1.0 .8 .8 (first 1.0, last .8)
tepo seed 0: held-out .2 .5 .7; kl_mask_frac .1 .2 .3 .4 (mean .25)
tepo seed 1: held-out .3 .3 .3; kl_mask_frac .3 each (mean .3)

grpo curve: step 0 .2 ± 0; step 2 .5 ± 12.7062·.141421/√2 = 1.27062; step 4 the same mean, so the
best grpo mean is .5, at step 2 (the earliest of a tie). Levels: 50 % → .25, 90 % → .45.
grpo: ≥ .25 at step 2 in both seeds (2 ± 0, 2 s); ≥ .45 at 4 and 2 → 3 ± 12.7062·1.41421/√2 = 12.7062.
tepo: ≥ .25 at 2 and 0 (before training: 1 ± 12.7062, seconds 1 ± 12.7062); ≥ .45 at 2 in seed 0
only (1/2). grpo entropy last: (.5 + .8)/2 = .65 ± 12.7062·.212132/√2 = 1.90593; tepo's KL-mask
share .275 ± 12.7062·.0353553/√2 = .317655.
AUC (mean of steps 2 and 4): grpo .5, .5 (.5 ± 0); tepo .6, .3 (.45 ± 12.7062·.212132/√2 = 1.906).
Steps to a level, censored (a run that never reaches it counts at its last evaluation, 4):
grpo .25: 2, 2; .45: 4, 2 (3 ± 12.7); tepo .25: 2, 0 (1 ± 12.7); .45: 2, never → 4 (3 ± 12.7).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tepo_cli.eval.report import Options, build_report

OPTIONS = Options(last=2, reference="algo=grpo", fractions=(0.5, 0.9))


def write_run(root: Path, algo: str, seed: int, held_out: list[float], **series: list[float]):
    run = root / f"{algo}-{seed}"
    (run / ".hydra").mkdir(parents=True)
    overrides = [f"algo={algo}", f"seed={seed}"]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"seed": seed, "algo": {"name": algo}, "trainer": {"max_steps": 4}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    with (run / "metrics.jsonl").open("w") as handle:
        for step in range(1, 5):
            record = {"step": step, "step_seconds": 1.0, "reward_mean": 0.5, "accuracy": 0.5}
            if algo == "grpo":  # the tepo runs stand for runs logged before step_cpu_seconds
                record["step_cpu_seconds"] = 0.5
            record.update({key: values[step - 1] for key, values in series.items()})
            handle.write(json.dumps(record) + "\n")
    evals = zip((0, 2, 4), ("before", "every", "after"), held_out, strict=True)
    (run / "eval.jsonl").write_text(
        "".join(json.dumps({"step": s, "when": w, "accuracy": a}) + "\n" for s, w, a in evals)
    )
    status = {"state": "finished", "pid": 1, "hostname": socket.gethostname()}
    (run / "status.json").write_text(json.dumps(status))


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    write_run(root, "grpo", 0, [0.2, 0.4, 0.6], entropy=[1.0, 0.8, 0.6, 0.4])
    write_run(root, "grpo", 1, [0.2, 0.6, 0.4], entropy=[1.0, 1.0, 0.8, 0.8])
    write_run(root, "tepo", 0, [0.2, 0.5, 0.7], kl_mask_frac=[0.1, 0.2, 0.3, 0.4])
    write_run(root, "tepo", 1, [0.3, 0.3, 0.3], kl_mask_frac=[0.3, 0.3, 0.3, 0.3])
    return root


def test_levels_are_fractions_of_the_reference_groups_best_held_out_mean(sweep, tmp_path):
    report = build_report(sweep, tmp_path / "out", OPTIONS, plots=False)
    assert report.reference is not None
    assert (report.reference.label, report.reference.step) == ("algo=grpo", 2)
    assert report.reference.best == pytest.approx(0.5)
    grpo, tepo = report.dynamics
    assert sorted(grpo.curve) == [0, 2, 4]
    assert grpo.curve[0].mean == pytest.approx(0.2) and grpo.curve[0].half_width == 0
    assert grpo.curve[2].mean == pytest.approx(0.5)
    assert grpo.curve[2].half_width == pytest.approx(1.27062, abs=1e-5)
    half, ninety = grpo.reaches
    assert (half.reached, half.steps.mean, half.steps.half_width) == (2, 2.0, 0.0)
    assert half.seconds.mean == pytest.approx(2.0)
    assert half.cpu_seconds.mean == pytest.approx(1.0)
    assert ninety.steps.mean == pytest.approx(3.0)
    assert ninety.steps.half_width == pytest.approx(12.7062, abs=1e-4)
    half, ninety = tepo.reaches
    assert half.reached == 2 and half.steps.mean == pytest.approx(1.0)  # seed 1 at step 0
    assert half.seconds.mean == pytest.approx(1.0)
    assert half.cpu_seconds is None  # not logged: not guessed
    assert (ninety.reached, ninety.finished, ninety.steps.mean) == (1, 2, 2.0)
    assert ninety.steps.half_width is None  # one run: no spread to judge
    assert grpo.entropy_first.mean == pytest.approx(0.95)
    assert grpo.entropy_last.mean == pytest.approx(0.65)
    assert grpo.entropy_last.half_width == pytest.approx(1.90593, abs=1e-5)
    assert grpo.mask_frac is None and tepo.entropy_last is None
    assert tepo.mask_frac.mean == pytest.approx(0.275)
    assert tepo.mask_frac.half_width == pytest.approx(0.317655, abs=1e-6)
    assert tepo.best.mean == pytest.approx(0.5)  # best of .7 and .3


def test_the_report_prints_and_writes_the_dynamics(sweep, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "report", str(sweep), "--no-plots", "--last", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Learning dynamics" in result.stdout and "Held-out accuracy by step" in result.stdout
    markdown = (sweep / "report.md").read_text()
    header = "| steps to 50% (0.250) | seconds to it | CPU s to it | steps to it, censored (n) |"
    header += " steps to 90% (0.450) |"
    assert header in markdown
    tepo = "| algo=tepo | 0.500 ± 2.541 | 0.450 ± 1.906 (2) | 1.0 ± 12.7 | 1 ± 13 | — |"
    tepo += " 1.0 ± 12.7 (2) | 2.0 (1/2) | 2 (1/2) | — (1/2) | 3.0 ± 12.7 (2) |"
    assert tepo in markdown
    grpo = "| algo=grpo | 0.600 ± 0.000 | 0.500 ± 0.000 (2) | 2.0 ± 0.0 | 2 ± 0 | 1 ± 0 |"
    assert grpo + " 2.0 ± 0.0 (2) | 3.0 ± 12.7 |" in markdown
    assert "| algo=grpo | 0.200 ± 0.000 | 0.500 ± 1.271 | 0.500 ± 1.271 |" in markdown
    curve = (sweep / "report_eval_curve.csv").read_text().splitlines()
    assert curve[0] == "group,step,held_out_mean,held_out_ci95,n"
    assert curve[1].startswith("algo=grpo,0,0.2")


def test_no_reference_group_is_said_not_guessed(sweep, tmp_path):
    options = Options(last=2, reference="algo=dapo")
    report = build_report(sweep, tmp_path / "out", options, plots=False)
    assert report.reference is None
    said = "--reference 'algo=dapo' names no single group with a held-out evaluation"
    assert said in (tmp_path / "out" / "report.md").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "report", str(sweep), "--fractions", "0.5,2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "--fractions '0.5,2' must be numbers in (0, 1]" in (
        result.stderr
    )


def test_levels_of_the_gain_start_from_the_references_mean_before_training(sweep, tmp_path):
    """grpo starts at 0.2 and peaks at a mean of 0.5 (step 2): 50 % of the gain is 0.35, 90 %
    0.47 — where 50 % of the best (0.25) would sit barely above the start."""
    options = Options(last=2, reference="algo=grpo", fractions=(0.5, 0.9), gain=True)
    report = build_report(sweep, tmp_path / "out", options, plots=False)
    assert report.reference.start == pytest.approx(0.2) and report.reference.gain
    assert report.reference.level(0.5) == pytest.approx(0.35)
    grpo, tepo = report.dynamics
    half, ninety = grpo.reaches
    assert (half.reached, half.steps.mean) == (2, 2.0)  # both runs at step 2 (0.4 and 0.6)
    assert (ninety.reached, ninety.steps.mean) == (2, 3.0)  # .47: seed 0 at 4 (.6), seed 1 at 2
    half, _ = tepo.reaches
    assert (half.reached, half.finished, half.steps.mean) == (1, 2, 2.0)  # seed 1 stays at .3
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| steps to 50% (0.350) |" in markdown
    assert "its start 0.200 plus a fraction of the gain" in markdown


def test_the_command_takes_the_levels_and_refuses_others(sweep):
    ran = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "report", str(sweep), "--no-plots", "--levels", "gain"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "steps to 50% (0.350)" in (sweep / "report.md").read_text()
    refused = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "report", str(sweep), "--levels", "half"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--levels" in refused.stderr


def test_a_reference_matching_several_groups_is_refused_before_anything_is_written(sweep, tmp_path):
    """With a second GRPO group (4 updates per rollout), "algo=grpo" names two groups: a report
    against the first one found would read as one against GRPO. Refused, naming both."""
    write_run(sweep, "grpo", 2, [0.2, 0.3, 0.3])
    run = sweep / "grpo-2"
    overrides = ["algo=grpo", "seed=2", "trainer.minibatches=4"]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["trainer"]["minibatches"] = 4
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "tepo_cli", "report", str(sweep)),
            *("--reference", "algo=grpo", "--out", str(out), "--no-plots"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "--reference 'algo=grpo' matches 2 groups" in result.stderr
    assert "trainer.minibatches=4" in result.stderr and not out.exists()
    # Not named, the default algo=grpo gives a report without a reference, and says why.
    plain = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "report", str(sweep), "--out", str(out), "--no-plots"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr
    said = "--reference 'algo=grpo' (the default) names no single group"
    markdown = (out / "report.md").read_text()
    assert said in markdown
    # ... and says it where the comparison tables would be, on the terminal too (issue #54)
    note = (
        "none: the default reference 'algo=grpo' matches 2 groups ('algo=grpo "
        "trainer.minibatches=(default)', 'algo=grpo trainer.minibatches=4'), so there are no "
        "steps to a level and no comparison with it."
    )
    assert f"## Against the reference\n\n{note}" in markdown
    assert note in " ".join(plain.stdout.split())
    narrowed = build_report(
        sweep,
        tmp_path / "narrowed",
        Options(last=2, reference="algo=grpo trainer.minibatches=4"),
        plots=False,
    )
    assert narrowed.reference is not None and narrowed.reference.best == pytest.approx(0.3)
