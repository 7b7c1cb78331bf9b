"""Typed schema of `tepo train` configs, and of the groups `tepo eval` shares with it
(config/eval_schema.py holds eval's own).

Hydra composes the YAML tree in conf/; these models check the result once, at start-up, before any
model loads. The YAML files document each knob (a comment per key); the models hold only types and
ranges, so the documentation is written once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.config.auto_bool import AutoBool
from tepo_cli.config.benchmark_schema import BenchmarkConfig
from tepo_cli.config.env_schema import EnvConfig
from tepo_cli.config.model_path import model_path_problem
from tepo_cli.config.reward_schema import RewardConfig
from tepo_cli.config.rollout_schema import (  # noqa: F401  (imported from here across tepo)
    PROMPT_ROOM,
    EngineConfig,
    RolloutConfig,
    resolve_engine_length,
)
from tepo_cli.config.strict import Strict, without


class LoraConfig(Strict):
    """`model.lora` (tepo train): low-rank adapters through peft; r = 0 trains every weight."""

    r: int = Field(default=0, ge=0)
    alpha: float = Field(default=32.0, gt=0.0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: str | list[str] = "all-linear"
    save_merged: bool = True

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, value: str | list[str]) -> str | list[str]:
        if not value:
            raise ValueError("names no module: give 'all-linear' or module names like q_proj")
        return value

    @property
    def enabled(self) -> bool:
        return self.r > 0


class ModelConfig(Strict):
    name: str = Field(min_length=1)
    source: Literal["gguf_package", "tiny", "hf", "reference", "replay"]
    path: str | None = None
    package: str | None = None
    gguf_file: str | None = None
    tokenizer: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # how bf16 weights follow their float32 masters after each step (runtime/weight_rounding.py)
    weight_rounding: Literal["stochastic", "nearest"] = "stochastic"
    # auto: only micro-batches over trainer.micro_batch_tokens (train/recompute.py)
    gradient_checkpointing: AutoBool = "auto"
    share_prompts: bool = True
    packing: bool = True
    # With packing and shared prompts: a minibatch's prompts run once for all its micro-batches
    prompt_pass: bool = True
    trust_remote_code: bool = False
    hidden_size: int = Field(default=64, ge=8)
    intermediate_size: int = Field(default=128, ge=8)
    num_hidden_layers: int = Field(default=2, ge=1)
    num_attention_heads: int = Field(default=2, ge=1)
    num_key_value_heads: int = Field(default=1, ge=1)
    init_seed: int = 0
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @model_validator(mode="after")
    def _check_source(self) -> ModelConfig:
        if self.source == "hf" and (not self.path or self.path == "???"):
            raise ValueError("model=hf needs model.path (a hub id or a local directory)")
        # Every preset that loads weights loads model.path when set (models/loading.py): a
        # missing directory is named here on all of them, not only on model=hf.
        if (
            self.source in ("hf", "tiny", "gguf_package")
            and self.path
            and self.path != "???"
            and (problem := model_path_problem(self.path))
        ):
            raise ValueError(problem)
        if self.source == "replay" and not self.path:
            raise ValueError("model=replay needs model.path (a JSONL file of completions)")
        if self.source == "gguf_package" and not (self.package and self.gguf_file):
            raise ValueError("source=gguf_package needs model.package and model.gguf_file")
        if self.source == "tiny":
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    "model.hidden_size must be a multiple of model.num_attention_heads"
                )
            if self.num_attention_heads % self.num_key_value_heads:
                raise ValueError(
                    "model.num_attention_heads must be a multiple of model.num_key_value_heads"
                )
        return self


class AdvantageConfig(Strict):
    """How rewards become advantages (docs/objectives.md §0.1), outside the loss."""

    name: Literal["grpo", "rloo", "reinforce_pp", "gae"]
    # grpo
    scale: Literal["std", "batch", "none"] = "std"
    eps: float = Field(default=1e-6, gt=0.0)
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    # reinforce_pp
    baseline: Literal["group", "none"] = "group"
    # gae
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    lam: float = Field(default=1.0, ge=0.0, le=1.0)
    value_clip: float | None = Field(default=0.5, gt=0.0)
    whiten: bool = True
    critic_lr: float = Field(default=1e-5, gt=0.0)
    critic_path: str | None = None
    save_critic: bool = False
    critic_warmup: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check_knobs(self) -> AdvantageConfig:
        misplaced = sorted((self.model_fields_set - _OWN[self.name]) & _ESTIMATOR_KNOBS)
        if misplaced:
            raise ValueError(
                f"{', '.join('advantage.' + k for k in misplaced)} do not apply to "
                f"advantage={self.name} (grpo: {', '.join(sorted(_GRPO_KNOBS))}; reinforce_pp: "
                f"baseline; gae: {', '.join(sorted(_GAE_KNOBS))})"
            )
        if self.aggregation == "normalize_then_sum" and self.scale != "std":
            raise ValueError(
                f"advantage.scale={self.scale} scales the summed reward; "
                "advantage.aggregation=normalize_then_sum normalises each reward component by its "
                "group's std and their weighted sum by the step's: leave advantage.scale=std"
            )
        return self

    @model_serializer(mode="wrap")
    def _applicable_knobs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A dump (a run's config.yaml) holds this estimator's knobs only, so it validates
        again: the other estimators' knobs are refused when set."""
        return without(handler(self), _ESTIMATOR_KNOBS - _OWN[self.name])

    @property
    def needs_groups(self) -> bool:
        """Group estimators compare the samples of one prompt: they need rollout.n >= 2."""
        return self.name in ("grpo", "rloo") or (
            self.name == "reinforce_pp" and self.baseline == "group"
        )

    @property
    def needs_critic(self) -> bool:
        return self.name == "gae"


