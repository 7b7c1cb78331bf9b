"""The smoke runs' model: tepo's in-process tiny model (`model=tiny`) saved as a model directory,
so every side of a smoke run loads it the way the real job loads a checkpoint (`model=hf`)."""

from __future__ import annotations

from pathlib import Path


def save_tiny_model(directory: Path) -> str:
    """Build `model=tiny` (random, seeded, SmolLM2's tokenizer), save it with its tokenizer into
    `directory` (once) and return that directory's path."""
    if (directory / "config.json").is_file():
        return str(directory.resolve())
    import torch
    from hydra import compose, initialize_config_module

    from tepo_cli.config.validate import load_train_config
    from tepo_cli.models.loading import load_model, load_tokenizer

    with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
        config = load_train_config(compose(config_name="train", overrides=["model=tiny"]))
    tokenizer = load_tokenizer(config.model)
    model = load_model(config.model, tokenizer, torch.device("cpu"))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory.resolve())
