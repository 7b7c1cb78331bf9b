"""scripts/word_math_claims.sh (the word_math comparison's driver) on the tiny model: each run's
records are published without weights, the report compares against GRPO, a second invocation
skips the finished runs instead of training them again, and a reproduction from a clone (whose
docs/results/word_math/runs holds every run already) trains into a fresh folder by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEPO = Path(sys.executable).parent / "tepo"
SCRIPT = ROOT / "scripts" / "word_math_claims.sh"


def run_claims(cwd: Path, *folders: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the script from cwd (a clone's root) with RUNS_DIR and RESULTS_DIR, or with none:
    then its defaults, relative to cwd."""
    result = subprocess.run(
        ["bash", str(SCRIPT), *map(str, folders)],
        cwd=cwd,
        env={**os.environ, "TEPO": str(TEPO), **env},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_the_list_names_every_run_of_the_comparison(tmp_path):
    listed = run_claims(
        tmp_path, tmp_path / "runs", tmp_path / "results", LIST="1"
    ).stdout.splitlines()
    names = [line.split(":")[0] for line in listed]
    assert len(names) == 23 and len(set(names)) == 23
    assert names[:5] == [f"{a}_seed0" for a in ("grpo", "dapo", "gspo", "tepo", "mpo")]
    assert "tepo_mb4_first_order_seed0: recipe=word_math algo=tepo trainer.minibatches=4 " in (
        "\n".join(listed)
    )
    assert {f"mpo_k{k}_seed0" for k in (2, 4, 8)} <= set(names)
    assert "gspo_mb4_seed0: recipe=word_math algo=gspo trainer.minibatches=4 seed=0" in listed
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_smoke_publishes_records_reports_and_skips_finished_runs(tmp_path):
    # A clone: the committed records of a finished run where the default used to publish.
    committed = tmp_path / "docs" / "results" / "word_math" / "runs" / "grpo_seed0"
    committed.mkdir(parents=True)
    record = ROOT / "docs" / "results" / "word_math" / "runs" / "grpo_seed0" / "status.json"
    (committed / "status.json").write_bytes(record.read_bytes())
    runs = tmp_path / "multirun" / "word_math"
    results = tmp_path / "multirun" / "word_math_results"
    first = run_claims(tmp_path, SMOKE="1")  # the defaults, as the results page says
    assert "finished and published already" not in first.stdout
    assert f"report go to {results.relative_to(tmp_path)}" in first.stdout
    assert [p.name for p in committed.parent.iterdir()] == ["grpo_seed0"]
    assert (committed / "status.json").read_bytes() == record.read_bytes()
    for name in ("grpo_seed0", "tepo_mb4_nomask_seed0"):
        published = results / name
        assert json.loads((published / "status.json").read_text())["state"] == "finished"
        assert len((published / "metrics.jsonl").read_text().splitlines()) == 2
        overrides = (published / ".hydra" / "overrides.yaml").read_text()
        assert "recipe=word_math" in overrides and "resume=true" in overrides
        console = (published / "console.log").read_text()
        assert "held-out accuracy" in console
        # each evaluation's graded answers travel with the accuracy they add up to
        evaluations = [json.loads(line) for line in (published / "eval.jsonl").open()]
        answers = [json.loads(line) for line in (published / "eval_samples.jsonl").open()]
        assert len(answers) == sum(e["problems"] for e in evaluations) > 0
        assert "no usable checkpoint" not in console  # a fresh job under resume=true: no news
        assert not (runs / name / "checkpoints").exists()
        assert not any(path.suffix == ".safetensors" for path in published.rglob("*"))
    report = (results / "report.md").read_text()
    assert "## Against the reference" in report
    assert "| algo=tepo trainer.minibatches=4 | held-out final |" in report
    published = {
        p: p.read_bytes() for p in results.rglob("*") if p.is_file() and p.suffix != ".png"
    }
    again = run_claims(tmp_path, runs, results, SMOKE="1")
    assert again.stdout.count("finished and published already, skipped") == 2
    assert f"nothing trained: every selected run is published in {results}" in again.stdout
    # the published records stay byte for byte (Hydra would rewrite a rerun's .hydra/)
    assert all(p.read_bytes() == content for p, content in published.items())
    # a run finished but not published (killed between the two) is skipped by tepo train itself
    (results / "grpo_seed0" / "status.json").unlink()
    third = run_claims(tmp_path, runs, results, SMOKE="1")
    assert "nothing to resume, skipped" in third.stdout + third.stderr
    assert (results / "grpo_seed0" / "status.json").is_file()


@pytest.mark.parametrize("option", ["--help", "-n"])
def test_an_option_prints_the_usage_or_is_refused_and_nothing_runs(tmp_path, option):
    result = subprocess.run(
        ["bash", str(SCRIPT), option],
        cwd=tmp_path,
        env={**os.environ, "TEPO": str(TEPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if option == "--help":
        assert result.returncode == 0 and "ONLY=REGEX" in result.stdout
    else:
        assert result.returncode == 2 and "unknown option '-n'" in result.stderr
    assert list(tmp_path.iterdir()) == []
