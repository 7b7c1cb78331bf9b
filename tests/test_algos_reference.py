"""§2.8: every objective's loss and gradient against a float64 hand-written reference.

The reference below is written straight from docs/objectives.md with plain Python loops over rows,
units and tokens; it shares no code with tepo_cli.algos or tepo_cli.kernels.units.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tepo_cli.algos import load_preset, policy_loss

F64 = torch.float64


def _zero() -> torch.Tensor:
    return torch.zeros((), dtype=F64)


def _window_weights(spec: str, k: int) -> tuple[list[float], bool]:
    """β_1..β_K over the full window, and whether they are a normalised weighting."""
    if spec == "uniform":
        return [1.0] * k, False
    kind, value = spec.split(":")
    if kind == "decay":  # MPO's Eq. 10
        beta2, lam = (float(x) for x in value.split(","))
        future = [beta2 * lam ** (n - 2) for n in range(2, k + 1)]
        return [1.0 - sum(future), *future], True
    p = float(value)
    if kind == "future":
        return ([1.0] if k == 1 else [1 - p] + [p / (k - 1)] * (k - 1)), True
    raw = [p**n for n in range(k)]
    return [x / sum(raw) for x in raw], True


def _units(cfg: dict[str, Any], cols: list[int]) -> list[tuple[list[int], list[float], list[int]]]:
    """(tokens of the unit, their weights, tokens where the unit's loss is counted)."""
    units = []
    if cfg["layout"] == "sliding":
        k = cfg["k"]
        base, normalised = _window_weights(cfg["block_weights"], k)
        for i, c in enumerate(cols):
            window = cols[i : i + k]
            w = base[: len(window)]  # tail=drop: the missing slots' weight is simply gone
            if normalised and cfg["tail"] == "renormalise":
                total = sum(w)
                w = [x / total if total > 0 else 0.0 for x in w]
            units.append((window, w, [c]))
        return units
    size = {"token": 1, "block": cfg["k"], "sequence": max(len(cols), 1)}[cfg["unit"]]
    for i in range(0, len(cols), size):
        window = cols[i : i + size]
        units.append((window, [1.0] * len(window), window))
    return units


def reference_loss(
    cfg: dict[str, Any],
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    ref: torch.Tensor | None = None,
    ent: torch.Tensor | None = None,
    old_ent: torch.Tensor | None = None,
    old_term: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_len: float | None = None,
) -> torch.Tensor:
    rows, columns = logp.shape
    pg = [[None] * columns for _ in range(rows)]
    kl = [[None] * columns for _ in range(rows)]
    for b in range(rows):
        cols = [t for t in range(columns) if mask[b, t]]
        a = float(adv[b])
        for window, weights, counted in _units(cfg, cols):
            lam = sum(w * (logp[b, c] - old[b, c]) for w, c in zip(weights, window, strict=True))
            if cfg["ratio_norm"] == "mean":
                lam = lam / len(window)
            rho = torch.exp(torch.clamp(lam, -20.0, 20.0))
            for c in counted:
                if cfg["route"] == "unit":
                    r = rho
                else:
                    r = rho.detach() * torch.exp(logp[b, c] - logp[b, c].detach())
                plain = -r * a
                clipped = -torch.clamp(r, 1 - cfg["eps_low"], 1 + cfg["eps_high"]) * a
                loss = plain if float(plain.detach()) >= float(clipped.detach()) else clipped
                c_dual = cfg["dual_clip"]
                if c_dual is not None and a < 0 and float(loss.detach()) > -c_dual * a:
                    loss = torch.tensor(-c_dual * a, dtype=F64)
                pg[b][c] = loss
        for c in cols:
            if cfg["beta"] == 0:
                kl[b][c] = _zero()
                continue
            target = ref if cfg["kl_target"] == "ref" else old
            x = target[b, c] - logp[b, c]
            if cfg["kl_estimator"] == "k1":
                d = -x
            elif cfg["kl_estimator"] == "k2":
                d = x * x / 2
            else:
                d = torch.exp(x) - x - 1
                d = torch.clamp(d, -10.0, 10.0)
            on = True
            if cfg["kl_mask"] == "tepo":
                criterion = cfg["mask_criterion"]
                if criterion == "covariance":
                    falling = float(old[b, c] + old_ent[b, c]) > 0
                elif criterion == "entropy_drop":
                    falling = float(ent[b, c]) < float(old_ent[b, c])
                elif criterion == "advantage_only":
                    falling = True
                else:  # first_order: p_a (log p_a + H) > S, S = sum_j p_j^2 (log p_j + H)
                    p_a = math.exp(float(old[b, c]))
                    falling = p_a * float(old[b, c] + old_ent[b, c]) > float(old_term[b, c])
                on = a > 0 and falling
            kl[b][c] = cfg["beta"] * d if on else _zero()
    return _aggregate(cfg["loss_agg"], pg, mask, num_tokens, num_seqs, max_len) + _aggregate(
        cfg["loss_agg"], kl, mask, num_tokens, num_seqs, max_len
    )


def _aggregate(agg, values, mask, num_tokens, num_seqs, max_len) -> torch.Tensor:
    rows, columns = mask.shape
    total = _zero()
    row_terms = []
    count = 0
    for b in range(rows):
        row = _zero()
        n = 0
        for t in range(columns):
            if mask[b, t]:
                row = row + values[b][t]
                n += 1
        count += n
        total = total + row
        row_terms.append(row / n if n else _zero())
    seqs = rows if num_seqs is None else num_seqs
    if agg == "token-mean":
        return total / (num_tokens if num_tokens is not None else max(count, 1))
    if agg == "seq-mean-token-mean":
        return sum(row_terms) / seqs
    if agg == "seq-mean-token-sum":
        return total / seqs
    return total / (seqs * (columns if max_len is None else max_len))


def make_inputs(seed: int, rows: int = 6, columns: int = 9, holes: bool = False):
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = -torch.rand(shape, generator=gen, dtype=F64) * 3 - 0.05
    # Per-row distance from the rollout policy: on-policy, GSPO-close and clearly off-policy rows.
    scale = torch.tensor([0.0, 1e-4, 0.3, 0.05, 0.5, 2e-4] * rows, dtype=F64)[:rows, None]
    old = logp + scale * torch.randn(shape, generator=gen, dtype=F64)
    ref = logp + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    old_ent = torch.rand(shape, generator=gen, dtype=F64) * 3
    ent = old_ent + 0.5 * torch.randn(shape, generator=gen, dtype=F64)
    adv = torch.randn(rows, generator=gen, dtype=F64)
    lengths = torch.randint(1, columns + 1, (rows,), generator=gen)
    lengths[0] = columns
    lengths[1] = 1
    mask = torch.zeros(rows, columns, dtype=torch.bool)
    for b in range(rows):
        n = int(lengths[b])
        if b % 2:
            mask[b, columns - n :] = True  # left padding
        else:
            mask[b, :n] = True
    if holes:
        mask[0, 3] = False
    logp.requires_grad_(True)
    return logp, old, adv, mask, ref, ent, old_ent


VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("grpo", {}),
    ("dapo", {}),
    ("gspo", {}),
    ("tepo", {}),
    ("mpo_exact", {}),
    ("mpo_exact", {"tail": "renormalise"}),
    ("mpo_disjoint", {}),
    ("gspo", {"route": "token"}),
    ("gspo", {"loss_agg": "seq-mean-token-sum"}),  # LUSPO: each answer's term times its length
    ("mpo_disjoint", {"k": 3, "ratio_norm": "mean"}),
    ("mpo_exact", {"k": 2, "block_weights": "uniform"}),
    ("mpo_exact", {"k": 3, "block_weights": "future:0.3"}),
    ("mpo_exact", {"k": 3, "block_weights": "geometric:0.5", "tail": "renormalise"}),
    ("mpo_exact", {"k": 3, "block_weights": "uniform", "ratio_norm": "mean", "route": "token"}),
    ("mpo_exact", {"k": 4, "block_weights": "decay:0.2,0.5", "route": "token"}),
    ("mpo_disjoint", {"beta": 0.1, "kl_estimator": "k2", "kl_target": "old"}),
    ("dapo", {"unit": "block", "k": 4, "dual_clip": 1.5}),
    ("grpo", {"kl_estimator": "k1", "loss_agg": "seq-mean-token-sum"}),
    ("grpo", {"loss_agg": "seq-mean-token-sum-norm", "dual_clip": 3.0}),
    ("tepo", {"mask_criterion": "entropy_drop", "kl_target": "old"}),
    ("tepo", {"mask_criterion": "advantage_only"}),
    ("tepo", {"mask_criterion": "first_order", "kl_estimator": "k2"}),
    ("tepo", {"loss_agg": "seq-mean-token-mean", "eps_low": 0.1, "eps_high": 0.1}),
]


