"""The triton back-end: its import guard on machines without triton, and its kernels' numbers.

The kernels run on a GPU when there is one; without one they run under Triton's interpreter
(TRITON_INTERPRET=1, CPU tensors) in a subprocess, which checks the same arithmetic. Both are
skipped where triton is not installed (this project's CPU environment); the guard tests are not.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tepo_cli.kernels import dispatch as kernel_dispatch
from tepo_cli.kernels import token_logprobs

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_missing_triton_is_reported_and_auto_uses_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    monkeypatch.delitem(sys.modules, "tepo_cli.kernels.triton_logprobs", raising=False)
    kernel_dispatch._load_triton.cache_clear()
    try:
        module, why = kernel_dispatch._load_triton()
        assert module is None and "triton could not be imported" in why
        hidden = torch.randn(3, 4)
        weight = torch.randn(9, 4)
        targets = torch.tensor([0, 4, 8])
        with pytest.raises(ValueError, match=r"backend='triton' is not available: triton could"):
            token_logprobs(hidden, weight, targets, backend="triton")
        assert kernel_dispatch.available_backends(torch.device("cpu")) == ["torch", "naive"]
        logp, _ = token_logprobs(hidden, weight, targets)  # auto
        ref, _ = token_logprobs(hidden, weight, targets, backend="naive")
        torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)
    finally:
        kernel_dispatch._load_triton.cache_clear()


def test_float64_is_never_sent_to_triton():
    reason = kernel_dispatch.triton_unavailable_reason(torch.device("cuda"), torch.float64)
    assert reason is not None and "float64" in reason


_CHECK = textwrap.dedent(
    """
    import torch
    from tepo_cli.kernels import token_logprobs

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    worst = {}
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 0.15)):
        for chunk, temp, ent in ((None, 1.0, False), (4, 0.7, True), (1, 1.3, True)):
            h = torch.randn(11, 16, generator=gen).to(dtype)
            w = torch.randn(301, 16, generator=gen).to(dtype)
            y = torch.randint(0, 301, (11,), generator=gen)
            g = torch.randn(11, generator=gen, dtype=torch.float64)
            ge = torch.randn(11, generator=gen, dtype=torch.float64)
            g[[2, 7]] = 0.0
            ge[[2, 7]] = 0.0
            h, w, y = h.to(dev).requires_grad_(), w.to(dev).requires_grad_(), y.to(dev)
            lp, en = token_logprobs(h, w, y, temp, ent, chunk, "triton")
            loss = (lp * g.to(dev).float()).sum()
            if ent:
                loss = loss + (en * ge.to(dev).float()).sum()
            gh, gw = torch.autograd.grad(loss, [h, w])
            h64 = h.detach().cpu().double().requires_grad_()
            w64 = w.detach().cpu().double().requires_grad_()
            lr, er = token_logprobs(h64, w64, y.cpu(), temp, True, backend="naive")
            loss = (lr * g).sum() + ((er * ge).sum() if ent else 0.0)
            gh_ref, gw_ref = torch.autograd.grad(loss, [h64, w64])
            assert lp.dtype == torch.float32
            errs = [
                (lp.cpu().double() - lr).abs().max(),
                (gh.cpu().double() - gh_ref).abs().max(),
                (gw.cpu().double() - gw_ref).abs().max(),
            ]
            if ent:
                errs.append((en.cpu().double() - er).abs().max())
            assert max(errs) < tol, (dtype, chunk, temp, ent, errs)
            assert torch.equal(gh[[2, 7]].cpu(), torch.zeros(2, 16, dtype=dtype))
    with torch.no_grad():
        lp, _ = token_logprobs(h, w, y, backend="triton")
    assert lp.grad_fn is None
    print("TRITON-OK")
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_kernels_match_float64_reference():
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "TRITON-OK" in proc.stdout, proc.stdout + proc.stderr
