"""The long job's normalised steps (benchstep.report) -> per-side summaries and the table
(pure: no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchlib import report as fmt

from benchstep.update_shapes import length_stats, update_gflops

# The long job's bars (issue 52, which raised issue 25's): each tepo side against TRL at its best
# precision here (the TRL side with most steps/s), and its update's MFU and peak RSS.
TARGET_RSS_BYTES = 4e9
TARGET_MFU = 0.7
TARGET_SPEEDUP = 5.0
TARGET_RSS_RATIO = 0.3


def summarize(run: dict[str, Any], matmul_gflops: float) -> dict[str, Any]:
    """One side: steps 2.. when it finished more than one (the first warms up), else step 1."""
    steps = run["steps"]
    timed = steps[1:] if len(steps) > 1 else steps
    lengths = [n for s in steps for n in s["answer_lengths"]]
    cap = next((s["max_new_tokens"] for s in steps if s["max_new_tokens"]), None)
    shapes = [s["shapes"] for s in timed if s["shapes"]]
    slots = sum(s["slots"] for s in shapes)
    real = sum(s["real"] for s in shapes)
    answer_tokens = sum(s["answer_tokens"] for s in shapes)
    update_seconds = sum(s["update"] for s in timed if s["shapes"] and s["update"] is not None)
    params = next((s["params"] for s in steps if s["params"]), None)
    gflops = update_gflops(params, answer_tokens, update_seconds) if params else None
    median = fmt.median(s["total"] for s in timed)
    # A step whose every advantage was 0 runs no update (tepo: trainer.skip_zero_advantage): its
    # update seconds are not an update's, so the update's median is over the steps that ran one.
    updated = [s for s in timed if not s["shapes"] or s["shapes"]["slots"] > 0]
    needed = [s.get("update_flops") for s in timed if s["update"] is not None]
    known = needed and all(f is not None for f in needed) and update_seconds
    needed_gflops = sum(needed) / update_seconds / 1e9 if known else None
    return {
        "side": run["side"],
        "dtype": run.get("dtype"),
        "status": run["status"],
        "steps_done": len(steps),
        "timed_steps": [s["step"] for s in timed],
        "generation_mode": run.get("generation") or run.get("rollout"),
        "generation_why": run.get("generation_why"),
        "host_allocator": run.get("host_allocator"),
        "median_s": median,
        "steps_per_s": 1.0 / median if median else None,
        "parts_median_s": {
            "generation": fmt.median(s["generation"] for s in timed),
            "scoring": fmt.median(s["scoring"] for s in timed),
            "update": fmt.median(s["update"] for s in updated),
        },
        "updates_skipped": len(timed) - len(updated),
        "lengths": length_stats(lengths, cap) if cap else length_stats(lengths, 10**9),
        "max_new_tokens": cap,
        "padding_share": 1.0 - real / slots if slots else None,
        "token_slots": slots,
        "real_tokens": real,
        "answer_tokens": answer_tokens,
        "shapes_source": shapes[0].get("source") if shapes else None,
        "params": params,
        "update_gflops": gflops,
        "matmul_share": gflops / matmul_gflops if gflops is not None and matmul_gflops else None,
        # MFU as every step record gives it (train/flops.py): the needed FLOPs (prompts once,
        # attention included) over the update's seconds x the matmul rate of the same shape
        "update_mfu": needed_gflops / matmul_gflops if needed_gflops and matmul_gflops else None,
        "peak_rss_bytes": run["peak_rss_bytes"],
        "wall_s": run["wall_seconds"],
    }


def _update_cell(summary: dict[str, Any]) -> str:
    """The update's median seconds, and how many timed steps ran none (no row with a gradient)."""
    cell = fmt.s(summary["parts_median_s"]["update"])
    skipped = summary.get("updates_skipped", 0)
    return f"{cell} ({skipped} steps without one)" if skipped else cell


