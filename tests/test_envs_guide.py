"""The environments guide (docs/guides/environments.md) runs as written, offline, on the tiny
model: its worked example's plugin file is written out and its command trains, with the episode
metrics in the run's records; and every other `tepo` command of the page runs to the end with
the hub unreachable (HF_HUB_OFFLINE), shrunk to 2 steps of tiny sizes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from markers import needs_vllm
from test_docs_examples import BLOCK, QUICK

from tepo_cli.data.prepare import prepare, problem_with

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "environments.md"

pytestmark = pytest.mark.slow


def test_the_guide_s_environment_trains(tmp_path):
    section = PAGE.read_text().split("## A worked example", 1)[1].split("\n## ", 1)[0]
    blocks = list(BLOCK.finditer(section))
    files = {m["file"]: m["body"] for m in blocks if m["file"]}
    commands = [shlex.split(m["body"]) for m in blocks if not m["file"]]
    assert list(files) == ["guess.py"] and len(commands) == 1
    (tmp_path / "guess.py").write_text(files["guess.py"])
    args = commands[0]
    assert args[:2] == ["tepo", "train"]
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args[1:], *QUICK, "hydra.run.dir=run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["env_turns_mean"] >= 1.0
    ends = sum(value for key, value in record.items() if key.startswith("env_end_"))
    assert ends == pytest.approx(1.0)


def test_a_plugin_breaking_the_contract_is_refused_at_start(tmp_path):
    (tmp_path / "broken.py").write_text(
        "from tepo_cli.envs import Environment, register_environment\n\n"
        "@register_environment\nclass Broken(Environment):\n    name = 'broken'\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tepo_cli",
            "train",
            "plugins=[broken.py]",
            "env.name=broken",
            *QUICK,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "does not implement respond" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists() or not any(
        (tmp_path / "outputs").rglob("metrics.jsonl")
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.name=chess", "env.name=chess is not an environment; the environments are:"),
        ("env=chess", "is chosen with env.name=chess, not env=chess"),
    ],
)
def test_an_unknown_environment_lists_the_known_ones(tmp_path, override, message):
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", override, *QUICK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert message in result.stderr and "python_tool" in result.stderr


def test_hf_episodes_under_zero3_on_several_ranks_are_refused(compose_config):
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.core.errors import ConfigError

    cfg = compose_config(
        "train", ["env=python_tool", "deepspeed=zero3", "trainer.nproc=2", "model=tiny"]
    )
    with pytest.raises(
        ConfigError, match=r"rollout=vllm .one engine per rank., or deepspeed=zero2"
    ):
        load_train_config(cfg)


# What every guide command gets appended: the tiny model, 2 steps of 2 prompts x 2 answers of 8
# tokens, no held-out evaluation inside training (the eval commands are run as well).
TINY_TRAIN = [
    "model=tiny",
    "trainer.max_steps=2",
    "trainer.prompts_per_step=2",
    "rollout.n=2",
    "rollout.max_new_tokens=8",
    "trainer.eval_before=false",
    "trainer.eval_after=false",
    "trainer.save_every=0",
]
TINY_EVAL = ["model=tiny", "eval.limit=2", "benchmark.max_new_tokens=8"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def guide_commands() -> list[str]:
    """The page's `tepo` lines in fenced shell blocks, outside the worked example (which
    test_the_guide_s_environment_trains runs with its plugin file)."""
    text = PAGE.read_text().split("## A worked example", 1)[0]
    blocks = re.findall(r"```([a-z]*)\n(.*?)```", text, re.S)  # every fence, so none pairs wrongly
    shell = [body for language, body in blocks if language in ("", "bash", "sh", "shell")]
    return [
        line.strip() for body in shell for line in body.splitlines() if line.startswith("tepo ")
    ]


def test_the_guide_s_commands_are_the_ones_run_here():
    assert guide_commands() == [
        "tepo train env=python_tool benchmark=word_math rollout=vllm",
        "tepo train env=code_feedback benchmark=mbpp env.max_turns=4",
        "tepo eval model.path=outputs/train/<date>/<time>/final benchmark=word_math env=python_tool",
        "tepo eval benchmark=mbpp env=code_feedback env.max_turns=4 eval.limit=50 rollout=vllm",
    ]


def run_offline(tmp_path: Path, command: str) -> subprocess.CompletedProcess[str]:
    args = shlex.split(command)
    tiny = TINY_TRAIN if args[1] == "train" else TINY_EVAL
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args[1:], *tiny],
        cwd=tmp_path,
        env=dict(os.environ, **OFFLINE),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def mbpp_prepared() -> None:
    """`tepo data prepare benchmark=mbpp`, as the guide's reader has run (online, once)."""
    if problem_with("mbpp"):
        prepare(["mbpp"])


