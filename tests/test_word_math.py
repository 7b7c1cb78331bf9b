"""The generated word-problem benchmark: generation per seed, the held-out split, answers
recomputed from the structure, the step-count mix, config errors, and the worked solutions
through `tepo eval` (the grader's own tests: test_word_math_grader.py)."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter

import pytest

from tepo_cli.benchmarks import build_task, check_benchmark, get_benchmark
from tepo_cli.config.schema import BenchmarkConfig, RewardConfig
from tepo_cli.config.validate import load_eval_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.data.word_math_problems import WordMathOptions, WordMathTask
from tepo_cli.data.word_problems import draw_problem
from tepo_cli.eval.eval_job import run_eval
from tepo_cli.rewards.word_math_grader import is_correct


def word_math(**keys: object) -> BenchmarkConfig:
    return BenchmarkConfig(name="word_math", **keys)


def recompute(start: int, steps: list[list]) -> list[int]:
    """Every value along the way, from the structure alone (not the generator's own code)."""
    values = [start]
    for op, amount in steps:
        value = values[-1]
        if op == "div":
            assert value % amount == 0, (value, amount)
        values.append(
            {"add": value + amount, "sub": value - amount, "mul": value * amount}.get(
                op, value // amount
            )
        )
    return values


def test_default_config_is_the_yaml(compose_config):
    """The schema's defaults of the word_math keys are the YAML's (the configuration reference
    shows the schema's), and `benchmark=word_math` builds this task."""
    composed = load_eval_config(compose_config("eval", ["benchmark=word_math"])).benchmark
    options = composed.own(WordMathOptions)
    assert options == WordMathOptions()  # every own knob: the YAML's value is the schema's
    assert set(composed.model_extra) == set(WordMathOptions.model_fields)  # and the YAML sets each
    assert composed.max_new_tokens == 320 and composed.system_prompt
    assert build_task(composed).eval_problems() == WordMathTask(composed).eval_problems()
    assert len(WordMathTask(composed).eval_problems()) == options.eval_size == 100


def test_every_answer_is_right_and_every_step_stays_whole_and_in_range():
    task = WordMathTask(word_math(max_value=120))
    cfg = task.cfg  # the validated options, defaults filled in
    assert cfg.max_value == 120
    problems = task.eval_problems() + list(itertools.islice(task.train_stream(0), 3000))
    ops = Counter()
    for problem in problems:
        start, steps = problem.extra["start"], problem.extra["steps"]
        values = recompute(start, steps)
        assert problem.answer == str(values[-1])
        assert all(1 <= value <= cfg.max_value for value in values), values
        assert cfg.start_range[0] <= start <= cfg.start_range[1]
        for op, amount in steps:
            ops[op] += 1
            low, high = cfg.operand_range if op in ("add", "sub") else cfg.factor_range
            assert low <= amount <= high
        assert re.search(rf"\b{start}\b", problem.question), problem.question
        assert problem.question.endswith("?") and problem.question.count("?") == 1
        solution = problem.extra["solution"]
        assert solution.endswith(f"The answer is {problem.answer}.")
        assert is_correct(solution, problem.answer) == (True, problem.answer)
    assert set(ops) == {"add", "sub", "mul", "div"}
    assert min(ops.values()) > 0.1 * sum(ops.values())


def test_the_question_tells_the_structure():
    """The story's numbers are the start and each step's amount, in order (a halving says
    "half" instead of 2: those stories are left out here)."""
    rng = random.Random(0)
    settings = WordMathTask(word_math()).settings
    told = 0
    for _ in range(500):
        drawn = draw_problem(rng, settings)
        if "half of them" in drawn.question:
            continue
        numbers = [int(n) for n in re.findall(r"\d+", drawn.question)]
        assert numbers == [drawn.start, *(amount for _, amount in drawn.steps)], drawn.question
        told += 1
    assert told > 400


def test_generation_is_deterministic_per_seed():
    cfg = word_math()
    first, again = WordMathTask(cfg), WordMathTask(cfg)
    assert first.eval_problems() == again.eval_problems()
    assert [p.extra for p in first.eval_problems()] == [p.extra for p in again.eval_problems()]
    stream = [p.question for p in itertools.islice(first.train_stream(3), 50)]
    assert stream == [p.question for p in itertools.islice(again.train_stream(3), 50)]
    assert stream != [p.question for p in itertools.islice(first.train_stream(4), 50)]
    other_seed = WordMathTask(word_math(eval_seed=99)).eval_problems()
    assert {p.question for p in other_seed} != {p.question for p in first.eval_problems()}
    bigger = WordMathTask(word_math(eval_size=150)).eval_problems()
    assert bigger[:100] == first.eval_problems()  # a larger split extends the smaller one
    assert first.eval_problems(limit=7) == first.eval_problems()[:7]


def test_held_out_questions_are_distinct_and_never_trained_on():
    """A narrow config (one-step halvings of 2: ~7,800 distinct texts) with a large held-out
    split, so that raw draws hit held-out questions often and the filter is exercised."""
    cfg = word_math(
        steps=[1],
        step_weights=[1],
        step_ops=["div"],
        start_range=[2, 2],
        factor_range=[2, 2],
        max_value=2,
        eval_size=1500,
    )
    task = WordMathTask(cfg)
    held_out = {p.question for p in task.eval_problems()}
    assert len(held_out) == 1500
    assert len({p.id for p in task.eval_problems()}) == 1500
    rng = random.Random("an unrelated stream")
    raw = [draw_problem(rng, task.settings).question for _ in range(2000)]
    assert sum(q in held_out for q in raw) > 100  # the generator alone would train on them
    for seed in (0, 1):
        trained = [p.question for p in itertools.islice(task.train_stream(seed), 2000)]
        assert not set(trained) & held_out


def test_step_counts_follow_the_mix():
    cfg = word_math(steps=[1, 2, 3, 4], step_weights=[5, 3, 2, 0])
    problems = list(itertools.islice(WordMathTask(cfg).train_stream(0), 4000))
    counts = Counter(len(p.extra["steps"]) for p in problems)
    assert counts[4] == 0
    for steps, share in ((1, 0.5), (2, 0.3), (3, 0.2)):
        assert counts[steps] / len(problems) == pytest.approx(share, abs=0.03)
    six = WordMathTask(word_math(steps=[6], step_weights=[1], max_value=500)).eval_problems()
    assert {len(p.extra["steps"]) for p in six} == {6}


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"step_weights": [1, 1]}, "benchmark.step_weights=[1.0, 1.0] must give one weight"),
        ({"step_weights": [0, 0, 0, 0]}, "benchmark.step_weights=[0.0, 0.0, 0.0, 0.0] are all 0"),
        ({"start_range": [9, 3]}, "benchmark.start_range=[9, 3] must be [low, high]"),
        ({"operand_range": [0, 5]}, "benchmark.operand_range=[0, 5] must start at 1"),
        ({"factor_range": [1, 4]}, "benchmark.factor_range=[1, 4] must start at 2"),
        ({"start_range": [2, 500]}, "benchmark.start_range=[2, 500] goes past benchmark.max_value"),
        (
            {
                "steps": [3],
                "step_weights": [1],
                "step_ops": ["mul"],
                "start_range": [20, 30],
                "max_value": 30,
            },
            "benchmark.steps=[3] with benchmark.step_ops=['mul'] cannot be drawn",
        ),
    ],
)
def test_config_errors_are_one_paragraph_naming_the_key(keys, named):
    with pytest.raises(ConfigError) as caught:
        WordMathTask(word_math(**keys))
    message = str(caught.value)
    assert message.startswith(named) and "\n" not in message


