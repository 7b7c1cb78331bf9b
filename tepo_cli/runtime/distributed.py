"""Process topology: one process without a launcher, or ranks started by the deepspeed launcher.

`tepo train trainer.nproc=N` re-launches itself as
`deepspeed --num_gpus N --no_local_rank --master_port P --module tepo_cli train <overrides>`
(`--include localhost:<ids>` instead of `--num_gpus` on CUDA with CUDA_VISIBLE_DEVICES set)
with the parent's run directory, and waits for it. Multi-node runs use the same launcher with a
hostfile (see docs/guides/distributed.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from tepo_cli.core.errors import ConfigError
from tepo_cli.core.run_dir import NO_HYDRA_OUTPUTS
from tepo_cli.runtime.device_choice import choose_device

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_SET_BY_US: dict[str, str] = {}  # rendezvous variables this job set (a single process)
_OWN_GROUP: list[bool] = []  # non-empty once this process made its own one-rank group


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_launcher() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ and not _SET_BY_US


def check_launched_world(nproc: int) -> None:
    """A launcher-started rank refuses a `trainer.nproc` other than the launcher's world size,
    before any process group starts."""
    if not launched_by_launcher():
        return
    launched = int(os.environ["WORLD_SIZE"])
    if launched != nproc:
        raise ConfigError(
            f"trainer.nproc={nproc}, but the launcher started {launched} rank(s) "
            f"(WORLD_SIZE={launched}). Set trainer.nproc={launched}, the number of ranks over "
            f"all nodes: the split of each step's prompts and the per-rank batch checks use it."
        )


def setup_topology(
    num_threads: int | None, device_type: str | None = None, collective_timeout_s: float = 1800.0
) -> Topology:
    """Read (or, for a single process, set) the rendezvous variables DeepSpeed expects.

    Without them DeepSpeed falls back to MPI discovery and asks for mpi4py. `device_type`:
    `trainer.device` as resolved at start-up ("cpu" or "cuda"); None: decided here as for `auto`.
    Launched ranks' collectives wait at most `collective_timeout_s` (runtime/collective_timeout.py).
    """
    if not launched_by_launcher():
        # DeepSpeed reads these; the group itself needs no port (see below).
        single = dict(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
        )
        _SET_BY_US.update(single)
        os.environ.update(single)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # The deepspeed launcher exports LOCAL_SIZE; torchrun exports LOCAL_WORLD_SIZE.
    local_world = (
        int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 0) or world
    )
    use_cuda = choose_device(device_type or "auto").uses_cuda
    if use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if _SET_BY_US and not _OWN_GROUP:
        _init_single_process_group(device)
        _OWN_GROUP.append(True)
    elif not _SET_BY_US:
        _join_launched_group(collective_timeout_s)
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    torch.set_num_threads(num_threads or max(1, cores // local_world))
    return Topology(rank, world, local_rank, local_world, device)


def _init_single_process_group(device: torch.device) -> None:
    """A one-rank group over an in-memory store: no TCP port to bind (or to race for).

    DeepSpeed reuses an initialised torch.distributed group instead of creating its own.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def _join_launched_group(collective_timeout_s: float) -> None:
    """Ranks started by a launcher join their group now, not inside deepspeed.initialize: the
    loop agrees on a checkpoint and broadcasts MPO's warmed-up modules before the engine exists.
    The back-end is the one deepspeed.initialize would pick (gloo on CPU, NCCL on CUDA); every
    collective of the group waits at most `collective_timeout_s`."""
    from tepo_cli.core.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed()

    from tepo_cli.runtime import collective_timeout

    deepspeed.init_distributed(timeout=collective_timeout.timeout(collective_timeout_s))


