"""bf16 through DeepSpeed at every ZeRO stage (one CPU rank, gloo): float32 master weights,
AdamW moments and gradient accumulation; every skipped step counted, DeepSpeed's own included."""

from __future__ import annotations

import json

import deepspeed
import pytest
import torch
import torch.distributed as dist
from deepspeed.utils import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
)
from torch import nn

from tepo_cli.config.validate import load_train_config
from tepo_cli.core import collective
from tepo_cli.core.collective import collective_device
from tepo_cli.core.errors import RunError
from tepo_cli.runtime import faults
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.runtime.engine import build_engine
from tepo_cli.runtime.guards import FiniteAdamW, skipped_optimizer_steps
from tepo_cli.runtime.hooks import RunHooks
from tepo_cli.runtime.master_weights import MasterAdamW

SMALL = 2.0**-9  # 1 + SMALL is 1 in bf16 (8 significant bits), not in float32


class LmWithProbe(nn.Module):
    """The tiny LM's next-token loss plus `probe · c`: the probe's gradient is exactly c, so the
    gradient DeepSpeed accumulates over micro-batches can be read to the last bit."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.probe = nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))

    def forward(self, ids: torch.Tensor, c: float) -> torch.Tensor:
        logits = self.lm(input_ids=ids).logits.float()
        lm_loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        return lm_loss + (self.probe.float() * c).sum()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_trains_with_float32_masters_moments_accumulation_and_counts_skipped_steps(
    compose_config, tiny_model, stage
):
    """Two micro-batches whose probe gradients are 1 and 2^-9: their mean keeps the 2^-9 only
    if DeepSpeed accumulates in float32. The step moves the LM's bf16 weights to the float32
    master (rounded), whose moments are float32. Then a non-finite step, which DeepSpeed's own
    bf16 wrapper skips before the guard runs: counted, the weights, moments and schedule kept."""
    cfg = load_train_config(
        compose_config(
            "train",
            ["model=tiny", f"deepspeed=zero{stage}", "trainer.grad_clip=0", "trainer.lr=1e-3"],
        )
    )
    setup_topology(num_threads=None)
    try:
        model = LmWithProbe(tiny_model.to(torch.bfloat16))
        before = model.lm.model.layers[0].mlp.up_proj.weight.detach().float().clone()
        engine = build_engine(model, cfg, accumulation=2, world=1)
        ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
        lm_weight = engine.module.lm.model.layers[0].mlp.up_proj.weight
        losses = []
        for c in (1.0, SMALL):
            if losses:
                engine.step()  # a micro-step: DeepSpeed steps at the accumulation boundary only
            loss = engine(ids, c)
            engine.backward(loss)
            losses.append(float(loss.detach()))
        probe = engine.module.probe
        grad = safe_get_full_grad(probe)
        assert grad is not None and grad.dtype == torch.float32
        assert torch.equal(grad, torch.full((8,), (1.0 + SMALL) / 2))  # not 0.5, bf16's sum
        assert engine.communication_data_type == torch.float32
        engine.step()
        assert all(torch.isfinite(torch.tensor(losses)))
        for param in (probe, lm_weight):
            master = safe_get_full_fp32_param(param)
            assert master is not None and master.dtype == torch.float32
            for key in ("exp_avg", "exp_avg_sq"):
                moment = safe_get_full_optimizer_state(param, key)
                assert moment is not None and moment.dtype == torch.float32, key
        expected_moment = torch.full((8,), 0.1 * (1.0 + SMALL) / 2)  # (1 - β1) · g
        torch.testing.assert_close(safe_get_full_optimizer_state(probe, "exp_avg"), expected_moment)
        master = safe_get_full_fp32_param(lm_weight)
        assert (master - before).abs().max() > 1e-4  # the step moved the weights
        with deepspeed.zero.GatheredParameters([lm_weight]):  # ZeRO-3 holds a partition
            assert lm_weight.dtype == torch.bfloat16
            assert torch.equal(lm_weight.detach(), master.bfloat16())
        kept = (
            safe_get_full_fp32_param(probe).clone(),
            safe_get_full_optimizer_state(probe, "exp_avg").clone(),
            engine.lr_scheduler.last_epoch,
        )
        assert skipped_optimizer_steps(engine) == 0

        for c in (float("nan"), 1.0):
            engine.backward(engine(ids, c))
            engine.step()
        assert engine.skipped_steps == 1  # DeepSpeed's bf16 wrapper skipped it, not the guard
        assert skipped_optimizer_steps(engine) == 1
        assert torch.equal(safe_get_full_fp32_param(probe), kept[0])
        assert torch.equal(safe_get_full_optimizer_state(probe, "exp_avg"), kept[1])
        assert engine.lr_scheduler.last_epoch == kept[2]
    finally:
        teardown()


def test_max_bad_steps_stops_a_bf16_run(compose_config, tmp_path, monkeypatch):
    """`TEPO_FAULT=nan_loss:2-3 tepo train model=tiny model.dtype=bfloat16`: DeepSpeed's bf16
    wrapper skips steps 2 and 3; each is logged as skipped and two in a row end the run."""
    from tepo_cli.train.recipe import train

    monkeypatch.setenv("TEPO_FAULT", "nan_loss:2-3")
    cfg = load_train_config(
        compose_config(
            "train",
            [
                "model=tiny",
                "model.dtype=bfloat16",
                "trainer.max_steps=4",
                "trainer.max_bad_steps=2",
                "trainer.eval_before=false",
                "trainer.eval_after=false",
                "trainer.progress=false",
                "rollout.max_new_tokens=6",
            ],
        )
    )
    topo = setup_topology(num_threads=None)
    try:
        with pytest.raises(RunError, match=r"2 steps in a row \(up to step 3\)"):
            train(cfg, tmp_path, topo, faults.from_env())
    finally:
        teardown()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_optimizer_steps"] for r in records] == [0, 1, 1]


def test_collective_device_follows_the_default_groups_backend(monkeypatch):
    """NCCL takes tensors on the current CUDA device only; gloo (or no group) the host."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    assert collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert collective_device() == torch.device("cpu")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    assert collective_device() == torch.device("cpu")


