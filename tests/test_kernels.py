"""The token log-prob kernel path (tepo_cli.kernels): values and gradients of the chunked torch
back-end against a float64 full-softmax reference, entropies, tied weights, padding rows,
input validation and the choice of back-end."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tepo_cli.kernels import available_backends, token_logprobs
from tepo_cli.kernels import chunked as kernel_chunked
from tepo_cli.kernels import dispatch as kernel_dispatch
from tepo_cli.kernels.blocking import choose_blocking

F64 = torch.float64


def make_inputs(n: int, h: int, v: int, dtype: torch.dtype = F64, seed: int = 0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=gen, dtype=F64) * scale).to(dtype)
    weight = (torch.randn(v, h, generator=gen, dtype=F64) * scale).to(dtype)
    targets = torch.randint(0, v, (n,), generator=gen)
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def reference(hidden, weight, targets, temperature=1.0):
    """float64 log_softmax + gather and the entropy, written out independently of the package."""
    logits = hidden.detach().to(F64) @ weight.detach().to(F64).t() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(1, targets[:, None]).squeeze(1), -(logprobs.exp() * logprobs).sum(-1)


def grads_of(fn, hidden, weight, g_logp, g_ent=None):
    """(logp, entropy, grad_hidden, grad_weight) of sum(g_logp * logp + g_ent * entropy)."""
    logp, ent = fn(hidden, weight)
    loss = (logp * g_logp.to(logp.dtype)).sum()
    if g_ent is not None:
        loss = loss + (ent * g_ent.to(ent.dtype)).sum()
    gh, gw = torch.autograd.grad(loss, [hidden, weight])
    return logp.detach(), None if ent is None else ent.detach(), gh, gw


def upstream(n: int, seed: int = 1, zero_rows=(3,)) -> torch.Tensor:
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    g[[r for r in zero_rows if r < n]] = 0.0
    return g


@pytest.mark.parametrize(
    ("n", "v", "chunk", "vocab_chunk"),
    [
        (37, 101, None, None),  # one block
        (37, 101, 1, None),  # one row at a time
        (37, 101, 5, 7),  # neither N nor V a multiple of the block
        (37, 101, 8, 1),  # one vocabulary entry per tile
        (1, 101, None, 16),  # N = 1
        (12, 1, 5, None),  # V = 1: log-prob 0, entropy 0
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_torch_matches_float64_reference(n, v, chunk, vocab_chunk, temperature, with_entropy):
    hidden, weight, targets = make_inputs(n, 16, v)
    g_logp = upstream(n)
    g_ent = upstream(n, seed=2) if with_entropy else None

    def ours(h, w):
        return token_logprobs(
            h, w, targets, temperature, with_entropy, chunk, "torch", vocab_chunk_size=vocab_chunk
        )

    def naive(h, w):
        return token_logprobs(h, w, targets, temperature, True, backend="naive")

    lp, ent, gh, gw = grads_of(ours, hidden, weight, g_logp, g_ent)
    lp_ref, _, gh_ref, gw_ref = grads_of(naive, hidden, weight, g_logp, g_ent)
    assert lp.dtype == F64 and lp.shape == (n,)
    ref_lp, ref_ent = reference(hidden, weight, targets, temperature)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-10)
    torch.testing.assert_close(lp_ref, ref_lp, rtol=0, atol=1e-12)
    if with_entropy:
        torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-10)
    else:
        assert ent is None
    torch.testing.assert_close(gh, gh_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(gw, gw_ref, rtol=0, atol=1e-10)
    assert (gh.abs().sum() > 0 and gw.abs().sum() > 0) or v == 1


@pytest.mark.parametrize("with_entropy", [False, True])
def test_float32_close_to_float64_reference(with_entropy):
    hidden, weight, targets = make_inputs(64, 32, 515, dtype=torch.float32, scale=0.7)
    g_logp, g_ent = upstream(64), upstream(64, seed=3) if with_entropy else None

    def ours(h, w):
        return token_logprobs(h, w, targets, 0.7, with_entropy, 16, vocab_chunk_size=100)

    lp, ent, gh, gw = grads_of(ours, hidden, weight, g_logp, g_ent)
    h64 = hidden.detach().to(F64).requires_grad_()
    w64 = weight.detach().to(F64).requires_grad_()
    lp_ref, ent_ref, gh_ref, gw_ref = grads_of(
        lambda h, w: token_logprobs(h, w, targets, 0.7, True, backend="naive"),
        h64,
        w64,
        g_logp,
        g_ent,
    )
    assert lp.dtype == torch.float32 and gh.dtype == torch.float32 and gw.dtype == torch.float32
    torch.testing.assert_close(lp.to(F64), lp_ref, rtol=1e-5, atol=2e-5)
    if with_entropy:
        torch.testing.assert_close(ent.to(F64), ent_ref, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(gh.to(F64), gh_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw.to(F64), gw_ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "kind"),
    [(F64, "huge"), (torch.float32, "huge"), (torch.float32, "negative"), (F64, "negative")],
)
def test_extreme_logits_take_the_shifted_paths_and_stay_exact(dtype, kind):
    """Logits far outside exp's range (|z| ~ 1e3, or all around -70) make the unshifted fast
    paths decline; the max-shifted fallbacks must give the reference numbers."""
    hidden, weight, targets = make_inputs(
        23, 16, 97, dtype=F64, scale=16.0 if kind == "huge" else 1
    )
    if kind == "negative":
        hidden = (2.0 + 0.1 * hidden.detach()).requires_grad_()
        weight = -(2.0 + 0.1 * weight.detach())
    hidden = hidden.detach().to(dtype).requires_grad_()
    weight = weight.detach().to(dtype).requires_grad_()
    g_logp = upstream(23)

    def ours(h, w):
        return token_logprobs(h, w, targets, 0.7, False, 8, "torch", vocab_chunk_size=40)

    lp, _, gh, gw = grads_of(ours, hidden, weight, g_logp)
    h64 = hidden.detach().to(F64).requires_grad_()
    w64 = weight.detach().to(F64).requires_grad_()
    lp_ref, _, gh_ref, gw_ref = grads_of(
        lambda h, w: token_logprobs(h, w, targets, 0.7, backend="naive"), h64, w64, g_logp
    )
    assert lp_ref.abs().max() > 100 if kind == "huge" else lp_ref.max() < 0
    # Each logit is rounded to eps * |z|: tolerances scale with the largest logit (and, for
    # gradients, with the largest entry they multiply).
    eps = 2**-52 if dtype == F64 else 2**-24
    z_max = (h64 @ w64.t()).abs().max().item() / 0.7
    entry = max(h64.abs().max().item(), w64.abs().max().item())
    torch.testing.assert_close(lp.to(F64), lp_ref, rtol=0, atol=16 * eps * z_max)
    torch.testing.assert_close(gh.to(F64), gh_ref, rtol=0, atol=16 * eps * z_max * entry)
    torch.testing.assert_close(gw.to(F64), gw_ref, rtol=0, atol=16 * eps * z_max * entry)


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("scale", [0.3, 1.0])  # logits up to ~4 and ~40 (a real head: tens)
def test_bfloat16_on_cpu_multiplies_in_bf16_within_the_naive_paths_error(with_entropy, scale):
    """bf16 inputs on the CPU: the tiles are multiplied in bf16 (float32 accumulation, the block
    rounded to bf16 as a bf16 model's own logits are), every exponent and sum in float32. Its
    log-probs, entropies and gradients stay as close to the float64 reference on the same bf16
    values as the naive path's (full bf16 logits, float32 softmax); gradients come back in bf16."""
    hidden, weight, targets = make_inputs(33, 64, 300, dtype=torch.bfloat16, scale=scale)
    assert kernel_chunked.matmul_dtype(hidden, weight) == torch.bfloat16
    g_logp, g_ent = upstream(33), (upstream(33, seed=5) if with_entropy else None)

    def run(backend, h, w, **kw):
        return grads_of(
            lambda a, b: token_logprobs(a, b, targets, 0.7, with_entropy, backend=backend, **kw),
            h,
            w,
            g_logp,
            g_ent,
        )

    ours = run("torch", hidden, weight, chunk_size=8, vocab_chunk_size=64)
    naive = run("naive", hidden, weight)
    assert ours[0].dtype == torch.float32
    assert ours[2].dtype == torch.bfloat16 and ours[3].dtype == torch.bfloat16
    h64 = hidden.detach().to(F64).requires_grad_()
    w64 = weight.detach().to(F64).requires_grad_()
    exact = run("naive", h64, w64)
    for index in (0, 1, 2, 3) if with_entropy else (0, 2, 3):  # logp, entropy, grads
        err = (ours[index].to(F64) - exact[index]).abs().max()
        naive_err = (naive[index].to(F64) - exact[index]).abs().max()
        scale_of = exact[index].abs().max()
        assert err <= 2 * naive_err + 2**-8 * scale_of, (index, float(err), float(naive_err))


def test_bfloat16_tiles_only_where_both_inputs_are_bf16_on_the_cpu():
    """float32 (and mixed) inputs keep float32 tiles: the float32 path is unchanged."""
    h32, w32, _ = make_inputs(4, 8, 16, dtype=torch.float32)
    h16, w16, _ = make_inputs(4, 8, 16, dtype=torch.bfloat16)
    assert kernel_chunked.matmul_dtype(h32, w32) is None
    assert kernel_chunked.matmul_dtype(h16, w32) is None
    assert kernel_chunked.matmul_dtype(h16, w16) == torch.bfloat16


def test_entropy_equals_direct_computation():
    hidden, weight, targets = make_inputs(20, 12, 300, scale=2.0)  # peaked and flat rows
    hidden.data[3] = 0.0  # a uniform row: entropy log V
    with torch.no_grad():
        _, ent = token_logprobs(hidden, weight, targets, 0.5, True, 3, vocab_chunk_size=64)
        probs = torch.softmax(hidden @ weight.t() / 0.5, dim=-1)
        direct = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(ent, direct, rtol=0, atol=1e-10)
    assert abs(ent[3].item() - torch.log(torch.tensor(300.0, dtype=F64)).item()) < 1e-12


def test_tied_embedding_gradient_matches_naive():
    """The lm-head is the input embedding: autograd adds both uses' gradients."""
    vocab, width = 50, 8
    results = []
    for backend in ("torch", "naive"):
        torch.manual_seed(0)
        emb = nn.Embedding(vocab, width).double()
        mix = nn.Linear(width, width).double()
        ids = torch.randint(0, vocab, (3, 7))
        hidden = torch.tanh(mix(emb(ids[:, :-1]))).reshape(-1, width)
        logp, _ = token_logprobs(hidden, emb.weight, ids[:, 1:].reshape(-1), 0.9, False, 4, backend)
        (-logp.mean()).backward()
        results.append((logp.detach(), emb.weight.grad.clone(), mix.weight.grad.clone()))
    (lp, g_emb, g_mix), (lp_ref, g_emb_ref, g_mix_ref) = results
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_emb, g_emb_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_mix, g_mix_ref, rtol=0, atol=1e-12)
    assert g_emb.abs().sum() > 0


