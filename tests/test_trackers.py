"""Experiment trackers (`logger=[...]`): each library's own reader gets back exactly what was
logged, a resumed run continues the same tracked run, a tracker that breaks mid-run is switched
off, and an unknown or uninstalled one stops `tepo train` before any model loads.

The libraries are the optional `trackers` extra (`make install-trackers`); without one its tests
skip, unless TEPO_REQUIRE_TRACKERS=1 (CI) makes them fail. Nothing here uses the network: W&B
runs offline, MLflow and trackio write local SQLite stores."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from tracker_readers import (
    jsonl,
    mlflow_run,
    mlflow_scalars,
    tensorboard_hparams,
    tensorboard_scalars,
    trackio_scalars,
    trackio_store,
    wandb_config,
    wandb_runs,
    wandb_scalars,
)

from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError, RunError
from tepo_cli.trackers import (
    HELD_OUT_ACCURACY,
    check_trackers,
    numeric,
    open_trackers,
    register_tracker,
    trackers,
    wandb_tracker,
)
from tepo_cli.trackers.base import run_name

TRACKERS = ("tensorboard", "mlflow", "wandb", "trackio")
REQUIRED = os.environ.get("TEPO_REQUIRE_TRACKERS") == "1"


def needs(*libraries: str) -> pytest.MarkDecorator:
    missing = [name for name in libraries if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(
        bool(missing) and not REQUIRED,
        reason=f"{', '.join(missing)} not installed (make install-trackers)",
    )


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    """No tracker reaches a server: W&B offline, no user stores or credentials."""
    for name in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "TRACKIO_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NETRC", str(tmp_path_factory.getbasetemp() / "no-netrc"))


# Four steps with numbers that float32 cannot hold exactly (TensorBoard stores float32).
RECORDS = [
    {
        "step": step,
        "reward_mean": step / 3,
        "accuracy": step / 8,
        "loss": -0.01 * step / 7,
        "kl": 1e-3 * step / 3,
        "step_seconds": 2.5 + step / 9,
        "skipped_optimizer_steps": 0,
        "note": "text is not a scalar",
    }
    for step in (1, 2, 3, 4)
]
KEYS = ("reward_mean", "accuracy", "loss", "kl", "step_seconds", "skipped_optimizer_steps")
CONFIG = {"trainer": {"max_steps": 4, "adam_betas": [0.9, 0.999]}, "algo": {"name": "grpo"}}


def as_stored(tracker: str, value: float) -> float:
    return float(np.float32(value)) if tracker == "tensorboard" else value


def read_back(tracker: str, run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    if tracker == "tensorboard":
        return tensorboard_scalars(run_dir)
    if tracker == "mlflow":
        return mlflow_scalars(run_dir)
    if tracker == "wandb":
        return wandb_scalars(run_dir)
    return trackio_scalars(Path(os.environ["TRACKIO_DIR"]), run_name(run_dir))


def recorded_config(tracker: str, run_dir: Path) -> dict[str, Any]:
    if tracker == "tensorboard":
        return tensorboard_hparams(run_dir)
    if tracker == "mlflow":
        return mlflow_run(run_dir).data.params
    if tracker == "wandb":
        return wandb_config(run_dir)
    store = trackio_store(Path(os.environ["TRACKIO_DIR"]), run_name(run_dir))
    return store["config"]


def test_every_tracker_module_names_itself():
    assert set(trackers()) == set(TRACKERS)


def test_a_record_gives_its_numbers_but_not_its_step_flags_or_text():
    record = {"step": 3, "reward_mean": 0.5, "refill_rounds": 2, "ok": True, "note": "x"}
    assert numeric(record) == {"reward_mean": 0.5, "refill_rounds": 2.0}


# MLflow builds its SQLite store's tables (alembic migrations) in about 6 s.
SLOW_TO_START = {"mlflow": (pytest.mark.slow,)}


@pytest.mark.parametrize(
    "tracker", [pytest.param(t, marks=(needs(t), *SLOW_TO_START.get(t, ()))) for t in TRACKERS]
)
def test_a_stopped_then_resumed_run_reads_back_every_step_once(
    tracker, tmp_path, tmp_path_factory, monkeypatch
):
    """Steps 1-2, stopped (checkpoint at 2), resumed for 3-4: one tracked run, each step once,
    every value as logged; held-out accuracy at the steps it was measured; the config once."""
    if tracker == "trackio":  # trackio takes its store once per process, at import
        monkeypatch.setenv("TRACKIO_DIR", str(tmp_path_factory.getbasetemp() / "trackio-store"))
    run_dir = tmp_path / "run"
    with open_trackers([tracker], run_dir, CONFIG, None) as started:
        started.log_held_out(0, 0.25)
        for record in RECORDS[:2]:
            started.log_step(record)
    with open_trackers([tracker], run_dir, CONFIG, 2) as started:
        for record in RECORDS[2:]:
            started.log_step(record)
        started.log_held_out(4, 0.75)
    scalars = read_back(tracker, run_dir)
    assert set(scalars) == {*KEYS, HELD_OUT_ACCURACY}
    for key in KEYS:
        assert scalars[key] == [(r["step"], as_stored(tracker, r[key])) for r in RECORDS], key
    assert scalars[HELD_OUT_ACCURACY] == [(0, 0.25), (4, 0.75)]
    config = recorded_config(tracker, run_dir)
    assert config["trainer.max_steps"] in (4, "4")  # MLflow params are text
    assert config["algo.name"] == "grpo"
    assert str(config["trainer.adam_betas"]) == "[0.9, 0.999]"
    assert len(config["git_commit"]) >= 7
    if tracker == "wandb":  # one W&B id for both processes: `wandb sync` makes them one run
        assert {run.run_id for run in wandb_runs(run_dir)} == {
            (run_dir / "wandb" / "run_id").read_text().strip()
        }
    if tracker == "mlflow":
        assert mlflow_run(run_dir).info.status == "FINISHED"


@needs("tensorboard")
def test_tensorboard_hides_what_a_killed_run_logged_after_its_checkpoint(tmp_path):
    """Killed after logging step 3, resumed from step 2's checkpoint: step 3 shows once, with
    the resumed run's value (purge_step)."""
    run_dir = tmp_path / "run"
    killed = open_trackers(["tensorboard"], run_dir, CONFIG, None)
    for record in RECORDS[:3]:
        killed.log_step({**record, "reward_mean": -1.0})  # the process dies without closing
    with open_trackers(["tensorboard"], run_dir, CONFIG, 2) as resumed:
        for record in RECORDS[2:]:
            resumed.log_step(record)
    expected = [-1.0, -1.0, RECORDS[2]["reward_mean"], RECORDS[3]["reward_mean"]]
    assert tensorboard_scalars(run_dir)["reward_mean"] == [
        (step, float(np.float32(value))) for step, value in zip((1, 2, 3, 4), expected, strict=True)
    ]