_GRPO_KNOBS = {"scale", "eps", "aggregation"}
_GAE_KNOBS = {
    "gamma",
    "lam",
    "value_clip",
    "whiten",
    "critic_lr",
    "critic_path",
    "save_critic",
    "critic_warmup",
}
_OWN = {"grpo": _GRPO_KNOBS, "rloo": set(), "reinforce_pp": {"baseline"}, "gae": _GAE_KNOBS}
_ESTIMATOR_KNOBS = _GRPO_KNOBS | {"baseline"} | _GAE_KNOBS


class DeepSpeedConfig(Strict):
    stage: int = Field(default=0, ge=0, le=3)
    offload_optimizer: Literal["none", "cpu"] = "none"
    offload_param: Literal["none", "cpu"] = "none"
    overlap_comm: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_offload(self) -> DeepSpeedConfig:
        if self.offload_optimizer != "none" and self.stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs ZeRO stage 1, 2 or 3")
        if self.offload_param != "none" and self.stage != 3:
            raise ValueError("deepspeed.offload_param needs ZeRO stage 3")
        return self


class KernelConfig(Strict):
    backend: Literal["auto", "torch", "triton", "naive"] = "auto"
    chunk_size: int | None = Field(default=None, ge=1)
    lean_layers: bool = True
    tf32: AutoBool = "auto"  # auto: on for a float32 policy on CUDA (kernels/tf32.py)


