"""How many steps MPO's MTP warm-up takes: `algo.mtp.warmup.steps=auto` sized to what the modules
can learn and to the job (docs/objectives.md §1.5); an explicit integer always wins.

Why these two rules:
- **A random backbone teaches nothing.** The modules predict tokens t+2.. from the backbone's
  hidden state at t (and the next token's embedding). A model built in-process with random
  weights (`model.source=tiny` without `model.path`) has hidden states that carry no knowledge of
  the text: its warm-up loss stays at ln V (10.8 nats for SmolLM2's 49,152 tokens) over 30 steps,
  3–6 minutes of a 2-step smoke run spent learning nothing. Whether the weights are random is
  known from the config before anything loads, so auto gives 0 there without a measurement.
- **Never more than the job.** With trained weights the warm-up is worth its cost, but a short
  run should not spend more on it than on RL: auto takes at most `AUTO_MOST` steps (the earlier
  fixed default, [ours]) and never more sequences than the RL run samples
  (`trainer.max_steps × trainer.prompts_per_step × rollout.n`). A warm-up sequence costs one
  forward of the frozen backbone and the modules' forward and backward, an RL answer its
  generation, scoring and the whole model's forward and backward, so the warm-up stays below
  the RL's own work. Every shipped recipe keeps its 30 steps (their runs sample ≥ 480 answers);
  a 2-step run of the default gets 2.
"""

from __future__ import annotations

from dataclasses import dataclass

from tepo_cli.config.schema import ModelConfig, TrainConfig

AUTO_MOST = 30  # [ours] the warm-up's former fixed length, auto's ceiling


@dataclass(frozen=True)
class WarmupSize:
    """The warm-up's step count and the reason the start line gives for it."""

    steps: int
    reason: str


def random_backbone(model: ModelConfig) -> bool:
    """The policy is built in-process with random weights: the tiny model without a saved
    directory to load (models/loading.py builds it from `init_seed`)."""
    return model.source == "tiny" and not model.path


def warmup_size(cfg: TrainConfig) -> WarmupSize:
    """The warm-up's steps for this run: the integer given, or auto's choice (module docstring)."""
    steps = cfg.algo.mtp.warmup.steps
    if steps != "auto":
        return WarmupSize(steps, f"algo.mtp.warmup.steps={steps}")
    if random_backbone(cfg.model):
        return WarmupSize(
            0,
            f"auto: model={cfg.model.name} has random weights, so the modules, which read its "
            "hidden states, have nothing to learn (the loss stays at ln V); "
            "set algo.mtp.warmup.steps=N to warm up anyway",
        )
    trainer, size = cfg.trainer, cfg.algo.mtp.warmup.batch_size
    answers = trainer.max_steps * trainer.prompts_per_step * cfg.rollout.n
    steps = min(AUTO_MOST, answers // size)
    if steps == AUTO_MOST:
        reason = f"auto: its most; the run samples {answers} answers"
    else:
        reason = (
            f"auto: no more sequences than the run's {answers} answers "
            f"({trainer.max_steps} steps x {trainer.prompts_per_step} prompts x {cfg.rollout.n}) "
            f"at {size} a step"
        )
    return WarmupSize(steps, reason)


def settle_warmup_steps(cfg: TrainConfig) -> WarmupSize | None:
    """Write auto's choice into the config (the run's config.yaml then records the number it ran
    with, and a resume compares numbers); None when the objective has no MTP modules."""
    if not cfg.algo.mtp_depths:
        return None
    size = warmup_size(cfg)
    cfg.algo.mtp.warmup.steps = size.steps
    return size


def warmup_line(size: WarmupSize, batch_size: int) -> str:
    """The start line: how long the MTP warm-up runs, and why."""
    if size.steps == 0:
        return f"MTP warm-up: none ({size.reason})"
    steps = "1 step" if size.steps == 1 else f"{size.steps} steps"
    return f"MTP warm-up: {steps} of {batch_size} sequences ({size.reason})"
