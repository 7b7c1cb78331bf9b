"""What is wrong with a local `model.path`, said before anything loads.

transformers reads a path that is not a directory as a hub id and answers "Repo id must be in the
form 'repo_name' or 'namespace/repo_name'", which hides the real problem (a typo in a directory, a
file given for a directory, a run's directory instead of its `final/`).
"""

from __future__ import annotations

from pathlib import Path

CONFIGS = ("config.json", "adapter_config.json")  # a model, or a LoRA adapter (models/loading.py)
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
HUB_ID = "a hub id looks like 'namespace/name' (e.g. HuggingFaceTB/SmolLM2-135M-Instruct)"


def local_reason(path: str) -> str | None:
    """Why `path` is read as a local path, in words for the message; None for a hub id.

    A hub id is `name` or `namespace/name`; anything else is meant as a local path, and so is
    `outputs/final` when `outputs/` exists here: a user who types a path under a directory they
    have means that directory, not a hub namespace that happens to share its name."""
    first = path.split("/", 1)[0]
    if path.startswith(("/", "~", ".")):
        return f"it starts with '{path[0]}'"
    if path.count("/") >= 2:
        return "it has more than one '/'"
    if Path(path).expanduser().exists():
        return "it exists here"
    if "/" in path and first and Path(first).is_dir():
        return f"its first part {first}/ is a directory here"
    return None


def model_path_problem(path: str) -> str | None:
    """One sentence on why `path` cannot be the model's directory; None when it can (or when it
    is a hub id, which only the hub can check)."""
    reason = local_reason(path)
    if reason is None:
        return None
    where = Path(path).expanduser()
    shown = f"model.path={path}"
    if not where.exists():
        return (
            f"{shown}: no such directory (looked for {where.resolve()}; read as a local path because {reason}). A local "
            f"model is a directory holding config.json and its weights, e.g. a run's final/; "
            f"{HUB_ID}"
        )
    if not where.is_dir():
        return (
            f"{shown} is a file, not a directory: give the directory that holds config.json and "
            f"the weights; {HUB_ID}"
        )
    if not any((where / name).is_file() for name in CONFIGS):
        inside = sorted(p.name for p in where.iterdir())[:6]
        run = (
            " (a tepo run directory: its trained model is in final/)"
            if (where / "metrics.jsonl").is_file()
            else ""
        )
        return (
            f"{shown}: the directory holds no config.json (nor a LoRA adapter's "
            f"adapter_config.json){run}; it holds {', '.join(inside) or 'nothing'}"
        )
    if (where / "adapter_config.json").is_file():
        return None  # a LoRA adapter: models/loading.py says what its base model needs
    if not any(any(where.glob(pattern)) for pattern in WEIGHTS):
        return f"{shown}: the directory has a config but no weights (*.safetensors or *.bin files)"
    return None
