"""`tepo eval env=...` (envs/episode_sampler.py): every sample an episode run by its
environment, as in training, graded by it; its records say how it went and the summary adds up
the episodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tepo_cli.config.schema import RewardConfig
from tepo_cli.config.validate import load_eval_config
from tepo_cli.core.machine import describe
from tepo_cli.core.records import Problem
from tepo_cli.envs.episode_sampler import episode_summary
from tepo_cli.envs.episodes import SampledTurn
from tepo_cli.envs.sampler import build_sampler
from tepo_cli.rewards import make_reward
from tepo_cli.rollout import Sampling


class ScriptedTurns:
    """The model's side of every episode from a script (turn k of each episode: script[k]); the
    environment, its sandbox and the grader are the real ones."""

    def __init__(self, tokenizer, script: list[str]) -> None:
        eos = tokenizer.eos_token_id
        self.script = [[*tokenizer.encode(t, add_special_tokens=False), eos] for t in script]
        self.contexts: list[list[list[int]]] = []

    def sample_turns(self, contexts, max_new_tokens, sampling) -> list[SampledTurn]:
        turn = self.script[len(self.contexts) % len(self.script)]  # each batch: turn 0, 1, ...
        self.contexts.append(contexts)
        return [SampledTurn(turn[:max_new_tokens], None, ended=True) for _ in contexts]


def test_an_episode_record_holds_the_turns_the_tool_output_and_the_environments_grade(
    compose_config, tiny_tokenizer
):
    overrides = ["model=tiny", "benchmark=arith", "env=python_tool", "eval.batch_size=2"]
    config = load_eval_config(compose_config("eval", overrides))
    problems = [Problem("a", "6*7", "42"), Problem("b", "40+2", "42"), Problem("c", "1+1", "2")]
    backend = ScriptedTurns(tiny_tokenizer, ["```python\nprint(6*7)\n```", "The answer is 42."])
    reward = make_reward(RewardConfig(name="arith"), "arith")
    sampler = build_sampler(config.env, config.benchmark, config.turn_tokens)
    sampling = Sampling(n=1, greedy=True, batch_size=config.eval.batch_size)  # as eval_job's
    batches = list(sampler.records(backend, tiny_tokenizer, problems, reward, sampling))
    assert [len(batch) for batch in batches] == [2, 1]  # eval.batch_size // eval.n problems each
    records = [record for batch in batches for record in batch]
    assert [r["id"] for r in records] == ["a", "b", "c"]
    first = records[0]
    assert (first["turns"], first["tool_calls"], first["end"]) == (2, 1, "answer")
    assert first["passed"] and first["reward"] == 1.0 and first["extracted"] == "42"
    assert "42" in first["completion"].split("The answer is")[0]  # the sandbox's output, shown
    assert not records[2]["passed"]  # 1+1 is not 42
    # The second turn was sampled after the first and the observation, per episode.
    assert len(backend.contexts[1][0]) > len(backend.contexts[0][0]) + 5
    summary = episode_summary(records)
    assert summary["turns_mean"] == 2.0 and summary["tool_calls_mean"] == 1.0
    assert summary["ends"]["answer"] == 1.0 and sum(summary["ends"].values()) == 1.0


def _eval(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", "eval", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_tepo_eval_with_an_environment_writes_episodes_and_resumes(tmp_path):
    run = tmp_path / "run"
    args = ["model=tiny", "benchmark=arith", "env=python_tool", "eval.limit=3"]
    args += ["eval.max_new_tokens=8", f"hydra.run.dir={run}"]
    first = _eval(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "env=python_tool:" in first.stdout and "turns" in first.stdout
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all({"turns", "tool_calls", "end"} <= r.keys() for r in records)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env"]["name"] == "python_tool" and summary["env"]["max_turns"] == 3
    assert sum(summary["env"]["ends"].values()) == 1.0
    assert summary["machine"] == describe(torch.device("cpu"))  # where the answers came from
    again = _eval(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    # nothing left to generate: the machine that generated the answers is kept
    assert summary["resumed_problems"] == 3 and summary["machine"] == describe(torch.device("cpu"))


def test_an_environment_needs_a_model_that_takes_turns(tmp_path):
    refused = _eval("model=reference", "benchmark=arith", "env=python_tool", cwd=tmp_path)
    assert refused.returncode == 2
    assert "env=python_tool runs episodes" in refused.stderr and "model=reference" in refused.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.jsonl"))


def test_an_unknown_environment_is_named_with_the_known_ones(tmp_path):
    refused = _eval("model=tiny", "benchmark=arith", "env.name=chess", cwd=tmp_path)
    assert refused.returncode == 2
    assert "env.name=chess is not an environment" in refused.stderr
    assert "python_tool" in refused.stderr and "code_feedback" in refused.stderr
