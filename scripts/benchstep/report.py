"""Both trainers' per-step records -> one normalised step (both jobs); the short job's
summaries, ratios tepo/TRL and table. Pure (no torch, no trl): tested without either trainer."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchlib import report as fmt

PARTS = ("generation", "scoring", "forward", "backward", "fwd_bwd", "optimizer", "other")
LABELS = {
    "generation": "generation",
    "scoring": "scoring (reward + no-grad log-probs)",
    "forward": "loss forward",
    "backward": "backward",
    "fwd_bwd": "forward + backward",
    "optimizer": "optimizer (clip + AdamW + zero_grad)",
    "other": "other (step − the parts above)",
}
MEASURED = (
    "How measured (wall clock, perf_counter): tepo — step, generation (rollout_seconds) and "
    "scoring (reward_seconds + score_seconds), loss forward, backward and optimizer "
    "(forward_seconds, backward_seconds, optimizer_seconds) from its metrics.jsonl. "
    "TRL — step from a TrainerCallback (on_step_begin → "
    "on_step_end); generation = GRPOTrainer._generate; scoring = _generate_and_score_completions "
    "− generation; loss forward = compute_loss; backward = accelerator.backward; optimizer = end "
    "of training_step → on_step_end. Peak RSS: ru_maxrss of each trainer's process (wait4), "
    "from start to exit (load, train, save). Accuracy: one process scores the base and every "
    "trained model with tepo's eval code (greedy).",
)
# Done-when of issue 8, checked on the summary.
TARGET_SPEEDUP = 2.0
TARGET_RSS_RATIO = 0.6
TARGET_ACCURACY_POINTS = 3.0


def tepo_steps(metrics: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]]) -> list[dict]:
    """tepo's metrics.jsonl rows (the update's split is tepo's own) with benchstep.tepo_side's
    probe rows (same order): what the update forwarded."""
    steps = []
    for index, row in enumerate(metrics):
        probe = probes[index] if index < len(probes) else {}
        update = row.get("update_seconds")
        shapes = probe.get("update")
        if shapes is not None:
            shapes = {**shapes, "source": f"probe ({probe.get('plan', 'plan unknown')})"}
        scoring = row.get("reward_seconds", 0.0) + row.get("score_seconds", 0.0)
        split = tuple(row.get(f"{part}_seconds") for part in UPDATE_PARTS)
        parts = (row.get("rollout_seconds"), scoring, *split)
        steps.append(_step(row, probe, row["step_seconds"], parts, update, shapes))
    return steps


def trl_steps(timings: Sequence[dict[str, Any]]) -> list[dict]:
    """benchstep.trl_side's timings.jsonl rows (update = loss forward + backward + optimizer)."""
    steps = []
    for row in timings:
        parts = tuple(row[f"{p}_seconds"] for p in ("generation", "scoring", *UPDATE_PARTS))
        update = sum(row[f"{p}_seconds"] for p in UPDATE_PARTS)
        shapes = {**row["update"], "source": "TRL's padded batch"} if "update" in row else None
        steps.append(_step(row, row, row["step_seconds"], parts, update, shapes))
    return steps


UPDATE_PARTS = ("forward", "backward", "optimizer")


def _step(
    row: dict[str, Any],
    shapes_row: dict[str, Any],
    total: float,
    parts: tuple[float | None, ...],
    update: float | None,
    shapes: dict[str, Any] | None,
) -> dict[str, Any]:
    """One normalised step of either trainer (seconds; None where a side cannot measure it)."""
    generation, scoring, forward, backward, optimizer = parts
    fwd_bwd = forward + backward if forward is not None and backward is not None else None
    other = total - sum(parts) if all(p is not None for p in parts) else None  # type: ignore[arg-type]
    return {
        "step": row["step"],
        "total": total,
        "generation": generation,
        "scoring": scoring,
        "forward": forward,
        "backward": backward,
        "fwd_bwd": fwd_bwd,
        "optimizer": optimizer,
        "other": other,
        "reward": row.get("reward_mean"),
        "update": update,
        "answer_lengths": shapes_row.get("answer_lengths", []),
        "max_new_tokens": shapes_row.get("max_new_tokens"),
        "shapes": shapes,
        "params": shapes_row.get("params"),
        "update_flops": row.get("update_flops"),  # the same formula both sides (train/flops.py)
    }


