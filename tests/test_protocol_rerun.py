"""`tepo protocol run --rerun RUN`: a published run trained again from its own overrides for its
first steps, compared record by record, saying which keys differ and never a value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from test_protocol_run import journal, protocol_file, tepo_protocol

from tepo_cli.protocol.rerun import Agreement, compare
from tepo_cli.protocol.spec import Run


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_records_are_compared_up_to_the_step_with_times_aside(tmp_path):
    warmup = {"mtp_warmup_step": 0, "mtp_warmup_loss": 2.5, "mtp_warmup_seconds": 3.0}
    steps = [{"step": s, "loss": 0.1 * s, "step_seconds": 9.0 + s, "peak_rss_mb": 100 + s}
             for s in (1, 2, 3)]  # fmt: skip
    write_jsonl(tmp_path / "a/metrics.jsonl", [warmup, *steps])
    rerun = [{**warmup, "mtp_warmup_seconds": 7.0}, *[{**r, "step_seconds": 1.0} for r in steps]]
    rerun[2] = {**rerun[2], "loss": 0.25, "kl": 0.0}  # step 2 differs in loss and a new key
    write_jsonl(tmp_path / "b/metrics.jsonl", rerun[:3])  # killed after step 2
    answers = [{"step": s, "completion": f"{s}{i}"} for s in (1, 2, 3) for i in range(2)]
    write_jsonl(tmp_path / "a/samples.jsonl", answers)
    write_jsonl(tmp_path / "b/samples.jsonl", answers[:4])
    write_jsonl(tmp_path / "a/eval.jsonl", [{"step": 0, "accuracy": 0.5, "seconds": 3.0}])
    write_jsonl(tmp_path / "b/eval.jsonl", [{"step": 0, "accuracy": 0.5, "seconds": 9.0}])
    found = compare(tmp_path / "a", tmp_path / "b", 2)
    assert found == {  # the key only the rerun logs is named, not counted as a difference
        "metrics.jsonl": Agreement(3, 2, 4, ("loss",), (), ("kl",)),
        "samples.jsonl": Agreement(4, 4, 2, (), (), ()),
        "eval.jsonl": Agreement(1, 1, 2, (), (), ()),
        "eval_samples.jsonl": Agreement(0, 0, 0, (), (), ()),
    }


def test_the_overrides_are_the_published_ones_less_resume_with_a_note_where_not_registered(
    tmp_path, capsys
):
    from tepo_cli.protocol.rerun import _published_overrides

    published = tmp_path / "grpo_seed0"
    (published / ".hydra").mkdir(parents=True)
    made = ["algo=grpo", "seed=0", "k=2", "resume=true"]
    (published / ".hydra/overrides.yaml").write_text(yaml.safe_dump(made))
    run = Run("grpo_seed0", ["algo=grpo", "seed=0", "trainer.max_steps=9"])
    assert _published_overrides(run, published) == [
        "algo=grpo",
        "seed=0",
        "k=2",
        "trainer.progress=false",
    ]
    assert capsys.readouterr().out == (
        "== note: grpo_seed0 was made with overrides the protocol does not give it (only made: "
        "k=2; only registered: trainer.max_steps=9); the rerun uses what it was made with\n"
    )


def test_a_run_that_is_not_registered_or_not_published_is_refused(tmp_path):
    path = protocol_file(tmp_path)
    for name, said in (
        ("mpo_seed0", "--rerun 'mpo_seed0' is not one of the protocol's runs (grpo_seed0, tepo_seed0)"),
        ("tepo_seed0", f"--rerun tepo_seed0: it is not published in {path.parent / 'runs'}"),
    ):  # fmt: skip
        result = tepo_protocol(tmp_path, str(path), "--rerun", name, timeout=60)
        assert result.returncode == 2 and said in result.stderr, result.stderr
    assert not (tmp_path / "multirun").exists()


@pytest.mark.slow
def test_a_published_run_reruns_equal_and_a_changed_record_is_named_by_its_key(tmp_path):
    path = protocol_file(tmp_path)
    runs = str(tmp_path / "ckpts")
    trained = tepo_protocol(tmp_path, str(path), "--only", "^grpo_", "--runs-dir", runs)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr
    published = path.parent / "runs" / "grpo_seed0"

    again = tepo_protocol(tmp_path, str(path), "--rerun", "grpo_seed0", "--rerun-steps", "2",
                          "--runs-dir", runs)  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    said = again.stdout.splitlines()[-1]
    assert said.startswith("grpo_seed0, rerun of steps 1–2: metrics.jsonl ")
    counts = [tuple(map(int, pair)) for pair in re.findall(r"(\d+) of (\d+)", said)]
    assert len(counts) == 4 and all(same == of > 0 for same, of in counts)  # the evaluations too
    assert not (tmp_path / "ckpts" / ".rerun" / "grpo_seed0").exists()
    assert journal(path.parent / "runs")[-1]["event"] == "rerun"
    assert journal(path.parent / "runs")[-1]["outcome"] == "every compared record equal"

    records = [json.loads(line) for line in (published / "metrics.jsonl").read_text().splitlines()]
    step_2 = next(r for r in records if r.get("step") == 2)
    step_2["reward_mean"] = 12345.0  # a value no rerun makes
    (published / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    changed = tepo_protocol(tmp_path, str(path), "--rerun", "grpo_seed0", "--rerun-steps", "2",
                            "--runs-dir", runs)  # fmt: skip
    assert changed.returncode == 1
    assert "(the first that differs: reward_mean)" in changed.stdout
    assert "12345" not in changed.stdout + changed.stderr
    assert (tmp_path / "ckpts" / ".rerun" / "grpo_seed0").is_dir()  # kept to be looked at
    assert journal(path.parent / "runs")[-1]["outcome"] == "records differed"
