"""Launching on a GPU node: the launcher command keeps CUDA_VISIBLE_DEVICES, trainer.device
decides (and says) where the ranks train, ranks other than 0 leave Hydra's outputs alone, each
rank hashes its own checkpoint files, and `.deepspeed_env` carries tepo's variables to the
other nodes. In-process and cheap; the launches themselves are in tests/test_two_nodes.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tepo_cli import cli
from tepo_cli.core.errors import ConfigError
from tepo_cli.runtime import checkpoint, distributed
from tepo_cli.runtime.distributed import Topology


def _command(device_type: str, visible: str | None, nproc: int = 2) -> list[str]:
    return distributed.launcher_command(
        "deepspeed", nproc, 29500, ["model=tiny"], Path("/runs/a"), device_type, visible
    )


def test_the_launcher_command_keeps_the_visible_gpus(monkeypatch, tmp_path) -> None:
    # CUDA with CUDA_VISIBLE_DEVICES=4,5,6,7: the first nproc of those GPUs, named explicitly
    # (DeepSpeed's runner drops the variable when --num_gpus is given and takes GPUs 0..N-1).
    command = _command("cuda", "4,5,6,7")
    assert command[1:3] == ["--include", "localhost:4,5"] and "--num_gpus" not in command
    assert command[-4:] == [
        "trainer.nproc=2",
        "hydra.run.dir=/runs/a",
        "hydra.output_subdir=null",
        "hydra/job_logging=stdout",
    ]
    assert _command("cuda", " 6, 7 ")[1:3] == ["--include", "localhost:6,7"]
    # CUDA without the variable, or the CPU: --num_gpus is the number of ranks
    assert _command("cuda", None)[1:3] == ["--num_gpus", "2"]
    assert _command("cpu", "4,5,6,7")[1:3] == ["--num_gpus", "2"]
    with pytest.raises(ConfigError, match=r"trainer.nproc=4, but CUDA_VISIBLE_DEVICES='4,5'"):
        _command("cuda", "4,5", nproc=4)
    with pytest.raises(ConfigError, match="by UUID"):
        _command("cuda", "GPU-8e1c,GPU-77a0")
    # relaunch() runs exactly that command (observed where it starts the launcher)
    seen: list[list[str]] = []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setattr(
        distributed, "run_forwarding_signals", lambda cmd, env: seen.append(cmd) or 0
    )
    assert distributed.relaunch(2, ["model=tiny"], tmp_path, device_type="cuda") == 0
    assert seen[0][1:3] == ["--include", "localhost:4,5"]


def test_trainer_device_cuda_refuses_and_auto_says_why_it_chose_the_cpu() -> None:
    from tepo_cli.runtime.device_choice import choose_device

    if torch.cuda.is_available():
        pytest.skip("torch can use CUDA here: trainer.device=cuda is not refused")
    with pytest.raises(ConfigError) as refused:
        choose_device("cuda")
    message = str(refused.value)
    assert message.startswith("trainer.device=cuda, but torch ")
    assert "is a build without CUDA" in message and "trainer.device=cpu" in message
    auto = choose_device("auto")
    assert auto.type == "cpu" and not auto.uses_cuda
    assert auto.reason.startswith("trainer.device=auto: no usable CUDA device (torch ")
    assert choose_device("cpu").type == "cpu"


def test_tepo_train_device_cuda_stops_before_the_model_loads(tmp_path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tepo_cli",
            "train",
            "model=tiny",
            "trainer.device=cuda",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "tepo train: trainer.device=cuda, but torch" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run_dir / "config.yaml").exists()  # refused before the run started


def test_trainer_device_accepts_auto_cpu_cuda_only(compose_config) -> None:
    from tepo_cli.config.validate import load_train_config

    config = load_train_config(compose_config("train", ["model=tiny"]))
    assert config.trainer.device == "auto"
    with pytest.raises(ConfigError, match=r"trainer\.device") as refused:
        load_train_config(compose_config("train", ["model=tiny", "trainer.device=gpu"]))
    assert "'auto', 'cpu' or 'cuda'" in str(refused.value)


@pytest.mark.parametrize(("rank", "written_by_hydra"), [(None, True), ("0", True), ("1", False)])
def test_only_rank_0_writes_hydras_outputs(monkeypatch, rank, written_by_hydra) -> None:
    """A multi-node `deepspeed --hostfile ... --module tepo_cli train` names no Hydra output
    overrides: on ranks other than 0 tepo adds them (and drops the user's own)."""
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    seen: list[list[str]] = []
    monkeypatch.setattr(cli, "_run_hydra", lambda name, job, overrides: seen.append(overrides))
    cli.main(["train", "model=tiny", "hydra.output_subdir=.hydra", "hydra.run.dir=/runs/x"])
    overrides = seen[0]
    if written_by_hydra:
        assert overrides == ["model=tiny", "hydra.output_subdir=.hydra", "hydra.run.dir=/runs/x"]
    else:
        assert overrides == [
            "model=tiny",
            "hydra.run.dir=/runs/x",
            "hydra.output_subdir=null",
            "hydra/job_logging=stdout",
        ]


def _stage(root: Path) -> Path:
    """A checkpoint laid out as DeepSpeed (ZeRO-2, two ranks) and tepo write it."""
    names = {
        "engine/mp_rank_00_model_states.pt": b"weights",
        "engine/zero_pp_rank_0_mp_rank_00_optim_states.pt": b"optimizer part 0",
        "engine/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": b"optimizer part 1",
        "rank_00000.pt": b"rng 0",
        "rank_00001.pt": b"rng 1",
        "trainer_state.json": b"{}",
    }
    for name, data in names.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _topology(rank: int) -> Topology:
    return Topology(rank, 2, rank, 2, torch.device("cpu"))


def test_each_rank_hashes_and_verifies_its_own_checkpoint_files(tmp_path) -> None:
    staging = _stage(tmp_path / "staging")
    own = {rank: checkpoint._digest_own(staging, _topology(rank)) for rank in (0, 1)}
    assert sorted(own[1]) == [
        "engine/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "rank_00001.pt",
    ]
    assert sorted(own[0]) == [
        "engine/mp_rank_00_model_states.pt",
        "engine/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "rank_00000.pt",
        "trainer_state.json",
    ]
    final = tmp_path / "step_00000001"
    checkpoint._seal(staging, final, 1, {**own[0], **own[1]})
    manifest = json.loads((final / "manifest.json").read_text())
    assert len(manifest["files"]) == 6 and manifest["step"] == 1
    assert checkpoint.verify(final) is None
    # a rank reads back only its own files: rank 1's shard torn, rank 0 does not look at it
    (final / "rank_00001.pt").write_bytes(b"rng 2")
    assert checkpoint.verify(final, _topology(0)) is None
    assert (
        checkpoint.verify(final, _topology(1)) == "rank_00001.pt does not match its sha256 checksum"
    )
    # ranks beyond the world (a run resumed with fewer ranks) fall to rank 0
    assert checkpoint.owner_rank("engine/zero_pp_rank_3_mp_rank_00_optim_states.pt", 2) == 0


def test_deepspeed_env_carries_tepo_and_hf_variables_to_every_node(tmp_path) -> None:
    from deepspeed.launcher.multinode_runner import PDSHRunner
    from deepspeed.launcher.runner import parse_args

    from tepo_cli.runtime.deepspeed_env import deepspeed_env_command

    env_file = tmp_path / ".deepspeed_env"
    env_file.write_text("NCCL_DEBUG=INFO\nTEPO_CACHE=/old/cache\n")
    environ = {
        "TEPO_CACHE": "/shared/tepo cache",
        "HF_HOME": "/shared/hf",
        "TRANSFORMERS_OFFLINE": "1",
        "PATH": "/usr/bin",
    }
    assert deepspeed_env_command(["--file", str(env_file)], environ) == 0
    assert env_file.stat().st_mode & 0o777 == 0o600
    # read back as DeepSpeed's runner does (runner.main: one `KEY=VALUE` a line, every line)
    args = parse_args(["--hostfile", str(tmp_path / "hostfile"), "train.py"])
    runner = PDSHRunner(args, "e30=")
    for line in env_file.read_text().splitlines():
        key, value = line.split("=", maxsplit=1)
        runner.add_export(key, value)
    assert runner.exports == {
        "NCCL_DEBUG": "INFO",
        "TEPO_CACHE": '"/shared/tepo cache"',
        "HF_HOME": "/shared/hf",
        "TRANSFORMERS_OFFLINE": "1",
    }
    command, _, _ = runner.get_cmd(dict(os.environ), {"node0": [0], "node1": [0]})
    assert 'export TEPO_CACHE="/shared/tepo cache";' in " ".join(command)
    assert deepspeed_env_command(["--file"], environ) == 2
    assert deepspeed_env_command(["--file", str(env_file)], {"HF_X": "a\nb"}) == 2
