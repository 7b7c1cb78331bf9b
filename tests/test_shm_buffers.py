"""DeepSpeed's /dev/shm all-reduce buffers (tepo_cli/runtime/shm_buffers.py): those of a launch
killed outright are removed by the next multi-rank start; a live run's, or a young one, never."""

from __future__ import annotations

import mmap
import os
import signal
import time
from pathlib import Path

import pytest
from test_ranks_collectives import leftovers, run_processes, tepo, two_zero3_ranks

from tepo_cli.runtime.shm_buffers import (
    MIN_AGE_S,
    PREFIX,
    SHM,
    _mapped_names,
    remove_stale_shm_buffers,
)

UID = os.getuid()


def buffer(shm: Path, port: int, rank: int, age_s: float) -> Path:
    path = shm / f"{PREFIX}_{UID}_127.0.0.1_{port}_{rank}"
    path.write_bytes(b"\0" * 4096)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_only_old_unmapped_buffers_of_this_user_go(tmp_path):
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    (proc / "123").mkdir(parents=True)
    (proc / "self").mkdir()
    dead = [buffer(shm, 5000, rank, 3600) for rank in (0, 1)]
    live = buffer(shm, 6000, 0, 3600)
    young = buffer(shm, 7000, 0, 1)
    other_user = shm / f"{PREFIX}_{UID + 1}_127.0.0.1_5000_0"
    other_user.write_bytes(b"x")
    os.utime(other_user, (0, 0))
    (proc / "123" / "maps").write_text(
        f"7f00-7f01 rw-s 00000000 00:1a 42  /dev/shm/{live.name}\n"
        "7f02-7f03 r-xp 00000000 08:01 7  /usr/lib/libc.so.6\n"
    )
    assert remove_stale_shm_buffers(shm, proc) == dead
    assert sorted(shm.iterdir()) == sorted([live, young, other_user])


@pytest.mark.slow
def test_a_launch_killed_outright_leaves_buffers_the_next_start_removes(tmp_path):
    """A real 2-rank CPU run, every process of it SIGKILLed at once (a lost node, the OOM killer):
    its buffers stay behind; the sweep the next start runs removes them and keeps a mapped one."""
    pattern = f"{PREFIX}_{UID}_*"
    before = set(SHM.glob(pattern))
    run_dir = tmp_path / "run"
    args = [*two_zero3_ranks(run_dir), "trainer.max_steps=500", "trainer.eval_before=false"]
    process = tepo(args, cwd=tmp_path)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not set(SHM.glob(pattern)) - before:
            time.sleep(0.5)
        left = set(SHM.glob(pattern)) - before
        assert left, "the run made no shared-memory buffer"
        time.sleep(2)  # both ranks have mapped theirs
        for pid in list(run_processes(run_dir)):
            os.kill(pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=60)
    deadline = time.time() + 60  # killed processes unmap their memory as they are torn down
    while time.time() < deadline and (
        list(run_processes(run_dir)) or _mapped_names(Path("/proc")) & {path.name for path in left}
    ):
        time.sleep(0.5)
    assert not leftovers(run_dir)
    left = set(SHM.glob(pattern)) - before
    assert left, "SIGKILL left nothing behind: nothing to test"
    old = time.time() - MIN_AGE_S - 5
    for path in left:
        os.utime(path, (old, old))
    live = buffer(SHM, 1, 0, MIN_AGE_S + 5)
    try:
        with live.open("r+b") as handle, mmap.mmap(handle.fileno(), 4096):
            removed = set(remove_stale_shm_buffers())
            assert left <= removed and live not in removed and live.exists()
    finally:
        live.unlink(missing_ok=True)
    assert not (set(SHM.glob(pattern)) & left)
