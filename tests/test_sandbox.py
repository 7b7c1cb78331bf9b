"""Sandbox behaviour on well-behaved programs: API, environment, isolation choice, pool, clean-up.

Hostile programs are in test_sandbox_hostile.py.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import tempfile
import time

import pytest

from tepo_cli.rewards.sandbox import (
    FALLBACK,
    REASONS,
    STRONG,
    Program,
    SandboxConfig,
    SandboxLimits,
    SandboxUnavailableError,
    _launcher,
    clear_probe_cache,
    isolation,
    reaper,
    result,
    run_many,
    run_program,
)
from tepo_cli.rewards.sandbox.environment import sandbox_env

IS_ROOT = os.geteuid() == 0


@functools.cache
def _strong_available() -> bool:
    try:
        run_program("pass", config=SandboxConfig(isolation="strong"))
    except SandboxUnavailableError:
        return False
    return True


@pytest.fixture(params=[STRONG, FALLBACK])
def level(request: pytest.FixtureRequest) -> str:
    if request.param == STRONG and not _strong_available():
        if os.environ.get("TEPO_REQUIRE_STRONG_SANDBOX"):
            pytest.fail("strong sandbox required (TEPO_REQUIRE_STRONG_SANDBOX) but unavailable")
        pytest.skip("strong sandbox (bubblewrap namespaces) unavailable on this machine")
    return request.param


def _config(level: str, **limits: float) -> SandboxConfig:
    return SandboxConfig(isolation=level, limits=SandboxLimits(**limits))  # type: ignore[arg-type]


def test_runs_a_program_with_stdin(level: str) -> None:
    res = run_program("print(input()[::-1])", stdin="abc\n", config=_config(level))
    assert res.passed and res.reason == "ok"
    assert res.stdout == "cba\n" and res.stderr == ""
    assert res.exit_code == 0 and res.signal is None and not res.timed_out
    assert res.isolation == level
    assert 0 < res.cpu_time_s <= res.wall_time_s  # a Python start-up costs CPU time


def test_cpu_time_is_the_programs_own(level: str) -> None:
    """A 0.3 s busy loop is measured as at least that much CPU time; a 0.3 s sleep as far less."""
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    idle = "import time\ntime.sleep(0.3)"
    spent = run_program(busy, config=_config(level)).cpu_time_s
    slept = run_program(idle, config=_config(level))
    assert spent >= 0.3 and slept.wall_time_s >= 0.3 and slept.cpu_time_s < spent - 0.2


def test_exit_codes_and_exceptions_are_reported(level: str) -> None:
    res = run_program("import sys; sys.exit(3)", config=_config(level))
    assert (res.passed, res.reason, res.exit_code) == (False, "exit-code", 3)
    res = run_program("raise ValueError('boom')", config=_config(level))
    assert (res.reason, res.exit_code) == ("exit-code", 1)
    assert "ValueError: boom" in res.stderr


def test_success_marker_must_be_a_whole_line(level: str) -> None:
    marker = "MARK-" + secrets.token_hex(4)
    ok = run_program(f"print('x'); print({marker!r})", config=_config(level), success_marker=marker)
    assert ok.passed
    partial = run_program(f"print('a' + {marker!r})", config=_config(level), success_marker=marker)
    assert not partial.passed and partial.reason == "marker-missing"


def test_environment_is_scrubbed_and_minimal(level: str) -> None:
    src = "import json, os, sys; print(json.dumps(dict(os.environ))); print(sys.flags.no_site)"
    res = run_program(src, config=_config(level))
    env_line, no_site = res.stdout.splitlines()
    assert no_site == "1"
    child_env = __import__("json").loads(env_line)
    child_env.pop("PWD", None)  # set by bubblewrap's --chdir
    assert set(child_env) == set(sandbox_env("/x", 0))
    assert child_env["HOME"] == child_env["TMPDIR"]


def test_hash_seed_makes_output_reproducible(level: str) -> None:
    src = "print(list({'alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta'}))"
    first = run_program(src, config=_config(level)).stdout
    assert first == run_program(src, config=_config(level)).stdout


def test_large_unread_stdin_does_not_hang(level: str) -> None:
    res = run_program("print('ignored')", stdin=b"x" * (1 << 20), config=_config(level))
    assert res.passed and res.stdout == "ignored\n"


def test_run_as_unprivileged_user(level: str) -> None:
    res = run_program(
        "import os; print(os.getuid(), os.geteuid(), os.getgroups())", config=_config(level)
    )
    uid, euid, groups = res.stdout.split(" ", 2)
    if IS_ROOT:
        lo, hi = SandboxConfig().uid_range
        assert lo <= int(uid) < hi and uid == euid
        assert groups.strip() in ("[]", f"[{uid}]")


def test_scratch_directory_is_private_and_deleted(level: str) -> None:
    root = tempfile.mkdtemp(prefix="tepo-sbx-root-")
    os.chmod(root, 0o711)  # the sandbox user must be able to reach its directory
    try:
        config = SandboxConfig(isolation=level, scratch_root=root)
        src = (
            "import os\n"
            "os.makedirs('a/b', exist_ok=True)\n"
            "open('a/b/f.txt', 'w').write('data')\n"
            "os.symlink('/etc', 'etc-link')\n"
            "os.chmod('a', 0)\n"
            "print(os.getcwd(), os.environ['HOME'] == os.getcwd())\n"
        )
        res = run_program(src, config=config)
        assert res.passed, res.stderr
        assert res.stdout.split()[1] == "True"
        assert os.listdir(root) == []
        assert os.path.isdir("/etc")  # the planted link was removed, not followed
    finally:
        shutil.rmtree(root)


def test_run_many_keeps_input_order(level: str) -> None:
    programs = [Program(f"import time; time.sleep({0.05 * (5 - i)}); print({i})") for i in range(6)]
    results = run_many(programs, max_workers=3, config=_config(level))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert run_many([], config=_config(level)) == []
    assert run_many(["print(7)"], config=_config(level))[0].stdout == "7\n"


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch):
    clear_probe_cache()
    monkeypatch.setattr(isolation, "bwrap_path", lambda: None)
    yield
    clear_probe_cache()


def test_strong_required_but_unavailable_fails_clearly(no_bwrap: None) -> None:
    with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        run_program("print(1)", config=SandboxConfig(isolation="strong"))


def test_auto_falls_back_and_reports_it(no_bwrap: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        res = run_program("print(1)", config=SandboxConfig(isolation="auto"))
    assert res.passed and res.isolation == FALLBACK
    assert "strong isolation unavailable" in caplog.text


def test_config_validation_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="isolation"):
        SandboxConfig(isolation="paranoid")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wall_time_s"):
        SandboxLimits(wall_time_s=0)
    with pytest.raises(ValueError, match="max_processes"):
        SandboxLimits(max_processes=1)
    assert SandboxLimits(wall_time_s=2.5).cpu_seconds == 4


def test_launcher_and_parent_agree_on_exit_codes() -> None:
    assert _launcher.MEMORY_EXIT_CODE == result.MEMORY_EXIT_CODE
    assert _launcher.SETUP_EXIT_CODE == result.SETUP_EXIT_CODE
    assert "ok" in REASONS and "timeout" in REASONS


@pytest.mark.skipif(not IS_ROOT, reason="needs root to start a process as another uid")
def test_reaper_kills_every_process_of_a_uid() -> None:
    import subprocess

    uid = 0x71F00000 + secrets.randbelow(1 << 16)
    procs = [
        subprocess.Popen(
            ["sleep", "60"], user=uid, group=uid, extra_groups=[], start_new_session=True
        )
        for _ in range(3)
    ]
    try:
        assert sorted(reaper.kill_uid(uid)) == sorted(p.pid for p in procs)
        for p in procs:
            assert p.wait(timeout=10) == -9
        assert reaper.processes_of(uid) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_wall_time_is_measured(level: str) -> None:
    start = time.monotonic()
    res = run_program("import time; time.sleep(0.3)", config=_config(level))
    assert res.passed
    assert 0.3 <= res.wall_time_s <= time.monotonic() - start
