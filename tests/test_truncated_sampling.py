"""Truncated sampling made honest (docs/objectives.md §0.9): with rollout.top_k/top_p the trainer
scores every log-prob over the sampler's kept tokens (kernels/truncated.py), so its log-prob of a
sampled token is the sampler's own — transformers' warpers (rollout=hf) and vLLM's sampler
(rollout=vllm) alike, in float64 — and an on-policy step's ratio is exactly 1. `refuse` and
`biased` stay available."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tepo_cli.config.schema import KernelConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.kernels.truncated import (
    Truncation,
    truncated_entropy_terms,
    truncated_token_logprobs,
)
from tepo_cli.models.policy import Policy
from tepo_cli.train.setup import build_policy

SAMPLERS = [(0, 0.9, 0.7), (20, 1.0, 1.0), (20, 0.8, 0.7), (3, 0.5, 1.3), (1, 1.0, 0.7)]


def _inputs(rows: int = 37, hidden: int = 16, vocab: int = 300, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(rows, hidden, dtype=torch.float64, generator=generator)
    weight = torch.randn(vocab, hidden, dtype=torch.float64, generator=generator)
    return states, weight, generator


def _warped(logits: torch.Tensor, top_k: int, top_p: float, temperature: float) -> torch.Tensor:
    """transformers' own warpers, in generate()'s order (what rollout=hf samples from)."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())


@pytest.mark.parametrize(("top_k", "top_p", "temperature"), SAMPLERS)
def test_the_trainers_logprobs_are_the_transformers_samplers(top_k, top_p, temperature):
    states, weight, generator = _inputs()
    warped = _warped(states @ weight.t(), top_k, top_p, temperature)
    sampler = torch.log_softmax(warped, dim=-1)
    targets = torch.multinomial(sampler.exp(), 1, generator=generator).squeeze(1)
    truncation = Truncation(top_k, top_p)
    logp, entropy = truncated_token_logprobs(
        states, weight, targets, temperature, True, truncation, chunk_size=8
    )
    expected = sampler.gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(logp, expected, rtol=0, atol=1e-12)
    kept = sampler.isfinite()
    expected_entropy = -(sampler.exp() * sampler.where(kept, 0)).sum(-1)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)
    # The kept set really is smaller than the vocabulary, and the full softmax differs.
    assert (~kept).any(dim=-1).all()
    full = torch.log_softmax(states @ weight.t() / temperature, -1).gather(1, targets[:, None])
    assert (full.squeeze(1) - expected).abs().max() > 1e-3


@pytest.mark.parametrize(("top_k", "top_p", "temperature"), SAMPLERS)
def test_the_trainers_logprobs_are_vllms_samplers(top_k, top_p, temperature):
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    states, weight, generator = _inputs(seed=1)
    scaled = states @ weight.t() / temperature  # vLLM divides by the temperature first
    rows = scaled.shape[0]
    k = torch.full((rows,), top_k) if top_k else None
    p = torch.full((rows,), top_p, dtype=torch.float64) if top_p < 1.0 else None
    sampler = torch.log_softmax(ops.apply_top_k_top_p_pytorch(scaled.clone(), k, p), dim=-1)
    targets = torch.multinomial(sampler.exp(), 1, generator=generator).squeeze(1)
    logp, _ = truncated_token_logprobs(
        states, weight, targets, temperature, False, Truncation(top_k, top_p)
    )
    torch.testing.assert_close(
        logp, sampler.gather(1, targets[:, None]).squeeze(1), rtol=0, atol=1e-12
    )


