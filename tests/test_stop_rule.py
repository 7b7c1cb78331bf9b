"""`rollout.stop`: where an answer ends under a stop string (rollout/stop_rule.py), the cut of a
rollout there, and `rollout=hf` stopping there: a stopped generation is the unstopped one cut
where the rule ends it, token for token. vLLM's side: tests/test_vllm_stop.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tepo_cli.config.rollout_schema import RolloutConfig
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.rollout.backend import Sampling
from tepo_cli.rollout.hf import generate
from tepo_cli.rollout.stop_rule import StopCriterion, StopRule, cut_at_stop, stop_rule

WORD_MATH = (
    "Tom has 3 apples and buys 9 more.\nSo he has 3 + 9 = 12 apples.\nThe answer is 12.\n"
    "The answer is 12.\nthe answer is 12."
)


def test_ends_at_the_string_or_at_the_end_of_its_line():
    string, line = StopRule(("The answer is",)), StopRule(("The answer is", "answer:"), "line")
    assert not string.ends("So he has 12.") and string.ends("So he has 12. The answer is")
    assert not line.ends("The answer is 12.") and line.ends("The answer is 12.\n")
    assert line.ends("so answer: 7\nmore") and not line.ends("so answer: 7")
    assert not line.ends("\nThe answer is 12.")  # a line break before the string is not its end
    number = StopRule(("The answer is",), "line", r"\d")
    assert not number.ends("The answer is N.\nSo the answer is 9.")
    assert number.ends("The answer is N.\nSo The answer is 9.\n")
    assert not number.ends("The answer is N.\nthe answer is 9.\n")  # the strings are literal
    line_x = RolloutConfig(stop=["x"], stop_at="line")
    assert stop_rule(RolloutConfig()) is None and stop_rule(line_x) == StopRule(("x",), "line")


@pytest.mark.parametrize("at", ["string", "line"])
def test_the_end_is_the_first_token_whose_text_ends(tiny_tokenizer, at):
    rule = StopRule(("The answer is",), at)
    ids = tiny_tokenizer(WORD_MATH, add_special_tokens=False)["input_ids"]
    end = rule.end_of(ids, tiny_tokenizer)
    kept = tiny_tokenizer.decode(ids[:end])
    assert rule.ends(kept) and not rule.ends(tiny_tokenizer.decode(ids[: end - 1]))
    assert kept.count("answer is") == 1
    if at == "line":
        assert kept.startswith(WORD_MATH.split("\nThe answer is 12.\nthe")[0])
        assert kept.endswith("\n")
    else:
        assert kept.endswith("The answer is")
    assert StopRule(("never said",)).end_of(ids, tiny_tokenizer) is None


def test_the_criterion_decodes_only_the_rows_still_going(tiny_tokenizer):
    """Step by step over two rows (prompt width 1): row 0 ends at the string's last token and
    stays done without being decoded again; row 1 never ends and is decoded at every step."""
    tok = tiny_tokenizer
    ended = tok("x The answer is 12", add_special_tokens=False)["input_ids"]
    going = tok("x Tom has twelve apples today, he", add_special_tokens=False)["input_ids"]
    end = StopRule(("The answer is",)).end_of(ended[1:], tok)
    assert end is not None and 1 + end < len(ended)
    decoded: list[int] = []
    batch_decode = tok.batch_decode

    def counting(rows, **kwargs):
        decoded.append(len(rows))
        return batch_decode(rows, **kwargs)

    criterion = StopCriterion(StopRule(("The answer is",)), tok, prompt_width=1)
    tok.batch_decode = counting
    try:
        done = []
        for length in range(2, min(len(ended), len(going)) + 1):
            ids = torch.tensor([ended[:length], going[:length]])
            done.append(criterion(ids, torch.zeros(2, 8)).tolist())
    finally:
        del tok.batch_decode
    steps = len(done)
    assert [row[0] for row in done] == [length - 1 >= end for length in range(2, steps + 2)]
    assert not any(row[1] for row in done)
    assert decoded == [2] * (end) + [1] * (steps - end)


def test_a_cut_pads_the_rest_and_the_cut_answer_is_not_truncated(tiny_tokenizer):
    """Row 0 ends under the rule in its middle (it ran to the length limit); row 1 ended at its
    EOS without the rule; row 2 ran to the limit without it."""
    tok, rule = tiny_tokenizer, StopRule(("The answer is",), "line")
    texts = [WORD_MATH, "Tom has 12.", "Tom has 12 apples and"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    rows[1].append(tok.eos_token_id)
    width = max(len(r) for r in rows)
    ids = torch.full((3, width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((3, width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), True
    logprobs = torch.where(mask, -0.5, 0.0)
    rollout = Rollout(
        torch.ones((3, 2), dtype=torch.long),
        torch.ones((3, 2), dtype=torch.long),
        ids,
        mask,
        [tok.decode(r, skip_special_tokens=True) for r in rows],
        torch.tensor([True, False, True]),
        logprobs,
    )
    cut = cut_at_stop(rollout, rule, tok)
    end = rule.end_of(rows[0], tok)
    assert end is not None and end < len(rows[0])
    assert cut.completion_mask[0].sum() == end and not cut.truncated[0]
    assert (cut.completion_ids[0, end:] == tok.pad_token_id).all()
    assert (cut.logprobs[0, end:] == 0).all() and (cut.logprobs[0, :end] == -0.5).all()
    assert cut.texts[0] == tok.decode(rows[0][:end]) and cut.texts[0].endswith("12.\n")
    for row in (1, 2):  # untouched
        assert torch.equal(cut.completion_ids[row], ids[row])
        assert torch.equal(cut.completion_mask[row], mask[row])
        assert cut.texts[row] == rollout.texts[row]
    assert cut.truncated.tolist() == [False, False, True]


def test_hf_stops_where_the_rule_ends_the_unstopped_generation(tiny_model, tiny_tokenizer):
    """The random tiny model writes an "e" within a few tokens: the stopped rollout is the free
    one cut at each row's first "e" (same draws: hf samples every row at every step), and the
    generation ended sooner."""
    rule = StopRule(("e",))
    prompts = ["12+34=", "7+8=", "50+49="]
    free_sampling = Sampling(n=4, temperature=1.0, max_new_tokens=32)
    torch.manual_seed(0)
    free = generate(tiny_model, tiny_tokenizer, prompts, free_sampling)
    torch.manual_seed(0)
    stopped = generate(
        tiny_model, tiny_tokenizer, prompts, Sampling(**{**vars(free_sampling), "stop": rule})
    )
    expected = cut_at_stop(free, rule, tiny_tokenizer)
    cut_rows = 0
    for row in range(len(free.texts)):
        length = int(expected.completion_mask[row].sum())
        assert int(stopped.completion_mask[row].sum()) == length
        assert torch.equal(
            stopped.completion_ids[row, :length], expected.completion_ids[row, :length]
        )
        assert stopped.texts[row] == expected.texts[row]
        assert bool(stopped.truncated[row]) == bool(expected.truncated[row])
        cut_rows += int(length < int(free.completion_mask[row].sum()))
    assert cut_rows >= 6  # most rows met an "e" before their end
    assert stopped.completion_ids.shape[1] < free.completion_ids.shape[1]


def test_a_line_pattern_that_is_no_regex_or_without_line_ends_is_refused(compose_config):
    from tepo_cli.config.validate import load_train_config

    base = ["model=tiny", "rollout.stop=[answer is]"]
    for extra, why in (
        (["rollout.stop_at=line", "rollout.stop_pattern='[0-9'"], "not a regular expression"),
        (["rollout.stop_pattern=x"], "set rollout.stop_at=line"),
    ):
        with pytest.raises(ConfigError, match=why):
            load_train_config(compose_config("train", [*base, *extra]))
    cfg = load_train_config(
        compose_config("train", [*base, "rollout.stop_at=line", "rollout.stop_pattern=x"])
    )
    assert cfg.rollout.stop_pattern == "x"


def test_training_draws_with_the_configured_rule(compose_config):
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.train.sampling import training_sampling

    keys = ["rollout.stop=[The answer is]", "rollout.stop_at=line", "rollout.stop_pattern=x"]
    cfg = load_train_config(compose_config("train", ["model=tiny", *keys]))
    assert training_sampling(cfg).stop == StopRule(("The answer is",), "line", "x")
    assert (
        training_sampling(load_train_config(compose_config("train", ["model=tiny"]))).stop is None
    )


def test_stop_strings_are_refused_with_episodes(compose_config):
    from tepo_cli.config.validate import load_train_config

    cfg = compose_config("train", ["model=tiny", "env=python_tool", "rollout.stop=[answer]"])
    with pytest.raises(ConfigError, match=r"rollout\.stop=.*plays episodes"):
        load_train_config(cfg)
    single = load_train_config(compose_config("train", ["model=tiny", "rollout.stop=[answer]"]))
    assert single.rollout.stop == ["answer"] and single.rollout.stop_at == "string"


def test_tepo_eval_ends_its_answers_at_the_stop_string(tmp_path):
    """`tepo eval` takes `rollout.stop` (where answers end) and refuses it with episodes."""
    run = tmp_path / "run"
    args = ["model=tiny", "benchmark=arith", "eval.limit=6", "eval.max_new_tokens=24"]
    args += ["eval.greedy=false", "eval.temperature=1.0"]  # the random model greedily repeats "\\n"
    command = [sys.executable, "-m", "tepo_cli", "eval", *args, "rollout.stop=[e]"]
    result = subprocess.run(
        [*command, f"hydra.run.dir={run}"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    stopped = [r for r in records if not r["truncated"]]
    assert len(stopped) >= 3
    for record in stopped:  # the answer's last token holds its first "e"
        assert "e" in record["completion"][-16:] and record["length"] < 24, record
    episodes = subprocess.run(
        [*command, "env=python_tool"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert episodes.returncode == 2 and "plays episodes" in episodes.stderr
