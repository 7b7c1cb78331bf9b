"""A training run's plumbing, behind the methods the recipe calls: the models and engines, the
prompt streams, the run's typed state, the logs and experiment trackers, stop signals, held-out
evaluations, the bad-step guard, checkpoints and the final save. `train/setup.py` builds one (fresh or resumed).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.errors import RunError, StopRequested
from tepo_cli.core.run_dir import EVALS
from tepo_cli.envs.sampler import Sampler
from tepo_cli.models.critic import Critic
from tepo_cli.models.policy import Policy
from tepo_cli.models.reference import Reference
from tepo_cli.rewards import Reward
from tepo_cli.rollout import RolloutBackend
from tepo_cli.runtime import checkpoint, collective_timeout, finish
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.hooks import RunHooks
from tepo_cli.runtime.metrics import RunLog
from tepo_cli.runtime.resume import log_lengths
from tepo_cli.runtime.rng_and_streams import capture_rng
from tepo_cli.runtime.state import RankState, TrainerState
from tepo_cli.runtime.stop import TIME_UP, StopSignals
from tepo_cli.runtime.time_limit import TimeLimit
from tepo_cli.trackers import Trackers
from tepo_cli.train.feature import Feature
from tepo_cli.train.held_out import held_out_accuracy
from tepo_cli.train.prompt_streams import Prompts


@dataclass
class Models:
    """The trained policy's DeepSpeed engine, the critic's (advantage=gae) and the frozen
    reference (a KL term)."""

    engine: Any
    critic_engine: Any | None
    reference: Reference | None

    @property
    def policy(self) -> Policy:
        return self.engine.module

    @property
    def critic(self) -> Critic | None:
        return None if self.critic_engine is None else self.critic_engine.module

    def engines(self) -> list[Any]:
        return [e for e in (self.engine, self.critic_engine) if e is not None]


@dataclass
class Run:
    cfg: TrainConfig
    run_dir: Path
    topo: Topology
    tokenizer: PreTrainedTokenizerBase
    task: Any  # data.tasks: the training stream and held-out split
    reward: Reward
    sampler: Sampler  # answers or episodes (envs/sampler.py): the rollout and the held-out split's
    models: Models
    backend: RolloutBackend
    prompts: Prompts
    generator: torch.Generator  # the update's minibatch shuffles
    state: TrainerState
    log: RunLog | None  # rank 0 only
    trackers: Trackers = field(default_factory=Trackers)  # logger=[...]; empty off rank 0
    signals: StopSignals = field(default_factory=StopSignals)
    hooks: RunHooks = field(default_factory=RunHooks)  # faults (TEPO_FAULT) in the kill tests
    feature: Feature | None = None  # the objective's own machinery (train/feature.py), or none
    time_limit: TimeLimit = field(init=False)  # trainer.time_limit_minutes

    def __post_init__(self) -> None:
        self.time_limit = self._time_limit()

    def _time_limit(self) -> TimeLimit:
        """trainer.time_limit_minutes's clock, with the answers this rank generates in an
        evaluation and in a step (to estimate an evaluation not yet timed)."""
        cfg, world = self.cfg, self.topo.world_size
        if cfg.trainer.time_limit_minutes is None:
            return TimeLimit(None)
        return TimeLimit(
            cfg.trainer.time_limit_minutes,
            evaluation_answers=lambda: -(-len(self.sampler.held_out_problems(self.task)) // world),
            step_answers=cfg.trainer.prompts_per_step / world * cfg.rollout.n,
        )

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Logs and trackers open, SIGINT/SIGTERM caught (a step finishes, then a checkpoint and
        exit), the rollout engine released at the end; the trackers close with the run's outcome."""
        log = self.log or contextlib.nullcontext()
        with log, self.trackers, self.signals, contextlib.closing(self.backend):
            yield

    def remaining_steps(self) -> Iterator[int]:
        """The steps left to take (all of them, or those after the resumed checkpoint's)."""
        collective_timeout.begin("training step")
        for step in range(self.state.step + 1, self.cfg.trainer.max_steps + 1):
            self.hooks.enter_step(step)
            self.hooks.hold(lambda: self.signals.signum)
            yield step

    def evaluate(self, when: str) -> None:
        """Held-out accuracy `before` the first step (unless resumed) or `after` the last; and,
        resumed at a step whose evaluation the logs lost, that one again."""
        trainer = self.cfg.trainer
        if when == "before" and trainer.eval_before and self.state.step == 0:
            self.state.summary["eval_before"] = self._held_out(0, when)
        if when == "before" and self._evaluation_lost(self.state.step):
            self._held_out(self.state.step, "during")
        if when == "after" and trainer.eval_after:
            self.state.summary["eval_after"] = self._held_out(trainer.max_steps, when)

    def evaluate_during(self, step: int) -> None:
        """Every `trainer.eval_every` steps, except the last (`after` covers it)."""
        if step < self.cfg.trainer.max_steps and self._evaluation_after(step):
            self._held_out(step, "during")

    def _evaluation_lost(self, step: int) -> bool:
        """A finished run extended (trainer.max_steps raised) resumes from its last checkpoint,
        written before its `after` evaluation, so the logs were cut back past that evaluation: an
        `eval_every` step with no record in eval.jsonl is evaluated again (greedy: the same
        answers), so the extended run's curve has every point an uninterrupted one would."""
        every = self.cfg.trainer.eval_every
        if step == 0 or not every or step % every or step >= self.cfg.trainer.max_steps:
            return False
        recorded = False
        if self.topo.is_main:
            evals = self.run_dir / EVALS
            lines = evals.read_text(encoding="utf-8").splitlines() if evals.is_file() else []
            recorded = any(json.loads(line)["step"] == step for line in lines)
        return not collective.from_rank0(recorded)

    def log_step(self, record: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """The step's record and samples into the run's logs, its numbers to the trackers; too
        many skipped optimizer steps in a row (non-finite loss or gradient) end the run."""
        state = self.state
        state.step = record["step"]
        state.step_seconds.append(record["step_seconds"])
        self.time_limit.step_took(record["step_seconds"], record.get("rollout_seconds", 0.0))
        if self.log is not None:
            self.log.step(record, samples)
            note = self._feature_note(record)
            if note is not None:
                self.log.info(note)
        self.trackers.log_step(record)
        state.summary.update(steps=record["step"], final_reward_mean=record["reward_mean"])
        skipped = record["skipped_optimizer_steps"]
        state.bad_steps_in_row = state.bad_steps_in_row + 1 if skipped else 0
        if state.bad_steps_in_row >= self.cfg.trainer.max_bad_steps:
            raise RunError(finish.too_many_bad_steps(self.cfg, record["step"], self.run_dir))

    def _feature_note(self, record: dict[str, Any]) -> str | None:
        """What the run's feature says of a step's record (MPO's modules predicting worse than
        a uniform guess), or None."""
        if self.feature is None:
            return None
        return self.feature.step_note(record, int(self.models.policy.lm.config.vocab_size))

    def checkpoint(self, step: int) -> None:
        """A checkpoint every `trainer.save_every` steps, and after a stop signal or before the
        time limit would pass (then exit)."""
        time_up = step < self.cfg.trainer.max_steps and self.time_limit.next_would_pass(
            self._evaluation_after(step + 1)
        )
        with collective_timeout.phase("stop-signal agreement"):
            signum = self.signals.requested(self.topo.device, time_up)
        every = self.cfg.trainer.save_every
        if not (signum or (every and step % every == 0)):
            return
        self.state.stream_drawn = self.prompts.stream.drawn
        self.state.logs = log_lengths(self.run_dir) if self.topo.is_main else {}
        refill = self.prompts.refill
        rank = RankState(capture_rng(self.generator), refill.drawn if refill is not None else 0)
        models = self.models
        with collective_timeout.phase("checkpoint"):
            saved = checkpoint.save(
                models.engine,
                self.run_dir,
                self.state,
                rank,
                self.topo,
                self.cfg.trainer.keep_checkpoints,
                models.critic_engine,
                self.hooks,
            )
        if signum == TIME_UP:
            said = self.time_limit.said(step, self._evaluation_after(step + 1))
            raise StopRequested(signal.SIGTERM, f"{said}; {_continue(saved, self.run_dir)}")
        if signum:
            raise StopRequested(signum, _stopped(signum, step, saved, self.run_dir))

    def _evaluation_after(self, step: int) -> bool:
        """Whether a held-out evaluation follows `step` (eval_every's, or the one after the last)."""
        trainer, every = self.cfg.trainer, self.cfg.trainer.eval_every
        last = step == trainer.max_steps
        return bool(trainer.eval_after if last else every and step % every == 0)

    def finish(self) -> None:
        """Optimizer state dropped, held-out accuracy after, the final model and summary."""
        collective_timeout.begin("final save")
        for engine in self.models.engines():
            finish.drop_optimizer_state(engine)
        self.evaluate("after")
        summary = self.state.summary
        if self.state.step_seconds:
            summary["median_step_seconds"] = float(np.median(self.state.step_seconds))
        models, topo = self.models, self.topo
        summary.update(finish.rank_checksums(models.engine, models.critic_engine, topo))
        if self.cfg.trainer.save_final:
            summary.update(
                finish.save_final(
                    self.cfg,
                    models.engine,
                    models.critic_engine,
                    self.tokenizer,
                    self.run_dir,
                    topo,
                )
            )
        if self.log is not None:
            finish.write_summary(self.log, summary, self.run_dir)

    def _held_out(self, step: int, when: str) -> float:
        """Held-out accuracy into eval.jsonl and the trackers, at the step it follows."""
        started = time.monotonic()
        with collective_timeout.phase(f"held-out evaluation ({when})"):
            accuracy = held_out_accuracy(
                self.cfg,
                self.sampler,
                self.backend,
                self.tokenizer,
                self.task,
                self.reward,
                self.topo,
                self.log,
                step,
                when,
            )
        self.trackers.log_held_out(step, accuracy)
        self.time_limit.evaluation_took(time.monotonic() - started)
        return accuracy


def _stopped(signum: int, step: int, saved: Path, run_dir: Path) -> str:
    return (
        f"stopped by {signal.Signals(signum).name} after step {step}; {_continue(saved, run_dir)}"
    )


def _continue(saved: Path, run_dir: Path) -> str:
    return (
        f"checkpoint written to {saved}. Continue it with the same command plus "
        f"resume={run_dir} (for a sweep: the same sweep command plus resume=true)."
    )
