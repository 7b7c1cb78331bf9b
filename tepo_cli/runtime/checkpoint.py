"""Resumable checkpoints under <run dir>/checkpoints/step_NNNNNNNN.

Written into a hidden staging directory, sealed by a manifest (size and sha256 of every file),
then renamed into place: a checkpoint either exists whole or not at all, and one torn or
corrupted on disk afterwards fails its manifest check, so the previous good one is used.
Each holds the DeepSpeed engine states (weights — with LoRA only the adapters' —, optimizer,
schedule, ZeRO partitions: the policy's under `engine/`, the critic's under `critic/` with advantage=gae), one file
of random-number states and stream positions per rank, and the trainer's own state (step,
summary so far, byte lengths of the run's log files) as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tepo_cli.core import collective
from tepo_cli.core.atomic_write import replace
from tepo_cli.core.errors import RunError
from tepo_cli.core.library_warnings import library_prints_to_log
from tepo_cli.core.run_dir import CHECKPOINTS
from tepo_cli.runtime.distributed import Topology
from tepo_cli.runtime.hooks import NO_HOOKS, RunHooks
from tepo_cli.runtime.state import RankState, TrainerState

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
ENGINE_TAG = "engine"
CRITIC_TAG = "critic"
_NAME = re.compile(r"^step_(\d{8})$")
_RANK_IN_NAME = re.compile(r"(?:^|_)pp_rank_(\d+)_|^rank_(\d+)\.pt$")


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / CHECKPOINTS


def sealed_checkpoints(run_dir: Path) -> list[Path]:
    """Sealed checkpoint directories, newest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def save(
    engine: Any,
    run_dir: Path,
    trainer_state: TrainerState,
    rank_state: RankState,
    topo: Topology,
    keep: int,
    critic_engine: Any = None,
    hooks: RunHooks = NO_HOOKS,
) -> Path:
    """Collective: every rank calls it, after step `trainer_state.step`. Returns the sealed
    directory; RunError if a write failed."""
    step = trainer_state.step
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:08d}"
    staging = root / f".step_{step:08d}.staging"
    if topo.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
    _barrier()
    error = _attempt(lambda: _write_rank_parts(engine, critic_engine, staging, rank_state, topo))
    hooks.reached("checkpoint")
    if error is None and topo.is_main:
        error = _attempt(lambda: _write_trainer_state(staging, trainer_state))
    error = _first_error(error, topo)  # also: every rank's files are written now
    digests: dict[str, dict[str, Any]] = {}
    if error is None:
        error = _attempt(lambda: digests.update(_digest_own(staging, topo)))
    digests, error = _gather_digests(digests, error, topo)
    if error is None and topo.is_main:
        error = _attempt(lambda: _seal(staging, final, trainer_state.step, digests))
    error = _first_error(error, topo)
    if error is not None:
        if topo.is_main:
            shutil.rmtree(staging, ignore_errors=True)
        previous = sealed_checkpoints(run_dir)
        kept = (
            f"the previous checkpoint {previous[0]} is intact"
            if previous
            else "no earlier checkpoint exists"
        )
        raise RunError(
            f"could not write the checkpoint of step {step} under {root}: {error}. Nothing partial "
            f"was left behind and {kept}; free some disk space (or fix the permissions) and "
            f"continue with resume=true."
        )
    if topo.is_main:
        for stale in sealed_checkpoints(run_dir)[keep:]:
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    return final


def _write_rank_parts(
    engine: Any, critic_engine: Any, staging: Path, rank_state: RankState, topo: Topology
) -> None:
    _save_engine(engine, staging)
    if critic_engine is not None:
        critic_engine.save_checkpoint(str(staging), tag=CRITIC_TAG, save_latest=False)
    torch.save(rank_state.to_dict(), staging / f"rank_{topo.rank:05d}.pt")


def owner_rank(name: str, world_size: int) -> int:
    """The rank that hashes a checkpoint file when it is sealed and verifies it on resume: the
    one that wrote it, read from DeepSpeed's and tepo's per-rank names (`..zero_pp_rank_<r>_..`,
    `rank_<r>.pt`); rank 0 for the rest (ZeRO 0-2's model states, the trainer state). Each rank
    reads back only what it wrote, instead of rank 0 reading every rank's shards while the
    others wait."""
    match = _RANK_IN_NAME.search(Path(name).name)
    rank = int(match.group(1) or match.group(2)) if match else 0
    return rank if rank < world_size else 0


def _write_trainer_state(staging: Path, trainer_state: TrainerState) -> None:
    (staging / TRAINER_STATE).write_text(json.dumps(trainer_state.to_json()))


def _digest_own(staging: Path, topo: Topology) -> dict[str, dict[str, Any]]:
    """Size and sha256 (fsyncing each file) of the staged files this rank owns."""
    names = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
    return {
        name: _digest(staging / name)
        for name in names
        if owner_rank(name, topo.world_size) == topo.rank
    }


