#!/usr/bin/env python
"""The token log-prob kernel path against the naive full-softmax baseline.

    python scripts/bench_logprob.py --cases smollm2 --repeats 3 --rounds 2 --backends torch,naive
    python scripts/bench_logprob.py --smoke --markdown smoke.md  # CI: a tiny case, 1 repeat

Each (case, backend) runs in a fresh subprocess; its peak memory is the growth over the inputs
(CPU: VmHWM, reset after the inputs; CUDA: max_memory_allocated), gradient buffers included.
Times: the minimum over --repeats calls and --rounds alternating rounds; ratios against `naive`.
Back-ends: naive, torch, triton (CUDA), matmul (the bare lm-head matmul: the throughput
reference), liger (CUDA, when liger_kernel imports).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchlib.report import table
from benchlib.runner import best_seconds

CPU_CASES = ["smollm2", "qwen2.5-0.5b"]
# --smoke: one tiny case through every step of a real run (numbers meaningless).
SMOKE = ["--cases", "256,64,1024,float32,smoke", "--repeats", "1", "--device", "cpu"]
CUDA_CASES = ["smollm2-bf16", "qwen2.5-0.5b-bf16", "liger-b2", "liger-b4", "liger-b8"]
CUDA_CASES += ["liger-b16", "qwen2.5-7b"]


@dataclass(frozen=True)
class Case:
    name: str
    n: int  # tokens
    h: int  # hidden size
    v: int  # vocabulary
    dtype: str


NAMED = {
    name: Case(name, *shape)
    for name, shape in {
        "smollm2": (4096, 576, 49152, "float32"),
        "qwen2.5-0.5b": (1024, 896, 151936, "float32"),
        "smollm2-bf16": (16384, 576, 49152, "bfloat16"),
        "qwen2.5-0.5b-bf16": (8192, 896, 151936, "bfloat16"),
        "qwen2.5-7b": (4096, 3584, 152064, "bfloat16"),
        **{f"liger-b{b}": (1024 * b, 4096, 128256, "bfloat16") for b in (2, 4, 8, 16)},
    }.items()
}


def parse_case(text: str) -> Case:
    """A name from NAMED, or N,H,V[,dtype[,name]]."""
    if text in NAMED:
        return NAMED[text]
    parts = text.split(",")
    if len(parts) < 3:
        raise SystemExit(f"unknown case {text!r}: use one of {', '.join(NAMED)} or N,H,V[,dtype]")
    n, h, v = (int(p) for p in parts[:3])
    dtype = parts[3] if len(parts) > 3 else "float32"
    name = parts[4] if len(parts) > 4 else f"N{n}-H{h}-V{v}-{dtype}"
    return Case(name, n, h, v, dtype)


# ----------------------------------------------------------------------------- worker side


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


def _make_step(backend: str, hidden, weight, targets):
    """A callable running the forward; returns the scalar to backprop from."""
    from tepo_cli.kernels import token_logprobs

    if backend == "matmul":
        return lambda: (hidden @ weight.t()).sum()
    if backend == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss_fn = LigerFusedLinearCrossEntropyLoss(reduction="sum")
        return lambda: loss_fn(weight, hidden, targets)
    return lambda: token_logprobs(hidden, weight, targets, backend=backend)[0].sum()


def run_worker(spec: dict) -> dict:
    import torch

    case = Case(**spec["case"])
    backend, repeats, device = spec["backend"], spec["repeats"], torch.device(spec["device"])
    dtype = getattr(torch, case.dtype)
    cuda = device.type == "cuda"

    sync = torch.cuda.synchronize if cuda else None

    def make(n: int, h: int, v: int):
        gen = torch.Generator().manual_seed(0)
        hidden = torch.randn(n, h, generator=gen).to(device, dtype).requires_grad_()
        weight = (torch.randn(v, h, generator=gen) * (2.0 / h**0.5)).to(device, dtype)
        targets = torch.randint(0, v, (n,), generator=gen).to(device)
        return hidden, weight.requires_grad_(), targets

    # Initialise the libraries (BLAS buffers, threads, kernels) on a tiny problem first.
    tiny = make(8, case.h, 64)
    _make_step(backend, *tiny)().backward()
    del tiny
    hidden, weight, targets = make(case.n, case.h, case.v)
    step = _make_step(backend, hidden, weight, targets)
    if sync:
        sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        exact = _reset_peak_rss()
        base_kb = (
            _status_kb("VmRSS") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        )
    step().backward()  # the measured (first) forward + backward
    if sync:
        sync()
    if cuda:
        peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak_kb = (
            _status_kb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        )
        peak_mb = (peak_kb - (base_kb or 0)) / 1024

    def fwd_bwd() -> None:
        hidden.grad = weight.grad = None
        step().backward()

    timed = {"fwd_ms": step, "fwdbwd_ms": fwd_bwd}
    best = {key: 1e3 * best_seconds(fn, repeats, sync=sync) for key, fn in timed.items()}
    return {"peak_mb": peak_mb, **best}


# ----------------------------------------------------------------------------- parent side


def spawn(case: Case, backend: str, repeats: int, device: str) -> dict:
    spec = {"case": asdict(case), "backend": backend, "repeats": repeats, "device": device}
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:120]}
    return json.loads(lines[-1])


def usable_backends(requested: list[str], device: str) -> tuple[list[str], dict[str, str]]:
    """The back-ends that can run here, and why each of the others cannot."""
    keep, skipped = [], {}
    for name in requested:
        if name == "liger":
            try:
                import liger_kernel  # noqa: F401
            except ImportError:
                skipped[name] = "liger_kernel does not import"
        if name == "triton":
            import torch

            from tepo_cli.kernels import available_backends

            if "triton" not in available_backends(torch.device(device), torch.bfloat16):
                skipped[name] = "the triton back-end is unavailable here"
        if name in skipped:
            print(f"{skipped[name]}: skipping the {name} rows", file=sys.stderr)
        else:
            keep.append(name)
    return keep, skipped


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"


def build_rows(results: dict, cases: list[Case], backends: list[str]) -> list[list[str]]:
    rows = []
    for case in cases:
        naive = results.get((case.name, "naive"), {})
        matmul = results.get((case.name, "matmul"), {})
        for backend in backends:
            r = results.get((case.name, backend), {})
            if "error" in r:
                rows.append([case.name, backend, "error: " + r["error"]] + [""] * 6)
                continue

            def ratio(key: str, base: dict, r=r) -> str:
                if key not in r or key not in base or base[key] <= 0:
                    return "—"
                return f"{r[key] / base[key]:.2f}"

            rows.append(
                [
                    f"{case.name} (N={case.n}, H={case.h}, V={case.v}, {case.dtype})",
                    backend,
                    fmt(r.get("fwd_ms")),
                    fmt(r.get("fwdbwd_ms")),
                    fmt(r.get("peak_mb")),
                    ratio("fwdbwd_ms", naive),
                    ratio("peak_mb", naive),
                    ratio("fwd_ms", naive),
                    (
                        f"{matmul['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}"
                        if "fwdbwd_ms" in matmul and "fwdbwd_ms" in r
                        else "—"
                    ),
                ]
            )
    return rows


HEADER = [
    "case",
    "backend",
    "fwd ms",
    "fwd+bwd ms",
    "peak extra MB",
    "fwd+bwd time / naive",
    "peak mem / naive",
    "fwd time / naive",
    "throughput / bare matmul",
]


def print_table(rows: list[list[str]], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(table(HEADER, rows) + "\n")
        return
    shown = Table(title=title)
    for i, col in enumerate(HEADER):
        shown.add_column(col, justify="left" if i < 2 else "right")
    for row in rows:
        shown.add_row(*row)
    Console(width=max(200, Console().width)).print(shown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", help="names or N,H,V[,dtype[,name]]")
    parser.add_argument("--backends", help="comma-separated (default: naive,torch on CPU)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per subprocess")
    parser.add_argument("--rounds", type=int, default=1, help="alternating subprocess rounds")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--markdown", type=Path, help="also write the table here as Markdown")
    parser.add_argument("--json", type=Path, help="also write every result here as JSON")
    parser.add_argument("--smoke", action="store_true", help="CI smoke run: " + " ".join(SMOKE))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args = parser.parse_args([*SMOKE, *(argv if argv is not None else sys.argv[1:])])
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0
    for path in (args.markdown, args.json):  # their folders first, not after the minutes
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [parse_case(c) for c in (args.cases or (CUDA_CASES if device == "cuda" else CPU_CASES))]
    default = "matmul,naive,torch,triton,liger" if device == "cuda" else "naive,torch"
    backends, skipped = usable_backends((args.backends or default).split(","), device)
    results: dict = {}
    for case in cases:
        for _ in range(args.rounds):
            for backend in backends:
                r = spawn(case, backend, args.repeats, device)
                best = results.setdefault((case.name, backend), r)
                if "error" in r or "error" in best:
                    results[(case.name, backend)] = r if "error" in best else best
                    continue
                best["fwd_ms"] = min(best["fwd_ms"], r["fwd_ms"])
                best["fwdbwd_ms"] = min(best["fwdbwd_ms"], r["fwdbwd_ms"])
                best["peak_mb"] = max(best["peak_mb"], r["peak_mb"])
                print(f"  {case.name} {backend}: {r}", file=sys.stderr)
    rows = build_rows(results, cases, backends)
    where = (
        f"cuda ({torch.cuda.get_device_name()}, torch {torch.__version__})"
        if device == "cuda"
        else device
    )
    title = (
        f"token_logprobs on {where} ({torch.get_num_threads()} threads), min of "
        f"{args.repeats} repeats x {args.rounds} rounds; peak = max over rounds"
    )
    print_table(rows, title)
    if args.markdown:
        args.markdown.write_text(f"{title}\n\n{table(HEADER, rows)}\n")
    if args.json:
        report = {
            "title": title,
            "torch": torch.__version__,
            "cases": [asdict(c) for c in cases],
            "results": [{"case": c, "backend": b, **r} for (c, b), r in results.items()],
            "skipped_backends": skipped,
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
