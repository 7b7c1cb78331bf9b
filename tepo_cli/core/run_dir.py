"""The layout of a run directory (outputs/train/... and outputs/eval/...), named in one place.

config.yaml         the validated config the run started with (resume checks it)
status.json         running / finished / failed / interrupted (core/run_status.py)
metrics.jsonl       one record per training step (and per MTP warm-up step)
samples.jsonl       logged completions (train) or every graded sample (eval, resumable)
eval.jsonl          held-out evaluations during training
eval_samples.jsonl  each held-out evaluation's graded answers (single-turn tasks)
summary.json        the run's outcome
checkpoints/        step_NNNNNNNN/, each sealed by manifest.json (runtime/checkpoint.py)
final/              the trained model, a transformers directory
mtp_modules.safetensors   MPO's MTP modules (future=mtp)
critic/             the critic (advantage=gae, advantage.save_critic)
.hydra/             Hydra's own record of the command (config.yaml, overrides.yaml)
tensorboard/ mlflow/ wandb/ trackio/   the experiment trackers of `logger=[...]` (tepo_cli/trackers)
"""

from __future__ import annotations

import shutil
from pathlib import Path

CONFIG = "config.yaml"
STATUS = "status.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
EVALS = "eval.jsonl"
EVAL_SAMPLES = "eval_samples.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
FINAL = "final"
CRITIC = "critic"
HYDRA = ".hydra"

# The training run's append-only logs, in the order RunLog opens them (resume cuts them back).
LOG_FILES = (METRICS, SAMPLES, EVALS, EVAL_SAMPLES)

# Hydra overrides that keep a process from writing .hydra/ and train.log: every rank but the one
# that writes the run's outputs (the trainer.nproc relaunch passes them; cli.py adds them on ranks
# other than 0 whatever the launch command says).
NO_HYDRA_OUTPUTS = ("hydra.output_subdir=null", "hydra/job_logging=stdout")


def discard_if_unused(run_dir: Path, stop_at: Path | None = None) -> bool:
    """Remove a run directory that holds nothing but what Hydra writes before the job starts
    (`.hydra/` and an empty `<job>.log`) and the run's lock file: a run refused at start-up
    leaves no output behind. Empty parents go too (`outputs/train/<date>/`), up to `stop_at`
    (default: the working directory). A directory holding anything else — an earlier run's files, a resumed run's — is kept."""
    if not run_dir.is_dir():
        return False
    for entry in run_dir.iterdir():
        hydra_record = entry.name == HYDRA and entry.is_dir()
        empty_log = entry.suffix == ".log" and entry.is_file() and entry.stat().st_size == 0
        lock = entry.name == ".tepo.lock"  # runtime/run_lock.py: this run's own, taken at start
        if not (hydra_record or empty_log or lock):
            return False
    shutil.rmtree(run_dir)
    stop = (stop_at or Path.cwd()).resolve()
    parent = run_dir.resolve().parent
    while parent != stop and stop in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
    return True
