"""`token_logprobs`: argument checks and the choice of back-end.

Back-ends: `torch` (chunked.py, any device), `triton` (triton_logprobs.py, CUDA only; imported
lazily), `naive` (naive.py, the test reference) and `auto` = triton for CUDA tensors when triton
imports and its first call works, else torch.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import warnings
from numbers import Real
from types import ModuleType
from typing import Any

import torch

from tepo_cli.kernels.blocking import choose_blocking, full_vocab_rows
from tepo_cli.kernels.chunked import chunked_backward, chunked_forward
from tepo_cli.kernels.function import Backend, TokenLogprobs
from tepo_cli.kernels.naive import naive_token_logprobs
from tepo_cli.kernels.tf32 import tf32_for_half_inputs

BACKENDS = ("auto", "torch", "triton", "naive")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_triton_broken: str | None = None  # set when the auto back-end's triton call failed once


@functools.lru_cache(maxsize=1)
def _load_triton() -> tuple[ModuleType | None, str]:
    """(the triton_logprobs module or None, why not)."""
    try:
        module = importlib.import_module("tepo_cli.kernels.triton_logprobs")
    except Exception as exc:  # ImportError, or a triton install that fails to initialise
        return None, f"triton could not be imported ({type(exc).__name__}: {exc})"
    return module, ""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None if the triton back-end can run on tensors of this device and dtype, else why not."""
    if dtype not in TRITON_DTYPES:
        return f"it supports float16/bfloat16/float32 inputs (got {dtype})"
    module, why = _load_triton()
    if module is None:
        return why
    if device.type != "cuda" and not _interpreting():
        return f"it needs CUDA tensors (got device '{device.type}')"
    return None


def available_backends(device: torch.device, dtype: torch.dtype = torch.float32) -> list[str]:
    names = ["torch", "naive"]
    if triton_unavailable_reason(device, dtype) is None:
        names.insert(0, "triton")
    return names


def _check_int(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")


def validate(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int | None,
    backend: str,
    vocab_chunk_size: int | None,
) -> None:
    """Raise ValueError naming the offending argument."""
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [V, H], got shape {tuple(weight.shape)}")
    if hidden.dtype not in FLOAT_DTYPES:
        raise ValueError(f"hidden must be a floating tensor, got dtype {hidden.dtype}")
    if weight.dtype not in FLOAT_DTYPES:
        raise ValueError(f"weight must be a floating tensor, got dtype {weight.dtype}")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"weight has hidden size {weight.shape[1]} but hidden has {hidden.shape[1]} "
            f"(weight {tuple(weight.shape)}, hidden {tuple(hidden.shape)})"
        )
    if weight.shape[0] < 1:
        raise ValueError("weight must have at least one vocabulary row")
    if targets.dtype != torch.int64:
        raise ValueError(f"targets must be an int64 (torch.long) tensor, got dtype {targets.dtype}")
    if targets.shape != (hidden.shape[0],):
        raise ValueError(
            f"targets must have shape [N] = ({hidden.shape[0]},) to match hidden, "
            f"got {tuple(targets.shape)}"
        )
    if not (hidden.device == weight.device == targets.device):
        raise ValueError(
            f"hidden, weight and targets must be on one device, got {hidden.device}, "
            f"{weight.device}, {targets.device}"
        )
    if targets.numel() > 0:
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= weight.shape[0]:
            bad = lo if lo < 0 else hi
            raise ValueError(f"targets must lie in [0, {weight.shape[0]}) (V), found {bad}")
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, Real)
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    _check_int("chunk_size", chunk_size)
    _check_int("vocab_chunk_size", vocab_chunk_size)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def resolve_backend(backend: str, hidden: torch.Tensor, weight: torch.Tensor) -> str:
    """The concrete back-end ('torch', 'triton' or 'naive') for these inputs."""
    dtype = torch.promote_types(hidden.dtype, weight.dtype)
    if backend == "triton":
        why = triton_unavailable_reason(hidden.device, dtype)
        if why is not None:
            available = ", ".join(available_backends(hidden.device, dtype))
            raise ValueError(
                f"backend='triton' is not available: {why}; available backends here: "
                f"{available} (or 'auto')"
            )
        return "triton"
    if backend == "auto":
        if (
            hidden.device.type == "cuda"
            and _triton_broken is None
            and triton_unavailable_reason(hidden.device, dtype) is None
        ):
            return "triton"
        return "torch"
    return backend


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    backend: str = "auto",
    *,
    vocab_chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` under softmax(hidden @ weight.T / temperature), chunk by chunk.

    hidden [N, H] (float16/bfloat16/float32/float64), weight [V, H] (the lm-head, possibly the
    tied input embedding), targets [N] int64. Returns (logp [N], entropy [N] or None), float64
    if an input is float64 else float32. Differentiable w.r.t. hidden and weight, including
    through the entropy. The [N, V] logits are never materialised (except by backend='naive'):
    `chunk_size` rows (tokens) and `vocab_chunk_size` vocabulary entries at a time, both sized
    from the vocabulary when None (see blocking.py). Without grad (no_grad, or no input requires
    grad), nothing is saved for a backward pass.
    """
    global _triton_broken
    validate(hidden, weight, targets, temperature, chunk_size, backend, vocab_chunk_size)
    temperature = float(temperature)
    name = resolve_backend(backend, hidden, weight)
    if name == "naive":
        return naive_token_logprobs(hidden, weight, targets, temperature, with_entropy)
    if name == "triton":
        try:
            return _triton_logprobs(hidden, weight, targets, temperature, with_entropy, chunk_size)
        except Exception as exc:
            if backend == "triton":
                raise
            _triton_broken = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"the triton log-prob kernel failed ({_triton_broken}); using the torch "
                "back-end from now on",
                RuntimeWarning,
                stacklevel=2,
            )
    blocking = choose_blocking(
        hidden.shape[0], weight.shape[0], hidden.device, chunk_size, vocab_chunk_size
    )
    if not _needs_grad(hidden, weight):
        logp, ent, _ = _torch_forward(
            hidden.detach(), weight.detach(), targets, temperature, with_entropy, blocking
        )
        return logp, ent
    logp, ent = TokenLogprobs.apply(
        hidden, weight, targets, temperature, with_entropy, blocking, _TORCH
    )
    return logp, (ent if with_entropy else None)


def _torch_forward(hidden: torch.Tensor, weight: torch.Tensor, *args: Any) -> Any:
    """chunked.py's forward; half-precision CUDA inputs multiply in TF32 (kernels/tf32.py)."""
    with tf32_for_half_inputs(weight):
        return chunked_forward(hidden, weight, *args)


def _torch_backward(active: Any, weight: torch.Tensor, *args: Any) -> Any:
    with tf32_for_half_inputs(weight):
        return chunked_backward(active, weight, *args)


_TORCH = Backend(_torch_forward, _torch_backward)


def _triton_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    module, _ = _load_triton()
    assert module is not None  # resolve_backend checked
    rows = full_vocab_rows(hidden.shape[0], weight.shape[0], hidden.device, chunk_size)
    targets = targets.contiguous()
    if not _needs_grad(hidden, weight):
        logp, ent, _ = module.triton_forward(
            hidden.detach(), weight.detach(), targets, temperature, with_entropy, rows
        )
        return logp, ent
    backend = Backend(module.triton_forward, module.triton_backward)
    logp, ent = TokenLogprobs.apply(
        hidden, weight, targets, temperature, with_entropy, rows, backend
    )
    return logp, (ent if with_entropy else None)
