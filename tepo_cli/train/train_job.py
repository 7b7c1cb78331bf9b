"""`tepo train`: validate the composed config, then run (or re-launch as several ranks)."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tepo_cli.config.added_keys import check_added_keys
from tepo_cli.config.schema import TrainConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.core import job_dirname  # noqa: F401  (registers the sweep sub-directory's resolver)
from tepo_cli.core.dry_run import dry_run
from tepo_cli.core.errors import ConfigError, RunError, StopRequested
from tepo_cli.core.run_dir import CONFIG, METRICS, discard_if_unused
from tepo_cli.core.run_status import write_status
from tepo_cli.train.feature import Feature, feature_of

if TYPE_CHECKING:
    from tepo_cli.runtime.device_choice import DeviceChoice
    from tepo_cli.runtime.distributed import Topology


def train_job(cfg: DictConfig) -> None:
    """Run the job; a failure ends it with its exit code and one paragraph, and the run's
    status.json says how it ended wherever the run had started."""
    from tepo_cli.runtime import faults
    from tepo_cli.runtime.lifetime import follow_train_process
    from tepo_cli.runtime.run_lock import RunDirInUse

    hydra_cfg = HydraConfig.get()
    job = _Job(Path(hydra_cfg.runtime.output_dir))
    follow_train_process()  # a rank of `trainer.nproc=N`: it ends when `tepo train` ends
    hooks = faults.from_env()  # the run's hooks: TEPO_FAULT's faults (the kill tests), or none
    try:
        job.run(cfg, hydra_cfg, hooks)
    except RunDirInUse as error:  # the directory and its files are the live run's
        _fail(job.run_dir, False, "failed", f"tepo train: {error}", 2)
    except ConfigError as error:
        if not job.status_owner:  # refused before the run started: no output left behind
            discard_if_unused(job.run_dir)
        _fail(job.run_dir, job.status_owner, "failed", f"tepo train: {error}", 2)
    except RunError as error:
        _fail(job.run_dir, job.status_owner, "failed", f"tepo train: {error}", 1)
    except StopRequested as error:
        code = 128 + error.signum
        _fail(job.run_dir, job.status_owner, "interrupted", f"tepo train: {error}", code)
    except Exception as error:
        if job.config is not None and job.config.trainer.nproc > 1:
            _fail_if_timed_out(job.run_dir, job.status_owner, job.config, error, hooks.step)
        if job.status_owner:
            write_status(job.run_dir, "failed", error=repr(error))
        raise
    finally:
        distributed = sys.modules.get("tepo_cli.runtime.distributed")
        if distributed is not None:  # else no rank was set up: nothing to end, torch not loaded
            distributed.teardown()
        if job.lock is not None:
            job.lock.release()


@dataclass
class _Job:
    """One `tepo train` process's part: what its failure handling needs to know of it."""

    run_dir: Path
    config: TrainConfig | None = None
    status_owner: bool = False  # this process wrote status.json "running": it writes the end
    lock: Any = None  # the run directory's lock, held until the job returns or dies

    def run(self, cfg: DictConfig, hydra_cfg: Any, hooks: Any) -> None:
        """The checks that can refuse the command, then this process's part: nothing more
        (`--dry-run`, a finished run), the launcher of N ranks, or a rank that trains."""
        config = self.config = load_train_config(cfg, hydra_cfg.runtime.choices)
        check_added_keys(hydra_cfg.overrides.task, hydra_cfg.runtime.choices)
        # torch from here on: a config refused above never pays its import
        from tepo_cli.runtime.device_choice import apply_device_choice, choose_device
        from tepo_cli.runtime.run_lock import hold_run_dir, takes_the_lock

        device = choose_device(config.trainer.device)
        apply_device_choice(device)  # before anything imports DeepSpeed (it picks its device once)
        dtype_name = config.model.dtype
        _settle_precision(config, device.type)
        feature = feature_of(config)
        feature_line = feature.settle() if feature is not None else None
        _check_registered_names(config)
        if dry_run(config, "train"):
            _say_precision(dtype_name, device.type, config.model.weight_rounding)
            _say(feature_line)
            discard_if_unused(self.run_dir)
            return
        if config.resume and _finished_already(self.run_dir, config):
            return  # only read: a finished run's directory stays as it was
        if takes_the_lock():
            self.lock = hold_run_dir(self.run_dir)  # one writer
        from tepo_cli.runtime import distributed

        if config.trainer.nproc > 1 and not distributed.launched_by_launcher():
            _relaunch(config, hydra_cfg, self.run_dir, device.type)
            return
        topo = _join_ranks(config, device, feature)
        if topo.is_main:
            _say_precision(dtype_name, device.type, config.model.weight_rounding)
            _say(feature_line)
        self._train(config, topo, hooks)

    def _train(self, config: TrainConfig, topo: Topology, hooks: Any) -> None:
        """This rank's training, the run directory prepared and its status kept by rank 0."""
        from tepo_cli.core.library_warnings import warnings_to_log
        from tepo_cli.train.recipe import train

        _prepare_on_rank0(config, self.run_dir, topo)
        if topo.is_main:
            write_status(self.run_dir, "running")
            self.status_owner = True
        with warnings_to_log("train"):
            train(config, self.run_dir, topo, hooks)
        if self.status_owner:
            write_status(self.run_dir, "finished")


