"""Every rank enters every collective the same number of times, and no collective waits forever.

Under ZeRO-3 each forward all-gathers the layers' parameters from every rank, so generation is a
collective: ranks whose samples end early must keep stepping (synced_gpus), every rank must make
as many generate() calls as the others (held-out shards padded, DAPO's refill rounds agreed),
a rank that never comes ends the run after `trainer.collective_timeout_s`, and SIGTERM ends a run
whose ranks are stuck in a collective, leaving no process and no /dev/shm buffer behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tepo_cli.core.records import Problem
from tepo_cli.train.held_out import in_problem_order, rank_shard

# Rank 0's groups are always mixed (its calls alternate wrong, right); rank 1's first training
# group (calls 3 and 4, after the held-out evaluation's problem and padding problem) is all wrong,
# so under DAPO's dynamic sampling rank 1 alone needs a refill round in step 1.
SKEWED_REWARD = """
import os
calls = 0

def score(completion, problem):
    global calls
    calls += 1
    if os.environ.get("RANK") == "1" and calls in (3, 4):
        return False
    return calls % 2 == 0
"""


def tepo(args: list[str], cwd: Path, fault: str = "", **env_vars: str) -> subprocess.Popen:
    env = dict(os.environ, TEPO_FAULT=fault, **env_vars)
    return subprocess.Popen(
        [sys.executable, "-m", "tepo_cli", "train", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def two_zero3_ranks(run_dir: Path) -> list[str]:
    return [
        "model=tiny",
        "trainer.nproc=2",
        "deepspeed=zero3",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
    ]


def run_processes(run_dir: Path) -> dict[int, str]:
    """Processes of this run (its directory is on their command line), by pid. The run directory
    is under pytest's tmp_path, so "pytest" in a command line says nothing: only this test's own
    process is left out."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(run_dir) in cmdline:
            found[int(proc.name)] = cmdline
    return found


def leftovers(run_dir: Path) -> list[str]:
    """Processes of this run still alive."""
    return list(run_processes(run_dir).values())


def buffers(output: str) -> list[Path]:
    """DeepSpeed's /dev/shm all-reduce buffers of the run that printed `output` (its port)."""
    port = re.search(r"--master_port[= ](\d+)", output)
    assert port, output[-3000:]
    return sorted(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port[1]}_*"))


def test_rank_shards_are_padded_to_the_same_size():
    problems = [Problem(id=str(i), question=str(i), answer=str(i)) for i in range(3)]
    shards = [rank_shard(problems, rank, 2) for rank in range(2)]
    assert [[p.id for p in shard] for shard, _ in shards] == [["0", "2"], ["1"]]
    assert [len(shard) + len(padding) for shard, padding in shards] == [2, 2]
    assert rank_shard(problems[:1], 1, 2) == ([], problems[:1])  # a rank with no problem at all
    assert rank_shard(problems, 0, 1) == (problems, [])
    # The ranks' graded answers go back into the problems' order for eval_samples.jsonl
    for count, world in ((3, 2), (7, 3), (1, 2), (0, 2)):
        ids = [str(i) for i in range(count)]
        shards = [[{"id": i} for i in ids[rank::world]] for rank in range(world)]
        assert [a["id"] for a in in_problem_order(shards)] == ids


def test_a_timed_out_collective_is_reported_with_the_phase_it_happened_in():
    from tepo_cli.runtime import collective_timeout
    from tepo_cli.runtime.clock import StepClock

    gloo = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation"
    outer = collective_timeout.current_phase()  # whatever an earlier in-process run left
    evaluation, clock = collective_timeout.phase("held-out evaluation (after)"), StepClock()
    with pytest.raises(RuntimeError) as caught, evaluation, clock("rollout"):
        raise RuntimeError(gloo)
    assert collective_timeout.timed_out(caught.value)
    assert not collective_timeout.timed_out(RuntimeError("CUDA out of memory"))
    message = collective_timeout.timeout_message(1, 2, 10, 3, caught.value)
    assert message.startswith(
        "rank 1 of 2 waited more than trainer.collective_timeout_s=10 s for the other ranks in a "
        "collective during the rollout phase (at step 3)"
    )
    assert collective_timeout.current_phase() == outer  # the phases ended with the error


