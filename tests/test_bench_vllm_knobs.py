"""scripts/bench_vllm.py knobs: its ratios (pure; no engine). With several settings the reference
is measured first and last, and every knob is set against the mean of its two readings, so a
machine that drifts over the run does not pass for a knob's effect."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from bench_vllm import knob_ratios


def _row(setting: str, tokens_per_second: float) -> dict:
    return {"setting": setting, "tokens_per_second": tokens_per_second}


def test_knobs_are_set_against_the_mean_of_the_reference_s_two_readings():
    rows = [
        _row("bf16", 150.0),
        _row("kv1", 200.0),
        _row("seqs8", 100.0),
        _row("bf16 (again)", 250.0),
    ]
    assert knob_ratios(rows) == [
        "bf16 measured first and last: 1.67x (the machine's drift over the run: a knob's ratio "
        "within it is no effect)",
        "kv1: 1.00x bf16's tokens/s",
        "seqs8: 0.50x bf16's tokens/s",
    ]


def test_one_reading_of_the_reference_is_its_own_reference():
    assert knob_ratios([_row("bf16", 100.0), _row("kv4", 120.0)]) == ["kv4: 1.20x bf16's tokens/s"]
    assert knob_ratios([_row("no_chunked", 90.0)]) == []


def test_every_knob_composes_into_a_valid_training_config():
    """Each setting's overrides as the knob child composes them (no engine started): a typo in a
    tepo key or value is caught here, not in the benchmark's child; engine_kwargs pass to vLLM as
    written (the n-gram setting's dict arrives whole)."""
    from bench_vllm import KNOBS
    from benchstep.job import compose_overrides

    for name, knob in KNOBS.items():
        overrides = ["recipe=word_math", "model.dtype=bfloat16", *knob]
        cfg = compose_overrides(overrides)
        assert cfg.rollout.backend == "vllm", name
    ngram = compose_overrides(["recipe=word_math", *KNOBS["ngram3"]])
    assert dict(ngram.rollout.engine.engine_kwargs["speculative_config"]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
