"""MPO's MTP modules' one way into a run: `MtpHook.of(cfg)`, None without `future=mtp`. The
recipe calls `settle` (the warm-up's length and start line) and `check_model` in `tepo train`,
`attach` as it builds the policy and `warm_up` before step 1 of a fresh start. The policy then
carries the modules (`Policy.attached`, modules.py): they score `mtp_logp`, add their terms to
the loss and their work to the FLOPs, save themselves beside final/, and are checkpointed as the
policy's `mtp.` keys, so a resume needs no hook. Imported at `tepo train`'s start: the heavy
modules (torch, the stack) only when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tepo_cli.config.schema import TrainConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.mtp.warmup_size import settle_warmup_steps, warmup_line

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tepo_cli.models.policy import Attach, Policy
    from tepo_cli.rollout.backend import Sampling
    from tepo_cli.runtime.hooks import RunHooks
    from tepo_cli.runtime.metrics import RunLog


class MtpHook:
    """The modules' part in one run of `cfg` (module docstring)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

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
    ) -> dict[str, Any]:
        """The warm-up on its own problem stream (`train_stream(seed)`, the task's), each record
        to `log`; returns its summary."""
        from tepo_cli.mtp.warmup import console_line, warm_up, warmup_stream_seed

        stream = train_stream(warmup_stream_seed(self.cfg.seed))

        def emit(record: dict[str, Any]) -> None:
            if log is not None:
                log.before_training(record, console_line(record))

        return warm_up(self.cfg, policy, tokenizer, stream, emit, hooks, sampling)
