"""The start line of a multi-turn run: how many turns an episode may take (and whether that is
the default), and what the held-out evaluation inside `tepo train` will cost — each of its
problems is a whole greedy episode, up to `env.max_turns` generations long, which on the
embedded model took 570 s against 12–44 s for single answers. Said before the first
evaluation, with the knobs that make it smaller, so nobody waits on it without a word."""

from __future__ import annotations

from tepo_cli.config.env_schema import DEFAULT_TURNS, EnvConfig
from tepo_cli.config.schema import TrainerConfig


def environment_line(env: EnvConfig, trainer: TrainerConfig, eval_problems: int) -> str:
    """One line for `tepo train` with a multi-turn environment (`eval_problems`: the held-out
    problems each evaluation plays, after `env.eval_size`)."""
    turns = f"env.name={env.name}: up to {env.turns} turns per episode"
    if env.turns_defaulted:
        turns += f" (env.max_turns not set: {DEFAULT_TURNS}, the multi-turn default)"
    moments = [
        *(["before"] if trainer.eval_before else []),
        *([f"every {trainer.eval_every} steps"] if trainer.eval_every else []),
        *(["after"] if trainer.eval_after else []),
    ]
    if not moments:
        return f"{turns}; no held-out evaluation"
    size = "" if env.eval_size is None else f"the first {env.eval_size} (env.eval_size)"
    return (
        f"{turns}; the held-out evaluation ({', '.join(moments)}) plays one greedy episode on "
        f"each of {eval_problems} held-out problems{f', {size}' if size else ''}: up to "
        f"{env.turns} generations each, up to {env.turns}x a single-answer evaluation; "
        f"env.eval_size=N evaluates on fewer, trainer.eval_before=false / trainer.eval_after=false "
        f"skip it"
    )