def test_the_guards_finite_flag_is_all_reduced_on_the_collective_device(monkeypatch):
    """Host gradients (ZeRO-Offload) under NCCL: the flag crosses to the group's device before
    the all-reduce, and a non-finite gradient on another rank skips this rank's step too."""
    target = torch.device("cpu")  # what collective_device() answers; a CUDA device under NCCL
    asked, reduced = [], []
    monkeypatch.setattr(collective, "collective_device", lambda: asked.append(1) or target)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)

    def all_reduce(tensor: torch.Tensor, op=None, group=None, async_op=False) -> None:
        reduced.append(tensor.device)
        tensor.fill_(0.0)  # the other rank's gradients were not finite

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    weight = nn.Parameter(torch.ones(3))
    optimizer = FiniteAdamW([weight], lr=0.1)
    weight.grad = torch.ones(3)
    optimizer.step()
    assert asked and reduced == [target]
    assert optimizer.last_step_skipped and optimizer.skipped_steps == 1
    assert torch.equal(weight.detach(), torch.ones(3))


def test_master_adamw_keeps_updates_below_bf16_resolution():
    """Constant unit gradients make each AdamW update exactly lr = 1e-3, below half the bf16
    spacing under 1 (2^-9): AdamW on the bf16 weights never moves them; with float32 masters
    the updates add up, and the weights are the masters rounded."""
    plain = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    mastered = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    plain_adamw = torch.optim.AdamW([plain], lr=1e-3, weight_decay=0.0)
    master_adamw = MasterAdamW([mastered], lr=1e-3, weight_decay=0.0)
    for _ in range(3):
        plain.grad = torch.ones_like(plain)
        plain_adamw.step()
        master_adamw.zero_grad()
        mastered.grad = torch.ones_like(mastered)
        master_adamw.step(max_norm=float("inf"))
    (master,) = master_adamw.masters
    assert torch.equal(plain.detach(), torch.ones(4, dtype=torch.bfloat16))  # lost to rounding
    torch.testing.assert_close(master.detach(), torch.full((4,), 0.997), rtol=0, atol=1e-6)
    assert master.dtype == torch.float32
    assert torch.equal(mastered.detach(), torch.full((4,), 1 - 2**-8, dtype=torch.bfloat16))