def _settle_precision(config: TrainConfig, device_type: str) -> None:
    """`model.dtype=auto` becomes the dtype this machine trains in (models/precision.py), said
    once the config has passed every check that can refuse it (`_say_precision`) and written to
    the run's config.yaml, so a resume on a machine that would
    choose otherwise is refused rather than continued in another precision."""
    import torch

    from tepo_cli.models.precision import resolve_dtype

    name = config.model.dtype
    if name == "auto":
        dtype = resolve_dtype(name, torch.device(device_type))
        config.model.dtype = str(dtype).removeprefix("torch.")  # type: ignore[assignment]


def _finished_already(run_dir: Path, config: TrainConfig) -> bool:
    """A resumed job whose run already took all its steps has nothing to do: a sweep re-run with
    resume=true after an interruption skips its finished jobs (their files stay as they were)."""
    from tepo_cli.core.run_status import effective_state

    previous = run_dir / CONFIG
    if effective_state(run_dir) != "finished" or not previous.is_file():
        return False
    steps = (OmegaConf.load(previous).get("trainer") or {}).get("max_steps")
    if steps != config.trainer.max_steps:
        return False  # trainer.max_steps raised: the run goes on from its last checkpoint
    print(
        f"tepo train: {run_dir} finished all {steps} steps already: nothing to resume, skipped",
        file=sys.stderr,
    )
    return True


def _relaunch(config: TrainConfig, hydra_cfg: Any, run_dir: Path, device_type: str) -> None:
    """`trainer.nproc=N` without a launcher: run this job again as N ranks under the deepspeed
    launcher, and exit with its code when it failed."""
    from tepo_cli.config.launcher import parallel_job_threads
    from tepo_cli.runtime import distributed

    overrides = list(hydra_cfg.overrides.task)
    explicit = any(o.lstrip("+~").startswith("trainer.num_threads=") for o in overrides)
    code = distributed.relaunch(
        config.trainer.nproc,
        overrides,
        run_dir,
        None if explicit else parallel_job_threads(),
        device_type,
    )
    if code:
        sys.exit(code)


def _join_ranks(config: TrainConfig, device: DeviceChoice, feature: Feature | None) -> Topology:
    """This process as a rank: the checks that need no group (the feature's model check among
    them), then its place in the group (one rank, or the launcher's), on the device
    `trainer.device` chose."""
    from tepo_cli.runtime import collective_timeout, distributed, thread_wait

    if feature is not None:
        feature.check_model()
    distributed.check_launched_world(config.trainer.nproc)
    collective_timeout.begin("start-up")
    if os.environ.get("RANK", "0") == "0":
        print(f"tepo train: {device.reason}", file=sys.stderr)
        busy = thread_wait.start_line(os.environ)
        if busy:
            print(f"tepo train: {busy}", file=sys.stderr)
    return distributed.setup_topology(
        config.trainer.num_threads, device.type, config.trainer.collective_timeout_s
    )


def _check_registered_names(config: TrainConfig) -> None:
    """The rollout back-end, the objective (after the plugins' import), the benchmark, the grader
    and the trackers exist (and the packages they need): one paragraph naming the known ones
    otherwise, before anything heavy starts."""
    from tepo_cli.algos.plugins import load_objectives
    from tepo_cli.benchmarks import check_benchmark
    from tepo_cli.envs import environment
    from tepo_cli.rollout import check_backend
    from tepo_cli.trackers import check_trackers

    load_objectives(config.plugins, config.algo.name)  # imports the plugins first
    environment(config.env.name)  # a plugin's environment is registered by now
    check_backend(config.rollout)
    check_benchmark(config.benchmark, config.reward)
    check_trackers(config.logger)


