"""High-entropy tokens only (`top_entropy_quantile`, docs/objectives.md §0.11), for every objective.

Wang et al. ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for LLM
Reasoning", arXiv 2506.01939) find that the few tokens where the policy is uncertain ("forks")
carry the useful gradient of RLVR: keeping the policy gradient of the top 20 % of tokens by
entropy matches or beats training on all of them. TRL ships it as `top_entropy_quantile`. Here a
token outside the pick keeps its place in the aggregation's normaliser and its KL term; only its
policy term is dropped, through `token_weights`, which every objective multiplies its per-token
term by (algos/objective_loss.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch


def kept_count(quantile: float, valid: int) -> int:
    """n = max(1, int(ρ · N + 0.9999)) tokens kept out of N valid ones (0 when N = 0): the
    authors' code's rounding up, which leaves a product that float rounding put a hair above an
    integer (0.07 · 100 = 7.000000000000001) at that integer."""
    if valid <= 0:
        return 0
    return min(valid, max(1, int(quantile * valid + 0.9999)))


def high_entropy_tokens(
    entropy: Tensor, mask: Tensor, quantile: float
) -> tuple[Tensor, dict[str, float]]:
    """[B, T] bool, the n = `kept_count` valid tokens of highest `entropy` (ties fall as
    `torch.topk` breaks them), and the pick's metrics: entropy_kept_frac (n / N) and
    entropy_threshold (the lowest entropy kept; 0 without tokens)."""
    mask = mask.bool()
    valid = int(mask.sum())
    count = kept_count(quantile, valid)
    kept = torch.zeros_like(mask)
    threshold = 0.0
    if count:
        flat = torch.nonzero(mask.reshape(-1), as_tuple=True)[0]
        values = entropy.detach().reshape(-1)[flat].to(torch.float64)
        top = torch.topk(values, count, largest=True)
        kept.view(-1)[flat[top.indices]] = True
        threshold = float(top.values[-1])
    frac = count / valid if valid else 0.0
    return kept, {"entropy_kept_frac": frac, "entropy_threshold": threshold}


def entropy_kept(batch: PolicyBatch, cfg: AlgoConfig) -> tuple[Tensor | None, dict[str, float]]:
    """[B, T] bool, the tokens whose policy term counts (None when `top_entropy_quantile` = 1),
    and the pick's metrics when it was made here, among these rows, by `old_entropy` (none when
    the pick came in as `entropy_kept`)."""
    if not cfg.entropy_selection:
        return None, {}
    if batch.entropy_kept is not None:
        return batch.entropy_kept, {}
    assert batch.old_entropy is not None  # require_inputs
    return high_entropy_tokens(batch.old_entropy, batch.mask, cfg.top_entropy_quantile)
