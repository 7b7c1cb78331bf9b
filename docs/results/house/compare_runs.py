"""`python compare_runs.py BEFORE AFTER`: two run directories of the same command compared.

Every metrics.jsonl record (keys measuring seconds, rates, MFU and memory aside), every
samples.jsonl row, eval.jsonl (seconds aside) and eval_samples.jsonl, summary.json (times aside,
paths relative to the run) and the bytes of every file under final/ (and of MPO's
mtp_modules.safetensors). A run cut short is compared over the records both have.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from tepo_cli.protocol.rerun import untimed


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def summary(run: Path) -> dict | None:
    path = run / "summary.json"
    if not path.is_file():
        return None
    kept = untimed(json.loads(path.read_text()))
    # paths into the run directory (final_model, mtp_modules) compared relative to it
    kept = {k: v.replace(str(run), "RUN") if isinstance(v, str) else v for k, v in kept.items()}
    return {k: v for k, v in kept.items() if k != "run_dir"}


def final_files(run: Path) -> dict[str, str]:
    files = sorted(p for p in (run / "final").rglob("*") if p.is_file())
    files += [p for p in [run / "mtp_modules.safetensors"] if p.is_file()]  # MPO's modules
    return {
        p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }


def main(before: Path, after: Path) -> None:
    for name in ("metrics.jsonl", "samples.jsonl", "eval.jsonl", "eval_samples.jsonl"):
        left, right = (
            [untimed(r) for r in rows(before / name)],
            [untimed(r) for r in rows(after / name)],
        )
        both = min(len(left), len(right))
        same = sum(x == y for x, y in zip(left[:both], right[:both], strict=True))
        print(
            f"{name}: {same} of the {both} both have equal (before {len(left)}, after {len(right)})"
        )
    sums = summary(before), summary(after)
    print(
        "summary.json:", "missing" if None in sums else "equal" if sums[0] == sums[1] else "DIFFER"
    )
    files = final_files(before), final_files(after)
    state = "missing" if not all(files) else "equal" if files[0] == files[1] else "DIFFER"
    print(f"final/: {len(files[0])} files, {state}")
    rewards = [r["reward_mean"] for r in rows(before / "metrics.jsonl") if "reward_mean" in r]
    print("reward_mean by step (before):", rewards)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
