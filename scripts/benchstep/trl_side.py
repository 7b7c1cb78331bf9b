"""The TRL side: GRPOTrainer on the job, timed step by step.

    python -m benchstep.trl_side JOB.json TEPO_CONFIG.json RUN_DIR [generate|vllm [DTYPE]]

Same model directory, prompts (tepo's stream, checked token for token), sampling, grader (tepo's
Reward) and seed as tepo. RUN_DIR/timings.jsonl, one line per optimizer step, times wrapped calls:
step (callback begin -> end), generation (_generate), reward (_calculate_rewards), scoring
(_generate_and_score_completions - generation), forward (compute_loss), backward
(accelerator.backward), optimizer (end of training_step -> step end); and the padded tensors each
compute_loss ran (update_shapes). The trained model goes to RUN_DIR/final.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from benchlib.runner import CallTimes, record_cuda_memory_at_exit
from transformers import TrainerCallback

from benchstep.job import Job, load_tepo_config, train_problems
from benchstep.update_shapes import padded_shapes


class StepClock(CallTimes, TrainerCallback):
    """Collects the wrapped calls' seconds per optimizer step; one JSON line per step."""

    def __init__(self, sink: Path) -> None:
        super().__init__()
        self.sink = sink
        self.begin = 0.0
        self.train_step_end = 0.0
        self.rewards: list[float] = []
        self.batches: list[dict[str, int]] = []
        self.lengths: list[int] = []
        self.params: int | None = None
        self.shape: Any = None  # tepo_cli.train.flops.ModelShape of TRL's model
        self.prompts: dict[tuple[int, ...], int] = {}  # the step's distinct prompts: length
        self.answers: list[tuple[int, int]] = []  # (answer length, its prompt's length)
        self.max_new_tokens: int | None = None

    def wrap(self, owner: Any, name: str, key: str) -> None:
        setattr(owner, name, self.timed(getattr(owner, name), key))

    def ended(self, key: str) -> None:
        if key == "training_step_seconds":
            self.train_step_end = time.perf_counter()

    def record_inputs(self, inputs: dict[str, Any]) -> None:
        """The padded batch compute_loss trains on: its slots, real tokens and answer lengths."""
        prompt, answer = inputs["prompt_mask"], inputs["completion_mask"]
        answer_tokens = int(answer.sum())
        self.batches.append(
            {
                "slots": prompt.numel() + answer.numel(),
                "real": int(prompt.sum()) + answer_tokens,
                "answer_tokens": answer_tokens,
            }
        )
        self.lengths.extend(int(n) for n in answer.sum(dim=1).tolist())
        for ids, mask, length in zip(inputs["prompt_ids"], prompt, answer.sum(dim=1), strict=True):
            real = tuple(ids[mask.bool()].tolist())
            self.prompts[real] = len(real)
            self.answers.append((int(length), len(real)))

    def update_flops(self) -> float | None:
        """The step's needed FLOPs by tepo's own formula (tepo_cli/train/flops.py): each
        distinct prompt once, every answer after its prompt, forward and backward."""
        if self.shape is None or not self.answers:
            return None
        from tepo_cli.train.flops import needed_flops

        answers, prompts = zip(*self.answers, strict=True)
        flops, _ = needed_flops(
            self.shape,
            torch.tensor(list(self.prompts.values())),
            torch.tensor(answers),
            torch.tensor(prompts),
        )
        return flops

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.sums, self.rewards, self.batches, self.lengths = {}, [], [], []
        self.prompts, self.answers = {}, []
        self.begin = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        end = time.perf_counter()
        sums = self.sums
        record = {
            "step": state.global_step,
            "step_seconds": end - self.begin,
            "generation_seconds": sums.get("generation_seconds", 0.0),
            "reward_seconds": sums.get("reward_seconds", 0.0),
            "scoring_seconds": sums.get("prepare_seconds", 0.0)
            - sums.get("generation_seconds", 0.0),
            "forward_seconds": sums.get("forward_seconds", 0.0),
            "backward_seconds": sums.get("backward_seconds", 0.0),
            "optimizer_seconds": end - self.train_step_end,
            "reward_mean": sum(self.rewards) / len(self.rewards) if self.rewards else None,
            "threads": torch.get_num_threads(),
            "answer_lengths": self.lengths,
            "max_new_tokens": self.max_new_tokens,
            "update": padded_shapes(self.batches).as_dict(),
            "params": self.params,
            "update_flops": self.update_flops(),
        }
        with self.sink.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def make_reward(config: Any, clock: StepClock) -> Any:
    """tepo's grader as a TRL reward function (completions come back as assistant messages)."""
    from tepo_cli.benchmarks import build_reward
    from tepo_cli.core.records import Problem

    reward = build_reward(config.reward, config.benchmark)

    def tepo_reward(completions: list[Any], question: list[str], answer: list[str], **_: Any):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        problems = [
            Problem(id=q, question=q, answer=a) for q, a in zip(question, answer, strict=True)
        ]
        values = [r.reward for r in reward.score_many(texts, problems)]
        clock.rewards.extend(values)
        return values

    return tepo_reward


