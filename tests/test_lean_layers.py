"""Lean RMSNorm/SwiGLU: the same forward values, gradients equal to a float64 reference, less
kept for backward, and only the modules whose code is known are changed."""

from __future__ import annotations

import copy

import torch
from torch import nn

from tepo_cli.kernels.lean_layers import SAVED_OUTPUTS, _RMSNorm, _SiluMul, make_lean


def _reference_rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def test_rms_norm_forward_and_gradients_match_float64():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(16, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 5, 16, dtype=torch.float64)
    expected = _reference_rms_norm(x, weight, 1e-5)
    grads = torch.autograd.grad((expected * upstream).sum(), [x, weight])
    lean = _RMSNorm.apply(x, weight, 1e-5)
    torch.testing.assert_close(lean, expected, rtol=0, atol=1e-12)
    lean_grads = torch.autograd.grad((lean * upstream).sum(), [x, weight])
    for got, want in zip(lean_grads, grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, w: _RMSNorm.apply(a, w, 1e-5), (x, weight))


def test_silu_mul_forward_and_gradients_match_float64():
    torch.manual_seed(1)
    gate = torch.randn(4, 7, 32, dtype=torch.float64, requires_grad=True) * 4
    up = torch.randn(4, 7, 32, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SiluMul.apply, (gate.detach().requires_grad_(), up))
    expected = nn.functional.silu(gate) * up
    upstream = torch.randn_like(expected)
    grads = torch.autograd.grad((expected * upstream).sum(), [gate, up])
    lean = _SiluMul.apply(gate, up)
    assert torch.equal(lean, expected)
    for got, want in zip(
        torch.autograd.grad((lean * upstream).sum(), [gate, up]), grads, strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _saved_bytes(model, inputs) -> tuple[int, int]:
    """(bytes autograd keeps for backward, bytes kept as recipes instead) over one forward. Inside
    the lean decoder stack its own hooks take precedence over this one: they count there."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    kept, recomputed = SAVED_OUTPUTS.kept_bytes, SAVED_OUTPUTS.recomputed_bytes
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs).logits.sum().backward()
    kept = SAVED_OUTPUTS.kept_bytes - kept
    return total + kept, SAVED_OUTPUTS.recomputed_bytes - recomputed


def test_lean_model_matches_and_keeps_less_for_backward(tiny_model):
    lean = copy.deepcopy(tiny_model)
    layers = len(tiny_model.model.layers)
    # 2 norms and an MLP per layer, the final norm, the decoder stack (recipes for their outputs)
    assert make_lean(lean) == 3 * layers + 2
    torch.manual_seed(2)
    inputs = {
        "input_ids": torch.randint(3, 1000, (2, 9)),
        "attention_mask": torch.tensor([[0, 0] + [1] * 7, [1] * 9]),
    }
    expected = tiny_model(**inputs).logits
    got = lean(**inputs).logits
    assert torch.equal(got, expected)  # float32: the same operations in the same order
    tiny_model.zero_grad()
    expected.square().sum().backward()
    got.square().sum().backward()
    for (name, a), b in zip(lean.named_parameters(), tiny_model.parameters(), strict=True):
        error = float((a.grad - b.grad).norm() / b.grad.norm())
        assert error < 1e-5, f"{name}: relative error {error:.1e} (float32 rounding is ~1e-7)"
    tokens, hidden = 2 * 9, tiny_model.config.hidden_size
    inter = tiny_model.config.intermediate_size
    (plain, none), (kept, recomputed) = _saved_bytes(tiny_model, inputs), _saved_bytes(lean, inputs)
    # Per token and layer, float32: the lean functions keep neither the normalised inputs nor
    # silu(gate) (2 x hidden + inter); their consumers keep recipes instead of the outputs:
    # q, k, v and gate, up their normalised input (5 x hidden), down_proj silu(gate) * up.
    assert none == 0 and recomputed == tokens * layers * (5 * hidden + inter) * 4
    assert plain - kept >= tokens * layers * (2 * hidden + inter + 5 * hidden + inter) * 4
    with torch.no_grad():  # without autograd the modules' own forwards run
        assert torch.equal(lean(**inputs).logits, expected.detach())


def test_unknown_modules_are_left_alone():
    class OtherNorm(nn.Module):
        variance_epsilon = 1e-6

        def forward(self, x):
            return x

    model = nn.Sequential(OtherNorm(), nn.Linear(3, 3))
    assert make_lean(model) == 0
    assert "forward" not in vars(model[0])


def test_recipes_give_bitwise_the_gradients_of_kept_outputs(tiny_model):
    """The recomputed outputs are the forward's to the bit (the same operations on the same
    inputs), so keeping recipes instead of the outputs changes no gradient at all."""
    with_recipes = copy.deepcopy(tiny_model)
    make_lean(with_recipes)
    kept = copy.deepcopy(with_recipes)
    del kept.model.forward  # the decoder stack's own forward: its layers' outputs are kept
    torch.manual_seed(3)
    inputs = {"input_ids": torch.randint(3, 1000, (2, 11))}
    recomputed = SAVED_OUTPUTS.recomputed_bytes
    for model in (with_recipes, kept):
        model(**inputs).logits.square().sum().backward()
    assert SAVED_OUTPUTS.recomputed_bytes > recomputed  # only the first model used recipes
    for (name, a), b in zip(with_recipes.named_parameters(), kept.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
