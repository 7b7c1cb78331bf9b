"""What the kill/resume tests compare between two runs: the weights files a run saves and its
metrics without the keys that measure the machine."""

from __future__ import annotations

import json
from pathlib import Path

# Keys that measure the machine, not the run: they differ between any two runs.
TIMING_KEYS = {
    "tokens_per_second",
    "trained_tokens_per_second",
    "update_mfu",
    "peak_flops",
    "peak_rss_mb",
    "peak_gpu_mb",
}
# What a run saves beside its metrics (the last three with MPO's MTP modules / a GAE critic).
WEIGHTS_FILES = (
    "final/model.safetensors",
    "mtp_modules.safetensors",
    "critic/model.safetensors",
    "critic/value_head.safetensors",
    "final/adapter_model.safetensors",  # LoRA: the adapter and the model with it merged in
    "final/merged/model.safetensors",
)


def comparable_metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if k not in TIMING_KEYS and not k.endswith("seconds")}
        for r in records
    ]
