"""`trainer.host_allocator`: tcmalloc, jemalloc or mimalloc preloaded when `tepo train` starts.

The choice is resolved from the composed config before Hydra runs the job, the process starts
itself again with the library in LD_PRELOAD, and the run records the allocator that served it.
The end-to-end runs need the libraries (Debian: libtcmalloc-minimal4, libjemalloc2; mimalloc: the
cmeel-mimalloc wheel, a dependency): skipped without them, failed without them under
TEPO_REQUIRE_ALLOCATORS=1 (CI installs all three).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tepo_cli import cli
from tepo_cli.core import host_allocator
from tepo_cli.core.errors import ConfigError
from tepo_cli.train.setup import _allocator_line

REQUIRED = os.environ.get("TEPO_REQUIRE_ALLOCATORS") == "1"
ON_LINUX = sys.platform.startswith("linux")


def finder(*present: str):
    return lambda name: f"lib{name}.so.9" if name in present else None


def test_auto_takes_jemalloc_then_tcmalloc_then_glibc_with_a_hint() -> None:
    if not ON_LINUX:
        pytest.skip("LD_PRELOAD is Linux only")
    both = host_allocator.resolve("auto", finder("tcmalloc_minimal", "jemalloc"))
    assert (both.name, both.library) == ("jemalloc", "libjemalloc.so.9")
    minimal = host_allocator.resolve("auto", finder("tcmalloc_minimal", "tcmalloc"))
    assert (minimal.name, minimal.library) == ("tcmalloc", "libtcmalloc_minimal.so.9")
    full = host_allocator.resolve("auto", finder("tcmalloc"))
    assert (full.name, full.library) == ("tcmalloc", "libtcmalloc.so.9")
    pip_only = host_allocator.resolve("auto", finder("mimalloc"))  # its wheel, no apt
    assert (pip_only.name, pip_only.library) == ("mimalloc", "libmimalloc.so.9")
    assert host_allocator.resolve("auto", finder("mimalloc", "tcmalloc")).name == "tcmalloc"
    none = host_allocator.resolve("auto", finder())
    assert (none.name, none.library) == ("glibc", None)
    assert "pip install cmeel-mimalloc" in none.note and "apt install libjemalloc2" in none.note


def test_mimalloc_is_found_in_its_wheel_without_ldconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip alone installs cmeel-mimalloc: its library is outside ldconfig's cache, found through
    the wheel's file list; a library no wheel ships is left to ldconfig."""
    if not _installed("mimalloc"):
        if REQUIRED:
            pytest.fail("mimalloc required (TEPO_REQUIRE_ALLOCATORS=1) but not installed")
        pytest.skip("cmeel-mimalloc is not installed")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    found = host_allocator.find_library("mimalloc")
    assert found is not None and Path(found).name == "libmimalloc.so" and Path(found).is_file()
    assert "cmeel.prefix" in found
    assert host_allocator.find_library("jemalloc") is None
    with pytest.raises(ConfigError, match="pip install cmeel-mimalloc"):
        host_allocator.resolve("mimalloc", finder())


def test_a_named_allocator_that_is_missing_is_refused_with_its_package() -> None:
    if not ON_LINUX:
        pytest.skip("LD_PRELOAD is Linux only")
    with pytest.raises(ConfigError) as error:
        host_allocator.resolve("jemalloc", finder("tcmalloc_minimal"))
    message = str(error.value)
    assert "trainer.host_allocator=jemalloc" in message and "apt install libjemalloc2" in message
    with pytest.raises(ConfigError, match="apt install libtcmalloc-minimal4"):
        host_allocator.resolve("tcmalloc", finder("jemalloc"))
    assert host_allocator.resolve("glibc", finder("jemalloc")).library is None


def test_the_allocator_in_use_is_read_from_the_mapped_libraries() -> None:
    maps = (
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
    )
    assert host_allocator.loaded(maps) == "jemalloc"
    assert host_allocator.loaded(maps.replace("libjemalloc.so.2", "libtcmalloc.so.4")) == "tcmalloc"
    assert host_allocator.loaded(maps.splitlines()[0]) == "glibc"
    assert host_allocator.loaded(maps.replace("libjemalloc.so.2", "libmimalloc.so")) == "mimalloc"
    assert host_allocator.loaded() in ("glibc", "tcmalloc", "jemalloc", "mimalloc")  # its own