def _gather_digests(
    own: dict[str, dict[str, Any]], error: str | None, topo: Topology
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Every rank's digests (and the first error of any rank), on every rank."""
    if not collective.multi_rank():
        return own, error
    parts = collective.from_every_rank((own, error))
    merged = {name: entry for digests, _ in parts for name, entry in digests.items()}
    return merged, next((e for _, e in parts if e is not None), None)


def _seal(staging: Path, final: Path, step: int, digests: dict[str, dict[str, Any]]) -> None:
    """Rank 0: the manifest of every rank's digests, then the atomic rename."""
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    entries = dict(digests)
    for path in files:  # nothing a rank did not own escapes the manifest
        entries.setdefault(str(path.relative_to(staging)), _digest(path))
    manifest = {"files": dict(sorted(entries.items())), "step": step}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    # over the same step saved again (e.g. a stop right after a periodic save)
    replace(staging, final, durable=True)


def verify(checkpoint: Path, topo: Topology | None = None) -> str | None:
    """Why the checkpoint cannot be used, or None when every file matches its manifest. With
    `topo`, only the files that rank owns (`owner_rank`) are read back."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its manifest is missing or unreadable"
    for name, expected in files.items():
        if topo is not None and owner_rank(name, topo.world_size) != topo.rank:
            continue
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["size"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {expected['size']}"
        if _digest(path)["sha256"] != expected["sha256"]:
            return f"{name} does not match its sha256 checksum"
    return None


def latest_good(run_dir: Path, warn: Callable[[str], None], topo: Topology) -> Path | None:
    """Collective: the newest checkpoint every rank verifies (each its own files), the same on
    all ranks; each unusable newer one is reported through `warn` on rank 0."""
    candidates = [str(p) for p in sealed_checkpoints(run_dir)] if topo.is_main else []
    candidates = collective.from_rank0(candidates)
    for name in candidates:
        checkpoint = Path(name)
        problem = _first_error(verify(checkpoint, topo), topo)
        if problem is None:
            return checkpoint
        if topo.is_main:
            warn(f"checkpoint {checkpoint} is unusable ({problem}); falling back to the one before")
    return None


def remove_staging(run_dir: Path) -> list[Path]:
    """Staging directories left by a run killed while writing a checkpoint."""
    root = checkpoint_root(run_dir)
    leftovers = sorted(root.glob(".step_*.staging")) if root.is_dir() else []
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)
    return leftovers


def read_trainer_state(checkpoint: Path) -> TrainerState:
    """The trainer's own state saved with a checkpoint (step, summary, log lengths)."""
    return TrainerState.from_json(json.loads((checkpoint / TRAINER_STATE).read_text()))


def load(
    engine: Any, checkpoint: Path, topo: Topology, critic_engine: Any = None
) -> tuple[TrainerState, RankState]:
    """Collective: restores the engine(s); returns (trainer state, this rank's state)."""
    rank_file = checkpoint / f"rank_{topo.rank:05d}.pt"
    if not rank_file.is_file():
        raise RunError(
            f"checkpoint {checkpoint} has no state for rank {topo.rank}: it was written by a run "
            f"with a different number of ranks (trainer.nproc)."
        )
    if critic_engine is not None and not (checkpoint / CRITIC_TAG).is_dir():
        raise RunError(
            f"checkpoint {checkpoint} has no critic: it was written by a run without advantage=gae."
        )
    with library_prints_to_log():  # DeepSpeed's loader prints each state it reads
        engine.load_checkpoint(
            str(checkpoint),
            tag=ENGINE_TAG,
            load_module_strict=not _base_weights_frozen(engine),
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
        if critic_engine is not None:
            critic_engine.load_checkpoint(
                str(checkpoint),
                tag=CRITIC_TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
    rank_state = RankState.from_dict(torch.load(rank_file, weights_only=False))
    return read_trainer_state(checkpoint), rank_state


def _save_engine(engine: Any, staging: Path) -> None:
    if not _base_weights_frozen(engine):
        engine.save_checkpoint(str(staging), tag=ENGINE_TAG, save_latest=False)
        return
    # DeepSpeed leaves out the frozen parameters it names once (`named_parameters()`), not their
    # tied second names (lm_head.weight, the kernel head's weight): those go too, meanwhile.
    frozen = {
        name
        for name, p in engine.module.named_parameters(remove_duplicate=False)
        if not p.requires_grad
    }

    def drop_frozen(module: Any, state: dict[str, Any], prefix: str, metadata: Any) -> None:
        for name in frozen:
            state.pop(prefix + name, None)

    hook = engine.module.register_state_dict_post_hook(drop_frozen)
    try:
        engine.save_checkpoint(
            str(staging), tag=ENGINE_TAG, save_latest=False, exclude_frozen_parameters=True
        )
    finally:
        hook.remove()


def _base_weights_frozen(engine: Any) -> bool:
    """With LoRA every frozen weight is the base model's, which a resumed run reads again from
    where it came from: checkpoints hold only the adapters (and the policy's attached modules)
    and their optimizer state. (Frozen attached modules, warmed up once, are kept.)"""
    policy = engine.module
    return policy.adapted and (policy.attached is None or policy.attached.trainable)


def _digest(path: Path) -> dict[str, Any]:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            sha.update(block)
        os.fsync(handle.fileno())
    return {"size": path.stat().st_size, "sha256": sha.hexdigest()}


def _attempt(action: Callable[[], None]) -> str | None:
    try:
        action()
    except (OSError, RuntimeError) as error:  # torch.save reports a failed write as RuntimeError
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return None


def _first_error(error: str | None, topo: Topology) -> str | None:
    """Every rank learns whether any rank failed, so they all raise (or go on) together."""
    return next((e for e in collective.from_every_rank(error) if e is not None), None)


def _barrier() -> None:
    collective.barrier()
