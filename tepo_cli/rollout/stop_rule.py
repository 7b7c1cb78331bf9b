r"""`rollout.stop`: where an answer ends other than at an end-of-sequence token.

An answer ends with the token that first completes one of `rollout.stop`'s strings
(`rollout.stop_at=string`, vLLM's `stop` with the string kept in the output), or the token that
ends the line such a string is on (`rollout.stop_at=line`: word_math's "The answer is 12." and
its line break, after which a trained model tends to repeat the line to the token cap). With
`rollout.stop_pattern`, a line ends the answer only if what follows the string on it matches
that regular expression (`\d`: a number, so the untrained model's echo of its instructions,
"The answer is N.", does not end it). The stopped answer counts as ended, not truncated; no
end-of-sequence token is trained after it.

Both back-ends stop generating there (hf: a stopping criterion per row; vllm: the engine's stop
strings, and for `line` more requests for the answers that stopped at a string or at a line
that did not end them, vllm_line_end.py), and both cut the returned answer with `cut_at_stop`, so
an answer ends at the same token whichever engine sampled it. The rule reads decoded text, at token granularity: the cut keeps the whole token that
completes the rule, whatever characters that token carries after it. What is trained then:
docs/objectives.md §0.10.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PreTrainedTokenizerBase, StoppingCriteria

from tepo_cli.config.rollout_schema import RolloutConfig
from tepo_cli.core.rollout_record import Rollout

LINE_END = "\n"


@dataclass(frozen=True)
class StopRule:
    strings: tuple[str, ...]
    at: Literal["string", "line"] = "string"
    pattern: str | None = None  # line: what follows the string on its line must match this

    def ends(self, text: str) -> bool:
        """Whether an answer whose text so far is `text` has reached its end under the rule."""
        for string in self.strings:
            found = text.find(string)
            if found >= 0 and self.at == "string":
                return True
            while found >= 0:
                rest = found + len(string)
                line_end = text.find(LINE_END, rest)
                if line_end < 0:
                    break
                if self.pattern is None or re.search(self.pattern, text[rest:line_end]):
                    return True
                found = text.find(string, rest)
        return False

    def end_of(self, ids: Sequence[int], tokenizer: PreTrainedTokenizerBase) -> int | None:
        """How many leading tokens of `ids` the answer keeps: the fewest whose text ends under
        the rule (None: the rule never ends it). A prefix's text is a prefix of a longer one's
        (an unfinished UTF-8 character at its end aside, which no stop string contains), so
        "ends" only turns true once and a bisection finds the first token."""
        if not self.ends(_text(tokenizer, ids)):
            return None
        low, high = 0, len(ids)  # ends(ids[:high]) holds, ends(ids[:low]) does not
        while high - low > 1:
            middle = (low + high) // 2
            if self.ends(_text(tokenizer, ids[:middle])):
                high = middle
            else:
                low = middle
        return high


def stop_rule(rollout: RolloutConfig) -> StopRule | None:
    """The rule of `rollout.stop`, `rollout.stop_at` and `rollout.stop_pattern` (None when no
    string is given), for training, its held-out evaluation and `tepo eval` alike."""
    if not rollout.stop:
        return None
    return StopRule(tuple(rollout.stop), rollout.stop_at, rollout.stop_pattern)


def cut_at_stop(rollout: Rollout, rule: StopRule, tokenizer: PreTrainedTokenizerBase) -> Rollout:
    """`rollout` with each answer cut where `rule` ends it: the tokens after the cut become
    padding (id, mask and engine log-prob), the text is the kept tokens', and a cut answer is not
    truncated. An answer that ended at its end-of-sequence token first keeps it."""
    ids, mask = rollout.completion_ids.clone(), rollout.completion_mask.clone()
    logprobs = None if rollout.logprobs is None else rollout.logprobs.clone()
    truncated, texts = rollout.truncated.clone(), list(rollout.texts)
    for row in range(ids.shape[0]):
        length = int(mask[row].sum())
        end = rule.end_of(ids[row, :length].tolist(), tokenizer)
        if end is None or (end == length and not bool(truncated[row])):
            continue
        ids[row, end:] = tokenizer.pad_token_id
        mask[row, end:] = False
        if logprobs is not None:
            logprobs[row, end:] = 0.0
        truncated[row] = False
        texts[row] = _text(tokenizer, ids[row, :end].tolist())
    return dataclasses.replace(
        rollout,
        completion_ids=ids,
        completion_mask=mask,
        texts=texts,
        truncated=truncated,
        logprobs=logprobs,
    )


class StopCriterion(StoppingCriteria):
    """transformers' per-row stopping criterion for `rule`, for one `generate` call: a row is
    done once its generated text (the tokens after `prompt_width`) ends under the rule, and stays
    done (a longer text still ends), so only the rows still going are decoded at each step. The
    rows' ids are cut afterwards by `cut_at_stop`; this only saves the decode steps after the end."""

    def __init__(
        self, rule: StopRule, tokenizer: PreTrainedTokenizerBase, prompt_width: int
    ) -> None:
        self.rule, self.tokenizer, self.prompt_width = rule, tokenizer, prompt_width
        self.done: list[bool] | None = None

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object
    ) -> torch.Tensor:
        done = self.done = self.done or [False] * input_ids.shape[0]
        going = [row for row, ended in enumerate(done) if not ended]
        generated = input_ids[going, self.prompt_width :].tolist()
        texts = self.tokenizer.batch_decode(generated, skip_special_tokens=True)
        for row, text in zip(going, texts, strict=True):
            done[row] = self.rule.ends(text)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _text(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)
