"""Nothing lost: real training subprocesses killed (SIGKILL), stopped (SIGTERM), fed NaN, starved
of disk, then resumed — and compared bit for bit with an uninterrupted run of the same seed."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_files import WEIGHTS_FILES, comparable_metrics

from tepo_cli.core.machine import cpu_model

pytestmark = pytest.mark.slow

STEPS = 4


def base_args(tmp: Path, run_dir: Path) -> list[str]:
    reward = tmp / "parity.py"
    reward.write_text("def score(completion, problem):\n    return len(completion) % 2 == 0\n")
    return [
        "model=tiny",
        f"trainer.max_steps={STEPS}",
        "trainer.save_every=1",
        "trainer.keep_checkpoints=3",
        "trainer.progress=false",
        "trainer.eval_after=false",
        "trainer.eval_before=false",
        "reward=custom",
        f"reward.path={reward}",
        f"hydra.run.dir={run_dir}",
    ]


def tepo(args: list[str], cwd: Path, fault: str = "", **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, TEPO_FAULT=fault)
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=cwd,
        env=dict(os.environ, TEPO_FAULT=""),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_steps(run_dir: Path, steps: int, process: subprocess.Popen) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= steps:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {steps}: {process.poll()}")


def assert_same_run(run_dir: Path, reference: Path) -> None:
    ours, theirs = comparable_metrics(run_dir), comparable_metrics(reference)
    steps = [m["step"] for m in ours if "step" in m]  # MTP warm-up records have none
    assert steps == list(range(1, STEPS + 1))  # no step lost, none twice
    assert ours == theirs
    for weights in WEIGHTS_FILES:
        if (reference / weights).exists() or (run_dir / weights).exists():
            assert (run_dir / weights).read_bytes() == (reference / weights).read_bytes()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and len(summary) >= 4
    # resumed on the machine it started on: one machine, from the start
    assert [(m["cpu"], m["from_step"]) for m in summary["machines"]] == [(cpu_model(), 0)]


def uninterrupted(tmp_path_factory, name: str, make_args) -> Path:
    """The run a killed-and-resumed one must equal: the same arguments, never stopped."""
    tmp = tmp_path_factory.mktemp(name)
    run_dir = tmp / "run"
    result = tepo(make_args(tmp, run_dir), cwd=tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def killed_resumed_as_uninterrupted(
    tmp_path: Path, tmp_path_factory, make_args, fault: str
) -> tuple[Path, subprocess.CompletedProcess]:
    """A run killed (SIGKILL) at `fault`, resumed, and equal to an uninterrupted one."""
    reference_dir = uninterrupted(tmp_path_factory, f"{make_args.__name__}_reference", make_args)
    run_dir = tmp_path / "run"
    args = make_args(tmp_path, run_dir)
    killed = tepo(args, cwd=tmp_path, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = tepo([*args, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run_dir, reference_dir)
    return run_dir, resumed


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return uninterrupted(tmp_path_factory, "reference", base_args)


def mtp_args(tmp: Path, run_dir: Path) -> list[str]:
    """MPO with MTP modules, off-policy (two epochs), so the old MTP scores are checkpointed
    state too; a short warm-up on the policy's own samples."""
    return [
        *base_args(tmp, run_dir),
        "algo=mpo",
        "k=3",
        "trainer.ppo_epochs=2",
        "algo.mtp.warmup.steps=3",
        "algo.mtp.warmup.batch_size=8",
        "algo.mtp.warmup.log_every=1",
    ]


def chain_args(tmp: Path, run_dir: Path) -> list[str]:
    """MPO's MTP modules (off-policy: the old MTP scores are state too) beside PPO's critic (one
    response per prompt: V_old, returns and the critic's optimizer are state), the policy training
    LoRA adapters with a KL term to the base model (the adapters switch off to score it); the
    MTP modules and the critic are copies of layers without adapters and train whole."""
    return [
        *mtp_args(tmp, run_dir),
        "model.lora.r=4",
        "algo.beta=0.04",
        "advantage=gae",
        "rollout.n=1",
        "trainer.prompts_per_step=4",
        "advantage.save_critic=true",
    ]


@pytest.fixture(scope="module")
def chain_reference(tmp_path_factory) -> Path:
    run_dir = uninterrupted(tmp_path_factory, "chain_reference", chain_args)
    assert len([line for line in (run_dir / "metrics.jsonl").open() if "mtp_warmup_step" in line])
    return run_dir


