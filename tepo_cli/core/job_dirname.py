"""The name of a sweep job's directory: `hydra.sweep.subdir` in conf/train.yaml and conf/eval.yaml
is `${hydra.job.num}_${tepo_job_dirname:${hydra.job.override_dirname}}`.

Hydra's `override_dirname` is the job's overrides joined (`algo=mpo,seed=1`) and keeps their
values as written: a path (`reward.path=/home/me/rewards/parity.py`) would nest the job's run
directory six levels down, where `tepo report` does not look for runs, and a long one would pass
the 255-byte limit of a file name. The name keeps every override readable with '/' as '_', and a
name past LIMIT bytes is cut and ends with a hash of the whole, so jobs still differ.
"""

from __future__ import annotations

import hashlib

from omegaconf import OmegaConf

RESOLVER = "tepo_job_dirname"
LIMIT = 200  # bytes; file names may have 255, and Hydra prefixes the job number


def job_dirname(override_dirname: str) -> str:
    name = override_dirname.replace("/", "_")
    if len(name.encode()) <= LIMIT:
        return name
    digest = hashlib.sha256(override_dirname.encode()).hexdigest()[:12]
    head = name.encode()[: LIMIT - len(digest) - 1].decode(errors="ignore")
    return f"{head}_{digest}"


if not OmegaConf.has_resolver(RESOLVER):
    # at import: Hydra's launchers (joblib, submitit) resolve the sub-directory in the job's own
    # process, which imports the job function's module (train/train_job.py, eval/eval_job.py) and this one
    OmegaConf.register_new_resolver(RESOLVER, job_dirname)
