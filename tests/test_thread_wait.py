"""How long torch's idle threads spin (tepo_cli/runtime/thread_wait.py): fewer spins only where
other threads hold at least half the cores when a command starts, never over the user's choice,
said once, after the config is accepted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tepo_cli.core import busy
from tepo_cli.runtime import thread_wait


def _loadavg(tmp_path: Path, running: int) -> Path:
    path = tmp_path / "loadavg"
    path.write_text(f"2.51 2.68 2.56 {running}/135 7702\n")
    return path


@pytest.mark.parametrize(("running", "cores", "expected"), [(3, 2, 2), (2, 2, 1), (1, 2, None)])
def test_busy_threads_counts_the_others_running_against_half_the_cores(
    tmp_path, monkeypatch, running, cores, expected
):
    monkeypatch.setattr(busy, "LOADAVG", _loadavg(tmp_path, running))
    monkeypatch.setattr(busy, "machine_cores", lambda: cores)
    monkeypatch.setattr(thread_wait, "available_cores", lambda: cores)
    assert thread_wait.busy_threads() == expected


def test_a_process_on_one_core_is_never_busy(tmp_path, monkeypatch):
    """Its pool has one thread, which waits for no other: nothing to change."""
    monkeypatch.setattr(busy, "LOADAVG", _loadavg(tmp_path, 9))
    monkeypatch.setattr(busy, "machine_cores", lambda: 2)
    monkeypatch.setattr(thread_wait, "available_cores", lambda: 1)
    assert thread_wait.busy_threads() is None


@pytest.mark.parametrize(("running", "expected"), [([1, 1, 4, 1, 1], None), ([3, 1, 3, 1, 3], 2)])
def test_busy_threads_takes_the_median_of_its_reads(tmp_path, monkeypatch, running, expected):
    """A blip (another program's thread for one read) does not make the machine busy; a job that
    runs through most reads does."""
    reads = iter(running)
    path = tmp_path / "loadavg"
    path.write_text(f"0 0 0 {next(reads)}/9 1")
    monkeypatch.setattr(busy, "LOADAVG", path)
    monkeypatch.setattr(busy, "machine_cores", lambda: 2)
    monkeypatch.setattr(thread_wait, "available_cores", lambda: 2)
    monkeypatch.setattr(busy.time, "sleep", lambda _: path.write_text(f"0 0 0 {next(reads)}/9 1"))
    assert thread_wait.busy_threads() == expected


def test_busy_threads_is_none_without_proc_loadavg(tmp_path, monkeypatch):
    monkeypatch.setattr(busy, "LOADAVG", tmp_path / "absent")
    monkeypatch.setattr(thread_wait, "available_cores", lambda: 2)
    assert thread_wait.busy_threads() is None


def test_a_busy_machine_gets_fewer_spins_and_a_start_line():
    environ: dict[str, str] = {}
    thread_wait.settle(environ, others=2, torch_loaded=False)
    assert environ["GOMP_SPINCOUNT"] == "1000"
    line = thread_wait.start_line(environ)
    assert line is not None and line.startswith(
        "the machine is busy (2 other threads running on its"
    )
    assert "GOMP_SPINCOUNT sets it" in line


@pytest.mark.parametrize(
    ("environ", "others", "torch_loaded"),
    [
        ({}, None, False),  # idle: nothing changes
        ({"GOMP_SPINCOUNT": "300000"}, 2, False),  # the user's choice wins
        ({"OMP_WAIT_POLICY": "ACTIVE"}, 2, False),
        ({}, 2, True),  # torch's OpenMP read its variables already
    ],
)
def test_nothing_is_set_or_said_otherwise(environ, others, torch_loaded):
    before = dict(environ)
    thread_wait.settle(environ, others=others, torch_loaded=torch_loaded)
    assert environ == before
    assert thread_wait.start_line(environ) is None


def _tepo_on_a_busy_machine(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """`tepo ARGS` in a fresh interpreter on a 2-core machine whose /proc/loadavg has three threads
    running (this one and two others), without the suite's GOMP_SPINCOUNT (tests/conftest.py).
    The host allocator's re-exec runs the same code again."""
    code = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from tepo_cli.core import busy
        from tepo_cli.runtime import thread_wait
        busy.LOADAVG = Path({str(_loadavg(tmp_path, 3))!r})
        busy.machine_cores = thread_wait.available_cores = lambda: 2
        from tepo_cli.cli import main
        try:
            main({args!r})
        finally:
            print("GOMP_SPINCOUNT=" + os.environ.get("GOMP_SPINCOUNT", "unset"), file=sys.stderr)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_refused_command_on_a_busy_machine_says_its_paragraph_only(tmp_path):
    result = _tepo_on_a_busy_machine(tmp_path, ["train", "trainer.lr=-1"])
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("tepo train:")]
    assert len(lines) == 1 and "trainer.lr=-1 is not allowed" in lines[0], result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "args"),
    [
        (
            "train",
            [
                "model=tiny",
                "trainer.max_steps=1",
                "trainer.eval_before=false",
                "trainer.eval_after=false",
                "trainer.progress=false",
                "hydra.run.dir=run",
            ],
        ),
        ("eval", ["model=tiny", "benchmark.eval_size=2", "hydra.run.dir=eval"]),
    ],
)
def test_a_job_on_a_busy_machine_says_so_once_and_its_threads_spin_less(tmp_path, command, args):
    result = _tepo_on_a_busy_machine(tmp_path, [command, *args])
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "the machine is busy" in line]
    assert said == [
        f"tepo {command}: the machine is busy (2 other threads running on its 2 cores): torch's idle "
        "threads spin 1,000 times before they sleep, not OpenMP's 300,000, so that they do not "
        "hold cores another job's threads wait for (GOMP_SPINCOUNT sets it; the numbers are the "
        "same either way)"
    ]
    assert result.stderr.rstrip().endswith("GOMP_SPINCOUNT=1000")
