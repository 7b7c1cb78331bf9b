"""The CPU's matmul peak for MFU (tepo_cli/train/cpu_peak.py): the fastest of several trials at
a fixed shape, cached per machine and dtype, and MFU never above 1 even when the first probe ran
on a busy machine. The probe's clock is replaced so every timing below is exact:
a [1024, 1024] × [1024, 1024] product is 2 · 1024³ = 2 147 483 648 FLOPs."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from tepo_cli.train import cpu_peak
from tepo_cli.train.step_records import _throughput

PRODUCT = 2.0 * 1024**3


class Clock:
    """Each trial (a begin and an end reading) takes the next of `tooks` seconds."""

    def __init__(self, *tooks: float) -> None:
        self.tooks, self.now, self.calls = list(tooks), 0.0, 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:
            self.now += self.tooks.pop(0) if len(self.tooks) > 1 else self.tooks[0]
        return self.now


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TEPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_peak, "_KNOWN", {})
    return tmp_path / "cache" / "cpu_peak.json"


def test_the_probe_leaves_the_global_rng_alone_and_measures_a_rate():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    rate = cpu_peak.measure(torch.float32, size=128)
    assert torch.equal(torch.rand(3), expected)
    assert math.isfinite(rate) and rate > 1e6


def test_the_peak_is_the_fastest_of_the_trials(monkeypatch):
    monkeypatch.setattr(cpu_peak, "clock", Clock(0.5, 0.1, 0.2, 0.4, 0.3))
    assert cpu_peak.measure(torch.float32) == pytest.approx(PRODUCT / 0.1, rel=1e-12)


def test_a_slow_dtype_stops_after_three_trials_past_the_budget(monkeypatch):
    clock = Clock(2.0)  # 3 trials: 6 s > the 3 s budget
    monkeypatch.setattr(cpu_peak, "clock", clock)
    assert cpu_peak.measure(torch.float32) == pytest.approx(PRODUCT / 2.0)
    assert clock.calls == 6


def test_cached_per_machine_and_dtype(monkeypatch, cache):
    measured: list[torch.dtype] = []
    rates = {torch.float32: 4e10, torch.bfloat16: 9e10}
    monkeypatch.setattr(cpu_peak, "measure", lambda dtype: measured.append(dtype) or rates[dtype])
    assert cpu_peak.cpu_peak(torch.float32) == 4e10
    assert cpu_peak.cpu_peak(torch.float32) == 4e10
    assert cpu_peak.cpu_peak(torch.bfloat16) == 9e10  # its own probe: another unit, another peak
    assert measured == [torch.float32, torch.bfloat16]
    stored = json.loads(cache.read_text())
    key = cpu_peak.machine_key(torch.float32)
    assert stored == {key: 4e10, cpu_peak.machine_key(torch.bfloat16): 9e10}
    assert f"torch={torch.__version__}|float32" in key and "|cores=" in key and "|threads=" in key
    monkeypatch.setattr(cpu_peak, "_KNOWN", {})  # a later run on this machine: read, not measured
    assert cpu_peak.cpu_peak(torch.float32) == 4e10 and len(measured) == 2


def engine() -> SimpleNamespace:
    return SimpleNamespace(
        module=SimpleNamespace(lm=torch.nn.Linear(2, 2)), device=torch.device("cpu")
    )


def test_a_slow_first_probe_never_records_mfu_above_one(monkeypatch, cache, capsys):
    """The first probe ran while another job held the cores: every trial 10 s, a peak of
    0.2147 GFLOP/s. The update then does 3 GFLOP in 1 s (3 GFLOP/s): the peak is measured again
    (still busy: 5 s a trial, 0.4295 GFLOP/s), so the achieved rate becomes the peak, said on
    stderr and cached, and MFU is exactly 1, never 3 / 0.2147 = 13.97."""
    monkeypatch.setattr(cpu_peak, "clock", Clock(10.0))
    assert cpu_peak.cpu_peak(torch.float32) == pytest.approx(PRODUCT / 10.0)
    monkeypatch.setattr(cpu_peak, "clock", Clock(5.0))
    record = {"update_flops": 3e9, "trained_tokens": 100.0, "update_seconds": 1.0}
    result = _throughput(engine(), record)
    assert result["update_mfu"] == 1.0 and result["peak_flops"] == pytest.approx(3e9)
    assert "raised to the achieved rate" in capsys.readouterr().err
    assert json.loads(cache.read_text()) == {cpu_peak.machine_key(torch.float32): 3e9}
    # the next step at 1.5 GFLOP/s reads against the raised peak: 0.5, nothing measured
    monkeypatch.setattr(cpu_peak, "measure", lambda dtype: pytest.fail("measured again"))
    later = _throughput(engine(), {**record, "update_flops": 1.5e9})
    assert later["update_mfu"] == pytest.approx(0.5)


def test_a_slow_first_probe_measured_again_on_a_quiet_machine(monkeypatch, capsys):
    """Measured again with the machine quiet (0.01 s a trial: 214.7 GFLOP/s): that is the peak,
    and the update's 3 GFLOP/s reads as MFU 3e9 / 2.147e11 = 0.013970."""
    monkeypatch.setattr(cpu_peak, "clock", Clock(10.0))
    cpu_peak.cpu_peak(torch.float32)
    monkeypatch.setattr(cpu_peak, "clock", Clock(0.01))
    result = _throughput(
        engine(), {"update_flops": 3e9, "trained_tokens": 1.0, "update_seconds": 1.0}
    )
    assert result["update_mfu"] == pytest.approx(3e9 / (PRODUCT / 0.01), rel=1e-9)
    assert result["update_mfu"] == pytest.approx(0.013970, abs=1e-6)
    assert "raised" not in capsys.readouterr().err
