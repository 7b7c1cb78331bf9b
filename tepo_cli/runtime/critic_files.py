"""The critic of `advantage=gae`: built at start-up, saved beside `final/` when asked.

It is training state like the policy (its own DeepSpeed engine, in every checkpoint under
`critic/`); `final/` never holds it. With `advantage.save_critic=true` the trained critic is also
written to `<run dir>/critic/` (a Hugging Face decoder plus `value_head.safetensors`), which
`advantage.critic_path` can start a later run from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.models.critic import Critic
from tepo_cli.models.loading import resolve_dtype
from tepo_cli.models.policy import Policy
from tepo_cli.runtime.atomic_dir import write_directory
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.engine import consolidated_state_dict


def build_critic(cfg: TrainConfig, policy: Policy, topo: Topology) -> Critic:
    """A copy of the policy's decoder with a value head, or one loaded from critic_path."""
    settings = cfg.advantage
    if settings.critic_path is None:
        return Critic.from_policy(policy.lm, policy.share_prompts, policy.packing)
    try:
        return Critic.from_path(
            settings.critic_path,
            dtype=resolve_dtype(cfg.model.dtype, topo.device),
            device=topo.device,
            share_prompts=policy.share_prompts,
            packing=policy.packing,
            trust_remote_code=cfg.model.trust_remote_code,
        )
    except OSError as error:
        raise ConfigError(
            f"advantage.critic_path={settings.critic_path!r}: cannot load a model from it "
            f"({error}). Give a directory written by save_pretrained (a model, or a run's "
            "critic/), or leave it null to start the critic as a copy of the policy."
        ) from None


def save_critic(critic_engine: Any, target: Path, topo: Topology) -> None:
    """Collective under ZeRO-3; rank 0 writes `target` through a staging directory."""
    critic: Critic = critic_engine.module
    state = consolidated_state_dict(critic_engine)
    if not topo.is_main:
        return
    write_directory(target, lambda staging: critic.save(staging, state), "the critic")