def summarize(runs: Sequence[dict[str, Any]], skip: int = 1) -> dict[str, Any]:
    """One side over its rounds: step statistics pooled over steps skip+1..N of every round."""
    timed = [s for run in runs for s in run["steps"] if s["step"] > skip]
    totals = [s["total"] for s in timed]
    median = statistics.median(totals) if totals else None
    summary: dict[str, Any] = {
        "rounds": len(runs),
        "timed_steps": len(timed),
        "median_s": median,
        "min_s": min(totals) if totals else None,
        "max_s": max(totals) if totals else None,
        "steps_per_s": 1.0 / median if median else None,
        "parts_median_s": {part: fmt.median(s[part] for s in timed) for part in PARTS},
        "peak_rss_bytes": max((run["peak_rss_bytes"] for run in runs), default=None),
        "peak_rss_bytes_per_round": [run["peak_rss_bytes"] for run in runs],
        "peak_cuda_bytes": max(
            (run["peak_cuda_bytes"] for run in runs if run.get("peak_cuda_bytes")), default=None
        ),
        "wall_s": fmt.median(run["wall_seconds"] for run in runs),
        "reward_per_step": _mean_by_step(runs),
        "accuracy_after": fmt.mean(run.get("accuracy_after") for run in runs),
    }
    rewards = [r for r in summary["reward_per_step"] if r is not None]
    summary["reward_mean"] = sum(rewards) / len(rewards) if rewards else None
    return summary


def _mean_by_step(runs: Sequence[dict[str, Any]]) -> list[float | None]:
    length = max((len(run["steps"]) for run in runs), default=0)
    return [
        fmt.mean(run["steps"][i]["reward"] for run in runs if i < len(run["steps"]))
        for i in range(length)
    ]