def test_mpo_mtp_gae_lora_run_killed_then_resumed_loses_nothing(tmp_path, chain_reference):
    """Killed during the warm-up: there is no checkpoint yet, so the resumed run starts over,
    warm-up included. Killed again in step 3's update: the policy's and the critic's engines come
    back from step 2's checkpoint, which holds the warmed-up, partly trained MTP modules (the
    warm-up never runs again) and the adapters with their optimizer state, not the frozen base
    weights (read again from where they came from). Metrics (value losses included), final/ (the
    adapter and the merged model), the MTP modules and critic/ end byte for byte the same."""
    import torch

    run_dir = tmp_path / "run"
    args = chain_args(tmp_path, run_dir)
    in_warmup = tepo(args, cwd=tmp_path, fault="warmup:2")
    assert in_warmup.returncode == -signal.SIGKILL, in_warmup.stderr[-3000:]
    assert not list((run_dir / "checkpoints").glob("step_*"))
    in_rl = tepo([*args, "resume=true"], cwd=tmp_path, fault="update:3")
    assert in_rl.returncode == -signal.SIGKILL, in_rl.stderr[-3000:]
    assert "MTP warm-up step" in in_rl.stderr  # nothing to resume from: warmed up again
    checkpoint = run_dir / "checkpoints" / "step_00000002"
    assert (checkpoint / "critic").is_dir()
    policy = torch.load(checkpoint / "engine" / "mp_rank_00_model_states.pt", weights_only=False)
    kept = list(policy["module"])
    assert kept and all("lora_" in key or key.startswith("mtp.") for key in kept)
    resumed = tepo([*args, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "MTP warm-up step" not in resumed.stderr
    assert_same_run(run_dir, chain_reference)
    saved = [name for name in WEIGHTS_FILES if (run_dir / name).is_file()]
    assert len(saved) == 5 and "final/model.safetensors" not in saved


def episode_args(tmp: Path, run_dir: Path) -> list[str]:
    """Multi-turn episodes (env=python_tool) graded by the custom reward."""
    return [*base_args(tmp, run_dir), "env=python_tool", "env.max_turns=2"]


def test_a_multi_turn_run_killed_mid_episode_then_resumed_loses_nothing(tmp_path, tmp_path_factory):
    """kill -9 in step 3, after a turn of its episodes was sampled and before the environment
    answered: the resumed run samples step 3's episodes again from step 2's checkpoint and ends
    with the uninterrupted run's metrics (episode metrics included) and weights."""
    run_dir, _ = killed_resumed_as_uninterrupted(
        tmp_path, tmp_path_factory, episode_args, "episode:3"
    )
    assert "env_turns_mean" in comparable_metrics(run_dir)[-1]


def test_a_finished_run_extended_keeps_every_evaluation(tmp_path):
    """`trainer.max_steps` raised on a finished run: it resumes from its last checkpoint, written
    before its `after` evaluation, whose record the resume cuts back. That step is evaluated
    again, so the extended run's eval.jsonl and eval_samples.jsonl are an uninterrupted run's."""

    def args(run_dir: Path, steps: int) -> list[str]:
        kept = [
            a
            for a in base_args(tmp_path, run_dir)
            if not a.startswith(("trainer.eval_a", "trainer.max_steps="))
        ]
        return [
            *kept,
            f"trainer.max_steps={steps}",
            "trainer.eval_every=1",
            "benchmark.eval_size=6",
        ]

    def evaluations(run_dir: Path, name: str) -> list[dict]:
        records = [json.loads(line) for line in (run_dir / name).read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "seconds"} for r in records]

    straight, extended = tmp_path / "straight", tmp_path / "extended"
    assert tepo(args(straight, 3), cwd=tmp_path).returncode == 0
    assert tepo(args(extended, 2), cwd=tmp_path).returncode == 0
    assert [e["when"] for e in evaluations(extended, "eval.jsonl")] == ["during", "after"]
    again = tepo([*args(extended, 3), "resume=true"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "after step 2" in again.stderr
    steps = [(e["step"], e["when"]) for e in evaluations(extended, "eval.jsonl")]
    assert steps == [(1, "during"), (2, "during"), (3, "after")]
    for name in ("eval.jsonl", "eval_samples.jsonl"):
        assert evaluations(extended, name) == evaluations(straight, name)
    assert len(evaluations(extended, "eval_samples.jsonl")) == 3 * 6


def test_sigkill_at_each_point_then_resume_loses_nothing(tmp_path, reference):
    """Killed in step 2's rollout, then (resumed) in step 3's update, then (resumed again) while
    writing step 3's checkpoint; then step 2's checkpoint is torn on disk after it was sealed, so
    the last resume falls back to step 1's, and ends byte for byte as the uninterrupted run."""
    run_dir = tmp_path / "run"
    args = base_args(tmp_path, run_dir)
    for fault in ("rollout:2", "update:3", "checkpoint:3"):
        again = ["resume=true"] if fault != "rollout:2" else []
        killed = tepo([*args, *again], cwd=tmp_path, fault=fault)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert json.loads((run_dir / "status.json").read_text())["state"] == "running"
    assert list((run_dir / "checkpoints").glob(".step_*.staging"))  # the torn write
    newest = run_dir / "checkpoints" / "step_00000002" / "engine" / "mp_rank_00_model_states.pt"
    with newest.open("r+b") as handle:  # and the newest sealed one torn on disk afterwards
        handle.truncate(newest.stat().st_size // 2)
    resumed = tepo([*args, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step_00000002 is unusable" in resumed.stderr and "after step 1" in resumed.stderr
    assert not list((run_dir / "checkpoints").glob(".step_*"))
    assert_same_run(run_dir, reference)


def test_sigterm_then_kill_9_then_resume_true_loses_nothing(tmp_path, reference):
    """In the default run directory (outputs/train/<date>/<time>): SIGTERM after step 1 with
    periodic saves off, so the step finishes, its checkpoint is written, and the run exits
    128 + 15 saying how to resume. Resumed by directory and killed from outside (kill -9) a step
    later. `resume=true` finds that newest unfinished run and ends it byte for byte as the
    uninterrupted run; then there is no unfinished run left to resume."""
    args = [a for a in base_args(tmp_path, tmp_path) if not a.startswith("hydra.run.dir=")]
    args.append("trainer.save_every=0")
    process = start(args, tmp_path)
    run_dir = wait_for_run_dir(tmp_path / "outputs" / "train", process)
    wait_for_steps(run_dir, 1, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in stderr and "resume=" in stderr and run_dir.name in stderr
    assert "Traceback" not in stderr
    assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted"
    (saved,) = (run_dir / "checkpoints").glob("step_*")
    stopped_at = int(saved.name.split("_")[1])
    assert stopped_at == len((run_dir / "metrics.jsonl").read_text().splitlines())
    process = start([*args, f"resume={run_dir}"], tmp_path)
    wait_for_steps(run_dir, stopped_at + 1, process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    resumed = tepo([*args, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir}" in resumed.stderr or f"resuming {run_dir.resolve()}" in (
        resumed.stderr
    )
    assert_same_run(run_dir, reference)
    nothing_left = tepo([*args, "resume=true"], cwd=tmp_path)
    assert nothing_left.returncode == 2 and "no unfinished run" in nothing_left.stderr


def test_a_time_limit_stops_after_a_step_with_a_checkpoint_and_resume_loses_nothing(
    tmp_path, reference
):
    """trainer.time_limit_minutes so short that after step 1 the next step cannot end in time
    (the process has run longer already): it writes a checkpoint and exits 128 + 15 saying why,
    counting the evaluation due after step 2 at its estimate (none has run); resumed with no
    limit and no evaluation (a new allocation), it ends byte for byte as the uninterrupted run."""
    run_dir = tmp_path / "run"
    args = [*base_args(tmp_path, run_dir), "trainer.save_every=0"]
    limited = [*args, "trainer.time_limit_minutes=0.001", "trainer.eval_every=2"]
    stopped = tepo(limited, cwd=tmp_path)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "tepo train: trainer.time_limit_minutes=0.001: stopped after step 1, " in stopped.stderr
    assert "and the held-out evaluation after it, " in stopped.stderr
    assert " s (estimated: none has run yet)) could end past the limit" in stopped.stderr
    assert f"resume={run_dir}" in stopped.stderr and "Traceback" not in stopped.stderr
    assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted"
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*")] == ["step_00000001"]
    resumed = tepo([*args, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run_dir, reference)


def wait_for_run_dir(root: Path, process: subprocess.Popen) -> Path:
    """The run directory a run started without hydra.run.dir creates under `root`."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        found = [p.parent for p in root.glob("*/*/config.yaml")]
        if found:
            (run_dir,) = found
            return run_dir
        time.sleep(0.05)
    raise AssertionError(f"no run directory appeared under {root}: {process.poll()}")


def test_non_finite_steps_are_skipped_then_the_run_stops(tmp_path):
    run_dir = tmp_path / "run"
    args = [*base_args(tmp_path, run_dir), "trainer.max_bad_steps=2", "trainer.max_steps=5"]
    result = tepo(args, cwd=tmp_path, fault="nan_loss:2,nan_loss:4-5")
    assert result.returncode == 1
    assert "trainer.max_bad_steps" in result.stderr and "Traceback" not in result.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["skipped_optimizer_steps"] for m in metrics] == [0, 1, 0, 1, 1]
    assert metrics[1]["loss"] is None  # NaN is written as null
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert checkpoints[-1] == "step_00000004"  # the failing step 5 wrote nothing
    from tepo_cli.runtime.checkpoint import verify

    assert verify(run_dir / "checkpoints" / checkpoints[-1]) is None
    # The failed run resumes only as itself: another objective is refused, as is a fresh start.
    refused = tepo([*args, "resume=true", "algo=mpo"], cwd=tmp_path)
    assert refused.returncode == 2
    assert "cannot resume" in refused.stderr and "algo.name: 'grpo' -> 'mpo'" in refused.stderr
    assert "Traceback" not in refused.stderr
    fresh_over_old = tepo(args, cwd=tmp_path)
    assert (
        fresh_over_old.returncode == 2 and "already holds a training run" in fresh_over_old.stderr
    )


def _small_file_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_disk_full_while_checkpointing_leaves_nothing_partial(tmp_path):
    run_dir = tmp_path / "run"
    result = tepo(base_args(tmp_path, run_dir), cwd=tmp_path, preexec_fn=_small_file_limit)
    assert result.returncode == 1
    assert "could not write the checkpoint of step 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((run_dir / "checkpoints").iterdir())  # no torn staging, no sealed dir


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            '{"question": "What is 1+1?", "answer": "2\\n#### 2"}\n{"question": "What is 2+2?"}\n',
            "gsm8k record 1 has no 'answer' value (missing or null)",
        ),
        (
            '{"question": "What is 1+1?", "answer": "2\\n#### 2"}\nnot json\n',
            "JSON parse error: Invalid value. in row 1",
        ),
    ],
    ids=["missing-field", "not-json"],
)
def test_malformed_training_rows_stop_the_run_before_the_model_loads(tmp_path, rows, message):
    data = tmp_path / "train.jsonl"
    data.write_text(rows)
    run_dir = tmp_path / "run"
    args = ["model=tiny", "benchmark=gsm8k", f"benchmark.path={data}", f"hydra.run.dir={run_dir}"]
    result = tepo(args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"


def vllm_args(tmp: Path, run_dir: Path) -> list[str]:
    """Rollouts from an in-process vLLM engine, without per-request seeds (the default): it draws
    from the trainer's torch generator, which the checkpoint holds, so the resumed run samples
    what the uninterrupted one did. A held-out evaluation every 2 steps: the uninterrupted run
    evaluates after step 2 and samples step 3 with the same engine, the resumed one with a fresh
    engine from step 2's checkpoint, so the evaluation must leave nothing step 3 samples from."""
    return [
        *base_args(tmp, run_dir),
        "rollout=vllm",
        "rollout.engine.kv_cache_gib=1",
        "trainer.lr=1e-2",  # every step moves the weights far: a missed sync would show
        "trainer.eval_every=2",
    ]


@pytest.mark.skipif(
    os.environ.get("TEPO_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None,
    reason="rollout=vllm needs `make install-vllm`",
)
def test_vllm_run_killed_then_resumed_loses_nothing(tmp_path_factory, tmp_path):
    """`tepo train model=tiny rollout=vllm`, uninterrupted: the rollout log-probs are the
    trainer's to float rounding at every step (the weights reached the engine after each update).
    Then kill -9 in the rollout of step 3 and resume: the new process starts a new engine from the
    checkpoint's weights; metrics (mismatch metrics included) and final/ are byte for byte equal."""
    reference = uninterrupted(tmp_path_factory, "vllm_reference", vllm_args)
    for m in comparable_metrics(reference):  # the engine generated with the trainer's weights
        assert m["mismatch_abs_max"] < 1e-3 and m["mismatch_masked_frac"] == 0.0
    run_dir = tmp_path / "run"
    args = vllm_args(tmp_path, run_dir)
    assert tepo(args, cwd=tmp_path, fault="rollout:3").returncode == -signal.SIGKILL
    resumed = tepo([*args, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run_dir, reference)


def test_a_sweep_killed_mid_job_continues_with_one_command(tmp_path, reference):
    """A multirun killed (kill -9) in the middle of its second job: the same sweep command plus
    resume=true skips the finished job, untouched, and resumes the killed one in its own
    directory, which ends byte for byte as an uninterrupted run."""
    sweep = tmp_path / "sweep"
    common = [a for a in base_args(tmp_path, sweep) if not a.startswith(("hydra.", "trainer.max"))]
    command = ["-m", *common, f"trainer.max_steps=2,{STEPS}", f"hydra.sweep.dir={sweep}"]
    killed = tepo(command, cwd=tmp_path, fault="update:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    finished, cut = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert json.loads((finished / "status.json").read_text())["state"] == "finished"
    before = {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()}

    resumed = tepo([*command, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(p for p in sweep.iterdir() if p.is_dir()) == [finished, cut]  # no new job dirs
    assert f"{finished} finished all 2 steps already: nothing to resume, skipped" in resumed.stderr
    assert {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()} == before
    assert f"resuming {cut} after step 2" in resumed.stderr
    assert_same_run(cut, reference)