def test_too_small_a_space_is_a_config_error(monkeypatch: pytest.MonkeyPatch):
    """Held out at most half of the distinct problems drawing finds: a generator that can only
    tell 150 stories (names and objects fixed, say) cannot hold out 100 of them."""
    real_draw = draw_problem

    def few_stories(rng: random.Random, settings) -> object:
        drawn = real_draw(rng, settings)
        return drawn.__class__(1, (("add", 1),), f"Story {rng.randrange(150)}?", drawn.solution)

    monkeypatch.setattr("tepo_cli.data.word_math_problems.draw_problem", few_stories)
    with pytest.raises(ConfigError) as caught:
        WordMathTask(word_math(eval_size=100))
    message = str(caught.value)
    assert message.startswith("benchmark.eval_size=100 leaves too few training problems: 4000 ")
    assert "only 150 distinct" in message and "\n" not in message
    assert len(WordMathTask(word_math(eval_size=70)).eval_problems()) == 70


def test_schema_errors_name_the_key(compose_config):
    config = load_eval_config(
        compose_config("eval", ["benchmark=word_math", "benchmark.steps=[1,7]"])
    )
    with pytest.raises(ConfigError) as caught:
        check_benchmark(config.benchmark, config.reward)
    message = str(caught.value)
    assert "benchmark.steps.1: input should be less than or equal to 6" in message
    assert "\n" not in message
    # a benchmark's own knobs are checked by its own options model, before any model loads
    gsm8k_steps = BenchmarkConfig(name="gsm8k", steps=[1])
    with pytest.raises(ConfigError, match=r"^benchmark\.steps: benchmark=gsm8k has no knobs of"):
        check_benchmark(gsm8k_steps, RewardConfig(name="auto"))
    with pytest.raises(ConfigError) as caught:
        check_benchmark(word_math(digits=2), RewardConfig(name="auto"))
    assert str(caught.value).startswith(
        "benchmark.digits: benchmark=word_math has no such knob (its own: steps, step_weights"
    )
    with pytest.raises(ConfigError, match=r"benchmark\.digits: benchmark=word_math has no such"):
        WordMathTask(word_math(digits=2))
    dumped = word_math(steps=[2]).model_dump()  # a run's config.yaml validates again
    assert dumped["steps"] == [2] and BenchmarkConfig(**dumped) == word_math(steps=[2])
    assert "steps" not in BenchmarkConfig(name="arith").model_dump()


def test_reference_solutions_pass_through_tepo_eval(compose_config, tmp_path):
    """model=reference answers with the generated worked solutions: generator and grader agree
    on all 100 held-out problems, and the summary says the split is the held-out one."""
    config = load_eval_config(compose_config("eval", ["model=reference", "benchmark=word_math"]))
    summary = run_eval(config, tmp_path)
    assert (summary["problems"], summary["accuracy"]) == (100, 1.0)
    assert (summary["split"], summary["grader"]) == ("held-out", "word_math")
    assert get_benchmark("word_math").task is WordMathTask
