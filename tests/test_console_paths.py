"""Lines that name a path or a command to copy stay whole on a console that is a file or a pipe
(rich folds at 80 columns there): the end of `tepo train`, `tepo eval`'s record paths and
`tepo report`'s "wrote" line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tepo_cli.eval import eval_job
from tepo_cli.runtime.finish import write_summary
from tepo_cli.runtime.metrics import RunLog


@pytest.fixture()
def deep_dir(tmp_path: Path) -> Path:
    """A sweep job's directory: well over 80 characters, with brackets rich would read as markup."""
    return tmp_path / "multirun" / "3_algo=mpo,model=tiny,seed=1,trainer.max_steps=2" / "[try 2]"


def test_the_final_model_line_is_one_line_with_the_path_as_it_is(deep_dir, capsys):
    final = deep_dir / "final"
    with RunLog(deep_dir, total_steps=1, show_progress=False) as log:
        write_summary(
            log, {"final_model": str(final), "eval_before": 0.2, "eval_after": 0.5}, deep_dir
        )
    lines = capsys.readouterr().err.splitlines()
    assert len(str(final)) > 80
    assert f"final model: {final} (score it: tepo eval model.path={final})" in lines
    assert "held-out accuracy: 0.200 -> 0.500 (+30.0 points)" in lines


def test_the_eval_table_and_record_paths_are_whole(deep_dir, capsys):
    summary = {
        "benchmark": "gsm8k", "grader": "lm-eval", "model": str(deep_dir / "final"), "problems": 2, "samples": 2,
        "accuracy": 0.5, "mean_length": 3.0, "median_length": 3.0, "samples_per_second": 1.0,
    }  # fmt: skip
    eval_job._print_table(summary, deep_dir)
    out = capsys.readouterr().out.splitlines()
    assert any(str(deep_dir / "final") in line for line in out)  # the model's cell, not cut to "…"
    assert (
        f"summary: {deep_dir / 'summary.json'}   per-sample records: {deep_dir / 'samples.jsonl'}"
        in out
    )


def test_tepo_report_says_what_it_wrote_on_one_line(deep_dir, capsys):
    from tepo_cli.eval.report import command

    run = deep_dir.parent / "runs" / "grpo_seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5, "accuracy": 0.5}\n')
    out_dir = deep_dir / "report"
    assert command.main([str(run.parent), "--out", str(out_dir), "--no-plots"]) == 0
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == 1 and str(out_dir) in wrote[0]
