"""Objectives declare the inputs they read (algos/inputs.py): a registered objective reads no input
it did not declare, and the trainer's batch (train/micro_batch_objective.py) holds every
declared one, with the loss the public `policy_loss` gives on everything the trainer has."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from small_experience import ROWS, small_experience

import tepo_cli.train.experience as exp
from tepo_cli.algos import (
    get_policy_loss,
    objective_reads,
    policy_loss,
    preset_names,
    register_policy_loss,
    resolve_algo,
)
from tepo_cli.algos.algo_config import AlgoConfig
from tepo_cli.algos.batch import PolicyBatch, checked_batch
from tepo_cli.algos.inputs import DECLARABLE, scored
from tepo_cli.algos.tepo_mask import CRITERIA
from tepo_cli.config.validate import load_train_config
from tepo_cli.models.policy import Policy
from tepo_cli.models.reference import build_reference
from tepo_cli.mtp.modules import attach
from tepo_cli.train.micro_batch_objective import (
    forward_scores,
    micro_batch_objective,
    objective_batch,
)
from tepo_cli.train.token_picks import step_picks

F64 = torch.float64
B, T = 3, 6


class UndeclaredRead(AssertionError):
    pass


class _Undeclared:
    """Stands in the batch for an input the objective did not declare: any use of it raises."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _fail(self) -> UndeclaredRead:
        return UndeclaredRead(f"the objective read {self.name}, which it did not declare")

    def __getattr__(self, attr: str):
        raise self._fail()

    def __bool__(self) -> bool:
        raise self._fail()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        undeclared = next(a for a in (*args, *(kwargs or {}).values()) if isinstance(a, cls))
        raise undeclared._fail()


def _full_batch(depths: int) -> PolicyBatch:
    """Every input an objective can read, random, with padding on row 1 and 2."""
    generator = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.rand(*shape, generator=generator, dtype=F64)  # noqa: E731
    mask = torch.arange(T) < torch.tensor([[6], [4], [2]])
    old = -rand(B, T) - 0.1
    return checked_batch(
        PolicyBatch(
            (old + 0.1 * rand(B, T) - 0.05).requires_grad_(),
            old,
            torch.tensor([1.0, -0.5, 0.25], dtype=F64),
            mask,
            ref_logp=old - 0.2 * rand(B, T),
            entropy=rand(B, T) * 2,
            old_entropy=rand(B, T) * 2,
            mtp_logp=-rand(B, T, max(depths, 1)),
            old_mtp_logp=-rand(B, T, max(depths, 1)),
            old_entropy_term=rand(B, T) * 0.1,
            cov_selected=rand(B, T) > 0.7,
        )
    )


def _only_declared(batch: PolicyBatch, cfg: AlgoConfig) -> PolicyBatch:
    reads = objective_reads(cfg)
    return dataclasses.replace(batch, **{name: _Undeclared(name) for name in DECLARABLE - reads})


CONFIGS = [
    *((name, {}) for name in preset_names()),
    *(("tepo", {"mask_criterion": c}) for c in CRITERIA),
    *(("tepo", {"mask_criterion": c, "beta": 0.0}) for c in CRITERIA),
    ("grpo", {"kl_target": "old"}),
    ("grpo", {"beta": 0.0}),
    ("mpo", {"k": 3}),
    ("kl_cov", {"beta": 0.04, "kl_mask": "tepo"}),
    ("clip_cov", {"beta": 0.04, "kl_mask": "tepo", "mask_criterion": "entropy_drop"}),
]


@pytest.mark.parametrize(("preset", "knobs"), CONFIGS)
def test_each_objective_reads_only_what_it_declares(preset, knobs) -> None:
    cfg = resolve_algo(preset, knobs)
    full = _full_batch(cfg.mtp_depths)
    loss, metrics = get_policy_loss(cfg.name)(full, cfg)
    declared_loss, declared_metrics = get_policy_loss(cfg.name)(_only_declared(full, cfg), cfg)
    assert torch.equal(declared_loss, loss) and declared_metrics == metrics
    # the one declaration sets what each pass scores
    reads = objective_reads(cfg)
    assert ("mtp_logp" in scored(reads, rollout=True)) == (cfg.mtp_depths > 0)
    assert ("entropy" in scored(reads, rollout=True)) == cfg.needs_old_entropy
    assert ("entropy_term" in scored(reads, rollout=True)) == cfg.needs_old_entropy_term
    assert "entropy" in scored(reads, rollout=False)  # the step's logged entropy


