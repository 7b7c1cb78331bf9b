"""Every script under scripts/ is smoke-run (its `--smoke` mode: model=tiny, a step or two, tiny
sizes, the script's own code path end to end) and its output checked, so none rots unseen.

gpu_check.py/.sh are run by tests/test_gpu_check.py and sweeps.sh by tests/test_sweeps.py; a new
script must be added to SMOKE_TESTS (a test here or in another file), or
test_every_script_has_a_smoke_run fails. bench_step.py's TRL side needs the `bench` extra
(`make bench-install`): skipped without TRL, failed without it under TEPO_REQUIRE_BENCH=1 (CI).
rollout=vllm runs need vLLM: skipped without it, failed without it under TEPO_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tepo_cli.core import host_allocator

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
pytestmark = pytest.mark.slow

# script -> the test that smoke-runs it ("file::test")
SMOKE_TESTS = {
    "bench_hf_decode.py": "tests/test_scripts.py::test_bench_hf_decode_smoke",
    "bench_logprob.py": "tests/test_scripts.py::test_bench_logprob_smoke",
    "bench_lora.py": "tests/test_scripts.py::test_bench_lora_smoke",
    "bench_packing.py": "tests/test_scripts.py::test_bench_packing_smoke",
    "bench_precision.py": "tests/test_scripts.py::test_bench_precision_smoke",
    "bench_step.py": "tests/test_scripts.py::test_bench_step_short_smoke",
    "bench_stop.py": "tests/test_scripts.py::test_bench_stop_smoke",
    "bench_update.py": "tests/test_scripts.py::test_bench_update_smoke",
    "bench_vllm.py": "tests/test_scripts.py::test_bench_vllm_smoke",
    "bench_weight_rounding.py": "tests/test_scripts.py::test_bench_weight_rounding_smoke",
    "check_references.py": "tests/test_scripts.py::test_check_references_smoke",
    "compare_objectives.py": "tests/test_scripts.py::test_compare_objectives_smoke",
    "device_check.sh": (
        "tests/test_device_kit.py::test_a_kit_built_and_installed_the_node_way_runs_the_node_script"
    ),
    "device_kit.py": (
        "tests/test_device_kit.py::test_a_kit_built_and_installed_the_node_way_runs_the_node_script"
    ),
    "device_kit.sh": (
        "tests/test_device_kit.py::test_a_kit_built_and_installed_the_node_way_runs_the_node_script"
    ),
    "gpu_check.py": "tests/test_gpu_check.py::test_every_path_runs_on_one_rank_and_on_all_gpus",
    "multi_turn_bench.sh": (
        "tests/test_multi_turn_bench.py::"
        "test_the_multi_turn_bench_runs_every_pair_and_skips_them_the_second_time"
    ),
    "gpu_check.sh": (
        "tests/test_gpu_check.py::test_the_script_runs_checks_on_cpu_ranks_and_writes_its_table"
    ),
    "sweeps.sh": "tests/test_sweeps.py::test_joblib_sweep_and_report",
    "protocol_run.sh": "tests/test_scripts.py::test_protocol_run_lists_a_pinned_protocol_s_runs",
    "word_math_claims.sh": (
        "tests/test_word_math_claims.py::test_smoke_publishes_records_reports_and_skips_finished_runs"
    ),
}

needs_trl = pytest.mark.skipif(
    os.environ.get("TEPO_REQUIRE_BENCH") != "1" and importlib.util.find_spec("trl") is None,
    reason="TRL (the bench extra: make bench-install) is not installed",
)
HAVE_VLLM = (
    os.environ.get("TEPO_REQUIRE_VLLM") == "1" or importlib.util.find_spec("vllm") is not None
)
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM (make install-vllm) is not installed")


def run_script(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """Run scripts/<args>; a failure shows the script's output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS)])}
    result = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"{args} exit {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result


def finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_every_script_has_a_smoke_run():
    scripts = {p.name for p in SCRIPTS.iterdir() if p.is_file() and p.suffix in {".py", ".sh"}}
    assert scripts == set(SMOKE_TESTS), (
        "every script under scripts/ needs a smoke run in CI: add a --smoke mode and a test, and "
        f"list it in SMOKE_TESTS; missing {sorted(scripts - set(SMOKE_TESTS))}, "
        f"gone {sorted(set(SMOKE_TESTS) - scripts)}"
    )
    for script, test in SMOKE_TESTS.items():
        path, name = test.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), (script, test)
        assert script in (ROOT / path).read_text(), f"{test} does not run {script}"


