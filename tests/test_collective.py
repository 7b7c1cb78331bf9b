"""tepo_cli/core/collective.py on one process: every collective is a no-op that returns its
input, so callers need no `dist.is_initialized()` of their own (the multi-rank behaviour is
exercised by the two-rank runs: test_ranks_collectives.py, test_two_nodes.py, test_vllm_e2e.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tepo_cli.core import collective


def test_one_process_is_one_rank_and_every_collective_returns_its_input():
    # An earlier test in this worker may have left a group of one: still one rank.
    assert not dist.is_initialized() or dist.get_world_size() == 1
    assert (collective.world_size(), collective.multi_rank()) == (1, False)
    values = torch.tensor([1.5, -2.0], dtype=torch.float64)
    for op in ("sum", "max", "min"):
        assert collective.reduce(values, op) is values
    assert collective.any_rank(True) and not collective.any_rank(False)
    assert collective.every_rank(True) and not collective.every_rank(False)
    assert collective.from_rank0({"a": 1}) == {"a": 1}
    assert collective.from_every_rank(3) == [3]
    collective.tensors_from_rank0([values])
    collective.barrier()
    if not dist.is_initialized():
        assert collective.collective_device() == torch.device("cpu")
