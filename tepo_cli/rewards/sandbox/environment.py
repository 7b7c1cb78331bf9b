"""The sandboxed program's environment and interpreter command line.

Nothing is inherited from the parent's environment: API keys, tokens, proxy settings, HF/W&B
credentials and cluster variables all live there, and a program that can read them can print
them into completions, logs and checkpoints. The child gets only what is listed here.

The interpreter runs as ``python -s -S -B -c <launcher>``: with the environment fully replaced,
this is equivalent to ``python -I`` (``-I`` = ``-E -s -P``) except that PYTHONHASHSEED, which
``-E`` would ignore, still applies, so set iteration order is reproducible. ``-S`` (no ``site``)
keeps third-party packages out of reach unless ``site_packages`` is set; ``-B`` writes no
bytecode caches.
"""

from __future__ import annotations

MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"


def sandbox_env(home: str, hash_seed: int) -> dict[str, str]:
    """The complete environment of a sandboxed program whose home/scratch directory is `home`."""
    return {
        "PATH": MINIMAL_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONHASHSEED": str(hash_seed),
        "PYTHONIOENCODING": "utf-8",
        "PYTHONUNBUFFERED": "1",  # output written before a kill is still captured
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONSAFEPATH": "1",
        # Numerical libraries (with site_packages) start one thread per core otherwise, which
        # counts against RLIMIT_NPROC and reserves address space against RLIMIT_AS.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def interpreter_argv(python: str, launcher_source: str, spec_json: str, site: bool) -> list[str]:
    """``python -s [-S] -B -c <launcher source> <spec>``."""
    flags = ["-s", "-B"] if site else ["-s", "-S", "-B"]
    return [python, *flags, "-c", launcher_source, spec_json]
