"""`policy_loss`: the public, stable entry point to the objectives (docs/objectives.md §4)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from tepo_cli.algos import cispo as _cispo  # noqa: F401  (cispo)
from tepo_cli.algos import cov_objectives as _cov_objectives  # noqa: F401  (kl_cov, clip_cov)
from tepo_cli.algos import gmpo as _gmpo  # noqa: F401  (gmpo)
from tepo_cli.algos import objectives as _objectives  # noqa: F401  (registers the presets)
from tepo_cli.algos import sapo as _sapo  # noqa: F401  (sapo)
from tepo_cli.algos.batch import PolicyBatch, checked_batch, require_inputs
from tepo_cli.algos.objective_loss import objective_loss
from tepo_cli.algos.presets import AlgoSpec, resolve_algo


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
    entropy, old_entropy: [B, T], for TEPO's KL mask (entropy too: mask_criterion=entropy_drop);
                 entropy, with its gradient, for the entropy bonus (entropy_coef != 0).
    named:       keyword only, the other `PolicyBatch` fields (its docstring says what each
                 holds): mtp_logp, old_mtp_logp [B, T, K−1] (MPO, future=mtp), old_entropy_term
                 (TEPO first_order), token_weights (mismatch correction), sampling_logp (the
                 engine's own log-probs, off_policy_mask), turns (episodes),
                 cov_selected and generator (KL-Cov / Clip-Cov), entropy_kept (the tokens kept
                 by `top_entropy_quantile`; else picked here by old_entropy), the optimizer step's global
                 normalisers num_tokens, num_seqs, max_len (§0.5: the micro-batch losses then
                 sum to the loss of one big batch); any other keyword is an AlgoConfig knob
                 (k=4, loss_agg="token-mean", ...). A ValueError names the argument missing or
                 misshapen.

    Metrics: pg_loss, kl_loss, kl, clip_frac(_low/_high), dual_clip_frac, ratio_mean, kl_mask_frac;
    KL-Cov / Clip-Cov: cov_loss, cov_abs_kl, and (when they pick here) cov_selected,
    cov_selected_frac, cov_selected_mean, cov_candidates (docs/objectives.md §1.6);
    top_entropy_quantile < 1, picking here: entropy_kept_frac, entropy_threshold (§0.11);
    entropy_coef != 0: entropy_bonus_loss (§0.12); off_policy_mask set: off_policy_masked_frac
    (§0.13)."""
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
    return objective_loss(batch, cfg)
