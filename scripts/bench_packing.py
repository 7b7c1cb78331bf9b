"""Padded vs packed (`model.packing`), and packed with gradient checkpointing: one forward+backward
of the policy on ragged answers, each layout in its own process, on the same batch.

    python scripts/bench_packing.py [--prompts 4 --n 8 --prompt-tokens 44 ...] [--profile]
    python scripts/bench_packing.py --smoke              # the tiny model, seconds (CI)

`prompts` prompts of `prompt_tokens` tokens (left-padded by a few), `n` answers each, lengths
uniform up to twice `mean_answer`, capped at `max_answer`. Prints the seconds (best of
--repeats), peak RSS and token counts, writes them as JSON; --profile splits the time by op.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from importlib import resources
from pathlib import Path

from benchlib.measure import op_line, profiled_shares
from benchlib.report import table
from benchlib.runner import best_seconds, child_json

# layout -> (model.packing, model.gradient_checkpointing)
LAYOUTS = {
    "padded": (False, False),
    "packed": (True, False),
    "packed+checkpointing": (True, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model preset")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--max-answer", type=int, default=512)
    parser.add_argument("--mean-answer", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("bench_packing.json"))
    parser.add_argument("--smoke", action="store_true", help="model=tiny, small shapes, 1 repeat")
    parser.add_argument("--profile", action="store_true", help="split each layout's time by op")
    parser.add_argument("--layout", choices=LAYOUTS, help=argparse.SUPPRESS)  # one child's run
    args = parser.parse_args()
    if args.smoke:
        args.model, args.prompt_tokens, args.max_answer, args.mean_answer = "tiny", 12, 24, 10
        args.repeats = 1
    if args.layout:
        print(json.dumps(_run(args)))
        return
    args.output.parent.mkdir(parents=True, exist_ok=True)  # before the minutes of measuring
    command = [sys.executable, __file__, *sys.argv[1:], "--layout"]
    results = {layout: child_json([*command, layout]) for layout in LAYOUTS}
    _report(results)
    args.output.write_text(json.dumps(results, indent=2) + "\n")


def _run(args: argparse.Namespace) -> dict[str, float]:
    import torch
    from omegaconf import OmegaConf

    from tepo_cli.config.schema import KernelConfig, ModelConfig
    from tepo_cli.core.rollout_record import left_padded_positions
    from tepo_cli.core.sequences import SequenceBatch
    from tepo_cli.models.loading import load_model, load_tokenizer
    from tepo_cli.models.policy import Policy

    preset = resources.files("tepo_cli.conf") / "model" / f"{args.model}.yaml"
    config = ModelConfig.model_validate(OmegaConf.to_container(OmegaConf.load(str(preset))))
    packing, checkpointing = LAYOUTS[args.layout]
    config = config.model_copy(update={"gradient_checkpointing": checkpointing})
    model = load_model(config, load_tokenizer(config), torch.device("cpu"))
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = args.prompts * args.n
    lengths = torch.rand(rows, generator=generator, device="cpu") * 2 * args.mean_answer
    lengths = (lengths.long() + 1).clamp(max=args.max_answer)
    width = int(lengths.max())
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(1, vocab, (args.prompts, args.prompt_tokens), generator=generator)
    prompt_ids = prompt_ids.repeat_interleave(args.n, dim=0)
    prompt_mask = torch.ones(rows, args.prompt_tokens, dtype=torch.long, device="cpu")
    for prompt in range(args.prompts):  # prompts of different lengths, left-padded
        prompt_mask[prompt * args.n : (prompt + 1) * args.n, : 3 * prompt] = 0
    answer_ids = torch.randint(1, vocab, (rows, width), generator=generator)
    answer_mask = torch.arange(width, device="cpu")[None] < lengths[:, None]
    input_ids = torch.cat([prompt_ids, answer_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, answer_mask.long()], dim=1)
    batch = SequenceBatch(
        input_ids,
        attention_mask,
        left_padded_positions(attention_mask),
        answer_mask,
        args.prompt_tokens,
    )
    policy = Policy(model, KernelConfig(), packing=packing)

    def step() -> None:
        scores = policy(batch, 1.0, with_entropy=True)
        (scores.logp.sum() + scores.entropy.sum()).backward()
        policy.zero_grad(set_to_none=True)

    seconds = best_seconds(step, args.repeats)
    shares = profiled_shares(step) if args.profile else {}
    return {
        **shares,
        "fwd_bwd_seconds": seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "rows": rows,
        "real_answer_tokens": int(lengths.sum()),
        "padded_answer_slots": rows * width,
    }


def _report(results: dict[str, dict[str, float]]) -> None:
    padded = results["padded"]
    print(
        f"{padded['rows']} answers, {padded['real_answer_tokens']} real answer tokens in "
        f"{padded['padded_answer_slots']} padded slots"
    )
    cells = [
        (n, f"{r['fwd_bwd_seconds']:.2f}", f"{r['peak_rss_gb']:.2f}") for n, r in results.items()
    ]
    print(table(["layout", "fwd+bwd s", "peak RSS GB"], cells))
    for layout, run in results.items():
        if "matmul_share" in run:
            print(f"{layout}: {op_line(run)}")
    for layout, run in list(results.items())[1:]:
        speedup = padded["fwd_bwd_seconds"] / run["fwd_bwd_seconds"]
        memory = run["peak_rss_gb"] / padded["peak_rss_gb"]
        print(f"{layout}: {speedup:.2f}x the padded speed, {memory:.2f}x its peak RSS")


if __name__ == "__main__":
    main()
