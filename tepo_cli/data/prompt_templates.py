"""Prompt templates: the benchmark's user message, optionally in the model's chat template."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from tepo_cli.config.schema import BenchmarkConfig


def render_prompt(tokenizer: PreTrainedTokenizerBase, cfg: BenchmarkConfig, question: str) -> str:
    # Plain substitution, not str.format: prompts may hold braces of their own (\boxed{}).
    message = cfg.prompt.replace("{question}", question)
    if not cfg.chat_template or tokenizer.chat_template is None:
        return message
    messages = [{"role": "user", "content": message}]
    if cfg.system_prompt:
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