def test_bench_logprob_smoke(tmp_path):
    table = tmp_path / "new" / "table.md"  # a folder the script makes
    run_script("scripts/bench_logprob.py", "--smoke", "--markdown", str(table))
    rows = [line for line in table.read_text().splitlines() if line.startswith("| smoke (")]
    assert [row.split("|")[2].strip() for row in rows] == ["naive", "torch"]
    for row in rows:
        fwd, fwd_bwd, peak = (float(cell) for cell in row.split("|")[3:6])
        # Times only: each is the best of its own repeats, so on a busy machine the forward
        # alone can come out slower than forward+backward (seen in the suite): no ordering.
        assert fwd > 0 and fwd_bwd > 0 and peak >= 0


def test_bench_packing_smoke(tmp_path):
    output = tmp_path / "new" / "packing.json"  # a folder the script makes
    result = run_script("scripts/bench_packing.py", "--smoke", "--profile", "--output", str(output))
    runs = json.loads(output.read_text())
    assert set(runs) == {"padded", "packed", "packed+checkpointing"}
    for run in runs.values():
        assert finite(run["fwd_bwd_seconds"]) and run["peak_rss_gb"] > 0, run
        shares = [run["matmul_share"], run["attention_share"], run["other_share"]]
        assert abs(sum(shares) - 1) < 1e-9 and min(shares) > 0, run
        assert run["real_answer_tokens"] < run["padded_answer_slots"]  # ragged answers
    assert "| packed |" in result.stdout and "x the padded speed" in result.stdout
    assert "packed: time in matmuls" in result.stdout


def test_bench_update_smoke(tmp_path):
    """One variant per kind of setting (a config key, an allocator, an environment variable): the
    others differ from these only in a value (each allocator in a real run:
    tests/test_host_allocator.py)."""
    output = tmp_path / "new" / "update.json"  # a folder the script makes
    named = {  # variant -> the allocator its process must run on
        "prompts-in-every-micro-batch": host_allocator.resolve("auto").name,
        "prompt-pass": host_allocator.resolve("auto").name,
        "prompt-pass-glibc-huge-pages": "glibc",
    }
    variants = ",".join(named)
    result = run_script(
        "scripts/bench_update.py", "--smoke", "--profile", "--variants", variants,
        "--output", str(output),
    )  # fmt: skip
    runs = json.loads(output.read_text())
    skipped = {name for name in named if f"variant {name} skipped" in result.stderr}
    if os.environ.get("TEPO_REQUIRE_ALLOCATORS") == "1":
        assert not skipped, result.stderr[-2000:]
    assert set(runs) == set(named) - skipped
    for name, run in runs.items():  # each variant's process ran on the allocator its config names
        assert run["host_allocator"] == named[name], (name, run)
    for run in runs.values():
        assert finite(run["update_seconds"]) and run["peak_rss_gb"] > 0, run
        assert finite(run["update_gflops"]) and finite(run["matmul_gflops"]), run
        assert finite(run["update_mfu"]) and run["update_mfu"] > 0, run
        assert run["cpu"], run  # each figure names its processor
        shares = [run["matmul_share"], run["attention_share"], run["other_share"]]
        assert abs(sum(shares) - 1) < 1e-9 and min(shares) > 0, run
        assert run["top_other"] and all(0 < share < 1 for _, share in run["top_other"]), run
    # The prompts ran once: fewer micro-batches hold the same answers.
    assert (
        runs["prompt-pass"]["micro_batches"] < runs["prompts-in-every-micro-batch"]["micro_batches"]
    )
    assert "x the speed of prompts-in-every-micro-batch" in result.stdout


def test_compare_objectives_smoke(tmp_path):
    out = tmp_path / "compare"
    run_script("scripts/compare_objectives.py", "--smoke", "--out", str(out))
    rows = (out / "comparison.md").read_text().splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == ["grpo", "gspo"]
    for row in rows:
        assert "failed" not in row, row
        assert re.search(r"\d\.\d\d → \d\.\d\d", row), row


def test_check_references_smoke():
    result = run_script("scripts/check_references.py", "--smoke", timeout=900)
    assert "acceptance: PASS" in result.stdout
    counts = re.findall(r"(\d+)/(\d+)\s+\(", result.stdout)
    assert len(counts) >= 5  # gsm8k (three modes), math, math500, humaneval (+ bare), mbpp
    assert all(int(total) == 5 for _, total in counts), result.stdout