def test_gradients_equal_the_full_masked_softmaxs_in_float64():
    states, weight, generator = _inputs(rows=23, seed=2)
    truncation, temperature = Truncation(15, 0.85), 0.7
    warped = _warped(states @ weight.t(), 15, 0.85, temperature)
    targets = torch.multinomial(warped.softmax(-1), 1, generator=generator).squeeze(1)
    upstream = torch.linspace(-1.0, 2.0, 23, dtype=torch.float64)

    def loss_and_grads(score):
        h, w = states.clone().requires_grad_(), weight.clone().requires_grad_()
        logp, entropy = score(h, w)
        ((logp * upstream).sum() + entropy.sum()).backward()
        return h.grad, w.grad

    def ours(h, w):
        return truncated_token_logprobs(h, w, targets, temperature, True, truncation, chunk_size=5)

    def reference(h, w):
        scaled = h @ w.t() / temperature
        keep = _warped(scaled.detach() * temperature, 15, 0.85, temperature).isfinite()
        keep[torch.arange(23), targets] = True
        logprobs = torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), -1)
        entropy = -(logprobs.exp() * logprobs.masked_fill(~keep, 0)).sum(-1)
        return logprobs.gather(1, targets[:, None]).squeeze(1), entropy

    for got, expected in zip(loss_and_grads(ours), loss_and_grads(reference), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_entropy_terms_over_the_kept_set():
    states, weight, generator = _inputs(seed=3)
    warped = _warped(states @ weight.t(), 0, 0.9, 1.0)
    targets = torch.multinomial(warped.softmax(-1), 1, generator=generator).squeeze(1)
    logp, entropy, term = truncated_entropy_terms(
        states, weight, targets, 1.0, Truncation(0, 0.9), chunk_size=6
    )
    logprobs = torch.log_softmax(warped, -1)
    probs = logprobs.exp()
    safe = logprobs.where(probs > 0, 0)
    expected_entropy = -(probs * safe).sum(-1)
    expected = (probs * probs * (safe + expected_entropy[:, None])).sum(-1)
    torch.testing.assert_close(
        logp, logprobs.gather(1, targets[:, None]).squeeze(1), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)
    torch.testing.assert_close(term, expected, rtol=0, atol=1e-12)


def test_a_token_outside_the_scoring_policys_kept_set_stays_finite():
    """After an update (or under the KL reference) the sampled token may fall out of top-k: the
    kept set is widened by it [our reading], so its log-prob is finite and has a gradient."""
    states, weight, _ = _inputs(rows=4, seed=4)
    logits = states @ weight.t()
    least_likely = logits.argmin(dim=-1)
    w = weight.clone().requires_grad_()
    logp, _ = truncated_token_logprobs(states, w, least_likely, 1.0, False, Truncation(5, 1.0))
    assert logp.isfinite().all() and (logp < 0).all()
    logp.sum().backward()
    assert w.grad.isfinite().all() and w.grad.abs().sum() > 0


@pytest.mark.parametrize(("top_k", "top_p"), [(8, 1.0), (0, 0.7), (8, 0.7)])
def test_an_on_policy_ratio_is_exactly_one_on_the_hf_samplers_own_logprobs(
    tiny_model, tiny_tokenizer, top_k, top_p
):
    """rollout=hf's path end to end: transformers' generate() samples with top-k/top-p and
    reports its processed scores; the trainer's float64 log-probs (renormalise) equal them, so
    π_θ/π_old = 1 exactly on-policy and π_θ/π_sampler = 1; the full softmax's (biased) do not."""
    model = tiny_model.double()
    temperature = 0.7
    prompt = tiny_tokenizer(["Add 2 and 3."], return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(
        **prompt,
        do_sample=True,
        temperature=temperature,
        top_k=top_k or None,
        top_p=top_p,
        max_new_tokens=12,
        min_new_tokens=12,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=tiny_tokenizer.pad_token_id,
    )
    completion = out.sequences[:, prompt.input_ids.shape[1] :]
    sampler = torch.stack(
        [
            torch.log_softmax(s, -1).gather(1, completion[:, [t]]).squeeze(1)
            for t, s in enumerate(out.scores)
        ],
        dim=1,
    )
    batch = SequenceBatch(
        input_ids=out.sequences,
        attention_mask=torch.ones_like(out.sequences),
        position_ids=torch.arange(out.sequences.shape[1])[None],
        completion_mask=torch.ones_like(completion, dtype=torch.bool),
        prompt_width=prompt.input_ids.shape[1],
    )
    kernel = KernelConfig(backend="torch")
    honest = Policy(model, kernel, truncation=Truncation(top_k, top_p))
    biased = Policy(model, kernel)
    with torch.no_grad():
        logp_old = honest(batch, temperature).logp
        logp_new = honest(batch, temperature).logp
        logp_full = biased(batch, temperature).logp
    # generate() samples from float32 scores (transformers casts the logits): equal to float32
    # rounding; the float64 equality with the same warpers is the first test's.
    torch.testing.assert_close(logp_old, sampler.double(), rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.exp(logp_new - logp_old), torch.ones_like(logp_old))
    assert (logp_full - sampler).abs().max() > 1e-3  # the untruncated ratio is biased


def test_renormalise_is_the_default_and_reaches_the_policy_and_its_reference(
    compose_config, tiny_model
):
    overrides = ["model=tiny", "rollout.top_p=0.9", "rollout.top_k=20", "algo.beta=0.04"]
    config = load_train_config(compose_config("train", overrides))
    assert config.rollout.truncated_sampling == "renormalise"
    policy = build_policy(config, tiny_model)
    assert policy.head.truncation == Truncation(20, 0.9)
    from tepo_cli.models.reference import frozen_copy

    assert frozen_copy(policy, config).head.truncation == Truncation(20, 0.9)
    untruncated = load_train_config(compose_config("train", ["model=tiny"]))
    assert not build_policy(untruncated, tiny_model).head.truncation.active


def test_mtp_heads_score_under_the_samplers_truncation_too(compose_config, tiny_model):
    overrides = ["model=tiny", "algo=mpo", "rollout.top_k=20", "algo.mtp.head=copy"]
    policy = build_policy(load_train_config(compose_config("train", overrides)), tiny_model)
    heads = [depth.head for depth in policy.mtp.depths]
    assert heads and all(head.truncation == Truncation(20, 1.0) for head in heads)


@pytest.mark.parametrize("sampler", [["rollout.top_p=0.9"], ["rollout.top_k=20"]])
def test_refuse_refuses_a_truncated_sampler(compose_config, sampler):
    overrides = ["model=tiny", *sampler, "rollout.truncated_sampling=refuse"]
    with pytest.raises(ConfigError) as caught:
        load_train_config(compose_config("train", overrides))
    message = str(caught.value)
    assert "truncated distribution" in message and "§0.9" in message
    assert "rollout.truncated_sampling=renormalise" in message


@pytest.mark.parametrize("rollout", ["hf", "vllm"])
def test_biased_keeps_the_full_softmax(compose_config, tiny_model, rollout):
    overrides = ["model=tiny", f"rollout={rollout}", "rollout.top_p=0.9", "rollout.top_k=20"]
    config = load_train_config(
        compose_config("train", [*overrides, "rollout.truncated_sampling=biased"])
    )
    assert (config.rollout.top_p, config.rollout.top_k) == (0.9, 20)
    assert not build_policy(config, tiny_model).head.truncation.active


def test_the_setting_is_inert_and_stored_at_its_default_without_truncation(compose_config):
    """A run saved with the old default (refuse) and an untruncated sampler resumes: the key
    that acts on nothing is read as its default (runtime/resume.py compares configs)."""
    config = load_train_config(
        compose_config("train", ["model=tiny", "rollout.truncated_sampling=refuse"])
    )
    assert (config.rollout.top_p, config.rollout.top_k) == (1.0, 0)
    assert config.rollout.truncated_sampling == "renormalise"


@pytest.mark.slow
def test_on_vllm_the_trainers_truncated_logprobs_are_the_engines(tmp_path):
    """rollout=vllm end to end with top-k and top-p: the engine reports the log-probs of its
    processed (truncated) distribution; with renormalise the trainer's ℓ^old equal them (the
    mismatch is rounding), with biased they are the full softmax's and differ by far more."""
    import json
    import os
    import subprocess
    import sys

    if os.environ.get("TEPO_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="rollout=vllm needs `make install-vllm`")
    common = ["-m", "model=tiny", "rollout=vllm", "rollout.top_k=8", "rollout.top_p=0.9"]
    common += ["trainer.max_steps=1", "trainer.eval_before=false", "trainer.eval_after=false"]
    common += ["trainer.save_final=false", "trainer.progress=false"]
    common += ["rollout.truncated_sampling=renormalise,biased", "hydra.sweep.dir=sweep"]
    ran = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *common],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    mismatch = {}
    for metrics in (tmp_path / "sweep").glob("*/metrics.jsonl"):
        config = (metrics.parent / "config.yaml").read_text()
        mode = "renormalise" if "truncated_sampling: renormalise" in config else "biased"
        mismatch[mode] = json.loads(metrics.read_text().splitlines()[-1])["mismatch_abs_max"]
    assert mismatch["renormalise"] < 1e-3, mismatch
    assert mismatch["biased"] > 0.05, mismatch
