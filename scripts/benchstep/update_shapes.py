"""What an update forwards: answer lengths and its micro-batches' token slots (pure, no torch).

Padding share = padded slots / all slots the forward/backward computes. tepo packed: the real
tokens in one row (each distinct prompt once when shared, or in the minibatch's prompt pass);
padded: each micro-batch cut to its longest answer, shared prompts [P] once, else [P + width] per
row. TRL: every micro-batch is its padded [rows, P + C] tensors. Truncated: length at the cap.
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
