"""The process's host memory allocator (`trainer.host_allocator`): tcmalloc, jemalloc or mimalloc in
place of glibc's malloc, for tensors on the CPU.

Why. A CPU update allocates and frees many large activation blocks per step. glibc serves a
block either with its own mmap (over `trainer.mmap_threshold_kb`, runtime/host_memory.py): it then
faults in fresh zeroed pages, a large share of a long-answer update; or from its heap, which
reuses freed blocks but fragments and raises the peak. tcmalloc and jemalloc keep freed blocks in
size classes and reuse them, at about the peak of glibc mapping every block
(docs/guides/performance.md, "The host allocator", measured by scripts/bench_update.py).
On a GPU the activations live in PyTorch's CUDA caching allocator; this only changes host memory.

How. An allocator replaces malloc only if it is loaded before the C library's malloc is first
called: `LD_PRELOAD`. So `tepo train` resolves the choice before anything else happens and, when
the library is installed and not already loaded, starts itself again (`os.execv`, same process
id, same arguments) with the library preloaded. The environment carries it to every process the
run starts (the deepspeed launcher and its ranks). A rank started on another node without it does
the same for itself. `auto` takes jemalloc, else tcmalloc, else mimalloc (its wheel is a dependency
of tepo on Linux, so a pip-only set-up has it), else stays with glibc and says how to install
one, on a CPU run; a GPU run keeps glibc (`for_device`). Naming one that is not installed
is refused.

A change outside tepo's own objects: listed in docs/patches.md.
"""

from __future__ import annotations

import ctypes.util
import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tepo_cli.core.errors import ConfigError

GLIBC = "glibc"
# allocator -> the library names ctypes.util.find_library looks up (ldconfig's cache), best first
LIBRARIES: dict[str, tuple[str, ...]] = {
    "jemalloc": ("jemalloc",),
    "tcmalloc": ("tcmalloc_minimal", "tcmalloc"),
    "mimalloc": ("mimalloc",),
}
PACKAGES = {  # how to install each: Debian and Ubuntu's packages, mimalloc's wheel
    "tcmalloc": "apt install libtcmalloc-minimal4",
    "jemalloc": "apt install libjemalloc2",
    "mimalloc": "pip install cmeel-mimalloc",
}
# library -> (the wheel that ships it, its file inside the wheel's install): found with pip alone,
# no apt and no ldconfig cache, so a fresh `make train` set-up has a reusing allocator.
WHEELS = {"mimalloc": ("cmeel-mimalloc", "cmeel.prefix/lib/libmimalloc.so")}
# jemalloc first: on the long-answer job both make the update faster than glibc's malloc, and
# jemalloc's peak is below tcmalloc's (docs/guides/performance.md, "The host allocator")
# mimalloc last: its wheel comes with tepo (no apt), and on the long job's update it ran at
# jemalloc's speed within 3 % and 0.5 GB under glibc's peak (docs/results/bench_update/allocators_pip.md)
AUTO_ORDER = ("jemalloc", "tcmalloc", "mimalloc")
AUTO_TEXT = "jemalloc, else tcmalloc, else mimalloc, else glibc"
# Set in the environment of the process started again: a second start would be a loop.
STARTED_AGAIN = "TEPO_HOST_ALLOCATOR_PRELOADED"


@dataclass(frozen=True)
class Allocator:
    """What `trainer.host_allocator` resolved to on this machine."""

    name: str  # glibc, tcmalloc, jemalloc or mimalloc
    library: str | None  # the shared library to preload (None: glibc's own malloc)
    note: str = ""  # for auto without a library: how to get one


CHOICES = ("auto", GLIBC, *LIBRARIES)


