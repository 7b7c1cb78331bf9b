"""A run's feature: the one way an objective's own machinery (MPO's multi-token-prediction
modules, tepo_cli/mtp/hook.py) enters `tepo train`. `feature_of(cfg)` is None for an objective
without one; the job, the rank checks and the set-up take what it returns and call its hooks."""

from __future__ import annotations

from tepo_cli.config.schema import TrainConfig
from tepo_cli.mtp.hook import MtpHook

Feature = MtpHook  # the one feature so far; a second would make this a Protocol


def feature_of(cfg: TrainConfig) -> Feature | None:
    """The run's feature, or None."""
    return MtpHook.of(cfg)
