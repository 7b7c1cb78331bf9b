"""`model.dtype=auto` on the CPU: bf16 only with bf16 matrix instructions and a probe that
confirms them, float32 otherwise, said at start and settled in the run's config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tepo_cli.models import precision


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No forced answer, an empty cache, no remembered decision, and a quiet machine."""
    monkeypatch.delenv(precision.FORCE_VARIABLE, raising=False)
    monkeypatch.setattr(precision, "_busy", lambda: None)
    monkeypatch.setenv("TEPO_CACHE", str(tmp_path))
    precision.cpu_precision.cache_clear()
    yield tmp_path
    precision.cpu_precision.cache_clear()


def _no_probe():
    raise AssertionError("the probe ran")


def test_a_cpu_without_bf16_instructions_keeps_float32_without_probing(fresh, monkeypatch):
    monkeypatch.setattr(precision, "bf16_instructions", lambda: [])
    monkeypatch.setattr(precision, "probe_speedup", _no_probe)
    choice = precision.cpu_precision()
    assert choice.dtype == "float32" and "no bf16 matrix instructions" in choice.reason
    assert precision.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    line = precision.precision_line("auto", "cpu")
    assert line.startswith("model.dtype=auto: float32 (this CPU has no bf16")


@pytest.mark.parametrize(
    ("speedup", "expected"), [(0.02, "float32"), (1.1, "float32"), (3.0, "bfloat16")]
)
def test_the_probe_decides_where_the_instructions_exist(fresh, monkeypatch, speedup, expected):
    """A probe that finds bf16 slower (an emulating VM) or barely faster keeps float32."""
    monkeypatch.setattr(precision, "bf16_instructions", lambda: ["AMX"])
    monkeypatch.setattr(precision, "probe_speedup", lambda: speedup)
    choice = precision.cpu_precision()
    assert choice.dtype == expected
    assert f"{speedup:.1f}" in choice.reason or f"{speedup:.2f}" in choice.reason
    assert precision.resolve_dtype("auto", torch.device("cpu")) == precision.DTYPES[expected]


def test_the_probe_runs_once_per_machine_then_reads_its_cache(fresh, monkeypatch):
    monkeypatch.setattr(precision, "bf16_instructions", lambda: ["AVX-512 BF16"])
    monkeypatch.setattr(precision, "probe_speedup", lambda: 2.5)
    assert precision.cpu_precision().dtype == "bfloat16"
    cached = json.loads((fresh / "precision.json").read_text())
    assert list(cached.values()) == [2.5]
    precision.cpu_precision.cache_clear()
    monkeypatch.setattr(precision, "probe_speedup", _no_probe)  # a second process: cache only
    assert precision.cpu_precision().dtype == "bfloat16"


@pytest.mark.parametrize(
    ("speedup", "expected"), [(0.02, "float32"), (0.95, "bfloat16"), (1.1, "bfloat16")]
)
def test_a_probe_on_a_busy_machine_tells_only_emulation_and_is_not_cached(
    fresh, monkeypatch, speedup, expected
):
    """Beside a training run a native bf16 read 0.95x on an Intel Xeon with AMX (1.4-1.5x alone):
    under load a probe below the bar keeps float32 only for an emulated bf16, so the runs a busy
    machine starts decide alike, and nothing is cached."""
    monkeypatch.setattr(precision, "bf16_instructions", lambda: ["AMX"])
    monkeypatch.setattr(precision, "_busy", lambda: 3)
    monkeypatch.setattr(precision, "probe_speedup", lambda: speedup)
    choice = precision.cpu_precision()
    assert choice.dtype == expected
    assert "not cached: 3 other threads were running" in choice.reason
    assert f"below {precision.MIN_SPEEDUP_BUSY}x, emulation's, keeps float32" in choice.reason
    assert not (fresh / "precision.json").exists()


