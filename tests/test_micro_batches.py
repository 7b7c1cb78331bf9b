"""Token-budget micro-batches (train/micro_batches.py): the planner's own properties, and one
update by token budget equal to the fixed-count update in float64 (loss and weights), for every
preset, MPO's MTP depths and the GAE critic included."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tepo_cli.algos.advantage import group_advantages
from tepo_cli.config.validate import load_train_config
from tepo_cli.core.errors import ConfigError
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.models.prompt_pass import MinibatchPrompts
from tepo_cli.runtime.critic_files import build_critic
from tepo_cli.runtime.distributed import setup_topology, teardown
from tepo_cli.runtime.engine import build_engine
from tepo_cli.train import experience as exp
from tepo_cli.train import update as update_module
from tepo_cli.train.advantage_stage import critic_targets
from tepo_cli.train.micro_batches import assign, micro_batch_cost, micro_batches, plan
from tepo_cli.train.setup import build_policy
from tepo_cli.train.update import accumulation_steps, update

# Eight rows of two prompts (3 and 5 tokens), ragged completions.
COMPLETION = [9, 1, 4, 7, 2, 8, 3, 6]
OWNER = [0, 0, 0, 0, 1, 1, 1, 1]
PROMPT = [3, 5]


def test_every_row_is_planned_once_and_multi_row_micro_batches_keep_the_budget():
    for budget in (1, 5, 12, 20, 30, 60, 1000):
        bins = plan(COMPLETION, OWNER, PROMPT, budget)
        assert sorted(row for part in bins for row in part) == list(range(8))
        for part in bins:
            assert len(part) == 1 or micro_batch_cost(part, COMPLETION, OWNER, PROMPT) <= budget
    assert plan(COMPLETION, OWNER, PROMPT, 1000) == [list(range(8))]
    assert plan([], [], [], 10) == []


def test_a_row_over_the_budget_gets_a_micro_batch_of_its_own():
    bins = plan(COMPLETION, OWNER, PROMPT, 8)  # row 0 costs 12, row 5 costs 13
    assert [0] in bins and [5] in bins
    assert len(plan(COMPLETION, OWNER, PROMPT, 1)) == 8


def test_longest_first_balances_the_token_totals():
    # 48 tokens in 2 micro-batches: the greedy plan splits them 24/24, prompts included.
    bins = assign(COMPLETION, OWNER, PROMPT, 2)
    costs = [micro_batch_cost(part, COMPLETION, OWNER, PROMPT) for part in bins]
    assert sum(costs) >= sum(COMPLETION) + sum(PROMPT)
    assert max(costs) - min(costs) <= max(COMPLETION)
    assert bins == assign(list(COMPLETION), list(OWNER), list(PROMPT), 2)  # deterministic


def test_a_given_count_is_met_exactly_whatever_the_tokens():
    """What a rank with fewer tokens does to match the count the ranks agreed on."""
    for count in range(1, 9):
        bins = assign(COMPLETION, OWNER, PROMPT, count)
        assert len(bins) == count and all(bins)
    zeros = [0] * 8
    assert len(assign(zeros, OWNER, PROMPT, 5)) == 5  # empty answers: still five micro-batches


def test_the_budget_must_be_positive(compose_config):
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        load_train_config(compose_config("train", ["model=tiny", "trainer.micro_batch_tokens=0"]))
    cfg = load_train_config(
        compose_config("train", ["model=tiny", "trainer.micro_batch_tokens=null"])
    )
    assert cfg.trainer.micro_batch_tokens is None


def _rollout(lengths: list[int] = COMPLETION) -> Rollout:
    generator = torch.Generator().manual_seed(0)
    rows, width = 8, 9
    completion_mask = torch.zeros(rows, width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        completion_mask[row, :length] = True
    prompts = torch.randint(3, 60, (2, 5), generator=generator)
    prompt_mask = torch.ones(rows, 5, dtype=torch.long)
    prompt_mask[:4, :2] = 0  # the first prompt is 3 tokens, left-padded
    return Rollout(
        prompt_ids=prompts.repeat_interleave(4, dim=0),
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(3, 60, (rows, width), generator=generator),
        completion_mask=completion_mask,
        texts=[""] * rows,
        truncated=torch.zeros(rows, dtype=torch.bool),
    )


def test_row_tokens_count_each_distinct_prompt_once():
    batch = SequenceBatch.from_rollout(_rollout())
    parts = micro_batches(batch, torch.arange(8, device="cpu"), 25, 16)
    assert sorted(torch.cat(parts.rows).tolist()) == list(range(8))
    assert [p.tolist() for p in parts.rows] == plan(COMPLETION, OWNER, PROMPT, 25)
    assert not parts.prompt_pass
    assert parts.costs == [micro_batch_cost(p, COMPLETION, OWNER, PROMPT) for p in parts.rows]
    fixed = micro_batches(batch, torch.arange(8), None, 3)
    assert [p.tolist() for p in fixed.rows] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert fixed.costs is None and not fixed.prompt_pass


def test_with_a_prompt_pass_the_micro_batches_hold_answers_only():
    """Prompts included, the rows need several micro-batches: with a prompt pass they are
    planned again on their answers alone (the prompts run once, beside them)."""
    batch = SequenceBatch.from_rollout(_rollout())
    parts = micro_batches(batch, torch.arange(8, device="cpu"), 21, 16, prompt_pass=True)
    no_prompts = [0] * len(PROMPT)
    assert parts.prompt_pass
    assert [p.tolist() for p in parts.rows] == plan(COMPLETION, OWNER, no_prompts, 21)
    assert len(parts.rows) < len(plan(COMPLETION, OWNER, PROMPT, 21))
    assert parts.costs == [_answer_tokens(p) for p in parts.rows]
    # Rows that fit one micro-batch with their prompts keep them in it: nothing to share.
    short = SequenceBatch.from_rollout(_rollout([1] * 8))
    alone = micro_batches(short, torch.arange(8, device="cpu"), 21, 16, prompt_pass=True)
    assert len(alone.rows) == 1 and not alone.prompt_pass
    # The fixed-count mode: a prompt pass when there are several micro-batches.
    assert micro_batches(batch, torch.arange(8), None, 3, prompt_pass=True).prompt_pass
    assert not micro_batches(batch, torch.arange(8), None, 8, prompt_pass=True).prompt_pass


def _answer_tokens(rows: list[int]) -> int:
    return sum(COMPLETION[row] for row in rows)


def _rank_plan(rank: int, init: str, out: str) -> None:
    """One of two gloo ranks: rank 0 holds long answers, rank 1 one-token answers; the plans
    with and without a prompt pass."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        batch = SequenceBatch.from_rollout(_rollout(COMPLETION if rank == 0 else [1] * 8))
        result = {}
        for prompt_pass in (False, True):
            parts = micro_batches(batch, torch.arange(8, device="cpu"), 25, 16, prompt_pass)
            rows = [p.tolist() for p in parts.rows]
            result[str(prompt_pass)] = {"rows": rows, "prompt_pass": parts.prompt_pass}
        Path(f"{out}.{rank}").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_ranks_with_uneven_tokens_agree_on_the_micro_batch_count(tmp_path):
    """Alone, rank 1's 24 tokens fit one micro-batch; it splits finer to run as many as rank 0,
    and runs a prompt pass when rank 0 does (every forward is a collective under ZeRO-3)."""
    alone = plan([1] * 8, OWNER, PROMPT, 25)
    assert len(alone) == 1 < len(plan(COMPLETION, OWNER, PROMPT, 25))
    out = str(tmp_path / "plan")
    mp.spawn(_rank_plan, args=(str(tmp_path / "init"), out), nprocs=2)
    ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]
    for prompt_pass in (False, True):
        plans = [result[str(prompt_pass)] for result in ranks]
        prompts = [0] * len(PROMPT) if prompt_pass else PROMPT
        assert plans[0]["rows"] == plan(COMPLETION, OWNER, prompts, 25)
        assert len(plans[1]["rows"]) == len(plans[0]["rows"])
        assert plans[0]["prompt_pass"] == plans[1]["prompt_pass"] == prompt_pass
        assert sorted(row for part in plans[1]["rows"] for row in part) == list(range(8))


