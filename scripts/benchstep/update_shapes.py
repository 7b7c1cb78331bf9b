"""What an update forwards: answer lengths and the token slots of its micro-batches (pure, no torch).

The padding share of an update is the share of the token slots its forward/backward computes on
that hold padding: slots = Σ over micro-batches of the tensor shapes the model runs,
real = the tokens that are not padding in them. Both sides are counted the same way:

  tepo  with packing (model.packing, the default) a micro-batch is its real tokens in one row:
        no padding, each distinct prompt once with shared prompts (model.share_prompts) — or,
        when the minibatch ran a prompt pass (model.prompt_pass, models/prompt_pass.py), its
        answers only, each distinct prompt of the minibatch counted once, in the pass. Padded
        (model.packing=false): each micro-batch is cut to its own longest answer
        (SequenceBatch.select); with shared prompts (no gradient checkpointing) each distinct
        prompt runs once, [P] left-padded columns, and its answers [rows, width] attend to its
        cache; otherwise every row is [P + width].
  TRL   every micro-batch is [rows, P + C]: prompts left-padded to the batch's longest, answers
        right-padded to the generation batch's longest (its padded tensors, counted as they are).

Truncated = an answer that reached the max_new_tokens cap.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class UpdateShapes:
    slots: int  # token positions the update's forward/backward computes
    real: int  # of those, not padding
    answer_tokens: int  # real answer tokens (the ones the loss trains on)
    micro_batches: int

    @property
    def padding_share(self) -> float:
        return 1.0 - self.real / self.slots if self.slots else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "padding_share": self.padding_share}


def fixed_plan(rows: int, micro_batch_size: int) -> list[list[int]]:
    """tepo's fixed-count micro-batches (trainer.micro_batch_size rows each, in order)."""
    return [
        list(range(i, min(i + micro_batch_size, rows))) for i in range(0, rows, micro_batch_size)
    ]


def tepo_shapes(
    answer_lengths: Sequence[int],
    prompt_lengths: Sequence[int],
    prompt_of_row: Sequence[int],
    prompt_width: int,
    plan: Sequence[Sequence[int]],
    shared_prompts: bool,
    packed: bool = False,
    prompt_passes: Sequence[Sequence[int]] = (),
) -> UpdateShapes:
    """tepo's update over `plan` (row indices per micro-batch). `prompt_lengths[g]` is the real
    length of distinct prompt g, `prompt_of_row[i]` the prompt of row i, `prompt_width` the
    step's left-padded prompt width P; `packed`: the real tokens in one row, no padding slots;
    `prompt_passes`: the rows of each minibatch that ran one (packed: its distinct prompts once,
    its micro-batches' answers alone)."""
    slots = real = answers = 0
    passed = {row for rows in prompt_passes for row in rows}
    for rows in prompt_passes:
        prompt_real = sum(prompt_lengths[g] for g in {prompt_of_row[i] for i in rows})
        slots, real = slots + prompt_real, real + prompt_real
    for rows in plan:
        width = max((answer_lengths[i] for i in rows), default=0)
        width = max(width, 1)  # select() keeps one column when every answer is empty
        answer_real = sum(answer_lengths[i] for i in rows)
        prompts = sorted({prompt_of_row[i] for i in rows}) if shared_prompts else list(rows)
        if set(rows) <= passed:
            prompts = []  # the minibatch's prompt pass ran them
        prompt_real = sum(
            prompt_lengths[g] if shared_prompts else prompt_lengths[prompt_of_row[g]]
            for g in prompts
        )
        slots += (
            prompt_real + answer_real if packed else len(prompts) * prompt_width + len(rows) * width
        )
        real += prompt_real + answer_real
        answers += answer_real
    return UpdateShapes(slots, real, answers, len(plan))


def padded_shapes(batches: Sequence[dict[str, int]]) -> UpdateShapes:
    """An update whose micro-batches are padded tensors, each given as
    {"slots": rows x columns, "real": mask sum, "answer_tokens": answer mask sum}."""
    return UpdateShapes(
        slots=sum(b["slots"] for b in batches),
        real=sum(b["real"] for b in batches),
        answer_tokens=sum(b["answer_tokens"] for b in batches),
        micro_batches=len(batches),
    )


def length_stats(lengths: Sequence[int], cap: int) -> dict[str, float | int | None]:
    """Mean, p50, p90, max and the truncated share (length ≥ cap) of answer lengths."""
    if not lengths:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "max": None, "truncated": None}
    ordered = sorted(lengths)
    return {
        "count": len(ordered),
        "mean": statistics.fmean(ordered),
        "p50": _quantile(ordered, 0.5),
        "p90": _quantile(ordered, 0.9),
        "max": ordered[-1],
        "truncated": sum(1 for n in ordered if n >= cap) / len(ordered),
    }


def _quantile(ordered: Sequence[int], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def update_gflops(params: int, answer_tokens: int, seconds: float | None) -> float | None:
    """Training rate on real answer tokens: 6 · params · tokens (forward 2, backward 4 FLOPs per
    parameter per token) / update seconds, in GFLOP/s."""
    if not seconds:
        return None
    return 6.0 * params * answer_tokens / seconds / 1e9
