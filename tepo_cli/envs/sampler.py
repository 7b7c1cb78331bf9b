"""The one choice between one answer per prompt and episodes, made once per run from `env.name`:
`tepo train`'s rollout (train/sampling.py), its held-out evaluation (train/held_out.py) and
`tepo eval` (eval/eval_job.py) all call the sampler this returns, and read its results
(`Samples`, `HeldOut`: envs/samples.py) without asking which it is. `env=single` is `Answers`;
every other environment, built in or a plugin's, `Episodes`."""

from __future__ import annotations

from tepo_cli.config.env_schema import EnvConfig
from tepo_cli.config.schema import BenchmarkConfig
from tepo_cli.envs.answer_sampler import Answers
from tepo_cli.envs.episode_sampler import Episodes

# Each has the same methods (sample, records, held_out, held_out_problems, summary, start_line).
Sampler = Answers | Episodes


def build_sampler(env: EnvConfig, benchmark: BenchmarkConfig, turn_tokens: int) -> Sampler:
    """The run's sampler; `turn_tokens` is the most one answer (one turn of an episode) holds."""
    if env.multi_turn:
        return Episodes(env, benchmark, turn_tokens)
    return Answers(benchmark)
