"""A user's own environment, written from docs/guides/environments.md alone
(tests/user_env/guess_number.py: guess the number, a shaped reward from per-episode state, a
`turn_end`, a helper module beside it), trains multi-turn on the tiny model; and each faulty
variant (a hook that raises, one that hangs, a malformed observation) ends its episodes with
reward 0, says why on the console, in train.log and in samples.jsonl, and the run exits 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PLUGIN = Path(__file__).resolve().parent / "user_env" / "guess_number.py"
QUICK = [
    "model=tiny",
    "rollout=hf",
    f"plugins=[{PLUGIN}]",  # run from elsewhere: `import hints` must find the file's sibling
    "trainer.eval_after=false",
    "trainer.save_final=false",
    "trainer.progress=false",
]


def train(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [a for a in args if a.startswith("-")]  # `-m` before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", *flags, *QUICK, *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_guide_s_guessing_game_trains_two_multi_turn_steps(tmp_path):
    # No env.max_turns: a plugin environment plays 3 turns, and the start line says so; the
    # held-out evaluation plays the first 2 problems (env.eval_size), and says its cost.
    result = train(
        tmp_path,
        "env.name=guess_number",
        "trainer.max_steps=2",
        "env.eval_size=2",
        "hydra.run.dir=run",
    )
    assert (
        "tepo train: env.name=guess_number: up to 3 turns per episode (env.max_turns not set: 3, "
        "the multi-turn default); the held-out evaluation (before) plays one greedy episode on "
        "each of 2 held-out problems, the first 2 (env.eval_size)"
    ) in result.stderr
    assert "eval (before, step 0): accuracy 0.000 on 2 held-out problems" in result.stderr
    run = tmp_path / "run"
    records = lines(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["env_turns_mean"] > 1.0  # episodes, not single answers
        ends = [v for k, v in record.items() if k.startswith("env_end_")]
        assert sum(ends) == pytest.approx(1.0)
        assert record["env_end_env_error_frac"] == 0.0
        assert {"env_tool_failures_mean", "env_observations_cut_mean"} <= set(record)
    samples = lines(run / "samples.jsonl")
    assert len(samples) == 8  # trainer.samples_per_step=4, two steps, none failed
    for sample in samples:
        assert sample["end"] in ("answer", "turn-limit", "turn-tokens", "episode-tokens")
        assert sample["turns"] >= 1 and sample["error"] is None
        assert 0.0 <= sample["reward"] <= 1.0  # the shaped reward's range
    assert "episode(s) ended by an environment error" not in result.stderr


# (variant, the hook named, the end reason, whether every episode reaches that hook)
FAULTY = [
    ("guess_raise_init", "__init__ raised KeyError: 'no such board'", "env-error", True),
    ("guess_raise_turn_end", "turn_end raised IndexError: turn_end fell over", "env-error", True),
    (
        "guess_raise_respond",
        "respond raised ZeroDivisionError: division by zero",
        "env-error",
        False,
    ),
    ("guess_raise_reward", "reward raised ValueError: the scorer is broken", "env-error", False),
    ("guess_hang", "respond did not answer within env.respond_timeout_s=2 s", "env-timeout", False),
    ("guess_malformed", "respond returned dict, not str or None", "env-malformed", False),
]


def test_each_faulty_environment_is_contained_and_says_why(tmp_path):
    names = ",".join(name for name, *_ in FAULTY)
    result = train(
        tmp_path,
        "-m",
        f"env.name={names}",
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "env.respond_timeout_s=2",
        "hydra.sweep.dir=sweep",
        "hydra.sweep.subdir=${env.name}",
    )
    for name, message, end, every in FAULTY:
        run = tmp_path / "sweep" / name
        line = f"environment {name}: {message}"
        # the console: the step's first error, on one line, with the count
        console = [row for row in result.stderr.splitlines() if line in row]
        assert len(console) == 1 and console[0].startswith("step 1: "), name
        assert "episode(s) ended by an environment error" in console[0]
        # train.log: every one
        logged = [row for row in (run / "train.log").read_text().splitlines() if line in row]
        record = lines(run / "metrics.jsonl")[-1]
        failed = record[f"env_end_{end.replace('-', '_')}_frac"]
        assert len(logged) == round(failed * 16) >= 1, name  # 2 prompts x rollout.n=8
        assert failed == 1.0 or not every, name
        assert record["reward_mean"] == 0.0 or not every, name
        # samples.jsonl: the failed episodes' records carry it
        errors = [s for s in lines(run / "samples.jsonl") if s["error"] is not None]
        assert errors and all(s["error"] == line and s["end"] == end for s in errors), name
        assert all(s["reward"] == 0.0 for s in errors), name
