"""The unit view (tepo_cli.kernels.units): token / block / sequence units and the sliding layout."""

from __future__ import annotations

import pytest
import torch

from tepo_cli.kernels.units import (
    parse_block_weights,
    segment_sum,
    sliding_window_sum,
    unit_view,
    valid_positions,
)

F64 = torch.float64


def masks_from_rows(rows: list[str]) -> torch.Tensor:
    """'..xxx.' → [0, 0, 1, 1, 1, 0] per row."""
    return torch.tensor([[c == "x" for c in row] for row in rows])


def unit_groups(view, mask: torch.Tensor) -> list[list[list[int]]]:
    """Per row, the units as lists of column indices, in order (empty slots left out)."""
    groups = []
    for b in range(mask.shape[0]):
        by_id: dict[int, list[int]] = {}
        for t in range(mask.shape[1]):
            if mask[b, t]:
                by_id.setdefault(int(view.ids[b, t]), []).append(t)
        groups.append([by_id[i] for i in sorted(by_id)])
    return groups


MASK = masks_from_rows(["xxxxxxx..", "..xxxxxxx", "x........", ".........", "xx.xxx.x."])


def test_valid_positions_any_padding_side() -> None:
    got = valid_positions(MASK)
    assert got[0].tolist() == [0, 1, 2, 3, 4, 5, 6, -1, -1]
    assert got[1].tolist() == [-1, -1, 0, 1, 2, 3, 4, 5, 6]
    assert got[3].tolist() == [-1] * 9
    assert got[4].tolist() == [0, 1, -1, 2, 3, 4, -1, 5, -1]


def test_blocks_start_at_first_valid_token_with_short_tail() -> None:
    view = unit_view(MASK, "block", k=3)
    groups = unit_groups(view, MASK)
    assert groups[0] == [[0, 1, 2], [3, 4, 5], [6]]
    assert groups[1] == [[2, 3, 4], [5, 6, 7], [8]]  # left padding: same blocks, shifted
    assert groups[2] == [[0]]  # shorter than K: one block
    assert groups[3] == []
    assert groups[4] == [[0, 1, 3], [4, 5, 7]]  # holes are skipped
    assert sorted(view.sizes[view.sizes > 0].tolist()) == sorted([3, 3, 1, 3, 3, 1, 1, 3, 3])
    assert torch.all(view.ids[~MASK] == view.num_units)


def test_token_is_block_of_one_and_sequence_is_block_of_at_least_the_length() -> None:
    token = unit_groups(unit_view(MASK, "token"), MASK)
    assert token == unit_groups(unit_view(MASK, "block", k=1), MASK)
    assert token[0] == [[t] for t in range(7)]
    sequence = unit_groups(unit_view(MASK, "sequence"), MASK)
    for k in (7, 9, 50):
        assert sequence == unit_groups(unit_view(MASK, "block", k=k), MASK)
    assert sequence[1] == [[2, 3, 4, 5, 6, 7, 8]]


@pytest.mark.parametrize(
    ("unit", "k"), [("token", None), ("block", 2), ("block", 4), ("sequence", None)]
)
def test_segment_sum_mean_broadcast_against_loops(unit: str, k: int | None) -> None:
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(MASK.shape, generator=gen, dtype=F64, requires_grad=True)
    view = unit_view(MASK, unit, k)
    sums = view.sum(values)
    means = view.mean(values)
    for b, row_units in enumerate(unit_groups(view, MASK)):
        for cols in row_units:
            uid = int(view.ids[b, cols[0]])
            expected = sum(float(values[b, c].detach()) for c in cols)
            assert sums[uid].item() == pytest.approx(expected, abs=1e-12)
            assert means[uid].item() == pytest.approx(expected / len(cols), abs=1e-12)
            assert int(view.sizes[uid]) == len(cols)
    back = view.broadcast(sums)
    assert torch.all(back[~MASK] == 0)
    assert torch.equal(back[MASK], sums[view.ids[MASK]])
    # The gradient of a unit sum reaches exactly its tokens.
    (grad,) = torch.autograd.grad(sums.sum(), values)
    assert torch.equal(grad, MASK.to(F64))


def test_segment_sum_drops_the_dump_id_and_checks_shapes() -> None:
    values = torch.tensor([[1.0, 2.0, 4.0]])
    ids = torch.tensor([[0, 2, 1]])
    assert segment_sum(values, ids, 2).tolist() == [1.0, 4.0]
    with pytest.raises(ValueError, match="shape"):
        segment_sum(values, ids[:, :2], 2)


def test_unit_view_single_row_and_errors() -> None:
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    view = unit_view(mask, "block", k=4)
    assert unit_groups(view, mask.bool()) == [[[1, 2, 3, 4], [5]]]
    with pytest.raises(ValueError, match="k >= 1"):
        unit_view(mask, "block")
    with pytest.raises(ValueError, match="unknown unit"):
        unit_view(mask, "word")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        unit_view(mask[0], "token")