def test_bf16_mtp_warmup_steps_float32_masters(compose_config, tiny_model, tiny_tokenizer):
    """The warm-up on a bf16 policy at lr 1e-3: the modules' fresh norm weights start at 1,
    where bf16's spacing (2^-8 below 1) is ~4x an AdamW update; only float32 masters let
    several small updates move them."""
    from tepo_cli.benchmarks import build_task
    from tepo_cli.mtp.warmup import warm_up, warmup_stream_seed
    from tepo_cli.rollout import build_backend
    from tepo_cli.train.sampling import training_sampling
    from tepo_cli.train.setup import build_policy

    cfg = load_train_config(
        compose_config(
            "train",
            [
                "model=tiny",
                "algo=mpo",
                "k=2",
                "algo.mtp.warmup.steps=3",
                "algo.mtp.warmup.lr=1e-3",
                "algo.mtp.warmup.batch_size=2",
                "algo.mtp.warmup.log_every=100",
                "rollout.n=2",
                "rollout.max_new_tokens=4",
            ],
        )
    )
    policy = build_policy(cfg, tiny_model.to(torch.bfloat16))
    norms = [d.hidden_norm.weight for d in policy.mtp.depths] + [
        d.embed_norm.weight for d in policy.mtp.depths
    ]
    assert all(torch.equal(w, torch.ones_like(w)) for w in norms)
    stream = build_task(cfg.benchmark).train_stream(warmup_stream_seed(cfg.seed))
    sampling = training_sampling(cfg)

    def backend():
        return build_backend(cfg.rollout, policy.lm, tiny_tokenizer, True, torch.device("cpu"))

    warm_up(cfg, policy, tiny_tokenizer, stream, lambda record: None, RunHooks(), sampling, backend)
    assert all(p.dtype == torch.bfloat16 for p in policy.mtp.parameters())
    moved = sum(int((w != 1.0).sum()) for w in norms)
    assert moved > 0


def test_bf16_critic_computes_values_in_float32_over_float32_masters(compose_config, tiny_model):
    """advantage=gae on a bf16 model: the value head is float32 and computes V in float32 (a bf16
    product would round V to 8 bits); in the critic's bf16 engine its master weights and
    moments are float32."""
    from tepo_cli.core.rollout_record import Rollout
    from tepo_cli.core.sequences import SequenceBatch
    from tepo_cli.models.critic import Critic

    critic = Critic.from_policy(tiny_model.to(torch.bfloat16))
    assert critic.value_head.weight.dtype == torch.float32
    rows, width = 4, 5
    rollout = Rollout(
        prompt_ids=torch.randint(1, 100, (rows, 3), generator=torch.Generator().manual_seed(1)),
        prompt_mask=torch.ones(rows, 3, dtype=torch.long),
        completion_ids=torch.randint(1, 100, (rows, width), generator=torch.Generator()),
        completion_mask=torch.ones(rows, width, dtype=torch.bool),
        texts=[""] * rows,
        truncated=torch.zeros(rows, dtype=torch.bool),
    )
    batch = SequenceBatch.from_rollout(rollout)
    seen: list[torch.Tensor] = []
    critic.value_head.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    values = critic(batch)
    (hidden,) = seen
    assert hidden.dtype == torch.bfloat16
    head = critic.value_head
    exact = (hidden.float() @ head.weight.float().T + head.bias.float()).squeeze(-1)
    torch.testing.assert_close(values, exact, rtol=1e-6, atol=1e-7)
    assert not torch.equal(values, exact.bfloat16().float())  # finer than bf16 steps

    cfg = load_train_config(compose_config("train", ["model=tiny", "advantage=gae"]))
    setup_topology(num_threads=None)
    try:
        engine = build_engine(critic, cfg, accumulation=1, world=1, lr=cfg.advantage.critic_lr)
        engine.backward(engine(batch).pow(2).mean())
        engine.step()
        weight = engine.module.value_head.weight
        assert weight.dtype == torch.bfloat16  # the engine's copy; the master is float32
        master = safe_get_full_fp32_param(weight)
        assert master is not None and master.dtype == torch.float32
        assert safe_get_full_optimizer_state(weight, "exp_avg").dtype == torch.float32
        assert torch.equal(weight.detach(), master.bfloat16())
    finally:
        teardown()
