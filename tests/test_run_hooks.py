"""The run's hooks (runtime/hooks.py): a normal run's points pass; TEPO_FAULT's faults
(runtime/faults.py) fire at their point, step range and rank only."""

from __future__ import annotations

import math

import torch

from tepo_cli.runtime import faults
from tepo_cli.runtime.hooks import RunHooks


def test_a_normal_runs_hooks_change_nothing():
    hooks = RunHooks()
    loss = torch.tensor(1.5, dtype=torch.float64)
    hooks.enter_step(3)
    hooks.reached("update")  # would SIGKILL this test under a fault
    hooks.hold(lambda: 1)  # would exit the process under a fault
    assert hooks.loss(loss) is loss
    assert hooks.step == 3


def test_faults_are_armed_at_their_steps_and_ranks_only():
    hooks = faults.FaultInjection("update:2-3,nan_loss:4@1,hang:1@0", rank=1)
    armed = {}
    for step in range(6):
        hooks.enter_step(step)
        armed[step] = [p for p in ("update", "nan_loss", "hang") if hooks.armed(p)]
    assert armed == {0: [], 1: [], 2: ["update"], 3: ["update"], 4: ["nan_loss"], 5: []}
    hooks.enter_step(4)
    assert math.isnan(float(hooks.loss(torch.tensor(2.0, dtype=torch.float64))))
    hooks.enter_step(5)
    assert float(hooks.loss(torch.tensor(2.0, dtype=torch.float64))) == 2.0


def test_the_run_reads_tepo_fault_once(monkeypatch):
    monkeypatch.setenv("TEPO_FAULT", "")
    assert type(faults.from_env()) is RunHooks
    monkeypatch.setenv("TEPO_FAULT", "rollout:7@2")
    monkeypatch.setenv("RANK", "2")
    hooks = faults.from_env()
    monkeypatch.setenv("TEPO_FAULT", "")  # read at the start: a later change is not seen
    hooks.enter_step(7)
    assert isinstance(hooks, faults.FaultInjection) and hooks.armed("rollout")
