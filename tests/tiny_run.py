"""A few training steps of the tiny in-process model on a parity reward (an answer of even length
is right), for the end-to-end tests of an objective's knobs: the config and the step records."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tepo_cli.config.schema import TrainConfig
from tepo_cli.config.validate import load_train_config
from tepo_cli.runtime.hooks import RunHooks


@dataclass(frozen=True)
class TinyRun:
    config: TrainConfig
    summary: dict[str, Any]  # what `train` returned
    lines: list[dict[str, Any]]  # every record of metrics.jsonl

    @property
    def records(self) -> list[dict[str, Any]]:
        """The training steps' records."""
        return [r for r in self.lines if "step" in r]


def tiny_run(
    compose_config: Any,
    tmp_path: Path,
    overrides: list[str],
    steps: int = 2,
    hooks: RunHooks | None = None,
) -> TinyRun:
    """Train `steps` steps with `overrides` in `tmp_path` (checked to log each step once);
    `hooks`: the run's, to stop it at a point."""
    from tepo_cli.algos.plugins import load_objectives
    from tepo_cli.runtime.distributed import setup_topology, teardown
    from tepo_cli.train.recipe import train

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "parity.py").write_text(
        "def score(completion, problem):\n    return len(completion) % 2 == 0\n"
    )
    config = load_train_config(
        compose_config(
            "train",
            [
                "model=tiny",
                "reward=custom",
                f"reward.path={tmp_path / 'parity.py'}",
                f"trainer.max_steps={steps}",
                "trainer.eval_before=false",
                "trainer.eval_after=false",
                "trainer.save_final=false",
                "trainer.progress=false",
                "rollout.max_new_tokens=8",
                *overrides,
            ],
        )
    )
    load_objectives(config.plugins, config.algo.name)
    topo = setup_topology(num_threads=None)
    try:
        summary = train(config, tmp_path, topo, hooks)
    finally:
        teardown()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    run = TinyRun(config, summary, [json.loads(line) for line in lines])
    assert summary["steps"] == steps
    assert [r["step"] for r in run.records] == list(range(1, steps + 1))
    return run
