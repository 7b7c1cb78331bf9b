"""The end of a run: the optimizer state dropped, rank checksums, the final model (and the
policy's attached modules, the critic) saved whole, summary.json and the console report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.run_dir import CRITIC, FINAL, SUMMARY
from tepo_cli.models.policy import Policy
from tepo_cli.runtime import checkpoint
from tepo_cli.runtime.atomic_dir import write_directory
from tepo_cli.runtime.critic_files import save_critic
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.engine import consolidated_state_dict
from tepo_cli.runtime.guards import torch_optimizer
from tepo_cli.runtime.lora_files import save_adapter
from tepo_cli.runtime.metrics import RunLog


def drop_optimizer_state(engine: Any) -> None:
    """No optimizer step follows: the AdamW moments (2x the weights) go before the final
    evaluation and save, which then run in the memory of inference plus the weights."""
    torch_optimizer(engine).state.clear()


def rank_checksums(engine: Any, critic_engine: Any, topo: Topology) -> dict[str, list[float]]:
    """Every rank's parameter checksum (several ranks only): data-parallel ranks must hold
    identical weights."""
    if topo.world_size == 1:
        return {}
    sums = {"rank_param_checksums": _checksums(engine, topo)}
    if critic_engine is not None:
        sums["critic_rank_param_checksums"] = _checksums(critic_engine, topo)
    return sums


def save_final(
    cfg: TrainConfig,
    engine: Any,
    critic_engine: Any,
    tokenizer: Any,
    run_dir: Path,
    topo: Topology,
) -> dict[str, str]:
    """final/ (a transformers model directory; with LoRA the adapter and final/merged), the
    policy's attached modules (their own files) and the critic; returns their paths for the
    summary. Collective: every rank calls it."""
    if engine.module.adapted:
        saved = save_adapter(cfg, engine, tokenizer, run_dir / FINAL, topo)
    else:
        saved = {"final_model": str(run_dir / FINAL)}
        _save_model(engine, tokenizer, run_dir / FINAL, topo)
    if engine.module.attached is not None:
        saved.update(engine.module.attached.save_beside_final(engine, cfg, run_dir, topo))
    if critic_engine is not None and cfg.advantage.save_critic:
        save_critic(critic_engine, run_dir / CRITIC, topo)
        saved["critic"] = str(run_dir / CRITIC)
    return saved


def write_summary(log: RunLog, summary: dict[str, Any], run_dir: Path) -> None:
    """summary.json, then the before -> after accuracy and where the model is, on the console."""
    (run_dir / SUMMARY).write_text(json.dumps(summary, indent=2))
    before, after = summary.get("eval_before"), summary.get("eval_after")
    if before is not None and after is not None:
        log.info(
            f"held-out accuracy: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)"
        )
    if "final_model" in summary:
        log.info(
            f"final model: {summary['final_model']} "
            f"(score it: tepo eval model.path={summary['final_model']})"
        )


def too_many_bad_steps(cfg: TrainConfig, step: int, run_dir: Path) -> str:
    good = checkpoint.sealed_checkpoints(run_dir)
    kept = f"the last good checkpoint is {good[0]}" if good else "no checkpoint was written yet"
    return (
        f"{cfg.trainer.max_bad_steps} steps in a row (up to step {step}) had a non-finite loss or "
        f"gradient and were skipped (trainer.max_bad_steps); {kept}. Lower trainer.lr, check "
        f"the rewards and advantages in metrics.jsonl, or raise trainer.max_bad_steps."
    )


def _checksums(engine: Any, topo: Topology) -> list[float]:
    if engine.zero_optimization_stage() == 3:
        return []  # parameters are partitioned; there is nothing identical to compare
    with torch.no_grad():
        local = sum(p.double().sum() + p.double().pow(2).sum() for p in engine.module.parameters())
    return collective.from_every_rank(float(local))


def _save_model(engine: Any, tokenizer: Any, target: Path, topo: Topology) -> None:
    """save_pretrained into a staging directory renamed into place (never a half-written model)."""
    policy: Policy = engine.module
    consolidated = consolidated_state_dict(engine)
    if not topo.is_main:
        return
    state_dict = None if consolidated is None else policy.hf_state_dict(consolidated)

    def write(staging: Path) -> None:
        policy.lm.save_pretrained(staging, state_dict=state_dict)
        tokenizer.save_pretrained(staging)

    write_directory(target, write, "the final model")
