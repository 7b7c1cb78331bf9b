"""rollout=vllm end to end: two ranks under ZeRO-3 and the one-paragraph refusal when vLLM is not
installed (that one runs everywhere) through the real CLI; `tepo eval`'s job in this process.
One rank, kill -9 and resume: tests/test_resume_faults.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from markers import needs_vllm

pytestmark = pytest.mark.slow


def tepo(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args],
        cwd=cwd,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )


# A reward that also writes down, when TEPO_TEST_RECORD_DIR is set, which rank scored which
# prompt's completion (the reward runs in every rank's own process).
PARITY = """
import json, os
import torch.distributed as dist

def score(completion, problem):
    if "TEPO_TEST_RECORD_DIR" in os.environ:
        rank = dist.get_rank()
        path = os.path.join(os.environ["TEPO_TEST_RECORD_DIR"], f"scored-{rank}.jsonl")
        with open(path, "a") as out:
            out.write(json.dumps({"question": problem.question, "completion": completion}) + "\\n")
    return len(completion) % 2
"""

# A plugin (imported by every rank before its engine starts) that builds each vllm.LLM as tepo
# asks and writes down its placement arguments and where vLLM put it: the worker's rank and
# local rank (its device index: cuda:<local rank> on a GPU).
ENGINE_RECORDER = """
import json, os
import torch.distributed as dist
import vllm

LAUNCHER_LOCAL_RANK = os.environ.get("LOCAL_RANK")
PLACEMENT_KEYS = ("distributed_executor_backend", "tensor_parallel_size", "seed")
MODE_KEYS = ("enforce_eager", "enable_sleep_mode")


class RecordedLLM(vllm.LLM):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        worker = self.llm_engine.model_executor.driver_worker.worker
        record = dict(
            arguments={key: kwargs.get(key) for key in PLACEMENT_KEYS},
            modes={key: kwargs.get(key) for key in MODE_KEYS},
            trainer_rank=dist.get_rank(),
            launcher_local_rank=int(LAUNCHER_LOCAL_RANK),
            engine_rank=worker.rank,
            engine_local_rank=worker.local_rank,
            executor=self.llm_engine.vllm_config.parallel_config.distributed_executor_backend,
        )
        path = os.path.join(os.environ["TEPO_TEST_RECORD_DIR"], f"engine-{dist.get_rank()}.json")
        with open(path, "w") as out:
            json.dump(record, out)


