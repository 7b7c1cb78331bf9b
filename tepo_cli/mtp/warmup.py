"""The MTP modules' warm-up before RL: the backbone frozen, only the modules train (§1.5).

L_MTP = Σ_n α_n · NLL_n on text — the benchmark's reference solutions when it has them (GSM8K,
MATH, code), otherwise the policy's own sampled completions (the embedded arithmetic task), drawn
by the run's rollout back-end (under rollout=vllm its engine: the backbone is frozen, so the
engine holds the weights the warm-up samples from) — with its own AdamW (over float32 master
weights when the model is bf16). It runs once, before the first RL step, never on resume (a
checkpoint holds the warmed-up modules), on its own problem stream and its own random-number
state, so the RL steps that follow draw exactly what they would without it. Every rank runs the
same warm-up; rank 0's result is then broadcast, so the ranks start RL with identical modules.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core import collective
from tepo_cli.core.records import Problem
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.data.prompt_templates import render_prompt
from tepo_cli.kernels.argmax import token_argmax
from tepo_cli.models.policy import Policy
from tepo_cli.mtp.prediction_loss import mtp_prediction_loss, mtp_present
from tepo_cli.mtp.warmup_size import warmup_size
from tepo_cli.rollout.backend import RolloutBackend, Sampling
from tepo_cli.runtime.hooks import RunHooks
from tepo_cli.runtime.master_weights import MasterAdamW

Emit = Callable[[dict[str, Any]], None]
_WARMUP_STREAM = 7_919  # seeds the warm-up's problem stream apart from the RL stream
WARMUP_TEMPERATURE = 1.0  # the modules learn the plain next-n-token distributions


def warmup_source(cfg: TrainConfig) -> str:
    """`solutions` or `samples`: what the warm-up trains on (`mtp.warmup.data=auto` decides by
    whether the benchmark has reference solutions)."""
    data = cfg.algo.mtp.warmup.data
    if data != "auto":
        return data
    return "samples" if cfg.benchmark.name == "arith" else "solutions"


def warm_up(
    cfg: TrainConfig,
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    stream: Iterator[Problem],
    emit: Emit,
    hooks: RunHooks,
    sampling: Sampling,
    backend: Callable[[], RolloutBackend],
) -> dict[str, Any]:
    """Train the MTP modules for `mtp.warmup.steps` steps (auto: as warmup_size.py sizes it;
    `tepo train` settles it at start); returns the summary (steps, seconds, per-depth NLL and
    top-1 agreement before and after). Zero steps draw nothing: the modules stay as built (the
    step-0 measurement alone costs a batch: 16 sampled answers with data=samples, drawn with the
    training steps' `sampling` from `backend()`, the run's back-end, built when first called)."""
    stack = policy.attached
    assert stack is not None
    settings = cfg.algo.mtp.warmup
    size = warmup_size(cfg)
    source = warmup_source(cfg)
    summary: dict[str, Any] = {"mtp_warmup_source": source, "mtp_warmup_steps": size.steps}
    if size.steps == 0:
        _broadcast_from_rank0(list(stack.parameters()))
        return summary
    params = list(stack.parameters())
    began = time.perf_counter()
    with _only_modules_train(policy), _own_random_state(cfg.seed):
        optimizer = MasterAdamW(params, lr=settings.lr, weight_decay=0.0)  # float32 masters
        for step in range(0, size.steps + 1):
            batch = _batch(cfg, policy, tokenizer, stream, source, sampling, backend)
            with torch.no_grad():
                hidden = policy.backbone_hidden(batch)
            mtp_logp, depth_hidden = stack.score(
                policy, batch, hidden, WARMUP_TEMPERATURE, backbone_grad=False
            )
            mask = batch.completion_mask
            loss = mtp_prediction_loss(mtp_logp, mask, settings.alpha_decay)
            if step == 0 or step == size.steps or step % settings.log_every == 0:
                record = {"mtp_warmup_step": step, "mtp_warmup_loss": float(loss.detach())}
                record.update(_depth_metrics(policy, batch, hidden, depth_hidden, mtp_logp))
                record["mtp_warmup_seconds"] = time.perf_counter() - began
                emit(record)
                if step == 0:
                    summary["mtp_warmup_before"] = record
                summary["mtp_warmup_after"] = record
            if step == size.steps:
                break  # the record of step s measures the modules after s updates
            optimizer.zero_grad()
            loss.backward()
            optimizer.step(cfg.trainer.grad_clip or float("inf"))
            hooks.enter_step(step + 1)
            hooks.reached("warmup")
    hooks.enter_step(0)
    _broadcast_from_rank0(params)
    summary["mtp_warmup_seconds"] = time.perf_counter() - began
    return summary


def _batch(
    cfg: TrainConfig,
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    stream: Iterator[Problem],
    source: str,
    sampling: Sampling,
    backend: Callable[[], RolloutBackend],
) -> SequenceBatch:
    size = cfg.algo.mtp.warmup.batch_size
    if source == "samples":
        prompts_needed = -(-size // cfg.rollout.n)
        problems = [next(stream) for _ in range(prompts_needed)]
        prompts = [render_prompt(tokenizer, cfg.benchmark, p.question) for p in problems]
        rollout = backend().generate(prompts, sampling)
        return SequenceBatch.from_rollout(rollout.take(torch.arange(size, device="cpu")))
    problems = [next(stream) for _ in range(size)]
    return SequenceBatch.from_rollout(_solutions_rollout(cfg, tokenizer, problems, policy))


def reference_solution(problem: Problem) -> str | None:
    """The worked solution a benchmark ships with the problem (GSM8K, MATH), or the canonical
    program (HumanEval, MBPP); None for the generated arithmetic task."""
    solution = problem.extra.get("solution")
    if solution:
        return str(solution)
    return problem.answer if "test" in problem.extra else None


def _solutions_rollout(
    cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], policy: Policy
) -> Rollout:
    """Prompt + reference solution + EOS, as the rollout would lay them out (prompts left-padded,
    completions right-padded, at most rollout.max_new_tokens completion tokens)."""
    device = next(policy.parameters()).device
    solutions = [reference_solution(p) for p in problems]
    if any(s is None for s in solutions):
        raise ValueError(
            f"benchmark {cfg.benchmark.name} has no reference solutions to warm the MTP modules "
            "up on: set algo.mtp.warmup.data=samples"
        )
    prompts = [render_prompt(tokenizer, cfg.benchmark, p.question) for p in problems]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    limit = cfg.rollout.max_new_tokens
    rows = [
        [*tokenizer(s, add_special_tokens=False)["input_ids"][: limit - 1], tokenizer.eos_token_id]
        for s in solutions
    ]
    width = max(len(r) for r in rows)
    completion_ids = torch.full(
        (len(rows), width), tokenizer.pad_token_id, dtype=torch.long, device="cpu"
    )
    completion_mask = torch.zeros((len(rows), width), dtype=torch.bool, device="cpu")
    for index, ids in enumerate(rows):
        completion_ids[index, : len(ids)] = torch.tensor(ids, dtype=torch.long, device="cpu")
        completion_mask[index, : len(ids)] = True
    return Rollout(
        encoded["input_ids"].to(device),
        encoded["attention_mask"].to(device),
        completion_ids.to(device),
        completion_mask.to(device),
        [str(s) for s in solutions],
        torch.zeros(len(rows), dtype=torch.bool, device=device),
    )


@torch.no_grad()
def _depth_metrics(
    policy: Policy,
    batch: SequenceBatch,
    hidden: torch.Tensor,
    depth_hidden: list[torch.Tensor],
    mtp_logp: torch.Tensor,
) -> dict[str, float]:
    """Per depth n: mean NLL of its targets and top-1 agreement with the backbone's own
    teacher-forced prediction of the same token (the backbone at position t + n − 1)."""
    stack = policy.attached
    mask = batch.completion_mask
    start = batch.prompt_width - 1
    response = hidden[:, start:]
    width = mask.shape[1]
    present = mtp_present(mask, len(stack.depths))
    metrics: dict[str, float] = {}
    backbone_top = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    backbone_top[mask] = token_argmax(response[mask], policy.head.weight)
    pairs = zip(stack.depths, depth_hidden, strict=True)
    for offset, (depth, states) in enumerate(pairs, start=1):
        here = present[..., offset - 1]
        count = int(here.sum())
        name = offset + 1
        if count == 0:
            continue
        head = depth.head if depth.head is not None else policy.head
        predicted = token_argmax(depth.final_norm(states[:, start:][here]), head.weight)
        reference = torch.zeros_like(backbone_top)
        reference[:, : width - offset] = backbone_top[:, offset:]
        agree = (predicted == reference[here]).float().mean()
        metrics[f"mtp_warmup_nll_d{name}"] = float(-mtp_logp[..., offset - 1][here].mean())
        metrics[f"mtp_warmup_agree_d{name}"] = float(agree)
    return metrics


@contextlib.contextmanager
def _only_modules_train(policy: Policy) -> Iterator[None]:
    """The backbone (and a shared head) frozen, the modules trainable, for the warm-up only."""
    flags = {p: p.requires_grad for p in policy.parameters()}
    policy.requires_grad_(False)
    policy.attached.requires_grad_(True)
    try:
        yield
    finally:
        for param, flag in flags.items():
            param.requires_grad_(flag)


@contextlib.contextmanager
def _own_random_state(seed: int) -> Iterator[None]:
    """Sampling in the warm-up draws from its own seeded state and leaves the caller's as it was."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed * 1000 + _WARMUP_STREAM)
        yield


def _broadcast_from_rank0(params: list[torch.nn.Parameter]) -> None:
    with torch.no_grad():
        collective.tensors_from_rank0([param.data for param in params])


def warmup_stream_seed(seed: int) -> int:
    """The seed of the warm-up's own problem stream (apart from the RL stream's)."""
    return seed * 1000 + _WARMUP_STREAM


def console_line(record: dict[str, Any]) -> str:
    """A warm-up record as the console shows it (metrics.jsonl keeps the record)."""
    depths = sorted(k.rsplit("_d", 1)[1] for k in record if k.startswith("mtp_warmup_agree_d"))
    agreement = " ".join(f"d{d} {record[f'mtp_warmup_agree_d{d}']:.2f}" for d in depths)
    return (
        f"MTP warm-up step {record['mtp_warmup_step']}: loss "
        f"{record['mtp_warmup_loss']:.3f}, top-1 agreement with the backbone {agreement} "
        f"({record['mtp_warmup_seconds']:.0f} s)"
    )
