"""rollout=hf keeps each conversation's KV cache between turns (tepo_cli/rollout/turn_cache.py):
greedy turns are the ones a fresh prefill of the whole context gives, token for token, and the
kept keys and values are a fresh forward's (float64, tiny model)."""

from __future__ import annotations

import pytest
import torch

from tepo_cli.models.cache_key import returned_cache
from tepo_cli.rollout import hf
from tepo_cli.rollout.backend import Sampling
from tepo_cli.rollout.turn_cache import TurnCache


@pytest.fixture()
def model64(tiny_model, monkeypatch):
    # Every even token id ends a turn: the random model's turns end after a few tokens, at
    # different lengths per row, so rows reuse different lengths and the batch has gaps.
    monkeypatch.setattr(hf, "eos_ids", lambda model, tokenizer: list(range(0, 50000, 2)))
    return tiny_model.to(torch.float64)


def _conversations(model, tokenizer, turn_cache: TurnCache | None, turns: int = 3):
    """Four conversations of `turns` greedy turns, each followed by an observation of its own
    length; (each turn's ids per row, the reused lengths seen on the way)."""
    contexts = [
        tokenizer.encode(t, add_special_tokens=False) for t in ("Hi.", "Go on", "A", "Why?")
    ]
    greedy = Sampling(greedy=True, max_new_tokens=9, batch_size=3)  # two chunks: 3 rows + 1
    sampled, reused = [], []
    for turn in range(turns):
        if turn_cache is not None:
            reused.append([turn_cache.reuse(c)[1] for c in contexts])
        out = hf.sample_turns(model, tokenizer, contexts, 9, greedy, turn_cache)
        sampled.append([t.ids for t in out])
        observation = [[7 + row] * (row + turn + 1) for row in range(len(contexts))]
        contexts = [c + t.ids + o for c, t, o in zip(contexts, out, observation, strict=True)]
    return sampled, reused


def test_kept_caches_give_the_same_greedy_turns_as_fresh_prefills(model64, tiny_tokenizer):
    fresh, _ = _conversations(model64, tiny_tokenizer, None)
    cache = TurnCache()
    kept, reused = _conversations(model64, tiny_tokenizer, cache)
    assert kept == fresh
    assert reused[0] == [0, 0, 0, 0]  # nothing kept before the first turn
    # later turns reuse the whole conversation so far: context + turn, less nothing
    assert all(length > 0 for lengths in reused[1:] for length in lengths)
    assert len({*reused[1]}) > 1, "rows must reuse different lengths (gaps in the batch)"


def test_the_kept_keys_and_values_are_a_fresh_forwards(model64, tiny_tokenizer):
    cache = TurnCache()
    _conversations(model64, tiny_tokenizer, cache, turns=2)
    for kept in cache.kept:
        ids = torch.tensor([kept.tokens])
        with torch.no_grad():
            fresh = returned_cache(model64(input_ids=ids, use_cache=True))
        assert len(kept.layers) == len(fresh.layers)
        for (keys, values), layer in zip(kept.layers, fresh.layers, strict=True):
            torch.testing.assert_close(keys, layer.keys[0], rtol=0, atol=1e-10)
            torch.testing.assert_close(values, layer.values[0], rtol=0, atol=1e-10)


def test_a_sync_drops_the_kept_caches(tiny_model, tiny_tokenizer):
    backend = hf.HfBackend(tiny_model, tiny_tokenizer, share_prompts=True)
    backend.sample_turns([[5, 6, 7]], 3, Sampling(greedy=True, max_new_tokens=3))
    assert len(backend.turn_cache.kept) == 1
    backend.sync(tiny_model)  # the weights may have changed: their keys and values are stale
    assert backend.turn_cache.kept == []
    assert backend.turn_cache.reuse([5, 6, 7, 8]) == (None, 0)


def test_only_a_continued_conversation_is_reused(tiny_model, tiny_tokenizer):
    """A context that begins with a kept conversation's whole context reuses it; one that only
    shares a header with it (another problem in the same chat template) runs afresh."""
    cache = TurnCache()
    hf.sample_turns(tiny_model, tiny_tokenizer, [[5, 6, 7, 8]], 3, Sampling(greedy=True), cache)
    (kept,) = cache.kept
    assert kept.context == 4 and kept.tokens[:4] == [5, 6, 7, 8]
    turn = kept.tokens[4:]
    assert cache.reuse([5, 6, 7, 9, 1]) == (None, 0)  # shares 3 tokens of the context only
    assert cache.reuse([5, 6, 7, 8, 1]) == (kept, 4)  # the turn cut before its first token
    assert cache.reuse([5, 6, 7, 8, *turn, 1]) == (kept, 4 + len(turn))


def test_turn_cache_false_keeps_nothing_and_its_turns_are_the_same(
    compose_config, model64, tiny_tokenizer
):
    """`rollout.turn_cache=false` (the benchmark's reference path): no conversation is kept, every
    turn prefills its whole context, and greedy turns are the cached back-end's."""
    from tepo_cli.config.validate import load_train_config

    config = load_train_config(compose_config("train", ["rollout.turn_cache=false"]))
    backend = hf.build(config.rollout, model64, tiny_tokenizer, share_prompts=True)
    assert backend.turn_cache is None
    kept = hf.HfBackend(model64, tiny_tokenizer, share_prompts=True)
    assert kept.turn_cache is not None  # the default
    greedy = Sampling(greedy=True, max_new_tokens=6)
    contexts = [[5, 6, 7], [9, 8]]
    for _ in range(2):
        plain = backend.sample_turns(contexts, 6, greedy)
        cached = kept.sample_turns(contexts, 6, greedy)
        assert [t.ids for t in plain] == [t.ids for t in cached]
        contexts = [c + t.ids + [11, 12] for c, t in zip(contexts, plain, strict=True)]
    backend.sync(model64)  # nothing to drop
