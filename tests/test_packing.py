"""Padding-free packing (models/packing.py): the packed row scores and trains exactly as the padded
batch does — log-probs, entropies, MTP depths, critic values and every parameter's gradient, float64,
shared prompts on and off — and its layout holds only real tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from test_shared_prompts import _batch, assert_same_gradient

from tepo_cli.algos.algo_config import MtpConfig
from tepo_cli.config.schema import KernelConfig
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.kernels.lean_layers import SAVED_OUTPUTS, make_lean
from tepo_cli.models.critic import Critic
from tepo_cli.models.packing import pack
from tepo_cli.models.policy import Policy
from tepo_cli.mtp.modules import attach


def _scores_and_grads(policy: Policy, batch: SequenceBatch, with_mtp: bool):
    policy.zero_grad(set_to_none=True)
    scores = policy(batch, 0.7, with_entropy=True, make=("mtp_logp",) if with_mtp else ())
    weights = torch.linspace(-1.0, 2.0, scores.logp.numel(), dtype=scores.logp.dtype)
    loss = (scores.logp * weights.view_as(scores.logp)).sum() + scores.entropy.sum()
    if with_mtp:
        loss = loss + (scores.mtp_logp * 0.3).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    mtp = None if scores.mtp_logp is None else scores.mtp_logp.detach()
    return scores.logp.detach(), scores.entropy.detach(), mtp, grads


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("with_mtp", [False, True])
def test_packed_equals_padded_in_values_and_gradients(tiny_model, tiny_tokenizer, share, with_mtp):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    assert batch.attention_mask[:, : batch.prompt_width].eq(0).any(), "prompts must be padded"
    assert not batch.completion_mask.all(), "answers must be ragged"
    kernel = KernelConfig(backend="torch")
    mtp = MtpConfig()
    depths = 3 if with_mtp else 0
    torch.manual_seed(0)
    modules = attach(depths, mtp) if depths else None
    padded = Policy(tiny_model, kernel, share, attach=modules)
    packed = Policy(tiny_model, kernel, share, attach=modules, packing=True)
    if with_mtp:
        packed.mtp.load_state_dict(padded.mtp.state_dict())
    expected = _scores_and_grads(padded, batch, with_mtp)
    got = _scores_and_grads(packed, batch, with_mtp)
    for name, value, reference in zip(
        ("logp", "entropy", "mtp"), got[:3], expected[:3], strict=True
    ):
        if reference is not None:
            torch.testing.assert_close(value, reference, rtol=0, atol=1e-12, msg=name)
    assert got[3].keys() == expected[3].keys()
    for name, grad in got[3].items():
        assert_same_gradient(grad, expected[3][name], name)


def test_packed_critic_values_and_gradients_equal_the_padded(tiny_model, tiny_tokenizer):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=2)
    padded = Critic.from_policy(tiny_model).double()
    packed = Critic.from_policy(tiny_model, packing=True).double()
    packed.load_state_dict(padded.state_dict())
    results = []
    for critic in (padded, packed):
        values = critic(batch)
        (
            values * torch.linspace(-1, 1, values.numel(), dtype=values.dtype).view_as(values)
        ).sum().backward()
        results.append((values.detach(), {n: p.grad for n, p in critic.named_parameters()}))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=1e-12)
    for name, grad in results[1][1].items():
        assert_same_gradient(grad, results[0][1][name], name)


def test_layout_holds_each_prompt_once_and_only_real_tokens(tiny_model, tiny_tokenizer):
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    prompt_width = batch.prompt_width
    prompts = batch.attention_mask[:, :prompt_width]
    first, owner = batch.distinct_prompts()
    layout = pack(batch.attention_mask, batch.position_ids, prompt_width, (first, owner))
    assert len(first) == 3 < len(batch)
    distinct_tokens = int(prompts[first].sum())
    real_answers = int(batch.completion_mask.sum())
    assert layout.length == distinct_tokens + real_answers
    flat = batch.input_ids.reshape(-1)
    mask = batch.attention_mask.reshape(-1)
    assert bool(mask.index_select(0, layout.source).all()), "a padding token was packed"
    # Positions restart at every prompt and continue it in every answer.
    positions = layout.positions.tolist()
    assert positions.count(0) == 3
    assert flat.index_select(0, layout.source).numel() == layout.length
    # Each answer's keys: its whole prompt, then itself.
    starts, keys = layout.key_starts, layout.key_index.tolist()
    counts = [starts[i + 1] - starts[i] for i in range(len(starts) - 1)]
    queries = [layout.query_starts[i + 1] - layout.query_starts[i] for i in range(len(counts))]
    assert sum(queries) == layout.length
    assert all(k >= q for k, q in zip(counts, queries, strict=True))
    assert len(keys) == starts[-1]


def test_packed_with_gradient_checkpointing_recomputes_and_equals_the_padded(
    tiny_model, tiny_tokenizer
):
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=2)
    kernel = KernelConfig(backend="torch")
    expected = _scores_and_grads(Policy(tiny_model, kernel), batch, with_mtp=False)
    tiny_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    packed = Policy(tiny_model, kernel, packing=True)
    calls = []
    layer = tiny_model.model.layers[0]
    hook = layer.mlp.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    try:
        got = _scores_and_grads(packed, batch, with_mtp=False)
    finally:
        hook.remove()
        tiny_model.gradient_checkpointing_disable()
    assert len(calls) == 2, "the first layer's MLP must run again during backward"
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-12)
    for name, grad in got[3].items():
        assert_same_gradient(grad, expected[3][name], name)


def test_packed_lean_layers_keep_recipes_and_equal_the_padded(tiny_model, tiny_tokenizer):
    """With the lean layers (kernel.lean_layers, the default) a packed row keeps recipes for the
    inputs of q, k, v, gate, up, down and o_proj (the segments' attention output, as one
    token-major tensor) and for the segments' keys and values, and the log-probs and gradients stay the padded path's (float64; both
    lean, whose norm runs in float64 where transformers' casts to float32)."""
    tiny_model.double()
    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    kernel = KernelConfig(backend="torch")
    lean = copy.deepcopy(tiny_model)
    make_lean(lean)
    expected = _scores_and_grads(Policy(lean, kernel, True), batch, False)
    before = SAVED_OUTPUTS.recomputed_bytes
    shapes = []
    pack = SAVED_OUTPUTS.pack

    def recording(tensor):
        packed = pack(tensor)
        if not isinstance(packed, torch.Tensor):
            shapes.append(tuple(tensor.shape))
        return packed

    SAVED_OUTPUTS.pack = recording
    try:
        got = _scores_and_grads(Policy(lean, kernel, True, packing=True), batch, False)
    finally:
        SAVED_OUTPUTS.pack = pack
    recomputed = SAVED_OUTPUTS.recomputed_bytes - before
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-12)
    for name, grad in got[3].items():
        assert_same_gradient(grad, expected[3][name], name)
    config = tiny_model.config
    kv_width = config.num_key_value_heads * config.hidden_size // config.num_attention_heads
    # Per token and layer, float64: the inputs of q, k, v, gate, up and o_proj (6 x hidden),
    # down_proj's (intermediate), and the segments' keys and values (2 x kv_width; an answer's
    # prompt keys once more per answer, which only adds).
    per_token = 6 * config.hidden_size + config.intermediate_size + 2 * kv_width
    answer_tokens = int(batch.completion_mask.sum())
    assert recomputed > answer_tokens * config.num_hidden_layers * per_token * 8
    head = config.hidden_size // config.num_attention_heads
    # [L, hidden] as torch's linear keeps its input, [1, L, hidden] as DeepSpeed's (which a ZeRO-3
    # engine built earlier in the process leaves in place of F.linear)
    row = [shape for shape in shapes if shape[-1] == config.hidden_size and len(shape) <= 3]
    assert len(row) == 6 * config.num_hidden_layers  # q, k, v, gate, up and o_proj, each layer
    segments = [shape for shape in shapes if len(shape) == 4 and shape[-1] == head]
    assert len(segments) >= 2 * 3 * config.num_hidden_layers  # keys and values of >= 3 answers


