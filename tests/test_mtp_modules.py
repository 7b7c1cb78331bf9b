"""MPO's MTP modules (docs/objectives.md §1.5, invariant §2.10): their log-probs through the kernel
path equal a naive full-logits float64 implementation, gradients included (modules and backbone);
their initialisation, the architectures that carry them, and the knobs that route gradients."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, Qwen2Config, Qwen2ForCausalLM

from tepo_cli.algos.algo_config import MtpConfig
from tepo_cli.config.schema import KernelConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.policy import Policy
from tepo_cli.mtp.modules import MtpStack, attach
from tepo_cli.mtp.prediction_loss import alpha_weights, mtp_prediction_loss, mtp_present
from tepo_cli.mtp.support import mtp_support_problem
from tepo_cli.rollout import Sampling
from tepo_cli.rollout.hf import generate

PROMPTS = ["Hi", "What is 7*8? Answer with just the number, please.", "What is 2+2?"]
KERNEL = KernelConfig(backend="torch", chunk_size=7)


def _batch(model, tokenizer, n: int = 2) -> SequenceBatch:
    """Left-padded prompts (each n times), right-padded completions of mixed lengths."""
    torch.manual_seed(3)
    rollout = generate(model, tokenizer, PROMPTS, Sampling(n=n, max_new_tokens=7))
    width = rollout.completion_ids.shape[1]
    lengths = torch.tensor([width, 3, 5, 1, 6, 2])[: len(PROMPTS) * n]
    rollout.completion_mask = torch.arange(width) < lengths[:, None].clamp(max=width)
    return SequenceBatch.from_rollout(rollout)


def naive_mtp_logprobs(policy: Policy, batch: SequenceBatch, temperature: float) -> torch.Tensor:
    """Written from the definition: the backbone over the whole sequence (no prompt sharing), each
    depth's block under a hand-built additive causal + padding mask, full logits, log_softmax,
    and targets picked with Python loops."""
    lm, stack = policy.lm, policy.mtp
    backbone = lm.base_model
    ids, attention, positions = batch.input_ids, batch.attention_mask, batch.position_ids
    prompt_width, mask = batch.prompt_width, batch.completion_mask
    width = mask.shape[1]
    hidden = backbone(
        input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False
    ).last_hidden_state[:, :-1]
    length = hidden.shape[1]
    pos = positions[:, :length]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = causal[None] & attention[:, None, :length].bool()
    additive = torch.zeros(allowed.shape, dtype=hidden.dtype)
    additive.masked_fill_(~allowed, torch.finfo(hidden.dtype).min)
    additive = additive[:, None]
    rotary = backbone.rotary_emb(hidden, position_ids=pos)
    out = torch.zeros((*mask.shape, len(stack.depths)), dtype=torch.float64)
    previous = hidden
    for offset, depth in enumerate(stack.depths, start=1):
        tokens = torch.zeros_like(ids[:, :length])
        available = ids[:, offset : offset + length]
        tokens[:, : available.shape[1]] = available
        combined = torch.cat(
            [depth.hidden_norm(previous), depth.embed_norm(backbone.embed_tokens(tokens))], dim=-1
        )
        previous = depth.block(
            depth.project(combined),
            attention_mask=additive,
            position_embeddings=rotary,
            position_ids=pos,
        )
        weight = (depth.head or policy.head).weight
        logits = depth.final_norm(previous).double() @ weight.double().t() / temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        for b in range(mask.shape[0]):
            for t in range(width):
                if mask[b, t] and t + offset < width and mask[b, t + offset]:
                    target = ids[b, prompt_width + t + offset]
                    out[b, t, offset - 1] = logprobs[b, prompt_width - 1 + t, target]
    return out


def _grads(policy: Policy, values: torch.Tensor) -> dict[str, torch.Tensor]:
    policy.zero_grad(set_to_none=True)
    weights = torch.linspace(-1.0, 2.0, values.numel(), dtype=values.dtype).view_as(values)
    (values * weights).sum().backward()
    return {
        name: p.grad.detach().clone() for name, p in policy.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("share_prompts", [False, True])
@pytest.mark.parametrize("head", ["copy", "shared"])
def test_kernel_path_equals_naive_full_logits_with_gradients(
    tiny_model, tiny_tokenizer, share_prompts: bool, head: str
):
    model = tiny_model.double()
    batch = _batch(model, tiny_tokenizer)
    policy = Policy(model, KERNEL, share_prompts, attach=attach(3, MtpConfig(head=head)))
    with torch.no_grad():  # a non-trivial M_n: the embedding half matters too
        for depth in policy.mtp.depths:
            depth.project.weight.add_(0.05 * torch.randn_like(depth.project.weight))
    got = policy(batch, 0.7, make=("mtp_logp",)).mtp_logp
    got_grads = _grads(policy, got)
    expected = naive_mtp_logprobs(policy, batch, 0.7)
    expected_grads = _grads(policy, expected)
    present = mtp_present(batch.completion_mask, 3)
    assert present[..., 2].any() and not present.all()  # every depth scored, some slots empty
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert torch.all(got[~present] == 0)
    assert set(got_grads) == set(expected_grads)
    assert any(name.startswith("lm.") for name in got_grads)  # the backbone is reached
    assert any(name.startswith("mtp.depths.2.block") for name in got_grads)
    for name, grad in got_grads.items():
        error = float((grad - expected_grads[name]).norm() / expected_grads[name].norm())
        # transformers' RMSNorm rounds to float32 inside a float64 model; shared prompts run
        # the prompts in batches of another shape, so agreement is to float32 rounding there.
        assert error < (1e-6 if share_prompts else 1e-9), f"{name}: relative error {error:.2e}"


def test_fresh_modules_copy_the_last_layer_and_head_with_identity_projection(tiny_model):
    size = tiny_model.config.hidden_size
    stack = MtpStack(tiny_model, 2, "copy", KERNEL)
    last = tiny_model.model.layers[-1].state_dict()
    for depth in stack.depths:
        weight = depth.project.weight
        assert torch.equal(weight[:, :size], torch.eye(size)) and torch.all(weight[:, size:] == 0)
        assert all(torch.equal(v, last[k]) for k, v in depth.block.state_dict().items())
        assert torch.equal(depth.head.weight, tiny_model.lm_head.weight)
        assert depth.head.weight.data_ptr() != tiny_model.lm_head.weight.data_ptr()  # a copy
        assert torch.all(depth.hidden_norm.weight == 1) and torch.all(depth.embed_norm.weight == 1)
    assert (
        stack.depths[0].block.self_attn.q_proj.weight
        is not stack.depths[1].block.self_attn.q_proj.weight
    )
    shared = MtpStack(tiny_model, 2, "shared", KERNEL)
    per_depth_head = tiny_model.lm_head.weight.numel()
    assert stack.parameter_count() - shared.parameter_count() == 2 * per_depth_head


def test_backbone_grad_off_keeps_the_backbone_out_and_trainable_off_freezes(
    tiny_model, tiny_tokenizer
):
    batch = _batch(tiny_model, tiny_tokenizer)
    for head in ("copy", "shared"):  # a shared head is the backbone's: it must stay out too
        config = MtpConfig(backbone_grad=False, head=head)
        policy = Policy(tiny_model, KERNEL, attach=attach(2, config))
        grads = _grads(policy, policy(batch, 1.0, make=("mtp_logp",)).mtp_logp)
        assert grads and all(name.startswith("mtp.") for name in grads), head
    frozen = Policy(tiny_model, KERNEL, attach=attach(2, MtpConfig(trainable=False)))
    assert not any(p.requires_grad for p in frozen.mtp.parameters())
    assert all(p.requires_grad for p in frozen.lm.parameters())


def test_a_qwen2_model_carries_mtp_modules_and_gpt2_is_refused(tiny_tokenizer):
    config = Qwen2Config(
        vocab_size=len(tiny_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(config)
    batch = _batch(qwen, tiny_tokenizer)
    policy = Policy(qwen, KERNEL, attach=attach(2, MtpConfig()))
    mtp_logp = policy(batch, 1.0, make=("mtp_logp",)).mtp_logp
    present = mtp_present(batch.completion_mask, 2)
    assert torch.all(mtp_logp[present] < 0) and torch.all(mtp_logp[~present] == 0)
    problem = mtp_support_problem(GPT2Config().model_type)
    assert "architecture is 'gpt2'" in problem and "llama, mistral, qwen2, qwen3" in problem


def test_prediction_loss_weights_depths_by_decaying_alpha():
    assert alpha_weights(3, 0.5).tolist() == pytest.approx([4 / 7, 2 / 7, 1 / 7], abs=1e-15)
    mask = torch.tensor([[True, True, True, False]])
    mtp_logp = torch.tensor(
        [[[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0], [-7.0, -8.0]]], dtype=torch.float64
    )
    # depth 2 targets at anchors 0, 1 (mean NLL 2); depth 3 at anchor 0 (NLL 2).
    loss = mtp_prediction_loss(mtp_logp, mask, alpha_decay=0.5)
    assert float(loss) == pytest.approx(2 / 3 * 2 + 1 / 3 * 2, abs=1e-12)
    global_norm = mtp_prediction_loss(mtp_logp, mask, alpha_decay=0.5, num_tokens=10)
    assert float(global_norm) == pytest.approx(2 / 3 * 4 / 10 + 1 / 3 * 2 / 10, abs=1e-12)
