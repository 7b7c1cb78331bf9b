"""Freed tensor buffers go back to the operating system, so peak RSS tracks what is alive.

glibc serves a large allocation with its own mmap and unmaps it on free, but it raises that
"large" threshold to the size of every mmapped block freed (up to 32 MiB). After one training
step every gradient and activation of a small model is served from the heap instead, and the
heap keeps freed memory it cannot hand back between live blocks, so the peak drifts up from step
to step (docs/results/bench_update/page_faults.md). A fixed threshold
(`trainer.mmap_threshold_kb`) stops the drift. Buffers under it are reused from the heap (no
fresh page faults: the speed of the update), buffers over it are mapped fresh and handed back at
once (the peak): the default sits where an update's activations of one hidden width are reused
(docs/guides/performance.md, "The host allocator", measured by scripts/bench_update.py). tcmalloc and jemalloc
(`trainer.host_allocator`, core/host_allocator.py) reuse freed buffers without that drift; with
either loaded the threshold does not apply.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from tepo_cli.core import host_allocator

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers in glibc's malloc.h
M_MMAP_THRESHOLD = -3


def return_freed_buffers(threshold_kb: int | None) -> bool:
    """Fix glibc's mmap threshold at `threshold_kb` KiB, and its trim threshold at twice that
    (the ratio glibc's adaptive rule keeps: a buffer under the threshold freed at the heap's top
    stays for the next one instead of being trimmed and faulted in again); False where it does
    not apply."""
    if threshold_kb is None or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False  # not glibc (musl has no adaptive threshold to fix)
    fixed = libc.mallopt(M_MMAP_THRESHOLD, threshold_kb * 1024)
    return bool(fixed and libc.mallopt(M_TRIM_THRESHOLD, 2 * threshold_kb * 1024))


def set_up_host_memory(threshold_kb: int | None) -> str:
    """The allocator serving this process (tcmalloc or jemalloc where `tepo train` preloaded one,
    else glibc, whose mmap threshold is then fixed at `threshold_kb`)."""
    in_use = host_allocator.loaded()
    if in_use == host_allocator.GLIBC:
        return_freed_buffers(threshold_kb)
    return in_use
