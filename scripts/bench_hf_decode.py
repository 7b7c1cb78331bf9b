"""What bounds `rollout=hf`'s decoding on this machine: the seconds of one decode step (one new
token for every row, keys and values of a 300-token context cached) at several batch sizes, and
`generate`'s tokens/s eagerly and with a static cache under `torch.compile`.

A step whose time hardly grows with its rows is bound by its fixed cost (the layers' small
operations), not by the work per row: then dropping finished rows saves little, and fewer
sequential steps (continuous batching across turns) is the lever. Beside each step, the least
it could take here: every weight and the cached keys and values read once from memory, at the
machine's read rate (a sum over 512 MiB, measured first). Results:
docs/results/multi_turn/index.md.

    python scripts/bench_hf_decode.py --out docs/results/multi_turn/hf_decode
    python scripts/bench_hf_decode.py --model tiny --steps 2 --new-tokens 4 --out /tmp/hd  # smoke
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml
from benchlib.runner import best_seconds

BATCHES = (1, 2, 4, 8, 16)
CONTEXT = 300  # tokens cached before the timed steps: a word_math prompt and a turn or two


def load(name: str, dtype: torch.dtype) -> torch.nn.Module:
    """The embedded model (converted from its package's GGUF file on first use, as `tepo train`
    does) or a tiny random Llama."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tepo_cli.models.gguf_convert import converted_checkpoint

    if name == "tiny":
        config = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
        torch.manual_seed(0)
        return LlamaForCausalLM(config).to(dtype).eval()
    preset = yaml.safe_load((Path(__file__).parents[1] / "conf/model" / f"{name}.yaml").read_text())
    path = converted_checkpoint(name, preset["package"], preset["gguf_file"])  # as tepo train
    return LlamaForCausalLM.from_pretrained(path, dtype=dtype).eval()


@torch.no_grad()
def step_seconds(model: torch.nn.Module, rows: int, steps: int) -> float:
    """Mean seconds of one decode step for `rows` rows over a cached CONTEXT-token prefix."""
    from tepo_cli.models.cache_key import returned_cache, with_cache

    vocab = model.config.vocab_size
    past = returned_cache(model(torch.randint(0, vocab, (rows, CONTEXT)), use_cache=True))
    token = torch.randint(0, vocab, (rows, 1))
    for _ in range(3):  # warm-up: allocations, kernels
        model(token, **with_cache(past), use_cache=True)
    start = time.perf_counter()
    for _ in range(steps):
        model(token, **with_cache(past), use_cache=True)
    return (time.perf_counter() - start) / steps


def read_rate(repeats: int = 5) -> float:
    """Bytes per second a sum over a 512 MiB float32 tensor reads (best of `repeats`)."""
    data = torch.ones(128 * 1024 * 1024)
    return data.numel() * data.element_size() / best_seconds(data.sum, repeats, warmup=1)


def step_bytes(model: torch.nn.Module, rows: int) -> int:
    """What one decode step must read at least: each weight once (a tied embedding once) and
    every row's cached keys and values (CONTEXT tokens)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # unique tensors
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    return weights + rows * CONTEXT * per_token * next(model.parameters()).element_size()


def generate_rate(model: torch.nn.Module, rows: int, new_tokens: int, compiled: bool) -> float:
    """`generate`'s new tokens per second over `rows` rows of CONTEXT tokens, sampling, every row
    made to run `new_tokens` tokens; the best of two calls after a first (which compiles)."""
    from transformers import CompileConfig

    prompt = torch.randint(0, model.config.vocab_size, (rows, CONTEXT))
    options: dict = {"do_sample": True, "temperature": 0.7}
    options.update(max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    if compiled:
        config = CompileConfig(mode="default")
        config._compile_all_devices = True  # transformers compiles on CUDA only unless told
        options.update(cache_implementation="static", compile_config=config)
    seconds = []
    for _ in range(3):
        torch.manual_seed(0)
        start = time.perf_counter()
        model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)
        seconds.append(time.perf_counter() - start)
    return rows * new_tokens / min(seconds[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2_135m", choices=["smollm2_135m", "tiny"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps per batch size")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per generate() row")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load(args.model, getattr(torch, args.dtype))
    rate = read_rate()
    steps = {rows: step_seconds(model, rows, args.steps) for rows in BATCHES}
    floors = {rows: step_bytes(model, rows) / rate for rows in BATCHES}
    rates = {
        mode: generate_rate(model, BATCHES[-1], args.new_tokens, mode == "static, compiled")
        for mode in ("eager", "static, compiled")
    }
    lines = [
        f"Decode steps, {args.model} in {args.dtype}, {args.threads} threads, {CONTEXT} tokens "
        f"cached, mean of {args.steps}; memory read rate {rate / 1e9:.1f} GB/s (a sum over 512 MiB); "
        "floor: the step's weights and cached keys and values read once at that rate:",
        "",
        "| rows | ms/step | tokens/s | step ÷ 1 row's | MB read at least | floor ms | step ÷ floor |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {rows} | {s * 1e3:.1f} | {rows / s:.0f} | {s / steps[1]:.2f} "
            f"| {step_bytes(model, rows) / 1e6:.0f} | {floors[rows] * 1e3:.1f} | {s / floors[rows]:.1f} |"
            for rows, s in steps.items()
        ),
        "",
        f"`generate`, {BATCHES[-1]} rows × {args.new_tokens} new tokens, sampling:",
        "",
        "| mode | tokens/s |",
        "|---|---:|",
        *(f"| {mode} | {rate:.0f} |" for mode, rate in rates.items()),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    results = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "read_bytes_per_s": rate,
        "step_seconds": steps,
        "floor_seconds": floors,
        "generate_tokens_per_s": rates,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
