"""Environments (tepo_cli/envs/): the registry and its contract check, the built-in environments
on real problems in the real sandbox, observation framing from the chat template, and the episode
runner's token bookkeeping, limits and failure handling."""

from __future__ import annotations

import time

import pytest
from test_code_reward import RUNNING_MAX

from tepo_cli.benchmarks.mbpp import to_problem
from tepo_cli.config.schema import RewardConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.records import Problem, RewardResult
from tepo_cli.envs import Environment, EnvSettings, environment, environments, register_environment
from tepo_cli.envs.code_feedback import visible_checks
from tepo_cli.envs.episodes import SampledTurn, run_episodes
from tepo_cli.envs.observations import ObservationFormat
from tepo_cli.rewards import make_reward

SETTINGS = EnvSettings(timeout_s=5.0)
MBPP = to_problem(
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
            "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))",
        ],
    },
    0,
    "mbpp",
)
HUMANEVAL = Problem(
    "Inline/0",
    RUNNING_MAX.prompt,
    "",
    {"prompt": RUNNING_MAX.prompt, "test": RUNNING_MAX.test, "entry_point": "running_max"},
)


def code_grader():
    return make_reward(RewardConfig(name="code", timeout_s=5.0), "code")


def test_the_registry_holds_the_built_in_environments_and_names_them_when_asked_for_another():
    assert {"single", "python_tool", "code_feedback"} <= set(environments())
    with pytest.raises(ConfigError, match=r"env.name=chess is not an environment.*code_feedback"):
        environment("chess")


def test_a_plugin_that_breaks_the_contract_is_refused_with_one_paragraph():
    class NoRespond(Environment):
        name = "no_respond"

    class NoName(Environment):
        def respond(self, turn: str) -> None:
            return None

    with pytest.raises(ConfigError, match="does not implement respond"):
        register_environment(NoRespond)
    with pytest.raises(ConfigError, match="sets no `name`"):
        register_environment(NoName)
    with pytest.raises(ConfigError, match="not a subclass"):
        register_environment(dict)  # type: ignore[arg-type]
    assert "no_respond" not in environments()


def test_python_tool_runs_the_last_block_in_the_sandbox_and_an_answer_ends_the_episode():
    tool = environment("python_tool")(Problem("p", "17*23?", "391"), code_grader(), SETTINGS)
    turn = "First a guess.\n```python\nprint(1)\n```\nBetter:\n```python\nprint(17 * 23)\n```"
    assert tool.respond(turn) == "```output\n391\n```"
    assert tool.respond("So the answer is 391.") is None
    assert tool.tool_calls() == 1 and tool.tool_failures() == {}


def test_python_tool_contains_hostile_code_and_reports_the_failure():
    tool = environment("python_tool")(
        Problem("p", "q", "1"), code_grader(), EnvSettings(timeout_s=1.0)
    )
    began = time.monotonic()
    looped = tool.respond("```python\nwhile True:\n    pass\n```")
    assert "timed out after 1 s" in looped and time.monotonic() - began < 10
    secret = tool.respond(
        "```python\nimport os\nprint(os.environ.get('HOME'), open('/etc/shadow').read())\n```"
    )
    assert "Error" in secret  # the sandbox refuses; the model sees the refusal, nothing else
    assert tool.tool_calls() == 2
    assert tool.tool_failures()["timeout"] == 1 and sum(tool.tool_failures().values()) == 2


def test_code_feedback_shows_mbpp_s_visible_test_and_rewards_the_hidden_ones():
    assert visible_checks(MBPP) == [(MBPP.extra["test_list"][0],) * 2]
    env = environment("code_feedback")(MBPP, code_grader(), SETTINGS)
    wrong = "```python\ndef similar_elements(a, b):\n    return tuple(a)\n```"
    feedback = env.respond(wrong)
    assert feedback.startswith("The visible tests failed:\nfailed: assert set(similar_elements")
    assert "(11, 12, 14, 13)" not in feedback  # a hidden test is never shown
    right = "```python\ndef similar_elements(a, b):\n    return tuple(set(a) & set(b))\n```"
    assert env.respond(right) is None
    assert env.reward([wrong, right]) == RewardResult(1.0, True, env.reward([right]).extracted)
    assert env.reward([right, wrong]).correct is False  # the last program is the one graded
    assert env.tool_calls() == 2 and env.tool_failures() == {"tests-failed": 1}


