"""`model.dtype=auto`: bfloat16 where the hardware trains it faster, float32 elsewhere.

On CUDA, auto is bfloat16, as every peer trains. On the CPU it is bfloat16 only where the
processor has bf16 matrix instructions (AVX-512 BF16 or AMX) **and** a one-time probe confirms a
bf16 training pass runs at least `MIN_SPEEDUP` times faster than float32 there (`probe_speedup`:
a few decoder layers, forward and backward, at changing lengths); otherwise float32. A CPU without
those instructions emulates bf16 matmuls, far slower; one with them can still lose, where oneDNN
compiles a kernel for every new bf16 shape and short sequences leave little matmul work to gain
on (docs/guides/performance.md, "bf16 on the CPU"). Either way DeepSpeed keeps float32 master
weights, moments and gradient accumulation (runtime/engine.py), and the log-prob kernel runs its
softmax statistics in float32.

The probe's answer is cached per machine (`$TEPO_CACHE/precision.json`, keyed by processor,
cores and torch version), so every rank and every later run of the machine decide alike. A probe
taken while other work keeps the cores busy is cached only if bf16 cleared `MIN_SPEEDUP` even
so; otherwise it serves its run and only tells emulation from native bf16 (`MIN_SPEEDUP_BUSY`).
`TEPO_CPU_BF16=1` or `0` forces it (tests; a machine whose probe you distrust).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tepo_cli.cache import cache_root
from tepo_cli.core.atomic_write import write_text
from tepo_cli.core.busy import others_running
from tepo_cli.core.machine import bf16_instructions, cpu_model

MIN_SPEEDUP = 1.2  # bf16 must beat float32 by this factor on the probe to be chosen
MIN_SPEEDUP_BUSY = 0.5  # under load the probe times other work too: below this only emulation
PROBE_SHAPE = (512, 576, 1536)  # rows x hidden x out: a SmolLM2-135M MLP projection's block
PROBE_LENGTHS = (16, 48, 128)  # sequence lengths the probe trains on, each once
PROBE_LAYERS = 4  # decoder layers of one shape, over which a new shape's compile is spread
PROBE_ROUNDS = 3  # the probe's answer is the median of these rounds' ratios
PROBE_VERSION = 2  # in the cache key: an answer of an earlier probe is measured again
FORCE_VARIABLE = "TEPO_CPU_BF16"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class CpuPrecision:
    dtype: str  # "bfloat16" or "float32"
    reason: str  # one clause: why, in the user's terms


def probe_speedup(lengths: tuple[int, ...] = PROBE_LENGTHS, rounds: int = PROBE_ROUNDS) -> float:
    """float32 seconds / bfloat16 seconds of a forward and backward through `PROBE_LAYERS`
    SmolLM2-135M-shaped decoder layers (a random Llama, built here) at a few short sequence
    lengths, as training meets them: every step packs another number of tokens. The median of
    `rounds` rounds, each timing both precisions in turn; the first round holds each new shape's
    compile (oneDNN compiles a bf16 kernel per shape), the later ones what repeated shapes cost.

    A single repeated matmul would hide that norms, attention and elementwise passes gain little
    from bf16. A real model pays each shape's compile once for all its layers of that shape, so
    the probe stacks several: with one layer and one round it charged the whole compile against
    one layer's work and read 0.87-0.89 on an Intel Xeon with AMX where the default job and
    word_math ran 1.45x and 1.8x as fast in bf16; one round of four layers read 1.05-1.78 there,
    the median of three 1.38-1.57 (docs/results/precision/index.md)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inner = PROBE_SHAPE[1], PROBE_SHAPE[2]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inner,
        num_attention_heads=9,
        num_key_value_heads=3,
        num_hidden_layers=PROBE_LAYERS,
        vocab_size=512,
        max_position_embeddings=max(lengths) + 1,
    )
    gen = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, config.vocab_size, (8, n), generator=gen, device="cpu") for n in lengths
    ]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    models = {torch.float32: model, torch.bfloat16: copy.deepcopy(model).to(torch.bfloat16)}
    ratios = []
    for _ in range(rounds):
        seconds = {}
        for dtype, each in models.items():
            start = time.perf_counter()
            for ids in batches:
                each(input_ids=ids).logits.float().sum().backward()
            seconds[dtype] = time.perf_counter() - start
        ratios.append(seconds[torch.float32] / seconds[torch.bfloat16])
    return statistics.median(ratios)


def _machine_key() -> str:
    return f"{cpu_model()} | {os.cpu_count()} cores | torch {torch.__version__} | probe {PROBE_VERSION}"


def _busy() -> int | None:
    """How many other threads are running where they hold more than half the cores (a probe then
    times the other work as much as bf16: on this project's 2-core Xeon one read 0.95x beside a
    training run, where it reads 1.4-1.5x alone), else None (core/busy.py)."""
    return others_running()