vllm.LLM = RecordedLLM
"""


def train_args(tmp: Path, run_dir: Path) -> list[str]:
    """The tiny model on a parity reward, a learning rate large enough that every step moves the
    weights far: a sync that failed would show as a large rollout-trainer gap."""
    (tmp / "parity.py").write_text(PARITY)
    return [
        "model=tiny",
        "rollout=vllm",
        "rollout.engine.kv_cache_gib=1",
        "reward=custom",
        f"reward.path={tmp / 'parity.py'}",
        "trainer.max_steps=3",
        "trainer.lr=1e-2",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
    ]


def records(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def assert_engine_followed_the_trainer(steps: list[dict]) -> None:
    """Every step's rollout log-probs are the trainer's own (ℓ^old) to float rounding: the
    engine generated with the weights of the step before, synced after each update."""
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        assert m["mismatch_abs_max"] < 1e-3
        assert m["mismatch_masked_frac"] == 0.0
        assert m["sync_seconds"] > 0
    assert steps[-1]["grad_norm"] > 0


@needs_vllm
def test_two_ranks_zero3_each_rank_syncs_its_engine(tmp_path):
    """Under ZeRO-3 every rank gathers each parameter for its own engine (the mismatch metrics
    are the maximum over ranks); the final model is consolidated from the partitions.

    Each rank's engine is vLLM's external-launcher executor at the trainer's own rank and local
    device (vLLM's default put every rank's engine at rank 0, device index 0: cuda:0 on a GPU
    node), and each rank samples and scores its own prompts. On the CPU the engine is eager and
    without sleep mode, its KV cache's pages released during the update instead (the autos), as
    the run's summary says."""
    run_dir, record_dir = tmp_path / "run", tmp_path / "records"
    record_dir.mkdir()
    (tmp_path / "engine_recorder.py").write_text(ENGINE_RECORDER)
    args = [*train_args(tmp_path, run_dir), "trainer.nproc=2", "deepspeed=zero3"]
    args += [f"plugins=[{tmp_path / 'engine_recorder.py'}]", "trainer.eval_before=false"]
    args += ["trainer.eval_after=false"]
    env = dict(os.environ, TEPO_TEST_RECORD_DIR=str(record_dir))
    result = tepo("train", *args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_engine_followed_the_trainer(records(run_dir))
    assert (run_dir / "final" / "model.safetensors").is_file()

    engines = [json.loads((record_dir / f"engine-{r}.json").read_text()) for r in (0, 1)]
    assert [(e["trainer_rank"], e["engine_rank"]) for e in engines] == [(0, 0), (1, 1)]
    assert [(e["launcher_local_rank"], e["engine_local_rank"]) for e in engines] == [(0, 0), (1, 1)]
    for rank, engine in enumerate(engines):
        assert engine["executor"] == "external_launcher"
        assert engine["arguments"] == {
            "distributed_executor_backend": "external_launcher",
            "tensor_parallel_size": 1,
            "seed": rank,
        }
        assert engine["modes"] == {"enforce_eager": True, "enable_sleep_mode": False}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tf32"] is False
    assert summary["rollout_engine"] == {
        "cuda_graphs": False,
        "sleep": False,
        "cpu_sleep": True,
        "per_request_seeds": False,
    }
    scored = [records(record_dir, f"scored-{r}.jsonl") for r in (0, 1)]
    questions = [{s["question"] for s in rank_scored} for rank_scored in scored]
    assert all(questions) and not questions[0] & questions[1]  # ranks never share a prompt
    completions = [[s["completion"] for s in rank_scored] for rank_scored in scored]
    assert completions[0] != completions[1]


@needs_vllm
def test_eval_with_vllm_samples_pass_at_k_and_resumes(compose_config, tmp_path):
    """`tepo eval rollout=vllm` (in this process, as a sweep job would run it): pass@k over
    seeded samples; a second run over the same directory has nothing left to do and starts no
    engine (greedy agreement with hf: tests/test_vllm_backend.py)."""
    from tepo_cli.config.validate import load_eval_config
    from tepo_cli.eval.eval_job import run_eval

    overrides = ["model=tiny", "benchmark=arith", "eval.limit=6", "rollout=vllm", "eval.n=4"]
    overrides += ["eval.greedy=false", "rollout.engine.kv_cache_gib=1"]
    config = load_eval_config(compose_config("eval", overrides))
    summary = run_eval(config, tmp_path)
    assert summary["problems"] == 6 and summary["samples"] == 24 and "pass@1" in summary
    assert len({r["completion"] for r in records(tmp_path, "samples.jsonl")}) > 6
    assert run_eval(config, tmp_path)["resumed_problems"] == 6


def test_without_vllm_rollout_vllm_is_refused_before_any_model_loads(tmp_path):
    """One paragraph naming `make install-vllm`, exit 2, nothing of a run written."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['vllm'] = None\n")
    env = dict(os.environ, PYTHONPATH=f"{hide}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for command in ("train", "eval"):
        run_dir = tmp_path / command
        result = tepo(command, "rollout=vllm", f"hydra.run.dir={run_dir}", cwd=tmp_path, env=env)
        assert result.returncode == 2
        message = result.stderr.strip().splitlines()
        assert len(message) == 1 and "make install-vllm" in message[0]
        assert "rollout=vllm" in message[0]
        written = {p.name for p in run_dir.iterdir()} if run_dir.exists() else set()
        assert not written & {"config.yaml", "metrics.jsonl", "samples.jsonl", "status.json"}


# A plugin that counts the prompts of each vllm.LLM.generate call, in call order.
GENERATE_COUNTER = """
import json, os
import vllm

_generate = vllm.LLM.generate


def counted(self, prompts, *args, **kwargs):
    with open(os.path.join(os.environ["TEPO_TEST_RECORD_DIR"], "calls.jsonl"), "a") as out:
        out.write(json.dumps(len(prompts)) + "\\n")
    return _generate(self, prompts, *args, **kwargs)


vllm.LLM.generate = counted
"""


@needs_vllm
def test_mpo_warmup_samples_the_policys_answers_with_the_vllm_engine(tmp_path):
    """`algo.mtp.warmup.data=samples` under rollout=vllm: the warm-up's 3 batches (steps 0–2,
    2 prompts × 2 answers each) come from the run's engine, after its own one-prompt start-up
    request and before the RL step's prompts."""
    run_dir, record_dir = tmp_path / "run", tmp_path / "records"
    record_dir.mkdir()
    (tmp_path / "generate_counter.py").write_text(GENERATE_COUNTER)
    args = [*train_args(tmp_path, run_dir), "trainer.max_steps=1", "algo=mpo", "k=2"]
    args += ["algo.mtp.warmup.data=samples", "algo.mtp.warmup.steps=2"]
    args += ["algo.mtp.warmup.batch_size=4", "rollout.n=2", "trainer.prompts_per_step=3"]
    args += [f"plugins=[{tmp_path / 'generate_counter.py'}]", "trainer.eval_before=false"]
    args += ["trainer.eval_after=false"]
    env = dict(os.environ, TEPO_TEST_RECORD_DIR=str(record_dir))
    result = tepo("train", *args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = records(record_dir, "calls.jsonl")
    assert calls == [1, 2, 2, 2, 3]
    warmup = [m["mtp_warmup_step"] for m in records(run_dir) if "mtp_warmup_step" in m]
    assert warmup == [0, 2]  # its records: the first and the last batch
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mtp_warmup_source"] == "samples" and summary["mtp_warmup_steps"] == 2
