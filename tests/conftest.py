"""Shared fixtures: composed configs and the tiny in-process model (SmolLM2's tokenizer)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

# How long torch's idle threads spin before they sleep, set before torch loads here and inherited by
# the xdist workers and every process the suite starts: 1,000, the value tepo itself takes on a
# busy machine (runtime/thread_wait.py). A test on both cores beside the other worker then does not
# wait a scheduler time slice per operation; and, set as the user's choice, tepo says nothing about
# it, so no run's output depends on what the other worker is doing when it starts.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# model.dtype=auto means float32 in the suite whatever the CPU (models/precision.py): CI machines
# differ in bf16 instructions, and the tests' numbers must not. bf16 tests set it themselves.
os.environ.setdefault("TEPO_CPU_BF16", "0")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers), each worker — and every process its
    tests start, which inherit its CPU affinity — runs on cores of its own: tepo sizes its torch
    thread pools by the cores it may use (trainer.num_threads: null), so two workers that both
    saw every core would each start a pool per core and spin against each other. Without xdist
    nothing changes."""
    if not hasattr(config, "workerinput"):  # the controlling process, once
        _stop_on_a_full_disk()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        _SESSION_CORES.extend(cores)
        own = cores[int(worker[2:]) % count :: count]
        os.sched_setaffinity(0, own)
        torch.set_num_threads(len(own))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Remembers whether a test's body passed, for `_free_the_tmp_path_of_a_passing_test`."""
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


_PASSED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _free_the_tmp_path_of_a_passing_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A passing test's tmp_path goes as soon as the test ends, not at the session's end (the
    `tmp_path_retention_policy = "failed"` of pyproject.toml): the end-to-end tests' checkpoints
    reach GBs, and together they would fill a small CI disk. A failed test keeps its own."""
    yield
    path = request.node.funcargs.get("tmp_path")
    if path is not None and request.node.stash.get(_PASSED, False):
        shutil.rmtree(path, ignore_errors=True)


# The suite's peak in the temporary directory: 1.8 GB, `make test` on 2026-11-30, each passing
# test's tmp_path removed as it ends (below). Less free space than this fails dozens of tests
# with "No space left on device" far from the cause; the session stops at once instead.
_DISK_NEEDED_GB = 3.0


def _stop_on_a_full_disk() -> None:
    """One line naming the directory and its free space, instead of a suite of ENOSPC errors."""
    tmp = tempfile.gettempdir()
    free_gb = shutil.disk_usage(tmp).free / 1e9
    if free_gb < _DISK_NEEDED_GB:
        pytest.exit(
            f"{tmp} has {free_gb:.1f} GB free; the suite needs about {_DISK_NEEDED_GB:.0f} GB "
            "there (checkpoints of its end-to-end runs): free some space or point TMPDIR elsewhere",
            returncode=3,
        )


_SESSION_CORES: list[int] = []  # every core the session may use, when xdist workers split them


@pytest.fixture()
def all_cores() -> Iterator[int]:
    """For a test that needs several threads on several cores (and the processes it starts):
    this worker runs on every core of the session for its duration; yields their count."""
    if not _SESSION_CORES:
        yield len(os.sched_getaffinity(0))
        return
    own, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, _SESSION_CORES)
    torch.set_num_threads(len(_SESSION_CORES))
    try:
        yield len(_SESSION_CORES)
    finally:
        os.sched_setaffinity(0, own)
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def compose_config() -> Callable[..., DictConfig]:
    """compose_config("train", ["model=tiny", ...]) -> the DictConfig Hydra would build."""

    def _compose(name: str = "train", overrides: list[str] | None = None) -> DictConfig:
        with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
            return compose(config_name=name, overrides=overrides or [])

    return _compose


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tepo_cli.models.loading import load_tokenizer

    return load_tokenizer(_tiny_model_config())


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    from tepo_cli.models.loading import load_model

    return load_model(_tiny_model_config(), tiny_tokenizer, torch.device("cpu"))


def _tiny_model_config():
    from tepo_cli.config.schema import ModelConfig

    # TEPO_TEST_TOKENIZER: a tokenizer folder where the embedded model's conversion is absent (a
    # GPU node that has the device kit's copy: scripts/device_check.sh).
    tokenizer = os.environ.get("TEPO_TEST_TOKENIZER", "smollm2_135m")
    return ModelConfig(name="tiny", source="tiny", tokenizer=tokenizer, dtype="float32")
