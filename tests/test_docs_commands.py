"""Every `tepo train` and `tepo eval` command the README and the documentation site show composes
and validates as written: the keys exist, the group choices exist, the values are allowed. A key
renamed in the code and not in the pages fails here, before a reader copies it.

The commands are read from the pages' code blocks (a `$ ` prompt, backslash continuations and
trailing comments understood). A `-m` sweep is checked one value at a time for each swept key.
Not checked here, because other tests run them whole: the commands of the "extending tepo" page
(tests/test_docs_examples.py writes their files and runs them) and those shown with their output
(tests/test_docs_outputs.py compares what they print). `outputs/train/<date>/<time>` placeholders
stand for a run directory, made here with a saved model in its final/.

Then each command runs as a reader runs it, through the command line with `--dry-run` appended
(tests/dry_run_many.py runs them, one process per test worker): it exits 0, says "the
configuration is valid" once per job of a sweep, and writes nothing. A command whose install is
absent here (vLLM for `rollout=vllm`, a tracker's package for `logger=`) is skipped, the reason
named in the skip.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import IO

import pytest
from hydra import compose, initialize_config_module
from omegaconf import open_dict

from tepo_cli.config.overrides import check_override_keys, quote_weight_specs
from tepo_cli.config.validate import load_eval_config, load_train_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN_ELSEWHERE = {ROOT / "docs" / "guides" / "extending.md"}  # tests/test_docs_examples.py
CODE_BLOCK = re.compile(r"(?P<marker><!-- output -->\n)?```[a-z]*\n(?P<body>.*?)```", re.S)
# `tepo train ...` (after an optional `$ ` prompt), or DeepSpeed's launcher starting the same job:
# `deepspeed ... --module tepo_cli train ...`.
COMMAND = re.compile(r"^(?:\$ )?tepo (?P<job>(?:train|eval)(?: .*)?)$")
LAUNCHER = re.compile(r"^deepspeed .*--module tepo_cli (?P<job>(?:train|eval)(?: .*)?)$")


def documented_commands() -> list[tuple[str, str]]:
    """(page, command line) of every tepo train/eval command in a code block of the pages."""
    found = []
    for page in PAGES:
        if page in RUN_ELSEWHERE:
            continue
        for block in CODE_BLOCK.finditer(page.read_text()):
            if block["marker"]:
                continue  # shown with its output: tests/test_docs_outputs.py
            body = re.sub(r"\\\n\s*", " ", block["body"])
            for line in body.splitlines():
                match = COMMAND.match(line.strip()) or LAUNCHER.match(line.strip())
                if match:
                    found.append((str(page.relative_to(ROOT)), f"tepo {match['job']}"))
    return found


def _configs(args: list[str]) -> list[list[str]]:
    """The override lists one command composes: itself, or, for a `-m` sweep, one list per
    swept value (each key's values in turn, the other keys at their first value)."""
    if "-m" not in args and "--multirun" not in args:
        return [args]
    args = [arg for arg in args if arg not in ("-m", "--multirun")]
    swept = {
        i: arg.split("=", 1)[1].split(",")
        for i, arg in enumerate(args)
        if "=" in arg and "," in arg and not re.search(r"=\s*[\[{'\"]", arg)
    }
    first = [
        f"{arg.split('=', 1)[0]}={swept[i][0]}" if i in swept else arg for i, arg in enumerate(args)
    ]
    lists = [first]
    for i, values in swept.items():
        key = args[i].split("=", 1)[0]
        lists += [[*first[:i], f"{key}={value}", *first[i + 1 :]] for value in values[1:]]
    return lists


def test_the_pages_show_commands_of_both_kinds():
    commands = [command for _, command in documented_commands()]
    assert len(commands) >= 30
    assert any(c.startswith("tepo eval") for c in commands)
    assert any(" -m " in c for c in commands)
    assert any("trainer.nproc=16" in c for c in commands)  # the multi-node launcher's command


@pytest.mark.parametrize(
    ("page", "command"), documented_commands(), ids=lambda v: re.sub(r"\s+", " ", v)[:60]
)
def test_a_documented_command_composes_and_validates(page, command, tmp_path):
    args = shlex.split(command, comments=True)
    subcommand = args[1]
    overrides = [arg for arg in args[2:] if arg not in ("--dry-run", "--verbose")]  # cli.py's flags
    if "--help" in overrides:
        return  # prints and exits; tests/test_docs_site.py checks what --help says
    # The run directory a placeholder stands for, with a saved model in final/: a model.path
    # that names no directory is refused (tepo_cli/config/model_path.py).
    run = tmp_path / "outputs" / "train" / "2026-01-01" / "00-00-00"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    (run / "final" / "model.safetensors").write_bytes(b"")
    overrides = [arg.replace("outputs/train/<date>/<time>", str(run)) for arg in overrides]
    overrides = [arg.replace("<date>/<time>", "2026-01-01/00-00-00") for arg in overrides]
    for config_overrides in _configs(overrides):
        config_overrides = quote_weight_specs(config_overrides)  # as tepo_cli/cli.py does
        check_override_keys(subcommand, config_overrides)
        with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
            cfg = compose(
                config_name=subcommand, overrides=config_overrides, return_hydra_config=True
            )
        with open_dict(cfg):
            del cfg["hydra"]  # Hydra's own settings; its sweep keys resolve only in a real sweep
        load = load_train_config if subcommand == "train" else load_eval_config
        load(cfg)  # raises ConfigError: one paragraph naming the key


# The Python package each `logger=` tracker imports (tepo_cli/trackers).
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
TRACKER_PACKAGES["trackio"] = "trackio"


# Commands (their arguments, comments dropped) a dry run in an empty directory cannot show valid,
# and the tests that run them instead. A sweep's `resume=true` (its own hydra.sweep.dir) is run.
NOT_DRY_RUN = {
    "tepo train resume=true": "continues the newest unfinished run, which an empty directory does not hold: "
    "tests/test_resume_faults.py kills and resumes real runs",
    "tepo train plugins=[guess.py] env.name=higher_or_lower env.max_turns=3": "the environments guide's worked example, whose plugin file is on the "
    "page: tests/test_envs_guide.py writes it out and trains",
}


def missing_install(args: list[str]) -> str | None:
    """What this machine lacks that the page says the command needs (None: nothing)."""
    if importlib.util.find_spec("vllm") is None and "vllm" in _rollout_backends(tuple(args)):
        return "rollout=vllm needs vLLM (`make install-vllm`), not installed here"
    for arg in args:
        if arg.startswith("logger="):
            for name in re.split(r"[\[\],]", arg.split("=", 1)[1]):
                package = TRACKER_PACKAGES.get(name)
                if package and importlib.util.find_spec(package) is None:
                    return f"logger={name} needs {package} (`make install-trackers`), not installed"
    return None


@cache
def _rollout_backends(args: tuple[str, ...]) -> set[str]:
    """The rollout back-ends a command's jobs generate with, as Hydra composes them: set on the
    command line (`rollout=vllm`) or chosen by a preset it names (`recipe=word_math`)."""
    overrides = [a.replace("<date>/<time>", "2026-01-01/00-00-00") for a in args[2:]]
    overrides = [a for a in overrides if not a.startswith("--")]  # cli.py's flags
    backends = set()
    for config_overrides in _configs(overrides):
        with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
            cfg = compose(config_name=args[1], overrides=quote_weight_specs(config_overrides))
        backends.add(cfg.rollout.backend)
    return backends


def jobs(args: list[str]) -> int:
    """How many jobs a command runs: 1, or a sweep's product of its swept keys' values."""
    if "-m" not in args and "--multirun" not in args:
        return 1
    configs = _configs(args)
    swept = [len(values) for values in _swept_values(args)]
    assert len(configs) == 1 + sum(n - 1 for n in swept)
    return math.prod(swept)


def _swept_values(args: list[str]) -> list[list[str]]:
    return [
        arg.split("=", 1)[1].split(",")
        for arg in args
        if "=" in arg and "," in arg and not re.search(r"=\s*[\[{'\"]", arg)
    ]


def placeholder_run(root: Path) -> Path:
    """The run directory `outputs/train/<date>/<time>` stands for, under `root`."""
    run = root / "outputs" / "train" / "2026-01-01" / "00-00-00"
    (run / "final").mkdir(parents=True, exist_ok=True)
    (run / "final" / "config.json").write_text("{}")
    (run / "final" / "model.safetensors").write_bytes(b"")
    return run


def as_run(command: str, root: Path) -> list[str]:
    args = shlex.split(command, comments=True)[1:]
    run = placeholder_run(root)
    args = [arg.replace("outputs/train/<date>/<time>", str(run)) for arg in args]
    return [arg.replace("<date>/<time>", "2026-01-01/00-00-00") for arg in args]


class DryRunner:
    """tests/dry_run_many.py kept running for this test worker: each page's commands go to the
    same interpreter, which imports tepo's libraries once for the whole session."""

    def __init__(self, errors: IO[str]) -> None:
        self.errors = errors  # a file: a full pipe would stall the process
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("dry_run_many.py"))],
            env=dict(os.environ, HYDRA_FULL_ERROR="0", HF_HUB_OFFLINE="1"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )
        self.pages: dict[str, dict[str, dict]] = {}

    def page(self, page: str, root: Path) -> dict[str, dict]:
        """Every command of `page` dry-run in `root`, once: command -> result."""
        if page not in self.pages:
            commands = [command for where, command in documented_commands() if where == page]
            runnable = [
                c
                for c in commands
                if missing_install(args := shlex.split(c, comments=True)) is None
                and " ".join(args) not in NOT_DRY_RUN
            ]
            self.pages[page] = {c: self._run(as_run(c, root), root) for c in runnable}
        return self.pages[page]

    def _run(self, args: list[str], cwd: Path) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"cwd": str(cwd), "args": args}) + "\n")
        self.process.stdin.flush()
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"dry_run_many.py ended: {self._errors()}")
            if line.startswith("{"):
                return json.loads(line)

    def _errors(self) -> str:
        self.errors.seek(0)
        return self.errors.read()[-3000:]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0, self._errors()


