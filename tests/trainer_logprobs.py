"""The trainer's float64 log-probs of a rollout's sampled tokens: what an engine's own log-probs
are checked against (tests/test_vllm_backend.py, tests/test_vllm_stop.py)."""

from __future__ import annotations

import torch


def trainer_logprobs(lm, rollout, temperature: float = 1.0) -> torch.Tensor:
    """[N, T] float64: each completion token's log-prob under `lm` at `temperature`."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=positions).logits.double()
    width = rollout.prompt_ids.shape[1]
    scaled = logits[:, width - 1 : -1] / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, rollout.completion_ids[..., None])[..., 0]
