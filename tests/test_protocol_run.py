"""`tepo protocol run`: a pre-registered experiment's runs trained one at a time in the registered
order, resumed after a crash, published without weights, journaled, and skipped once published."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tepo_cli.core.machine import cpu_model
from tepo_cli.protocol.journal import code_checkout, others_cores

TEPO = Path(sys.executable).parent / "tepo"
# The tiny overrides scripts/word_math_claims.sh uses for SMOKE=1 (CI): two steps, a checkpoint each.
SMOKE = [
    "recipe=word_math",
    "model=tiny",
    "rollout=hf",
    "trainer.max_steps=2",
    "trainer.warmup_steps=0",
    "benchmark.eval_size=4",
    "rollout.n=2",
    "trainer.prompts_per_step=2",
    "rollout.max_new_tokens=16",
    "trainer.save_every=1",
]


def protocol_file(tmp_path: Path, **changes: object) -> Path:
    data = {
        "name": "smoke",
        "description": "two arms, one seed, tiny model",
        "base": SMOKE,
        "arms": {"grpo": ["algo=grpo"], "tepo": ["algo=tepo"]},
        "seeds": [0],
        "first_run_only": ["trainer.eval_before=true"],
        "other_runs": ["trainer.eval_before=false"],
        "alpha": 0.05,
        "correction": "holm",
        "primaries": [
            {
                "name": "final",
                "metric": "eval_final",
                "treatment": "tepo",
                "control": "grpo",
                "direction": "greater",
                "test": "welch",
            }
        ],
        **changes,
    }
    path = tmp_path / "exp" / "protocol.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tepo_protocol(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 400):
    return subprocess.run(
        [str(TEPO), "protocol", "run", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def journal(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "journal.jsonl").read_text().splitlines()]


def test_list_prints_every_run_in_order_and_writes_nothing(tmp_path):
    path = protocol_file(tmp_path, seeds=[0, 1])
    before = sorted(tmp_path.rglob("*"))
    result = tepo_protocol(tmp_path, str(path), "--list", timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "grpo_seed0",
        "tepo_seed0",
        "grpo_seed1",
        "tepo_seed1",
    ]
    assert lines[0] == f"grpo_seed0: {' '.join(SMOKE)} algo=grpo seed=0 trainer.eval_before=true"
    assert lines[3].endswith("algo=tepo seed=1 trainer.eval_before=false")
    only = tepo_protocol(tmp_path, str(path), "--list", "--only", "^tepo", timeout=60)
    assert [line.split(":")[0] for line in only.stdout.splitlines()] == ["tepo_seed0", "tepo_seed1"]
    assert sorted(tmp_path.rglob("*")) == before


def test_status_says_where_each_run_stands_and_nothing_of_its_outcomes(tmp_path):
    path = protocol_file(tmp_path, seeds=[0, 1])
    results, runs = path.parent / "runs", tmp_path / "ckpts"
    records = [{"step": 1, "reward_mean": 0.25, "step_seconds": 12.3}]
    records += [{"step": 2, "reward_mean": 0.5, "step_seconds": 7.6}]

    def run_dir(root: Path, name: str, state: str, steps: int) -> Path:
        folder = root / name
        folder.mkdir(parents=True)
        lines = [json.dumps(r) for r in records[:steps]] + [json.dumps({"warmup_step": 0})]
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (folder / "eval.jsonl").write_text(json.dumps({"step": 0, "accuracy": 0.625}) + "\n")
        status = {"state": state, "pid": 1, "hostname": "elsewhere"}
        (folder / "status.json").write_text(json.dumps(status))
        return folder

    run_dir(results, "grpo_seed0", "finished", 2)
    interrupted = run_dir(runs, "tepo_seed0", "interrupted", 1)
    (interrupted / "checkpoints" / "step_00000001").mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    result = tepo_protocol(tmp_path, str(path), "--status", "--runs-dir", str(runs), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"grpo_seed0: published in {results / 'grpo_seed0'} (2 steps)",
        f"tepo_seed0: interrupted in {interrupted}, step 1 of 2 logged, newest checkpoint "
        "step 1, that step took 12 s, under a minute of steps left at the median pace of its "
        "last 1",
        "grpo_seed1: not started",
        "tepo_seed1: not started",
        "1 of 4 runs published; about 1 min of training steps left (the run in progress at its "
        "recent pace, 2 not started at the median of the 1 published), evaluations aside",
    ]
    assert "0.25" not in result.stdout and "0.625" not in result.stdout  # no outcome is read out
    assert sorted(tmp_path.rglob("*")) == before


def test_status_says_the_time_left_from_the_median_of_the_last_ten_steps():
    """Steps 1-12 of 100: the last ten took 60 s but one paused one (2,000 s); the median, 60 s,
    times the 88 steps left is 88 min. Without step seconds, or at the last step, nothing."""
    from tepo_cli.protocol.run_progress import time_left as _time_left

    steps = [{"step": s, "step_seconds": 2000.0 if s == 7 else 60.0} for s in range(1, 13)]
    assert _time_left(steps, ["100"]) == (
        ", about 1 h 28 min of steps left at the median pace of its last 10"
    )
    assert _time_left([{"step": 3}], ["100"]) == ""
    assert _time_left([{"step": 100, "step_seconds": 9.0}], ["100"]) == ""
    assert _time_left(steps, []) == ""


def test_status_closes_with_the_time_left_in_all():
    """Published runs took 3,000, 3,600 and 4,000 s of steps: two not started at the median
    (3,600 s) and the run in progress's 1,800 s are 2 h 30 min. Before any run is published the
    runs not started are not guessed at; with nothing left only the count is said."""
    from tepo_cli.protocol.run_progress import total_left

    assert total_left([3000.0, 4000.0, 3600.0], 1800.0, 2, 6) == (
        "3 of 6 runs published; about 2 h 30 min of training steps left (the run in progress at "
        "its recent pace, 2 not started at the median of the 3 published), evaluations aside"
    )
    assert total_left([], 1800.0, 3, 4) == (
        "0 of 4 runs published; the 3 not started are estimated once a run is published"
    )
    assert total_left([3000.0], 0.0, 1, 2) == (
        "1 of 2 runs published; about 50 min of training steps left (1 not started at the median "
        "of the 1 published), evaluations aside"
    )
    assert total_left([3000.0, 3000.0], 0.0, 0, 2) == "2 of 2 runs published"


def test_status_counts_the_evaluations_left_at_their_own_pace(tmp_path, capsys):
    """A published run took 100 s of steps and two evaluations of 50 s; the run in progress is at
    step 24 of 100 (20 s a step) with its evaluations at steps 10 and 20 done (60 and 70 s): its
    config plans one every 10 steps and one after the last, so 8 are left at its own median, 65 s:
    76 x 20 + 8 x 65 = 2,040 s; each of the two runs not started is the published one's 200 s
    (2,440 s in all).
    Only seconds are read out: no accuracy."""
    from tepo_cli.protocol.run_progress import evaluations_left, print_status

    results, runs = tmp_path / "runs", tmp_path / "ckpts"

    def folder(root: Path, name: str, steps: int, evals: dict[int, float], state: str) -> Path:
        path = root / name
        path.mkdir(parents=True)
        rows = [
            {"step": s, "reward_mean": 0.375, "step_seconds": 20.0} for s in range(1, steps + 1)
        ]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        marks = [{"step": s, "accuracy": 0.8125, "seconds": t} for s, t in evals.items()]
        (path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in marks))
        trainer = {"max_steps": 100, "eval_every": 10, "eval_before": False, "eval_after": True}
        (path / "config.yaml").write_text(yaml.safe_dump({"trainer": trainer}))
        (path / "status.json").write_text(json.dumps({"state": state, "pid": 1, "hostname": "x"}))
        return path

    folder(results, "grpo_seed0", 5, {50: 50.0, 100: 50.0}, "finished")
    running = folder(runs, "tepo_seed0", 24, {10: 60.0, 20: 70.0}, "interrupted")
    assert evaluations_left(running, 24) == [30, 40, 50, 60, 70, 80, 90, 100]
    assert evaluations_left(running, 20) == [30, 40, 50, 60, 70, 80, 90, 100]  # 20's is done
    planned = ["trainer.max_steps=100"]
    runs_list = [("grpo_seed0", planned), ("tepo_seed0", planned), ("grpo_seed1", planned)]
    runs_list += [("tepo_seed1", planned)]
    # the journal: tepo_seed0 is in its second try; grpo_seed1 tried once, its directory is gone
    events = [("tepo_seed0", "start"), ("tepo_seed0", "fail"), ("grpo_seed1", "start")]
    events += [("tepo_seed0", "resume")]
    journal_lines = [json.dumps({"run": run, "event": event}) + "\n" for run, event in events]
    (results / "journal.jsonl").write_text("".join(journal_lines))
    print_status(runs_list, runs, results)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith(
        "about 25 min of steps left at the median pace of its last 10, and 8 evaluations of "
        "about 65 s; its try 2 (journal)"
    )
    assert lines[2] == (
        "grpo_seed1: not started here; the journal has 1 earlier try of it, whose directory is "
        "gone, so it trains again from step 0"
    )
    assert lines[3] == "tepo_seed1: not started"
    assert lines[-1] == (
        "1 of 4 runs published; about 41 min of training steps and evaluations left (the run in "
        "progress at its recent pace, 2 not started at the median of the 1 published)"
    )
    assert "0.8125" not in "\n".join(lines) and "0.375" not in "\n".join(lines)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--only", "("], "--only '(' is not a regular expression"),
        (["--only", "mpo"], "--only 'mpo' matches none of the protocol's runs (grpo_seed0, tepo"),
    ],
)
def test_a_bad_only_is_refused_and_nothing_runs(tmp_path, args, expected):
    path = protocol_file(tmp_path)
    result = tepo_protocol(tmp_path, str(path), *args, timeout=60)
    assert result.returncode == 2 and expected in result.stderr
    assert not (tmp_path / "multirun").exists() and not (path.parent / "runs").exists()


def test_a_bad_protocol_file_is_refused_with_the_loaders_paragraph(tmp_path):
    path = protocol_file(tmp_path, alpha=2)
    result = tepo_protocol(tmp_path, str(path), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"tepo protocol run: Invalid protocol file {path}: alpha=2 is not allowed: input should "
        "be less than 1. Nothing was run."
    )


def test_another_commit_than_the_pinned_one_is_refused_unless_allowed_and_then_journaled(
    tmp_path,
):
    path = protocol_file(tmp_path, commit="0000000")
    results = path.parent / "runs"
    refused = tepo_protocol(tmp_path, str(path), timeout=60)
    assert refused.returncode == 2
    assert "pins commit 0000000, but the code that would train is at" in refused.stderr
    assert "--allow-commit-mismatch" in refused.stderr and "Nothing was run." in refused.stderr
    assert not results.exists() and not (tmp_path / "multirun").exists()
    # both runs published already: the allowed mismatch is journaled, nothing trains
    for name in ("grpo_seed0", "tepo_seed0"):
        (results / name).mkdir(parents=True)
        (results / name / "status.json").write_text('{"state": "finished"}')
    allowed = tepo_protocol(tmp_path, str(path), "--allow-commit-mismatch", timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.count("finished and published already, skipped") == 2
    (entry,) = journal(results)
    assert entry["event"] == "commit_mismatch" and entry["pinned"] == "0000000"
    assert entry["commit"] == code_checkout().commit


def test_a_protocol_edited_after_its_runs_started_is_refused_unless_allowed_and_journaled(tmp_path):
    path = protocol_file(tmp_path)
    results = path.parent / "runs"
    results.mkdir()
    earlier = {"time": "2026-11-28T01:00:00+00:00", "run": "grpo_seed0", "event": "start"}
    (results / "journal.jsonl").write_text(json.dumps({**earlier, "protocol_sha256": "ab"}) + "\n")
    result = tepo_protocol(tmp_path, str(path), timeout=60)
    assert result.returncode == 2
    assert f"{path} changed since its runs started (2026-11-28T01:00:00+00:00" in result.stderr
    assert "--allow-protocol-change" in result.stderr
    assert len(journal(results)) == 1 and not (tmp_path / "multirun").exists()
    for name in ("grpo_seed0", "tepo_seed0"):  # published: nothing would train
        (results / name).mkdir(parents=True)
        (results / name / "status.json").write_text('{"state": "finished"}')
    allowed = tepo_protocol(tmp_path, str(path), "--allow-protocol-change", timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    change = journal(results)[1]
    assert change["event"] == "protocol_changed" and change["previous_sha256"] == "ab"
    assert change["protocol_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # the change is the new registration: the next invocation goes on without the flag
    assert tepo_protocol(tmp_path, str(path), timeout=60).returncode == 0


def test_other_processes_cores_are_the_machines_busy_time_less_the_runs_own():
    assert others_cores(busy=30.0, own=10.0, wall=10.0) == 2.0  # two other cores busy
    assert others_cores(busy=9.9, own=10.0, wall=10.0) == 0.0  # clocks read apart: never < 0
    assert others_cores(busy=25.0, own=20.0, wall=0.0) == 0.0
    assert others_cores(busy=13.0, own=10.0, wall=4.0) == 0.75


PAUSED_CHILD = """
import sys, time
from tepo_cli.protocol.journal import CpuShare
share = CpuShare(tick=0.1, pause_gap=1.0)
print("sampling", flush=True)
sys.stdin.readline()  # the parent stops this process, waits, continues it, then writes a line
print(share.paused_seconds, share.paused.busy, flush=True)
"""


def test_a_run_stopped_with_sigstop_counts_as_paused_not_as_sharing():
    """A process stopped for 3 s while another burns a core: the 3 s are paused time, and the
    burnt core-seconds are the pause's, not sharing (other work on the machine only adds)."""
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSED_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "sampling"
    time.sleep(0.3)
    child.send_signal(signal.SIGSTOP)
    burn_until = time.monotonic() + 3.0
    while time.monotonic() < burn_until:  # one core busy while the child is stopped
        pass
    child.send_signal(signal.SIGCONT)
    time.sleep(0.3)
    paused, busy_in_pause = map(float, child.communicate("go\n", timeout=30)[0].split())
    assert 2.5 <= paused <= 4.5, paused
    assert busy_in_pause >= 2.0, busy_in_pause  # the burning core's seconds fell in the pause