@pytest.mark.slow
def test_zero3_two_ranks_uneven_eval_shards_and_dapo_refill_on_one_rank_finish(tmp_path):
    """Finding 4's command (batch_size 1, 3 held-out problems over 2 ranks) with DAPO's dynamic
    sampling, where only rank 1 refills in step 1: it used to deadlock in the first evaluation.
    With a prompt pass per minibatch, whose backward runs inside the last micro-batch's."""
    reward = tmp_path / "skewed.py"
    reward.write_text(SKEWED_REWARD)
    run_dir = tmp_path / "run"
    args = [
        *two_zero3_ranks(run_dir),
        "algo=dapo",
        "algo.beta=0.04",  # a KL reference: a ZeRO-3 inference engine, loaded partitioned
        # ... and the KL in the reward: π_old's no-grad scoring before the advantage, and the
        # step's KL summed over both ranks (rank 1 refilled, rank 0 did not)
        "algo.kl_reward_coef=0.01",
        "algo.kl_reward_target=0.001",
        "rollout.n=2",
        "rollout.batch_size=1",
        "benchmark.eval_size=3",
        "trainer.max_steps=2",
        # Several micro-batches: the prompts run once in a prompt pass (models/prompt_pass.py) on
        # both ranks, in the update and in the reference's scoring, checkpointed (`auto`).
        "trainer.micro_batch_tokens=24",
        "reward=custom",
        f"reward.path={reward}",
    ]
    process = tepo(args, cwd=tmp_path)
    try:
        output, _ = process.communicate(timeout=400)
    finally:
        process.kill()
    assert process.returncode == 0, output[-3000:]
    evaluations = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(e["when"], e["problems"]) for e in evaluations] == [("before", 3), ("after", 3)]
    # Both ranks' answers (2 + 1, the padding problem's left out), back in the problems' order.
    answers = [json.loads(line) for line in (run_dir / "eval_samples.jsonl").open()]
    assert [a["when"] for a in answers] == ["before"] * 3 + ["after"] * 3
    assert [a["id"] for a in answers[:3]] == [a["id"] for a in answers[3:]]
    assert len({a["id"] for a in answers[:3]}) == 3
    for evaluation, graded in zip(evaluations, (answers[:3], answers[3:]), strict=True):
        assert evaluation["accuracy"] == sum(a["passed"] for a in graded) / 3
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # step 1: 2 groups kept of 3 sampled (rank 1 refilled once, rank 0 generated alongside it)
    assert [round(s["dropped_group_frac"], 6) for s in steps] == [round(1 / 3, 6), 0.0]
    assert steps[0]["refill_rounds"] == 0  # rank 0's own count: it drew no refill
    # Step 1 scores the reference before any update: the same weights through the same float32
    # ops as the policy, so the KL is zero (up to the order of the all-gathered shards: none).
    assert abs(steps[0]["kl"]) < 1e-7 and abs(steps[0]["kl_reward"]) < 1e-7
    assert steps[0]["kl_reward_coef"] == 0.01 != steps[1]["kl_reward_coef"]
    assert all(step["prompt_pass_tokens"] > 0 for step in steps)
    summary = json.loads((run_dir / "summary.json").read_text())
    full, held = summary["policy_parameters"], summary["policy_parameters_on_rank"]
    assert full / 2 <= held < full / 2 + 2 * 64  # loaded partitioned: at most a row of padding
    assert not buffers(output) and not leftovers(run_dir)


@pytest.mark.slow
def test_a_stale_build_lock_of_deepspeeds_shm_op_does_not_stop_a_two_rank_run(tmp_path):
    """Every rank used to JIT-compile DeepSpeed's shared-memory op under torch's build lock file at
    every start; a rank killed while it held the file (CI's kill tests did) left it, and every later
    multi-rank start waited for it forever, printing nothing. tepo never builds the op now: a stale
    lock is no obstacle, nothing is compiled and no /dev/shm buffer is made."""
    extensions = tmp_path / "torch_extensions"
    lock = extensions / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    run_dir = tmp_path / "run"
    args = [
        "model=tiny",
        "trainer.nproc=2",
        "trainer.max_steps=1",
        "trainer.progress=false",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        f"hydra.run.dir={run_dir}",
    ]
    process = tepo(args, cwd=tmp_path, TORCH_EXTENSIONS_DIR=str(extensions))
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, output[-3000:]
    assert "step 1:" in output, output[-3000:]
    assert [path.name for path in lock.parent.iterdir()] == ["lock"]  # nothing built
    assert not buffers(output) and not leftovers(run_dir)


