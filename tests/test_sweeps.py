"""Multirun sweeps from the shell: launchers, threads per job, and `tepo report` on the result."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from tepo_cli.config.launcher import available_cores, joblib_workers
from tepo_cli.config.validate import load_train_config

ROOT = Path(__file__).resolve().parents[1]
TEPO = Path(sys.executable).parent / "tepo"


def test_job_dirname_is_one_level_and_fits_a_file_name():
    from tepo_cli.core.job_dirname import LIMIT, job_dirname

    assert job_dirname("algo=mpo,seed=1") == "algo=mpo,seed=1"
    assert job_dirname("reward.path=/home/me/parity.py,seed=0") == (
        "reward.path=_home_me_parity.py,seed=0"
    )
    long_a, long_b = (f"plugins=[/{'x' * 300}/{end}.py]" for end in ("a", "b"))
    name_a, name_b = job_dirname(long_a), job_dirname(long_b)
    assert len(name_a.encode()) <= LIMIT and "/" not in name_a
    assert name_a != name_b and name_a[:150] == name_b[:150]  # same head, the hash tells apart


def test_joblib_workers_follows_joblib():
    assert [joblib_workers(n, 8) for n in (None, 1, 3, -1, -2, -20)] == [1, 1, 3, 8, 7, 1]


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [
        (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], max(1, available_cores() // 2)),
        (["hydra/launcher=submitit_local", "hydra.launcher.cpus_per_task=3"], 3),
        (["hydra/launcher=basic"], None),
        (["hydra/launcher=slurm"], None),  # SLURM's allocation already limits the cores
        (["hydra/launcher=joblib", "trainer.num_threads=5"], 5),  # an explicit value wins
    ],
)
def test_threads_per_job_under_a_launcher(launcher, expected):
    with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
        cfg = compose("train", ["model=tiny", *launcher], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # as inside a job: hydra.launcher is readable
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        assert load_train_config(cfg).trainer.num_threads == expected
    finally:
        HydraConfig.instance().cfg = None


def test_slurm_launcher_preset_extends_submitit():
    with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
        cfg = compose("train", ["hydra/launcher=slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.timeout_min) == (1, 1, 720)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_joblib_sweep_and_report(tmp_path):
    """`scripts/sweeps.sh smoke`: tiny model, algo=grpo,mpo x seed=0,1 under joblib, then report."""
    out = tmp_path / "sweep"
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "sweeps.sh"), "smoke", str(out)],
        cwd=tmp_path,
        env={**os.environ, "TEPO": str(TEPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = sorted(path for path in out.iterdir() if path.is_dir())
    assert len(jobs) == 4
    configs = [yaml.safe_load((job / "config.yaml").read_text()) for job in jobs]
    assert sorted((c["algo"]["name"], c["seed"]) for c in configs) == [
        ("grpo", 0), ("grpo", 1), ("mpo", 0), ("mpo", 1),
    ]  # fmt: skip
    assert {c["trainer"]["num_threads"] for c in configs} == {max(1, available_cores() // 2)}
    groups = read_csv(out / "report.csv")
    assert [(g["group"], g["finished"]) for g in groups] == [("algo=grpo", "2"), ("algo=mpo", "2")]
    assert all(g["seconds_per_step_n"] == "2" and g["peak_rss_mb"] for g in groups)
    assert (out / "report.md").is_file() and (out / "plot_reward_mean.png").is_file()
    assert "algo=grpo" in result.stdout  # the rich table on the terminal


@pytest.mark.slow
def test_submitit_local_sweep_is_reported(tmp_path):
    (tmp_path / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2 == 0\n"
    )
    out = tmp_path / "sweep"
    command = [
        str(TEPO), "train", "-m", "model=tiny", "seed=0,1", "trainer.max_steps=2",
        "reward=custom", f"reward.path={tmp_path / 'parity.py'}", "reward.function=score",
        "rollout.max_new_tokens=8", "benchmark.eval_size=4", "trainer.save_final=false",
        "trainer.progress=false", "hydra/launcher=submitit_local",
        "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
        f"hydra.sweep.dir={out}",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / ".submitit").is_dir()
    report = subprocess.run(
        [str(TEPO), "report", str(out), "--out", str(tmp_path / "report"), "--no-plots"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    runs = read_csv(tmp_path / "report" / "report_runs.csv")
    assert sorted((r["seed"], r["state"], r["steps_done"]) for r in runs) == [
        ("0", "finished", "2"), ("1", "finished", "2"),
    ]  # fmt: skip
    for r in runs:  # the report's final reward: the mean reward of the run's last (<= 5) steps
        metrics = (Path(r["path"]) / "metrics.jsonl").read_text().splitlines()
        rewards = [json.loads(line)["reward_mean"] for line in metrics]
        assert float(r["final_reward"]) == pytest.approx(sum(rewards) / len(rewards), abs=1e-12)
    (group,) = read_csv(tmp_path / "report" / "report.csv")
    assert (group["group"], group["finished"], group["final_reward_n"]) == ("all runs", "2", "2")
    # reward.path's slashes do not nest the jobs' directories (core/job_dirname.py): one level
    files = [p for p in out.rglob("config.yaml") if p.parent.name != ".hydra"]
    assert {p.parent.parent for p in files} == {out}
    assert all(
        p.parent.name.startswith(("0_", "1_")) and "reward.path=_" in p.parent.name for p in files
    )
    configs = [yaml.safe_load(p.read_text()) for p in files]
    assert len(configs) == 2 and {c["trainer"]["num_threads"] for c in configs} == {1}
