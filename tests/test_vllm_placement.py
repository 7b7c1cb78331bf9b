"""rollout=vllm placement: the arguments each rank's engine is built with, and the rank and device
it reads from the environment. Pure functions, no engine (needs no vLLM): the two-rank run that
builds real engines with them is tests/test_vllm_e2e.py."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from tepo_cli.config.schema import EngineConfig
from tepo_cli.rollout.vllm_engine import (
    Placement,
    _rank_environment,
    engine_arguments,
    trainer_placement,
)


def test_in_the_trainers_group_each_rank_gets_an_external_launcher_engine():
    """Rank 1 of a trainer's group: vLLM's external-launcher executor (the trainer's rank and
    device, not rank 0 on device 0), one GPU per engine, its own seed."""
    cfg = EngineConfig(max_model_len=256, kv_cache_gib=1, gpu_memory_utilization=0.4)
    arguments = engine_arguments(cfg, "/m", torch.bfloat16, 7, Placement(rank=1, local_rank=1))
    assert arguments["distributed_executor_backend"] == "external_launcher"
    assert arguments["tensor_parallel_size"] == 1
    assert arguments["seed"] == 8
    assert arguments["dtype"] == "bfloat16"
    assert (arguments["max_model_len"], arguments["gpu_memory_utilization"]) == (256, 0.4)
    rank0 = engine_arguments(cfg, "/m", torch.bfloat16, 7, Placement(rank=0, local_rank=0))
    assert rank0["seed"] == 7
    assert {k: v for k, v in rank0.items() if k != "seed"} == {
        k: v for k, v in arguments.items() if k != "seed"
    }


def test_outside_a_process_group_the_engine_is_vllms_single_process_one():
    """`tepo eval` has no process group: vLLM's own executor, the seed as given."""
    arguments = engine_arguments(EngineConfig(), "/m", torch.float32, 7, None)
    assert "distributed_executor_backend" not in arguments
    assert "tensor_parallel_size" not in arguments
    assert arguments["seed"] == 7


@pytest.fixture()
def one_rank_group():
    """A one-rank gloo group for the test (or the one an earlier in-process run kept)."""
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if made:
        dist.destroy_process_group()


def test_placement_is_the_trainers_rank_and_the_launchers_local_rank(one_rank_group, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    expected = torch.cuda.current_device() if torch.cuda.is_available() else 3
    assert trainer_placement() == Placement(rank=0, local_rank=expected)


def test_rank_variables_are_the_trainers_while_the_engine_starts(monkeypatch):
    """A launcher that gave the rank other values (or a sweep job that forgot them): RANK and
    LOCAL_RANK are the placement's while vLLM reads them, as they were afterwards."""
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.delenv("RANK", raising=False)
    with _rank_environment(Placement(rank=2, local_rank=0)):
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("2", "0")
    assert os.environ["LOCAL_RANK"] == "5" and "RANK" not in os.environ
    with _rank_environment(None):
        assert os.environ["LOCAL_RANK"] == "5" and "RANK" not in os.environ


def test_an_engine_on_another_gpu_than_its_ranks_is_refused():
    """What vLLM's default executor did on rank 1 of a GPU node (its worker on cuda:0): one
    paragraph naming both devices. The engine here is a stand-in holding only the worker's
    device, the attribute path of vLLM 0.32's in-process engine (no GPU on the test machine)."""
    from types import SimpleNamespace

    from tepo_cli.core.errors import RunError
    from tepo_cli.rollout.vllm_engine import _check_device

    def engine_on(device: str) -> SimpleNamespace:
        worker = SimpleNamespace(worker=SimpleNamespace(device=torch.device(device)))
        executor = SimpleNamespace(driver_worker=worker)
        return SimpleNamespace(llm_engine=SimpleNamespace(model_executor=executor))

    _check_device(engine_on("cuda:1"), torch.device("cuda", 1))
    with pytest.raises(RunError, match=r"started on cuda:0, but the rank trains on cuda:1"):
        _check_device(engine_on("cuda:0"), torch.device("cuda", 1))