def _saved_masks(policy: Policy, batch: SequenceBatch):
    """Log-probs, gradients, and the attention masks autograd kept: {storage address: shape}."""
    masks = {}

    def pack_saved(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 2 and tensor.is_floating_point() and tensor.isneginf().any():
            masks[tensor.untyped_storage().data_ptr()] = tuple(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack_saved, lambda tensor: tensor):
        logp, entropy, _, grads = _scores_and_grads(policy, batch, with_mtp=False)
    return logp, entropy, grads, masks


def test_layers_keep_one_attention_mask_per_segment_shape(tiny_model, tiny_tokenizer, monkeypatch):
    """The answers that follow a shared prompt attend to it through a bottom-right causal mask:
    one tensor per segment shape for the whole stack (torch's `causal_lower_right` made one per
    layer on the CPU), with the same log-probs and gradients to the bit."""
    from tepo_cli.models import packed_attention

    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    policy = Policy(tiny_model, KernelConfig(backend="torch"), True, packing=True)
    logp, entropy, grads, masks = _saved_masks(policy, batch)
    shapes = list(masks.values())
    assert shapes, "shared prompts: the later answers' segments attend to their prompt's keys"
    assert len(shapes) == len(set(shapes)), f"one mask per shape, not per layer: {shapes}"
    monkeypatch.setattr(
        packed_attention,
        "_lower_right",
        lambda layout, q, k: packed_attention.causal_lower_right(q.shape[1], k.shape[1]),
    )
    torch_logp, torch_entropy, torch_grads, torch_masks = _saved_masks(policy, batch)
    layers = tiny_model.config.num_hidden_layers
    assert len(torch_masks) == layers * len(set(shapes)), "torch's: one per layer (the saving)"
    assert torch.equal(logp, torch_logp) and torch.equal(entropy, torch_entropy)
    assert grads.keys() == torch_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, torch_grads[name]), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's varlen kernel: CUDA")
