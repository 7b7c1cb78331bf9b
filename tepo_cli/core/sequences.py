"""Prompt + completion as one teacher-forced sequence (what the policy scores and trains on)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tepo_cli.core.rollout_record import Rollout, left_padded_positions


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor  # [N, P + T]
    attention_mask: torch.Tensor  # [N, P + T]
    position_ids: torch.Tensor  # [N, P + T]
    completion_mask: torch.Tensor  # [N, T] bool: completion tokens in the context
    prompt_width: int  # P: completions start at this column
    # [N, T] bool, multi-turn only: the model's own tokens, which the objective trains on (the
    # observations between turns are context only). None: every completion token. Its path from
    # the episode to the loss: `Rollout.trained_mask` (core/rollout_record.py).
    model_mask: torch.Tensor | None = None
    # [N] int64: which distinct prompt each row holds (rows with equal labels share a prompt),
    # found once where the batch is made and carried by `select`, so the prompt pass, the
    # shared-prompt forward, the micro-batch planner and the FLOPs count never compare prompts
    # again. Found from the prompt tokens when not given.
    prompt_owner: torch.Tensor = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.prompt_owner is None:
            width = self.prompt_width
            ids, mask = self.input_ids[:, :width], self.attention_mask[:, :width]
            self.prompt_owner = prompt_labels(ids, mask)

    @classmethod
    def from_rollout(cls, rollout: Rollout) -> SequenceBatch:
        input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        attention_mask = torch.cat(
            [rollout.prompt_mask, rollout.completion_mask.to(rollout.prompt_mask.dtype)], dim=1
        )
        # Left-padded prompts: positions count real tokens only, as during generation.
        position_ids = left_padded_positions(attention_mask)
        return cls(
            input_ids,
            attention_mask,
            position_ids,
            rollout.completion_mask,
            rollout.prompt_ids.shape[1],
            rollout.model_mask,
        )

    @property
    def trained_mask(self) -> torch.Tensor:
        """[N, T] bool: the completion tokens the objective, the KL, the entropy and the
        advantages act on — the model's own."""
        return self.completion_mask if self.model_mask is None else self.model_mask

    @property
    def turns(self) -> torch.Tensor | None:
        """[N, T] int64 turn index of each trained token (a new turn after every hole in the
        loss mask), so that no block or window of tokens spans an observation; None for
        single-turn rows."""
        if self.model_mask is None:
            return None
        return turn_index(self.model_mask)

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_width :]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor) -> SequenceBatch:
        """Rows of the batch, cut to the longest completion among them (less work)."""
        completion_mask = self.completion_mask[rows]
        width = (
            int(completion_mask.any(dim=0).nonzero().max().item()) + 1
            if completion_mask.any()
            else 1
        )
        stop = self.prompt_width + width
        return SequenceBatch(
            self.input_ids[rows, :stop],
            self.attention_mask[rows, :stop],
            self.position_ids[rows, :stop],
            completion_mask[:, :width],
            self.prompt_width,
            None if self.model_mask is None else self.model_mask[rows, :width],
            self.prompt_owner[rows],
        )

    def distinct_prompts(
        self, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the first row of each distinct prompt, each row's index into those), numbered in
        order of first appearance, for the whole batch or for `rows` of it."""
        return first_appearance(self.prompt_owner if rows is None else self.prompt_owner[rows])


def prompt_labels(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """[N] int64 labels of [N, P] left-padded prompts, equal for equal prompts: padding compares
    as padding, whatever its token id."""
    key = torch.where(prompt_mask.bool(), prompt_ids, -1)
    return torch.unique(key, dim=0, return_inverse=True)[1]


def first_appearance(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the first position of each distinct label, each position's index into those), the
    distinct labels numbered in order of first appearance."""
    number: dict[int, int] = {}
    owner = [number.setdefault(label, len(number)) for label in labels.tolist()]
    first = [0] * len(number)
    for row in reversed(range(len(owner))):
        first[owner[row]] = row
    device = labels.device
    return torch.tensor(first, dtype=torch.long, device=device), torch.tensor(
        owner, dtype=torch.long, device=device
    )


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """[N, T] int64: for each token of `mask`, how many runs of True began in its row up to it,
    minus one (the turn a model token belongs to; padding gets the last turn's index)."""
    mask = mask.bool()
    starts = mask & ~torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    return (starts.long().cumsum(dim=1) - 1).clamp(min=0)


def widen(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pad the token axis (dim 1) of [N, t] or [N, t, D] values to `width` columns (micro-batches
    are cut to their own longest completion; the step's tensors have the step's width)."""
    missing = width - values.shape[1]
    return torch.nn.functional.pad(
        values, (0, 0, 0, missing) if values.dim() == 3 else (0, missing)
    )
