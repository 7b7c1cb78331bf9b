"""No rank outlives its `tepo train`, whatever kills it, and a run directory has one writer
(tepo_cli/runtime/lifetime.py, tepo_cli/runtime/run_lock.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_files import WEIGHTS_FILES, comparable_metrics

from tepo_cli.runtime.lifetime import PARENT_ENV
from tepo_cli.runtime.run_lock import LOCK_NAME, RunDirInUse, check_run_dir_free, hold_run_dir

STEPS = 3


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_a_second_holder_is_refused_with_the_pid_and_a_killed_holder_leaves_no_lock(tmp_path):
    lock = hold_run_dir(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(RunDirInUse) as refused:
        hold_run_dir(tmp_path)  # another open file description: refused even in this process
    message = str(refused.value)
    assert f"PID {os.getpid()}" in message and str(tmp_path) in message and "\n" not in message
    lock.release()
    hold_run_dir(tmp_path).release()
    # held by another process, then that process SIGKILLed: no stale lock
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from tepo_cli.runtime.run_lock import hold_run_dir; "
            f"hold_run_dir(Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(RunDirInUse, match=f"PID {holder.pid}"):
        hold_run_dir(tmp_path)
    with pytest.raises(RunDirInUse, match=f"PID {holder.pid}"):  # the CLI's check before Hydra
        check_run_dir_free(["model=tiny", f"hydra.run.dir={tmp_path}", "resume=true"])
    check_run_dir_free(["-m", f"hydra.run.dir={tmp_path}"])  # a sweep: checked in each job
    holder.kill()
    holder.wait()
    check_run_dir_free([f"hydra.run.dir={tmp_path}"])
    hold_run_dir(tmp_path).release()


def test_a_rank_ends_the_moment_its_train_process_ends(tmp_path):
    """The rank's watch (a pidfd of `tepo train`, from TEPO_TRAIN_PID) ends the rank and its
    parent (DeepSpeed's `launch`) at once when `tepo train` is SIGKILLed."""
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rank_code = (
        "import time; from tepo_cli.runtime.lifetime import follow_train_process; "
        "assert follow_train_process() is not None; print('following', flush=True); "
        "time.sleep(60)"
    )
    launch = subprocess.Popen(  # a stand-in for `launch`: starts the rank, outlives it
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"rank = subprocess.Popen([sys.executable, '-c', {rank_code!r}]); "
            "print(rank.pid, flush=True); time.sleep(60)",
        ],
        env={**os.environ, PARENT_ENV: str(parent.pid)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        rank = int(launch.stdout.readline())
        assert launch.stdout.readline() == "following\n"
        assert launch.poll() is None and not _gone_within(rank, 0.2)
        parent.kill()
        parent.wait()
        assert launch.wait(timeout=5) == -signal.SIGKILL
        assert _gone_within(rank, 5)
    finally:
        for process in (parent, launch):
            process.kill()
            process.wait()
    # already gone when the rank starts: it ends at once
    late = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tepo_cli.runtime.lifetime import follow_train_process; "
            "follow_train_process(); import time; time.sleep(60)",
        ],
        env={**os.environ, PARENT_ENV: str(parent.pid)},
        timeout=60,
    )
    assert late.returncode == -signal.SIGKILL


def test_the_launcher_dies_with_its_parent(tmp_path):
    """die_with_parent (the launcher's preexec_fn): the parent SIGKILLed, its child goes too."""
    pid_file = tmp_path / "child"
    middle = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; from tepo_cli.runtime.lifetime import die_with_parent; "
            "child = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent, "
            "start_new_session=True); "
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)",
        ]
    )
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(pid_file.read_text())
    assert not _gone_within(child, 0.2)
    middle.kill()
    middle.wait()
    assert _gone_within(child, 5)


def _args(tmp: Path, run_dir: Path) -> list[str]:
    reward = tmp / "parity.py"
    reward.write_text("def score(completion, problem):\n    return len(completion) % 2 == 0\n")
    return [
        "trainer.nproc=2",
        "model=tiny",
        f"trainer.max_steps={STEPS}",
        "trainer.save_every=1",
        "trainer.keep_checkpoints=3",
        "trainer.progress=false",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.num_threads=1",
        "reward=custom",
        f"reward.path={reward}",
        f"hydra.run.dir={run_dir}",
    ]


