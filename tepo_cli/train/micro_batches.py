"""Micro-batches by token budget (`trainer.micro_batch_tokens`, as verl's
`ppo_max_token_len_per_gpu`): which rows of a minibatch go through one forward/backward together.

A micro-batch costs its real tokens: each row's completion tokens, plus each *distinct* prompt's
tokens once, because the shared-prompt forward (models/shared_prompts.py) runs a prompt once per
micro-batch however many of its answers are in it. Counting the prompt per row would overstate
a GRPO group's cost n-fold on short answers and split what runs fine as one micro-batch; counting
it once per micro-batch also makes the planner keep a prompt's answers together, where the saving
is. Padding is not counted (it is the packing path's to remove).

Rows are assigned longest-first to the micro-batch whose cost grows least (a greedy bin packing,
deterministic: ties go to the lower index), so the micro-batches carry similar token totals; a row
longer than the budget ends up alone in a micro-batch of its own, never dropped. The plan is a pure
function of the rows' token counts (no RNG), so a resumed step plans the same micro-batches.

With a prompt pass (models/prompt_pass.py: packing with shared prompts) the minibatch's distinct
prompts run once for all its micro-batches, which then hold answers only: when the prompts-included
plan needs two micro-batches or more, the minibatch is planned again on its answers' tokens alone,
and its prompts run once beside them. One micro-batch keeps its prompts in its own row (nothing to
share; a prompt pass would only add a forward).

Under data parallelism every rank must run the same number of micro-batches (under ZeRO-3 every
forward is a collective), and the prompt pass on every rank or on none: `agreed` takes the
largest count over ranks (one all-reduce), and ranks with fewer tokens split finer to meet it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.packing import ExternalPrompts
from tepo_cli.models.prompt_pass import MinibatchPrompts, PassOf, reads_prompt_pass

T = TypeVar("T")


def row_tokens(batch: SequenceBatch, rows: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
    """(completion tokens of each row, each row's distinct-prompt index, tokens of each distinct
    prompt) for these rows of the batch: what the planner weighs."""
    width = batch.prompt_width
    prompt_mask = batch.attention_mask[rows, :width]
    first, owner = batch.distinct_prompts(rows)
    completion = batch.completion_mask[rows].sum(dim=1)
    return completion.tolist(), owner.tolist(), prompt_mask[first].sum(dim=1).tolist()


def assign(
    completion: list[int], owner: list[int], prompt: list[int], count: int
) -> list[list[int]]:
    """Rows (indices into `completion`) in `count` micro-batches (fewer when there are fewer rows),
    longest row first into the micro-batch whose cost grows to the least; each micro-batch's rows
    ascending, micro-batches ordered by their first row."""
    count = max(1, min(count, len(completion)))
    bins: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    prompts: list[set[int]] = [set() for _ in range(count)]
    longest_first = sorted(range(len(completion)), key=lambda r: (-completion[r], r))
    for seed, row in enumerate(longest_first[:count]):  # every micro-batch gets a row
        bins[seed].append(row)
        loads[seed] = completion[row] + prompt[owner[row]]
        prompts[seed].add(owner[row])
    for row in longest_first[count:]:
        cost = [
            loads[b] + completion[row] + (0 if owner[row] in prompts[b] else prompt[owner[row]])
            for b in range(count)
        ]
        best = min(range(count), key=lambda b: (cost[b], b))
        bins[best].append(row)
        loads[best] = cost[best]
        prompts[best].add(owner[row])
    return sorted((sorted(rows) for rows in bins), key=lambda rows: rows[0])


def micro_batch_cost(
    rows: list[int], completion: list[int], owner: list[int], prompt: list[int]
) -> int:
    """Real tokens of a micro-batch: its completions, and each distinct prompt once."""
    return sum(completion[r] for r in rows) + sum(prompt[p] for p in {owner[r] for r in rows})


def micro_batch_tokens(batch: SequenceBatch, rows: torch.Tensor) -> int:
    """Real tokens of these rows as one micro-batch (what the budget is compared with)."""
    completion, owner, prompt = row_tokens(batch, rows)
    return micro_batch_cost(list(range(len(completion))), completion, owner, prompt)


def plan(
    completion: list[int], owner: list[int], prompt: list[int], budget: int
) -> list[list[int]]:
    """The fewest balanced micro-batches in which every micro-batch of two or more rows stays
    within `budget` tokens (a single row over it goes alone)."""
    rows = len(completion)
    if rows == 0:
        return []
    total = sum(completion) + sum(prompt)  # every prompt once: a lower bound of any split
    count = max(1, -(-total // budget))
    while True:
        bins = assign(completion, owner, prompt, count)
        over = [
            b
            for b in bins
            if len(b) > 1 and micro_batch_cost(b, completion, owner, prompt) > budget
        ]
        if not over or count >= rows:
            return bins
        count += 1


def agreed(counts: list[int]) -> list[int]:
    """The largest of each count over ranks (one all-reduce), `counts` themselves on one rank."""
    if not collective.multi_rank():
        return counts
    largest = collective.all_max(torch.tensor(counts, dtype=torch.int64, device="cpu"))
    return [int(count) for count in largest.tolist()]


@dataclass(frozen=True)
class Plan:
    """A minibatch's micro-batches: `minibatch`, the rows planned (host indices into the batch);
    `rows`, each micro-batch's; `prompt_pass`: the distinct prompts run once, in a prompt pass,
    and the micro-batches hold answers only; `costs`: each micro-batch's real tokens as it runs
    (None in the fixed-count mode). The one micro-batch loop: the update's learners and the
    three scorers (π_old and the reference, the critic's values, the left-out entropy) run it
    through `prompts` and `scores`."""

    minibatch: torch.Tensor
    rows: list[torch.Tensor]
    prompt_pass: bool = False
    costs: list[int] | None = None

    def prompts(self, pass_of: PassOf, batch: SequenceBatch) -> MinibatchPrompts:
        """The minibatch's distinct prompts through `pass_of` once, for all its micro-batches,
        where the plan has a prompt pass (models/prompt_pass.py)."""
        return MinibatchPrompts.run(pass_of, batch, self.minibatch, self.rows, self.prompt_pass)

    def scores(
        self,
        pass_of: PassOf,
        batch: SequenceBatch,
        forward: Callable[[SequenceBatch, ExternalPrompts | None], T],
    ) -> list[T]:
        """`forward(micro-batch, what it reads of the prompt pass)` of each micro-batch, in plan
        order, after the prompt pass through `pass_of`."""
        prompts = self.prompts(pass_of, batch)
        return [forward(batch.select(rows), prompts.read(i)) for i, rows in enumerate(self.rows)]

    def in_row_order(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The micro-batches' results (rows first, in plan order) in the order of their rows."""
        return torch.cat(parts)[torch.argsort(torch.cat(self.rows))]


def micro_batches(
    batch: SequenceBatch,
    rows: torch.Tensor,
    budget: int | None,
    size: int,
    prompt_pass: bool = False,
) -> Plan:
    """These rows of the batch in micro-batches: by token budget (`budget` tokens, the same count
    on every rank), or `size` rows each when `budget` is None (the fixed-count mode). With
    `prompt_pass` (the model can read one), a minibatch of several micro-batches runs its
    prompts once (module docstring)."""
    if budget is None:
        parts = list(rows.split(size))
        return Plan(rows, parts, prompt_pass and len(parts) > 1)
    completion, owner, prompt = row_tokens(batch, rows)
    count = len(plan(completion, owner, prompt, budget))
    answers_only = len(plan(completion, owner, [0] * len(prompt), budget)) if prompt_pass else 0
    count, answers_only = agreed([count, answers_only])
    use_pass = count > 1 and answers_only > 0  # the same on every rank
    if use_pass:  # the prompts run once, beside the micro-batches: their answers planned alone
        count, prompt = answers_only, [0] * len(prompt)
    # Each rank holds as many rows as the others (prompts_per_step / nproc groups of rollout.n),
    # so the agreed count never exceeds this rank's rows.
    parts = assign(completion, owner, prompt, count)
    return Plan(
        minibatch=rows,
        rows=[rows[torch.tensor(part, dtype=torch.long, device="cpu")] for part in parts],
        prompt_pass=use_pass,
        costs=[micro_batch_cost(part, completion, owner, prompt) for part in parts],
    )


def micro_batches_for(
    cfg: TrainConfig, batch: SequenceBatch, rows: torch.Tensor, model: torch.nn.Module
) -> Plan:
    """`micro_batches` at the run's budget and size, for `model`: a prompt pass where
    `model.prompt_pass` is on and the model can read one (the update, scoring, the critic)."""
    trainer = cfg.trainer
    prompt_pass = cfg.model.prompt_pass and reads_prompt_pass(model)
    return micro_batches(
        batch, rows, trainer.micro_batch_tokens, trainer.micro_batch_size, prompt_pass=prompt_pass
    )
