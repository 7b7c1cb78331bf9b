"""DeepSpeed, imported without its autotuner's MLflow import.

Importing `deepspeed` imports `deepspeed.autotuning.autotuner`, which imports mlflow whenever it
is installed — seconds of every process start with MLflow 3 (every rank of every run, every
`tepo` command; docs/guides/performance.md, "Figures behind the code"), for DeepSpeed's
autotuner, which tepo never runs. The import is made with mlflow
hidden (the autotuner records `has_mlflow = False`; nothing else in DeepSpeed reads it), and mlflow
is importable again as soon as it returns: `logger=[mlflow]` imports it as usual.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_deepspeed() -> ModuleType:
    """`import deepspeed`, with mlflow hidden during the import unless it is already loaded."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hide = "mlflow" not in sys.modules
    if hide:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises
    try:
        import deepspeed
    finally:
        if hide and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    return deepspeed