def _tepo(args: list[str], cwd: Path, fault: str = "", **popen) -> subprocess.Popen:
    # The ranks run under the `deepspeed` script's interpreter, which may be another environment's
    # (with another checkout of tepo installed): a `deepspeed` first on PATH that runs DeepSpeed's
    # runner under this interpreter makes the ranks run the code under test.
    launcher = cwd / "bin" / "deepspeed"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m deepspeed.launcher.runner "$@"\n')
    launcher.chmod(0o755)
    path = os.pathsep.join([str(launcher.parent), os.environ.get("PATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=cwd,
        env=dict(os.environ, TEPO_FAULT=fault, PATH=path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def _finish(process: subprocess.Popen, timeout: float = 400) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        process.kill()
    assert process.returncode == 0, output[-3000:]
    return output


def _run_processes(run_dir: Path) -> list[str]:
    """Live processes with the run directory on their command line (tepo, launcher, ranks)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(run_dir) in cmdline and state != "Z":
            found.append(cmdline)
    return found


@pytest.mark.slow
def test_a_two_rank_run_whose_group_is_sigkilled_leaves_nothing_and_resumes_exactly(tmp_path):
    """`kill -KILL -- -PGID` of a 2-rank CPU run's group (a scheduler's kill): within 5 s no
    launcher or rank is left; while it lived a second `tepo train` on its directory was refused
    naming its PID; `resume=true` then ends it as the uninterrupted run, step for step and byte
    for byte."""
    reference_dir = tmp_path / "reference" / "run"
    reference_dir.parent.mkdir()
    _finish(_tepo(_args(reference_dir.parent, reference_dir), reference_dir.parent))

    work = tmp_path / "killed"
    work.mkdir()
    run_dir = work / "run"
    args = _args(work, run_dir)
    # Its own group, as under a scheduler. Both ranks stop at the start of step 2 (in no
    # collective, step 1's checkpoint written) and wait there, so the run is surely alive, mid-way,
    # when the second command and the kill come, however slow this machine is.
    process = _tepo(args, work, fault="hang:2", start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "step_00000001").is_dir():
            assert process.poll() is None and time.monotonic() < deadline, process.poll()
            time.sleep(0.05)
        second = _tepo([*args, "resume=true"], work)
        refused, _ = second.communicate(timeout=120)
        assert second.returncode == 2, refused[-3000:]
        assert f"is in use by a live `tepo train` (PID {process.pid}," in refused
        assert len(_run_processes(run_dir)) >= 3  # tepo train, the launcher, the ranks
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 5
        while _run_processes(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _run_processes(run_dir), _run_processes(run_dir)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert len(metrics.read_text().splitlines()) == 1  # killed mid-run, after step 1

    _finish(_tepo([*args, "resume=true"], work))
    ours, theirs = comparable_metrics(run_dir), comparable_metrics(reference_dir)
    assert [m["step"] for m in ours] == list(range(1, STEPS + 1)) and ours == theirs
    for weights in WEIGHTS_FILES:
        if (reference_dir / weights).exists() or (run_dir / weights).exists():
            assert (run_dir / weights).read_bytes() == (reference_dir / weights).read_bytes()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


def test_a_two_rank_run_stops_together_at_its_time_limit(tmp_path):
    """trainer.time_limit_minutes on two ranks: the clock is the launching `tepo train`'s, both
    ranks agree to stop after step 1 (each writes its part of the checkpoint), and the job exits
    128 + SIGTERM saying why."""
    run_dir = tmp_path / "run"
    args = [*_args(tmp_path, run_dir), "trainer.save_every=0", "trainer.time_limit_minutes=0.001"]
    process = _tepo(args, tmp_path)
    output, _ = process.communicate(timeout=400)
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "trainer.time_limit_minutes=0.001: stopped after step 1, " in output
    assert "Traceback" not in output
    manifest = json.loads((run_dir / "checkpoints/step_00000001/manifest.json").read_text())
    assert {"rank_00000.pt", "rank_00001.pt"} <= set(manifest["files"])
    assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted"
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