def test_bench_precision_smoke(tmp_path):
    """bf16 against float32 on the same job, each in its own process, forced to run in bf16."""
    run_script("scripts/bench_precision.py", "--smoke", "--out", str(tmp_path))
    result = json.loads((tmp_path / "results.json").read_text())
    assert [run["dtype"] for run in result["runs"]] == ["float32", "bfloat16"]
    for dtype in ("float32", "bfloat16"):
        row = result["summary"][dtype]
        assert row["steps"] == 1 and finite(row["step_seconds"]) and row["step_seconds"] > 0
    config = (tmp_path / "runs" / "bfloat16-round1" / "config.yaml").read_text()
    assert "dtype: bfloat16" in config
    assert "| bf16 / float32 |" in (tmp_path / "results.md").read_text()


def test_bench_stop_smoke(tmp_path):
    """The same job with and without a stop string: the stopped answers are shorter."""
    run_script("scripts/bench_stop.py", "--smoke", "--out", str(tmp_path))
    free, stop = json.loads((tmp_path / "results.json").read_text())
    assert (free["name"], stop["name"]) == ("free", "stop")
    assert "rollout.stop=[e]" in stop["overrides"] and len(stop["steps"]) == 2
    assert stop["summary"]["response_length"] < free["summary"]["response_length"]
    assert finite(stop["summary"]["step_seconds"]) and stop["summary"]["step_seconds"] > 0
    assert "| stop / free |" in (tmp_path / "results.md").read_text()


def test_bench_hf_decode_smoke(tmp_path):
    """Every batch size's decode step and both generate modes (eager; static cache, compiled) on
    the tiny model."""
    args = ("--model", "tiny", "--dtype", "float32", "--steps", "2", "--new-tokens", "3")
    run_script("scripts/bench_hf_decode.py", *args, "--out", str(tmp_path))
    result = json.loads((tmp_path / "results.json").read_text())
    assert sorted(map(int, result["step_seconds"])) == [1, 2, 4, 8, 16]
    assert all(finite(s) and s > 0 for s in result["step_seconds"].values())
    rates = result["generate_tokens_per_s"]
    assert set(rates) == {"eager", "static, compiled"} and all(r > 0 for r in rates.values())
    assert "| 16 |" in (tmp_path / "results.md").read_text()


def test_bench_weight_rounding_smoke(tmp_path):
    """float32, nearest and stochastic bf16 weights, one step each on the tiny model."""
    run_script(
        "scripts/bench_weight_rounding.py",
        "--model",
        "tiny",
        "--steps",
        "1",
        "--out",
        str(tmp_path),
    )
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(row["mode"], row["step"]) for row in rows] == [
        (mode, step) for mode in ("float32", "nearest", "stochastic") for step in (0, 1)
    ]
    assert all(finite(row["loss"]) and row["kl_from_start"] >= 0 for row in rows)
    assert rows[0]["kl_from_start"] == 0.0  # float32 at step 0 is the starting model
    table = (tmp_path / "results.md").read_text()
    assert "| stochastic |" in table and "| tepo / torch_randint |" in table


def test_bench_lora_smoke(tmp_path):
    run_script("scripts/bench_lora.py", "--smoke", "--out", str(tmp_path))
    runs = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert set(runs) == {"full", "lora_r8", "full_kl", "full_no_kl", "lora_r8_kl", "lora_r8_no_kl"}
    assert runs["lora_r8"]["trainable_parameters"] < runs["full"]["trainable_parameters"]
    for run in runs.values():
        assert all(finite(run[k]) for k in ("median_step_seconds", "peak_rss_mb")), run
    table = (tmp_path / "results.md").read_text()
    assert "| trainable parameters |" in table and "the reference's cost" in table


@needs_vllm
def test_bench_vllm_smoke(tmp_path):
    # the same tepo train command per back-end; vllm alone keeps the smoke cheap
    step_args = ["step", "--smoke", "--backends", "vllm", "--out", str(tmp_path / "step")]
    run_script("scripts/bench_vllm.py", *step_args)
    rows = json.loads((tmp_path / "step" / "results.json").read_text())["rows"]
    assert [row["backend"] for row in rows] == ["vllm"]
    for row in rows:
        assert row["steps"] == 2 and finite(row["median_step_seconds"]), row
        assert finite(row["sync_seconds"]) and finite(row["mismatch_abs_max"]), row
    # eval: the same tepo eval command per back-end (`tepo eval rollout=vllm` is
    # tests/test_vllm_e2e.py's); hf keeps the smoke from starting two more engines
    eval_args = ["eval", "--smoke", "--backends", "hf", "--out", str(tmp_path / "eval")]
    run_script("scripts/bench_vllm.py", *eval_args)
    rows = json.loads((tmp_path / "eval" / "results.json").read_text())["rows"]
    assert [(r["benchmark"].split()[0], r["backend"]) for r in rows] == [
        ("gsm8k", "hf"),
        ("arith", "hf"),
    ]
    assert [r["samples"] for r in rows] == [2, 10]
    assert all(finite(r["samples_per_second"]) and 0 <= r["accuracy"] <= 1 for r in rows)
    # knobs: one setting, one that reaches vLLM through rollout.engine.engine_kwargs
    knob_args = ["knobs", "--smoke", "--knobs", "no_chunked", "--out", str(tmp_path / "knobs")]
    run_script("scripts/bench_vllm.py", *knob_args)
    (row,) = json.loads((tmp_path / "knobs" / "results.json").read_text())["rows"]
    assert row["setting"] == "no_chunked" and row["answers"] == 32 and row["decode_batch"] == 32
    assert 0 < row["mean_tokens"] <= 32 * 16 and finite(row["tokens_per_second"]), row


