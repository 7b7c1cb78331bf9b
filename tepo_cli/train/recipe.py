"""The training recipe: a run, and one step of it, top-down.

A step is docs/design.md's flow, each line a call into the module named after its stage: draw
prompts (train/prompt_streams.py) → rollout and reward (train/sampling.py) → score
(train/experience.py) → the KL in the reward, when on (train/kl_in_reward.py) → advantage
(train/advantage_stage.py) → update (train/update.py) → sync (the rollout back-end) → log
(train/step_records.py) → checkpoint. Set-up and resume live in train/setup.py; the run's
plumbing (logs, stop signals, evaluations, the bad-step guard, checkpoints, the final save) behind
`Run`'s methods in train/run.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.host_allocator import release_free_memory
from tepo_cli.runtime.clock import StepClock
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.hooks import RunHooks
from tepo_cli.train.advantage_stage import estimate
from tepo_cli.train.env_errors import report_env_errors
from tepo_cli.train.experience import Experience, score
from tepo_cli.train.kl_in_reward import charge
from tepo_cli.train.run import Run
from tepo_cli.train.sampling import rollout_and_grade, rollout_seed
from tepo_cli.train.setup import setup_run
from tepo_cli.train.step_records import step_record, step_samples
from tepo_cli.train.update import update


def train(
    cfg: TrainConfig, run_dir: Path, topo: Topology, hooks: RunHooks | None = None
) -> dict[str, Any]:
    """Set up (or resume) a run, evaluate, take the remaining steps, evaluate, save. Returns the
    run's summary (summary.json). `hooks`: what the run calls at its named points (the faults of
    the kill tests); none by default."""
    run = setup_run(cfg, run_dir, topo, hooks or RunHooks())
    with run.session():  # logs open, stop signals caught, the rollout engine closed at the end
        run.evaluate("before")
        for step in run.remaining_steps():
            record, samples = take_step(run, step)
            run.log_step(record, samples)  # metrics.jsonl, samples.jsonl, the bad-step guard
            run.evaluate_during(step)  # every trainer.eval_every steps
            run.checkpoint(step)  # every trainer.save_every steps, and on SIGINT/SIGTERM
        run.finish()  # held-out accuracy after, final/, summary.json
    return run.state.summary


def take_step(run: Run, step: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One optimizer step on this rank. Returns its metrics record (over all ranks) and the
    samples it logs."""
    cfg, models, clock = run.cfg, run.models, StepClock()
    problems = run.prompts.draw()
    seed = rollout_seed(cfg.seed, step, run.topo.rank)
    groups = rollout_and_grade(
        cfg,
        run.sampler,
        run.backend,
        run.tokenizer,
        problems,
        run.reward,
        run.prompts.refill,
        seed,
        clock,
        run.hooks,
    )
    report_env_errors(groups.env_errors, f"step {step}", run.log)  # gathered on rank 0, if any
    with clock("sync"):  # the engine's device memory to the update until the sync (vllm's sleep)
        run.backend.sleep()
        release_free_memory()  # what generation freed leaves the allocator: no drift across phases
    scores = score(cfg, models.policy, models.reference, groups, clock)
    kl = charge(cfg, groups.batch, scores, run.state)  # None unless algo.kl_reward_coef > 0
    advantages = estimate(cfg, groups, models.critic, clock, kl)
    experience = Experience.of(groups, scores, advantages)
    with clock("update"):
        metrics = update(
            cfg, models.engine, experience, run.generator, models.critic_engine, step, run.hooks
        )
    with clock("sync"):
        run.backend.sync(models.policy.lm)
        release_free_memory()  # ... and what the update freed
    record = step_record(cfg, step, models.engine, experience, metrics, clock)
    return record, step_samples(cfg, step, experience)