@pytest.fixture(scope="session")
def dry_runner() -> Iterator[DryRunner]:
    with tempfile.TemporaryFile("w+") as errors:
        runner = DryRunner(errors)
        yield runner
        runner.close()


@pytest.fixture(scope="module")
def dry_run_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("docs_dry_run")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "command"), documented_commands(), ids=lambda v: re.sub(r"\s+", " ", v)[:60]
)
def test_a_documented_command_dry_runs_from_the_command_line(
    page, command, dry_run_root, dry_runner
):
    args = shlex.split(command, comments=True)
    if "--help" in args:
        return  # prints and exits; tests/test_docs_site.py checks what --help says
    elsewhere = NOT_DRY_RUN.get(" ".join(args))
    if elsewhere is not None:
        pytest.skip(f"{page}: {command}: {elsewhere}")
    reason = missing_install(args)
    if reason is not None:
        pytest.skip(f"{page}: {reason}")
    root = dry_run_root / re.sub(r"\W", "_", page)
    root.mkdir(exist_ok=True)
    result = dry_runner.page(page, root)[command]
    assert result["code"] == 0, f"{command}\n{result['stderr'][-3000:]}"
    assert result["stdout"].count("the configuration is valid") == jobs(args[2:])
    assert sorted(p.name for p in root.iterdir()) == ["outputs"]  # the placeholder run only
    assert [p.name for p in (root / "outputs").iterdir()] == ["train"]