@pytest.mark.parametrize("with_entropy", [False, True])
def test_rows_with_zero_upstream_gradient_get_exactly_zero(with_entropy):
    hidden, weight, targets = make_inputs(10, 6, 40, dtype=torch.float32)
    padding = [0, 3, 4, 9]
    g_logp = upstream(10, zero_rows=padding)
    g_ent = upstream(10, seed=4, zero_rows=padding) if with_entropy else None

    def ours(h, w):
        return token_logprobs(h, w, targets, 1.0, with_entropy, 3, vocab_chunk_size=9)

    _, _, gh, gw = grads_of(ours, hidden, weight, g_logp, g_ent)
    assert torch.equal(gh[padding], torch.zeros(len(padding), 6))
    assert gh[1].abs().sum() > 0
    # grad_weight is the same as if the padding rows were not there at all.
    keep = [i for i in range(10) if i not in padding]
    h_keep = hidden.detach()[keep].requires_grad_()
    _, _, _, gw_keep = grads_of(
        lambda h, w: token_logprobs(h, w, targets[keep], 1.0, with_entropy, 3, vocab_chunk_size=9),
        h_keep,
        weight,
        g_logp[keep],
        None if g_ent is None else g_ent[keep],
    )
    torch.testing.assert_close(gw, gw_keep, rtol=1e-5, atol=1e-6)


