"""Bounded collectives: every collective of a multi-rank run waits at most
`trainer.collective_timeout_s`, and a rank that times out ends the run with one paragraph naming
itself, the phase it was in and the knob.

A collective waits for every rank of the group. A rank that never comes (stuck in a reward, a
data loader, a bug that makes it take another path) would hold the others forever; the timeout
given to the process group turns that wait into an error. gloo raises it from the collective
itself (a RuntimeError "Timed out waiting ..."), and tepo turns it into the paragraph. On NCCL the
same timeout arms torch's watchdog, which aborts the rank once a collective has waited that long
(its log names the collective and the timeout) — bounded, but without the phase. tepo does not set
`TORCH_NCCL_BLOCKING_WAIT=1`, which would make NCCL raise in the main thread (and so give the
paragraph): it makes every `wait()` block the host until the collective completes, which costs the
overlap of ZeRO-3's prefetched all-gathers with compute on every step. A user chasing a hang can
set it for that run; `timed_out` recognises NCCL's error then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

_phase: list[str] = ["start-up"]  # the phase this rank is in, for the timeout's message


def timeout(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Name what this rank is doing, for the message of a collective that times out in it. An
    error leaving the phase carries the innermost phase's name (`phase_of`): by the time it is
    reported, the phases it passed through have ended."""
    _phase.append(name)
    try:
        yield
    except Exception as error:
        if not hasattr(error, "tepo_phase"):
            with contextlib.suppress(AttributeError):
                error.tepo_phase = name  # type: ignore[attr-defined]
        raise
    finally:
        _phase.pop()


def begin(name: str) -> None:
    """Name the outermost phase (set-up, then the training steps), under any nested `phase`."""
    _phase[0] = name


def current_phase() -> str:
    return _phase[-1]


def phase_of(error: BaseException) -> str:
    """The phase `error` was raised in (the current one if it left none)."""
    return getattr(error, "tepo_phase", None) or current_phase()


def timed_out(error: BaseException) -> bool:
    """Whether `error` is a collective that waited past the group's timeout: gloo raises a
    RuntimeError "[...gloo...] Timed out waiting Nms for recv operation to complete"; NCCL with
    blocking wait a DistBackendError that says the work timed out."""
    import torch.distributed as dist

    text = str(error).lower()
    if isinstance(error, dist.DistBackendError):
        return "timed out" in text or "timeout" in text
    return isinstance(error, RuntimeError) and "timed out waiting" in text


def timeout_message(
    rank: int, world_size: int, seconds: float, step: int, error: BaseException
) -> str:
    where = f"at step {step}" if step else "before the first step"
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"rank {rank} of {world_size} waited more than trainer.collective_timeout_s={seconds:g} s "
        f"for the other ranks in a collective during the {phase_of(error)} phase ({where}), and "
        f"stopped the run. Another rank is stuck or has taken a different path (its own log "
        f"shows where), or is only slow: a phase that legitimately keeps some ranks waiting "
        f"longer (a long generation, a checkpoint on a slow disk) needs a larger "
        f"trainer.collective_timeout_s. ({detail})"
    )
