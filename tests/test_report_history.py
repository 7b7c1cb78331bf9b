"""How each run went, read from a protocol's journal (tepo_cli/eval/report/run_history.py), on
journals written by hand whose account is known: a resume after a crash, a run trained again from
step 0 after tries that left no record, a try at another commit with changed files under an
earlier protocol text, a run still training, and the experiment-wide deviations."""

from __future__ import annotations

import io
import json
import shutil

import pytest
import yaml
from rich.cells import cell_len
from rich.console import Console
from test_report_protocol import SEEDS, protocol, sweep  # noqa: F401 (the fake sweep fixture)

from tepo_cli.core.errors import ConfigError
from tepo_cli.eval.report.build_protocol import build_protocol_report
from tepo_cli.eval.report.render_protocol import NO_JOURNAL
from tepo_cli.eval.report.run_history import experiment_events, history_columns, run_histories

PINNED = "c0ffee1" + "0" * 33
OTHER = "abcdef0" + "1" * 33


def line(
    run: str, event: str, time: str, text: str, commit: str = PINNED, dirty: bool = False, **details
) -> dict:
    """A journal line as tepo_cli/protocol/journal.py writes it."""
    return {"time": f"2026-11-29T{time}+00:00", "run": run, "event": event, **details,
            "commit": commit, "dirty": dirty, "host": "vm", "protocol_sha256": text}  # fmt: skip


def journal(text: str) -> list[dict]:
    old = "0" * 64
    return [
        line("extra_seed1", "start", "01:00:00", text),
        line("tepo_seed10", "start", "01:00:05", old, commit=OTHER),
        line("*", "protocol_changed", "02:42:28", text, previous_sha256=old),
        line("tepo_seed10", "start", "02:42:30", text),
        line("grpo_seed10", "start", "03:00:00", text),
        line("grpo_seed10", "fail", "03:30:00", text, exit_code=143, state="interrupted",
             last_checkpoint=20, others_cores=0.01, paused_seconds=60.0),
        line("tepo_seed10", "resume", "04:00:00", text, after_step=0, state="unknown",
             dirty=True),
        line("tepo_seed10", "fail", "04:10:00", text, exit_code=1, state="crashed",
             last_checkpoint=None, others_cores=1.5),
        line("grpo_seed10", "resume", "05:00:00", text, after_step=20, state="interrupted"),
        line("grpo_seed10", "finish", "07:54:29", text, steps=100, others_cores=0.4,
             paused_seconds=120.0),
        line("grpo_seed11", "start", "07:54:29", text),
        line("*", "something_new", "08:00:00", text),
    ]  # fmt: skip