def resolve(choice: str, find: Callable[[str], str | None] | None = None) -> Allocator:
    """`choice` (auto, glibc, tcmalloc, jemalloc or mimalloc) on this machine; ConfigError where a named
    allocator is not installed or the platform cannot preload one. `find`: a library name to
    its file (default ctypes.util.find_library, which reads ldconfig's cache)."""
    find = find or find_library
    if choice not in CHOICES:
        raise ConfigError(
            f"trainer.host_allocator={choice}: not an allocator tepo knows; allowed: "
            f"{', '.join(CHOICES)} (auto: {AUTO_TEXT})."
        )
    if choice == GLIBC:
        return Allocator(GLIBC, None)
    wanted = AUTO_ORDER if choice == "auto" else (choice,)
    if not sys.platform.startswith("linux"):
        if choice == "auto":
            return Allocator(GLIBC, None)
        raise ConfigError(
            f"trainer.host_allocator={choice}: tepo preloads an allocator with LD_PRELOAD, which "
            f"it supports on Linux only (this is {sys.platform}). Use trainer.host_allocator=auto "
            f"or glibc."
        )
    for name in wanted:
        for library in LIBRARIES[name]:
            found = find(library)
            if found:
                return Allocator(name, found)
    if choice == "auto":
        return Allocator(
            GLIBC,
            None,
            note=(
                "no jemalloc, tcmalloc or mimalloc installed: `pip install cmeel-mimalloc` (or "
                "`apt install libjemalloc2` on Debian, Ubuntu) makes a CPU update with long "
                "answers leaner and faster (trainer.host_allocator; docs/guides/performance.md)"
            ),
        )
    raise ConfigError(
        f"trainer.host_allocator={choice}: its library (lib{LIBRARIES[choice][0]}.so) is not "
        f"installed on this machine. Install it (`{PACKAGES[choice]}`), or use "
        f"trainer.host_allocator=auto ({AUTO_TEXT}) or glibc."
    )


def find_library(library: str) -> str | None:
    """The file to preload for `library`: ldconfig's cache (apt's packages), else the wheel that
    ships it (`WHEELS`) where that wheel is installed in this Python."""
    found = ctypes.util.find_library(library)
    if found or library not in WHEELS:
        return found
    import importlib.metadata

    wheel, file = WHEELS[library]
    try:
        path = Path(importlib.metadata.distribution(wheel).locate_file(file))
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(path) if path.is_file() else None


def loaded(maps: str | None = None) -> str:
    """The allocator serving this process's malloc: tcmalloc, jemalloc or mimalloc when its library is mapped
    (preloaded, so first in the symbol search), else glibc. `maps`: /proc/self/maps' text
    (default: this process's, read once: a process's malloc never changes after it starts)."""
    if maps is None:
        return _this_process()
    for line in maps.splitlines():
        library = line.rsplit("/", 1)[-1]
        for name in LIBRARIES:
            if library.startswith(f"lib{name}"):
                return name
    return GLIBC


@functools.cache
def _this_process() -> str:
    try:
        return loaded(Path("/proc/self/maps").read_text())
    except OSError:
        return GLIBC


# allocator -> (environment variable, value) it reads at start, set unless the user set it.
# jemalloc: freed pages go back to the OS after ~1 s unused, not its default ~10 s. The loop
# reuses what it frees within a micro-batch or the next one, so nothing is lost in speed, while
# pages freed by one phase and not needed by the next leave sooner: a lower peak in the same time,
# where 0 (immediate) costs time (docs/guides/performance.md, "The host allocator").
SETTINGS: dict[str, tuple[str, str]] = {"jemalloc": ("MALLOC_CONF", "dirty_decay_ms:1000")}


def preloaded_environment(
    environ: dict[str, str], library: str, name: str | None = None
) -> dict[str, str]:
    """`environ` with `library` first in LD_PRELOAD, the marker that stops a second start, and
    allocator `name`'s settings (`SETTINGS`) where the environment has none of its own."""
    kept = [entry for entry in environ.get("LD_PRELOAD", "").split(":") if entry]
    started = {**environ, "LD_PRELOAD": ":".join([library, *kept]), STARTED_AGAIN: "1"}
    if name in SETTINGS:
        started.setdefault(*SETTINGS[name])
    return started


def start_with(allocator: Allocator, argv: Sequence[str]) -> None:
    """Replace this process by itself with `allocator` preloaded (returns only where nothing is to
    be done: glibc, already loaded, or already started again once)."""
    if allocator.library is None or loaded() == allocator.name:
        return
    if os.environ.get(STARTED_AGAIN):
        # Preloaded, yet not loaded: the dynamic loader ignored LD_PRELOAD (a setuid interpreter,
        # a library of the wrong architecture). Going on with glibc beats a loop of starts.
        print(
            f"tepo: {allocator.library} was preloaded but is not in use; continuing with glibc's "
            f"malloc (trainer.host_allocator=glibc says so without this note)",
            file=sys.stderr,
        )
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(
        sys.executable,
        list(argv),
        preloaded_environment(dict(os.environ), allocator.library, allocator.name),
    )


