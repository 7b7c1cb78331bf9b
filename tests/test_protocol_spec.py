"""protocol.yaml's loader: the documented example loads, every kind of mistake is refused with one
paragraph naming the file and the key, and `runs()` lists the runs in the order they train."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tepo_cli.core.errors import ConfigError
from tepo_cli.protocol.spec import load_protocol

EXAMPLE = """\
name: claims100
description: TEPO against GRPO over 100 steps on word_math
commit: null
base: [recipe=word_math, trainer.max_steps=100]
arms:
  grpo: [algo=grpo]
  tepo: [algo=tepo]
seeds: [10, 11, 12, 13, 14]
order: interleaved
first_run_only: [trainer.eval_before=true]
other_runs: [trainer.eval_before=false]
alpha: 0.05
correction: holm
primaries:
  - {name: convergence, metric: eval_auc, treatment: tepo, control: grpo, direction: greater, test: welch}
  - name: entropy
    metric: entropy_change
    params: {first: [1, 10], last: [91, 100]}
    treatment: tepo
    control: grpo
    direction: greater
    test: welch
    gate: {arm: grpo, seeds: [10, 11], metric: entropy_relative_change,
           params: {first: [1, 10], last: [91, 100]}, at_most: -0.20}
secondaries: []
"""


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "protocol.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_the_example_loads_with_every_field(tmp_path):
    protocol = load_protocol(write(tmp_path, EXAMPLE))
    assert protocol.name == "claims100" and protocol.commit is None
    assert protocol.arms == {"grpo": ["algo=grpo"], "tepo": ["algo=tepo"]}
    assert protocol.seeds == [10, 11, 12, 13, 14]
    assert protocol.alpha == 0.05 and protocol.correction == "holm"
    entropy = protocol.primaries[1]
    assert entropy.params == {"first": [1, 10], "last": [91, 100]}
    assert entropy.direction == "greater" and entropy.test == "welch"
    assert entropy.gate is not None and entropy.gate.at_most == -0.20
    assert entropy.gate.seeds == [10, 11] and entropy.gate.at_least is None
    assert protocol.primaries[0].gate is None and protocol.secondaries == []
    assert protocol.metric_names() == ["eval_auc", "entropy_change", "entropy_relative_change"]


def test_interleaved_runs_seed_outer_with_the_first_run_alone_evaluating_step_0(tmp_path):
    runs = load_protocol(write(tmp_path, EXAMPLE)).runs()
    assert len(runs) == 10
    assert [run.name for run in runs[:4]] == [
        "grpo_seed10",
        "tepo_seed10",
        "grpo_seed11",
        "tepo_seed11",
    ]
    name, overrides = runs[0]
    assert name == "grpo_seed10"
    assert overrides == [
        "recipe=word_math",
        "trainer.max_steps=100",
        "algo=grpo",
        "seed=10",
        "trainer.eval_before=true",
    ]
    assert runs[1].overrides == [
        "recipe=word_math",
        "trainer.max_steps=100",
        "algo=tepo",
        "seed=10",
        "trainer.eval_before=false",
    ]
    assert sum("trainer.eval_before=true" in run.overrides for run in runs) == 1
    assert runs[-1] == (
        "tepo_seed14",
        [
            "recipe=word_math",
            "trainer.max_steps=100",
            "algo=tepo",
            "seed=14",
            "trainer.eval_before=false",
        ],
    )


def test_arm_major_runs_one_arm_after_the_other(tmp_path):
    data = yaml.safe_load(EXAMPLE)
    data.update(order="arm_major", seeds=[3, 1], first_run_only=[], other_runs=[])
    data["primaries"][1]["gate"]["seeds"] = [1]
    runs = load_protocol(write(tmp_path, data)).runs()
    assert runs == [
        ("grpo_seed3", ["recipe=word_math", "trainer.max_steps=100", "algo=grpo", "seed=3"]),
        ("grpo_seed1", ["recipe=word_math", "trainer.max_steps=100", "algo=grpo", "seed=1"]),
        ("tepo_seed3", ["recipe=word_math", "trainer.max_steps=100", "algo=tepo", "seed=3"]),
        ("tepo_seed1", ["recipe=word_math", "trainer.max_steps=100", "algo=tepo", "seed=1"]),
    ]


def _set(path: str, value: Any):
    """A change to the example: `value` at a dotted path (list indices as numbers); `...` deletes."""

    def change(data: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = data
        for part in parents:
            node = node[part]
        if value is ...:
            del node[last]
        else:
            node[last] = value

    return change


BAD = [
    (_set("colour", "red"), ["unknown key 'colour' at the top level", "primaries"]),
    (_set("primaries.0.colour", 1), ["unknown key 'primaries[0].colour'", "treatment"]),
    (_set("primaries.1.gate.below", 1), ["unknown key 'primaries[1].gate.below'", "at_most"]),
    (_set("arms", ...), ["'arms' is required"]),
    (_set("arms.Grpo", ["algo=grpo"]), ["arms", "'Grpo'", "[a-z0-9_]+"]),
    (_set("primaries.0.treatment", "dapo"), ["primaries[0].treatment", "'dapo'", "grpo, tepo"]),
    (_set("primaries.0.control", "tepo"), ["primaries[0]", "same arm"]),
    (_set("primaries.1.gate.arm", "mpo"), ["primaries[1].gate.arm", "'mpo'"]),
    (_set("primaries.1.gate.seeds", [10, 99]), ["primaries[1].gate.seeds", "[99]"]),
    (_set("primaries.1.gate.at_most", ...), ["primaries[1].gate", "at_most", "at_least"]),
    (_set("seeds", [1, 2, 1]), ["seeds repeat: [1]"]),
    (_set("seeds", [True, 2]), ["seeds[0]=True", "integer"]),
    (_set("seeds", []), ["seeds=[]"]),
    (_set("alpha", 1.0), ["alpha=1.0", "less than 1"]),
    (_set("alpha", 0), ["alpha=0", "greater than 0"]),
    (_set("correction", "fdr"), ["correction='fdr'", "'holm', 'bonferroni' or 'none'"]),
    (_set("order", "random"), ["order='random'", "'interleaved' or 'arm_major'"]),
    (_set("primaries.0.direction", "up"), ["primaries[0].direction='up'", "'two-sided'"]),
    (_set("primaries.0.test", "ttest"), ["primaries[0].test='ttest'", "'mcnemar'"]),
    (_set("primaries.0.metric", 3), ["primaries[0].metric=3", "string"]),
    (
        _set("secondaries", [{"name": "entropy"}]),
        ["(5 problems)", "'secondaries[0].metric' is required"],
    ),
    (_set("primaries", []), ["primaries=[]"]),
    (_set("commit", "HEAD"), ["commit='HEAD'", "git rev-parse HEAD"]),
    (_set("arms.grpo", ["algo=grpo", "seed=3"]), ["arms.grpo", "'seed=3'", "under 'seeds'"]),
    (_set("base", ["hydra.run.dir=/tmp/x"]), ["base", "hydra.run.dir"]),
    (_set("other_runs", ["eval_before"]), ["other_runs", "'eval_before'", "key=value"]),
]


@pytest.mark.parametrize(("change", "expected"), BAD)
def test_a_bad_protocol_is_refused_naming_the_file_and_the_key(tmp_path, change, expected):
    data = copy.deepcopy(yaml.safe_load(EXAMPLE))
    change(data)
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_protocol(path)
    message = str(caught.value)
    assert message.startswith(f"Invalid protocol file {path}")
    assert message.endswith("Nothing was run.") and "\n" not in message
    for part in expected:
        assert part in message


def test_a_file_that_is_missing_not_yaml_or_not_a_mapping_is_refused(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError, match=r"Cannot read the protocol file .*nowhere.yaml"):
        load_protocol(missing)
    broken = write(tmp_path, "name: x\narms: {grpo: [algo=grpo]\n")
    with pytest.raises(ConfigError, match=r"protocol.yaml is not valid YAML at line 3"):
        load_protocol(broken)
    listed = write(tmp_path, "- grpo\n- tepo\n")
    with pytest.raises(ConfigError, match=r"must be a mapping of keys .* not list"):
        load_protocol(listed)


def test_the_protocols_guides_example_is_the_example_and_loads(tmp_path):
    """The guide's protocol is this file's EXAMPLE with comments: a schema change shows there."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "protocols.md").read_text()
    block = guide.split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = load_protocol(write(tmp_path, block))
    assert documented == load_protocol(write(tmp_path, EXAMPLE))
