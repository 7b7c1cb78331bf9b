"""core/atomic_write.py: a file or a directory takes its target's place whole, or not at all."""

from __future__ import annotations

import os

import pytest

from tepo_cli.core.atomic_write import replace, staged, staging_path, write_text


def test_a_file_is_replaced_whole_and_no_staging_is_left(tmp_path):
    target = tmp_path / "status.json"
    target.write_text("old")
    write_text(target, "new ü\n")
    assert target.read_bytes() == "new ü\n".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_a_directory_replaces_a_full_one(tmp_path):
    target = tmp_path / "final"
    target.mkdir()
    (target / "stale.bin").write_bytes(b"x" * 3)
    with staged(target) as staging:
        assert staging == tmp_path / "final.tmp"
        staging.mkdir()
        (staging / "model.bin").write_bytes(b"abcd")
    assert sorted(p.name for p in target.iterdir()) == ["model.bin"]
    assert (target / "model.bin").read_bytes() == b"abcd"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # nothing moved aside is left


@pytest.mark.parametrize("directory", [False, True])
def test_a_failed_write_leaves_the_target_as_it_was(tmp_path, directory):
    target = tmp_path / "kept"
    target.write_text("before")
    with pytest.raises(OSError, match="disk full"), staged(target) as staging:
        if directory:
            staging.mkdir()
            (staging / "half").write_text("half")
        else:
            staging.write_text("half")
        raise OSError("disk full")
    assert target.read_text() == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_unique_staging_is_per_process_and_durable_replace_seals_a_tree(tmp_path):
    target = tmp_path / "peaks.json"
    assert staging_path(target, unique=True).name == f"peaks.json.{os.getpid()}.tmp"
    staging = tmp_path / ".step.staging"
    (staging / "sub").mkdir(parents=True)
    (staging / "sub" / "part.pt").write_bytes(b"\x00\x01")
    final = tmp_path / "step"
    final.mkdir()
    replace(staging, final, durable=True)
    assert (final / "sub" / "part.pt").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step"]