def ratios(tepo: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """tepo/TRL: s/step (median), steps/s (the speed-up), peak RSS, each part; accuracy in points."""
    parts = {
        part: fmt.ratio(tepo["parts_median_s"][part], trl["parts_median_s"][part]) for part in PARTS
    }
    accuracy = None
    if tepo["accuracy_after"] is not None and trl["accuracy_after"] is not None:
        accuracy = 100.0 * (tepo["accuracy_after"] - trl["accuracy_after"])
    return {
        "median_s": fmt.ratio(tepo["median_s"], trl["median_s"]),
        "steps_per_s": fmt.ratio(tepo["steps_per_s"], trl["steps_per_s"]),
        "peak_rss": fmt.ratio(tepo["peak_rss_bytes"], trl["peak_rss_bytes"]),
        "parts": parts,
        "accuracy_points": accuracy,
    }


def targets(r: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The issue's done-when, each as (condition, measured, met?)."""
    speed, rss, acc = r["steps_per_s"], r["peak_rss"], r["accuracy_points"]
    return [
        (f"tepo ≥ {TARGET_SPEEDUP:.1f}× TRL steps/s", fmt.x(speed), _ok(speed, TARGET_SPEEDUP, 1)),
        (f"tepo peak RSS ≤ {TARGET_RSS_RATIO}× TRL's", fmt.x(rss), _ok(rss, TARGET_RSS_RATIO, -1)),
        (
            f"accuracy after within {TARGET_ACCURACY_POINTS:.0f} points of TRL's",
            fmt.points(acc),
            None if acc is None else abs(acc) <= TARGET_ACCURACY_POINTS,
        ),
    ]


def _ok(value: float | None, bound: float, sign: int) -> bool | None:
    return None if value is None else (value >= bound if sign > 0 else value <= bound)


def markdown(
    job: dict[str, Any],
    tepo: dict[str, Any],
    trl: dict[str, Any],
    accuracy_before: float | None,
    versions: dict[str, str],
) -> str:
    r = ratios(tepo, trl)
    n = job["steps"]
    lines = [
        f"# tepo vs TRL GRPOTrainer: {_job_line(job)}",
        "",
        "| | tepo | TRL | tepo/TRL |",
        "|---|---|---|---|",
        _row(f"median s/step (steps 2–{n})", tepo["median_s"], trl["median_s"], r["median_s"]),
        f"| min / max s/step | {fmt.s(tepo['min_s'])} / {fmt.s(tepo['max_s'])} "
        f"| {fmt.s(trl['min_s'])} / {fmt.s(trl['max_s'])} | |",
        _row("steps/s", tepo["steps_per_s"], trl["steps_per_s"], r["steps_per_s"], digits=3),
    ]
    for part in PARTS:
        t, u = tepo["parts_median_s"][part], trl["parts_median_s"][part]
        lines.append(_row(f"  {LABELS[part]}, median s", t, u, r["parts"][part]))
    lines += [
        f"| peak RSS | {fmt.gb(tepo['peak_rss_bytes'])} | {fmt.gb(trl['peak_rss_bytes'])} "
        f"| {fmt.x(r['peak_rss'])} |",
    ]
    if tepo["peak_cuda_bytes"] or trl["peak_cuda_bytes"]:
        cuda_ratio = fmt.ratio(tepo["peak_cuda_bytes"], trl["peak_cuda_bytes"])
        lines.append(
            f"| peak GPU memory (max allocated) | {fmt.gb(tepo['peak_cuda_bytes'])} "
            f"| {fmt.gb(trl['peak_cuda_bytes'])} | {fmt.x(cuda_ratio)} |"
        )
    lines += [
        f"| process wall time (load, {n} steps, save) | {fmt.seconds(tepo['wall_s'])} "
        f"| {fmt.seconds(trl['wall_s'])} | |",
        f"| mean reward over steps 1–{n} | {fmt.s(tepo['reward_mean'])} "
        f"| {fmt.s(trl['reward_mean'])} | |",
        f"| greedy accuracy before → after ({job['eval_size']} held-out) "
        f"| {fmt.s(accuracy_before)} → {fmt.s(tepo['accuracy_after'])} "
        f"| {fmt.s(accuracy_before)} → {fmt.s(trl['accuracy_after'])} | {fmt.points(r['accuracy_points'])} |",
        "",
        "Reward per step (mean over rounds):",
        "",
        f"- tepo: {_series(tepo['reward_per_step'])}",
        f"- TRL:  {_series(trl['reward_per_step'])}",
        "",
        "Targets (issue 8):",
        "",
    ]
    lines += fmt.verdicts(targets(r))
    lines += ["", *MEASURED, "", fmt.versions_line(versions)]
    return "\n".join(lines) + "\n"


def _job_line(job: dict[str, Any]) -> str:
    ops = "".join(job["operations"])
    return (
        f"{job['steps']} steps × {job['prompts_per_step']} prompts × {job['generations']} "
        f"generations, {job['max_new_tokens']} new tokens, T={job['temperature']}, "
        f"lr {job['lr']:g}, {job['digits']}-digit {ops}, {job['dtype']} on {job['device']} "
        f"({job['threads']} threads)"
    )


def _row(label: str, a: float | None, b: float | None, ratio: float | None, digits: int = 2) -> str:
    return f"| {label} | {fmt.s(a, digits)} | {fmt.s(b, digits)} | {fmt.x(ratio)} |"


def _series(values: Sequence[float | None]) -> str:
    return " ".join("—" if v is None else f"{v:.2f}" for v in values)