def test_each_run_s_tries_ends_and_code_are_counted_from_the_journal():
    text = "f" * 64
    order = ["grpo_seed10", "tepo_seed10", "grpo_seed11", "tepo_seed11"]
    rows = {r.run: r for r in run_histories([journal(text)], order, "c0ffee1")}
    assert list(rows) == ["grpo_seed10", "tepo_seed10", "grpo_seed11", "extra_seed1"]

    crashed_then_resumed = rows["grpo_seed10"]
    assert (crashed_then_resumed.tries, crashed_then_resumed.fresh_starts) == (2, 1)
    assert crashed_then_resumed.resumed_after == (20,)
    assert crashed_then_resumed.failed == ("exit 143 (interrupted, saved step 20)",)
    assert (crashed_then_resumed.unrecorded, crashed_then_resumed.open) == (0, False)
    assert crashed_then_resumed.others_cores == 0.4  # the most over its two recorded tries
    assert crashed_then_resumed.paused_seconds == 180.0  # the sum over them
    assert crashed_then_resumed.finished == "2026-11-29 07:54"
    assert crashed_then_resumed.commits == ("c0ffee1",)
    assert (crashed_then_resumed.off_commit, crashed_then_resumed.dirty) == (0, 0)
    assert crashed_then_resumed.earlier_text == 0

    # two starts that left no end, then a resume with no checkpoint (from step 0 again) that failed
    thrown_away = rows["tepo_seed10"]
    assert (thrown_away.tries, thrown_away.fresh_starts, thrown_away.resumed_after) == (3, 3, ())
    assert thrown_away.unrecorded == 2 and not thrown_away.open
    assert thrown_away.failed == ("exit 1 (crashed, no checkpoint)",)
    assert thrown_away.others_cores == 1.5 and thrown_away.finished is None
    assert thrown_away.paused_seconds is None  # a journal from before pauses were counted
    assert thrown_away.commits == ("abcdef0", "c0ffee1")
    assert (thrown_away.off_commit, thrown_away.dirty, thrown_away.earlier_text) == (1, 1, 1)

    training = rows["grpo_seed11"]
    assert (training.tries, training.open, training.unrecorded, training.finished) == (
        1,
        True,
        0,
        None,
    )
    assert training.others_cores is None

    cells = {r.run: [cell(r) for _, cell in history_columns()] for r in rows.values()}
    assert cells["grpo_seed10"] == [
        "grpo_seed10", "2", "1", "20", "exit 143 (interrupted, saved step 20)", "0.40", "3.0",
        "2026-11-29 07:54", "c0ffee1",
    ]  # fmt: skip
    assert cells["tepo_seed10"] == [
        "tepo_seed10", "3", "3", "—", "exit 1 (crashed, no checkpoint); no record ×2", "1.50",
        "—", "—", "abcdef0, c0ffee1 (1 not at the protocol's commit; 1 with changed files; "
        "1 under an earlier protocol text)",
    ]  # fmt: skip
    assert cells["grpo_seed11"][4:8] == ["—", "—", "—", "not yet"]


def test_the_experiment_wide_lines_are_its_deviations():
    rerun = line("*", "rerun", "09:00:00", "f" * 64, of_run="grpo_seed10", steps=3,
                 at="c0ffee1", outcome="every compared record equal")  # fmt: skip
    assert experiment_events([[*journal("f" * 64), rerun]]) == [
        "2026-11-29 02:42 UTC: the protocol file changed after its runs had started "
        "(--allow-protocol-change)",
        "2026-11-29 08:00 UTC: something_new",
        "2026-11-29 09:00 UTC: grpo_seed10 trained again from its published overrides until "
        "step 3 at commit c0ffee1 and compared with its records (--rerun): every compared "
        "record equal",
    ]


