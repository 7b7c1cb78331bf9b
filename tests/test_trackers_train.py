"""Experiment trackers through `tepo train` itself (subprocesses): refused before the model
loads when unknown or uninstalled; a run stopped and resumed reads back from every tracker equal
to its own metrics.jsonl and eval.jsonl; a sweep's jobs share one trackio store. Offline, as in
test_trackers.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tracker_readers import (
    TRACKERS,
    as_stored,
    go_offline,
    jsonl,
    mlflow_run,
    needs,
    read_back,
    trackio_store,
    wandb_runs,
)

from tepo_cli.trackers import HELD_OUT_ACCURACY, numeric
from tepo_cli.trackers.tracker import run_name

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    go_offline(monkeypatch, tmp_path_factory.getbasetemp())


def tepo_train(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_refuses_an_unknown_or_uninstalled_tracker_before_the_model_loads(tmp_path):
    (tmp_path / "neptune_tracker.py").write_text(
        "import sys\nfrom tepo_cli.trackers import register_tracker\n"
        "NAME, REQUIRES = 'neptune', 'tepo_absent_tracker_library'\n"
        "def build():\n    raise AssertionError('never built')\n"
        "register_tracker(sys.modules[__name__])\n"
    )
    cases = {
        "logger=[tensorboard,tensorbored]": "tensorbored is not an experiment tracker",
        "logger=[neptune]": "make install-trackers",
    }
    for number, (override, fragment) in enumerate(cases.items()):
        run_dir = tmp_path / f"run{number}"
        args = ["model=tiny", "plugins=[neptune_tracker.py]", override, f"hydra.run.dir={run_dir}"]
        result = tepo_train(args, tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        (message,) = result.stderr.strip().splitlines()
        assert message.startswith("tepo train: logger=") and fragment in message
        assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()


def parity_reward(tmp: Path) -> Path:
    """A reward the tiny random model earns about half the time (even-length completions)."""
    path = tmp / "parity.py"
    path.write_text("def score(completion, problem):\n    return len(completion) % 2 == 0\n")
    return path


def wait_for_steps(run_dir: Path, steps: int, process: subprocess.Popen) -> None:
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= steps:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {steps}: {process.poll()}")


@needs(*TRACKERS)
def test_a_run_stopped_and_resumed_reads_back_equal_to_its_logs_in_every_tracker(tmp_path):
    """`tepo train` with all four trackers, stopped by SIGTERM after step 2 and resumed to step
    4: each tracker holds one run whose every number at every step equals metrics.jsonl
    (TensorBoard: as float32), and whose held-out accuracy equals eval.jsonl."""
    run_dir = tmp_path / "run"
    args = [
        "model=tiny",
        "trainer.max_steps=4",
        "trainer.save_every=0",  # the checkpoint is the one SIGTERM writes
        "trainer.save_final=false",
        "trainer.progress=false",
        "benchmark.eval_size=4",
        "reward=custom",
        f"reward.path={parity_reward(tmp_path)}",
        f"logger=[{','.join(TRACKERS)}]",
        f"hydra.run.dir={run_dir}",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_steps(run_dir, 2, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    resumed = tepo_train([*args, "resume=true"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    metrics, evals = jsonl(run_dir / "metrics.jsonl"), jsonl(run_dir / "eval.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3, 4]
    assert [e["step"] for e in evals] == [0, 4]
    keys = {key for record in metrics for key in numeric(record)}
    assert {"reward_mean", "accuracy", "loss", "kl", "step_seconds"} <= keys
    trackio_dir = run_dir / "trackio"
    for tracker in TRACKERS:
        scalars = read_back(tracker, run_dir, trackio_dir)
        assert set(scalars) == {*keys, HELD_OUT_ACCURACY}, tracker
        for key in keys:
            expected = [(r["step"], as_stored(tracker, r[key])) for r in metrics]
            assert scalars[key] == expected, (tracker, key)
        held_out = [(e["step"], as_stored(tracker, e["accuracy"])) for e in evals]
        assert scalars[HELD_OUT_ACCURACY] == held_out, tracker
    assert mlflow_run(run_dir).info.status == "FINISHED"
    assert mlflow_run(run_dir).data.params["trainer.max_steps"] == "4"
    assert len({run.run_id for run in wandb_runs(run_dir)}) == 1
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 2  # one per process
    assert trackio_store(trackio_dir, run_name(run_dir))["runs"] == [run_name(run_dir)]


@needs("trackio")
def test_the_jobs_of_a_sweep_in_one_process_share_the_sweeps_trackio_store(tmp_path):
    """The basic launcher runs every job in the `tepo` process, where trackio took its directory
    at the first job: every job is a run of one store in the sweep's directory."""
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "model=tiny",
        "trainer.max_steps=1",
        "trainer.save_every=0",
        "trainer.save_final=false",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.progress=false",
        "logger=trackio",
        "seed=0,1",
        f"hydra.sweep.dir={sweep}",
    ]
    result = tepo_train(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.parent for p in sweep.glob("*/metrics.jsonl"))
    assert [job.name[:2] for job in jobs] == ["0_", "1_"]
    assert not any((job / "trackio").exists() for job in jobs)
    for job in jobs:
        store = trackio_store(sweep / "trackio", run_name(job))
        assert sorted(store["runs"]) == sorted(run_name(j) for j in jobs)
        (record,) = jsonl(job / "metrics.jsonl")
        assert [(row["step"], row["reward_mean"]) for row in store["logs"]] == [
            (1, record["reward_mean"])
        ]
