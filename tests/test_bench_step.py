"""scripts/bench_step.py's table and ratio functions (pure; no TRL, no model, no training)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from benchstep import report
from benchstep.job import ISSUE_PROMPT, Job


def _tepo_run(seconds: list[float], rss: int, accuracy: float) -> dict:
    metrics = [
        {
            "step": i + 1,
            "step_seconds": s,
            "rollout_seconds": 0.3 * s,
            "reward_seconds": 0.01,
            "score_seconds": 0.0,
            "update_seconds": 0.6 * s,
            "reward_mean": 0.5,
        }
        for i, s in enumerate(seconds)
    ]
    probes = [{"fwd_bwd_seconds": 0.5 * s, "backward_seconds": 0.3 * s} for s in seconds]
    steps = report.tepo_steps(metrics, probes)
    return {"steps": steps, "peak_rss_bytes": rss, "wall_seconds": 60.0, "accuracy_after": accuracy}


def _trl_run(seconds: list[float], rss: int, accuracy: float) -> dict:
    timings = [
        {
            "step": i + 1,
            "step_seconds": s,
            "generation_seconds": 0.25 * s,
            "scoring_seconds": 0.05 * s,
            "forward_seconds": 0.25 * s,
            "backward_seconds": 0.4 * s,
            "optimizer_seconds": 0.05 * s,
            "reward_mean": 0.25,
        }
        for i, s in enumerate(seconds)
    ]
    steps = report.trl_steps(timings)
    return {"steps": steps, "peak_rss_bytes": rss, "wall_seconds": 90.0, "accuracy_after": accuracy}


def test_tepo_steps_split_the_update_with_the_probes():
    (step,) = _tepo_run([10.0], 1, 0.5)["steps"]
    assert step["generation"] == pytest.approx(3.0)
    assert step["scoring"] == pytest.approx(0.01)
    assert step["forward"] == pytest.approx(2.0)
    assert step["backward"] == pytest.approx(3.0)
    assert step["fwd_bwd"] == pytest.approx(5.0)
    assert step["optimizer"] == pytest.approx(1.0)  # update − forward − backward
    assert step["other"] == pytest.approx(10.0 - 3.0 - 0.01 - 5.0 - 1.0)


def test_tepo_metrics_win_over_probes_and_missing_probes_leave_gaps():
    metrics = [
        {
            "step": 1,
            "step_seconds": 4.0,
            "rollout_seconds": 1.0,
            "update_seconds": 3.0,
            "forward_seconds": 1.0,
            "backward_seconds": 1.5,
            "optimizer_seconds": 0.25,
        }
    ]
    (step,) = report.tepo_steps(metrics, [{"fwd_bwd_seconds": 9.0, "backward_seconds": 9.0}])
    assert (step["forward"], step["backward"], step["optimizer"]) == (1.0, 1.5, 0.25)
    (bare,) = report.tepo_steps([{k: metrics[0][k] for k in ("step", "step_seconds")}], [])
    assert bare["forward"] is None and bare["optimizer"] is None and bare["other"] is None


def test_summary_skips_the_first_step_and_pools_rounds():
    runs = [_tepo_run([100.0, 2.0, 4.0], 10, 0.5), _tepo_run([50.0, 6.0, 8.0], 30, 0.7)]
    summary = report.summarize(runs)
    assert summary["timed_steps"] == 4
    assert summary["median_s"] == pytest.approx(5.0)
    assert (summary["min_s"], summary["max_s"]) == (2.0, 8.0)
    assert summary["steps_per_s"] == pytest.approx(0.2)
    assert summary["peak_rss_bytes"] == 30
    assert summary["accuracy_after"] == pytest.approx(0.6)
    assert summary["reward_per_step"] == [0.5, 0.5, 0.5]


def test_ratios_are_tepo_over_trl_and_accuracy_is_in_points():
    tepo = report.summarize([_tepo_run([9.0, 2.0, 2.0], 2_000_000_000, 0.95)])
    trl = report.summarize([_trl_run([9.0, 5.0, 5.0], 5_000_000_000, 0.97)])
    r = report.ratios(tepo, trl)
    assert r["median_s"] == pytest.approx(0.4)
    assert r["steps_per_s"] == pytest.approx(2.5)
    assert r["peak_rss"] == pytest.approx(0.4)
    assert r["accuracy_points"] == pytest.approx(-2.0)
    assert [met for _, _, met in report.targets(r)] == [True, True, True]
    slow = report.ratios(trl, tepo)
    assert [met for _, _, met in report.targets(slow)] == [False, False, True]


def test_markdown_table_has_every_row_and_handles_a_missing_side():
    job = Job(model="/m", steps=3, eval_size=20)
    job_dict = {**job.__dict__, "sequences_per_step": job.batch}
    tepo = report.summarize([_tepo_run([9.0, 2.0, 2.0], 2_000_000_000, 0.95)])
    trl = report.summarize([_trl_run([9.0, 5.0, 5.0], 5_000_000_000, 0.97)])
    table = report.markdown(job_dict, tepo, trl, 0.8, {"trl": "1.16.0"})
    for text in (
        "median s/step (steps 2–3)",
        "steps/s",
        "peak RSS",
        "2.50×",
        "0.40×",
        "generation",
    ):
        assert text in table
    assert "0.80 → 0.95" in table and "-2.0 points" in table
    alone = report.markdown(job_dict, tepo, report.summarize([]), None, {})
    assert "| median s/step (steps 2–3) | 2.00 | — | — |" in alone
    assert "not measured" in alone


def test_job_overrides_encode_the_issue_job():
    overrides = Job(model="/m").tepo_overrides()
    for expected in (
        "algo.beta=0",
        "rollout.n=8",
        "trainer.prompts_per_step=2",
        "rollout.max_new_tokens=16",
        "rollout.temperature=0.7",
        "trainer.lr=1e-05",
        "trainer.lr_schedule=constant",
        "trainer.grad_clip=1.0",
        "trainer.ppo_epochs=1",
        "benchmark.operations=['+']",
        "benchmark.digits=1",
        "trainer.max_steps=30",
    ):
        assert expected in overrides
    assert ISSUE_PROMPT == "What is {question}? Answer with just the number."


def test_job_overrides_compose_to_tepo_config(compose_config):
    """The overrides are valid `tepo train` keys and keep tepo's prompt equal to the issue's."""
    from tepo_cli.config.validate import load_train_config

    config = load_train_config(compose_config("train", Job(model="/m").tepo_overrides()))
    assert config.benchmark.prompt == ISSUE_PROMPT
    assert config.algo.beta == 0.0 and config.algo.loss_agg == "seq-mean-token-mean"
    assert config.trainer.micro_batch_size == 16 and config.rollout.batch_size == 16