def test_an_objective_reading_an_undeclared_input_is_caught() -> None:
    """The check above can fail: an objective that reads π_old's entropy without declaring it."""

    @register_policy_loss("test_reads_entropy_undeclared")
    def reads_entropy(batch: PolicyBatch, cfg: AlgoConfig):
        return (batch.old_entropy * batch.mask).sum(), {}

    cfg = resolve_algo("grpo", {"name": "test_reads_entropy_undeclared"})
    full = _full_batch(0)
    assert float(reads_entropy(full, cfg)[0]) == pytest.approx(
        float(full.old_entropy[full.mask].sum()), abs=1e-12
    )
    with pytest.raises(UndeclaredRead, match="old_entropy"):
        reads_entropy(_only_declared(full, cfg), cfg)

    register_policy_loss("test_declares_unknown", reads=frozenset({"values"}))(reads_entropy)
    with pytest.raises(ValueError, match="unknown inputs values"):
        objective_reads(resolve_algo("grpo", {"name": "test_declares_unknown"}))


def _experience() -> exp.Experience:
    return small_experience(torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]))


TRAINER = [
    ["algo=grpo"],
    ["algo=tepo"],
    ["algo=tepo", "trainer.minibatches=2"],
    ["algo=tepo", "algo.mask_criterion=first_order"],
    ["algo=tepo", "algo.mask_criterion=first_order", "trainer.minibatches=2"],
    ["algo=tepo", "algo.mask_criterion=entropy_drop", "trainer.minibatches=2"],
    ["algo=mpo"],
    ["algo=mpo", "trainer.minibatches=2"],
    ["algo=kl_cov"],
    ["algo=grpo", "algo.top_entropy_quantile=0.3"],  # on-policy: experience.selection
    ["algo=tepo", "algo.top_entropy_quantile=0.3", "trainer.minibatches=2"],
    ["algo=kl_cov", "algo.top_entropy_quantile=0.5"],
    ["algo=grpo", "algo.off_policy_mask=0.0", "algo.entropy_coef=0.01", "trainer.minibatches=2"],
    ["algo=grpo", "algo.kl_bias_correction=true", "trainer.minibatches=2"],
]


@pytest.mark.parametrize("overrides", TRAINER, ids=" ".join)
def test_the_trainer_passes_every_declared_input(compose_config, tiny_model, overrides) -> None:
    """Scored as the score stage and the update score them, the micro-batch's PolicyBatch holds
    each declared input (the reference's log-probs where the run loads a reference), and the
    loss and metrics equal `policy_loss` given everything the trainer has."""
    base = ["model=tiny", "rollout.n=4", "trainer.prompts_per_step=2"]
    cfg = load_train_config(compose_config("train", [*base, *overrides]))
    algo = cfg.algo
    torch.manual_seed(0)
    policy = Policy(
        tiny_model,
        cfg.kernel,
        attach=attach(algo.mtp_depths, algo.mtp) if algo.mtp_depths else None,
    )
    reference = build_reference(cfg, policy)
    experience = _experience()
    exp._add_scores(cfg, policy, reference, experience.batch, experience)
    assert (experience.old_logp is None) == exp.on_policy(cfg)
    rows = torch.arange(ROWS)
    part = experience.batch.select(rows)
    scores = policy(part, cfg.rollout.temperature, make=forward_scores(cfg, experience))
    picks = step_picks(algo, experience, rows, seed=3)
    selected = picks.cov_selected
    tokens, seqs = float(part.trained_mask.sum()), float(ROWS)
    batch = objective_batch(cfg, experience, rows, part, scores, tokens, seqs, None, picks)
    missing = {n for n in objective_reads(algo) if getattr(batch, n) is None}
    assert missing == (
        {"ref_logp"} if "ref_logp" in objective_reads(algo) and not algo.needs_ref else set()
    )
    assert {n for n in DECLARABLE - objective_reads(algo) if getattr(batch, n) is not None} == set()

    loss, metrics = micro_batch_objective(cfg, batch, scores)
    old = experience.old or {"old_" + name: value.detach() for name, value in scores.items()}
    everything, named = policy_loss(
        algo,
        scores.logp,
        old["old_logp"],
        experience.advantages,
        part.trained_mask,
        ref_logp=experience.ref_logp,
        entropy=scores.entropy,
        old_entropy=old.get("old_entropy"),
        mtp_logp=scores.mtp_logp,
        old_mtp_logp=old.get("old_mtp_logp"),
        old_entropy_term=old.get("old_entropy_term"),
        cov_selected=selected,
        entropy_kept=batch.entropy_kept,
        num_tokens=tokens,
        num_seqs=seqs,
        max_len=cfg.completion_tokens,
    )
    assert torch.equal(loss, everything)
    assert metrics == named
