"""An observation as tokens: the chat template's own framing around the environment's text.

After the model's turn (its ids, ending in the end-of-message token it sampled), the next
message is what the chat template would put there: the rest of the template after an assistant
message, the observation in `env.observation_role`'s message, and the header of the next
assistant message. Only this framing and the observation are encoded; the model's own tokens
are never decoded and encoded again. A tokenizer without a chat template frames the observation
with blank lines.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

_SLOT = "\u0000OBSERVATION\u0000"


class ObservationFormat:
    """Token ids of observation messages for one tokenizer and role."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, role: str = "user") -> None:
        self.tokenizer = tokenizer
        head, tail = _framing(tokenizer, role)
        # The framing is the same for every observation: encoded once.
        self.head_ids = tokenizer.encode(head, add_special_tokens=False)
        self.tail_ids = tokenizer.encode(tail, add_special_tokens=False)
        self.cut_ids = tokenizer.encode("\n[cut]", add_special_tokens=False)

    def ids(self, text: str, max_tokens: int) -> tuple[list[int], bool]:
        """The observation message's ids, its text cut to `max_tokens` tokens; and whether it
        was cut."""
        content = self.tokenizer.encode(text, add_special_tokens=False)
        cut = len(content) > max_tokens
        if cut:
            content = content[:max_tokens] + self.cut_ids
        return self.head_ids + content + self.tail_ids, cut


def _framing(tokenizer: PreTrainedTokenizerBase, role: str) -> tuple[str, str]:
    """(text between the model's end-of-message token and the observation, text after it up to
    the next assistant turn), read off the chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return "\n\n", "\n\n"
    answer = "\u0001ANSWER\u0001"
    before = [{"role": "user", "content": "question"}, {"role": "assistant", "content": answer}]
    closed = tokenizer.apply_chat_template(before, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*before, {"role": role, "content": _SLOT}], tokenize=False, add_generation_prompt=True
    )
    if not after.startswith(closed) or _SLOT not in after:
        raise ValueError(f"the chat template does not append a '{role}' message after an answer")
    rest = closed[closed.index(answer) + len(answer) :]
    eos = tokenizer.eos_token or ""
    if eos and rest.startswith(eos):  # the model sampled this token itself
        rest = rest[len(eos) :]
    head, tail = after[len(closed) :].split(_SLOT)
    return rest + head, tail
