"""How far bf16 weights follow their float32 masters under small AdamW steps (a numerics check,
not a timing): the embedded model trained on a fixed group-centred policy-gradient loss over
word_math problems with their worked solutions, for a few steps at lr 1e-5, three ways:

- `float32`: float32 weights stepped directly (the reference);
- `nearest`: float32 masters, the bf16 weights the model computes with rounded to nearest after
  each step (DeepSpeed's bf16 optimizers; `torch.autocast` computes with the same rounded values);
- `stochastic`: the same masters, the bf16 weights rounded stochastically
  (`tepo_cli/runtime/weight_rounding.py`, `model.weight_rounding=stochastic`).

Each step prints the loss the model computes and its KL from the starting model on other
problems (float32 arithmetic over the weights it computes with), and the share of weights whose
bf16 value changed. Then the seconds of one stochastic rounding of the model's parameter count,
tepo's (numpy's PCG64DXSM bits, the high half kept) against the former one (torch.randint's
32-bit draw per element, masked, converted to bf16), alternated, best of `--repeats` each: read
the ratio. Results: docs/results/precision/index.md.

    python scripts/bench_weight_rounding.py --steps 6 --out docs/results/precision/weight_rounding
    python scripts/bench_weight_rounding.py --model tiny --steps 1 --out /tmp/wr   # smoke
"""

from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path

import torch

from tepo_cli.data.word_math_problems import WordMathOptions, settings
from tepo_cli.data.word_problems import draw_problem
from tepo_cli.runtime.weight_rounding import round_stochastically

MODES = ("float32", "nearest", "stochastic")


def load(name: str) -> tuple[torch.nn.Module, object]:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tepo_cli.cache import cache_root

    path = cache_root() / "models" / "smollm2_135m"
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "right"
    if name == "tiny":
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
        torch.manual_seed(0)
        return LlamaForCausalLM(config), tokenizer
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer


def batches(tokenizer: object) -> tuple[dict, dict]:
    rng, problem = random.Random(0), settings(WordMathOptions())
    texts = [(d := draw_problem(rng, problem)).question + "\n" + d.solution for _ in range(24)]
    train = tokenizer(texts[:16], return_tensors="pt", padding=True)
    held = tokenizer(texts[16:], return_tensors="pt", padding=True)
    return train, held


def token_logps(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = torch.log_softmax(logits.float()[:, :-1], -1)
    return logps, batch["attention_mask"][:, 1:].float()


def run(mode: str, base: torch.nn.Module, train: dict, held: dict, steps: int) -> list[dict]:
    model = copy.deepcopy(base)
    masters = [p for p in model.parameters()]
    if mode != "float32":
        masters = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
        model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(masters, lr=1e-5, weight_decay=0.0)
    advantages = torch.tensor([1.0, -1.0] * 8)  # group-centred: large terms cancel
    with torch.no_grad():
        start, mask = token_logps(base, held)
    rows = []
    for step in range(steps + 1):
        with torch.no_grad():
            logps, _ = token_logps(copy.deepcopy(model).float(), held)
            kl = ((logps.exp() * (logps - start)).sum(-1) * mask).sum() / mask.sum()
        model.zero_grad(set_to_none=True)
        logps, train_mask = token_logps(model, train)
        chosen = logps.gather(-1, train["input_ids"][:, 1:, None])[..., 0]
        loss = -(advantages * (chosen * train_mask).sum(1) / train_mask.sum(1)).mean()
        loss.backward()
        row = {"mode": mode, "step": step, "loss": float(loss), "kl_from_start": float(kl)}
        if step == steps:
            rows.append(row)
            break
        for master, param in zip(masters, model.parameters(), strict=True):
            if master is not param:
                master.grad = param.grad.float()
        torch.nn.utils.clip_grad_norm_(masters, 1.0)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        with torch.no_grad():
            for index, (master, param) in enumerate(zip(masters, model.parameters(), strict=True)):
                if mode == "stochastic":
                    round_stochastically(master.detach(), param.data, step * 1000 + index)
                elif mode == "nearest":
                    param.copy_(master)
        changed = sum(int((b != p).sum()) for b, p in zip(before, model.parameters(), strict=True))
        row["weights_changed"] = changed / sum(p.numel() for p in model.parameters())
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def torch_randint_rounding(master: torch.Tensor, out: torch.Tensor, seed: int) -> None:
    """The former path (tepo before 2026-12-02), the reference for the timing: the same rounding
    from torch.randint's draws, masked, the float32 result converted to bf16."""
    generator = torch.Generator().manual_seed(seed)
    flat_master, flat_out, chunk = master.reshape(-1), out.view(-1), 1 << 22
    for start in range(0, flat_master.numel(), chunk):
        bits = flat_master[start : start + chunk].view(torch.int32)
        noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, generator=generator)
        flat_out[start : start + chunk].copy_(
            (bits + noise).bitwise_and_(-(1 << 16)).view(torch.float32)
        )


def rounding_seconds(count: int, repeats: int) -> dict[str, float]:
    """Best seconds of one rounding of `count` float32 masters, each way, alternated."""
    import time

    master = torch.randn(count, generator=torch.Generator().manual_seed(0)) * 0.03
    out = torch.empty(count, dtype=torch.bfloat16)
    ways = {"tepo": round_stochastically, "torch_randint": torch_randint_rounding}
    best = dict.fromkeys(ways, float("inf"))
    for repeat in range(repeats):
        for name, way in ways.items():
            began = time.perf_counter()
            way(master, out, repeat)
            best[name] = min(best[name], time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["smollm2_135m", "tiny"], default="smollm2_135m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3, help="timing: roundings each way")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base, tokenizer = load(args.model)
    train, held = batches(tokenizer)
    rows = [row for mode in MODES for row in run(mode, base, train, held, args.steps)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                                       "rows": rows}, indent=1))  # fmt: skip
    last = {row["mode"]: row for row in rows if row["step"] == args.steps}
    lines = [
        f"| weights | loss at step {args.steps} | KL from the start | KL / float32's |",
        "|---|---|---|---|",
    ]
    reference = last["float32"]["kl_from_start"]
    for mode in MODES:
        row = last[mode]
        share = row["kl_from_start"] / reference if reference else float("nan")
        lines.append(f"| {mode} | {row['loss']:+.4f} | {row['kl_from_start']:.5f} | {share:.2f} |")
    count = sum(p.numel() for p in base.parameters())
    seconds = rounding_seconds(count, args.repeats)
    lines += [
        "",
        f"| one rounding of {count:,} weights | seconds (best of {args.repeats}) |",
        "|---|---|",
        *(f"| {name} | {value:.3f} |" for name, value in seconds.items()),
        f"| tepo / torch_randint | {seconds['tepo'] / seconds['torch_randint']:.2f} |",
    ]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