def test_all_rows_masked_and_empty_batch():
    hidden, weight, targets = make_inputs(5, 4, 11)
    logp, _ = token_logprobs(hidden, weight, targets, backend="torch")
    gh, gw = torch.autograd.grad((logp * 0).sum(), [hidden, weight])
    assert torch.equal(gh, torch.zeros_like(gh)) and torch.equal(gw, torch.zeros_like(gw))

    empty_h = torch.zeros(0, 4, dtype=F64, requires_grad=True)
    logp, ent = token_logprobs(empty_h, weight, targets[:0], with_entropy=True, backend="torch")
    assert logp.shape == (0,) and ent is not None and ent.shape == (0,)
    gh, gw = torch.autograd.grad(logp.sum() + ent.sum(), [empty_h, weight])
    assert gh.shape == (0, 4) and torch.equal(gw, torch.zeros_like(weight))


def test_gradcheck_tiny_float64():
    hidden, weight, targets = make_inputs(5, 3, 7)

    def fn(h, w):
        logp, ent = token_logprobs(h, w, targets, 0.7, True, 2, "torch", vocab_chunk_size=3)
        return logp, ent

    assert torch.autograd.gradcheck(fn, (hidden, weight), eps=1e-6, atol=1e-8)


def test_forward_only_saves_nothing_and_backward_saves_no_logits():
    hidden, weight, targets = make_inputs(64, 8, 200)
    with torch.no_grad():
        logp, _ = token_logprobs(hidden, weight, targets, backend="torch")
    assert logp.grad_fn is None
    logp, _ = token_logprobs(hidden.detach(), weight.detach(), targets, backend="torch")
    assert logp.grad_fn is None and not logp.requires_grad

    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logp, _ = token_logprobs(hidden, weight, targets, with_entropy=True, backend="torch")
    assert logp.grad_fn is not None
    # hidden, weight, targets (the inputs themselves) and the per-row lse / entropy: no [N, V].
    assert max(t.numel() for t in saved) <= weight.numel()
    assert sum(t.numel() for t in saved) <= hidden.numel() + weight.numel() + 3 * 64


