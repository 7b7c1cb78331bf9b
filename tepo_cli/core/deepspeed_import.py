"""DeepSpeed, imported as tepo uses it: without its autotuner's MLflow import, and without its
shared-memory all-reduce op.

Importing `deepspeed` imports `deepspeed.autotuning.autotuner`, which imports mlflow whenever it
is installed — seconds of every process start with MLflow 3 (every rank of every run, every
`tepo` command; docs/guides/performance.md, "Figures behind the code"), for DeepSpeed's
autotuner, which tepo never runs. The import is made with mlflow
hidden (the autotuner records `has_mlflow = False`; nothing else in DeepSpeed reads it), and mlflow
is importable again as soon as it returns: `logger=[mlflow]` imports it as usual.

DeepSpeed's communication back-end JIT-compiles its CPU shared-memory op (`build_shm_op`) in
every rank of every start, under torch's build lock file; it serves only `inference_all_reduce`
(DeepSpeed's tensor-parallel inference), which tepo never calls, and its buffers in /dev/shm are
never unlinked. A rank killed while it held that lock (SIGKILL, a lost node) left the file behind,
and from then on every multi-rank start on the machine waited for it forever, silently. The op
is replaced by "no op", which DeepSpeed handles as on a machine that cannot build it: training
collectives go through torch.distributed either way.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def import_deepspeed() -> ModuleType:
    """`import deepspeed` (mlflow hidden during the import unless it is already loaded), its
    shared-memory op replaced by none."""
    if "deepspeed" not in sys.modules:
        hide = "mlflow" not in sys.modules
        if hide:
            sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises
        try:
            importlib.import_module("deepspeed")
        finally:
            if hide and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
                del sys.modules["mlflow"]
    # importlib: the attribute `deepspeed.comm.torch` is torch itself, not DeepSpeed's module.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    return sys.modules["deepspeed"]