@pytest.mark.slow
def test_dry_run_validates_every_runs_config_and_names_the_invalid_one(tmp_path):
    path = protocol_file(tmp_path, arms={"grpo": ["algo=grpo"], "tepo": ["algo.eps_high=-1"]})
    result = tepo_protocol(tmp_path, str(path), "--dry-run", timeout=120)
    assert result.returncode == 2
    assert "grpo_seed0: valid" in result.stdout
    assert "tepo_seed0: invalid (exit 2)" in result.stdout and "algo.eps_high" in result.stdout
    assert "1 of 2 runs have an invalid config (tepo_seed0)" in result.stderr
    assert not (tmp_path / "multirun").exists() and not (path.parent / "runs").exists()


@pytest.mark.slow
def test_runs_crash_resume_publish_and_are_skipped_once_published(tmp_path):
    path = protocol_file(tmp_path, commit=code_checkout().commit)
    runs, results = tmp_path / "multirun" / "smoke", path.parent / "runs"
    # the first run SIGKILLs itself in step 2's update (after step 1's checkpoint)
    crashed = tepo_protocol(tmp_path, str(path), env={"TEPO_FAULT": "update:2"})
    assert crashed.returncode == 137, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert "grpo_seed0 did not finish (exit 137); the runs after it did not start" in (
        crashed.stderr
    )
    assert not (runs / "tepo_seed0").exists() and not (results / "grpo_seed0").exists()
    start, fail = journal(results)
    assert (start["run"], start["event"]) == ("grpo_seed0", "start")
    assert (fail["event"], fail["exit_code"], fail["last_checkpoint"]) == ("fail", 137, 1)
    assert fail["state"] == "crashed" and fail["cpus"] == os.cpu_count()
    assert start["commit"] == code_checkout().commit and start["time"].endswith("+00:00")
    assert start["cpu"] == fail["cpu"] == cpu_model()  # which processor each event ran on

    # its run directory gone (a fresh machine): trained again from step 0, said and journaled
    shutil.move(runs / "grpo_seed0", tmp_path / "lost")
    crashed = tepo_protocol(tmp_path, str(path), env={"TEPO_FAULT": "update:2"})
    assert crashed.returncode == 137, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert "the journal has 1 earlier try of it: its checkpoints are gone" in crashed.stdout
    restart = journal(results)[2]
    assert (restart["event"], restart["earlier_tries"]) == ("start", 1)
    assert "earlier_tries" not in start

    # under a scheduler's wall time: each run gets what is left as its own limit (ample here)
    again = tepo_protocol(tmp_path, str(path), "--time-limit", "600")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resuming" in again.stdout and "after step 1" in again.stdout
    events = [(e["run"], e["event"]) for e in journal(results)[4:]]
    assert events == [
        ("grpo_seed0", "resume"),
        ("grpo_seed0", "finish"),
        ("tepo_seed0", "start"),
        ("tepo_seed0", "finish"),
    ]
    resume, finish, start = journal(results)[4:7]
    assert resume["after_step"] == 1 and finish["steps"] == 2
    # what is left, journaled to 0.01 min: the first run's may round up to the whole 600
    assert 590 < start["time_limit_minutes"] <= resume["time_limit_minutes"] <= 600
    for name in ("grpo_seed0", "tepo_seed0"):
        published = results / name
        assert json.loads((published / "status.json").read_text())["state"] == "finished"
        steps = [json.loads(line)["step"] for line in (published / "metrics.jsonl").open()]
        assert steps == [1, 2]  # the resumed run counts step 2 once
        overrides = yaml.safe_load((published / ".hydra" / "overrides.yaml").read_text())
        limit = overrides.pop()  # the time left when it was started or resumed
        assert limit.startswith("trainer.time_limit_minutes=5") and float(limit[27:]) < 600
        arm = name.split("_")[0]
        first = "true" if arm == "grpo" else "false"
        assert overrides == [
            *SMOKE,
            f"algo={arm}",
            "seed=0",
            f"trainer.eval_before={first}",
            "resume=true",
        ]
        evaluations = [json.loads(line) for line in (published / "eval.jsonl").open()]
        answers = [json.loads(line) for line in (published / "eval_samples.jsonl").open()]
        assert len(answers) == sum(e["problems"] for e in evaluations) > 0
        assert {"config.yaml", "summary.json", "train.log", "console.log"} <= {
            p.name for p in published.iterdir()
        }
        assert not any(p.suffix in (".safetensors", ".pt") for p in published.rglob("*"))
        summary = json.loads((published / "summary.json").read_text())
        assert summary.get("resumed_after") == ([1] if arm == "grpo" else None)
        assert not (runs / name / "checkpoints").exists()

    # the step-0 evaluation ran once, in the first run only
    def evaluated(name: str) -> list[int]:
        return [json.loads(line)["step"] for line in (results / name / "eval.jsonl").open()]

    assert evaluated("grpo_seed0") == [0, 2] and evaluated("tepo_seed0") == [2]
    # the crashed attempt's console stays in the published console log, before the resume's
    console = (results / "grpo_seed0" / "console.log").read_text()
    assert console.index("step 1:") < console.index("after step 1")

    published = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    third = tepo_protocol(tmp_path, str(path))
    assert third.returncode == 0
    assert third.stdout.count("finished and published already, skipped") == 2
    assert {p: p.read_bytes() for p in results.rglob("*") if p.is_file()} == published

    # finished but not published (stopped between the two): tepo train skips it, it is published
    (results / "tepo_seed0" / "status.json").unlink()
    fourth = tepo_protocol(tmp_path, str(path))
    assert fourth.returncode == 0, fourth.stderr[-2000:]
    assert "nothing to resume, skipped" in fourth.stdout
    assert journal(results)[-2]["event"] == "publish" and journal(results)[-1]["event"] == "finish"
    assert (results / "tepo_seed0" / "status.json").is_file()


