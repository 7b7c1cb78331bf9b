"""Two nodes on one machine, through DeepSpeed's own launcher as docs/guides/distributed.md documents it:

    deepspeed --no_ssh --hostfile H --num_nodes 2 --node_rank R --num_gpus 1 \\
        --master_addr 127.0.0.1 --master_port P --no_local_rank --module tepo_cli train \\
        trainer.nproc=2 ... hydra.run.dir=<shared run dir>

started twice (R=0 and R=1), one rank each. The run carries MPO's MTP modules and PPO's critic
(GAE) under ZeRO-2, so every kind of per-rank state crosses the nodes: the warmed-up modules are
broadcast, GAE's whitening statistics all-reduced, the optimizer states partitioned. A rank-0
refusal stops the other node at once with the same paragraph; a run killed with SIGKILL on node 1
and resumed on both nodes ends byte for byte as the uninterrupted two-node run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_files import WEIGHTS_FILES, comparable_metrics

from tepo_cli.runtime.distributed import free_port

pytestmark = pytest.mark.slow

STEPS = 2


def _launcher() -> str:
    return shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")


def _args(tmp: Path, run_dir: Path) -> list[str]:
    reward = tmp / "parity.py"
    reward.write_text("def score(completion, problem):\n    return len(completion) % 2 == 0\n")
    return [
        "trainer.nproc=2",
        "model=tiny",
        "deepspeed=zero2",  # each rank writes its own optimizer partition
        "algo=mpo",
        "k=3",
        "trainer.ppo_epochs=2",  # off-policy: the old MTP scores are checkpointed state too
        "algo.mtp.warmup.steps=1",
        "algo.mtp.warmup.batch_size=8",
        "advantage=gae",
        "rollout.n=1",
        "trainer.prompts_per_step=4",
        "advantage.save_critic=true",
        f"trainer.max_steps={STEPS}",
        "trainer.save_every=1",
        "trainer.keep_checkpoints=3",
        "trainer.progress=false",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.num_threads=1",
        "reward=custom",
        f"reward.path={reward}",
        f"hydra.run.dir={run_dir}",
    ]


def two_nodes(
    tmp: Path,
    args: list[str],
    fault_on_node1: str = "",
    timeout: float = 240,
    devices_checked: bool = False,
) -> list[subprocess.CompletedProcess]:
    """Start node 1's and node 0's launchers (each its own session), wait for both; a launch
    that outlives `timeout` is SIGKILLed (both nodes) and fails the test. `devices_checked`:
    under TEPO_CHECK_DEVICES=1 (tests/test_device_discipline.py), so a rank fails if its tepo code
    made a tensor without naming its device."""
    hostfile = tmp / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    port = str(free_port())
    processes = []
    for node in (1, 0):
        command = [
            _launcher(),
            "--no_ssh",
            "--hostfile",
            str(hostfile),
            "--num_nodes",
            "2",
            "--node_rank",
            str(node),
            "--num_gpus",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            port,
            "--no_local_rank",
            "--module",
            "tepo_cli",
            "train",
            *args,
        ]
        env = dict(
            os.environ,
            TEPO_FAULT=fault_on_node1 if node == 1 else "",
            TEPO_CHECK_DEVICES="1" if devices_checked else "0",
        )
        processes.append(
            subprocess.Popen(
                command,
                cwd=tmp,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    try:
        for process in reversed(processes):  # node 0 first
            output, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(process.args, process.returncode, output))
    except subprocess.TimeoutExpired:
        pytest.fail(f"a two-node launch was still running after {timeout:.0f} s")
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return results  # [node 0, node 1]


def test_two_nodes_refuse_together_then_killed_on_one_node_and_resumed_match_the_whole_run(
    tmp_path,
) -> None:
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    node0, node1 = two_nodes(tmp_path, _args(tmp_path, whole), devices_checked=True)
    assert node0.returncode == 0, node0.stdout[-3000:]
    assert node1.returncode == 0, node1.stdout[-3000:]
    assert "without device" not in node0.stdout + node1.stdout
    summary = json.loads((whole / "summary.json").read_text())
    first, second = summary["rank_param_checksums"]  # both nodes end with the same policy
    critic_first, critic_second = summary["critic_rank_param_checksums"]
    assert first == second and critic_first == critic_second
    assert summary["mtp_parameters"] > 0 and summary["critic_parameters"] > 0
    manifest = json.loads((whole / "checkpoints/step_00000002/manifest.json").read_text())
    assert "rank_00001.pt" in manifest["files"]
    assert any("zero_pp_rank_1_" in name for name in manifest["files"])  # node 1's partition

    # Only rank 0 checks the run directory: its refusal (an earlier run there) reaches node 1,
    # which stops with the same paragraph instead of waiting in its first collective.
    started = time.monotonic()
    node0, node1 = two_nodes(tmp_path, _args(tmp_path, whole), timeout=150)
    for node in (node0, node1):
        assert node.returncode == 2, node.stdout[-3000:]
        assert f"tepo train: {whole} already holds a training run" in node.stdout
        assert "Traceback" not in node.stdout
    assert time.monotonic() - started < 150

    # kill -9 of node 1's rank in step 2 (node 0's rank then fails in its collective) ...
    node0, node1 = two_nodes(tmp_path, _args(tmp_path, killed), fault_on_node1="update:2")
    assert node0.returncode != 0 and node1.returncode != 0
    assert [p.name for p in (killed / "checkpoints").glob("step_*")] == ["step_00000001"]
    # ... and resumed on both nodes: the same run as the uninterrupted one
    node0, node1 = two_nodes(tmp_path, [*_args(tmp_path, killed), "resume=true"])
    assert node0.returncode == 0, node0.stdout[-3000:]
    assert node1.returncode == 0, node1.stdout[-3000:]
    assert f"resuming {killed} after step 1" in node0.stdout
    assert comparable_metrics(killed) == comparable_metrics(whole)
    steps = [m["step"] for m in comparable_metrics(killed) if "step" in m]  # not the warm-up's
    assert steps == list(range(1, STEPS + 1))
    saved = [weights for weights in WEIGHTS_FILES if (whole / weights).exists()]
    assert len(saved) == 4  # the policy, the MTP modules, the critic's two files
    for weights in saved:
        assert (killed / weights).read_bytes() == (whole / weights).read_bytes(), weights
    assert json.loads((killed / "status.json").read_text())["state"] == "finished"
