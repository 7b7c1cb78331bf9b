"""`tepo report` on hand-written runs whose table values are computed by hand below.

Two groups (algo=grpo, algo=mpo), seeds 0-1 and 0-2, options last=2, threshold accuracy ≥ 0.5:

grpo seed 0: rewards .1 .3 .5 .7 -> final (.5+.7)/2 = .6; accuracy reaches .6 at step 3, after
             2+3+2 = 7 s; step seconds 2 3 2 4 -> median 2.5; peak RSS 130; held-out .2 -> .5
grpo seed 1: rewards .2 .6 .4 1.0 -> final .7; accuracy .5 at step 2, after 1+1 = 2 s;
             median of 1 1 2 2 = 1.5; peak 140; held-out .2 -> .7
grpo seed 2: status "running" with a dead pid on this host -> crashed, not in the statistics
mpo seed 0:  rewards 0 .2 .4 -> final .3; accuracy never ≥ .5; median 1; peak 200; after .3
mpo seed 1:  rewards .3 .5 .7 -> final .6; accuracy .6 at step 2 after 1.5+1.5 = 3 s;
             median of 1.5 1.5 3 = 1.5; peak 210; after .4
mpo seed 2:  rewards .2 .4 .6 -> final .5; accuracy .6 at step 3 after 1+1+1 = 3 s; median 1;
             no peak_rss_mb (an older run); after .5 (summary.json only, no eval.jsonl)
mpo seed 3:  status "running" on another host -> "running on elsewhere", not in the statistics

grpo (n=2, t(0.975, 1) = 12.7062): final .65 ± 12.7062·0.0707107/√2 = .635310;
  after .6 ± 1.27062; steps 2.5 ± 6.35310; seconds 4.5 ± 12.7062·3.535534/√2 = 31.7655;
  s/step 2.0 ± 6.35310; peak max = 140.
mpo (n=3, t(0.975, 2) = 4.3027): final mean .466667, s = .152753, ± 4.3027·.152753/√3 = .379463;
  after .4 ± 4.3027·.1/√3 = .248416; steps (2 of 3 reached) 2.5 ± 6.35310; seconds 3.0 ± 0;
  s/step 1.166667 ± 4.3027·.288675/√3 = .717117; peak max(200, 210) = 210.
"""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tepo_cli.eval.report import Options, build_report
from tepo_cli.eval.report.runs import find_runs
from tepo_cli.eval.report.stats import estimate, first_crossing, t_quantile_975

