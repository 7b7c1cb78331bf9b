"""MBPP trains offline (issue #54 item 3): its pinned wheel holds only the test split (task ids
11-510), so `train` is tasks 11-410 and `heldout` 411-510, both cut from the prepared test file
(data/derived_splits.py), and a training run's held-out evaluation leaves out what it trains on.

Needs the prepared MBPP files (`tepo data prepare`); prepared on first use."""

from __future__ import annotations

import json

import pytest

from tepo_cli.benchmarks import build_task, load_problems
from tepo_cli.core.errors import ConfigError
from tepo_cli.data.derived_splits import DerivedSplit, read_derived
from tepo_cli.data.prepare import prepare, prepared_file, problem_with
from tepo_cli.data.tasks import DatasetTask


@pytest.fixture(scope="module", autouse=True)
def prepared() -> None:
    if problem_with("mbpp"):
        prepare(["mbpp"])


def task_ids(split: str) -> list[int]:
    return [int(p.id.removeprefix("mbpp/")) for p in load_problems("mbpp", split)]


def test_train_and_heldout_are_disjoint_and_make_up_the_test_split():
    train, heldout, test = task_ids("train"), task_ids("heldout"), task_ids("test")
    assert (len(train), len(heldout), len(test)) == (400, 100, 500)
    assert (min(train), max(train), min(heldout), max(heldout)) == (11, 410, 411, 510)
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == sorted(test)
    with prepared_file("mbpp").open() as handle:  # the same records, nothing rewritten
        first = json.loads(handle.readline())
    assert load_problems("mbpp", "train")[0].answer == first["code"]


def test_a_training_run_holds_out_only_what_it_does_not_train_on(compose_config):
    from tepo_cli.config.validate import load_train_config

    config = load_train_config(compose_config("train", ["model=tiny", "benchmark=mbpp"]))
    task = build_task(config.benchmark)
    assert isinstance(task, DatasetTask)
    assert len(task.eval_problems()) == 500  # `tepo eval`: the whole test split
    task.check_training()
    held_out = task.eval_problems()
    assert [int(p.id.removeprefix("mbpp/")) for p in held_out] == list(range(411, 511))
    assert len(task.eval_problems(limit=7)) == 7
    data = task.describe_data()
    assert (data["train_problems"], data["eval_problems"]) == (400, 100)
    assert data["eval_trained_on_left_out"] == 400
    assert data["train_from"].endswith("test.jsonl, task_id 11-410")


def test_a_cut_that_does_not_give_its_rows_stops_with_one_paragraph():
    cut = DerivedSplit("test", "task_id", 1, 3, rows=3)
    records = [{"task_id": 1}, {"task_id": 2}, {"task_id": 9}]
    from tepo_cli.data import derived_splits

    derived_splits.DERIVED["toy"] = {"train": cut}
    try:
        with pytest.raises(ConfigError, match=r"task_id 1-3: 3 expected, 2 found"):
            read_derived("toy", "train", lambda parent: records)
        records.append({"task_id": 3})
        assert read_derived("toy", "train", lambda parent: records) == [*records[:2], records[3]]
    finally:
        del derived_splits.DERIVED["toy"]