def test_code_feedback_on_humaneval_runs_the_docstring_examples():
    env = environment("code_feedback")(HUMANEVAL, code_grader(), SETTINGS)
    feedback = env.respond("    return numbers\n")
    assert "failed: running_max([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5] (got [1, 3, 2, 5, 4])" in (
        feedback
    )
    crash = env.respond("    return numbers[99]\n")
    assert "error: running_max([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]: IndexError" in crash
    assert env.respond("    return [max(numbers[: i + 1]) for i in range(len(numbers))]\n") is None


def test_an_observation_is_framed_as_the_chat_template_frames_a_message(tiny_tokenizer):
    framing = ObservationFormat(tiny_tokenizer, "user")
    ids, cut = framing.ids("```output\n391\n```", max_tokens=100)
    text = tiny_tokenizer.decode(ids)
    assert text == "\n<|im_start|>user\n```output\n391\n```<|im_end|>\n<|im_start|>assistant\n"
    assert not cut
    long_ids, cut = framing.ids(" ".join(["word"] * 50), max_tokens=10)
    assert cut and tiny_tokenizer.decode(long_ids).count("word") == 10
    assert "[cut]" in tiny_tokenizer.decode(long_ids)


class Scripted:
    """A sampler that answers each turn from a script (the turns as token ids), and keeps the
    contexts it was given."""

    def __init__(self, tokenizer, turns: list[list[str]]) -> None:
        eos = tokenizer.eos_token_id
        self.turns = [
            [[*tokenizer.encode(t, add_special_tokens=False), eos] for t in ep] for ep in turns
        ]
        self.calls: list[list[list[int]]] = []
        self.index = [0] * len(turns)

    def __call__(self, contexts: list[list[int]], max_new_tokens: int) -> list[SampledTurn]:
        self.calls.append(contexts)
        out = []
        for context in contexts:
            episode = self.episode_of(context)
            ids = self.turns[episode][self.index[episode]]
            self.index[episode] += 1
            out.append(SampledTurn(ids[:max_new_tokens], None, ended=len(ids) <= max_new_tokens))
        return out

    def episode_of(self, context: list[int]) -> int:
        return context[0]  # the tests' prompts start with their episode's index


def test_episode_tokens_are_the_sampled_ids_and_the_observations_in_between(tiny_tokenizer):
    turns = [["```python\nprint(6*7)\n```", "The answer is 42."], ["The answer is 5."]]
    sampler = Scripted(tiny_tokenizer, turns)
    grader = make_reward(RewardConfig(name="arith"), "arith")
    problems = [Problem("a", "6*7", "42"), Problem("b", "2+3", "5")]
    envs = [environment("python_tool")(p, grader, SETTINGS) for p in problems]
    episodes = run_episodes(sampler, tiny_tokenizer, [[0, 11], [1, 12]], envs, SETTINGS)
    first, second = episodes
    observation, _ = ObservationFormat(tiny_tokenizer).ids("```output\n42\n```", 128)
    assert first.ids == sampler.turns[0][0] + observation + sampler.turns[0][1]
    assert first.model_mask == [True] * len(sampler.turns[0][0]) + [False] * len(observation) + [
        True
    ] * len(sampler.turns[0][1])
    # The second turn was sampled from exactly the prompt, the first turn and the observation.
    assert sampler.calls[1] == [[0, 11] + sampler.turns[0][0] + observation]
    assert first.end == "answer" and first.reward.correct and first.environment.tool_calls() == 1
    assert second.ids == sampler.turns[1][0] and second.end == "answer" and second.reward.correct
    assert first.observation_tokens == len(observation)


def test_limits_end_episodes_and_say_which(tiny_tokenizer):
    code = "```python\nprint(1)\n```"
    grader = make_reward(RewardConfig(name="arith"), "arith")
    problem = Problem("a", "q", "1")

    def run(settings: EnvSettings, turns: list[str]):
        envs = [environment("python_tool")(problem, grader, settings)]
        return run_episodes(
            Scripted(tiny_tokenizer, [turns]), tiny_tokenizer, [[0]], envs, settings
        )[0]

    assert run(EnvSettings(max_turns=2), [code, code]).end == "turn-limit"
    cut = run(EnvSettings(max_turn_tokens=3), ["a long answer that goes on and on"])
    assert cut.end == "turn-tokens" and len(cut.ids) == 3 and cut.reward is not None
    tight = run(EnvSettings(max_turn_tokens=64, max_episode_tokens=20), [code, "The answer is 1."])
    assert tight.end == "episode-tokens" and len(tight.ids) <= 20


class Raises(Environment):
    name = "raises"

    def respond(self, turn: str) -> str | None:
        raise RuntimeError("the environment's own bug")


