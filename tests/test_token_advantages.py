"""Token-level advantages [B, T] (docs/objectives.md §0.1), as a learned critic produces them:
what each kind of unit takes, and that per-response advantages broadcast to tokens change nothing."""

from __future__ import annotations

import pytest
import torch

from tepo_cli.algos import policy_loss, preset_names

F64 = torch.float64
# Every preset callable without MTP inputs (the paper's `mpo` needs them: tests/test_algos_mpo.py).
PRESETS = [name for name in preset_names() if name != "mpo"]


def batch(seed: int = 0, rows: int = 4, columns: int = 7, spread: float = 0.2):
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = (-torch.rand(shape, generator=gen, dtype=F64) * 2 - 0.1).requires_grad_(True)
    old = logp.detach() + spread * torch.randn(shape, generator=gen, dtype=F64)
    ref = logp.detach() + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    ent = torch.rand(shape, generator=gen, dtype=F64) * 2
    token_adv = torch.randn(shape, generator=gen, dtype=F64)
    lengths = torch.tensor([columns, 3, 5, 1])[:rows]
    mask = torch.arange(columns) < lengths[:, None]
    return logp, old, ref, ent, token_adv, mask


def run(preset, logp, old, adv, mask, **kw):
    loss, metrics = policy_loss(preset, logp, old, adv, mask, **kw)
    return loss.detach(), torch.autograd.grad(loss, logp)[0], metrics


@pytest.mark.parametrize("preset", PRESETS)
def test_per_response_advantages_broadcast_to_tokens_change_nothing(preset: str):
    logp, old, ref, ent, token_adv, mask = batch()
    per_row = token_adv[:, 0]
    extra = {"ref_logp": ref, "old_entropy": ent}
    a = run(preset, logp, old, per_row, mask, **extra)
    b = run(preset, logp, old, per_row[:, None].expand_as(token_adv).clone(), mask, **extra)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-15)


def test_a_unit_clipped_as_one_action_takes_its_tokens_mean():
    """GSPO (one ratio and one clip per response) with token advantages is GSPO with each
    response's mean advantage; the disjoint MPO blocks likewise, block by block."""
    logp, old, _, _, token_adv, mask = batch(1, spread=1e-3)
    row_mean = (token_adv * mask).sum(1) / mask.sum(1)
    a = run("gspo", logp, old, token_adv, mask)
    b = run("gspo", logp, old, row_mean, mask)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-15)
    block_mean = torch.zeros_like(token_adv)
    for r in range(mask.shape[0]):
        n = int(mask[r].sum())
        for start in range(0, n, 2):
            block_mean[r, start : min(n, start + 2)] = token_adv[
                r, start : min(n, start + 2)
            ].mean()
    a = run("mpo_disjoint", logp, old, token_adv, mask, k=2)
    b = run("mpo_disjoint", logp, old, block_mean, mask, k=2)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-15)


def test_tokens_and_mpo_anchors_take_their_own_token_advantage():
    """GRPO's surrogate uses each token's own Â; MPO's window is named by its anchor, so with
    β₂ = 0 (a window of its anchor alone) it is token-level PPO-clip with the same Â_{i,t}."""
    logp, old, _, _, token_adv, mask = batch(2)
    loss, grad, _ = run("grpo", logp, old, token_adv, mask, beta=0.0, loss_agg="token-mean")
    ratio = torch.exp(logp.detach() - old)
    per_token = -torch.minimum(ratio * token_adv, ratio.clamp(0.8, 1.2) * token_adv)
    expected = per_token[mask].sum() / mask.sum()
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-14)
    mpo = run("mpo_exact", logp, old, token_adv, mask, block_weights="decay:0,0.8")
    torch.testing.assert_close(mpo[0], loss, rtol=0, atol=1e-15)
    torch.testing.assert_close(mpo[1], grad, rtol=0, atol=1e-15)


def test_on_policy_gspo_token_with_token_advantages_is_grpos_gradient():
    """GSPO-token keeps each token's own advantage; on-policy its gradient is GRPO's with the
    same token-level advantages (§2.3 with a critic's advantages)."""
    logp, _, _, _, token_adv, mask = batch(3)
    old = logp.detach().clone()
    grpo = run("grpo", logp, old, token_adv, mask, beta=0.0)
    gspo_token = run("gspo", logp, old, token_adv, mask, route="token", eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(gspo_token[1], grpo[1], rtol=0, atol=1e-15)


def test_padding_and_shape_errors():
    logp, old, _, _, token_adv, mask = batch(4)
    token_adv[~mask] = float("nan")  # padding values are never read
    loss, grad, _ = run("grpo", logp, old, token_adv, mask, beta=0.0)
    assert torch.isfinite(loss) and torch.all(grad[~mask] == 0)
    with pytest.raises(
        ValueError, match=r"^advantages must be \[B\] = \(4,\), one per response, or"
    ):
        policy_loss("grpo", logp, old, token_adv[:, :3], mask)
