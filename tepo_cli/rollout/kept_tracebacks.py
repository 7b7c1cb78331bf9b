"""The tracebacks of exceptions a package keeps as module globals, dropped.

vLLM keeps the exception of an optional import at module level (vllm/multimodal/media/audio.py
keeps torchcodec's, which `make install-vllm` removes on the CPU). A traceback holds the frames it
passed through, and a frame its caller: every frame on the stack that first imported the package
stays alive, with its locals, for the rest of the process. MPO's warm-up builds the engine when it
first samples, so its frame was on that stack and its optimizer outlived it: float32 masters and
AdamW moments of the modules it trains, 1.1 GB on the default job (docs/patches.md links the
figures). The exceptions stay, type and message; only what they passed through is let go.
"""

from __future__ import annotations

import sys


def drop_kept_tracebacks(package: str) -> int:
    """Clear the traceback of every exception (and of its causes and contexts) held by a global
    of `package`'s imported modules; returns how many were cleared."""
    cleared = 0
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] != package or module is None:
            continue
        for value in list(vars(module).values()):
            seen: set[int] = set()
            while isinstance(value, BaseException) and id(value) not in seen:
                seen.add(id(value))
                if value.__traceback__ is not None:
                    value.__traceback__ = None
                    cleared += 1
                value = value.__cause__ or value.__context__
    return cleared
