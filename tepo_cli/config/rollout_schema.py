"""Typed schema of the `rollout` group (conf/rollout/): sampling, the mismatch correction, and the
engine's knobs (conf/rollout/vllm.yaml documents each one; schema.py re-exports these)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

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
    correction: Literal["auto", "none", "token_tis", "seq_mask"] = "auto"
    correction_cap: float = Field(default=3.0, gt=1.0)
    # docs/objectives.md §0.9: score under the sampler's top-k/top-p, refuse them, or ignore them
    truncated_sampling: Literal["renormalise", "refuse", "biased"] = "renormalise"
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @model_validator(mode="after")
    def _check_correction(self) -> RolloutConfig:
        if self.backend == "hf" and self.correction not in ("auto", "none"):
            raise ValueError(
                f"rollout.correction={self.correction} corrects the gap between a rollout engine's "
                "log-probs and the trainer's, but with rollout=hf the trainer's own model "
                "generates: there is no gap. Use rollout.correction=auto or none with hf."
            )
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
        """auto = TRL's default (sequence mask, C = 3) for an engine that is not the trainer,
        none for hf (docs/objectives.md §0.8)."""
        if self.correction != "auto":
            return self.correction
        return "none" if self.backend == "hf" else "seq_mask"