def _prepare_on_rank0(config: TrainConfig, run_dir: Path, topo: Topology) -> None:
    """Rank 0 checks and prepares the run directory, then tells every rank how it went: a
    refusal there (an earlier run in the directory, a resume with another config) stops all
    ranks at once with the same paragraph, instead of leaving the others, possibly on other
    nodes, waiting in their first collective until its timeout."""
    outcome: list[tuple[str, str] | None] = [None]
    if topo.is_main:
        try:
            _prepare_run_dir(config, run_dir, topo.device.type)
        except (ConfigError, RunError) as error:
            outcome = [(type(error).__name__, str(error))]
        except OSError as error:
            outcome = [("RunError", f"could not prepare the run directory {run_dir}: {error}")]
    from tepo_cli.core import collective

    outcome = collective.from_rank0(outcome)
    if outcome[0] is not None:
        kind, message = outcome[0]
        raise (ConfigError if kind == "ConfigError" else RunError)(message)


def _say_precision(name: str, device_type: str, rounding: str) -> None:
    """The start line naming the precision and why, and the slow-bf16 paragraph where due."""
    from tepo_cli.models.precision import precision_line, slow_bf16_warning

    print(f"tepo train: {precision_line(name, device_type, rounding)}", file=sys.stderr)
    warning = slow_bf16_warning(name, device_type)
    if warning:
        print(f"tepo train: {warning}", file=sys.stderr)


def _say(feature_line: str | None) -> None:
    """The feature's start line (MPO's: how long its warm-up runs and why). A resume skips the
    warm-up (the checkpoint holds the modules), but the line still says what a fresh start of
    this config would do."""
    if feature_line is not None:
        print(f"tepo train: {feature_line}", file=sys.stderr)


def _auto_as_it_was(previous: dict[str, Any], device_type: str) -> dict[str, Any]:
    """A run started before `model.dtype=auto` was settled at start recorded "auto", which then
    meant float32 on the CPU and bfloat16 on CUDA: compared as that dtype."""
    model = previous.get("model")
    if isinstance(model, dict) and model.get("dtype") == "auto":
        settled = "bfloat16" if device_type == "cuda" else "float32"
        return {**previous, "model": {**model, "dtype": settled}}
    return previous


def _prepare_run_dir(config: TrainConfig, run_dir: Path, device_type: str) -> None:
    """Check a resumed run's config against its own; refuse to start afresh over an earlier run."""
    from tepo_cli.runtime import checkpoint, resume

    current = config.model_dump(mode="json")
    previous = resume.read_config(run_dir)
    if config.resume:
        if previous is not None:
            resume.check_same_run(_auto_as_it_was(previous, device_type), current, run_dir)
    elif checkpoint.sealed_checkpoints(run_dir) or _has_steps(run_dir):
        raise ConfigError(
            f"{run_dir} already holds a training run (metrics.jsonl or checkpoints/). Continue it "
            f"with resume=true, or give this run another directory (hydra.run.dir=...)."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(OmegaConf.to_yaml(current))


def _has_steps(run_dir: Path) -> bool:
    metrics = run_dir / METRICS
    return metrics.is_file() and metrics.stat().st_size > 0


def _fail_if_timed_out(
    run_dir: Path, owner: bool, config: TrainConfig, error: Exception, step: int
) -> None:
    """A collective that waited past `trainer.collective_timeout_s` ends this rank with one
    paragraph (which rank, which phase) instead of a traceback from inside torch.distributed."""
    from tepo_cli.runtime import collective_timeout

    if not collective_timeout.timed_out(error):
        return
    message = collective_timeout.timeout_message(
        int(os.environ.get("RANK", "0")),
        config.trainer.nproc,
        config.trainer.collective_timeout_s,
        step,
        error,
    )
    if owner:
        write_status(run_dir, "failed")
    print(f"tepo train: {message}", file=sys.stderr, flush=True)
    # Not sys.exit: the process group's transport threads still wait on the missing rank, and
    # tearing them down at interpreter exit aborts the process (std::terminate, SIGABRT) instead
    # of ending it with this exit code. Nothing of the run is left to save after a timeout.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(1)


def _fail(run_dir: Path, owner: bool, state: str, message: str, code: int) -> None:
    if owner:
        write_status(run_dir, state)
    print(message, file=sys.stderr)
    sys.exit(code)
