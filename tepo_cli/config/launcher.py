"""CPU threads per job when a sweep's launcher runs several jobs at once on one machine.

`trainer.num_threads: null` means "this machine's cores / local ranks" — right for one job at a
time (the basic launcher) and for SLURM, whose allocation already limits the cores a job sees.
Under `hydra/launcher=joblib`, n_jobs worker processes share the machine, so each job gets
cores // n_jobs threads instead; under `hydra/launcher=submitit_local` every job of the sweep
runs at once, and `hydra.launcher.cpus_per_task`, when set, is each job's share. The value is
filled into the validated config, so the run's config.yaml records the threads it used.
"""

from __future__ import annotations

import os
from typing import Any


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parallel_job_threads() -> int | None:
    """Threads for this job under a parallel local launcher; None: keep the usual default."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    launcher: Any = HydraConfig.get().get("launcher") or {}
    target = str(launcher.get("_target_", ""))
    cores = available_cores()
    if target.endswith("JoblibLauncher"):
        return max(1, cores // joblib_workers(launcher.get("n_jobs"), cores))
    if target.endswith("submitit_launcher.LocalLauncher"):
        cpus = launcher.get("cpus_per_task")
        return int(cpus) if cpus else None
    return None


def joblib_workers(n_jobs: int | None, cores: int) -> int:
    """joblib's reading of n_jobs: None is 1, -1 is every core, -2 all but one, and so on."""
    if n_jobs is None or n_jobs == 0:
        return 1
    if n_jobs < 0:
        return max(1, cores + 1 + n_jobs)
    return n_jobs