@needs_trl
def test_bench_step_short_smoke(tmp_path):
    """The headline benchmark (scripts/bench_step.py; docs/guides/performance.md), tepo vs TRL, with evaluation."""
    run_script("scripts/bench_step.py", "--smoke", "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    for side in ("tepo", "trl"):
        summary = results["summary"][side]
        assert summary["timed_steps"] == 1 and finite(summary["median_s"]), side
        assert summary["peak_rss_bytes"] > 0 and 0 <= summary["accuracy_after"] <= 1
    assert finite(results["ratios_tepo_over_trl"]["steps_per_s"])
    assert "| peak RSS |" in (tmp_path / "results.md").read_text()


@needs_trl
def test_bench_step_long_smoke(tmp_path):
    """`--job long` on the tiny model: tepo-hf beside TRL on its own generate, the length,
    padding, FLOP and memory columns. The other sides are the same code with one flag each
    (tepo-vllm: rollout=vllm, whose `tepo train` bench_vllm.py's smoke runs; TRL's colocated
    vLLM: `--trl-generation vllm`), and a vLLM engine's start would double the smoke's cost."""
    sides = ["tepo-hf", "trl"]
    args = ["--job", "long", "--smoke", "--sides", ",".join(sides), "--trl-generation", "generate"]
    run_script("scripts/bench_step.py", *args, "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert max(m["gflops"] for m in results["matmul"]) > 0
    summaries = {s["side"]: s for s in results["summary"]}
    assert list(summaries) == sides
    for run in results["runs"]:
        summary = summaries[run["side"]]
        assert summary["status"] == "ok" and summary["steps_done"] == 1, summary
        lengths = summary["lengths"]
        assert lengths["count"] == 2 * 4 and 1 <= lengths["mean"] <= lengths["max"] <= 24
        assert lengths["p50"] <= lengths["p90"] <= lengths["max"]
        assert 0 <= lengths["truncated"] <= 1
        answers = sum(n for step in run["steps"] for n in step["answer_lengths"])
        assert summary["answer_tokens"] == answers  # the update trains on every answer token
        assert answers < summary["real_tokens"] <= summary["token_slots"]
        assert 0 <= summary["padding_share"] < 1
        assert summary["update_gflops"] > 0 and summary["matmul_share"] > 0
        # one formula for both trainers (the tiny model's MLP matmul is no peak: any size > 0)
        assert finite(summary["update_mfu"]) and summary["update_mfu"] > 0, summary
        assert summary["peak_rss_bytes"] > 0 and finite(summary["median_s"])
        parts = summary["parts_median_s"]
        assert all(finite(parts[p]) for p in ("generation", "scoring", "update")), parts
    assert summaries["trl"]["generation_mode"] == "generate"
    assert summaries["trl"]["generation_why"]
    assert (tmp_path / "trl-generate" / "timings.jsonl").exists()
    assert not (tmp_path / "trl-generate" / "final").exists()  # no model this job would score
    # TRL at its own memory defaults: the smoke's 8 sequences in two micro-batches of 4, one
    # optimizer step (the step count above), gradient checkpointing on.
    (trl_run,) = [run for run in results["runs"] if run["side"] == "trl"]
    assert [step["shapes"]["micro_batches"] for step in trl_run["steps"]] == [2]
    table = (tmp_path / "results.md").read_text()
    assert (
        "4 sequences per forward/backward (2 accumulated per optimizer step), gradient "
        "checkpointing on" in table
    )
    for label in ("update padding share", "truncated share", "… / matmul rate", "peak RSS"):
        assert f"| {label}" in table
    # each side's allocator: tepo's default (its start chose it), TRL's process never preloads one
    assert summaries["tepo-hf"]["host_allocator"] == host_allocator.resolve("auto").name
    assert summaries["trl"]["host_allocator"] == "glibc"
    assert "| host allocator |" in table


@pytest.mark.parametrize(
    ("script", "args", "missing", "prepare"),
    [
        (
            "scripts/bench_step.py",
            ["--job", "long", "--smoke"],
            "data/math500/train.jsonl (math500's train split: not prepared)",
            "`tepo data prepare benchmark=math500`",
        ),
        (
            "scripts/bench_vllm.py",
            ["eval", "--smoke", "--backends", "hf"],
            "data/gsm8k/test.jsonl (gsm8k's test split: not prepared)",
            "`tepo data prepare benchmark=gsm8k`",
        ),
        (
            "scripts/multi_turn_bench.sh",
            ["runs", "results"],
            "data/mbpp/test.jsonl (mbpp's test split: not prepared)",
            "`tepo data prepare benchmark=mbpp`",
        ),
    ],
)
def test_a_benchmark_without_its_prepared_data_stops_at_once(
    tmp_path, script, args, missing, prepare
):
    """No side started and failed ("failed, 0 steps"): one paragraph, exit 2, no output."""
    out = tmp_path / "out"
    runner = ["bash"] if script.endswith(".sh") else [sys.executable]
    extra = [] if script.endswith(".sh") else ["--out", str(out)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS)]),
        "TEPO_CACHE": str(tmp_path / "cache"),
        "TEPO": str(Path(sys.executable).parent / "tepo"),
        "SMOKE": "1",
    }
    result = subprocess.run(
        [*runner, str(ROOT / script), *args, *extra],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    message = result.stderr.strip()
    assert "\n" not in message and f"{tmp_path / 'cache'}/{missing}" in message, message
    assert prepare in message and result.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no run, results or cache directory made


def test_protocol_run_lists_a_pinned_protocol_s_runs(tmp_path):
    """The runner pins a worktree at the protocol's commit, gives it a light environment, and
    hands over to `tepo protocol run` there (`--list`: the runs, nothing trained); a missing
    protocol file is refused before anything is made. With COMMIT=1 it commits the published
    records beside the protocol (here a run's status file put there by hand) in the checkout that
    holds them, that folder only."""
    refused = subprocess.run(
        ["bash", "scripts/protocol_run.sh", str(tmp_path / "none.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "must be a protocol.yaml file" in refused.stderr
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("scripts/protocol_run.sh needs the checkout's .venv (make install)")
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    text = (ROOT / "docs/results/precision/parity/protocol.yaml").read_text()
    protocol = tmp_path / "smoke" / "protocol.yaml"
    protocol.parent.mkdir()
    protocol.write_text(
        re.sub(r"(?m)^commit: .*$", f"commit: {head}", text).replace(
            "name: bf16_parity", "name: smoke"
        )
    )
    results = protocol.parent
    identity = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    identity["GIT_COMMITTER_EMAIL"] = "t@t"
    for command in (["init", "-q"], ["add", "protocol.yaml"], ["commit", "-qm", "protocol"]):
        subprocess.run(["git", *command], cwd=results, env={**os.environ, **identity}, check=True)
    (results / "runs" / "float32_seed0").mkdir(parents=True)
    (results / "runs" / "float32_seed0" / "status.json").write_text('{"state": "finished"}\n')
    (results / "unrelated.txt").write_text("staged, not committed by the runner\n")
    subprocess.run(["git", "add", "unrelated.txt"], cwd=results, check=True)
    worktree = tmp_path / "code"
    env = {**os.environ, **identity, "WORKTREE": str(worktree), "RUNS": str(tmp_path / "runs")}
    env.update(COMMIT="1", COMMIT_EVERY="1")
    try:
        listed = subprocess.run(
            ["bash", "scripts/protocol_run.sh", str(protocol), "--list"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)
    assert listed.returncode == 0, listed.stderr[-3000:]
    lines = [line for line in listed.stdout.splitlines() if re.match(r"\w+_seed\d+:", line)]
    assert [line.split(":")[0] for line in lines] == [
        f"{arm}_seed{seed}" for seed in (0, 1, 2) for arm in ("float32", "bf16")
    ]
    assert lines[1].endswith("model.dtype=bfloat16 seed=0")
    log = subprocess.run(
        ["git", "log", "--format=%s", "--name-only", "-1"],
        cwd=results,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert log[:3] == ["smoke:", "published", "float32_seed0"]
    assert "runs/float32_seed0/status.json" in log and "unrelated.txt" not in log
    status = subprocess.run(
        ["git", "status", "--short"], cwd=results, capture_output=True, text=True
    )
    assert status.stdout == "A  unrelated.txt\n"
