"""The tepo side: `tepo train OVERRIDES` in this process, with a probe around the update.

    python -m benchstep.tepo_side PROBES.jsonl OVERRIDE...

tepo's metrics.jsonl has the step's seconds and the update's forward / backward / optimizer
split; the probe adds, per step, one JSON line of what the update forwarded (update_shapes: the
rows each micro-batch and prompt pass ran, the answer lengths, the parameter count).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Probe:
    """The rows the current step's update ran, written as one line per step."""

    def __init__(self, sink: Path) -> None:
        self.sink = sink
        self.policy_engine: Any = None
        self.micro_batches: list[list[int]] = []
        self.prompt_passes: list[list[int]] = []  # the rows of each minibatch that ran one
        self.params: int | None = None

    def record_rows(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Keep the row indices of each micro-batch `_forward_backward` is called with."""

        @functools.wraps(function)
        def recorded(
            cfg: Any, engine: Any, experience: Any, prompts: Any, index: int, *args: Any, **kw: Any
        ):
            rows = prompts.micro_batch_rows[index]
            self.micro_batches.append([int(i) for i in rows.tolist()])
            return function(cfg, engine, experience, prompts, index, *args, **kw)

        return recorded

    def record_prompt_passes(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Keep the minibatch rows of each prompt pass `_prompt_pass` runs for the policy."""

        @functools.wraps(function)
        def recorded(cfg: Any, engine: Any, experience: Any, minibatch: Any, *args: Any):
            result = function(cfg, engine, experience, minibatch, *args)
            if result.prompt_pass is not None and engine is self.policy_engine:
                self.prompt_passes.append([int(i) for i in minibatch.tolist()])
            return result

        return recorded

    def write_step(self, update_seconds: float, shapes: dict[str, Any]) -> None:
        record = {"probe_update_seconds": update_seconds, **shapes}
        with self.sink.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        self.micro_batches = []
        self.prompt_passes = []


def update_shapes(
    cfg: Any,
    engine_module: Any,
    experience: Any,
    micro_batches: list[list[int]],
    prompt_passes: list[list[int]] | None = None,
    recording: bool = False,
) -> dict[str, Any]:
    """The step's answer lengths and its update's token slots (benchstep.update_shapes). The plan
    is the rows the update ran (recorded; none when `recording` and nothing was: every row's
    advantage was 0, tepo_cli/train/zero_advantage.py); the fixed trainer.micro_batch_size split
    where the rows could not be recorded."""
    from benchstep.update_shapes import UpdateShapes, fixed_plan, tepo_shapes
    from tepo_cli.models.packing import supports_packing

    batch = experience.batch
    width = batch.prompt_width
    answers = [int(n) for n in batch.completion_mask.sum(dim=1).tolist()]
    prompt_mask = batch.attention_mask[:, :width]
    first, owner = batch.distinct_prompts()
    prompt_lengths = [int(n) for n in prompt_mask[first].sum(dim=1).tolist()]
    recorded = bool(micro_batches)
    if recording and not micro_batches:
        return {
            "answer_lengths": answers,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "update": UpdateShapes(0, 0, 0, 0).as_dict(),
            "plan": "none: no row with a gradient",
            "micro_batch_rows": [],
            "packed": cfg.model.packing,
            "prompt_passes": 0,
        }
    plan = micro_batches or fixed_plan(len(answers), cfg.trainer.micro_batch_size)
    packed = cfg.model.packing and supports_packing(engine_module.lm)
    # Unpacked, a checkpointed micro-batch runs row by row (models/sequence_hidden.py); auto
    # checkpoints only a lone over-budget row, where sharing has nothing to share.
    shared = cfg.model.share_prompts and (packed or cfg.model.gradient_checkpointing is not True)
    passes = prompt_passes or []
    shapes = tepo_shapes(
        answers, prompt_lengths, owner.tolist(), width, plan, shared, packed, passes
    )
    return {
        "answer_lengths": answers,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "update": shapes.as_dict(),
        "plan": "recorded"
        if recorded
        else f"fixed micro_batch_size={cfg.trainer.micro_batch_size}",
        "micro_batch_rows": [len(rows) for rows in plan],
        "packed": packed,
        "prompt_passes": len(passes),
    }


def install(probe: Probe) -> list[str]:
    """Wrap tepo's update (one call per step), its micro-batch forward+backward and its prompt
    pass. Returns what could not be wrapped (a renamed function: no recorded rows then)."""
    from tepo_cli.train import recipe
    from tepo_cli.train import update as update_module

    missing = []
    if hasattr(update_module, "_forward_backward"):
        update_module._forward_backward = probe.record_rows(update_module._forward_backward)
    else:
        missing.append("tepo_cli.train.update._forward_backward")
    if hasattr(update_module, "_prompt_pass"):
        update_module._prompt_pass = probe.record_prompt_passes(update_module._prompt_pass)
    else:
        missing.append("tepo_cli.train.update._prompt_pass")
    original_update = recipe.update

    @functools.wraps(original_update)
    def timed_update(cfg: Any, engine: Any, *args: Any, **kwargs: Any) -> Any:
        probe.policy_engine = engine
        if probe.params is None:
            parameters = engine.module.parameters()
            probe.params = sum(getattr(p, "ds_numel", p.numel()) for p in parameters)
        start = time.perf_counter()
        result = original_update(cfg, engine, *args, **kwargs)
        seconds = time.perf_counter() - start
        experience = args[0] if args else kwargs["experience"]
        recording = "tepo_cli.train.update._forward_backward" not in missing
        shapes = update_shapes(
            cfg, engine.module, experience, probe.micro_batches, probe.prompt_passes, recording
        )
        probe.write_step(seconds, {**shapes, "params": probe.params})
        return result

    recipe.update = timed_update
    return missing


def main(argv: list[str]) -> None:
    from benchlib.runner import record_cuda_memory_at_exit

    from tepo_cli.cli import main as tepo_main
    from tepo_cli.cli import start_with_host_allocator

    sink, overrides = Path(argv[0]), argv[1:]
    start_with_host_allocator("train", overrides)  # as the `tepo` command does: same allocator
    sink.write_text("")
    record_cuda_memory_at_exit()
    missing = install(Probe(sink))
    for name in missing:
        print(f"bench_step: {name} not found; the update's plan not recorded", file=sys.stderr)

    tepo_main(["train", *overrides])


if __name__ == "__main__":
    main(sys.argv[1:])
