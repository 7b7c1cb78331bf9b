"""`PolicyBatch`: the checked inputs of one policy-loss call (docs/objectives.md §4)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from numbers import Real

import torch
from torch import Tensor

from tepo_cli.algos.aggregate import Count
from tepo_cli.algos.algo_config import AlgoConfig


def _per_token(*, detached: bool, scored: bool = False, depths: bool = False) -> dict[str, bool]:
    """The metadata of a [B, T] input field (with `depths`, [B, T, D]) that `checked_batch` zeroes
    on padding; `detached`: the objective reads it without gradient; `scored`: a policy pass's
    score, made for the current policy as `name`, for the rollout policy as `old_<name>`
    (algos/inputs.py)."""
    return {"detached": detached, "scored": scored, "depths": depths}


@dataclass(frozen=True)
class PolicyBatch:
    """Per-token inputs [B, T] (advantages [B] or [B, T]) of B responses, as every loss plugin
    receives them.

    Passed through `checked_batch`, which checks shapes and makes padding harmless: `mask` is bool,
    every [B, T] tensor is 0 on padding (so padding gets exactly zero gradient, whatever the caller
    left there), and old_logp, ref_logp, old_entropy and advantages are detached.
    `num_tokens`, `num_seqs`, `max_len` override the aggregation normalisers (§0.5); None means
    "count these rows".
    MPO with `future=mtp` reads `mtp_logp` / `old_mtp_logp` [B, T, K−1]: entry [b, t, n−2] is the
    log-prob, under MTP depth n at anchor t, of the token n−1 valid positions after t (0 where
    that token does not exist). TEPO's `first_order` mask reads `old_entropy_term` [B, T].
    `token_weights` [B, T] (None = 1) multiply each token's policy term: the rollout–training
    mismatch correction (algos/mismatch.py); a plugin that builds its own surrogate applies them.
    `sampling_logp` [B, T] (None = old_logp): the rollout engine's own log-probs of the sampled
    tokens, which off-policy sequence masking measures the drift from (§0.13).
    `turns` [B, T] (multi-turn episodes, None otherwise): the turn of each of the model's tokens,
    so that K-blocks and sliding windows stay inside one turn (docs/objectives.md §0.2).
    `cov_selected` [B, T] bool (KL-Cov, Clip-Cov, §1.6): the tokens picked by covariance over a
    larger set (training: the optimizer step's rows); None = pick among these rows, Clip-Cov's
    draw from `generator` (None = a generator seeded with 0).
    `entropy_kept` [B, T] bool (`top_entropy_quantile` < 1, §0.11): the tokens whose policy term
    counts, picked by entropy over a larger set (training: the optimizer step's rows); None =
    pick among these rows by `old_entropy`.
    """

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    ref_logp: Tensor | None = field(default=None, metadata=_per_token(detached=True))
    entropy: Tensor | None = field(default=None, metadata=_per_token(detached=False, scored=True))
    old_entropy: Tensor | None = field(
        default=None, metadata=_per_token(detached=True, scored=True)
    )
    mtp_logp: Tensor | None = field(
        default=None, metadata=_per_token(detached=False, scored=True, depths=True)
    )
    old_mtp_logp: Tensor | None = field(
        default=None, metadata=_per_token(detached=True, scored=True, depths=True)
    )
    old_entropy_term: Tensor | None = field(
        default=None, metadata=_per_token(detached=True, scored=True)
    )
    token_weights: Tensor | None = field(default=None, metadata=_per_token(detached=True))
    sampling_logp: Tensor | None = field(default=None, metadata=_per_token(detached=True))
    turns: Tensor | None = None  # [B, T] int64 turn of each token (multi-turn episodes), or None
    cov_selected: Tensor | None = None  # [B, T] bool, KL-Cov / Clip-Cov's pick, or None
    generator: torch.Generator | None = None  # Clip-Cov's draw when it picks among these rows
    entropy_kept: Tensor | None = None  # [B, T] bool, the high-entropy pick (§0.11), or None
    num_tokens: Count | None = None
    num_seqs: Count | None = None
    max_len: Count | None = None

    @property
    def normalisers(self) -> dict[str, Count | None]:
        return {"num_tokens": self.num_tokens, "num_seqs": self.num_seqs, "max_len": self.max_len}


PER_TOKEN = {f.name: f.metadata for f in dataclasses.fields(PolicyBatch) if f.metadata}
"""The optional per-token inputs, each with its `_per_token` spec."""
_FLAT = [name for name, spec in PER_TOKEN.items() if not spec["depths"]]  # the [B, T] ones


def checked_batch(raw: PolicyBatch) -> PolicyBatch:
    """`raw`'s inputs checked (ValueError naming the argument), as every loss plugin receives them:
    bool mask, 0 on padding, detached where the objective reads no gradient."""
    logp, advantages = raw.logp, raw.advantages
    mask = _checked_mask(logp, raw.mask)
    shape = tuple(logp.shape)
    if not isinstance(advantages, Tensor) or tuple(advantages.shape) not in (shape[:1], shape):
        raise ValueError(
            f"advantages must be [B] = ({shape[0]},), one per response, or [B, T] = {shape}, one "
            f"per token, got {_describe(advantages)}"
        )
    if raw.old_logp is None:
        raise ValueError("old_logp is required (the rollout policy's token log-probs)")
    for name in ("old_logp", *_FLAT, "turns", "cov_selected", "entropy_kept"):
        tensor = getattr(raw, name)
        if tensor is not None and (not isinstance(tensor, Tensor) or tuple(tensor.shape) != shape):
            raise ValueError(
                f"{name} must be [B, T] shaped like logp {shape}, got {_describe(tensor)}"
            )
    _check_mtp(raw.mtp_logp, raw.old_mtp_logp, shape)
    for name, count in raw.normalisers.items():
        _check_count(name, count)
    selected, kept = raw.cov_selected, raw.entropy_kept
    return dataclasses.replace(
        raw,
        logp=_zero_padding(logp, mask, detach=False),
        advantages=(
            _zero_padding(advantages.to(logp.dtype), mask, detach=True)
            if advantages.dim() == 2
            else advantages.detach().to(logp.dtype)
        ),
        mask=mask,
        old_logp=_zero_padding(raw.old_logp, mask, detach=True),
        **{
            name: _zero_padding(getattr(raw, name), mask, detach=spec["detached"])
            for name, spec in PER_TOKEN.items()
        },
        cov_selected=None if selected is None else selected.bool() & mask,
        entropy_kept=None if kept is None else kept.bool() & mask,
    )


def _checked_mask(logp: Tensor, mask: Tensor) -> Tensor:
    """logp must be [B, T] float; the mask, shaped like it, comes back as bool."""
    if not isinstance(logp, Tensor) or logp.dim() != 2 or not logp.is_floating_point():
        raise ValueError(f"logp must be a [B, T] float tensor, got {_describe(logp)}")
    shape = tuple(logp.shape)
    if not isinstance(mask, Tensor) or tuple(mask.shape) != shape:
        raise ValueError(
            f"mask must be a [B, T] tensor shaped like logp {shape}, got {_describe(mask)}"
        )
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be bool or hold only 0 and 1")
        mask = mask != 0
    return mask


def _zero_padding(tensor: Tensor | None, mask: Tensor, detach: bool) -> Tensor | None:
    """0 on padding ([B, T] or [B, T, D] values), detached where the objective reads no gradient."""
    if tensor is None:
        return None
    tensor = tensor.detach() if detach else tensor
    where = mask if tensor.dim() == 2 else mask.unsqueeze(-1)
    return torch.where(where, tensor, 0.0)


def require_inputs(batch: PolicyBatch, cfg: AlgoConfig) -> None:
    """Fail early, naming the missing argument, when the objective's knobs need an input."""
    if cfg.needs_ref and batch.ref_logp is None:
        raise ValueError(
            f"ref_logp is required: algo {cfg.name} has a KL term to the reference "
            f"(beta={cfg.beta}, kl_target=ref); pass ref_logp, or set beta=0 or kl_target=old"
        )
    if cfg.entropy_selection and batch.entropy_kept is None and batch.old_entropy is None:
        raise ValueError(
            f"old_entropy is required: top_entropy_quantile={cfg.top_entropy_quantile} keeps the "
            "tokens of highest rollout-policy entropy; pass old_entropy (or the pick itself as "
            "entropy_kept), or set top_entropy_quantile=1"
        )
    if cfg.needs_old_entropy and batch.old_entropy is None:
        raise ValueError(
            f"old_entropy is required: algo {cfg.name} masks its KL term with kl_mask=tepo "
            f"(beta={cfg.beta}); pass the rollout policy's token entropies"
        )
    if cfg.needs_old_entropy_term and batch.old_entropy_term is None:
        raise ValueError(
            f"old_entropy_term is required: algo {cfg.name} uses mask_criterion=first_order; pass "
            "the rollout policy's S = sum_j p_j^2 (log p_j + H) per token "
            "(tepo_cli.kernels.token_entropy_terms)"
        )
    depths = cfg.mtp_depths
    if depths:
        for name in ("mtp_logp", "old_mtp_logp"):
            tensor = getattr(batch, name)
            if tensor is None:
                raise ValueError(
                    f"{name} is required: algo {cfg.name} uses future=mtp with k={cfg.k}; pass "
                    f"the MTP depths' log-probs [B, T, {depths}] (or set future=exact)"
                )
            if tensor.shape[-1] != depths:
                raise ValueError(
                    f"{name} has {tensor.shape[-1]} MTP depths in its last dimension, but k={cfg.k} "
                    f"needs k - 1 = {depths}"
                )
    if cfg.entropy_coef != 0 and batch.entropy is None:
        raise ValueError(
            f"entropy is required: entropy_coef={cfg.entropy_coef} adds the current policy's "
            "token entropies (with their gradient) to the loss; pass entropy, or set entropy_coef=0"
        )
    if cfg.needs_entropy and batch.entropy is None:
        raise ValueError(
            f"entropy is required: algo {cfg.name} uses mask_criterion=entropy_drop; pass the "
            "current policy's token entropies"
        )


def _check_mtp(mtp_logp: Tensor | None, old_mtp_logp: Tensor | None, shape: tuple) -> None:
    given = {"mtp_logp": mtp_logp, "old_mtp_logp": old_mtp_logp}
    for name, tensor in given.items():
        if tensor is None:
            continue
        if not isinstance(tensor, Tensor) or tensor.dim() != 3 or tuple(tensor.shape[:2]) != shape:
            raise ValueError(
                f"{name} must be [B, T, K-1] with [B, T] = {shape} like logp, got "
                f"{_describe(tensor)}"
            )
    if (mtp_logp is None) != (old_mtp_logp is None):
        missing = "old_mtp_logp" if old_mtp_logp is None else "mtp_logp"
        raise ValueError(f"{missing} is required with the other MTP log-probs (pass both)")
    if mtp_logp is not None and old_mtp_logp is not None and mtp_logp.shape != old_mtp_logp.shape:
        raise ValueError(
            f"old_mtp_logp {tuple(old_mtp_logp.shape)} must match mtp_logp {tuple(mtp_logp.shape)}"
        )


def _check_count(name: str, count: Count | None) -> None:
    if count is None:
        return
    if isinstance(count, Tensor):
        if count.numel() != 1:
            raise ValueError(
                f"{name} must be a single count, got a tensor of shape {tuple(count.shape)}"
            )
        return
    if isinstance(count, bool) or not isinstance(count, Real) or not count > 0:
        raise ValueError(f"{name} must be a positive number (a global count), got {count!r}")


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