def test_a_busy_probe_that_clears_the_bar_anyway_is_cached(fresh, monkeypatch):
    """A busy reading over the bar is kept: later runs skip the probe."""
    monkeypatch.setattr(precision, "bf16_instructions", lambda: ["AVX-512 BF16"])
    monkeypatch.setattr(precision, "_busy", lambda: 2)
    monkeypatch.setattr(precision, "probe_speedup", lambda: 1.6)
    choice = precision.cpu_precision()
    assert choice.dtype == "bfloat16"
    assert "probed once beside 2 other running threads, cached in" in choice.reason
    assert list(json.loads((fresh / "precision.json").read_text()).values()) == [1.6]
    precision.cpu_precision.cache_clear()
    monkeypatch.setattr(precision, "probe_speedup", _no_probe)  # the next run: the cache only
    assert precision.cpu_precision().dtype == "bfloat16"


def test_an_earlier_probes_answer_is_measured_again(fresh, monkeypatch):
    """The one-layer probe's cached 0.894 (its key had no probe version) must not decide."""
    monkeypatch.setattr(precision, "bf16_instructions", lambda: ["AMX"])
    old_key = precision._machine_key().rsplit(" | probe ", 1)[0]
    (fresh / "precision.json").write_text(json.dumps({old_key: 0.894}))
    monkeypatch.setattr(precision, "probe_speedup", lambda: 1.7)
    choice = precision.cpu_precision()
    assert choice.dtype == "bfloat16" and "1.7x" in choice.reason
    cached = json.loads((fresh / "precision.json").read_text())
    assert cached == {old_key: 0.894, precision._machine_key(): 1.7}


@pytest.mark.parametrize(("forced", "expected"), [("0", "float32"), ("1", "bfloat16")])
def test_the_environment_forces_the_answer(fresh, monkeypatch, forced, expected):
    monkeypatch.setenv(precision.FORCE_VARIABLE, forced)
    monkeypatch.setattr(precision, "probe_speedup", _no_probe)
    choice = precision.cpu_precision()
    assert choice.dtype == expected and f"TEPO_CPU_BF16={forced}" in choice.reason


def test_the_probe_measures_a_ratio():
    """The real probe: a positive, finite float32/bf16 time ratio (its size is the hardware's)."""
    speedup = precision.probe_speedup(lengths=(5, 9), rounds=2)
    assert 0 < speedup < float("inf")


def test_cuda_and_explicit_names():
    assert precision.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert precision.resolve_dtype("float32", torch.device("cpu")) == torch.float32
    assert precision.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_a_slow_bf16_request_is_said_not_silent(monkeypatch):
    monkeypatch.setattr(precision, "bf16_instructions", lambda: [])
    warning = precision.slow_bf16_warning("bfloat16", "cpu")
    assert warning and "emulated" in warning and "model.dtype=auto" in warning
    monkeypatch.setattr(precision, "bf16_instructions", lambda: ["AMX"])
    assert precision.slow_bf16_warning("bfloat16", "cpu") is None
    assert precision.slow_bf16_warning("float32", "cpu") is None
    assert precision.slow_bf16_warning("bfloat16", "cuda") is None


@pytest.mark.parametrize(("forced", "dtype"), [("0", "float32"), ("1", "bfloat16")])
def test_train_settles_auto_says_it_and_records_it(tmp_path, forced, dtype):
    """The start line names the precision and why; the run's config holds the settled dtype."""
    run_dir = tmp_path / "run"
    env = {**os.environ, precision.FORCE_VARIABLE: forced}
    result = subprocess.run(
        [sys.executable, "-m", "tepo_cli", "train", f"hydra.run.dir={run_dir}", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"model.dtype=auto: {dtype} (TEPO_CPU_BF16={forced} forces it)" in result.stderr
    assert f"dtype: {dtype}" in result.stdout + result.stderr


def test_a_run_that_recorded_auto_resumes_as_the_dtype_auto_meant_then():
    from tepo_cli.train.train_job import _auto_as_it_was

    previous = {"model": {"dtype": "auto", "name": "m"}, "seed": 1}
    assert _auto_as_it_was(previous, "cpu")["model"] == {"dtype": "float32", "name": "m"}
    assert _auto_as_it_was(previous, "cuda")["model"]["dtype"] == "bfloat16"
    settled = {"model": {"dtype": "bfloat16"}}
    assert _auto_as_it_was(settled, "cpu") == settled
