"""`rollout.stop` on `rollout=vllm`: the engine's stop strings end each answer where the rule does
(the unstopped samples cut there, token for token, with per-request seeds), and under
`rollout.stop_at=line` an answer stopped at its string is continued to its line break: the
joined sample's log-probs are still the trainer's (the continuation conditions on the whole
answer so far). One tiny engine with the tokenizer loaded serves the module."""

from __future__ import annotations

import os

import pytest
import torch
from trainer_logprobs import trainer_logprobs

from tepo_cli.config.schema import EngineConfig
from tepo_cli.rollout.backend import Sampling
from tepo_cli.rollout.stop_rule import StopRule, cut_at_stop

if os.environ.get("TEPO_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="rollout=vllm needs `make install-vllm`")

PROMPTS = ["12+34=", "7+8=", "50+49="]


@pytest.fixture(scope="module")
def backend_and_model(tiny_tokenizer):
    from tepo_cli.config.schema import ModelConfig
    from tepo_cli.models.loading import load_model
    from tepo_cli.rollout.vllm_engine import VllmBackend

    cfg = ModelConfig(name="tiny", source="tiny", tokenizer="smollm2_135m", dtype="float32")
    lm = load_model(cfg, tiny_tokenizer, torch.device("cpu"))
    engine = EngineConfig(max_model_len=256, kv_cache_gib=1, per_request_seeds=True)
    backend = VllmBackend(engine, lm, tiny_tokenizer, stop_strings=True)
    yield backend, lm
    backend.close()


def test_stop_strings_end_answers_where_the_rule_cuts_the_unstopped_ones(
    backend_and_model, tiny_tokenizer
):
    backend, _ = backend_and_model
    rule = StopRule(("e",))
    free_sampling = Sampling(n=4, temperature=1.0, max_new_tokens=32, seed=11)
    free = backend.generate(PROMPTS, free_sampling)
    stopped = backend.generate(PROMPTS, Sampling(**{**vars(free_sampling), "stop": rule}))
    expected = cut_at_stop(free, rule, tiny_tokenizer)
    cut_rows = 0
    for row in range(len(free.texts)):
        length = int(expected.completion_mask[row].sum())
        assert int(stopped.completion_mask[row].sum()) == length, row
        assert torch.equal(
            stopped.completion_ids[row, :length], expected.completion_ids[row, :length]
        )
        assert stopped.texts[row] == expected.texts[row]
        assert bool(stopped.truncated[row]) == bool(expected.truncated[row])
        cut_rows += int(length < int(free.completion_mask[row].sum()))
    assert cut_rows >= 6


@pytest.mark.parametrize("pattern", [None, "zq"])
def test_line_ends_are_reached_by_continuations_with_the_trainers_logprobs(
    backend_and_model, tiny_tokenizer, pattern
):
    """With a pattern that the random model's lines do not match, no line ends an answer: the
    answers go round after round (string, line, string, ...) to an EOS or the length limit."""
    backend, lm = backend_and_model
    rule = StopRule(("e",), "line", pattern)
    sampling = Sampling(n=8, temperature=1.0, max_new_tokens=48, seed=3, stop=rule)
    calls = []
    engine_generate = backend.engine.generate
    backend.engine.generate = lambda requests, *a, **k: (
        calls.append(len(requests)) or engine_generate(requests, *a, **k)
    )
    try:
        rollout = backend.generate(PROMPTS, sampling)
    finally:
        backend.engine.generate = engine_generate
    assert calls[0] == len(PROMPTS) and calls[1] >= 2  # the continuations
    assert len(calls) == 2 if pattern is None else len(calls) >= 3
    ended = 0
    for row, text in enumerate(rollout.texts):
        ids = rollout.completion_ids[row, : int(rollout.completion_mask[row].sum())].tolist()
        end = rule.end_of(ids, tiny_tokenizer)
        if end is not None:  # ended by the rule, at its last token, and not truncated
            assert end == len(ids) and not rollout.truncated[row], (row, text)
            ended += 1
        else:  # at an EOS, or at the length limit
            assert bool(rollout.truncated[row]) == (len(ids) == 48)
    assert ended >= 2 if pattern is None else ended == 0
    mask = rollout.completion_mask
    trainer = trainer_logprobs(lm, rollout)
    assert (rollout.logprobs.double() - trainer)[mask].abs().max() < 1e-4
    assert (rollout.logprobs[~mask] == 0).all()