def test_only_naive_runs_log_softmax_over_all_rows(monkeypatch):
    """The torch path's log_softmax calls see one block (<= chunk_size rows), never [N, V]."""
    shapes: list[tuple[int, ...]] = []
    real = torch.log_softmax

    def recording(x, *args, **kwargs):
        shapes.append(tuple(x.shape))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch, "log_softmax", recording)
    hidden, weight, targets = make_inputs(64, 4, 30)
    logp, ent = token_logprobs(hidden, weight, targets, 1.0, True, 8, "torch")
    (logp.sum() + ent.sum()).backward()
    assert shapes and all(rows <= 8 for rows, _ in shapes)
    shapes.clear()
    token_logprobs(hidden, weight, targets, backend="naive")
    assert shapes == [(64, 30)]


def test_default_blocking_bounds_the_block_by_the_vocabulary():
    cpu = torch.device("cpu")
    smol = choose_blocking(4096, 49152, cpu)
    assert (smol.rows, smol.vocab_tile) == (2048, 2048)  # 16 MiB float32 blocks
    one = choose_blocking(4096, 49152, cpu, chunk_size=1)
    assert (one.rows, one.vocab_tile) == (1, 49152)
    rows = choose_blocking(4096, 49152, cpu, chunk_size=512)
    assert rows.rows == 512 and rows.vocab_tile * 512 * 4 <= 16 * 2**20
    for n, v in ((10**6, 151936), (7, 100), (0, 10)):
        b = choose_blocking(n, v, cpu)
        assert 1 <= b.rows <= max(n, 1) and 1 <= b.vocab_tile <= v
        assert b.rows * b.vocab_tile * 4 <= 16 * 2**20