class Malformed(Environment):
    name = "malformed"

    def respond(self, turn: str) -> str | None:
        return {"observation": turn}  # type: ignore[return-value]


class Hangs(Environment):
    name = "hangs"

    def respond(self, turn: str) -> str | None:
        time.sleep(30)
        return None


def test_a_failing_environment_ends_its_episode_with_reward_zero_and_the_others_go_on(
    tiny_tokenizer,
):
    grader = make_reward(RewardConfig(name="arith"), "arith")
    problem = Problem("a", "q", "1")
    settings = EnvSettings(respond_timeout_s=0.5)
    classes = [Raises, Malformed, Hangs, environment("single")]
    envs = [cls(problem, grader, settings) for cls in classes]
    turns = [["The answer is 1."]] * len(classes)
    began = time.monotonic()
    episodes = run_episodes(
        Scripted(tiny_tokenizer, turns), tiny_tokenizer, [[i] for i in range(4)], envs, settings
    )
    assert time.monotonic() - began < 5  # the hanging environment does not hold the run
    assert [e.end for e in episodes] == ["env-error", "env-malformed", "env-timeout", "answer"]
    assert [e.reward.reward for e in episodes] == [0.0, 0.0, 0.0, 1.0]
    assert [e.error for e in episodes] == [
        "environment raises: respond raised RuntimeError: the environment's own bug",
        "environment malformed: respond returned dict, not str or None",
        "environment hangs: respond did not answer within env.respond_timeout_s=0.5 s",
        None,
    ]


class RaisesInInit(Environment):
    name = "raises_init"

    def __init__(self, problem, grader, settings) -> None:
        raise KeyError("no board")

    def respond(self, turn: str) -> str | None:
        return None


class RaisesInTurnEnd(Environment):
    name = "raises_turn_end"

    def turn_end(self, text: str) -> int | None:
        raise IndexError("offset\nout of range")  # the message's lines become one

    def respond(self, turn: str) -> str | None:
        return None


class TurnEndMalformed(RaisesInTurnEnd):
    name = "turn_end_malformed"

    def turn_end(self, text: str) -> int | None:
        return 2.5  # type: ignore[return-value]


class RaisesInReward(Environment):
    name = "raises_reward"

    def respond(self, turn: str) -> str | None:
        return None

    def reward(self, turns: list[str]) -> RewardResult:
        raise ValueError("scorer broke")


class RewardMalformed(RaisesInReward):
    name = "reward_malformed"

    def reward(self, turns: list[str]) -> RewardResult:
        return 1.0  # type: ignore[return-value]


class RaisesInToolCalls(RaisesInReward):
    name = "raises_tool_calls"

    def reward(self, turns: list[str]) -> RewardResult:
        return RewardResult(1.0, True, "1")

    def tool_calls(self) -> int:
        return 1 // 0


def test_every_hook_s_failure_is_contained_and_says_which_environment_hook_and_why(
    tiny_tokenizer,
):
    from tepo_cli.envs.episodes import make_environments

    grader = make_reward(RewardConfig(name="arith"), "arith")
    problem = Problem("a", "q", "1")
    classes = [
        RaisesInInit,
        RaisesInTurnEnd,
        TurnEndMalformed,
        RaisesInReward,
        RewardMalformed,
        RaisesInToolCalls,
        environment("single"),
    ]
    envs = [made for cls in classes for made in make_environments(cls, [problem], grader, SETTINGS)]
    turns = [["The answer is 1."]] * len(classes)
    sampler = Scripted(tiny_tokenizer, turns)
    prompts = [[i] for i in range(len(classes))]
    episodes = run_episodes(sampler, tiny_tokenizer, prompts, envs, SETTINGS)
    assert [e.end for e in episodes] == [
        *["env-error", "env-error", "env-malformed", "env-error", "env-malformed", "env-error"],
        "answer",
    ]
    assert [e.error for e in episodes] == [
        "environment raises_init: __init__ raised KeyError: 'no board'",
        "environment raises_turn_end: turn_end raised IndexError: offset out of range",
        "environment turn_end_malformed: turn_end returned float, not an int or None",
        "environment raises_reward: reward raised ValueError: scorer broke",
        "environment reward_malformed: reward returned float, not a RewardResult "
        "(tepo_cli.core.records.RewardResult)",
        "environment raises_tool_calls: tool_calls raised ZeroDivisionError: integer division "
        "or modulo by zero",
        None,
    ]
    assert [e.reward.reward for e in episodes] == [0.0] * 6 + [1.0]
    # every episode, the failed ones included, holds the model's turn as sampled
    assert all(e.ids == sampler.turns[i][0] for i, e in enumerate(episodes))


