"""What a user sees of their environment in a training run, piece by piece: the defaults and
the start line, the per-episode metrics and their units, the errors on the console and in
train.log, the samples' episode fields, and a plugin file importing the module beside it."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from tepo_cli.config.env_schema import EnvConfig
from tepo_cli.core.records import Problem
from tepo_cli.core.user_code import import_user_code
from tepo_cli.envs.env_start import environment_line
from tepo_cli.runtime.metrics import RunLog
from tepo_cli.train.env_errors import report_env_errors
from tepo_cli.train.step_records import _episode_metrics


def test_max_turns_left_out_is_one_for_single_and_three_for_any_other_environment():
    assert EnvConfig().max_turns == 1 and not EnvConfig().turns_defaulted
    mine = EnvConfig(name="guess_number")
    assert mine.max_turns == 3 and mine.turns_defaulted
    assert mine.episode_tokens(16) == 3 * 16 + 2 * (128 + 32)
    chosen = EnvConfig(name="guess_number", max_turns=5)
    assert chosen.max_turns == 5 and not chosen.turns_defaulted
    assert EnvConfig.model_validate(mine.model_dump()).max_turns == 3  # config.yaml round trip


def test_the_start_line_says_the_turns_and_the_held_out_evaluation_s_size(compose_config):
    from tepo_cli.config.validate import load_train_config

    def line(*overrides: str, problems: int = 100) -> str:
        cfg = load_train_config(compose_config("train", ["model=tiny", *overrides]))
        return environment_line(cfg.env, cfg.trainer, problems)

    assert line("env.name=guess_number", "trainer.eval_every=10", "env.eval_size=20") == (
        "env.name=guess_number: up to 3 turns per episode (env.max_turns not set: 3, the "
        "multi-turn default); the held-out evaluation (before, every 10 steps, after) plays one "
        "greedy episode on each of 100 held-out problems, the first 20 (env.eval_size): up to 3 "
        "generations each, up to 3x a single-answer evaluation; env.eval_size=N evaluates on "
        "fewer, trainer.eval_before=false / trainer.eval_after=false skip it"
    )
    assert line("env=python_tool", "trainer.eval_before=false", "trainer.eval_after=false") == (
        "env.name=python_tool: up to 3 turns per episode; no held-out evaluation"
    )


def test_every_env_metric_is_per_episode():
    # Two ranks' worth summed into one (one process: the collective is the identity): 4
    # episodes, 10 turns, 6 tool calls of which 3 failed and 1 timed out, 2 observations cut.
    sums = {
        "episodes": 4.0,
        "env_turns": 10.0,
        "env_tool_calls": 6.0,
        "env_tool_failures": 3.0,
        "env_tool_timeouts": 1.0,
        "env_observation_tokens": 50.0,
        "env_observations_cut": 2.0,
        "env_end_answer": 3.0,
        "env_end_env_error": 1.0,
    }
    assert _episode_metrics(sums, torch.device("cpu")) == {
        "env_turns_mean": 2.5,
        "env_tool_calls_mean": 1.5,
        "env_tool_failures_mean": 0.75,
        "env_tool_timeouts_mean": 0.25,
        "env_observation_tokens_mean": 12.5,
        "env_observations_cut_mean": 0.5,
        "env_end_answer_frac": 0.75,
        "env_end_env_error_frac": 0.25,
    }


def test_errors_go_to_train_log_every_one_and_to_the_console_the_first(tmp_path, capsys):
    errors = [
        "environment guess: respond raised ValueError: [1, 2] is not a guess",  # no markup
        "environment guess: respond raised ValueError: twice",
        "environment guess: reward raised KeyError: 'x'",
    ]
    with RunLog(tmp_path, total_steps=1, show_progress=False) as log:
        log.console.width = 60  # narrower than the line: it must stay one line
        report_env_errors(errors, "step 3", log)
        report_env_errors([], "step 4", log)  # nothing to say: nothing said
    console = capsys.readouterr().err.splitlines()
    assert console == [
        f"step 3: 3 episode(s) ended by an environment error: {errors[0]} (2 more, every one "
        "in train.log)"
    ]
    for handler in logging.getLogger("tepo_cli.envs.errors").handlers:
        handler.flush()
    logged = (tmp_path / "train.log").read_text().splitlines()
    assert [row.split(" - ", 1)[1] for row in logged] == [f"step 3: {e}" for e in errors]
    assert all("[tepo_cli.envs.errors][WARNING]" in row for row in logged)


def test_a_plugin_file_imports_the_module_beside_it(tmp_path, monkeypatch):
    (tmp_path / "sibling_helper_54.py").write_text("ANSWER = 42\n")
    (tmp_path / "sibling_plugin_54.py").write_text(
        "import sibling_helper_54\n\nVALUE = sibling_helper_54.ANSWER + 1\n"
    )
    monkeypatch.chdir("/")  # not the plugin's folder: found by the file's own
    monkeypatch.setattr(sys, "path", list(sys.path))
    module = import_user_code(str(tmp_path / "sibling_plugin_54.py"), "plugins")
    assert module.VALUE == 43
    sys.modules.pop("sibling_helper_54", None)


@pytest.mark.parametrize("samples_per_step", [2, 0])
def test_samples_carry_the_episode_and_show_a_failed_one(compose_config, samples_per_step):
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.core.rollout_record import Rollout
    from tepo_cli.train.experience import Experience
    from tepo_cli.train.step_records import step_samples

    cfg = load_train_config(
        compose_config(
            "train",
            [
                "model=tiny",
                "env.name=guess_number",
                "rollout.n=2",
                f"trainer.samples_per_step={samples_per_step}",
            ],
        )
    )
    fields = [
        {"turns": 2, "tool_calls": 0, "tool_failures": 0, "end": "answer", "error": None},
        {"turns": 1, "tool_calls": 0, "tool_failures": 0, "end": "turn-limit", "error": None},
        {"turns": 1, "tool_calls": 0, "tool_failures": 0, "end": "env-error", "error": "boom"},
        {"turns": 1, "tool_calls": 0, "tool_failures": 0, "end": "env-error", "error": "bang"},
    ]
    ids = torch.zeros((4, 1), dtype=torch.long)
    rollout = Rollout(
        ids, ids, ids, ids.bool(), ["a", "b", "c", "d"], torch.zeros(4, dtype=torch.bool), None
    )
    experience = Experience(
        problems=[Problem("p", "1+1", "2"), Problem("q", "2+2", "4")],
        rollout=rollout,
        batch=None,  # type: ignore[arg-type]  # not read for one-number advantages
        rewards=torch.tensor([1.0, 0.5, 0.0, 0.0]),
        correct=torch.tensor([True, False, False, False]),
        advantages=torch.tensor([0.5, -0.5, 0.0, 0.0]),
        episode_records=fields,
    )
    samples = step_samples(cfg, 7, experience)
    if samples_per_step == 0:
        assert samples == []
        return
    assert [s["completion"] for s in samples] == ["a", "b", "c"]  # the first failed row added
    assert samples[2] == {
        "step": 7,
        "question": "2+2",
        "answer": "4",
        "completion": "c",
        "reward": 0.0,
        "advantage": 0.0,
        **fields[2],
    }
    assert samples[0]["end"] == "answer" and samples[0]["turns"] == 2