def sliding_reference(
    values, mask, k: int, spec: str, tail: str = "drop"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Straight from docs/objectives.md §1.5 with loops."""
    out = torch.zeros_like(values)
    sizes = torch.zeros(values.shape, dtype=torch.long)
    for b in range(values.shape[0]):
        cols = [t for t in range(values.shape[1]) if mask[b, t]]
        for i, c in enumerate(cols):
            window = cols[i : i + k]
            n = len(window)
            if spec == "uniform":
                w = [1.0] * n
            else:
                kind, p = spec.split(":")
                if kind == "decay":
                    b2, lam = (float(x) for x in p.split(","))
                    future = [b2 * lam ** (j - 2) for j in range(2, k + 1)]
                    full = [1 - sum(future), *future]
                elif kind == "future":
                    p = float(p)
                    full = [1.0] if k == 1 else [1 - p] + [p / (k - 1)] * (k - 1)
                else:
                    raw = [float(p) ** j for j in range(k)]
                    full = [x / sum(raw) for x in raw]
                w = full[:n]
                if tail == "renormalise":
                    total = sum(w)
                    w = [x / total if total else 0.0 for x in w]
            out[b, c] = sum(wj * values[b, cj] for wj, cj in zip(w, window, strict=True))
            sizes[b, c] = n
    return out, sizes


@pytest.mark.parametrize(
    "spec",
    [
        "uniform",
        "future:0.3",
        "future:0",
        "future:1",
        "geometric:0.5",
        "geometric:0",
        "geometric:2",
        "decay:0.06,0.8",
        "decay:0.03,1",
        "decay:0,0.5",
    ],
)
@pytest.mark.parametrize("k", [1, 2, 4, 12])
@pytest.mark.parametrize("tail", ["drop", "renormalise"])
def test_sliding_windows_against_loop_reference(spec: str, k: int, tail: str) -> None:
    gen = torch.Generator().manual_seed(k)
    values = torch.randn(MASK.shape, generator=gen, dtype=F64)
    got, sizes = sliding_window_sum(values, MASK, k, spec, tail=tail)
    expected, expected_sizes = sliding_reference(values, MASK, k, spec, tail)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert torch.equal(sizes, expected_sizes)
    assert torch.all(got[~MASK] == 0)


def test_sliding_window_renormalises_near_the_end() -> None:
    mask = torch.ones(1, 4, dtype=torch.bool)
    values = torch.tensor([[1.0, 10.0, 100.0, 1000.0]], dtype=F64)
    got, sizes = sliding_window_sum(values, mask, 3, "geometric:0.5", tail="renormalise")
    # full window: weights 1, .5, .25 over 1.75; two left: 1, .5 over 1.5; one left: 1.
    expected = [(1 + 5 + 25) / 1.75, (10 + 50 + 250) / 1.75, (100 + 500) / 1.5, 1000.0]
    assert got[0].tolist() == pytest.approx(expected, abs=1e-12)
    assert sizes.tolist() == [[3, 3, 2, 1]]
    uniform, _ = sliding_window_sum(values, mask, 3, "uniform")
    assert uniform[0].tolist() == [111.0, 1110.0, 1100.0, 1000.0]  # fewer terms, no renormalising


def test_sliding_window_gradient_and_padding_garbage() -> None:
    values = torch.randn(MASK.shape, dtype=F64)
    values[~MASK] = float("nan")
    values.requires_grad_(True)
    got, _ = sliding_window_sum(values, MASK, 3, "future:0.5")
    assert torch.isfinite(got).all()
    (grad,) = torch.autograd.grad(got.sum(), values)
    assert torch.all(grad[~MASK] == 0)


def test_parse_block_weights() -> None:
    def parsed(spec: str, k: int) -> tuple[list[float], bool]:
        weights, normalised = parse_block_weights(spec, k)
        return weights.tolist(), normalised

    assert parsed("uniform", 3) == ([1.0, 1.0, 1.0], False)
    weights, normalised = parsed("future:0.3", 4)
    assert weights == pytest.approx([0.7, 0.1, 0.1, 0.1], abs=1e-15) and normalised
    assert parsed("future:0.3", 1) == ([1.0], True)
    weights, normalised = parsed("geometric:0.5", 3)
    assert weights == pytest.approx([1 / 1.75, 0.5 / 1.75, 0.25 / 1.75], abs=1e-15) and normalised
    assert parsed("geometric:0", 3) == ([1.0, 0.0, 0.0], True)
    weights, normalised = parsed("decay:0.06,0.8", 5)  # the paper's best setting (Eq. 10)
    assert weights == pytest.approx([0.82288, 0.06, 0.048, 0.0384, 0.03072], abs=1e-12)
    assert sum(weights) == pytest.approx(1.0, abs=1e-15) and normalised
    assert parsed("decay:0.5,1", 1) == ([1.0], True)
    with pytest.raises(ValueError, match=r"beta_1 = 1 - that = -1 <= 0"):
        parse_block_weights("decay:0.5,1.0", 5)
    for bad in ("future:1.5", "geometric:-1", "softmax", "future:x", "decay:0.1", "decay:-1,1"):
        with pytest.raises(ValueError, match="block_weights"):
            parse_block_weights(bad, 3)