def test_the_library_goes_first_in_ld_preload_and_marks_the_second_start() -> None:
    env = host_allocator.preloaded_environment({"LD_PRELOAD": "libother.so", "A": "1"}, "libx.so")
    assert env["LD_PRELOAD"] == "libx.so:libother.so" and env["A"] == "1"
    assert env[host_allocator.STARTED_AGAIN] == "1"
    assert host_allocator.preloaded_environment({}, "libx.so")["LD_PRELOAD"] == "libx.so"


def test_jemalloc_returns_unused_pages_sooner_unless_the_user_configured_it() -> None:
    env = host_allocator.preloaded_environment({}, "libjemalloc.so.2", "jemalloc")
    assert env["MALLOC_CONF"] == "dirty_decay_ms:1000"
    own = {"MALLOC_CONF": "narenas:1"}
    assert (
        host_allocator.preloaded_environment(own, "libjemalloc.so.2", "jemalloc")["MALLOC_CONF"]
        == "narenas:1"
    )
    assert "MALLOC_CONF" not in host_allocator.preloaded_environment({}, "libt.so", "tcmalloc")


DECAY_PROGRAM = """
import ctypes
process = ctypes.CDLL(None)
value, size = ctypes.c_ssize_t(-2), ctypes.c_size_t(ctypes.sizeof(ctypes.c_ssize_t))
assert process.mallctl(b"opt.dirty_decay_ms", ctypes.byref(value), ctypes.byref(size), None, 0) == 0
print(value.value)
"""


def test_a_process_started_with_jemalloc_runs_with_its_setting() -> None:
    if not ON_LINUX:
        pytest.skip("LD_PRELOAD is Linux only")
    if not _installed("jemalloc"):
        if REQUIRED:
            pytest.fail("jemalloc required (TEPO_REQUIRE_ALLOCATORS=1) but not installed")
        pytest.skip("jemalloc is not installed")
    jemalloc = host_allocator.resolve("jemalloc")
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env = host_allocator.preloaded_environment(base, jemalloc.library, jemalloc.name)
    run = subprocess.run(
        [sys.executable, "-c", DECAY_PROGRAM], env=env, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "1000"  # jemalloc's own default is 10000


def test_the_choice_is_read_from_the_composed_command_line() -> None:
    assert host_allocator.requested("train", []) == "auto"
    assert host_allocator.requested("train", ["trainer.host_allocator=glibc"]) == "glibc"
    # auto preloads nothing on a GPU run; a named allocator is preloaded wherever it runs
    assert host_allocator.requested("train", ["trainer.device=cuda"]) == "glibc"
    assert host_allocator.requested("train", ["trainer.device=cpu"]) == "auto"
    cuda_jemalloc = ["trainer.device=cuda", "trainer.host_allocator=jemalloc"]
    assert host_allocator.requested("train", cuda_jemalloc) == "jemalloc"
    # other keys swept in a multirun do not hide it; Hydra's own flags are ignored
    swept = ["-m", "algo=grpo,mpo", "hydra.run.dir=/x", "trainer.host_allocator=jemalloc"]
    assert host_allocator.requested("train", swept) == "jemalloc"
    assert host_allocator.requested("train", ["trainer.host_allocator=bogus"]) == "bogus"
    with pytest.raises(ConfigError, match="allowed: auto, glibc, jemalloc, tcmalloc, mimalloc"):
        host_allocator.resolve("bogus")
    assert host_allocator.requested("train", ["model=no_such_preset"]) is None  # Hydra reports it
    with pytest.raises(ConfigError, match="cannot be swept"):
        host_allocator.requested("train", ["-m", "trainer.host_allocator=glibc,tcmalloc"])


def test_a_missing_allocator_stops_the_command_before_any_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if not ON_LINUX:
        pytest.skip("LD_PRELOAD is Linux only")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys, "argv", ["tepo", "train", "model=tiny", "trainer.host_allocator=tcmalloc"]
    )
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "trainer.host_allocator=tcmalloc" in err and "libtcmalloc-minimal4" in err
    assert list(tmp_path.iterdir()) == []  # no run directory, no partial output


def test_the_start_line_says_which_allocator_serves_and_why() -> None:
    line = _allocator_line("glibc", "glibc")
    assert line == "tepo train: host memory allocator glibc"
    assert "LD_PRELOAD" in _allocator_line("glibc", "tcmalloc")


ONE_TINY_STEP = [
    "model=tiny",
    "trainer.max_steps=1",
    "rollout.max_new_tokens=4",
    "rollout.n=2",
    "trainer.eval_before=false",
    "trainer.eval_after=false",
    "trainer.save_final=false",
    "trainer.progress=false",
]