def test_the_report_says_how_each_run_went_or_that_it_cannot(sweep, tmp_path):  # noqa: F811
    path = protocol(tmp_path / "p.yaml")
    report, files = build_protocol_report(sweep, path, tmp_path / "bare", plots=False)
    assert report.history == [] and NO_JOURNAL in files[0].read_text()

    entries = journal("f" * 64)
    (sweep / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    console = Console(width=300, file=io.StringIO(), color_system=None)
    report, files = build_protocol_report(sweep, path, tmp_path / "out", console, plots=False)
    assert [r.run for r in report.history] == [
        "grpo_seed10", "tepo_seed10", "grpo_seed11", "extra_seed1",
    ]  # fmt: skip
    markdown = files[0].read_text()
    section = markdown[markdown.index("## How each run went") :]
    assert (
        "| grpo_seed10 | 2 | 1 | 20 | exit 143 (interrupted, saved step 20) | 0.40 | 3.0 |"
        in section
    )
    assert "- 2026-11-29 02:42 UTC: the protocol file changed" in section
    printed = console.file.getvalue()
    assert "How each run went" in printed and "no record ×2" in printed
    assert "the protocol file changed after its runs had started" in printed

    narrow = Console(width=100, file=io.StringIO(), color_system=None)
    build_protocol_report(sweep, path, tmp_path / "narrow", narrow, plots=False)
    lines = narrow.file.getvalue().splitlines()
    assert max(cell_len(line) for line in lines) <= 100  # the 8 columns fit, text wraps in cells
    assert any(line.startswith("│ tepo_seed10 │") for line in lines)


def test_runs_gathered_through_links_bring_their_own_journals(sweep, tmp_path):  # noqa: F811
    """A follow-up arm's report reads a folder of links to two protocols' runs: each run's
    history comes from the journal beside its real directory."""
    text = "f" * 64
    first, second, gathered = tmp_path / "first", tmp_path / "second", tmp_path / "gathered"
    for folder, arm in ((first, "grpo"), (second, "tepo")):
        folder.mkdir()
        lines = [line(f"{arm}_seed{s}", "start", f"0{s - 10}:00:00", text) for s in (10, 11, 12)]
        lines += [line(f"{arm}_seed{s}", "finish", f"0{s - 10}:30:00", text) for s in (10, 11, 12)]
        (folder / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
        for run in sweep.glob(f"{arm}_seed*"):
            run.rename(folder / run.name)
    gathered.mkdir()
    for run in [*first.iterdir(), *second.iterdir()]:
        if run.is_dir():
            (gathered / run.name).symlink_to(run)
    path = protocol(tmp_path / "p.yaml")
    report, _ = build_protocol_report(gathered, path, tmp_path / "out", plots=False)
    assert [(r.run, r.tries, r.finished) for r in report.history] == [
        (f"{arm}_seed{s}", 1, f"2026-11-29 0{s - 10}:30")
        for s in (10, 11, 12)
        for arm in ("grpo", "tepo")
    ]


def test_a_reused_arm_is_read_where_its_protocol_published_it(sweep, tmp_path):  # noqa: F811
    """A protocol that reuses another's grpo arm (`reuse:`) is reported from its own runs/ alone:
    the grpo runs and their history come from the other protocol's runs/ and journal — not that
    protocol's other runs, nor its pilots of other arms — and the verdicts are those of the
    whole sweep in one folder."""
    whole, _ = build_protocol_report(
        sweep, protocol(tmp_path / "p.yaml"), tmp_path / "o1", plots=False
    )
    text = "f" * 64
    source, follow = tmp_path / "claims", tmp_path / "follow"
    for folder in (source / "runs", follow / "runs"):
        folder.mkdir(parents=True)
    protocol(source / "protocol.yaml")
    data = yaml.safe_load(protocol(follow / "protocol.yaml").read_text())
    data["reuse"] = {"grpo": "../claims/protocol.yaml"}
    (follow / "protocol.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for run in sweep.iterdir():
        run.rename((source if run.name.startswith("grpo") else follow) / "runs" / run.name)
    lines = [line(f"{arm}_seed{s}", "finish", f"0{s - 10}:30:00", text)
             for arm in ("grpo", "tepo") for s in SEEDS]  # fmt: skip
    lines.append(line("*", "pilot", "00:00:00", text, arm="tepo", of_run="tepo_seed10", seed=1012,
                      steps=2, exit_code=0))  # fmt: skip
    lines.append(line("*", "pilot", "00:01:00", text, arm="grpo", of_run="grpo_seed10", seed=1012,
                      steps=2, exit_code=0))  # fmt: skip
    (source / "runs" / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))

    report, _ = build_protocol_report(
        follow / "runs", follow / "protocol.yaml", tmp_path / "o2", plots=False
    )
    assert [(r.name, r.adjusted_p, r.verdict) for r in report.primaries] == [
        (r.name, r.adjusted_p, r.verdict) for r in whole.primaries
    ]
    assert report.finished == report.registered == 6
    assert [r.run for r in report.history] == ["grpo_seed10", "grpo_seed11", "grpo_seed12"]
    assert len(report.deviations) == 1 and "a pilot of arm grpo" in report.deviations[0]
    shutil.rmtree(source / "runs" / "grpo_seed12")
    with pytest.raises(ConfigError) as waiting:
        build_protocol_report(follow / "runs", follow / "protocol.yaml", tmp_path / "o3")
    assert "not found: grpo_seed12" in str(waiting.value)
    assert (
        f"(grpo_seed12: reused, trained by the protocol that publishes them in {source / 'runs'})"
        in str(waiting.value)
    )