def _bad_inputs():
    h, w, t = make_inputs(4, 3, 10)
    return [
        (dict(hidden=h[0]), "hidden"),
        (dict(weight=w[:, :2]), "weight"),
        (dict(weight=w[0]), "weight"),
        (dict(hidden=torch.ones(4, 3, dtype=torch.int64)), "hidden"),
        (dict(targets=t.to(torch.int32)), "targets"),
        (dict(targets=t.float()), "targets"),
        (dict(targets=t[:3]), "targets"),
        (dict(targets=torch.tensor([0, 1, 2, 10])), "targets"),
        (dict(targets=torch.tensor([0, -1, 2, 3])), "targets"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(vocab_chunk_size=-3), "vocab_chunk_size"),
        (dict(backend="cuda"), "backend"),
    ]


@pytest.mark.parametrize(("override", "argument"), _bad_inputs())
def test_invalid_arguments_raise_value_error_naming_them(override, argument):
    hidden, weight, targets = make_inputs(4, 3, 10)
    kwargs = dict(hidden=hidden, weight=weight, targets=targets) | override
    with pytest.raises(ValueError, match=argument):
        token_logprobs(**kwargs)


def test_auto_is_torch_on_cpu_and_triton_on_cpu_is_refused():
    hidden, weight, targets = make_inputs(6, 4, 30, dtype=torch.float32)
    assert kernel_dispatch.resolve_backend("auto", hidden, weight) == "torch"
    auto, _ = token_logprobs(hidden, weight, targets)
    torch_, _ = token_logprobs(hidden, weight, targets, backend="torch")
    assert torch.equal(auto, torch_)
    assert "triton" not in available_backends(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"backend='triton'.*available backends here: torch"):
        token_logprobs(hidden, weight, targets, backend="triton")


def test_auto_falls_back_to_torch_once_the_triton_call_fails(monkeypatch):
    """Stands in for a CUDA machine whose triton imports but whose kernel fails to compile."""
    hidden, weight, targets = make_inputs(6, 4, 30, dtype=torch.float32)
    expected, _ = token_logprobs(hidden, weight, targets, backend="naive")
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no kernel image")

    monkeypatch.setattr(kernel_dispatch, "_triton_broken", None)
    monkeypatch.setattr(kernel_dispatch, "resolve_backend", lambda *a: "triton")
    monkeypatch.setattr(kernel_dispatch, "_triton_logprobs", broken)
    with pytest.warns(RuntimeWarning, match="no kernel image"):
        logp, _ = token_logprobs(hidden, weight, targets)
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    assert kernel_dispatch._triton_broken is not None and calls == [1]
    with pytest.raises(RuntimeError, match="no kernel image"):  # explicit triton: no fallback
        token_logprobs(hidden, weight, targets, backend="triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 and the CUDA path need a GPU")
def test_bfloat16_on_cuda_in_tf32_stays_within_the_naive_paths_error():
    """The chunked path multiplies half-precision inputs in TF32 on CUDA (kernels/tf32.py): its
    log-probs and gradients stay as close to the float64 reference as the naive bf16 path's."""
    cuda = torch.device("cuda")
    hidden, weight, targets = make_inputs(64, 256, 4096, dtype=torch.bfloat16, scale=0.3)
    hidden = hidden.detach().to(cuda).requires_grad_()
    weight = weight.detach().to(cuda).requires_grad_()
    targets = targets.to(cuda)
    g_logp = upstream(64).to(cuda)
    results = {}
    for backend in ("torch", "naive"):
        results[backend] = grads_of(
            lambda h, w, b=backend: token_logprobs(h, w, targets, 0.7, False, backend=b),
            hidden,
            weight,
            g_logp,
        )
    h64 = hidden.detach().to(F64).requires_grad_()
    w64 = weight.detach().to(F64).requires_grad_()
    exact = grads_of(
        lambda h, w: token_logprobs(h, w, targets, 0.7, False, backend="naive"), h64, w64, g_logp
    )
    for index in (0, 2, 3):  # logp, grad_hidden, grad_weight
        ours = (results["torch"][index].to(F64) - exact[index]).abs().max()
        naive = (results["naive"][index].to(F64) - exact[index]).abs().max()
        assert ours <= 2 * naive + 1e-6, (index, float(ours), float(naive))