def _installed(name: str) -> bool:
    return any(host_allocator.find_library(lib) for lib in host_allocator.LIBRARIES[name])


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["tcmalloc", "jemalloc", "mimalloc", "glibc"])
def test_tepo_train_runs_with_the_allocator_it_records(tmp_path: Path, choice: str) -> None:
    """A real `tepo train` (tiny model, one step): the process started again with the library
    preloaded, the start line and summary.json name the allocator that served it."""
    if choice != "glibc" and not _installed(choice):
        if REQUIRED:
            pytest.fail(f"{choice} required (TEPO_REQUIRE_ALLOCATORS=1) but not installed")
        pytest.skip(f"{choice} is not installed")
    if not ON_LINUX:
        pytest.skip("LD_PRELOAD is Linux only")
    env = {
        k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", host_allocator.STARTED_AGAIN)
    }
    command = [sys.executable, "-m", "tepo_cli", "train", *ONE_TINY_STEP]
    command += [f"trainer.host_allocator={choice}", f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"host memory allocator {choice}" in result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["host_allocator"] == choice


RELEASE_PROGRAM = """
import ctypes
from tepo_cli.core import host_allocator
process = ctypes.CDLL(None)
process.malloc.restype = ctypes.c_void_p
process.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
blocks = [process.malloc(65536) for _ in range(6000)]  # ~390 MB in blocks each allocator keeps
for block in blocks:
    ctypes.memset(block, 1, 65536)
touched = rss()
for block in blocks[:-1]:  # the last one pins the top of glibc's heap, as live data would
    process.free(block)
freed = rss()
released = host_allocator.release_free_memory()
print(host_allocator.loaded(), released, touched, freed, rss())
"""


@pytest.mark.parametrize("choice", ["tcmalloc", "jemalloc", "mimalloc", "glibc"])
def test_free_blocks_go_back_to_the_os_between_phases(choice: str) -> None:
    """What a phase freed stays resident in the allocator until `release_free_memory`, which the
    loop calls between generation and the update: then RSS drops by the freed blocks."""
    if not ON_LINUX:
        pytest.skip("the allocators' release calls are used on Linux only")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if choice != "glibc":
        allocator = host_allocator.resolve(choice) if _installed(choice) else None
        if allocator is None:
            if REQUIRED:
                pytest.fail(f"{choice} required (TEPO_REQUIRE_ALLOCATORS=1) but not installed")
            pytest.skip(f"{choice} is not installed")
        env["LD_PRELOAD"] = allocator.library
    result = subprocess.run(
        [sys.executable, "-c", RELEASE_PROGRAM],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    name, released, touched, freed, after = result.stdout.split()
    assert name == choice and released == "True"
    mb = 1e6
    # released, the freed blocks are gone (jemalloc and mimalloc purge part of them on their own,
    # over time)
    assert int(after) < int(touched) - 300 * mb and int(after) <= int(freed), result.stdout
    if choice in ("tcmalloc", "glibc"):  # kept for reuse until released
        assert int(freed) > int(touched) - 50 * mb, result.stdout


def test_cuda_is_expected_only_with_a_driver_a_cuda_torch_and_visible_gpus(tmp_path):
    """`trainer.device=auto` before torch is imported (the allocator's choice) follows the same
    facts as torch.cuda.is_available() after: a CPU build of torch on a GPU node is a CPU run."""
    from tepo_cli.core.host_allocator import cuda_expected

    node = tmp_path / "nvidiactl"
    cpu_torch, cuda_torch = tmp_path / "cpu_torch", tmp_path / "cuda_torch"
    (cpu_torch / "lib").mkdir(parents=True)
    (cpu_torch / "lib" / "libtorch_cpu.so").write_bytes(b"")
    (cuda_torch / "lib").mkdir(parents=True)
    (cuda_torch / "lib" / "libtorch_cuda.so").write_bytes(b"")
    assert not cuda_expected(node, cuda_torch, {})  # no driver
    node.write_bytes(b"")
    assert cuda_expected(node, cuda_torch, {})
    assert not cuda_expected(node, cpu_torch, {})  # a CPU build of torch: the case
    assert not cuda_expected(node, cuda_torch, {"CUDA_VISIBLE_DEVICES": ""})
    assert not cuda_expected(node, cuda_torch, {"CUDA_VISIBLE_DEVICES": "-1"})
    assert cuda_expected(node, cuda_torch, {"CUDA_VISIBLE_DEVICES": "0,1"})