KEY = "trainer.host_allocator"


def requested(config_name: str, arguments: Sequence[str]) -> str | None:
    """`trainer.host_allocator` as the job will use it: read from the config composed from the
    command line (recipes included) before Hydra runs the job, `auto` settled for the device the
    run will train on (`for_device`). None where the command line does not compose (Hydra
    reports that itself, once it runs). A sweep of the key is refused: the allocator is the
    process's, chosen once for all the sweep's jobs."""
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser

    candidates = [a for a in arguments if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except Exception:
        return None
    for override in overrides:
        if override.key_or_group == KEY and override.is_sweep_override():
            raise ConfigError(
                f"{KEY} cannot be swept ({override.input_line}): the allocator is loaded when the "
                f"process starts, once for every job of a sweep. Run one sweep per allocator."
            )
    plain = [
        o.input_line
        for o in overrides
        if not o.is_hydra_override() and not o.is_sweep_override() and o.input_line is not None
    ]
    try:
        with initialize_config_module(config_module="tepo_cli.conf", version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=plain)
        choice, device = str(cfg.trainer.host_allocator), str(cfg.trainer.device)
    except Exception:
        return None
    if device == "auto":
        device = "cuda" if cuda_expected() else "cpu"
    return for_device(choice, device)


def cuda_expected(
    node: Path = Path("/dev/nvidiactl"),
    torch_dir: Path | None = None,
    env: Mapping[str, str] = os.environ,
) -> bool:
    """`trainer.device=auto`'s answer before torch is imported (runtime/device_choice.py decides
    after, with torch.cuda.is_available()): an NVIDIA driver's device node, a torch built with
    CUDA (its libtorch_cuda), and GPUs left visible. The two rules differ only where a driver is
    too old for the installed torch, which device_choice then reports."""
    if not node.exists() or env.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    if torch_dir is None:
        spec = importlib.util.find_spec("torch")
        locations = list(spec.submodule_search_locations or []) if spec else []
        torch_dir = Path(locations[0]) if locations else None
    return torch_dir is not None and any((torch_dir / "lib").glob("libtorch_cuda*"))


def for_device(choice: str, device: str) -> str:
    """`auto` on a run that trains on a GPU is glibc: its activations live in PyTorch's CUDA
    caching allocator, and host memory sees little churn, so nothing is preloaded there."""
    return GLIBC if choice == "auto" and device == "cuda" else choice


def release_free_memory() -> bool:
    """Hand the pages of the allocator's free blocks back to the OS (tcmalloc's
    `MallocExtension_ReleaseFreeMemory`, jemalloc's purge of every arena, glibc's `malloc_trim`).

    Called between a step's phases (generation, update): tcmalloc and jemalloc keep freed blocks
    for reuse, which is what makes an update's many micro-batches fast, but what one phase freed
    in its own sizes would otherwise stay resident through the next phase, fragmenting, and the
    peak would creep up step after step. Releasing at the boundary keeps each phase's reuse and
    costs one fresh fault per page per phase. False where there is nothing to call."""
    if not sys.platform.startswith("linux"):
        return False
    process = _symbols()
    name = loaded()
    if name == "tcmalloc" and hasattr(process, "MallocExtension_ReleaseFreeMemory"):
        process.MallocExtension_ReleaseFreeMemory()
        return True
    if name == "jemalloc" and hasattr(process, "mallctl"):
        every_arena = b"arena.4096.purge"  # MALLCTL_ARENAS_ALL = 4096
        return process.mallctl(every_arena, None, None, None, ctypes.c_size_t(0)) == 0
    if name == "mimalloc" and hasattr(process, "mi_collect"):
        process.mi_collect(ctypes.c_bool(True))  # force: every thread's free pages, now
        return True
    if name == GLIBC and hasattr(process, "malloc_trim"):
        process.malloc_trim(ctypes.c_size_t(0))
        return True
    return False


@functools.cache
def _symbols() -> ctypes.CDLL:
    """The process's global symbols (the preloaded allocator's among them), opened once."""
    return ctypes.CDLL(None)