@pytest.mark.parametrize(("preset", "overrides"), VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_loss_matches_hand_reference(preset: str, overrides: dict, seed: int) -> None:
    logp, old, adv, mask, ref, ent, old_ent = make_inputs(seed, holes=seed == 1)
    # S = sum_j p_j^2 (log p_j + H) lies in [0, p_a (log p_a + H)] often enough to split the mask.
    old_term = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    old_term = old_term * 0.2
    cfg = {**load_preset(preset), **overrides}
    loss, metrics = policy_loss(
        preset,
        logp,
        old,
        adv,
        mask,
        ref_logp=ref,
        entropy=ent,
        old_entropy=old_ent,
        old_entropy_term=old_term,
        **overrides,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    expected = reference_loss(cfg, logp, old, adv, mask, ref, ent, old_ent, old_term)
    if cfg["kl_mask"] == "tepo" and cfg["mask_criterion"] == "first_order":
        knobs = {**overrides, "mask_criterion": "advantage_only"}
        _, positive = policy_loss(preset, logp, old, adv, mask, ref_logp=ref, **knobs)
        assert 0 < metrics["kl_mask_frac"] < positive["kl_mask_frac"]  # a strict subset
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert loss.dim() == 0 and loss.dtype == torch.float64
    assert math.isclose(float(loss.detach()), float(expected.detach()), rel_tol=0, abs_tol=1e-9)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-9)
    assert grad.abs().sum() > 0  # the comparison is not between two zeros
    assert math.isclose(
        metrics["pg_loss"] + metrics["kl_loss"], float(loss.detach()), abs_tol=1e-12
    )


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_global_normalisers_match_reference(agg: str) -> None:
    logp, old, adv, mask, ref, _, _ = make_inputs(3)
    counts = {"num_tokens": 123.0, "num_seqs": 17.0, "max_len": 40.0}
    loss, _ = policy_loss("grpo", logp, old, adv, mask, ref_logp=ref, loss_agg=agg, **counts)
    cfg = {**load_preset("grpo"), "loss_agg": agg}
    expected = reference_loss(cfg, logp, old, adv, mask, ref, **counts)
    assert math.isclose(float(loss.detach()), float(expected.detach()), rel_tol=0, abs_tol=1e-12)


@pytest.mark.parametrize("preset", ["grpo", "dapo", "gspo", "mpo_exact", "mpo_disjoint"])
def test_gradient_matches_finite_differences(preset: str) -> None:
    """Autograd against central differences for the unit-routed objectives. (With route=token the
    gradient is by design not the derivative of the loss value, so TEPO and GSPO-token are covered
    by the hand reference above instead.)"""
    logp, old, adv, mask, ref, _, _ = make_inputs(4, rows=3, columns=5)
    noise = torch.randn(3, 5, generator=torch.Generator().manual_seed(9), dtype=F64)
    old = logp.detach() + 1e-4 * noise

    def loss(x: torch.Tensor) -> torch.Tensor:
        return policy_loss(preset, x, old, adv, mask, ref_logp=ref, beta=0.1)[0]

    assert torch.autograd.gradcheck(loss, (logp,), eps=1e-6, atol=1e-7)
