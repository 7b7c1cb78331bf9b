"""scripts/bench_step.py's table and ratio functions (pure; no TRL, no model, no training)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tepo_cli.core.sequences import SequenceBatch

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
            "forward_seconds": 0.2 * s,
            "backward_seconds": 0.3 * s,
            "optimizer_seconds": 0.1 * s,
            "reward_mean": 0.5,
        }
        for i, s in enumerate(seconds)
    ]
    steps = report.tepo_steps(metrics, [])
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


def test_tepo_steps_take_tepo_s_own_split_of_the_update():
    (step,) = _tepo_run([10.0], 1, 0.5)["steps"]
    assert step["generation"] == pytest.approx(3.0)
    assert step["scoring"] == pytest.approx(0.01)
    assert step["forward"] == pytest.approx(2.0)
    assert step["backward"] == pytest.approx(3.0)
    assert step["fwd_bwd"] == pytest.approx(5.0)
    assert step["optimizer"] == pytest.approx(1.0)
    assert step["update"] == pytest.approx(6.0)
    assert step["other"] == pytest.approx(10.0 - 3.0 - 0.01 - 5.0 - 1.0)


def test_a_step_without_tepo_s_split_leaves_gaps():
    (bare,) = report.tepo_steps([{"step": 1, "step_seconds": 4.0}], [])
    assert bare["forward"] is None and bare["optimizer"] is None and bare["other"] is None
    assert bare["fwd_bwd"] is None and bare["shapes"] is None


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


def a_model_dir(root: Path) -> str:
    """A directory that passes model.path's checks (a config and a weights file): these tests
    compose and validate, nothing loads it."""
    model = root / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    return str(model)


def test_job_overrides_compose_to_tepo_config(compose_config, tmp_path):
    """The overrides are valid `tepo train` keys and keep tepo's prompt equal to the issue's."""
    from tepo_cli.config.validate import load_train_config

    overrides = Job(model=a_model_dir(tmp_path)).tepo_overrides()
    config = load_train_config(compose_config("train", overrides))
    assert config.benchmark.prompt == ISSUE_PROMPT
    assert config.algo.beta == 0.0 and config.algo.loss_agg == "seq-mean-token-mean"
    assert config.trainer.micro_batch_size == 16 and config.rollout.batch_size == 16


# ------------------------------------------------------------------ --job long (issue 25)


def test_tepo_update_shapes_count_each_micro_batch_cut_to_its_longest_answer():
    from benchstep.update_shapes import fixed_plan, tepo_shapes

    answers = [5, 2, 7, 1]  # rows 0, 1 of prompt 0 (3 real tokens), rows 2, 3 of prompt 1 (4)
    plan = fixed_plan(4, 3)
    assert plan == [[0, 1, 2], [3]]
    shared = tepo_shapes(answers, [3, 4], [0, 0, 1, 1], 4, plan, shared_prompts=True)
    # [0,1,2]: prompts {0,1} x 4 columns + 3 rows x 7; [3]: prompt {1} x 4 + 1 row x 1
    assert shared.slots == 2 * 4 + 3 * 7 + 4 + 1
    assert shared.real == (3 + 4 + 5 + 2 + 7) + (4 + 1)
    assert shared.answer_tokens == 15 and shared.micro_batches == 2
    assert shared.padding_share == pytest.approx(1 - 26 / 34)
    per_row = tepo_shapes(answers, [3, 4], [0, 0, 1, 1], 4, plan, shared_prompts=False)
    assert per_row.slots == 3 * (4 + 7) + (4 + 1)
    assert per_row.real == (3 + 3 + 4) + 14 + 4 + 1
    packed = tepo_shapes(answers, [3, 4], [0, 0, 1, 1], 4, plan, shared_prompts=True, packed=True)
    assert packed.slots == packed.real == shared.real and packed.padding_share == 0.0
    # A prompt pass over the minibatch: prompts 0 and 1 once there, the micro-batches' answers.
    passed = tepo_shapes(
        answers, [3, 4], [0, 0, 1, 1], 4, plan, True, packed=True, prompt_passes=[[0, 1, 2, 3]]
    )
    assert passed.slots == passed.real == (3 + 4) + (5 + 2 + 7) + 1
    assert passed.answer_tokens == 15 and passed.micro_batches == 2


def test_padded_shapes_and_length_stats():
    from benchstep.update_shapes import length_stats, padded_shapes, update_gflops

    shapes = padded_shapes([{"slots": 100, "real": 60, "answer_tokens": 40}] * 2)
    assert (shapes.slots, shapes.real, shapes.answer_tokens) == (200, 120, 80)
    assert shapes.padding_share == pytest.approx(0.4)
    stats = length_stats([10, 512, 300, 40, 512], cap=512)
    assert stats["mean"] == pytest.approx(274.8) and stats["max"] == 512
    assert stats["p50"] == 300 and stats["p90"] == pytest.approx(512.0)
    assert stats["truncated"] == pytest.approx(0.4)
    assert length_stats([1, 2, 3, 4], 9)["p90"] == pytest.approx(3.7)  # numpy's linear rule
    assert update_gflops(135_000_000, 1000, 2.0) == pytest.approx(6 * 135e6 * 1000 / 2 / 1e9)


# A long-job probe row (benchstep.tepo_side): two answers, one micro-batch that ran.
LONG_PROBE = {
    "answer_lengths": [4, 8],
    "max_new_tokens": 8,
    "update": {"slots": 30, "real": 20, "answer_tokens": 12, "micro_batches": 1},
    "plan": "recorded",
    "params": 1000,
}


def test_long_summary_pools_steps_after_the_first_and_reports_oom():
    from benchstep import long_report

    metrics = [
        {"step": s, "step_seconds": t, "rollout_seconds": 1.0, "update_seconds": u}
        | {"update_flops": 3e9 * s}
        for s, t, u in ((1, 9.0, 5.0), (2, 4.0, 2.0), (3, 6.0, 2.0))
    ]
    probe = LONG_PROBE
    run = {"side": "tepo-hf", "status": "OOM", "peak_rss_bytes": 5, "wall_seconds": 1.0}
    run["steps"] = report.tepo_steps(metrics, [probe] * 3)
    summary = long_report.summarize(run, matmul_gflops=1e-4)
    assert summary["status"] == "OOM" and summary["steps_done"] == 3
    assert summary["timed_steps"] == [2, 3] and summary["median_s"] == pytest.approx(5.0)
    assert summary["padding_share"] == pytest.approx(1 / 3)
    assert summary["lengths"]["truncated"] == pytest.approx(0.5)
    gflops = 6 * 1000 * 24 / 4.0 / 1e9  # steps 2-3: 24 answer tokens in 4 update seconds
    assert summary["update_gflops"] == pytest.approx(gflops)
    assert summary["matmul_share"] == pytest.approx(gflops / 1e-4)
    # MFU as the step records give it: steps 2-3 need 6e9 + 9e9 FLOPs in 4 update seconds
    assert summary["update_mfu"] == pytest.approx(15e9 / 4.0 / 1e9 / 1e-4)


def test_a_step_without_an_update_counts_no_update_work():
    """A long-job step whose every advantage was 0 runs no update (trainer.skip_zero_advantage):
    the probe records no rows, its shapes are zero, and the update's median, GFLOP/s and MFU are
    over the steps that ran one (seen: 1.52 × the matmul rate when skipped steps' answers counted)."""
    from benchstep import long_report
    from benchstep.tepo_side import update_shapes

    metrics = [
        {"step": s, "step_seconds": t, "rollout_seconds": 1.0, "update_seconds": u}
        | {"update_flops": f}
        for s, t, u, f in ((1, 9.0, 5.0, 3e9), (2, 4.0, 2.0, 6e9), (3, 1.0, 0.001, 0.0))
    ]
    ran = LONG_PROBE
    none = {**ran, "update": {"slots": 0, "real": 0, "answer_tokens": 0, "micro_batches": 0}}
    run = {"side": "tepo-vllm", "status": "ok", "peak_rss_bytes": 5, "wall_seconds": 1.0}
    run["steps"] = report.tepo_steps(metrics, [ran, ran, none])
    summary = long_report.summarize(run, matmul_gflops=1e-4)
    assert summary["parts_median_s"]["update"] == pytest.approx(2.0)  # step 3 ran none
    assert summary["updates_skipped"] == 1
    assert summary["update_gflops"] == pytest.approx(6 * 1000 * 12 / 2.001 / 1e9)
    assert summary["update_mfu"] == pytest.approx(6e9 / 2.001 / 1e9 / 1e-4)
    assert "(1 steps without one)" in long_report._update_cell(summary)

    ids, mask = torch.tensor([[5, 1], [5, 2]]), torch.ones(2, 2, dtype=torch.long)
    batch = SequenceBatch(ids, mask, mask.cumsum(1) - 1, torch.tensor([[True], [True]]), 1)
    cfg = OmegaConf.create({"rollout": {"max_new_tokens": 8}, "model": {"packing": True}})
    experience = type("Experience", (), {"batch": batch})()
    shapes = update_shapes(cfg, None, experience, [], [], recording=True)
    assert shapes["update"]["slots"] == 0 and shapes["plan"] == "none: no row with a gradient"


def test_a_side_over_the_memory_limit_is_killed_and_reported(tmp_path):
    from benchlib.runner import run_watched

    # 50 MB every 20 ms: the watcher (every 50 ms) stops it within a few blocks of the limit, and
    # within 4 GB even when a loaded machine delays it by a second
    grow = (
        "import time\nblocks = []\nwhile True:\n"
        "    blocks.append(bytearray(50_000_000))\n    time.sleep(0.02)\n"
    )
    result = run_watched([sys.executable, "-c", grow], tmp_path / "log", None, 400_000_000, 0.05)
    assert result.oom and result.returncode != 0
    assert 400_000_000 < result.peak_rss_bytes < 4_000_000_000
    assert "killed at the memory limit" in (tmp_path / "log").read_text()
    fine = run_watched([sys.executable, "-c", "print(1)"], tmp_path / "ok", None, 10**10)
    assert not fine.oom and fine.returncode == 0 and fine.peak_rss_bytes > 0


def test_long_job_overrides_keep_tepo_defaults(compose_config, tmp_path):
    from benchstep.long_job import LongSettings, side_overrides, tepo_overrides

    from tepo_cli.config.validate import load_train_config

    job = Job(model=a_model_dir(tmp_path), steps=4, max_new_tokens=512, temperature=1.0)
    for rollout in ("hf", "vllm"):
        overrides = tepo_overrides(job, rollout)
        assert not any(o.startswith(("trainer.micro_batch", "model.gradient")) for o in overrides)
        config = load_train_config(compose_config("train", overrides))
        assert config.benchmark.name == "math500" and config.benchmark.train_split == "train"
        assert config.rollout.backend == rollout and config.rollout.max_new_tokens == 512
        assert config.rollout.temperature == 1.0 and config.rollout.n == 8
        assert config.algo.beta == 0.0 and config.trainer.prompts_per_step == 2
        assert config.model.dtype == "float32"
    settings = LongSettings(("tepo-vllm-bf16",), 10**10, "generate", host_allocator="glibc")
    overrides = side_overrides("tepo-vllm-bf16", job, settings)
    config = load_train_config(compose_config("train", overrides))
    assert config.model.dtype == "bfloat16" and config.rollout.backend == "vllm"
    assert config.trainer.host_allocator == "glibc"
    assert sum(o.startswith("model.dtype=") for o in overrides) == 1
    compiled = LongSettings(
        ("tepo-vllm-bf16",),
        10**10,
        "generate",
        tepo_overrides=("rollout.engine.enforce_eager=false",),
    )
    config = load_train_config(compose_config("train", side_overrides("tepo-vllm", job, compiled)))
    assert config.rollout.engine.enforce_eager is False and config.model.dtype == "float32"


def test_sigterm_to_the_benchmark_ends_the_watched_side(tmp_path):
    """`timeout` stops bench_step with SIGTERM: the side in its own session must end with it."""
    import signal
    import subprocess
    import time

    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from pathlib import Path\n"
        "from benchlib.runner import exit_on_sigterm, run_watched\n"
        "exit_on_sigterm()\n"
        "run_watched([sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); "
        "time.sleep(60)'], Path(sys.argv[2]), None, 10**10)\n"
    )
    log = tmp_path / "side.log"
    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    parent = subprocess.Popen([sys.executable, "-c", code, scripts, str(log)])
    deadline = time.monotonic() + 30
    while (
        time.monotonic() < deadline
        and len(log.read_text().splitlines() if log.exists() else []) < 2
    ):
        time.sleep(0.1)
    child = int(log.read_text().splitlines()[1])
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(0.2)
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    )


