"""`reuse:` in protocol.yaml: an arm whose runs another protocol trained and published. They are
used only where both protocols pin the same commit and make each run with the same overrides;
the runner never trains them, `--status` reads them where they are published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_protocol_run import SMOKE, journal, protocol_file, tepo_protocol

from tepo_cli.core.errors import ConfigError
from tepo_cli.protocol.reuse import reused_runs
from tepo_cli.protocol.spec import load_protocol

COMMIT = "f508ba4471b9"


def write(path: Path, **fields: object) -> Path:
    """A protocol like tests/test_protocol_run.py's (arms grpo and tepo, seed 0) at `path`."""
    made = protocol_file(path.parent.parent, **fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    made.rename(path)
    return path


def follow_up(tmp_path: Path, source_fields: dict | None = None, **fields: object) -> Path:
    """claims/protocol.yaml (grpo, tepo) and, reusing its grpo arm, gspo/protocol.yaml
    (grpo, gspo): the layout of docs/results/claims100 and claims100_gspo."""
    write(tmp_path / "claims" / "protocol.yaml", **{"commit": COMMIT, **(source_fields or {})})
    arms = {"grpo": ["algo=grpo"], "gspo": ["algo=gspo"]}
    primary = {"name": "final", "metric": "eval_final", "treatment": "gspo", "control": "grpo",
               "direction": "greater", "test": "welch"}  # fmt: skip
    values = {"name": "gspo", "arms": arms, "primaries": [primary], "commit": COMMIT,
              "reuse": {"grpo": "../claims/protocol.yaml"}, **fields}  # fmt: skip
    values = {key: value for key, value in values.items() if value is not None}
    return write(tmp_path / "gspo" / "protocol.yaml", **values)


def published_run(folder: Path, steps: int = 2) -> None:
    folder.mkdir(parents=True)
    lines = [json.dumps({"step": s, "reward_mean": 0.75, "step_seconds": 9.0}) for s in range(1, 3)]
    (folder / "metrics.jsonl").write_text("\n".join(lines[:steps]) + "\n")
    (folder / "status.json").write_text(json.dumps({"state": "finished", "pid": 1}))


def test_a_reused_arm_reads_its_runs_where_their_protocol_publishes_them(tmp_path):
    path = follow_up(tmp_path, seeds=[0], source_fields={"seeds": [0, 1]})
    assert reused_runs(load_protocol(path), path) == {
        "grpo_seed0": tmp_path / "claims/runs/grpo_seed0"
    }


def test_a_chain_of_reuses_leads_to_the_protocol_that_trained_the_runs(tmp_path):
    follow_up(tmp_path)
    third = write(
        tmp_path / "third" / "protocol.yaml",
        commit=COMMIT,
        reuse={"grpo": "../gspo/protocol.yaml"},
    )
    assert reused_runs(load_protocol(third), third) == {
        "grpo_seed0": tmp_path / "claims" / "runs" / "grpo_seed0"
    }


@pytest.mark.parametrize(
    ("source_fields", "fields", "said"),
    [
        ({"base": [*SMOKE, "trainer.minibatches=4"]}, {},
         "only here: nothing; only there: trainer.minibatches=4"),
        ({"arms": {"grpo": ["algo=grpo", "k=2"], "tepo": ["algo=tepo"]}}, {},
         "only there: k=2"),
        ({"first_run_only": []}, {}, "only here: trainer.eval_before=true"),
        ({"commit": "0123456789ab"}, {}, "pins commit f508ba4471b9 and that one 0123456789ab"),
        ({}, {"commit": None}, "pins commit (none) and that one f508ba4471b9"),
        ({}, {"seeds": [0, 7]}, "seed 7 is not one of its seeds (0)"),
        ({"arms": {"dapo": ["algo=dapo"], "tepo": ["algo=tepo"]},
          "primaries": [{"name": "final", "metric": "eval_final", "treatment": "tepo",
                         "control": "dapo", "direction": "greater", "test": "welch"}]}, {},
         "that protocol has no arm 'grpo' (its arms: dapo, tepo)"),
        ({}, {"reuse": {"grpo": "../nowhere/protocol.yaml"}}, "Cannot read the protocol file"),
    ],
)  # fmt: skip
def test_runs_the_source_would_not_have_made_the_same_are_refused(
    tmp_path, source_fields, fields, said
):
    path = follow_up(tmp_path, source_fields, **fields)
    with pytest.raises(ConfigError) as error:
        reused_runs(load_protocol(path), path)
    message = str(error.value)
    assert message.startswith(f"{path}: reuse.grpo=") and said in message, message
    assert message.endswith("Nothing was run.")


def test_a_reuse_that_leads_back_to_itself_is_refused(tmp_path):
    path = follow_up(tmp_path, source_fields={"reuse": {"grpo": "../gspo/protocol.yaml"}})
    with pytest.raises(ConfigError, match="which reuses from it in turn"):
        reused_runs(load_protocol(path), path)


@pytest.mark.parametrize(
    ("reuse", "said"),
    [
        ({"dapo": "../claims/protocol.yaml"}, "reuse.dapo: arm 'dapo' is not one of the arms"),
        ({"grpo": "a.yaml", "gspo": "b.yaml"}, "every arm is reused, so nothing would train here"),
    ],
)
def test_a_reuse_of_no_arm_or_of_every_arm_is_refused_when_the_file_is_read(tmp_path, reuse, said):
    path = follow_up(tmp_path, reuse=reuse)
    with pytest.raises(ConfigError, match=said):
        load_protocol(path)


def test_list_and_status_name_the_reused_runs_and_nothing_trains_them(tmp_path):
    path = follow_up(tmp_path, seeds=[0, 1], source_fields={"seeds": [0, 1]})
    source_runs = tmp_path / "claims" / "runs"
    published_run(source_runs / "grpo_seed0")
    listed = tepo_protocol(tmp_path, str(path), "--list", timeout=60)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].endswith(f"trainer.eval_before=true  # reused: {source_runs}, not trained here")
    assert lines[1].endswith("algo=gspo seed=0 trainer.eval_before=false")
    status = tepo_protocol(tmp_path, str(path), "--status", "--runs-dir", "ckpts", timeout=60)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines() == [
        f"grpo_seed0: reused, published in {source_runs / 'grpo_seed0'} (2 steps)",
        "gspo_seed0: not started",
        f"grpo_seed1: reused from {source_runs}, not published there yet (it trains under its "
        "own protocol)",
        "gspo_seed1: not started",
        "1 of 4 runs published; about 1 min of training steps left (2 not started at the median "
        "of the 1 published), evaluations aside",
    ]
    only_reused = tepo_protocol(tmp_path, str(path), "--only", "^grpo_", timeout=60)
    assert only_reused.returncode == 2
    assert "are all reused from another protocol" in only_reused.stderr
    assert not (tmp_path / "multirun").exists() and not (path.parent / "runs").exists()


@pytest.mark.slow
def test_the_runner_trains_only_its_own_arm_and_says_which_reused_runs_it_waits_for(tmp_path):
    path = follow_up(tmp_path, seeds=[0], commit=None, source_fields={"commit": None})
    result = tepo_protocol(tmp_path, str(path), "--runs-dir", str(tmp_path / "ckpts"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert [p.name for p in (path.parent / "runs").iterdir() if p.is_dir()] == ["gspo_seed0"]
    assert not (tmp_path / "ckpts" / "grpo_seed0").exists()
    assert [(e["run"], e["event"]) for e in journal(path.parent / "runs")] == [
        ("gspo_seed0", "start"),
        ("gspo_seed0", "finish"),
    ]
    assert result.stdout.splitlines()[-1] == (
        "== reused runs that their own protocol has not published yet: grpo_seed0 (in "
        f"{tmp_path / 'claims/runs'}); the report waits for them"
    )
    overrides = yaml.safe_load((path.parent / "runs/gspo_seed0/.hydra/overrides.yaml").read_text())
    assert "algo=gspo" in overrides and "algo=grpo" not in overrides