@pytest.mark.parametrize("share", [True, False])
def test_packed_on_cuda_goes_through_flash_varlen_and_agrees_with_the_padded(
    tiny_model, tiny_tokenizer, share, monkeypatch
):
    """The half-precision CUDA path (FlashAttention's variable-length kernel, grouped-query: the
    tiny model has 2 query heads per key head) against the padded batch's attention, in bf16."""
    import dataclasses
    import functools

    import torch.nn.attention.varlen as varlen

    batch = _batch(tiny_model, tiny_tokenizer, n=3)
    cuda = torch.device("cuda")
    batch = dataclasses.replace(
        batch,
        **{
            field.name: getattr(batch, field.name).to(cuda)
            for field in dataclasses.fields(batch)
            if isinstance(getattr(batch, field.name), torch.Tensor)
        },
    )
    model = tiny_model.to(cuda, torch.bfloat16)
    calls = []
    real = varlen.varlen_attn
    # functools.wraps: the path reads the installed kernel's signature (window_size or is_causal)
    # through the wrapper's __wrapped__, as it would from the real function.
    counted = functools.wraps(real)(lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(varlen, "varlen_attn", counted)
    kernel = KernelConfig(backend="torch")
    results = []
    for packing in (False, True):
        model.zero_grad(set_to_none=True)
        scores = Policy(model, kernel, share, packing=packing)(batch, 0.7, with_entropy=True)
        weights = torch.linspace(-1.0, 2.0, scores.logp.numel(), device=cuda)
        (scores.logp.float() * weights.view_as(scores.logp)).sum().backward()
        grads = {
            n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None
        }
        results.append((scores.logp.float().detach(), grads))
    assert calls, "the packed pass did not reach FlashAttention's varlen kernel"
    (padded_logp, padded_grads), (packed_logp, packed_grads) = results
    mask = batch.completion_mask
    torch.testing.assert_close(packed_logp[mask], padded_logp[mask], rtol=0, atol=0.1)
    for name, grad in packed_grads.items():
        error = float((grad - padded_grads[name]).norm() / padded_grads[name].norm().clamp(1e-12))
        assert error < 0.05, f"{name}: relative error {error:.2e} in bf16"