def best_trl(summaries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The TRL side at its best precision here: the one with most steps/s (a finished one first)."""
    trls = [s for s in summaries if s["side"].startswith("trl")]
    return max(trls, key=lambda s: (s["status"] == "ok", s["steps_per_s"] or 0.0), default=None)


def targets(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, str, bool | None]]:
    """The long job's bars for each tepo side, as (condition, measured, met?)."""
    trl = best_trl(summaries)
    rows = []
    for tepo in (s for s in summaries if s["side"].startswith("tepo")):
        name, rss, mfu = tepo["side"], tepo["peak_rss_bytes"], tepo.get("update_mfu")
        rows.append((f"{name} peak RSS ≤ 4 GB", fmt.gb(rss), rss <= TARGET_RSS_BYTES))
        met = None if mfu is None else mfu >= TARGET_MFU
        rows.append((f"{name} update MFU ≥ {TARGET_MFU}", fmt.s(mfu), met))
        if trl is None:
            continue
        against = f"{trl['side']}'s"
        speed = fmt.ratio(tepo["steps_per_s"], trl["steps_per_s"])
        if trl["status"] == "OOM" and tepo["status"] == "ok":
            rows.append(
                (f"{name} ≥ {TARGET_SPEEDUP:.0f}× {against} steps/s", "TRL ran out of memory", None)
            )
        else:
            met = None if speed is None else speed >= TARGET_SPEEDUP
            rows.append((f"{name} ≥ {TARGET_SPEEDUP:.0f}× {against} steps/s", fmt.x(speed), met))
        ratio = fmt.ratio(rss, trl["peak_rss_bytes"])
        met = None if ratio is None else ratio <= TARGET_RSS_RATIO
        rows.append((f"{name} peak RSS ≤ {TARGET_RSS_RATIO}× {against}", fmt.x(ratio), met))
    return rows


def markdown(
    job: Any,
    summaries: Sequence[dict[str, Any]],
    matmuls: Sequence[dict[str, Any]],
    memory_limit_bytes: int,
    micro_batches: str,
    versions: dict[str, str],
) -> str:
    """The table: one column per side."""
    head = "| | " + " | ".join(s["side"] for s in summaries) + " |"
    rule = "|---|" + "---:|" * len(summaries)

    def row(label: str, cells: Sequence[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |"

    def each(function: Any) -> list[str]:
        return [function(s) for s in summaries]

    lengths = [s["lengths"] for s in summaries]
    lines = [
        f"## Long-answer job (issue 25): {job.steps} steps × {job.prompts_per_step} prompts × "
        f"{job.generations} answers, ≤ {job.max_new_tokens} new tokens, T={job.temperature}, "
        f"GRPO β=0, MATH-500 train split, on {job.device} ({job.threads} threads)",
        "",
        f"Model: {job.model}. Memory limit per side: {memory_limit_bytes / 1e9:.0f} GB (process "
        "tree RSS, watched; killed at the limit = OOM).",
        "",
        head,
        rule,
        row("status (steps finished)", each(lambda s: f"{s['status']} ({s['steps_done']})")),
        row("precision", each(lambda s: str(s.get("dtype") or job.dtype))),
        row("generation", each(lambda s: str(s["generation_mode"] or "—"))),
        row("host allocator", each(lambda s: str(s.get("host_allocator") or "—"))),
        row("median s/step", each(lambda s: fmt.s(s["median_s"]))),
        row("  generation, s", each(lambda s: fmt.s(s["parts_median_s"]["generation"]))),
        row("  scoring, s", each(lambda s: fmt.s(s["parts_median_s"]["scoring"]))),
        row("  update, s", each(_update_cell)),
        row("steps/s", each(lambda s: fmt.s(s["steps_per_s"], 4))),
        row("peak RSS", each(lambda s: fmt.gb(s["peak_rss_bytes"]))),
        row("answers", [str(x["count"]) for x in lengths]),
        row("answer length mean", [fmt.s(x["mean"], 1) for x in lengths]),
        row("answer length p50 / p90 / max", [_lengths(x) for x in lengths]),
        row("truncated share", [fmt.pct(x["truncated"]) for x in lengths]),
        row("update padding share", each(lambda s: fmt.pct(s["padding_share"]))),
        row(
            "update token slots / real", each(lambda s: f"{s['token_slots']} / {s['real_tokens']}")
        ),
        row("update GFLOP/s on answer tokens", each(lambda s: fmt.s(s["update_gflops"], 1))),
        row("… / matmul rate of its precision", each(lambda s: fmt.s(s["matmul_share"]))),
        row("update MFU (as in each step record)", each(lambda s: fmt.s(s.get("update_mfu")))),
        "",
    ]
    for trl in (s for s in summaries if s["side"].startswith("trl")):
        lines += [
            f"{trl['side']}'s generation: {trl['generation_mode']} — {trl['generation_why']}. "
            "Its update: "
            f"{job.trl_sequences} sequences per forward/backward ({job.trl_accumulation} accumulated "
            f"per optimizer step), gradient checkpointing {'on' if job.trl_checkpointing else 'off'}.",
            "",
        ]
    lines += ["Targets (issue 52; TRL at its best precision: the TRL side with most steps/s):", ""]
    lines += fmt.verdicts(targets(summaries))
    lines += [
        "",
        "How measured: s/step is the median over steps 2.. (step 1 when only one finished); "
        "tepo's split from its metrics.jsonl (rollout, reward + score, update seconds), TRL's from "
        "wrapped calls (generation = _generate, weight sync to its vLLM included; scoring = "
        "_generate_and_score_completions − generation; update = compute_loss + backward + "
        "optimizer). Truncated: length reached the cap. Padding share: padded token slots over "
        "all slots the update's forward/backward computes (tepo: each micro-batch's rows cut to "
        "their longest answer, each distinct prompt once with shared prompts — from the rows its "
        f"micro-batches ran ({micro_batches} by default), none with packing; TRL: its "
        "padded prompt + completion tensors). GFLOP/s = 6 × parameters × real answer tokens / "
        "update seconds, over the same steps; matmul rate: the best of torch.mm "
        f"{matmuls[0]['shape']} in the side's precision timed before and after the sides, "
        f"{matmuls[0]['threads']} threads ({_rates(matmuls)}). Peak RSS: the side's process tree, sampled every 0.25 s (and wait4's "
        "ru_maxrss, whichever is larger).",
        "",
        fmt.versions_line(versions),
    ]
    return "\n".join(lines) + "\n"


def _rates(matmuls: Sequence[dict[str, Any]]) -> str:
    return ", ".join(
        f"{m.get('dtype', 'float32')} {float(m['gflops']):.1f} GFLOP/s" for m in matmuls
    )


def _lengths(x: dict[str, Any]) -> str:
    if not x["count"]:
        return "—"
    return f"{x['p50']:.0f} / {x['p90']:.0f} / {x['max']}"
