"""A sweep (`tepo train -m ...`) checked before Hydra launches it (cli.py).

Two things Hydra does on its own would surprise here:
- a SLURM launcher (`hydra/launcher=slurm` or `submitit_slurm`) on a machine without SLURM ends in
  submitit's 25-line traceback ("Could not detect "srun""); it is refused with one paragraph;
- `--dry-run` would still create the sweep directory and its `multirun.yaml` (Hydra's sweeper
  writes it before any job runs) and, with a SLURM launcher, submit every job. A dry run of a
  sweep validates each job's config in this process instead (the basic launcher, the launcher's
  own keys checked by composing them) and its sweep directory is a temporary one, removed after.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from tepo_cli.core.errors import ConfigError

SLURM_LAUNCHERS = ("slurm", "submitit_slurm")
MULTIRUN_FLAGS = ("-m", "--multirun")


def is_sweep(overrides: list[str]) -> bool:
    return any(a in MULTIRUN_FLAGS for a in overrides)


def launcher_choice(overrides: list[str]) -> str | None:
    """The `hydra/launcher=` a command line chooses (the last one wins, as in Hydra)."""
    chosen = [a.split("=", 1)[1] for a in overrides if a.startswith("hydra/launcher=")]
    return chosen[-1] if chosen else None


def _launcher_override(argument: str) -> bool:
    key = argument.lstrip("+~").split("=", 1)[0]
    return key == "hydra/launcher" or key.startswith("hydra.launcher.")


def check_slurm(overrides: list[str], command: str) -> None:
    """A sweep with a SLURM launcher where SLURM is not installed: one paragraph, not a traceback."""
    launcher = launcher_choice(overrides)
    if not is_sweep(overrides) or launcher not in SLURM_LAUNCHERS or shutil.which("srun"):
        return
    raise ConfigError(
        f"hydra/launcher={launcher} submits each job of the sweep to SLURM, but SLURM's `srun` is "
        f"not on this machine's PATH: run the command on the cluster's login node (with tepo "
        f"installed there, and hydra.launcher.setup naming its environment, e.g. "
        f"'hydra.launcher.setup=[\"source ~/tepo/.venv/bin/activate\"]'), or drop "
        f"hydra/launcher={launcher} to run the jobs here. `tepo {command} -m ... --dry-run` "
        f"validates every job's config on any machine without submitting anything. Nothing was "
        f"run."
    )


def check_launcher_keys(config_name: str, overrides: list[str]) -> None:
    """The launcher overrides of a command line composed on their own: a key the launcher does
    not have (`hydra.launcher.partiton=gpu`) is refused as Hydra would refuse it at launch."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    given = [a for a in overrides if _launcher_override(a)]
    if not given:
        return
    try:
        with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
            compose(config_name, given, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        cause = error.__cause__ or error  # Hydra's own first line is "Could not override ..."
        reason = f"{str(error).splitlines()[0].rstrip('.')} ({str(cause).splitlines()[0]})"
        raise ConfigError(
            f"the sweep's launcher overrides ({' '.join(given)}) do not compose: {reason}. The "
            f"launchers' keys are in conf/hydra/launcher/ and `tepo {config_name} "
            f"hydra/launcher=NAME --cfg hydra` prints them. Nothing was run."
        ) from error


@contextmanager
def dry_sweep(config_name: str, overrides: list[str]) -> Iterator[list[str]]:
    """For a dry run of a sweep: the overrides to launch with (the basic launcher, a temporary
    sweep directory), that directory removed when the jobs are done. check_launcher_keys first."""
    launcher = launcher_choice(overrides)
    kept = [
        a
        for a in overrides
        if not _launcher_override(a) and not a.lstrip("+~").startswith("hydra.sweep.dir=")
    ]
    if launcher not in (None, "basic"):
        print(
            f"tepo {config_name} --dry-run: every job's config is validated here, one after "
            f"another; hydra/launcher={launcher} is not used (nothing is submitted or started).",
            file=sys.stderr,
        )
    scratch = tempfile.mkdtemp(prefix="tepo-dry-sweep-")
    try:
        yield [*kept, f"hydra.sweep.dir={scratch}"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
