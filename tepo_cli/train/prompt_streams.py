"""Where a step's prompts come from: the shared training stream, this rank's share of it, and
(with DAPO's dynamic sampling) a per-rank refill stream, each resumable at its position."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.records import Problem
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.rng_and_streams import CountingStream
from tepo_cli.runtime.state import RankState, TrainerState


@dataclass
class Prompts:
    stream: CountingStream[Problem]  # every rank draws the whole step and keeps its share
    refill: CountingStream[Problem] | None
    prompts_per_step: int
    rank: int
    world_size: int

    def draw(self) -> list[Problem]:
        """The step's prompts that this rank owns (whole groups: ranks never share a prompt)."""
        problems = [next(self.stream) for _ in range(self.prompts_per_step)]
        share = self.prompts_per_step // self.world_size
        return problems[self.rank * share : (self.rank + 1) * share]


def open_prompts(
    cfg: TrainConfig,
    train_stream: Callable[[int], Iterator[Problem]],
    topo: Topology,
    state: TrainerState,
    rank_state: RankState,
) -> Prompts:
    """The streams, advanced to where a resumed run left them. DAPO refills come from a per-rank
    stream, so ranks never wait on each other's draws."""
    stream = CountingStream(train_stream(cfg.seed), state.stream_drawn)
    refill = (
        CountingStream(train_stream(cfg.seed * 1000 + 1 + topo.rank), rank_state.refill_drawn)
        if cfg.algo.dynamic_sampling
        else None
    )
    return Prompts(
        stream,
        refill,
        cfg.trainer.prompts_per_step,
        topo.rank,
        topo.world_size,
    )
