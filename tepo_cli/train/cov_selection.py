"""KL-Cov / Clip-Cov's token pick, once per optimizer step over its rows (docs/objectives.md §1.6).

verl picks per micro-batch: Ā, ℓ̄, N and the top-k or the random draw are over the micro-batch's
tokens. tepo plans micro-batches by a token budget, so the same step would pick differently under
another budget. [our reading] The pick is made once per optimizer step over the minibatch's rows
on this rank (all of the step's rows with one process and one minibatch), before its
micro-batches run, so it does not depend on how they are cut:
- cov uses π_old's log-probs (the score stage's: `experience.old_logp`, or, on-policy, the
  `selection` it scores for the picks alone), since the current ones of the whole step exist
  only after every micro-batch's forward. On the first optimizer step of a rollout π = π_old, so
  the pick is verl's; later minibatches and epochs pick by π_old where verl uses the moved π.
- Clip-Cov's "already clipped" exclusion reads the ratio at pick time, which is 1 (π = π_old):
  no token is excluded. A token that the clip catches later gets no gradient from its clipped
  term anyway, so this changes which tokens the budget is spent on, never a kept token's term.
- The random draw's generator is seeded with a hash of (run seed, step, rank, epoch, minibatch):
  the same run picks the same tokens, and a resumed run picks what the uninterrupted one would.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.covariance import (
    CovSelection,
    random_in_window,
    token_covariance,
    top_covariance,
)
from tepo_cli.train.experience import Experience


def selection_seed(run_seed: int, step: int, epoch: int, minibatch: int) -> int:
    """A 63-bit seed for one optimizer step's draw on this rank: a hash of the run seed, the
    step, this process's rank, the epoch and the minibatch (so each draws apart, and nothing
    else moves it)."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    digest = hashlib.sha256(f"cov/{run_seed}/{step}/{rank}/{epoch}/{minibatch}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def step_selection(
    algo: AlgoConfig, experience: Experience, minibatch: torch.Tensor, seed: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """[N, T] bool over the step's experience rows: the tokens of `minibatch` (host row indices)
    that `algo` picks (False on every other row), and the pick's metrics (cov_selected,
    cov_selected_frac, cov_selected_mean, Clip-Cov's cov_candidates)."""
    logp = experience.before_update("old_logp")
    if logp is None:
        raise ValueError(
            f"algo {algo.name} picks its tokens before the step's forwards: the score stage must "
            "provide pi_old's log-probs (experience.old or experience.selection)"
        )
    mask = experience.batch.trained_mask
    rows = minibatch.to(mask.device)
    part_mask = mask[rows]
    advantages = experience.advantages[minibatch.to(experience.advantages.device)]
    cov = token_covariance(advantages, logp[rows.to(logp.device)], part_mask.to(logp.device))
    pick: CovSelection
    if algo.name == "kl_cov":
        pick = top_covariance(cov, part_mask.to(cov.device), algo.cov_fraction)
    else:
        generator = torch.Generator().manual_seed(seed)
        pick = random_in_window(
            cov.cpu(), part_mask.cpu(), None, algo.cov_lb, algo.cov_ub, algo.cov_fraction, generator
        )
    selected = torch.zeros_like(mask)
    selected[rows] = pick.selected.to(mask.device)
    return selected, pick.metrics()
