"""Rollout back-ends are found, not listed: a new one is one module + one YAML, and the trainer runs
it (here: an engine that generates with transformers but reports its own log-probs, so the
rollout–training mismatch path runs end to end)."""

from __future__ import annotations

import json
import math
import sys

import pytest

import tepo_cli.rollout as rollout
from tepo_cli.config.schema import RolloutConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError

ENGINE_MODULE = '''
"""A test back-end: generate() with transformers, then the engine's "own" log-probs: the
trainer's at the sampling temperature plus a fixed offset per token."""

import torch

from tepo_cli.rollout.hf import HfBackend

NAME = "offset"
REQUIRES = None
OFFSET = 0.25


class OffsetBackend(HfBackend):
    def generate(self, prompts, sampling):
        out = super().generate(prompts, sampling)
        ids = torch.cat([out.prompt_ids, out.completion_ids], dim=1)
        mask = torch.cat([out.prompt_mask, out.completion_mask.long()], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        width = out.prompt_ids.shape[1]
        scaled = logits[:, width - 1 : -1].float() / sampling.temperature
        chosen = torch.log_softmax(scaled, dim=-1).gather(-1, out.completion_ids[..., None])[..., 0]
        out.logprobs = torch.where(out.completion_mask, chosen + OFFSET, 0.0)
        return out


def build(cfg, lm, tokenizer, share_prompts):
    return OffsetBackend(lm, tokenizer, share_prompts)
'''

ENGINE_YAML = """defaults:
  - hf
  - _self_

backend: offset
correction: token_tis
"""


@pytest.fixture()
def offset_backend(tmp_path, monkeypatch):
    """tmp/offset.py on the package's search path, tmp/conf/rollout/offset.yaml on Hydra's."""
    (tmp_path / "offset.py").write_text(ENGINE_MODULE)
    (tmp_path / "conf" / "rollout").mkdir(parents=True)
    (tmp_path / "conf" / "rollout" / "offset.yaml").write_text(ENGINE_YAML)
    monkeypatch.setattr(rollout, "__path__", [*rollout.__path__, str(tmp_path)])
    yield tmp_path
    sys.modules.pop("tepo_cli.rollout.offset", None)


def test_the_back_ends_are_the_modules_that_name_themselves():
    assert set(rollout.backends()) == {"hf", "vllm"}


def test_an_unknown_back_end_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"rollout.backend='sglang'.*known: hf, vllm"):
        rollout.check_backend(RolloutConfig(backend="sglang"))


@pytest.mark.slow
def test_a_new_back_end_is_one_module_and_one_yaml(compose_config, offset_backend):
    """The engine reports ℓ^roll = ℓ^old + 0.25 on every token: token TIS weights are
    exp(−0.25) on every token, and the mismatch metrics say 0.25."""
    from tepo_cli.runtime.distributed import setup_topology, teardown
    from tepo_cli.train.recipe import train

    assert "offset" in rollout.backends()
    (offset_backend / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2\n"
    )
    overrides = [
        f"hydra.searchpath=[file://{offset_backend / 'conf'}]",
        "rollout=offset",
        "model=tiny",
        "reward=custom",
        f"reward.path={offset_backend / 'parity.py'}",
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.progress=false",
        "trainer.save_final=false",
        "rollout.max_new_tokens=6",
    ]
    config = load_train_config(compose_config("train", overrides))
    assert config.rollout.backend == "offset" and config.rollout.correction_mode == "token_tis"
    topo = setup_topology(num_threads=None)
    try:
        train(config, offset_backend, topo)
    finally:
        teardown()
    (record,) = [json.loads(line) for line in (offset_backend / "metrics.jsonl").open()]
    assert record["mismatch_abs_mean"] == pytest.approx(0.25, abs=1e-5)
    assert record["mismatch_abs_max"] == pytest.approx(0.25, abs=1e-5)
    # ℓ^old − ℓ^roll = −0.25 on every token: k3 = e^−0.25 + 0.25 − 1
    assert record["mismatch_kl"] == pytest.approx(math.exp(-0.25) + 0.25 - 1, abs=1e-5)
    assert record["mismatch_truncated_frac"] == 0.0
    # every token's weight is e^−0.25: their mean, and an effective sample size of 1 (all equal)
    assert record["mismatch_weight_mean"] == pytest.approx(math.exp(-0.25), abs=1e-5)
    assert record["mismatch_ess"] == pytest.approx(1.0, abs=1e-6)
