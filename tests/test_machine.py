"""The machine a run records (tepo_cli/core/machine.py): each machine it trained on, once, with the
step it continued from there."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tepo_cli.core import machine
from tepo_cli.core.machine import cpu_model, describe, moved_warning, note_machine

XEON = {"cpu": "Intel Xeon", "cores": 2, "bf16_instructions": ["AMX", "AVX-512 BF16"]}
EPYC = {"cpu": "AMD EPYC", "cores": 2, "bf16_instructions": ["AVX-512 BF16"]}


def test_a_run_lists_each_machine_it_trained_on_with_the_step_it_continued_from():
    summary: dict = {}
    assert note_machine(summary, XEON, 0) is None  # the run's first machine
    assert note_machine(summary, dict(XEON), 40) is None  # resumed where it stopped: nothing
    assert note_machine(summary, EPYC, 95) == XEON  # resumed on another processor after step 95
    assert note_machine(summary, EPYC, 97) is None
    assert note_machine(summary, XEON, 98) == EPYC  # and back
    assert summary["machines"] == [
        {**XEON, "from_step": 0},
        {**EPYC, "from_step": 95},
        {**XEON, "from_step": 98},
    ]


def test_the_processor_name_is_cpuinfos_first_model_name():
    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
        if line.startswith("model name")
    ]
    assert cpu_model() == (names[0] if names else cpu_model()) and cpu_model()


def test_without_cpuinfo_the_name_comes_from_platform(monkeypatch):
    def unreadable(self: Path) -> str:
        raise OSError("no such file")

    monkeypatch.setattr(Path, "read_text", unreadable)
    monkeypatch.setattr(machine.platform, "processor", lambda: "")
    monkeypatch.setattr(machine.platform, "machine", lambda: "arm64")
    assert cpu_model() == "arm64"
    monkeypatch.setattr(machine.platform, "machine", lambda: "")
    assert cpu_model() == "unknown CPU"


def test_a_cpu_rank_is_described_without_an_accelerator():
    found = describe(torch.device("cpu"))
    assert found["cpu"] == cpu_model() and found["accelerator"] is None
    assert found["torch"] == torch.__version__
    assert set(found["bf16_instructions"]) <= {"AMX", "AVX-512 BF16"}
    assert found["cores"] == os.cpu_count()  # the machine's, whatever this process is bound to


def test_a_run_resumed_on_another_machine_is_told_what_changed_and_from_which_step():
    warning = moved_warning(XEON, EPYC, 95)
    assert warning.startswith("this run continues after step 95 on another machine or torch than")
    assert "(cpu Intel Xeon -> AMD EPYC; bf16_instructions ['AMX', 'AVX-512 BF16'] -> " in warning
    assert "['AVX-512 BF16'])" in warning and "cores" not in warning  # only what differs
    assert "equals an uninterrupted run only up to step 95" in warning
