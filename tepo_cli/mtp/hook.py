"""MPO's MTP modules' one way into a run: `MtpHook.of(cfg)`, None without `future=mtp`. The
recipe calls `settle` (the warm-up's length and start line) and `check_model` in `tepo train`,
`attach` as it builds the policy and `warm_up` before step 1 of a fresh start. The policy then
carries the modules (`Policy.attached`, modules.py): they score `mtp_logp`, add their terms to
the loss and their work to the FLOPs, save themselves beside final/, and are checkpointed as the
policy's `mtp.` keys, so a resume needs no hook. Imported at `tepo train`'s start: the heavy
modules (torch, the stack) only when called."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.mtp.warmup_size import settle_warmup_steps, warmup_line

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tepo_cli.models.policy import Attach, Policy
    from tepo_cli.rollout.backend import RolloutBackend, Sampling
    from tepo_cli.runtime.hooks import RunHooks
    from tepo_cli.runtime.metrics import RunLog


class MtpHook:
    """The modules' part in one run of `cfg` (module docstring)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.noted = False  # step_note has said its line in this process

    @classmethod
    def of(cls, cfg: TrainConfig) -> MtpHook | None:
        """The hook when the objective reads MTP modules (`algo.future=mtp`), else None."""
        return cls(cfg) if cfg.algo.mtp_depths else None

    def settle(self) -> str:
        """Auto's warm-up length into the config (config.yaml then records the number it ran
        with, and a resume compares numbers); the start line saying how long and why."""
        size = settle_warmup_steps(self.cfg)
        assert size is not None
        return warmup_line(size, self.cfg.algo.mtp.warmup.batch_size)

    def check_model(self) -> None:
        """ConfigError when the configured model cannot carry the modules, told from its config
        alone where it can be (before any weight loads)."""
        from tepo_cli.mtp.files import early_mtp_problem, mtp_unsupported_message

        problem = early_mtp_problem(self.cfg)
        if problem is not None:
            raise ConfigError(mtp_unsupported_message(self.cfg, problem))

    def attach(self, lm: PreTrainedModel) -> Attach:
        """What `Policy(attach=)` calls to build the modules on the loaded `lm`."""
        from tepo_cli.mtp.files import mtp_unsupported_message
        from tepo_cli.mtp.modules import attach
        from tepo_cli.mtp.support import mtp_support_problem

        problem = mtp_support_problem(getattr(lm.config, "model_type", None), lm)
        if problem is not None:
            raise ConfigError(mtp_unsupported_message(self.cfg, problem))
        return attach(self.cfg.algo.mtp_depths, self.cfg.algo.mtp)

    def warm_up(
        self,
        policy: Policy,
        tokenizer: PreTrainedTokenizerBase,
        train_stream: Any,
        log: RunLog | None,
        hooks: RunHooks,
        sampling: Sampling,
        backend: Callable[[], RolloutBackend],
    ) -> dict[str, Any]:
        """The warm-up on its own problem stream (`train_stream(seed)`, the task's), each record
        to `log`, sampling (data=samples) with `backend()`, the run's; returns its summary."""
        from tepo_cli.mtp.warmup import console_line, warm_up, warmup_stream_seed

        stream = train_stream(warmup_stream_seed(self.cfg.seed))

        def emit(record: dict[str, Any]) -> None:
            if log is not None:
                log.before_training(record, console_line(record))

        return warm_up(self.cfg, policy, tokenizer, stream, emit, hooks, sampling, backend)

    def step_note(self, record: dict[str, Any], vocab: int) -> str | None:
        """The line, once a process, for the first step whose modules predicted the policy's own
        tokens worse than a uniform guess over its `vocab` tokens at some depth (their log-ratios,
        MPO's future terms, are then noise); None otherwise."""
        from tepo_cli.mtp.prediction_loss import worse_than_uniform

        over = {} if self.noted else worse_than_uniform(record, vocab)
        if not over:
            return None
        self.noted = True
        return _worse_than_uniform_line(self.cfg, record, over, vocab)


def _worse_than_uniform_line(
    cfg: TrainConfig, record: dict[str, Any], over: dict[int, float], vocab: int
) -> str:
    """What step_note says: the numbers, what they mean for the objective, where the modules'
    warm-up came from and the knobs that change it."""
    from tepo_cli.mtp.warmup import warmup_source

    depths = ", ".join(f"d{depth} {nll:.1f}" for depth, nll in sorted(over.items()))
    exact = record.get("mtp_exact_nll_d2")
    backbone = f"; the backbone's own: {exact:.1f}" if isinstance(exact, float) else ""
    steps = cfg.algo.mtp.warmup.steps
    if steps == 0:
        warmed = "were not warmed up (algo.mtp.warmup.steps=0)"
    elif warmup_source(cfg) == "solutions":
        backend = cfg.rollout.backend
        faster = "" if backend == "vllm" else " (rollout=vllm samples faster)"
        warmed = (
            f"were warmed up for {steps} steps on the benchmark's reference solutions, which "
            "need not be how the policy writes: algo.mtp.warmup.data=samples warms them up on its "
            f"own answers, sampled by rollout={backend}{faster}"
        )
    else:
        warmed = f"were warmed up for {steps} steps on the policy's own answers"
        if cfg.algo.mtp.trainable:
            warmed += (
                " and are then trained by the RL loss, which on word_math made them worse step by "
                "step (docs/results/mtp_warmup/): algo.mtp.trainable=false keeps them as warmed up"
            )
    return (
        f"tepo train: step {record['step']}: MPO's MTP modules predicted the policy's own tokens "
        f"worse than a uniform guess over its {vocab:,} tokens (negative log-likelihood in nats, "
        f"ln V = {math.log(vocab):.1f}: {depths}{backbone}), so the windows' future terms are "
        f"noise rather than the tokens' log-ratios (docs/objectives.md §1.5). The modules "
        f"{warmed}; algo.future=exact reads the backbone's own conditionals instead. Said once; "
        "metrics.jsonl has mtp_nll_dN each step."
    )