@pytest.mark.slow
def test_a_rank_that_never_comes_ends_the_run_after_the_collective_timeout(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *two_zero3_ranks(run_dir),
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.collective_timeout_s=10",
    ]
    process = tepo(args, cwd=tmp_path, fault="hang:1@1")
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 1, output[-3000:]
    assert (
        "rank 0 of 2 waited more than trainer.collective_timeout_s=10 s for the other ranks in a "
        "collective during the rollout phase (at step 1)"
    ) in output, output[-3000:]
    assert "TEPO_FAULT: rank 1 hangs at step 1" in output
    assert "Traceback" not in output
    assert not buffers(output) and not leftovers(run_dir)


@pytest.mark.slow
def test_sigterm_to_the_parent_ends_ranks_stuck_in_a_collective_and_removes_shm(tmp_path):
    """Rank 1 never comes; rank 0 waits in ZeRO-3's all-gather (the timeout far away). SIGTERM to
    `tepo train` reaches the ranks, which end; nothing of the run outlives it."""
    run_dir = tmp_path / "run"
    args = [
        *two_zero3_ranks(run_dir),
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.collective_timeout_s=600",
    ]
    process = tepo(args, cwd=tmp_path, fault="hang:1@1")
    lines = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "TEPO_FAULT: rank 1 hangs at step 1" in line:
                break
        time.sleep(5)  # rank 0 is in step 1's generate(), waiting for rank 1's parameters
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    output = "".join(lines) + output
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert took < 60, output[-3000:]
    assert not buffers(output) and not leftovers(run_dir), output[-3000:]


# A stand-in for `deepspeed` → `deepspeed.launcher.launch` → rank: each level waits for the one
# below and passes its exit code up; the rank notes the signal it gets and exits 128 + it.
LEVEL = """
import signal, subprocess, sys, time
depth, note = int(sys.argv[1]), sys.argv[2]
if depth == 2:
    def stop(signum, frame):
        open(note, "a").write(f"{signum}\\n")
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    open(note + ".ready", "w").close()
    while True:
        time.sleep(0.05)
sys.exit(subprocess.call([sys.executable, __file__, str(depth + 1), note]))
"""


def test_relaunch_forwards_sigterm_to_the_ranks_and_returns_128_plus_it(tmp_path):
    from tepo_cli.runtime.distributed import run_forwarding_signals

    script, note = tmp_path / "level.py", tmp_path / "rank_signals"
    script.write_text(LEVEL)

    def signal_when_ready() -> None:
        while not Path(f"{note}.ready").exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill <tepo train's pid>` would

    previous = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=signal_when_ready, daemon=True).start()
    code = run_forwarding_signals([sys.executable, str(script), "0", str(note)], dict(os.environ))
    assert code == 128 + signal.SIGTERM
    assert note.read_text() == f"{int(signal.SIGTERM)}\n"  # the rank got it, once
    assert signal.getsignal(signal.SIGTERM) == previous  # this process's own handling is back
    assert not leftovers(tmp_path)


# Two gloo ranks: rank 1 never comes to the all-reduce rank 0 waits in, under tepo's stop signals.
STUCK_RANK = """
import datetime, sys, time
import torch, torch.distributed as dist
from tepo_cli.runtime.stop import StopSignals
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group(
    "gloo", init_method=f"file://{store}", rank=rank, world_size=2,
    timeout=datetime.timedelta(seconds=120),
)
if rank == 1:
    time.sleep(120)
with StopSignals(stuck_grace_s=1.0):
    print("in the collective", flush=True)
    dist.all_reduce(torch.zeros(1))
"""


def test_sigterm_ends_a_rank_blocked_in_a_collective(tmp_path):
    """Python cannot run the stop handler while the main thread waits in gloo's C++: the watcher
    thread ends the process 1 s later (before: the SIGTERM went unnoticed until the timeout)."""
    script, store = tmp_path / "stuck.py", tmp_path / "store"
    script.write_text(STUCK_RANK)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(store)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        assert ranks[0].stdout is not None
        assert ranks[0].stdout.readline() == "in the collective\n"
        time.sleep(0.5)  # inside all_reduce by now
        signalled = time.monotonic()
        ranks[0].send_signal(signal.SIGTERM)
        _, stderr = ranks[0].communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    assert ranks[0].returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert took < 10
    assert "rank 0 ends at once on SIGTERM (its handler could not run for 1 s" in stderr