PRESETS = [
    ["algo=grpo"],
    ["algo=dapo"],
    ["algo=gspo"],
    ["algo=tepo"],
    ["algo=mpo", "k=3", "algo.mtp.warmup.steps=0", "algo.mtp.aux_coef=0.1"],
    ["algo=mpo_exact", "k=3"],
    ["algo=grpo", "advantage=gae"],
    ["algo=kl_cov", "algo.cov_fraction=0.25"],  # one pick per optimizer step, not per micro-batch
    ["algo=clip_cov", "algo.cov_fraction=0.25", "algo.cov_lb=-100"],
    ["algo=cispo"],
    ["algo=sapo"],
    ["algo=gmpo"],
    ["algo=dapo", "algo.top_entropy_quantile=0.3"],  # one pick per optimizer step, as KL-Cov's
]


# One update of `_rollout()` in two minibatches, Adam's step linear in the gradients (eps far above
# them), no clipping, no KL: two such updates are equal exactly when their gradients are.
UPDATE_OVERRIDES = [
    "model=tiny",
    "rollout.n=4",
    "trainer.prompts_per_step=2",
    "trainer.minibatches=2",
    "trainer.lr=1.0",
    "trainer.adam_eps=1000",
    "trainer.grad_clip=0",
    "algo.beta=0",
]
UPDATE_REWARDS = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0], dtype=torch.float64)


