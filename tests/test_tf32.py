"""kernel.tf32: TF32 float32 matmuls for a float32 policy on CUDA, nothing on the CPU. The
setting is torch's process-wide flag, which exists (and is checked here) without a GPU."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tepo_cli.config.schema import KernelConfig
from tepo_cli.kernels.tf32 import set_tf32, tf32_wanted

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_auto_is_tf32_for_a_float32_policy_on_cuda_only():
    assert tf32_wanted("auto", torch.float32, CUDA)
    assert not tf32_wanted("auto", torch.bfloat16, CUDA)
    assert tf32_wanted(True, torch.bfloat16, CUDA)  # asked for: the float32 parts of a bf16 run
    assert not tf32_wanted(False, torch.float32, CUDA)
    for setting in ("auto", True, False):
        assert not tf32_wanted(setting, torch.float32, CPU)


@pytest.fixture()
def precision_kept():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_set_tf32_sets_the_processs_matmul_precision_on_cuda(precision_kept):
    assert set_tf32("auto", torch.float32, CUDA)
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # the newer API agrees
    assert not set_tf32(False, torch.float32, CUDA)
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"


def test_on_the_cpu_nothing_changes(precision_kept):
    torch.set_float32_matmul_precision("highest")
    assert not set_tf32(True, torch.float32, CPU)
    assert torch.get_float32_matmul_precision() == "highest"


def test_a_bad_value_is_refused():
    with pytest.raises(ValidationError, match="must be auto, true or false, not 'fast'"):
        KernelConfig(tf32="fast")


def test_the_chunked_path_multiplies_half_inputs_in_tf32_on_cuda_only(precision_kept, monkeypatch):
    """kernels/tf32.tf32_for_half_inputs: "high" inside, for bf16/fp16 CUDA inputs only, and the
    process's own setting back afterwards (also after an error)."""
    from tepo_cli.kernels.tf32 import tf32_for_half_inputs

    torch.set_float32_matmul_precision("highest")
    seen = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        weight = torch.zeros(2, 2, dtype=dtype)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
        with tf32_for_half_inputs(weight):
            seen.append(torch.get_float32_matmul_precision())
        monkeypatch.undo()
        with tf32_for_half_inputs(weight):  # on the CPU: nothing changes
            assert torch.get_float32_matmul_precision() == "highest"
    assert seen == ["high", "high", "highest"]
    assert torch.get_float32_matmul_precision() == "highest"
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(RuntimeError), tf32_for_half_inputs(torch.zeros(1, dtype=torch.bfloat16)):
        raise RuntimeError("a failing kernel")
    monkeypatch.undo()
    assert torch.get_float32_matmul_precision() == "highest"