def test_the_code_feedback_command_trains_on_mbpp_offline(tmp_path, mbpp_prepared):
    """Before MBPP's offline `train` split (data/derived_splits.py) this stopped at start:
    "Could not load split 'train' of the hub dataset 'google-research-datasets/mbpp:full'"."""
    result = run_offline(tmp_path, guide_commands()[1])
    assert "training on mbpp 'train' (400 problems; prepared offline:" in result.stderr
    (summary,) = tmp_path.glob("outputs/train/*/*/summary.json")
    assert json.loads(summary.read_text())["steps"] == 2
    (metrics,) = tmp_path.glob("outputs/train/*/*/metrics.jsonl")
    record = json.loads(metrics.read_text().splitlines()[-1])
    assert 1.0 <= record["env_turns_mean"] <= 4.0


@needs_vllm
def test_the_vllm_commands_run_offline_and_the_trained_model_evaluates(tmp_path, mbpp_prepared):
    """The page's python_tool training (rollout=vllm), `tepo eval` of its final model (the
    page's `<date>/<time>` placeholder: that run's directory), and the vLLM MBPP evaluation."""
    train, _, evaluate, evaluate_mbpp = guide_commands()
    run_offline(tmp_path, train)
    (final,) = tmp_path.glob("outputs/train/*/*/final")
    run_offline(tmp_path, evaluate.replace("outputs/train/<date>/<time>/final", str(final)))
    run_offline(tmp_path, evaluate_mbpp)
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("outputs/eval/*/*/summary.json")]
    assert sorted(s["problems"] for s in summaries) == [2, 2]


def test_the_guide_s_shaped_reward_pays_what_it_says(tiny_tokenizer):
    """The page's per-episode-state example, run as written on scripted turns: `turn_end` cuts
    a turn after its guess, the guesses are the episode's own, and the reward is shaped."""
    from test_envs import Scripted

    from tepo_cli.config.schema import RewardConfig
    from tepo_cli.core.records import Problem
    from tepo_cli.envs import EnvSettings, environment
    from tepo_cli.envs.episodes import run_episodes
    from tepo_cli.rewards import make_reward

    section = PAGE.read_text().split("### Per-episode state and a shaped reward", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "guess_shaped.py", "exec"), {"__name__": "guess_shaped"})
    shaped = environment("guess_shaped")
    settings = EnvSettings(max_turns=3)
    grader = make_reward(RewardConfig(name="arith"), "arith")
    turns = [
        ["My Guess: 7 and then some more words", "Guess: 5"],  # right on the 2nd guess
        ["Guess: 3", "Guess: 4", "Guess: 9"],  # out of turns, 4 away
        ["hello", "hello", "hello"],  # never a guess
    ]
    envs = [shaped(Problem(str(i), "2+3", "5"), grader, settings) for i in range(3)]
    sampler = Scripted(tiny_tokenizer, turns)
    episodes = run_episodes(sampler, tiny_tokenizer, [[0], [1], [2]], envs, settings)
    right, missed, silent = episodes
    assert right.turns == ["My Guess: 7", "Guess: 5"] and right.end == "answer"
    assert right.reward.reward == 0.75 and right.reward.correct  # 1.25 - 0.25 * 2
    assert right.reward.extracted == "5" and right.environment.guesses == [7, 5]
    assert missed.end == "turn-limit" and missed.environment.guesses == [3, 4, 9]
    assert missed.reward.reward == pytest.approx(0.2 / 5) and not missed.reward.correct
    assert silent.reward.reward == 0.0 and silent.reward.extracted is None
