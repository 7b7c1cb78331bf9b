"""The CPU's peak matmul rate, measured robustly and cached per machine, for MFU on the CPU.

Measured once per run at the model's MLP shape, the rate varied 35× between two runs of the same
tiny job (185 and 5.3 GFLOP/s): a [2048, 64] × [64, 256] product is too small to be bound by
arithmetic, and one timing taken while another job held the cores stands for the machine's peak.
So the probe multiplies a fixed [N, N] × [N, N] (N = `PROBE_SIZE`, large enough to be compute
bound, small enough for a fraction of a second per trial in float32), times several trials after
a warm-up and keeps the fastest (a busy machine only ever slows a trial down, so the best trial
is the nearest to the peak). The result is cached in `$TEPO_CACHE/cpu_peak.json`, keyed by CPU
model, core count, torch's thread count, torch version and dtype: float32 and bfloat16 matmuls
run on different units (AVX-512 FMA, AMX or AVX-512-BF16) at different peaks.

An update can still run faster than the cached peak (the probe ran while the machine was busy):
MFU would then read above 1. `raise_peak` measures again and keeps the higher rate; where even
that is below the rate the update achieved, the achieved rate is the peak (the machine did that
much), recorded in the cache and said on stderr, so MFU is never recorded above 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tepo_cli.cache import cache_root
from tepo_cli.core.atomic_write import write_text
from tepo_cli.core.machine import cpu_model

PROBE_SIZE = 1024
TRIALS = 5  # timed trials after one warm-up; the fastest counts
BUDGET_SECONDS = 3.0  # stop early past this much timing (a slow dtype on a slow CPU)
CACHE_FILE = "cpu_peak.json"

# The probe's clock: a test replaces it to force a slow first measurement.
clock: Callable[[], float] = time.perf_counter
_KNOWN: dict[str, float] = {}  # this process's peaks: the file is read once per key


def measure(dtype: torch.dtype, size: int = PROBE_SIZE) -> float:
    """FLOP/s of the fastest of `TRIALS` timed [size, size] × [size, size] products in `dtype`,
    after one untimed warm-up; the run's RNG streams are left untouched."""
    own = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=own, device="cpu").to(dtype)
    b = torch.randn(size, size, generator=own, device="cpu").to(dtype)
    torch.mm(a, b)
    best, spent = float("inf"), 0.0
    for trial in range(TRIALS):
        began = clock()
        torch.mm(a, b)
        took = max(clock() - began, 1e-9)
        best, spent = min(best, took), spent + took
        if trial >= 2 and spent > BUDGET_SECONDS:
            break
    return 2.0 * size**3 / best


def machine_key(dtype: torch.dtype) -> str:
    """What the peak depends on: CPU model, cores, torch's threads, torch version, dtype."""
    cores = os.cpu_count() or 0
    return (
        f"{cpu_model()}|cores={cores}|threads={torch.get_num_threads()}|"
        f"torch={torch.__version__}|{str(dtype).removeprefix('torch.')}"
    )


def cpu_peak(dtype: torch.dtype) -> float:
    """The cached peak for this machine and `dtype`, measured (and cached) on first use."""
    key = machine_key(dtype)
    if key in _KNOWN:
        return _KNOWN[key]
    cached = _load().get(key)
    if isinstance(cached, (int, float)) and cached > 0:
        _KNOWN[key] = float(cached)
        return _KNOWN[key]
    return _store(key, measure(dtype))


def raise_peak(dtype: torch.dtype, achieved: float) -> float:
    """The peak after an update ran at `achieved` FLOP/s, above the cached peak: the higher of a
    new measurement and the old peak, or `achieved` itself where both are below it (said)."""
    key = machine_key(dtype)
    old = cpu_peak(dtype)
    peak = max(old, measure(dtype))
    if peak < achieved:
        print(
            f"tepo train: the update ran at {achieved / 1e9:.1f} GFLOP/s, above this CPU's "
            f"measured {str(dtype).removeprefix('torch.')} matmul peak ({peak / 1e9:.1f} GFLOP/s, "
            f"measured while the machine was busier): the peak is raised to the achieved rate "
            f"(in {_path()}), so MFU reads at most 1.",
            file=sys.stderr,
        )
        peak = achieved
    return _store(key, peak) if peak > old else old


def _path() -> Path:
    return cache_root() / CACHE_FILE


def _load() -> dict[str, object]:
    try:
        data = json.loads(_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measured again and rewritten
    return data if isinstance(data, dict) else {}


def _store(key: str, peak: float) -> float:
    """Record `peak` under `key`, atomically (ranks of one run may write at once)."""
    _KNOWN[key] = peak
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**_load(), key: peak}
        write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n", unique=True)
    except OSError:
        pass  # a read-only cache: the peak still holds for this process
    return peak