def teardown() -> None:
    """End a job: launcher-started ranks end their group (the process exits next); a single
    process keeps its one-rank group for the next job of a multirun sweep (DeepSpeed caches
    process groups globally, so a second group would not match them) and forgets the
    rendezvous variables it set, so that no child process mistakes itself for a launched rank.
    """
    import torch.distributed as dist

    if not _OWN_GROUP and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for key in _SET_BY_US:
        os.environ.pop(key, None)
    _SET_BY_US.clear()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def relaunch(
    nproc: int,
    overrides: list[str],
    run_dir: Path,
    job_cores: int | None = None,
    device_type: str = "cpu",
) -> int:
    """Run this training job as `nproc` ranks under the deepspeed launcher; return its exit code.

    `job_cores`: the cores this job may use when a parallel sweep shares the machine; its ranks
    split them (an explicit `trainer.num_threads` in `overrides` is per rank and kept as given).
    `device_type`: `trainer.device` as resolved ("cpu" or "cuda").
    """
    launcher = shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")
    if not Path(launcher).exists():
        raise ConfigError(
            "trainer.nproc > 1 needs the `deepspeed` launcher on PATH (it comes with the deepspeed "
            "package); it was not found."
        )
    kept = [
        o for o in overrides if not o.lstrip("+~").startswith(("hydra.run.dir", "trainer.nproc"))
    ]
    cores = job_cores or (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    if job_cores is not None:
        kept.append(f"trainer.num_threads={max(1, job_cores // nproc)}")
    port = free_port()
    command = launcher_command(
        launcher, nproc, port, kept, run_dir, device_type, os.environ.get(VISIBLE_DEVICES)
    )
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // nproc)))
    return run_forwarding_signals(command, env)


def run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    """Run the launcher in its own process group and wait for it; SIGINT/SIGTERM to this process
    reach the ranks. The first goes to the ranks alone (each finishes its step, checkpoints and
    exits; the launcher then ends); the second to the whole group (the ranks end at once); a third
    kills the group. Whatever ends this process, no launcher or rank outlives it: a signal it can
    catch as above; one it cannot (SIGKILL of it or of its process group, which does not reach the
    launcher's own session) through the kernel, as runtime/lifetime.py says (the runner dies with
    this process, each rank follows this process's PID, DeepSpeed's `launch` ends with its ranks).

    Without this a SIGTERM killed this process alone: the deepspeed runner and its ranks went on
    (a rank hung in a collective forever)."""
    from tepo_cli.runtime.lifetime import PARENT_ENV, die_with_parent

    env = {**env, PARENT_ENV: str(os.getpid())}
    process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=die_with_parent)
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if len(received) == 1:
            targets = _ranks(process.pid)
            for pid in targets:
                _signal(pid, signum)
            if targets:
                return
        _signal_group(process.pid, signum if len(received) <= 2 else signal.SIGKILL)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if process.poll() is None:  # this process is ending some other way
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        _signal_group(process.pid, signal.SIGKILL)  # a rank the launcher left behind
    return 128 + received[0] if received and code else code


def _ranks(launcher_pid: int) -> list[int]:
    """The ranks: the processes two levels under the deepspeed runner (runner → launch → rank)."""
    import psutil

    try:
        launchers = psutil.Process(launcher_pid).children()
        return [rank.pid for launch in launchers for rank in launch.children()]
    except psutil.Error:
        return []


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _signal_group(leader: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)


def launcher_command(
    launcher: str,
    nproc: int,
    port: int,
    overrides: list[str],
    run_dir: Path,
    device_type: str,
    visible_devices: str | None,
) -> list[str]:
    """The deepspeed launcher command that runs this job as `nproc` local ranks.

    DeepSpeed's runner drops CUDA_VISIBLE_DEVICES as soon as `--num_gpus` is given and then
    uses GPUs 0..N-1 (`CUDA_VISIBLE_DEVICES=4,5,6,7` would land on 0-3); only without any
    resource argument does it turn the variable into `--include localhost:<ids>` itself. So on
    CUDA with the variable set, the first `nproc` visible GPUs are named with `--include`.
    On the CPU there are no devices to pick: `--num_gpus` is the number of ranks.
    """
    resources = ["--num_gpus", str(nproc)]
    if device_type == "cuda" and visible_devices is not None and visible_devices.strip():
        resources = ["--include", f"localhost:{','.join(_visible_ids(visible_devices, nproc))}"]
    return [
        launcher,
        *resources,
        "--no_local_rank",
        "--master_port",
        str(port),
        "--module",
        "tepo_cli",
        "train",
        *overrides,
        f"trainer.nproc={nproc}",
        f"hydra.run.dir={run_dir}",
        *NO_HYDRA_OUTPUTS,  # the parent already wrote .hydra/ and logs train.log
    ]


def _visible_ids(visible_devices: str, nproc: int) -> list[str]:
    ids = [part.strip() for part in visible_devices.split(",") if part.strip()]
    if not all(part.isdigit() for part in ids):
        raise ConfigError(
            f"{VISIBLE_DEVICES}={visible_devices!r} names GPUs by UUID or another form; with "
            f"trainer.nproc={nproc} the deepspeed launcher needs their indices "
            f"(e.g. {VISIBLE_DEVICES}=4,5,6,7; `nvidia-smi -L` lists them)."
        )
    if nproc > len(ids):
        raise ConfigError(
            f"trainer.nproc={nproc}, but {VISIBLE_DEVICES}={visible_devices!r} makes only "
            f"{len(ids)} GPU(s) visible: one rank per GPU. Lower trainer.nproc or make more "
            f"GPUs visible."
        )
    return ids[:nproc]
