"""Typed schema of the `rollout` group (conf/rollout/): sampling, the mismatch correction, and the
engine's knobs (conf/rollout/vllm.yaml documents each one; schema.py re-exports these)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from tepo_cli.config.auto_bool import AutoBool
from tepo_cli.config.strict import Strict


class EngineConfig(Strict):
    """A rollout engine's knobs (rollout=vllm: conf/rollout/vllm.yaml; autos: vllm_modes.py)."""

    # auto: PROMPT_ROOM + the longest answer asked for (TrainConfig / EvalConfig resolve it)
    max_model_len: Annotated[int, Field(ge=16)] | Literal["auto"] = "auto"
    kv_cache_gib: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.3, gt=0.0, le=1.0)
    max_num_seqs: int = Field(default=256, ge=1)
    enforce_eager: AutoBool = "auto"  # auto: CUDA graphs on CUDA, eager on CPU
    prefix_caching: bool = True
    sleep: AutoBool = "auto"  # auto: on CUDA (vLLM's sleep mode is CUDA-only)
    per_request_seeds: bool = False
    # any other `vllm.LLM` keyword argument, passed as is (e.g. enable_chunked_prefill)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("engine_kwargs")
    @classmethod
    def _not_tepos_own(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(kwargs) & set(TEPO_ENGINE_ARGUMENTS))
        if taken:
            owners = ", ".join(f"{key} ({TEPO_ENGINE_ARGUMENTS[key]})" for key in taken)
            raise ValueError(
                f"rollout.engine.engine_kwargs sets {owners}, which tepo sets itself from the "
                f"knob named in brackets: set that knob instead. engine_kwargs takes the other "
                f"vllm.LLM arguments (e.g. enable_chunked_prefill, max_num_batched_tokens)."
            )
        return kwargs


# vllm.LLM's arguments tepo sets (rollout/vllm_engine.py), and the knob or fact each comes from
TEPO_ENGINE_ARGUMENTS = {
    "model": "the trainer's own weights",
    "skip_tokenizer_init": "tepo tokenizes",
    "tokenizer": "rollout.stop (vLLM loads the tokenizer for stop strings only)",
    "load_format": "the trainer's own weights",
    "dtype": "model.dtype",
    "seed": "seed",
    "max_model_len": "rollout.engine.max_model_len",
    "max_num_seqs": "rollout.engine.max_num_seqs",
    "enable_prefix_caching": "rollout.engine.prefix_caching",
    "gpu_memory_utilization": "rollout.engine.gpu_memory_utilization",
    "logprobs_mode": "the mismatch correction needs processed log-probs",
    "enforce_eager": "rollout.engine.enforce_eager",
    "enable_sleep_mode": "rollout.engine.sleep",
    "distributed_executor_backend": "trainer.nproc",
    "tensor_parallel_size": "trainer.nproc",
}


PROMPT_ROOM = 2048  # tokens of prompt an auto max_model_len leaves beside the answers


def resolve_engine_length(engine: EngineConfig, max_new_tokens: int) -> None:
    """`rollout.engine.max_model_len=auto`: room for a PROMPT_ROOM-token prompt beside the longest
    answer the job asks for (MATH-500's longest training prompt is 1,520 tokens before the chat
    template), so a longer answer limit never needs the key raised by hand."""
    if engine.max_model_len == "auto":
        engine.max_model_len = max_new_tokens + PROMPT_ROOM


class RolloutConfig(Strict):
    backend: str = "hf"  # a module of tepo_cli/rollout/ (checked by rollout.check_backend)
    n: int = Field(default=8, ge=1)
    temperature: float = Field(default=0.7, gt=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    # None: the benchmark's max_new_tokens (TrainConfig resolves it, so the trainer reads an int)
    max_new_tokens: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=64, ge=1)
    correction: Literal[
        "auto", "none", "token_tis", "token_mis", "seq_tis", "seq_mis", "seq_mask"
    ] = "auto"
    correction_cap: float = Field(default=3.0, gt=1.0)
    # F: a lower bound on the weight (TRL's clip_min); None: none for the TRL modes, 1/C for seq_mask
    correction_floor: float | None = Field(default=None, gt=0.0, lt=1.0)
    # docs/objectives.md §0.9: score under the sampler's top-k/top-p, refuse them, or ignore them
    truncated_sampling: Literal["renormalise", "refuse", "biased"] = "renormalise"
    # rollout=hf's multi-turn episodes: each conversation's keys and values kept from one turn to
    # the next (rollout/turn_cache.py); false: every turn prefills its whole conversation again
    turn_cache: bool = True
    # where an answer ends besides its EOS (rollout/stop_rule.py): after the first of these strings
    # (`string`) or at the end of its line (`line`); kept in the answer, which counts as ended
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    stop_at: Literal["string", "line"] = "string"
    # line: a line ends the answer only if what follows the string on it matches this regex
    stop_pattern: str | None = None
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @model_validator(mode="after")
    def _check_correction(self) -> RolloutConfig:
        if self.backend == "hf" and self.correction not in ("auto", "none"):
            raise ValueError(
                f"rollout.correction={self.correction} corrects the gap between a rollout engine's "
                "log-probs and the trainer's, but with rollout=hf the trainer's own model "
                "generates: there is no gap. Use rollout.correction=auto or none with hf."
            )
        if self.correction_floor is not None and self.correction_mode == "none":
            raise ValueError(
                f"rollout.correction_floor={self.correction_floor:g} bounds the mismatch weight "
                f"from below, but rollout.correction resolves to none here (rollout={self.backend}, "
                f"rollout.correction={self.correction}): nothing would use it. Set "
                "rollout.correction_floor=null, or a correction mode with rollout=vllm "
                "(docs/objectives.md §0.8)."
            )
        if not self.stop:  # acts on nothing: kept at its default (resume compares)
            self.stop_at, self.stop_pattern = "string", None
        _check_stop_pattern(self.stop_pattern, self.stop_at)
        truncated = self.top_p < 1.0 or self.top_k > 0
        if not truncated:  # the setting acts on nothing: kept at its default (resume compares)
            self.truncated_sampling = "renormalise"
        elif self.truncated_sampling == "refuse":
            raise ValueError(
                f"rollout.top_p={self.top_p:g} / rollout.top_k={self.top_k} sample from a "
                "truncated distribution, and rollout.truncated_sampling=refuse refuses that "
                "(docs/objectives.md §0.9). Sample with rollout.top_p=1.0 rollout.top_k=0, let "
                "the trainer score under the sampler's kept tokens with "
                "rollout.truncated_sampling=renormalise (the default), or accept a biased "
                "ratio knowingly with rollout.truncated_sampling=biased"
            )
        return self

    @property
    def correction_mode(self) -> str:
        """auto = seq_mask (the geometric-mean band, C = 3) for an engine that is not the
        trainer, none for hf (docs/objectives.md §0.8)."""
        if self.correction != "auto":
            return self.correction
        return "none" if self.backend == "hf" else "seq_mask"


def _check_stop_pattern(pattern: str | None, at: str) -> None:
    if pattern is None:
        return
    if at != "line":
        raise ValueError(
            f"rollout.stop_pattern={pattern!r} says which lines end an answer, but "
            f"rollout.stop_at={at} ends it at the string itself: set rollout.stop_at=line, or "
            "drop rollout.stop_pattern"
        )
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(
            f"rollout.stop_pattern={pattern!r} is not a regular expression ({error}); e.g. "
            "'\\d' (a number follows the string on its line)"
        ) from None
