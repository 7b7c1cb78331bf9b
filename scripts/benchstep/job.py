"""The one job both trainers run, defined once.

tepo gets it as `tepo train` overrides; the TRL side reads the same `Job` plus the TrainConfig
those overrides compose to (benchmark, grader, prompt template), so the prompt stream, the chat
rendering and the grading are tepo's own code on both sides.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tepo_cli.config.schema import TrainConfig
    from tepo_cli.core.records import Problem

# The issue's prompt; tepo's arith benchmark must render exactly this (checked at start-up).
ISSUE_PROMPT = "What is {question}? Answer with just the number."
EMBEDDED_MODEL = "smollm2_135m"


@dataclass(frozen=True)
class Job:
    """One benchmark job. Defaults: the issue's CPU job (SmolLM2-135M-Instruct, float32)."""

    model: str  # a local model directory both trainers load (weights and tokenizer)
    steps: int = 30
    seed: int = 0
    prompts_per_step: int = 2
    generations: int = 8
    max_new_tokens: int = 16
    temperature: float = 0.7
    lr: float = 1e-5
    grad_clip: float = 1.0
    digits: int = 1
    operations: list[str] = field(default_factory=lambda: ["+"])
    eval_size: int = 50
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 2
    gradient_checkpointing: bool = False
    # TRL's side only: sequences per forward/backward (0: the whole step's batch at once), and its
    # gradient checkpointing (None: as `gradient_checkpointing`). The long job runs TRL at its own
    # defaults for both (8, on), without which it runs out of memory (benchstep/long_job.py).
    trl_micro_batch: int = 0
    trl_gradient_checkpointing: bool | None = None
    # tepo's side: an update with no row of non-zero advantage is skipped (tepo's default); the
    # long smoke keeps it, since the tiny model answers nothing right and must still measure one
    skip_zero_advantage: bool = True

    @property
    def batch(self) -> int:
        """Sequences per step (prompts x generations): one forward/backward on both sides."""
        return self.prompts_per_step * self.generations

    @property
    def trl_sequences(self) -> int:
        """TRL's per_device_train_batch_size: sequences per forward/backward."""
        return self.trl_micro_batch or self.batch

    @property
    def trl_accumulation(self) -> int:
        """TRL's gradient_accumulation_steps: its micro-batches per optimizer step."""
        return self.batch // self.trl_sequences

    @property
    def trl_checkpointing(self) -> bool:
        """TRL's gradient_checkpointing."""
        if self.trl_gradient_checkpointing is None:
            return self.gradient_checkpointing
        return self.trl_gradient_checkpointing

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @staticmethod
    def load(path: Path) -> Job:
        return Job(**json.loads(path.read_text()))

    def tepo_overrides(self) -> list[str]:
        """`tepo train` overrides for the short job (without hydra.run.dir)."""
        operations = ",".join(f"'{op}'" for op in self.operations)
        return [
            *self.common_overrides("hf"),
            f"model.gradient_checkpointing={_bool(self.gradient_checkpointing)}",
            "benchmark=arith",
            f"benchmark.operations=[{operations}]",
            f"benchmark.digits={self.digits}",
            f"benchmark.eval_size={self.eval_size}",
            f"benchmark.max_new_tokens={self.max_new_tokens}",
            "rollout.top_p=1.0",
            "rollout.top_k=0",
            f"rollout.batch_size={self.batch}",  # one generate() call per step, as TRL
            "deepspeed=zero0",
            "trainer.ppo_epochs=1",  # one update per rollout
            "trainer.minibatches=1",
            f"trainer.micro_batch_size={self.batch}",
            "trainer.lr_schedule=constant",
            "trainer.warmup_steps=0",
            "trainer.weight_decay=0.0",
            # Training only: the held-out evaluation runs afterwards, by the same code for both.
            "trainer.eval_every=0",
            "trainer.save_final=true",
        ]

    def common_overrides(self, rollout: str) -> list[str]:
        """What both jobs set: the model, GRPO with β = 0 (no reference model, no KL term), the
        sampling, the step's size, the optimizer's rate and clip; training only."""
        return [
            "algo=grpo",
            "algo.beta=0",
            "model=hf",
            f"model.path={self.model}",
            f"model.dtype={self.dtype}",
            "reward=auto",
            f"rollout={rollout}",
            f"rollout.n={self.generations}",
            f"rollout.temperature={self.temperature}",
            f"rollout.max_new_tokens={self.max_new_tokens}",
            f"seed={self.seed}",
            f"trainer.max_steps={self.steps}",
            f"trainer.prompts_per_step={self.prompts_per_step}",
            f"trainer.lr={self.lr}",
            f"trainer.grad_clip={self.grad_clip}",
            f"trainer.num_threads={self.threads}",
            "trainer.eval_before=false",
            "trainer.eval_after=false",
            "trainer.save_every=0",
            "trainer.progress=false",
        ]


def _bool(value: bool) -> str:
    return "true" if value else "false"


def compose_tepo_config(job: Job) -> TrainConfig:
    """The validated TrainConfig that `tepo train <job.tepo_overrides()>` runs with."""
    return compose_overrides(job.tepo_overrides())


def compose_overrides(overrides: list[str]) -> TrainConfig:
    """The validated TrainConfig that `tepo train OVERRIDES` runs with."""
    from hydra import compose, initialize_config_module

    from tepo_cli.config.validate import load_train_config

    with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
        return load_train_config(compose(config_name="train", overrides=overrides))


def load_tepo_config(path: Path) -> TrainConfig:
    from tepo_cli.config.schema import TrainConfig

    return TrainConfig.model_validate(json.loads(path.read_text()))


def train_problems(config: TrainConfig, steps: int) -> list[Problem]:
    """The problems tepo's loop draws, in order: prompts_per_step per step from the seeded stream."""
    from tepo_cli.benchmarks import build_task

    count = steps * config.trainer.prompts_per_step
    return list(islice(build_task(config.benchmark).train_stream(config.seed), count))


def resolve_model(name: str) -> str:
    """A local directory for `name`: the embedded model's cached checkpoint, a directory, or a
    hub id downloaded once here (so both trainers read the very same files)."""
    if name == EMBEDDED_MODEL:
        from tepo_cli.models.loading import checkpoint_dir

        path = checkpoint_dir(compose_overrides([]).model)  # the GGUF converted once, cached
        assert path is not None
        return str(Path(path).resolve())
    if Path(name).is_dir():
        return str(Path(name).resolve())
    from huggingface_hub import snapshot_download

    return snapshot_download(name)


def save_tiny_model(directory: Path) -> str:
    """The smoke runs' model: `model=tiny` saved with its tokenizer into `directory` (once), so
    every side loads it the way the real job loads a checkpoint (`model=hf`)."""
    if not (directory / "config.json").is_file():
        import torch

        from tepo_cli.models.loading import load_model, load_tokenizer

        config = compose_overrides(["model=tiny"]).model
        tokenizer = load_tokenizer(config)
        model = load_model(config, tokenizer, torch.device("cpu"))
        directory.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    return str(directory.resolve())


def describe(job: Job) -> dict[str, Any]:
    """The job as the results file records it."""
    return {**asdict(job), "sequences_per_step": job.batch}