def plugin_tracker(name: str, requires: str = "json", fail_in: str = "") -> types.ModuleType:
    """A tracker from a plugin file, as `register_tracker` takes one; `fail_in` names the
    method that raises (an unreachable server, a full disk)."""

    class Tracker:
        logged: ClassVar[list[int]] = []

        def start(self, run_dir: Path, config: dict[str, Any], resume: int | None) -> None:
            if fail_in == "start":
                raise ConnectionError("server unreachable")

        def log(self, step: int, scalars: dict[str, float]) -> None:
            if fail_in == "log":
                raise OSError("No space left on device")
            Tracker.logged.append(step)

        def close(self, outcome: str) -> None:
            pass

    module = types.ModuleType(f"plugin_{name}")
    module.NAME, module.REQUIRES, module.build, module.Tracker = name, requires, Tracker, Tracker
    return module


@pytest.fixture()
def plugin(monkeypatch):
    from tepo_cli import trackers as package

    monkeypatch.setattr(package, "_REGISTERED", {})

    def _register(*args: Any, **kwargs: Any) -> types.ModuleType:
        module = plugin_tracker(*args, **kwargs)
        register_tracker(module)
        return module

    return _register


def test_a_tracker_that_fails_mid_run_is_switched_off_and_the_others_go_on(plugin, capsys):
    healthy, _ = plugin("healthy"), plugin("broken", fail_in="log")
    with open_trackers(["broken", "healthy"], Path("unused"), CONFIG, None) as started:
        for record in RECORDS[:3]:
            started.log_step(record)
        assert started.names == ["healthy"]
    assert healthy.Tracker.logged == [1, 2, 3]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "broken" in line]
    assert len(warnings) == 1 and "at step 1" in warnings[0] and "No space left" in warnings[0]


def test_a_tracker_that_cannot_start_stops_the_run_with_its_name(plugin):
    plugin("remote", fail_in="start")
    with pytest.raises(RunError, match=r"logger=remote could not start \(ConnectionError"):
        open_trackers(["remote"], Path("unused"), CONFIG, None)


def test_unknown_and_uninstalled_trackers_are_refused(plugin):
    with pytest.raises(ConfigError) as unknown:
        check_trackers(["tensorboard", "tensorbored"])
    assert "tensorbored is not an experiment tracker" in str(unknown.value)
    assert "mlflow, tensorboard, trackio, wandb" in str(unknown.value)
    plugin("neptune", requires="tepo_absent_tracker_library")
    with pytest.raises(ConfigError) as missing:
        check_trackers(["neptune"])
    message = str(missing.value)
    assert "needs tepo_absent_tracker_library, not installed" in message
    assert "make install-trackers" in message and "'.[neptune]'" in message


def test_logger_takes_a_list_or_one_name_and_each_name_once(compose_config):
    assert load_train_config(compose_config("train")).logger == []
    one = load_train_config(compose_config("train", ["logger=tensorboard"]))
    assert one.logger == ["tensorboard"]
    with pytest.raises(ConfigError, match=r"logger.*lists mlflow more than once"):
        load_train_config(compose_config("train", ["logger=[mlflow,wandb,mlflow]"]))


def test_wandb_is_online_only_when_logged_in(monkeypatch, tmp_path):
    assert not wandb_tracker.logged_in()  # the fixture: no key, an empty NETRC
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_tracker.logged_in()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not wandb_tracker.logged_in()  # a netrc entry for another host
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    assert wandb_tracker.logged_in()


def tepo_train(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
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


@pytest.mark.slow
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
        if tracker == "trackio":
            scalars = trackio_scalars(trackio_dir, run_name(run_dir))
        else:
            scalars = read_back(tracker, run_dir)
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
