"""LoRA through peft (tepo_cli/models/lora.py, models/reference.py, runtime/lora_files.py): only the
adapters train, switching them off gives back the base model bit for bit (the KL reference, no
copy), merged weights are the adapted model's, dropout acts only where gradients are recorded,
and a run's final/ is a peft adapter plus the merged model that both load back."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tepo_cli.config.schema import KernelConfig, LoraConfig, ModelConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.loading import load_model
from tepo_cli.models.lora import (
    adapters_off,
    add_adapters,
    lora_layers,
    merged_weights,
    trainable_parameters,
)
from tepo_cli.models.policy import Policy
from tepo_cli.models.reference import AdaptersOff
from tepo_cli.rollout import Sampling
from tepo_cli.rollout.hf import generate

IDS = torch.tensor([[5, 17, 230, 9, 41, 77, 3, 1200], [8, 8, 310, 64, 2, 19, 700, 45]])


def _adapted(model, r: int = 4, **settings) -> torch.nn.Module:
    add_adapters(model, LoraConfig(r=r, **settings), base_model=None)
    return model


def _randomise_adapters(model, seed: int = 0) -> None:
    """peft starts B at zero (the adapted model is the base model); a trained adapter is not."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model):
            weight = layer.lora_B["default"].weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.5)


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_only_the_adapters_train_and_their_count_is_r_times_in_plus_out(tiny_model):
    """The tiny Llama (hidden 64, MLP 128, 2 layers, 1 of 2 heads for k/v: width 32): per layer
    q, o 64->64; k, v 64->32; gate, up 64->128; down 128->64. LoRA adds r (in + out) each."""
    base_count = sum(p.numel() for p in tiny_model.parameters())
    model = _adapted(tiny_model, r=4)
    per_layer = sum(i + o for i, o in [(64, 64), (64, 64), (64, 32), (64, 32)] + [(64, 128)] * 3)
    assert trainable_parameters(model) == 2 * 4 * per_layer == 8192
    assert sum(p.numel() for p in model.parameters()) == base_count + 8192
    assert all("lora_" in name for name, p in model.named_parameters() if p.requires_grad)
    assert len(lora_layers(model)) == 14


def test_adapters_off_is_the_base_model_bit_for_bit(tiny_model):
    base = copy.deepcopy(tiny_model)
    model = _adapted(tiny_model)
    torch.testing.assert_close(_logits(model), _logits(base), rtol=0, atol=0)  # B = 0 at start
    _randomise_adapters(model)
    adapted = _logits(model)
    assert (adapted - _logits(base)).abs().max() > 0.1
    with adapters_off(model):
        assert torch.equal(_logits(model), _logits(base))
    assert torch.equal(_logits(model), adapted)  # switched back on
    assert trainable_parameters(model) == 8192  # and trainable again


def test_merged_weights_are_the_adapted_model_under_plain_names(tiny_model):
    plain = copy.deepcopy(tiny_model)
    model = _adapted(tiny_model, r=8, alpha=16.0)
    _randomise_adapters(model, seed=3)
    merged = dict(merged_weights(model, lambda params: torch.no_grad()))
    names = [name for name, _ in plain.named_parameters(remove_duplicate=False)]
    assert list(merged) == names  # tied lm_head.weight included
    plain.load_state_dict(merged, strict=False)
    torch.testing.assert_close(_logits(plain), _logits(model), rtol=1e-5, atol=1e-5)
    layer = lora_layers(model)[0]  # W + (alpha / r) B A
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected = layer.base_layer.weight + 2.0 * b @ a
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], expected)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (["lm_head"], "LM head"),
        (["embed_tokens", "q_proj"], "embeddings"),
        (["query_key_value"], "model.lora.target_modules"),
    ],
)
def test_targets_the_kernel_cannot_adapt_are_refused(tiny_model, targets, message):
    with pytest.raises(ConfigError, match=message):
        _adapted(tiny_model, target_modules=targets)


def _batch(model, tokenizer) -> SequenceBatch:
    torch.manual_seed(4)
    rollout = generate(model, tokenizer, ["What is 2+2?", "7*8="], Sampling(n=2, max_new_tokens=6))
    return SequenceBatch.from_rollout(rollout)


