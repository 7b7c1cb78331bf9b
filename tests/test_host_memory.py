"""With a fixed mmap threshold, freed tensor buffers go back to the OS (RSS falls after a free);
with glibc's adaptive default, one freed block teaches malloc to keep the next ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tepo_cli.runtime.host_memory import return_freed_buffers

PROBE = textwrap.dedent(
    """
    import sys
    import torch
    from tepo_cli.runtime.host_memory import return_freed_buffers

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

    fixed = return_freed_buffers(int(sys.argv[1])) if sys.argv[1] != "none" else False
    warm = torch.ones(4 * 2**20 // 4)  # one freed 4 MiB block: glibc raises its threshold
    del warm
    before = rss_mb()
    # 300 MiB in 3 MiB buffers, each followed by a small block that stays live (as a step's
    # outputs do): on the heap, the freed buffers become holes below live blocks, which glibc's
    # free() never hands back (a single live block above them made this depend on where earlier
    # frees left room for it, hence on the interpreter's hash seed).
    blocks, live = [], []
    for _ in range(100):
        blocks.append(torch.ones(3 * 2**20 // 4))
        live.append(torch.ones(64 * 2**10 // 4))
    held = rss_mb()
    del blocks
    print(fixed, held - before, rss_mb() - before)
    """
)


def _run(threshold: str) -> tuple[bool, float, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, threshold], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", float(out[1]), float(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning")
def test_freed_buffers_return_to_the_os_only_with_a_fixed_threshold():
    fixed, held, after_free = _run("512")
    if not fixed:
        pytest.skip("not glibc: nothing to tune")
    assert held > 250
    assert after_free < 30, f"{after_free:.0f} MB still held after freeing 300 MB"
    _, held, after_free = _run("none")
    assert held > 250 and after_free > 250, "glibc's default keeps them (the drift being fixed)"


def test_no_threshold_means_no_change():
    assert return_freed_buffers(None) is False


TOP = textwrap.dedent(
    """
    import sys
    import torch
    from tepo_cli.runtime.host_memory import return_freed_buffers

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

    fixed = return_freed_buffers(int(sys.argv[1]))
    torch.ones(16) + 1  # torch's first op allocates for itself
    before = rss_mb()
    block = torch.ones(3 * 2**20 // 4)  # under the threshold: from the heap, at its top
    del block
    print(fixed, rss_mb() - before)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning")
def test_a_buffer_under_the_threshold_freed_at_the_top_stays_for_the_next_one():
    """The trim threshold is twice the mmap threshold (as glibc's adaptive rule keeps it): a
    3 MiB buffer freed at the heap's top under a 4 MiB threshold is kept (glibc's fixed default
    trim of 128 KiB would hand it back, and the next buffer would fault its pages in again);
    under a 512 KiB threshold it was mapped on its own and goes back at once."""
    out = subprocess.run(
        [sys.executable, "-c", TOP, "4096"], capture_output=True, text=True, check=True
    ).stdout.split()
    if out[0] != "True":
        pytest.skip("not glibc: nothing to tune")
    assert float(out[1]) > 2.5, f"only {float(out[1]):.1f} MB kept of a freed 3 MiB buffer"
    out = subprocess.run(
        [sys.executable, "-c", TOP, "512"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert float(out[1]) < 0.5, f"{float(out[1]):.1f} MB kept of a buffer mapped on its own"
