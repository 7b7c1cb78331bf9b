"""Shared fixtures: composed configs and the tiny in-process model (SmolLM2's tokenizer)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
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