def test_reference_is_the_base_models_logprobs_without_a_copy(tiny_model, tiny_tokenizer):
    base = Policy(copy.deepcopy(tiny_model), KernelConfig())
    policy = Policy(tiny_model, KernelConfig())
    policy.add_adapters(LoraConfig(r=4), base_model=None)
    _randomise_adapters(policy.lm)
    batch = _batch(tiny_model, tiny_tokenizer)
    reference = AdaptersOff(policy)
    with torch.no_grad():
        expected, adapted = base(batch, 0.7).logp, policy(batch, 0.7).logp
    assert torch.equal(reference(batch, 0.7).logp, expected)
    assert (adapted - expected).abs().max() > 0.01
    assert vars(reference) == {"policy": policy}  # no module, no tensor of its own


def test_dropout_acts_only_when_gradients_are_recorded(tiny_model, tiny_tokenizer):
    policy = Policy(tiny_model, KernelConfig())
    policy.add_adapters(LoraConfig(r=4, dropout=0.5), base_model=None)
    _randomise_adapters(policy.lm)
    batch = _batch(tiny_model, tiny_tokenizer)
    with torch.no_grad():
        scoring = policy(batch, 1.0).logp
        assert torch.equal(policy(batch, 1.0).logp, scoring)  # sampling, old log-probs: no dropout
    training = policy(batch, 1.0).logp
    assert training.requires_grad and (training - scoring).abs().max() > 1e-3
    assert not any(module.training for module in policy.lm.modules())


@pytest.mark.slow
def test_lora_run_saves_a_peft_adapter_and_the_merged_model(compose_config, tmp_path):
    """A LoRA run from a saved model (model=hf): the KL is 0 at step 1 (B = 0: policy and
    reference agree) and not after; only the adapters moved; final/ loads with peft and with
    `tepo eval`'s loader, final/merged with transformers, all three the same function."""
    from peft import PeftModel

    from tepo_cli.config.validate import load_train_config
    from tepo_cli.models.loading import load_tokenizer
    from tepo_cli.runtime.distributed import setup_topology, teardown
    from tepo_cli.train.recipe import train

    tiny_cfg = ModelConfig(name="tiny", source="tiny", tokenizer="smollm2_135m", dtype="float32")
    tokenizer = load_tokenizer(tiny_cfg)
    start = tmp_path / "start"
    load_model(tiny_cfg, tokenizer, torch.device("cpu")).save_pretrained(start)
    tokenizer.save_pretrained(start)
    (tmp_path / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2\n"
    )
    run_dir = tmp_path / "run"
    overrides = [
        "model=hf",
        f"model.path={start}",
        "model.lora.r=4",
        "reward=custom",
        f"reward.path={tmp_path / 'parity.py'}",
        "trainer.max_steps=3",
        "trainer.lr=1e-2",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.progress=false",
        "rollout.max_new_tokens=6",
    ]
    config = load_train_config(compose_config("train", overrides))
    try:
        summary = train(config, run_dir, setup_topology(num_threads=None))
    finally:
        teardown()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["kl"] == 0.0 and records[-1]["kl"] > 0.0
    assert summary["trainable_parameters"] == 8192
    assert summary["final_model"] == str(run_dir / "final" / "merged")
    final = run_dir / "final"
    assert json.loads((final / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ] == str(start.resolve())
    merged = AutoModelForCausalLM.from_pretrained(final / "merged")
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(start), final)
    ours = load_model(
        ModelConfig(name="lora", source="hf", path=str(final)), tokenizer, torch.device("cpu")
    )
    start_logits = _logits(AutoModelForCausalLM.from_pretrained(start))
    expected = _logits(peft_model)
    assert (expected - start_logits).abs().max() > 1e-3  # the adapter learned something
    torch.testing.assert_close(_logits(merged), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_logits(ours), expected, rtol=1e-5, atol=1e-5)


def test_an_adapter_of_an_in_process_model_points_to_its_merged_copy(tmp_path, tiny_tokenizer):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": None}))
    cfg = ModelConfig(name="lora", source="hf", path=str(tmp_path))
    with pytest.raises(ConfigError, match="merged"):
        load_model(cfg, tiny_tokenizer, torch.device("cpu"))