def _cached_speedup(path: Path) -> tuple[float, str, float]:
    """The probe's speed-up for this machine, where it came from, and the speed-up bf16 needs:
    read from the cache, else measured and stored — unless the machine is busy and bf16 missed
    `MIN_SPEEDUP`, when the figure serves this run only and is held to `MIN_SPEEDUP_BUSY`. Beside
    other work the probe times that work too, which took from bf16's gain where measured: a busy
    reading that clears the bar anyway is kept (later runs skip the probe); one that does not
    tells only emulation from native bf16, so that the runs a busy machine starts (a parallel
    sweep's jobs) take the instructions' answer alike instead of each a noisy one."""
    key = _machine_key()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(key), (int, float)):
        return float(cached[key]), f"probed once, cached in {path}", MIN_SPEEDUP
    others = _busy()
    speedup = probe_speedup()
    if others is not None and speedup < MIN_SPEEDUP:
        source = (
            f"probed now, not cached: {others} other threads were running, so only a "
            f"speed below {MIN_SPEEDUP_BUSY}x, emulation's, keeps float32"
        )
        return speedup, source, MIN_SPEEDUP_BUSY
    busy = "" if others is None else f" beside {others} other running threads"
    if not isinstance(cached, dict):
        cached = {}
    cached[key] = round(speedup, 3)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # ranks probing at once leave one whole file
        write_text(path, json.dumps(cached, indent=1, sort_keys=True), unique=True)
    except OSError:
        pass  # an unwritable cache costs a probe per run, nothing else
    return speedup, f"probed once{busy}, cached in {path}", MIN_SPEEDUP


@functools.cache
def cpu_precision() -> CpuPrecision:
    """What `model.dtype=auto` means on this CPU, and why."""
    forced = os.environ.get(FORCE_VARIABLE)
    if forced in ("0", "1"):
        dtype = "bfloat16" if forced == "1" else "float32"
        return CpuPrecision(dtype, f"{FORCE_VARIABLE}={forced} forces it")
    instructions = bf16_instructions()
    if not instructions:
        return CpuPrecision(
            "float32",
            "this CPU has no bf16 matrix instructions (AVX-512 BF16 or AMX): bf16 would be "
            "emulated, far slower",
        )
    cache = cache_root() / "precision.json"
    speedup, source, needed = _cached_speedup(cache)
    has = " and ".join(instructions)
    if speedup < needed:
        return CpuPrecision(
            "float32",
            f"this CPU has {has}, but a bf16 training pass of changing lengths ran at {speedup:.2f}x "
            f"float32's speed ({source}; docs/guides/performance.md)",
        )
    return CpuPrecision(
        "bfloat16",
        f"this CPU has {has}: a bf16 training pass of changing lengths ran {speedup:.1f}x as fast as "
        f"float32 ({source})",
    )


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype `model.dtype=name` means on `device`."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        return DTYPES[cpu_precision().dtype]
    return DTYPES[name]


def precision_line(name: str, device_type: str, rounding: str | None = None) -> str:
    """The start line that says which precision a run trains in and why; `rounding`
    (`model.weight_rounding`, None where nothing is trained) how its bf16 weights follow the
    float32 masters (runtime/weight_rounding.py)."""
    if device_type == "cuda":
        chosen = "bfloat16" if name == "auto" else name
        why = "auto on CUDA" if name == "auto" else "as set"
        return f"model.dtype={name}: {chosen} ({why}){_mixed(chosen, rounding)}"
    if name == "auto":
        choice = cpu_precision()
        return f"model.dtype=auto: {choice.dtype} ({choice.reason}){_mixed(choice.dtype, rounding)}"
    return f"model.dtype={name}: as set{_mixed(name, rounding)}"


def slow_bf16_warning(name: str, device_type: str) -> str | None:
    """One paragraph when a half precision is asked for on a CPU that would run it slowly."""
    if device_type != "cpu" or name not in ("bfloat16", "float16"):
        return None
    if name == "bfloat16" and bf16_instructions():
        return None
    what = "AVX-512 BF16 or AMX" if name == "bfloat16" else "native float16 matrix instructions"
    return (
        f"model.dtype={name} on a CPU without {what}: its matmuls are emulated and typically "
        f"10-100x slower than float32. The run goes on as asked; model.dtype=auto (or float32) "
        f"trains in float32 here."
    )


def _mixed(dtype: str, rounding: str | None) -> str:
    if dtype == "float32":
        return ""
    said = "; float32 master weights, optimizer state and softmax statistics"
    if rounding is None:
        return said
    how = "stochastically" if dtype == "bfloat16" and rounding == "stochastic" else "to nearest"
    return f"{said}; the {dtype} weights rounded {how} from the masters after each step"
