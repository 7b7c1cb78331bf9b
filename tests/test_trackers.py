"""Experiment trackers (`logger=[...]`), in process: each library's own reader gets back exactly
what was logged, a resumed run continues the same tracked run, a tracker that breaks mid-run is
switched off, and an unknown or uninstalled one is refused. Nothing here uses the network: W&B
runs offline, MLflow and trackio write local SQLite stores (tracker_readers.go_offline)."""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from tracker_readers import (
    TRACKERS,
    as_stored,
    go_offline,
    mlflow_run,
    needs,
    read_back,
    tensorboard_hparams,
    tensorboard_scalars,
    trackio_store,
    wandb_config,
    wandb_runs,
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
from tepo_cli.trackers.tracker import run_name


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    go_offline(monkeypatch, tmp_path_factory.getbasetemp())


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


@pytest.mark.parametrize("tracker", [pytest.param(t, marks=needs(t)) for t in TRACKERS])
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
    scalars = read_back(tracker, run_dir, Path(os.environ.get("TRACKIO_DIR", "")))
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

    monkeypatch.setattr(package._TRACKERS, "_registered", {})  # plugins of this test only

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
