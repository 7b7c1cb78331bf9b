"""How `tepo report` groups runs and names the groups: the word_math claims sweep's shape
(five presets on-policy, GRPO and TEPO off-policy, TEPO's mask settings, MPO's K), built as Run
records with the overrides each was typed with and the config values they composed to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tepo_cli.eval.report.grouping import group_runs
from tepo_cli.eval.report.runs import Run

# algo -> (algo.k, algo.kl_mask): the presets' composed values (every mask criterion: covariance)
PRESETS = {
    "grpo": (None, "none"),
    "dapo": (None, "none"),
    "mpo": (5, "none"),
    "tepo": (None, "tepo"),
}


def run(name: str, *overrides: str) -> Run:
    typed = dict(override.split("=", 1) for override in overrides)
    k, kl_mask = PRESETS[typed["algo"]]
    config: dict[str, Any] = {
        "seed": int(typed.get("seed", 0)),
        "k": int(typed["k"]) if "k" in typed else None,
        "algo.name": typed["algo"],
        "algo.k": int(typed["k"]) if "k" in typed else k,
        "algo.kl_mask": typed.get("algo.kl_mask", kl_mask),
        "algo.mask_criterion": typed.get("algo.mask_criterion", "covariance"),
        "trainer.minibatches": int(typed.get("trainer.minibatches", 1)),
    }
    typed_list = ["recipe=word_math", *overrides, "resume=true"]
    return Run(Path(name), name, "finished", config, typed_list, [], [], None)


def sweep() -> list[Run]:
    runs = [run(f"{a}_seed{s}", f"algo={a}", f"seed={s}") for s in (0, 1) for a in PRESETS]
    runs.append(run("grpo_mb4", "algo=grpo", "trainer.minibatches=4", "seed=0"))
    for criterion in ("covariance", "first_order"):
        runs.append(run(f"tepo_mb4_{criterion}", "algo=tepo", "trainer.minibatches=4",
                        f"algo.mask_criterion={criterion}", "seed=0"))  # fmt: skip
    runs.append(run("tepo_mb4_nomask", "algo=tepo", "trainer.minibatches=4", "algo.kl_mask=none"))
    runs.extend(run(f"mpo_k{k}", "algo=mpo", f"k={k}", "seed=0") for k in (2, 8))
    return runs


def test_labels_name_what_was_typed_and_only_what_tells_groups_apart():
    swept, groups = group_runs(sweep())
    assert swept == ["algo", "trainer.minibatches", "algo.mask_criterion", "algo.kl_mask", "k"]
    labels = {group.label: len(group.runs) for group in groups}
    assert labels == {
        "algo=grpo trainer.minibatches=1": 2,  # beside the off-policy GRPO group
        "algo=dapo": 2,  # its (inert) mask criterion and K are not in its name
        "algo=mpo k=5": 2,  # the shorthand it did not type: the K its preset set (algo.k)
        "algo=tepo trainer.minibatches=1": 2,
        "algo=grpo trainer.minibatches=4": 1,
        "algo=tepo trainer.minibatches=4 algo.mask_criterion=covariance algo.kl_mask=tepo": 1,
        "algo=tepo trainer.minibatches=4 algo.mask_criterion=first_order": 1,
        "algo=tepo trainer.minibatches=4 algo.kl_mask=none": 1,
        "algo=mpo k=2": 1,
        "algo=mpo k=8": 1,
    }
    dapo = next(group for group in groups if group.label == "algo=dapo")
    assert dapo.values == {  # every swept value is kept, for the CSV and --reference
        "algo": "dapo",
        "trainer.minibatches": "1",
        "algo.mask_criterion": "covariance",
        "algo.kl_mask": "none",
        "k": "null",
    }


def test_a_group_that_typed_nothing_is_named_by_its_values():
    runs = [run("default", "algo=grpo"), run("tepo", "algo=tepo")]
    runs[0].overrides = ["recipe=word_math", "seed=0"]  # no algo typed: GRPO by default
    swept, groups = group_runs(runs)
    assert swept == ["algo"]
    assert [group.label for group in groups] == ["algo=grpo", "algo=tepo"]


def test_one_setting_is_all_runs():
    _, groups = group_runs([run("a", "algo=grpo", "seed=0"), run("b", "algo=grpo", "seed=1")])
    assert [(group.label, len(group.runs)) for group in groups] == [("all runs", 2)]


def test_what_a_run_records_but_does_not_train_never_splits_a_group():
    """A pre-registered protocol evaluates step 0 in its first run only (trainer.eval_before),
    and runs differ in checkpointing, console settings and time limits: the arms stay one group
    each."""
    runs = [
        run("grpo_seed10", "algo=grpo", "seed=10", "trainer.eval_before=true"),
        run("grpo_seed11", "algo=grpo", "seed=11", "trainer.eval_before=false"),
        run(
            "grpo_seed12", "algo=grpo", "seed=12", "trainer.save_every=5", "trainer.progress=false"
        ),
        run("tepo_seed10", "algo=tepo", "seed=10", "trainer.eval_before=false"),
        run("tepo_seed11", "algo=tepo", "seed=11", "trainer.save_final=true"),
        # each started with what its allocation had left (tepo protocol run --time-limit)
        run("tepo_seed12", "algo=tepo", "seed=12", "trainer.time_limit_minutes=212.5"),
    ]
    swept, groups = group_runs(runs)
    assert swept == ["algo"]
    assert {group.label: len(group.runs) for group in groups} == {"algo=grpo": 3, "algo=tepo": 3}
    # a key that changes what is measured still splits
    swept, groups = group_runs([*runs, run("grpo_eval", "algo=grpo", "benchmark.eval_size=50")])
    assert "benchmark.eval_size" in swept and len(groups) == 3
