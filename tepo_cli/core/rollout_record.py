"""The `Rollout` record: what a back-end generated, as every later stage reads it, and the
padding helpers that keep its layout.

Rows are laid out group by group (the n samples of a prompt are consecutive); prompts are
left-padded, completions right-padded; a completion is valid up to and including its first EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """Generated samples, group by group (the n samples of a prompt are consecutive rows)."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P] 1 on prompt tokens
    completion_ids: torch.Tensor  # [N, T] right-padded
    completion_mask: torch.Tensor  # [N, T] bool: generated tokens up to and including the first EOS
    texts: list[str]  # decoded completions without special tokens
    truncated: torch.Tensor  # [N] bool: stopped by the length limit, not by EOS
    # [N, T] the engine's own log-probs of the sampled tokens (after temperature), 0 on padding;
    # None when the engine is the trainer's model (hf): its log-probs are the trainer's.
    logprobs: torch.Tensor | None = None
    # [N, T] bool, multi-turn episodes only: the model's own tokens among `completion_mask`'s
    # (the environment's observations between turns are in the context, not trained on). None:
    # every completion token is the model's. See `trained_mask` for its whole path.
    model_mask: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)

    @property
    def trained_mask(self) -> torch.Tensor:
        """[N, T] bool: the completion tokens the objective acts on, the model's own.

        The observation mask has two names on its way to the loss. `model_mask`, the "the model
        wrote this token" flag: built token by token in envs/episodes.py (`Episode.add`, one
        flag per id, `Episode.model_mask`), laid out as rows in envs/episode_sampler.py
        (`episodes_rollout` -> `Rollout.model_mask`), carried by `SequenceBatch.from_rollout`
        (core/sequences.py, `SequenceBatch.model_mask`). `trained_mask`, the loss's mask: this
        property (and `SequenceBatch.trained_mask`), `completion_mask` where there is no
        `model_mask`; read by the advantages (train/advantage_stage.py), the token counts and
        the zero-advantage skip (train/update.py), the step's records, and passed to the
        objective in train/micro_batch_objective.py, where it ends as `PolicyBatch.mask` (the
        loss plugins' API, algos/batch.py)."""
        return self.completion_mask if self.model_mask is None else self.model_mask

    def to(self, device: torch.device | str) -> Rollout:
        """This rollout with every tensor on `device` (tensors already there are not copied)."""
        return Rollout(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.completion_ids.to(device),
            self.completion_mask.to(device),
            self.texts,
            self.truncated.to(device),
            None if self.logprobs is None else self.logprobs.to(device),
            None if self.model_mask is None else self.model_mask.to(device),
        )

    def take(self, rows: torch.Tensor) -> Rollout:
        """The given rows (a LongTensor of indices), in that order."""
        return Rollout(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.completion_ids[rows],
            self.completion_mask[rows],
            [self.texts[i] for i in rows.tolist()],
            self.truncated[rows],
            None if self.logprobs is None else self.logprobs[rows],
            None if self.model_mask is None else self.model_mask[rows],
        )

    @staticmethod
    def concat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Stack rollouts of different widths: prompts re-padded left, completions right."""
        prompt_width = max(p.prompt_ids.shape[1] for p in parts)
        width = max(p.completion_ids.shape[1] for p in parts)
        with_logprobs = [p.logprobs is not None for p in parts]
        if any(with_logprobs) and not all(with_logprobs):
            raise ValueError("cannot concatenate rollouts with and without engine log-probs")
        masked = any(p.model_mask is not None for p in parts)
        return Rollout(
            torch.cat([pad_left(p.prompt_ids, prompt_width, pad_id) for p in parts]),
            torch.cat([pad_left(p.prompt_mask, prompt_width, 0) for p in parts]),
            torch.cat([pad_right(p.completion_ids, width, pad_id) for p in parts]),
            torch.cat([pad_right(p.completion_mask, width, False) for p in parts]),
            [text for p in parts for text in p.texts],
            torch.cat([p.truncated for p in parts]),
            torch.cat([pad_right(p.logprobs, width, 0.0) for p in parts])  # type: ignore[arg-type]
            if all(with_logprobs)
            else None,
            torch.cat([pad_right(p.trained_mask, width, False) for p in parts]) if masked else None,
        )


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids as generate() numbers them: real tokens 0, 1, ... from the first one."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def pad_right(values: torch.Tensor, width: int, fill: int | float | bool) -> torch.Tensor:
    return torch.nn.functional.pad(values, (0, width - values.shape[1]), value=fill)


def pad_left(values: torch.Tensor, width: int, fill: int | float | bool) -> torch.Tensor:
    return torch.nn.functional.pad(values, (width - values.shape[1], 0), value=fill)