OPTIONS = Options(threshold=0.5, threshold_key="accuracy", window=1, last=2)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_run(
    root: Path,
    name: str,
    algo: str,
    seed: int,
    rows: list[tuple[float, float, float, float | None]],  # reward, accuracy, seconds, peak MB
    before: float | None = None,
    after: float | None = None,
    status: dict | None = None,
    in_eval_file: bool = True,
) -> Path:
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump([f"algo={algo}", f"seed={seed}", "trainer.progress=false"])
    )
    max_steps = {"grpo": 4, "mpo": 3}[algo]
    config = {"seed": seed, "algo": {"name": algo}, "trainer": {"max_steps": max_steps}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    with (run / "metrics.jsonl").open("w") as handle:
        for step, (reward, accuracy, seconds, peak) in enumerate(rows, start=1):
            record = {"step": step, "reward_mean": reward, "accuracy": accuracy}
            record.update(step_seconds=seconds, entropy=1.0 / step, kl=None)
            if peak is not None:
                record["peak_rss_mb"] = peak
            handle.write(json.dumps(record) + "\n")
    evals = [("before", 0, before), ("after", len(rows), after)]
    if in_eval_file:
        lines = [
            json.dumps({"step": s, "when": w, "accuracy": a, "problems": 10, "seconds": 0.1})
            for w, s, a in evals
            if a is not None
        ]
        (run / "eval.jsonl").write_text("".join(line + "\n" for line in lines))
    if status is None:
        summary = {"steps": len(rows), "eval_before": before, "eval_after": after}
        (run / "summary.json").write_text(json.dumps(summary))
        status = {"state": "finished", "pid": 1, "hostname": socket.gethostname()}
    (run / "status.json").write_text(json.dumps({"updated": "2026-01-01T00:00:00+00:00", **status}))
    return run


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun"
    write_run(root, "0_algo=grpo,seed=0", "grpo", 0,
              [(0.1, 0.1, 2.0, 100), (0.3, 0.4, 3.0, 120), (0.5, 0.6, 2.0, 110), (0.7, 0.8, 4.0, 130)],
              before=0.2, after=0.5)  # fmt: skip
    write_run(root, "1_algo=grpo,seed=1", "grpo", 1,
              [(0.2, 0.2, 1.0, 90), (0.6, 0.5, 1.0, 95), (0.4, 0.3, 2.0, 100), (1.0, 0.9, 2.0, 140)],
              before=0.2, after=0.7)  # fmt: skip
    write_run(root, "2_algo=grpo,seed=2", "grpo", 2, [(0.9, 0.9, 1.0, 999), (0.9, 0.9, 1.0, 999)],
              before=0.2, status={"state": "running", "pid": dead_pid(),
                                  "hostname": socket.gethostname()})  # fmt: skip
    write_run(root, "3_algo=mpo,seed=0", "mpo", 0,
              [(0.0, 0.0, 1.0, 200), (0.2, 0.2, 1.0, 150), (0.4, 0.4, 1.0, 180)],
              before=0.2, after=0.3)  # fmt: skip
    write_run(root, "4_algo=mpo,seed=1", "mpo", 1,
              [(0.3, 0.3, 1.5, 190), (0.5, 0.6, 1.5, 210), (0.7, 0.7, 3.0, 205)],
              before=0.2, after=0.4)  # fmt: skip
    write_run(root, "5_algo=mpo,seed=2", "mpo", 2,
              [(0.2, 0.2, 1.0, None), (0.4, 0.4, 1.0, None), (0.6, 0.6, 1.0, None)],
              before=0.2, after=0.5, in_eval_file=False)  # fmt: skip
    write_run(root, "6_algo=mpo,seed=3", "mpo", 3, [(0.0, 0.0, 1.0, 100)],
              status={"state": "running", "pid": 1, "hostname": "elsewhere"})  # fmt: skip
    (root / "multirun.yaml").write_text("hydra: {}\n")
    (root / ".submitit" / "123").mkdir(parents=True)  # launcher files: never a run
    return root


def test_t_quantiles_and_estimate():
    assert t_quantile_975(1) == pytest.approx(12.7062)
    assert t_quantile_975(2) == pytest.approx(4.3027)
    assert t_quantile_975(30) == pytest.approx(2.0423, abs=1e-4)
    assert t_quantile_975(40) == pytest.approx(2.0211, abs=1e-4)  # expansion beyond the table
    assert t_quantile_975(120) == pytest.approx(1.9799, abs=1e-4)
    single = estimate([0.4])
    assert single is not None and single.half_width is None and single.format(2) == "0.40"
    assert estimate([None]) is None


def test_first_crossing_smoothed():
    metrics = [{"step": s, "accuracy": a, "step_seconds": 1.0} for s, a in
               enumerate([0.1, 0.45, 0.6, 0.8], start=1)]  # fmt: skip
    assert first_crossing(metrics, "accuracy", 0.5, window=1).step == 3
    crossing = first_crossing(metrics, "accuracy", 0.5, window=2)  # (.45 + .6) / 2 = .525
    assert (crossing.step, crossing.seconds) == (3, 3.0)
    assert first_crossing(metrics, "accuracy", 0.65, window=2).step == 4  # (.6 + .8) / 2 = .7
    assert first_crossing(metrics, "accuracy", 0.75, window=2) is None  # raw .8 would reach it
    assert first_crossing(metrics, "accuracy", 0.9) is None
    warmup = [{"mtp_warmup_step": 0, "mtp_warmup_loss": 9.0}]  # MPO's warm-up: not a step
    crossing = first_crossing(warmup + metrics, "accuracy", 0.5, window=2)
    assert (crossing.step, crossing.seconds) == (3, 3.0)


def test_report_numbers_match_the_hand_computation(sweep, tmp_path):
    report = build_report(sweep, tmp_path / "out", OPTIONS)
    assert report.swept == ["algo"]
    grpo, mpo = report.groups
    assert (grpo.group.label, mpo.group.label) == ("algo=grpo", "algo=mpo")
    assert dict(grpo.states) == {"finished": 2, "crashed": 1}
    assert dict(mpo.states) == {"finished": 3, "running on elsewhere": 1}

    def check(value, mean, half):
        assert value.mean == pytest.approx(mean, abs=1e-6)
        assert value.half_width == pytest.approx(half, abs=1e-5)

    check(grpo.final_reward, 0.65, 0.635310)
    check(grpo.accuracy_before, 0.2, 0.0)
    check(grpo.accuracy_after, 0.6, 1.27062)
    check(grpo.steps_to, 2.5, 6.35310)
    check(grpo.seconds_to, 4.5, 31.7655)
    check(grpo.seconds_per_step, 2.0, 6.35310)
    assert (grpo.reached, grpo.finished, grpo.peak_rss_mb) == (2, 2, 140)

    check(mpo.final_reward, 0.466667, 0.379463)
    check(mpo.accuracy_after, 0.4, 0.248416)
    check(mpo.steps_to, 2.5, 6.35310)
    check(mpo.seconds_to, 3.0, 0.0)
    check(mpo.seconds_per_step, 1.166667, 0.717117)
    assert (mpo.reached, mpo.finished, mpo.peak_rss_mb) == (2, 3, 210)
    assert mpo.final_reward.n == 3

    states = {row.run.name: row.run.state for row in report.runs}
    assert states["2_algo=grpo,seed=2"] == "crashed"
    assert states["6_algo=mpo,seed=3"] == "running on elsewhere"
    assert len(states) == 7  # .submitit/ is not a run


def test_report_files(sweep, tmp_path):
    out = tmp_path / "out"
    build_report(sweep, out, OPTIONS)
    with (out / "report.csv").open() as handle:
        rows = {row["group"]: row for row in csv.DictReader(handle)}
    assert float(rows["algo=grpo"]["final_reward_mean"]) == pytest.approx(0.65)
    assert float(rows["algo=grpo"]["final_reward_ci95"]) == pytest.approx(0.635310, abs=1e-5)
    assert rows["algo=mpo"]["threshold_reached"] == "2" and rows["algo=mpo"]["finished"] == "3"
    assert rows["algo=mpo"]["algo"] == "mpo" and rows["algo=mpo"]["peak_rss_mb"] == "210"
    with (out / "report_runs.csv").open() as handle:
        runs = list(csv.DictReader(handle))
    assert [r["state"] for r in runs].count("crashed") == 1 and len(runs) == 7
    markdown = (out / "report.md").read_text()
    assert "| algo=grpo | 2 finished, 1 crashed | 0.650 ± 0.635 |" in markdown
    assert "2.5 ± 6.4 (2/3)" in markdown  # mpo: two of three finished runs reached it
    for key in ("reward_mean", "accuracy", "entropy", "eval_accuracy"):
        assert (out / f"plot_{key}.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "plot_kl.png").exists()  # every kl is null: nothing to draw
    assert not (out / "plot_clip_frac.png").exists()


def test_a_folder_of_links_gathers_runs_published_in_several_places(sweep, tmp_path):
    """Runs published in two folders (one protocol's arms reused by another) read as one sweep
    through a folder of links; a run reached by two links, or a link looping back, counts once."""
    gathered = tmp_path / "gathered"
    gathered.mkdir()
    for name in ("0_algo=grpo,seed=0", "1_algo=grpo,seed=1"):  # published elsewhere
        run = sweep / name
        (gathered / run.name).symlink_to(run, target_is_directory=True)
    elsewhere = tmp_path / "elsewhere"
    write_run(elsewhere, "0_algo=mpo,seed=0", "mpo", 0, [(0.0, 0.0, 1.0, 200)], after=0.3)
    (gathered / "0_algo=mpo,seed=0").symlink_to(elsewhere / "0_algo=mpo,seed=0")
    (gathered / "loop").symlink_to(gathered, target_is_directory=True)
    (gathered / "again").symlink_to(sweep / "0_algo=grpo,seed=0", target_is_directory=True)
    found = [path.relative_to(gathered).as_posix() for path in find_runs(gathered)]
    assert found == ["0_algo=grpo,seed=0", "0_algo=mpo,seed=0", "1_algo=grpo,seed=1"]


def test_groups_from_configs_without_overrides(sweep, tmp_path):
    for overrides in sweep.glob("*/.hydra/overrides.yaml"):
        overrides.unlink()
    report = build_report(sweep, tmp_path / "out", OPTIONS, plots=False)
    assert report.swept == ["algo.name"]  # the flattened config.yaml files are compared
    assert [group.group.label for group in report.groups] == ["algo.name=grpo", "algo.name=mpo"]
    assert report.groups[1].final_reward.mean == pytest.approx(0.466667, abs=1e-6)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tepo_cli", "report", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_cli_writes_into_the_directory(sweep):
    result = run_cli(str(sweep), "--last", "2", "--no-plots")
    assert result.returncode == 0, result.stderr
    assert "algo=grpo" in result.stdout and "crashed" in result.stdout
    assert (sweep / "report.md").is_file() and (sweep / "report.csv").is_file()


def test_cli_refuses_an_unknown_threshold_key(sweep):
    result = run_cli(str(sweep), "--threshold-key", "acuracy")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "'acuracy' is not a key" in result.stderr and "accuracy, entropy" in result.stderr
    assert not (sweep / "report.md").exists()


@pytest.mark.parametrize("make", ["missing", "empty", "none"])
def test_cli_bad_directory_is_one_paragraph(tmp_path, make):
    target = tmp_path / "runs"
    if make == "empty":
        (target / "nothing here").mkdir(parents=True)
    result = run_cli(*([] if make == "none" else [str(target)]))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.startswith("tepo report: ")
    said = {"empty": "no runs found", "missing": "is not a directory", "none": "give DIR"}
    assert said[make] in result.stderr


def _set_machines(run: Path, *machines: tuple[str, int]) -> None:
    summary = json.loads((run / "summary.json").read_text())
    summary["machines"] = [
        {"cpu": cpu, "cores": 2, "bf16_instructions": [], "accelerator": None, "from_step": step}
        for cpu, step in machines
    ]
    (run / "summary.json").write_text(json.dumps(summary))


def _notes(out: Path) -> dict[str, str]:
    """Each run's `notes` cell in report_runs.csv."""
    with (out / "report_runs.csv").open() as handle:
        return {row["run"]: row["notes"] for row in csv.DictReader(handle)}


def test_runs_on_several_machines_are_named_and_a_run_that_moved_says_where(sweep, tmp_path):
    out = tmp_path / "out"
    build_report(sweep, out, OPTIONS)  # no run recorded a machine: nothing said
    assert "started on" not in (out / "report.md").read_text()
    _set_machines(sweep / "0_algo=grpo,seed=0", ("Intel Xeon", 0))
    _set_machines(sweep / "1_algo=grpo,seed=1", ("Intel Xeon", 0), ("AMD EPYC", 2))
    _set_machines(sweep / "3_algo=mpo,seed=0", ("AMD EPYC", 0))
    report = build_report(sweep, out, OPTIONS)
    assert report.machines == (
        "The runs started on 2 machines: Intel Xeon (2 runs), AMD EPYC (1 run); 4 did not record "
        "one; moved during training: 1_algo=grpo,seed=1. Compare seconds, tokens/s and MFU only "
        "between runs on one machine."
    )
    assert report.machines in (out / "report.md").read_text()
    notes = _notes(out)
    assert notes["1_algo=grpo,seed=1"] == "trained on Intel Xeon, then on AMD EPYC after step 2"
    assert notes["0_algo=grpo,seed=0"] == ""
    _set_machines(sweep / "1_algo=grpo,seed=1", ("Intel Xeon", 0), ("Intel Xeon", 2))
    _set_machines(sweep / "3_algo=mpo,seed=0", ("Intel Xeon", 0))
    assert build_report(sweep, out, OPTIONS).machines is None  # one machine: nothing to say


def test_runs_resumed_from_a_checkpoint_are_named_with_their_steps(sweep, tmp_path):
    out = tmp_path / "out"
    assert build_report(sweep, out, OPTIONS).resumes is None  # none recorded a resume
    for name, steps in (("1_algo=grpo,seed=1", [1]), ("3_algo=mpo,seed=0", [1, 2])):
        summary = json.loads((sweep / name / "summary.json").read_text())
        (sweep / name / "summary.json").write_text(json.dumps({**summary, "resumed_after": steps}))
    report = build_report(sweep, out, OPTIONS)
    assert report.resumes == (
        f"2 of {len(report.runs)} runs resumed from a checkpoint (after step): "
        "1_algo=grpo,seed=1 (1); 3_algo=mpo,seed=0 (1, 2). A resume on the machine the run "
        "trained on continues it exactly; see Machines for any that moved."
    )
    assert report.resumes in (out / "report.md").read_text()
    notes = _notes(out)
    assert notes["3_algo=mpo,seed=0"] == "resumed after step 1, 2"
    assert notes["0_algo=grpo,seed=0"] == ""


def _set_dtype(run: Path, dtype: str) -> None:
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"] = {"dtype": dtype}
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def test_a_group_whose_seeds_trained_in_two_precisions_is_named(sweep, tmp_path):
    """`model.dtype=auto` settles per machine: seeds typed alike can train in bf16 and float32."""
    out = tmp_path / "out"
    for name in ("0_algo=grpo,seed=0", "1_algo=grpo,seed=1", "3_algo=mpo,seed=0"):
        _set_dtype(sweep / name, "bfloat16")
    _set_dtype(sweep / "4_algo=mpo,seed=1", "bfloat16")
    _set_dtype(sweep / "5_algo=mpo,seed=2", "auto")  # recorded before dtypes were settled
    assert build_report(sweep, out, OPTIONS).machines is None  # each group in one precision
    _set_dtype(sweep / "4_algo=mpo,seed=1", "float32")
    report = build_report(sweep, out, OPTIONS)
    assert report.machines == (
        "Runs of one group trained in different precisions (model.dtype as each run settled it): "
        "algo=mpo (bfloat16: 3_algo=mpo,seed=0; float32: 4_algo=mpo,seed=1). Their spread "
        "includes the precision's."
    )
    assert report.machines in (out / "report.md").read_text()
