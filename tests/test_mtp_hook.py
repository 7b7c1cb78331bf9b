"""MPO's MTP modules live in tepo_cli/mtp/ and reach a run through one hook: the recipe asks
`MtpHook.of(cfg)`, the policy carries the modules as its `attached` ones (keys `mtp.*`), and no
other module of tepo_cli names them beyond the files listed here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import tepo_cli
from tepo_cli.algos.algo_config import MtpConfig
from tepo_cli.config.schema import KernelConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.policy import Policy
from tepo_cli.mtp.hook import MtpHook
from tepo_cli.mtp.modules import attach
from tepo_cli.rollout import Sampling
from tepo_cli.rollout.hf import generate
from tepo_cli.train.setup import model_sizes

PACKAGE = Path(tepo_cli.__file__).parent
# Outside tepo_cli/mtp/, only these may say "mtp": the config keys, the objective's input and
# MPO's future term that reads it (algos/), the public entry point's argument list
# (algos/api.py), the run directory's map (core/run_dir.py) and the feature's one way into a run
# (train/feature.py).
NAMED_OUTSIDE = {
    "algos/algo_config.py",
    "algos/api.py",
    "algos/batch.py",
    "algos/objectives.py",
    "core/run_dir.py",
    "train/feature.py",
}


def test_mtp_is_named_only_in_its_package_and_the_listed_files() -> None:
    named = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if re.search("mtp", path.read_text(), re.IGNORECASE)
    }
    outside = {name for name in named if not name.startswith("mtp/")}
    assert outside == NAMED_OUTSIDE


def test_the_hook_exists_with_future_mtp_only(compose_config) -> None:
    def hook(*overrides: str) -> MtpHook | None:
        return MtpHook.of(load_train_config(compose_config("train", list(overrides))))

    assert hook() is None and hook("algo=mpo_exact") is None
    mpo = hook("algo=mpo", "model=tiny")
    assert mpo is not None
    assert mpo.settle().startswith("MTP warm-up: none (auto: model=tiny has random weights")
    assert mpo.cfg.algo.mtp.warmup.steps == 0  # settled into the config
    mpo.check_model()  # the tiny model is a Llama: it carries the modules


def test_the_hook_refuses_a_model_that_cannot_carry_the_modules(compose_config) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = load_train_config(compose_config("train", ["algo=mpo", "model=tiny"]))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    hook = MtpHook.of(cfg)
    assert hook is not None
    with pytest.raises(ConfigError, match="cannot carry them"):
        hook.attach(gpt2)


def test_the_policy_carries_the_modules_under_their_keys(tiny_model, tiny_tokenizer) -> None:
    torch.manual_seed(3)
    rollout = generate(tiny_model, tiny_tokenizer, ["Hi", "What is 2+2?"], Sampling(n=2))
    batch = SequenceBatch.from_rollout(rollout)
    kernel = KernelConfig(backend="torch")
    with pytest.raises(ValueError, match="mtp_logp needs a policy built with the modules"):
        Policy(tiny_model, kernel)(batch, make=("mtp_logp",))

    policy = Policy(tiny_model, kernel, attach=attach(3, MtpConfig()))
    assert policy.attached is policy.mtp and len(policy.attached.depths) == 3
    keys = list(policy.state_dict())
    assert keys[0].startswith("lm.") and keys[-1].startswith("mtp.depths.2.")
    sizes = model_sizes(policy)
    assert sizes["mtp_parameters"] == sum(p.numel() for p in policy.mtp.parameters()) > 0
    mtp_logp = policy(batch, make=("mtp_logp",))["mtp_logp"]
    assert mtp_logp.shape == (*batch.completion_mask.shape, 3)
    assert torch.isfinite(mtp_logp).all() and (mtp_logp <= 0).all()


def test_modules_worse_than_a_uniform_guess_are_found_by_depth() -> None:
    from tepo_cli.mtp.prediction_loss import worse_than_uniform

    vocab = 49_152  # ln V = 10.80
    record = {"step": 1, "mtp_nll_d2": 17.5, "mtp_nll_d3": 10.8, "mtp_nll_d4": 10.81,
              "mtp_nll_d5": float("nan"), "mtp_exact_nll_d2": 30.0}  # fmt: skip
    assert worse_than_uniform(record, vocab) == {2: 17.5, 4: 10.81}
    assert worse_than_uniform({"step": 1, "mtp_nll_d2": 2.6}, vocab) == {}
    assert worse_than_uniform({"step": 1, "mtp_nll_d2": 2.6}, 2) == {2: 2.6}  # ln 2 = 0.69


def test_the_run_says_once_when_the_modules_predict_worse_than_a_uniform_guess(
    compose_config,
) -> None:
    """Measured on word_math (docs/results/mtp_warmup/): modules warmed up on its reference
    solutions gave the policy's own tokens 17.5 nats at RL step 1, where ln V is 10.8."""
    hook = MtpHook.of(load_train_config(compose_config("train", ["recipe=word_math", "algo=mpo"])))
    assert hook is not None
    hook.settle()
    fine = {"step": 1, "mtp_nll_d2": 2.6, "mtp_exact_nll_d2": 0.4}
    assert hook.step_note(fine, 49_152) is None
    bad = {"step": 2, "mtp_nll_d2": 17.5, "mtp_nll_d3": 9.0, "mtp_exact_nll_d2": 0.3}
    line = hook.step_note(bad, 49_152)
    assert line is not None
    assert line.startswith("tepo train: step 2: MPO's MTP modules predicted the policy's own")
    assert "uniform guess over its 49,152 tokens" in line and "ln V = 10.8: d2 17.5;" in line
    assert "the backbone's own: 0.3)" in line and "d3" not in line
    assert "for 30 steps on the benchmark's reference solutions" in line  # auto: min(30, 640 // 16)
    assert "algo.mtp.warmup.data=samples" in line and "algo.future=exact" in line
    assert "own answers, sampled by rollout=vllm;" in line  # word_math's back-end
    assert hook.step_note(bad, 49_152) is None  # once
    tiny = MtpHook.of(load_train_config(compose_config("train", ["algo=mpo", "model=tiny"])))
    assert tiny is not None
    tiny.settle()
    said = tiny.step_note(bad, 49_152)
    assert said is not None and "were not warmed up (algo.mtp.warmup.steps=0)" in said


def test_the_line_names_the_rl_updates_for_modules_warmed_up_on_samples(compose_config) -> None:
    """Measured on word_math (docs/results/mtp_warmup/): modules warmed up on the policy's own
    answers start under ln V, then the RL loss that trains them made them worse step by step;
    frozen after the warm-up they stayed near their start."""
    for trainable in (True, False):
        overrides = ["recipe=word_math", "algo=mpo", "algo.mtp.warmup.data=samples"]
        overrides.append(f"algo.mtp.trainable={str(trainable).lower()}")
        hook = MtpHook.of(load_train_config(compose_config("train", overrides)))
        assert hook is not None
        hook.settle()
        line = hook.step_note({"step": 14, "mtp_nll_d4": 10.9, "mtp_nll_d5": 11.6}, 49_152)
        assert line is not None and "ln V = 10.8: d4 10.9, d5 11.6)" in line
        assert "warmed up for 30 steps on the policy's own answers" in line
        assert ("algo.mtp.trainable=false keeps them as warmed up" in line) is trainable