def test_no_run_starts_once_the_time_limit_is_spent(tmp_path):
    path = protocol_file(tmp_path)
    spent = tepo_protocol(tmp_path, str(path), "--time-limit", "0.001")
    assert spent.returncode == 128 + signal.SIGTERM, spent.stdout[-2000:] + spent.stderr[-2000:]
    assert "== --time-limit 0.001: no time left: grpo_seed0 and the runs after it wait for " in (
        spent.stdout
    )
    assert not (tmp_path / "multirun").exists() and not (path.parent / "runs").exists()
    for bad in ("0", "-1", "soon", "inf"):
        refused = tepo_protocol(tmp_path, str(path), "--time-limit", bad)
        assert refused.returncode == 2 and "is not a number of minutes (above 0)" in refused.stderr


def test_the_next_run_needs_two_steps_at_the_published_runs_median_pace_and_a_minute(
    tmp_path, capsys
):
    from tepo_cli.protocol.protocol_runner import _minutes_left
    from tepo_cli.protocol.spec import Run
    from tepo_cli.runtime.time_limit import TimeLimit

    results = tmp_path / "runs"
    for name, seconds in (("a_seed0", [50, 70, 60]), ("a_seed1", [40, 200])):
        (results / name).mkdir(parents=True)
        steps = [{"step": i + 1, "step_seconds": s} for i, s in enumerate(seconds)]
        lines = [{"warmup": 1}, *steps]  # a record before the first step is no step
        (results / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    runs = [Run("a_seed0", []), Run("a_seed1", []), Run("a_seed2", [])]
    assert _minutes_left(None, runs, results, "a_seed2") is None  # no --time-limit
    # median step 60 s: 130 s left is enough, 110 s is not
    enough = TimeLimit(10.0, started=time.time() - 470.0)
    assert 2.1 < _minutes_left(enough, runs, results, "a_seed2") <= 130 / 60
    short = TimeLimit(10.0, started=time.time() - 490.0)
    assert _minutes_left(short, runs, results, "a_seed2") == 0.0
    said = capsys.readouterr().out
    assert (
        "== --time-limit 10: 1.8 min left, less than 2.0 min (two steps at the published " in said
    )
    # nothing published: a minute is enough, less is not
    assert _minutes_left(short, runs, tmp_path / "none", "a_seed0") > 0
    last = TimeLimit(10.0, started=time.time() - 545.0)
    assert _minutes_left(last, runs, tmp_path / "none", "a_seed0") == 0.0
    assert "0.9 min left, less than 1.0 min (two steps at " in capsys.readouterr().out


def test_a_pilot_replaces_the_seed_and_turns_off_evaluations_and_checkpoints():
    from tepo_cli.protocol.pilot import pilot_overrides
    from tepo_cli.protocol.spec import Run

    run = Run("grpo_seed0", [*SMOKE, "algo=grpo", "seed=0", "trainer.eval_before=true"])
    overrides = pilot_overrides(run, 1000, Path("/tmp/p"))
    keys = [o.split("=", 1)[0] for o in overrides]
    assert len(keys) == len(set(keys))  # Hydra refuses a key given twice
    assert {"seed=1000", "trainer.eval_before=false", "trainer.eval_every=0",
            "trainer.save_every=0", "hydra.run.dir=/tmp/p"} <= set(overrides)  # fmt: skip
    assert "trainer.max_steps=2" in overrides and "algo=grpo" in overrides  # the rest as registered


@pytest.mark.slow
def test_a_pilot_trains_each_arm_at_another_seed_says_only_seconds_and_memory_and_leaves_no_run(
    tmp_path,
):
    path, runs = protocol_file(tmp_path), tmp_path / "runs"
    results = path.parent / "runs"
    result = tepo_protocol(tmp_path, str(path), "--pilot", "1", "--runs-dir", str(runs))
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    for arm in ("grpo", "tepo"):
        line = next(line for line in result.stdout.splitlines() if line.startswith(f"{arm}: "))
        assert line.startswith(f"{arm}: pilot of {arm}_seed0 at seed 1000; a step ")
        assert "peak RSS" in line
    assert "at these paces, 2 of the 2 selected runs need" in result.stdout
    assert "reward" not in said and "acc " not in said  # no outcome of any step is shown
    assert not runs.exists() or not any(runs.iterdir())  # no run directory, no pilot left
    pilots = [e for e in journal(results) if e["event"] == "pilot"]
    assert [(e["run"], e["arm"], e["seed"], e["exit_code"]) for e in pilots] == [
        ("*", "grpo", 1000, 0), ("*", "tepo", 1000, 0)
    ]  # fmt: skip
    assert all(e["median_step_seconds"] > 0 and e["peak_rss_mb"] > 0 for e in pilots)
    status = tepo_protocol(tmp_path, str(path), "--status", "--runs-dir", str(runs), timeout=60)
    assert "grpo_seed0: not started" in status.stdout and "tepo_seed0: not started" in status.stdout
    from tepo_cli.eval.report.run_history import experiment_events

    assert experiment_events([journal(results)])[0].endswith(
        "UTC: a pilot of arm grpo: grpo_seed0's command at seed 1000 until step 1, not evaluated, "
        "only its seconds and memory read (--pilot; exit 0)"
    )


@pytest.mark.slow
def test_a_pilot_that_dies_says_which_keeps_its_console_and_exits_non_zero(tmp_path):
    path, runs = protocol_file(tmp_path), tmp_path / "runs"
    args = [str(path), "--pilot", "1", "--runs-dir", str(runs), "--only", "^grpo_"]
    result = tepo_protocol(tmp_path, *args, env={"TEPO_FAULT": "update:1"})
    assert result.returncode == 128 + signal.SIGKILL, result.stderr[-3000:]
    console = runs / ".pilot" / "grpo.console.log"
    assert (
        f"the pilot of grpo_seed0 ended (exit {128 + signal.SIGKILL}) after 0 of 1 steps. "
        f"Its console: {console}"
    ) in result.stderr
    assert console.is_file() and "reward" not in result.stdout + result.stderr
    assert "no estimate (no pilot finished" in result.stdout
    (pilot,) = [e for e in journal(path.parent / "runs") if e["event"] == "pilot"]
    assert pilot["exit_code"] == 128 + signal.SIGKILL


def test_a_pilot_reads_only_seconds_and_memory_a_warm_up_included(tmp_path):
    from tepo_cli.protocol.pilot import _measured, _measured_said

    records = [
        {"mtp_warmup_seconds": 2.7, "mtp_warmup_loss": 9.0},  # MPO's warm-up, cumulative seconds
        {"mtp_warmup_seconds": 121.0, "mtp_warmup_loss": 4.0},
        {"step": 1, "step_seconds": 48.9, "peak_rss_mb": 7217.0, "reward_mean": 0.5},
        {"step": 2, "step_seconds": 46.8, "peak_rss_mb": 7369.7, "reward_mean": 0.25},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    found = _measured(tmp_path)
    assert found == pytest.approx({
        "warmup_seconds": 121.0, "median_step_seconds": (48.9 + 46.8) / 2, "min_step_seconds": 46.8,
        "max_step_seconds": 48.9, "peak_rss_mb": 7369.7,
    })  # fmt: skip
    assert _measured_said("mpo_k5_seed10", 1014, found) == (
        "pilot of mpo_k5_seed10 at seed 1014; warm-up 121 s; a step 47–49 s (median 48 s); "
        "peak RSS 7.2 GB"
    )
