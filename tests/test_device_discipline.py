"""Every tensor tepo creates names its device, and rollouts reach the policy's device.

No GPU is at hand, so the rule is checked structurally (tepo_cli/core/device_check.py): a torch
function mode records each tensor factory that tepo's own code calls without `device=`. The
training and evaluation paths a GPU user takes run once each under it — hf with GAE and LoRA, MPO
with its MTP warm-up and DAPO's dynamic sampling, vLLM and `tepo eval` — and must record nothing.
Two ranks through the launcher, with the environment switch as a user sets it, are checked in the
two-rank MPO + MTP + GAE run of tests/test_resume_faults.py (one launch less). The
back-end boundary is checked on the `meta` device: a device the CPU engines never produce, so a
rollout found there was moved by the boundary.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from markers import needs_vllm

import tepo_cli
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.device_check import FACTORIES, DeviceCheck, Violation
from tepo_cli.core.rollout_record import Rollout

PARITY = "def score(completion, problem):\n    return len(completion) % 2\n"


def _run_as(module: str, source: str, check: DeviceCheck) -> None:
    """Run `source` as code of the module named `module` (its frames carry that name)."""
    with check:
        exec(
            compile(source, f"/somewhere/{module.replace('.', '/')}.py", "exec"),
            {
                "__name__": module,
                "torch": torch,
            },
        )


def test_the_check_records_tepos_factories_without_a_device_and_nothing_else():
    check = DeviceCheck()
    _run_as("tepo_cli.train.probe", "torch.zeros(2)\ntorch.tensor([1.0], device=None)", check)
    _run_as("tepo_cli.train.probe", "torch.arange(3, device='cpu')", check)
    _run_as("tepo_cli.train.probe", "x = torch.ones(2, device='cpu')\ntorch.zeros_like(x)", check)
    _run_as("tepo_cli_other.mod", "torch.zeros(2)", check)  # a package that only starts alike
    _run_as("transformers.probe", "torch.zeros(2)", check)
    _run_as("tepo_cli", "torch.randperm(4)\ntorch.eye(2)\ntorch.as_tensor([1])", check)
    # torch's own code called from tepo's (pad builds its output itself): not tepo's factory
    _run_as("tepo_cli.probe", "torch.nn.functional.pad(torch.ones(1, device='cpu'), (1, 1))", check)
    assert {(v.where.rsplit(":", 1)[1], v.factory) for v in check.violations} == {
        ("1", "zeros"),
        ("2", "tensor"),
        ("1", "randperm"),
        ("2", "eye"),
        ("3", "as_tensor"),
    }
    assert (
        str(Violation("tepo_cli/x.py:3", "zeros"))
        == "tepo_cli/x.py:3: torch.zeros(...) without device="
    )


def test_every_factory_call_in_the_source_names_its_device():
    """The paths no CPU run reaches (CUDA-only kernels, rare branches): every `torch.<factory>(`
    written in tepo_cli passes `device=` (and not `device=None`)."""
    names = {factory.__name__ for factory in FACTORIES}
    package = Path(tepo_cli.__file__).parent
    missing = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in names
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
            ):
                continue
            device = next((k.value for k in node.keywords if k.arg == "device"), None)
            if device is None or (isinstance(device, ast.Constant) and device.value is None):
                where = path.relative_to(package.parent)
                missing.append(f"{where}:{node.lineno}: torch.{node.func.attr}")
    assert missing == []


def _recorded(check: DeviceCheck) -> list[str]:
    """What the check recorded, one call site per line (the assertion shows them all)."""
    return sorted(map(str, check.violations))


def _train(compose_config, run_dir: Path, *overrides: str) -> list[dict]:
    from tepo_cli.runtime.distributed import setup_topology, teardown
    from tepo_cli.train.recipe import train

    (run_dir / "parity.py").write_text(PARITY)
    base = [
        "model=tiny",
        "reward=custom",
        f"reward.path={run_dir / 'parity.py'}",
        "trainer.max_steps=1",
        "trainer.eval_before=false",
        "trainer.eval_after=false",
        "trainer.save_final=false",
        "trainer.progress=false",
        "rollout.max_new_tokens=6",
    ]
    config = load_train_config(compose_config("train", [*base, *overrides]))
    topo = setup_topology(num_threads=None)
    try:
        train(config, run_dir, topo)
    finally:
        teardown()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        # the critic's GAE path, LoRA adapters and the ZeRO-2 engine; several micro-batches in
        # two minibatches: the policy's, the critic's and the adapters-off reference's prompt
        # passes, in training and in scoring
        pytest.param(
            (
                "advantage=gae",
                "model.lora.r=4",
                "deepspeed=zero2",
                "trainer.micro_batch_tokens=24",
                "trainer.minibatches=2",
            ),
            id="hf-gae-lora-zero2",
        ),
        # MPO's MTP modules (warm-up included), DAPO's refill, the held-out evaluation
        pytest.param(
            (
                "algo=mpo",
                "k=3",
                "algo.mtp.warmup.steps=1",
                "algo.mtp.warmup.batch_size=4",
                "algo.dynamic_sampling=true",
                "trainer.eval_after=true",
                "benchmark.eval_size=2",
            ),
            id="mpo-mtp-dapo-eval",
        ),
        pytest.param(
            ("rollout=vllm", "rollout.engine.kv_cache_gib=1"), marks=needs_vllm, id="vllm"
        ),
    ],
)
def test_training_names_every_device(compose_config, tmp_path, overrides):
    with DeviceCheck() as check:
        records = _train(compose_config, tmp_path, *overrides)
    assert _recorded(check) == []
    assert [r["step"] for r in records if "reward_mean" in r] == [1]
    if "trainer.micro_batch_tokens=24" in overrides:
        assert [r["prompt_pass_tokens"] > 0 for r in records if "reward_mean" in r] == [True]


def test_eval_names_every_device(compose_config, tmp_path):
    from tepo_cli.config.validate import load_eval_config
    from tepo_cli.eval.eval_job import run_eval

    overrides = ["model=tiny", "benchmark=arith", "eval.limit=2", "eval.n=2", "eval.greedy=false"]
    overrides += ["eval.max_new_tokens=4"]
    with DeviceCheck() as check:
        summary = run_eval(load_eval_config(compose_config("eval", overrides)), tmp_path)
    assert _recorded(check) == []
    assert summary["samples"] == 4


def _on(rollout: Rollout) -> set[torch.device]:
    tensors = [rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids]
    tensors += [rollout.completion_mask, rollout.truncated]
    tensors += [] if rollout.logprobs is None else [rollout.logprobs]
    return {t.device for t in tensors}


def test_every_back_end_returns_rollouts_on_the_device_it_was_built_for(compose_config):
    """`build_backend(..., device)`: hf generates with a CPU model; its rollout is on `meta`."""
    from tepo_cli.config.validate import load_train_config
    from tepo_cli.models.loading import load_model, load_tokenizer
    from tepo_cli.rollout import Sampling, build_backend

    config = load_train_config(compose_config("train", ["model=tiny"]))
    tokenizer = load_tokenizer(config.model)
    lm = load_model(config.model, tokenizer, torch.device("cpu"))
    backend = build_backend(config.rollout, lm, tokenizer, False, torch.device("meta"))
    rollout = backend.generate(["1+2="], Sampling(n=2, max_new_tokens=3))
    assert _on(rollout) == {torch.device("meta")}
    assert len(rollout.texts) == 2
