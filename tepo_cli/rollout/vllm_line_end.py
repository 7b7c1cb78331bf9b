"""`rollout.stop_at=line` on vLLM: the engine stops only at literal strings, so an answer that
stopped at one of `rollout.stop`'s strings is continued, in one more request, up to its line
break ("\\n", kept); if that line does not end it (`rollout.stop_pattern`), it is continued again
up to the next string, and so on, until the rule ends it, it ends by itself or it reaches the
length limit. Each round is one call for the answers still going; the parts are joined into one
sample (ids, the engine's log-probs, how it finished). A continuation's prompt is its answer's
prompt and the answer so far, so it samples from the same conditional distribution as one
uninterrupted request would (with prefix caching the engine reuses their keys and values)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from tepo_cli.rollout.backend import Sampling
from tepo_cli.rollout.stop_rule import LINE_END, StopRule

# A continuation's seed (with per-request seeds): its answer's row, past this offset times the
# round, so that it draws from another stream than any first request of the step.
CONTINUATION_SEED = 1_000_003


@dataclass(frozen=True)
class Joined:
    """One sample from several requests, read as vLLM's `CompletionOutput` is (vllm_outputs.py);
    `wants`: what its next request stops at (the rule's strings, or the line's end)."""

    index: int
    token_ids: list[int]
    logprobs: list[Any] | None
    finish_reason: str | None
    stop_reason: str | int | None
    wants: str = "line"


def continue_to_line_end(
    engine: Any,
    tokenizer: PreTrainedTokenizerBase,
    ids: list[list[int]],
    samples: list[list[Any]],
    sampling: Sampling,
    params: Callable[[Sampling, int], Any],
) -> list[list[Any]]:
    """`samples` (per prompt, its answers in order) with every answer that stopped at a string
    continued until `sampling.stop` ends it (or it ends by itself, or runs out of room).
    `params(sampling, i)` builds request i's sampling parameters (VllmBackend._params)."""
    from vllm.inputs import TokensPrompt

    rule = sampling.stop
    assert rule is not None
    joined: list[list[Any]] = [list(answers) for answers in samples]
    going = [(g, i) for g, answers in enumerate(samples) for i in range(len(answers))]
    rounds = 0
    while going := [(g, i) for g, i in going if _goes_on(joined[g][i], rule, sampling, tokenizer)]:
        rounds += 1
        requests, settings = [], []
        for group, index in going:
            answer = joined[group][index]
            row = group * sampling.n + index
            seed = sampling.seed
            if seed is not None:
                seed += CONTINUATION_SEED * rounds + row
            stop = rule if getattr(answer, "wants", "line") == "string" else StopRule((LINE_END,))
            room = sampling.max_new_tokens - len(answer.token_ids)
            one = dataclasses.replace(sampling, n=1, max_new_tokens=room, seed=seed, stop=stop)
            requests.append(TokensPrompt(prompt_token_ids=ids[group] + list(answer.token_ids)))
            settings.append(params(one, 0))
        outputs = engine.generate(requests, settings, use_tqdm=False)
        for (group, index), output in zip(going, outputs, strict=True):
            joined[group][index] = _join(joined[group][index], output.outputs[0])
    return [[_out_of_room(answer, rule, tokenizer) for answer in answers] for answers in joined]


def _goes_on(
    answer: Any, rule: StopRule, sampling: Sampling, tokenizer: PreTrainedTokenizerBase
) -> bool:
    """Whether `answer` stopped at a string or a line end (not at an EOS or the length limit)
    with room left, and the rule has not ended it yet."""
    if answer.finish_reason != "stop" or not isinstance(answer.stop_reason, str):
        return False
    if len(answer.token_ids) >= sampling.max_new_tokens:
        return False
    return not rule.ends(tokenizer.decode(list(answer.token_ids), skip_special_tokens=True))


def _out_of_room(answer: Any, rule: StopRule, tokenizer: PreTrainedTokenizerBase) -> Any:
    """An answer that stopped at a string or a line end the rule does not end, with no room to
    go on, ran out of room: it finished by the length limit (truncated), as an uninterrupted
    request would have."""
    if answer.finish_reason != "stop" or not isinstance(answer.stop_reason, str):
        return answer
    if rule.ends(tokenizer.decode(list(answer.token_ids), skip_special_tokens=True)):
        return answer
    return Joined(answer.index, list(answer.token_ids), answer.logprobs, "length", None, "line")


def _join(first: Any, second: Any) -> Joined:
    """`first` and its continuation as one sample; its next request stops at a line end if this
    one stopped at a string, and at a string if this one stopped at a line end."""
    both = first.logprobs is not None and second.logprobs is not None
    return Joined(
        index=first.index,
        token_ids=[*first.token_ids, *second.token_ids],
        logprobs=[*first.logprobs, *second.logprobs] if both else None,
        finish_reason=second.finish_reason,
        stop_reason=second.stop_reason,
        wants="string" if second.stop_reason == LINE_END else "line",
    )