class TrainerConfig(Strict):
    max_steps: int = Field(default=30, ge=0)
    prompts_per_step: int = Field(default=2, ge=1)
    ppo_epochs: int = Field(default=1, ge=1)
    minibatches: int = Field(default=1, ge=1)
    micro_batch_size: int = Field(default=16, ge=1)
    # Real tokens per micro-batch (train/micro_batches.py); None: micro_batch_size rows each
    micro_batch_tokens: int | None = Field(default=1024, ge=1)
    # tcmalloc, jemalloc or mimalloc preloaded in place of glibc's malloc (core/host_allocator.py)
    host_allocator: Literal["auto", "glibc", "jemalloc", "tcmalloc", "mimalloc"] = "auto"
    # glibc accepts a threshold up to 32 MiB (half its 64-bit heap size) and ignores a larger one
    mmap_threshold_kb: int | None = Field(default=4096, ge=4, le=32768)
    # None: FULL_FINE_TUNING_LR, or LORA_LR with model.lora (TrainConfig resolves it)
    lr: float | None = Field(default=None, gt=0.0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(default=0, ge=0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(default=1e-8, gt=0.0)
    grad_clip: float = Field(default=1.0, ge=0.0)
    nproc: int = Field(default=1, ge=1)
    # auto: CUDA when torch can use it, else the CPU (said at start); cuda refuses without a GPU
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_threads: int | None = Field(default=None, ge=1)
    eval_before: bool = True
    eval_after: bool = True
    eval_every: int = Field(default=0, ge=0)
    samples_per_step: int = Field(default=4, ge=0)
    save_final: bool = True
    progress: bool = True
    save_every: int = Field(default=10, ge=0)
    keep_checkpoints: int = Field(default=2, ge=1)
    max_bad_steps: int = Field(default=3, ge=1)
    # leave rows whose advantage is all 0 out of the update when no other term reads them
    skip_zero_advantage: bool = True  # train/zero_advantage.py
    collective_timeout_s: float = Field(default=1800.0, gt=0)  # runtime/collective_timeout.py
    time_limit_minutes: float | None = Field(default=None, gt=0)  # runtime/time_limit.py

    @model_validator(mode="after")
    def _check_schedule(self) -> TrainerConfig:
        # max_steps counts training steps (a rollout each); the warm-up counts optimizer steps,
        # ppo_epochs x minibatches of them per training step (runtime/engine.py).
        optimizer_steps = self.max_steps * self.ppo_epochs * self.minibatches
        if self.warmup_steps > optimizer_steps > 0:
            raise ValueError(
                f"trainer.warmup_steps={self.warmup_steps} (optimizer steps) exceeds the run's "
                f"{optimizer_steps} optimizer steps (trainer.max_steps={self.max_steps} training "
                f"steps x ppo_epochs={self.ppo_epochs} x minibatches={self.minibatches})"
            )
        return self


# A LoRA adapter learns best at ~10x full fine-tuning's learning rate (Schulman et al., "LoRA
# Without Regret", Thinking Machines Lab 2025); `trainer.lr` set by the user wins over both.
FULL_FINE_TUNING_LR = 1e-5
LORA_LR = 1e-4


class TrainConfig(Strict):
    seed: int = 0
    k: int | None = Field(default=None, ge=1)
    plugins: list[str] = Field(default_factory=list)
    resume: bool | str = False
    # experiment trackers (tepo_cli.trackers, checked at start); `logger=tensorboard` is one
    logger: list[str] = Field(default_factory=list)
    algo: AlgoConfig
    advantage: AdvantageConfig = Field(default_factory=lambda: AdvantageConfig(name="grpo"))
    model: ModelConfig
    reward: RewardConfig
    benchmark: BenchmarkConfig
    rollout: RolloutConfig
    deepspeed: DeepSpeedConfig
    env: EnvConfig = Field(default_factory=EnvConfig)
    kernel: KernelConfig = Field(default_factory=KernelConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)

    @field_validator("logger", mode="before")
    @classmethod
    def _one_logger(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("logger")
    @classmethod
    def _each_logger_once(cls, value: list[str]) -> list[str]:
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"lists {', '.join(twice)} more than once")
        return value

    @property
    def turn_tokens(self) -> int:
        """The most tokens one answer (one turn of an episode) may hold: rollout.max_new_tokens."""
        turn = self.rollout.max_new_tokens
        assert turn is not None  # resolved from the benchmark below
        return turn

    @property
    def completion_tokens(self) -> int:
        """The most tokens a row holds after its prompt (env.row_tokens)."""
        return self.env.row_tokens(self.turn_tokens)

    @model_validator(mode="after")
    def _check_episodes(self) -> TrainConfig:
        ranks = self.trainer.nproc
        hf_zero3 = self.rollout.backend == "hf" and self.deepspeed.stage == 3
        if self.env.multi_turn and hf_zero3 and ranks > 1:
            raise ValueError(
                f"env={self.env.name} with rollout=hf under deepspeed=zero3 on {ranks} ranks: "
                "each rank's episodes end after their own number of turns, while every hf "
                "generate() under ZeRO-3 is a collective that all ranks must enter together; use "
                "rollout=vllm (one engine per rank), or deepspeed=zero2"
            )
        check_stop_with_episodes(self.rollout, self.env)
        return self

    @model_validator(mode="after")
    def _check_batching(self) -> TrainConfig:
        if self.rollout.max_new_tokens is None:
            # One length story: the benchmark's answer length, unless training overrides it.
            self.rollout.max_new_tokens = self.benchmark.max_new_tokens
        resolve_engine_length(self.rollout.engine, self.completion_tokens)
        if self.trainer.lr is None:
            self.trainer.lr = LORA_LR if self.model.lora.enabled else FULL_FINE_TUNING_LR
        if self.model.source in ("reference", "replay"):
            raise ValueError(
                f"model={self.model.source} has no weights to train; it is for tepo eval"
            )
        t = self.trainer
        if self.algo.dynamic_sampling and self.rollout.n < 2:
            raise ValueError(
                "algo.dynamic_sampling drops the prompts whose responses all agree, so it needs "
                f"rollout.n >= 2 (got rollout.n={self.rollout.n})"
            )
        if self.advantage.needs_groups and self.rollout.n < 2:
            raise ValueError(
                f"advantage={self.advantage.name} compares each response with the other "
                f"responses to the same prompt, so it needs rollout.n >= 2 (got "
                f"rollout.n={self.rollout.n}); sample several responses per prompt, or use "
                "advantage=gae (a learned critic), which works with one"
                + (" (or advantage.baseline=none)" if self.advantage.name == "reinforce_pp" else "")
            )
        if t.prompts_per_step % t.nproc:
            raise ValueError(
                f"trainer.prompts_per_step ({t.prompts_per_step}) must be a multiple of "
                f"trainer.nproc ({t.nproc}): each rank takes whole groups"
            )
        if self.algo.overlong_penalty:
            from tepo_cli.algos.overlong import resolve_overlong_lengths

            resolve_overlong_lengths(
                self.algo.overlong_max_len,
                self.algo.overlong_cache_len,
                self.completion_tokens,
            )
        algo = self.algo
        on_policy = t.ppo_epochs == 1 and t.minibatches == 1
        if algo.kl_mask == "tepo" and algo.mask_criterion == "entropy_drop" and on_policy:
            raise ValueError(
                "algo.mask_criterion=entropy_drop compares the current policy's entropy with the "
                "rollout policy's, which are the same with one update per rollout "
                "(trainer.ppo_epochs=1, trainer.minibatches=1): the KL mask would always be "
                "empty. Set trainer.ppo_epochs or trainer.minibatches above 1, or use another "
                "criterion (covariance, advantage_only, first_order)"
            )
        sequences = t.prompts_per_step // t.nproc * self.rollout.n
        if sequences % t.minibatches:
            raise ValueError(
                f"trainer.minibatches ({t.minibatches}) must divide the sequences per rank and "
                f"step "
                f"(prompts_per_step / nproc x rollout.n = {sequences})"
            )
        return self

    @model_validator(mode="after")
    def _check_kl_reward(self) -> TrainConfig:
        if self.algo.kl_reward_coef > 0 and self.advantage.aggregation == "normalize_then_sum":
            raise ValueError(
                f"algo.kl_reward_coef={self.algo.kl_reward_coef} charges the KL to the reward "
                "before the advantage; advantage.aggregation=normalize_then_sum normalises each "
                "reward component on its own, and the KL is none of them: use "
                "advantage.aggregation=sum_then_normalize with it, or the loss's KL (algo.beta)"
            )
        return self


def check_stop_with_episodes(rollout: RolloutConfig, env: EnvConfig) -> None:
    """`rollout.stop` ends single answers; an episode's turns end at the model's end of message."""
    if env.multi_turn and rollout.stop:
        raise ValueError(
            f"rollout.stop={rollout.stop} ends an answer at a string, but env={env.name} plays "
            "episodes, whose turns end at the model's end of message and whose environment "
            "decides when an episode ends; drop rollout.stop, or use single answers (env=single)"
        )
