"""scripts/benchlib: the benchmarks' one report writer and one runner (pure parts, no model)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from benchlib import report, runner


def test_cells_say_what_was_not_measured_and_round_as_the_pages_do():
    assert [report.s(None), report.x(None), report.gb(None)] == ["—", "—", "—"]
    assert report.s(1.23456) == "1.23" and report.s(0.5, 4) == "0.5000"
    assert report.x(2.5) == "2.50×" and report.gb(1_234_000_000) == "1.23 GB"
    assert report.pct(0.1234) == "12.3 %" and report.points(-2.04) == "-2.0 points"
    assert report.seconds(61.6) == "62 s"
    assert report.ratio(3.0, 2.0) == 1.5 and report.ratio(3.0, 0.0) is None
    assert report.ratio(None, 2.0) is None


def test_median_and_mean_skip_what_was_not_measured():
    assert report.median([3.0, None, 1.0, 2.0]) == 2.0
    assert report.median([None]) is None
    assert report.mean([1.0, None, 2.0]) == 1.5 and report.mean([]) is None


def test_a_table_and_its_verdicts():
    text = report.table(["a", "b"], [(1, "x"), ("2", 3.5)])
    assert text == "| a | b |\n|---|---|\n| 1 | x |\n| 2 | 3.5 |"
    lines = report.verdicts([("fast", "2.00×", True), ("small", "—", None), ("x", "1", False)])
    assert lines == ["- fast: 2.00× — met", "- small: — — not measured", "- x: 1 — NOT met"]
    assert report.versions_line({"torch": "2.9", "cpu": "z"}) == "Versions: torch 2.9, cpu z"


def test_best_seconds_runs_the_warm_ups_untimed_and_keeps_the_fastest_call():
    import time

    pauses = iter([0.0, 0.05, 0.002, 0.03])  # the warm-up's, then three timed calls'
    calls = []

    def call() -> None:
        calls.append(1)
        time.sleep(next(pauses))

    best = runner.best_seconds(call, repeats=3, warmup=1)
    assert len(calls) == 4
    assert 0.002 <= best < 0.03  # the 2 ms call, not the 50 or 30 ms ones


def test_a_child_s_json_line_and_a_run_s_step_records(tmp_path):
    code = "print('loading'); print('{\"x\": 1}'); print('{\"x\": 2}')"
    assert runner.child_json([sys.executable, "-c", code]) == {"x": 2}
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 1}\n{"summary": 1}\n\n{"step": 2}\n')
    assert runner.step_records(tmp_path) == [{"step": 1, "a": 1}, {"step": 2}]
    assert runner.read_jsonl(tmp_path / "none.jsonl") == []
    result = runner.run_child([sys.executable, "-c", "print('hi')"], tmp_path / "log")
    assert result.returncode == 0 and result.peak_rss_bytes > 0 and result.cpu_seconds > 0
    assert (tmp_path / "log").read_text().splitlines()[-1] == "hi"
