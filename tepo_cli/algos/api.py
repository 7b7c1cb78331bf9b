"""`policy_loss`: the public, stable entry point to the objectives (docs/objectives.md §4)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from tepo_cli.algos import cov_objectives as _cov_objectives  # noqa: F401  (kl_cov, clip_cov)
from tepo_cli.algos import objectives as _objectives  # noqa: F401  (registers the presets)
from tepo_cli.algos.batch import PolicyBatch, checked_batch, require_inputs
from tepo_cli.algos.presets import AlgoSpec, resolve_algo
from tepo_cli.algos.registry import get_policy_loss


def policy_loss(
    algo: AlgoSpec,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    old_entropy: Tensor | None = None,
    **named: Any,
) -> tuple[Tensor, dict[str, float]]:
    """Loss (0-dim: policy term + KL term) and float metrics of objective `algo` on B responses.

    algo:        a preset name from conf/algo/ ("grpo", "dapo", "gspo", "tepo", "mpo"), or an
                 algo config (dict, DictConfig, AlgoConfig) whose `name` is a registered loss.
    logp:        [B, T] current token log-probs (with grad); old_logp: [B, T] rollout log-probs.
    advantages:  [B] one advantage per response, or [B, T] one per token (e.g. GAE); a unit takes
                 its anchor's or its own token's, or its tokens' mean (docs/objectives.md §0.1).
    mask:        [B, T] bool / 0-1 response tokens; padding may be on either side.
    ref_logp:    [B, T] reference log-probs, required when beta > 0 and kl_target=ref.
    entropy, old_entropy: [B, T], for TEPO's KL mask (entropy too: mask_criterion=entropy_drop).
    named:       any other field of `PolicyBatch` by name, keyword only:
                 mtp_logp, old_mtp_logp [B, T, K−1], required by MPO with future=mtp: [b, t, n−2]
                 is MTP depth n's log-prob at anchor t of the token n−1 valid positions after t;
                 old_entropy_term [B, T] S = Σ_j p_j²(log p_j + H) of the rollout policy (TEPO
                 first_order); token_weights [B, T] ≥ 0, detached: each token's policy term is
                 multiplied by its weight (mismatch correction, tepo_cli.algos.mismatch), not the
                 KL term, None = 1; turns [B, T] int64 turn of each token (episodes only): no block
                 or window spans two; cov_selected [B, T] bool, KL-Cov / Clip-Cov only: the
                 tokens already picked by covariance over a larger set (the trainer picks over
                 the optimizer step's rows), None: pick among these rows; generator: Clip-Cov's
                 random draw (None: seeded with 0); the normalisers of the whole optimizer step:
                 `num_tokens` (valid tokens, token-mean), `num_seqs` (responses, seq-mean modes),
                 `max_len` (seq-mean-token-sum-norm; default T). With global normalisers, the sum
                 of the micro-batch losses is the loss of one big batch.
                 The other keywords are AlgoConfig knobs (k=4, loss_agg="token-mean",
                 eps_high=0.28, ...). A ValueError names the argument missing or misshapen.

    Metrics: pg_loss, kl_loss, kl, clip_frac(_low/_high), dual_clip_frac, ratio_mean, kl_mask_frac;
    KL-Cov / Clip-Cov: cov_loss, cov_abs_kl, and (when they pick here) cov_selected,
    cov_selected_frac, cov_selected_mean, cov_candidates (docs/objectives.md §1.6)."""
    fields = {field.name for field in dataclasses.fields(PolicyBatch)}
    inputs = {name: named.pop(name) for name in list(named) if name in fields}
    cfg = resolve_algo(algo, named)
    raw = PolicyBatch(
        logp,
        old_logp,
        advantages,
        mask,
        ref_logp=ref_logp,
        entropy=entropy,
        old_entropy=old_entropy,
        **inputs,
    )
    batch = checked_batch(raw)
    require_inputs(batch, cfg)
    return get_policy_loss(cfg.name)(batch, cfg)