def test_the_hf_sampler_takes_ids_and_the_episode_keeps_exactly_what_it_sampled(
    tiny_model, tiny_tokenizer, monkeypatch
):
    import torch

    from tepo_cli.rollout import hf
    from tepo_cli.rollout.backend import Sampling

    # Every even token id ends a turn: the tiny random model's turns end after a few tokens, so
    # its episodes run over several turns.
    monkeypatch.setattr(hf, "eos_ids", lambda model, tokenizer: list(range(0, 50000, 2)))
    sampling = Sampling(temperature=1.0, max_new_tokens=12)
    sampled: dict[tuple[int, ...], list[int]] = {}

    def sample(contexts: list[list[int]], max_new_tokens: int) -> list[SampledTurn]:
        turns = hf.sample_turns(tiny_model, tiny_tokenizer, contexts, max_new_tokens, sampling)
        sampled.update({tuple(c): t.ids for c, t in zip(contexts, turns, strict=True)})
        return turns

    class Echo(Environment):  # always answers, so the episode runs to its turn limit
        name = "echo"

        def respond(self, turn: str) -> str:
            return f"you wrote {len(turn)} characters"

    torch.manual_seed(0)
    settings = EnvSettings(max_turns=3, max_turn_tokens=12, max_episode_tokens=200)
    prompts = [tiny_tokenizer.encode(text, add_special_tokens=False) for text in ("Hi.", "Go on.")]
    grader = make_reward(RewardConfig(name="arith"), "arith")
    envs = [Echo(Problem("a", "q", "1"), grader, settings) for _ in prompts]
    episodes = run_episodes(sample, tiny_tokenizer, prompts, envs, settings)
    framing = ObservationFormat(tiny_tokenizer)
    for prompt, episode in zip(prompts, episodes, strict=True):
        assert len(episode.turns) == 3 and episode.end == "turn-limit"
        # Rebuilt from what the sampler returned for each context: every turn is the sampled
        # ids, sampled from the prompt and every earlier turn and observation, as ids.
        context, rebuilt, mine = list(prompt), [], []
        for index, text in enumerate(episode.turns):
            turn = sampled[tuple(context)]
            assert tiny_tokenizer.decode(turn, skip_special_tokens=True) == text
            rebuilt += turn
            mine += [True] * len(turn)
            if index < 2:
                observation, _ = framing.ids(f"you wrote {len(text)} characters", 128)
                rebuilt += observation
                mine += [False] * len(observation)
            context = list(prompt) + rebuilt
        assert episode.ids == rebuilt and episode.model_mask == mine


def test_python_tool_stops_a_turn_at_its_first_closed_block_and_closes_the_message(
    tiny_tokenizer,
):
    code = "Let me compute.\n```python\nprint(2 + 3)\n```"
    turns = [[code + "\nSo it is 7, I think, and more text after.", "The answer is 5."]]
    sampler = Scripted(tiny_tokenizer, turns)
    grader = make_reward(RewardConfig(name="arith"), "arith")
    envs = [environment("python_tool")(Problem("a", "2+3", "5"), grader, SETTINGS)]
    (episode,) = run_episodes(sampler, tiny_tokenizer, [[0]], envs, SETTINGS)
    sampled = sampler.turns[0][0]
    kept = episode.model_mask.index(False)  # the model's first turn, as kept
    assert episode.ids[:kept] == sampled[:kept] and kept < len(sampled)
    assert tiny_tokenizer.decode(episode.ids[:kept]).rstrip() == code
    eos = tiny_tokenizer.eos_token_id
    observation, _ = ObservationFormat(tiny_tokenizer).ids("```output\n5\n```", 128)
    # the stopped message is closed by an end-of-message token that is context, not trained
    assert episode.ids[kept : kept + 1 + len(observation)] == [eos, *observation]
    assert episode.turns == [code, "The answer is 5."]
    assert episode.end == "answer" and episode.reward.correct


def test_python_tool_shows_the_program_s_own_traceback():
    tool = environment("python_tool")(Problem("p", "q", "1"), code_grader(), SETTINGS)
    shown = tool.respond("```python\nx = 1\nprint(y)\n```")
    assert shown.startswith("```output\nTraceback (most recent call last):\n  File ")
    assert 'main.py", line 2, in <module>' in shown and "NameError" in shown
    assert "_supervise" not in shown and "runpy" not in shown
    assert tool.tool_failures() == {"exit-code": 1}