def test_a_bf16_side_trains_in_bfloat16_and_the_others_in_the_job_s_dtype(tmp_path):
    """`--sides tepo-vllm-bf16,trl,trl-bf16`: the suffix picks the precision of one side only;
    TRL's bf16 reaches its child as an argument (its own `bf16=True`)."""
    from benchstep.long_job import side_precision, trl_command

    job = Job(model="/m")
    assert side_precision("tepo-vllm-bf16", job) == ("tepo-vllm", "bfloat16")
    assert side_precision("trl-bf16", job) == ("trl", "bfloat16")
    assert side_precision("trl", job) == ("trl", "float32")
    assert trl_command(tmp_path, tmp_path / "r", "generate", "bfloat16")[-2:] == [
        "generate",
        "bfloat16",
    ]
    assert trl_command(tmp_path, tmp_path / "r")[-1] == "generate"


def _long_summary(side: str, steps_per_s: float, rss: float, mfu: float | None, status="ok"):
    return {
        "side": side,
        "status": status,
        "steps_per_s": steps_per_s,
        "peak_rss_bytes": rss,
        "update_mfu": mfu,
    }


def test_long_targets_set_each_tepo_side_against_trl_at_its_best_precision():
    from benchstep import long_report

    summaries = [
        _long_summary("tepo-vllm-bf16", 0.05, 3.5e9, 0.75),
        _long_summary("trl", 0.005, 11e9, None),
        _long_summary("trl-bf16", 0.008, 12e9, None),  # TRL's best: most steps/s
    ]
    assert long_report.best_trl(summaries)["side"] == "trl-bf16"
    rows = long_report.targets(summaries)
    assert [(what, measured, met) for what, measured, met in rows] == [
        ("tepo-vllm-bf16 peak RSS ≤ 4 GB", "3.50 GB", True),
        ("tepo-vllm-bf16 update MFU ≥ 0.7", "0.75", True),
        ("tepo-vllm-bf16 ≥ 5× trl-bf16's steps/s", "6.25×", True),
        ("tepo-vllm-bf16 peak RSS ≤ 0.3× trl-bf16's", "0.29×", True),
    ]
    # a TRL side that finished beats a faster-looking one that ran out of memory
    summaries[2] = _long_summary("trl-bf16", 0.02, 12e9, None, status="OOM")
    assert long_report.best_trl(summaries)["side"] == "trl"
    slow = long_report.targets([_long_summary("tepo-hf", 0.01, 4.5e9, 0.5), summaries[1]])
    assert [met for _, _, met in slow] == [False, False, False, False]


def test_update_every_step_turns_tepo_s_skip_off_in_the_long_job(tmp_path):
    """`--update-every-step`: tepo's update runs on steps without a gradient too (as TRL's does),
    so its speed and MFU are measured on every step; without it tepo keeps its own skip."""
    from bench_step import make_job
    from benchstep.long_job import tepo_overrides
    from benchstep.options import parse_args

    model = a_model_dir(tmp_path)
    for argv, skip in (([], "true"), (["--update-every-step"], "false")):
        args = parse_args(["--job", "long", "--model", model, *argv], "")
        overrides = tepo_overrides(make_job(args, tmp_path), "vllm")
        assert f"trainer.skip_zero_advantage={skip}" in overrides