def prompt_rows(config: Any, steps: int) -> list[dict[str, Any]]:
    """tepo's training problems in tepo's order, as conversational prompts (TRL applies the
    chat template with add_generation_prompt=True, as tepo's render_prompt does)."""
    bench = config.benchmark
    rows = []
    for problem in train_problems(config, steps):
        message = bench.prompt.replace("{question}", problem.question)
        messages = [{"role": "user", "content": message}]
        if bench.system_prompt:
            messages.insert(0, {"role": "system", "content": bench.system_prompt})
        prompt: Any = messages if bench.chat_template else message
        rows.append({"prompt": prompt, "question": problem.question, "answer": problem.answer})
    return rows


def check_same_tokens(trainer: Any, config: Any, rows: list[dict[str, Any]]) -> None:
    """TRL's prompt ids must equal tepo's (render_prompt, then no added special tokens)."""
    from tepo_cli.data.prompt_templates import render_prompt

    tokenizer = trainer.processing_class
    sample = rows[: 2 * config.trainer.prompts_per_step]
    ids, _, _ = trainer._tokenize_prompts([row["prompt"] for row in sample])
    for row, theirs in zip(sample, ids, strict=True):
        text = render_prompt(tokenizer, config.benchmark, row["question"])
        ours = tokenizer(text, add_special_tokens=False)["input_ids"]
        if list(theirs) != list(ours):
            raise SystemExit(f"bench_step: TRL and tepo tokenise the prompt differently: {text!r}")


def grpo_config(
    job: Job, run_dir: Path, generation: str = "generate", dtype: str | None = None
) -> Any:
    """TRL's GRPOConfig for the job, in `dtype` (the job's when None): bfloat16 is TRL's own
    `bf16=True` with the model loaded in bfloat16."""
    from trl import GRPOConfig

    bf16 = (dtype or job.dtype) == "bfloat16"
    vllm: dict[str, Any] = {}
    if generation == "vllm":
        vllm = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_max_model_length": 2048,
            "vllm_enable_sleep_mode": False,
            "vllm_importance_sampling_correction": True,
        }
    return GRPOConfig(
        **vllm,
        output_dir=str(run_dir),
        max_steps=job.steps,
        # One generation of the whole step's batch, trained in trl_accumulation micro-batches
        # and one optimizer step (TRL derives steps_per_generation from these).
        per_device_train_batch_size=job.trl_sequences,
        gradient_accumulation_steps=job.trl_accumulation,
        num_generations=job.generations,
        generation_batch_size=job.batch,
        shuffle_dataset=False,  # tepo's stream order; the stream itself is seeded
        max_completion_length=job.max_new_tokens,
        temperature=job.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=job.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        optim="adamw_torch",
        max_grad_norm=job.grad_clip,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="grpo",  # per-sequence token mean, then mean over sequences (tepo's grpo)
        scale_rewards="group",
        seed=job.seed,
        use_cpu=job.device == "cpu",
        bf16=bf16,
        fp16=False,
        # TRL's default is True, tepo's auto; the short job runs both without it.
        gradient_checkpointing=job.trl_checkpointing,
        model_init_kwargs={"dtype": torch.bfloat16 if bf16 else torch.float32},
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )


def main(argv: list[str]) -> None:
    from datasets import Dataset
    from trl import GRPOTrainer

    job, config = Job.load(Path(argv[0])), load_tepo_config(Path(argv[1]))
    run_dir = Path(argv[2])
    generation = argv[3] if len(argv) > 3 else "generate"
    dtype = argv[4] if len(argv) > 4 else None
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(job.threads)
    record_cuda_memory_at_exit()
    clock = StepClock(run_dir / "timings.jsonl")
    clock.sink.write_text("")
    rows = prompt_rows(config, job.steps)
    trainer = GRPOTrainer(
        model=job.model,
        reward_funcs=make_reward(config, clock),
        args=grpo_config(job, run_dir, generation, dtype),
        train_dataset=Dataset.from_list(rows),
        callbacks=[clock],
    )
    check_same_tokens(trainer, config, rows)
    clock.wrap(trainer, "_generate", "generation_seconds")
    clock.wrap(trainer, "_calculate_rewards", "reward_seconds")
    clock.wrap(trainer, "_generate_and_score_completions", "prepare_seconds")
    clock.wrap(trainer, "compute_loss", "forward_seconds")
    clock.wrap(trainer, "training_step", "training_step_seconds")
    clock.wrap(trainer.accelerator, "backward", "backward_seconds")
    clock.params = sum(p.numel() for p in trainer.model.parameters())
    from tepo_cli.train.flops import model_shape

    clock.shape = model_shape(trainer.model)
    clock.max_new_tokens = job.max_new_tokens
    compute_loss = trainer.compute_loss

    def recorded_loss(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        clock.record_inputs(inputs)
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recorded_loss
    trainer.train()
    trainer.save_model(str(run_dir / "final"))


if __name__ == "__main__":
    main(sys.argv[1:])