def _one_update(cfg, lm, rewards):
    """One update of a float64 copy of `lm` under `cfg`: (its metrics, its weights' step)."""
    torch.manual_seed(0)  # MTP modules and the value head start from the same draw
    policy = build_policy(cfg, copy.deepcopy(lm)).double()
    topo = setup_topology(num_threads=None)
    try:
        critic = build_critic(cfg, policy, topo).double() if cfg.advantage.needs_critic else None
        engine = build_engine(policy, cfg, accumulation_steps(cfg), 1)
        critic_engine = build_engine(critic, cfg, accumulation_steps(cfg), 1) if critic else None
        rollout = _rollout()
        batch = SequenceBatch.from_rollout(rollout)
        experience = exp.Experience(
            [], rollout, batch, rewards, rewards.bool(), group_advantages(rewards, 4)
        )
        if critic is not None:
            targets = critic_targets(cfg, critic, batch, rewards)
            experience.advantages, experience.old_values = targets.advantages, targets.old_values
            experience.returns = targets.returns
        exp._add_scores(cfg, engine.module, None, experience.batch, experience)
        modules = [engine.module] + ([critic_engine.module] if critic_engine else [])
        before = torch.cat([p.detach().flatten() for m in modules for p in m.parameters()])
        metrics = update(cfg, engine, experience, torch.Generator().manual_seed(0), critic_engine)
        after = torch.cat([p.detach().flatten() for m in modules for p in m.parameters()])
        return metrics, after - before
    finally:
        teardown()


def _recording(prompt_pass, passes: list[MinibatchPrompts]):
    def recorded(*args, **kwargs):
        result = prompt_pass(*args, **kwargs)
        if result.prompt_pass is not None:
            passes.append(result)
        return result

    return recorded


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: "-".join(p))
def test_token_budget_update_equals_the_fixed_count_update_in_float64(
    preset, compose_config, tiny_model, monkeypatch
):
    """Two minibatches (off-policy: old log-probs scored in micro-batches too) of 4 rows, split by
    a 12-token budget into 2-4 micro-batches of varying counts, their prompts run once per
    minibatch (a prompt pass, models/prompt_pass.py), against one micro-batch each. Adam's eps far
    above the gradients makes its step linear in them: equal weights, equal gradients."""
    common = [*UPDATE_OVERRIDES, *preset]
    rewards = UPDATE_REWARDS
    fixed_cfg = load_train_config(
        compose_config("train", [*common, "trainer.micro_batch_tokens=null"])
    )
    token_cfg = load_train_config(
        compose_config("train", [*common, "trainer.micro_batch_tokens=12"])
    )
    fixed, fixed_step = _one_update(fixed_cfg, tiny_model, rewards)
    passes: list[
        MinibatchPrompts
    ] = []  # the token-budget update's: its prompts run once a minibatch
    with monkeypatch.context() as patch:
        patch.setattr(update_module, "_prompt_pass", _recording(update_module._prompt_pass, passes))
        tokens, token_step = _one_update(token_cfg, tiny_model, rewards)
    critic = "advantage=gae" in preset
    assert len(passes) == 2 * (1 + critic)  # two minibatches, the policy's and the critic's
    assert fixed.keys() == tokens.keys()
    cov = ("cov_selected", "cov_selected_mean", "cov_candidates", "entropy_kept_frac")
    losses = ("loss", "pg_loss", "kl_loss", "cov_loss", "value_loss", "mtp_aux_loss")
    for key in (*losses, "clip_frac", "entropy", *cov):
        if key in fixed:
            assert tokens[key] == pytest.approx(fixed[key], rel=1e-6, abs=1e-12), key
    # The update's float64 floor: transformers' RMSNorm rounds to float32 even in a float64 model,
    # so splitting rows differently moves the step by ~1e-7 of its norm (the fixed-count path
    # split 8 rows vs 2 does the same); a wrong normaliser or a lost micro-batch moves it by O(1).
    assert fixed_step.norm() > 0
    assert float((token_step - fixed_step).norm() / fixed_step.norm()) < 1e-5
    assert fixed["grad_norm"] > 0
    assert tokens["grad_norm"] == pytest.approx(fixed["grad_norm"], rel=1e-6)
