"""scripts/device_kit.sh (the wheels a bare GPU image lacks) and scripts/device_check.sh (the node's
one command): the plan drawn from a resolve, the image's list, and both scripts end to end on this
machine — a kit built for this Python, installed with `pip --target`, gpu_check and the kernel
benchmark run through the node's script on CPU ranks."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("device_kit", ROOT / "scripts" / "device_kit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_kit"] = module
    spec.loader.exec_module(module)
    return module


device_kit = load_script()


def item(name: str, version: str, url: str) -> dict:
    return {"metadata": {"name": name, "version": version}, "download_info": {"url": url}}


def test_the_kit_is_what_the_resolve_needs_and_the_image_lacks():
    image = {"torch": "2.11.0", "typing-extensions": None, "numpy": "2.5.2"}
    report = {
        "install": [
            item("tepo", "0.1.0", "file:///repo"),
            item("torch", "2.11.0", "https://x/torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
            item(
                "typing_extensions", "4.16.0", "https://x/typing_extensions-4.16.0-py3-none-any.whl"
            ),
            item("DeepSpeed", "0.19.8", "https://x/deepspeed-0.19.8.tar.gz"),
            item("pydantic_core", "2.50.5", "https://x/pydantic_core-2.50.5-cp312-cp312-x.whl"),
        ]
    }
    kit, image_side = device_kit.plan(report, image)
    assert [(e["name"], e["version"]) for e in kit] == [
        ("deepspeed", "0.19.8"),
        ("pydantic-core", "2.50.5"),
    ]
    # typing_extensions is the image's under its canonical name, at whatever version it holds.
    assert [e["name"] for e in image_side] == ["torch", "typing-extensions"]
    moved = {"install": [item("torch", "2.13.0", "https://x/torch.whl")]}
    with pytest.raises(ValueError, match=r"torch 2\.13\.0 \(image: 2\.11\.0\)"):
        device_kit.plan(moved, image)


def test_the_image_list_pins_what_the_node_holds_and_says_when_it_was_read(tmp_path):
    image, read = device_kit.read_image(device_kit.IMAGE_PACKAGES)
    assert read == "2026-11-17"
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0"
    assert image["huggingface-hub"] == "1.33.0" and image["peft"] is None
    for lacking in ("deepspeed", "hydra-core", "omegaconf", "pydantic", "datasets", "vllm"):
        assert lacking not in image
    undated = tmp_path / "image.txt"
    undated.write_text("torch==2.11.0\n")
    with pytest.raises(ValueError, match="read: YYYY-MM-DD"):
        device_kit.read_image(undated)


def test_the_size_table_sums_the_wheels():
    built = [
        {"wheel": "a-1-py3-none-any.whl", "bytes": 3 * 2**20, "origin": "published", "pure": True},
        {"wheel": "b-2-cp312-x.whl", "bytes": 2**19, "origin": "published", "pure": False},
    ]
    lines = device_kit.table(built).splitlines()
    assert lines[2] == "| a-1-py3-none-any.whl | published, pure Python | 3.00 |"
    assert lines[3] == "| b-2-cp312-x.whl | published, binary | 0.50 |"
    assert lines[-1] == "| **2 wheels** | | **3.50** |"


# What the smoke run's stand-in image lacks: this environment's own packages play the image (the
# real image's numpy 2.5 needs Python 3.12, and CI runs 3.11), less these, which the kit must bring.
LACKING = ("deepspeed", "hydra-core", "omegaconf", "antlr4-python3-runtime", "pydantic")


def this_environment_as_an_image(path: Path) -> Path:
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = device_kit.canonical(dist.metadata["Name"])
        if name not in (*LACKING, "pydantic-core", "tepo"):
            pins.setdefault(name, dist.version)
    lines = ["# read: 2026-11-26", *(f"{n}=={v}" for n, v in sorted(pins.items()))]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_a_kit_built_and_installed_the_node_way_runs_the_node_script(tmp_path):
    """A kit from a real resolve, for this interpreter, against this environment as the image
    less a few packages; then scripts/device_check.sh with it: pip --target, the repository on the
    path, one gpu_check and the benchmark's smoke case on CPU ranks, at most 8 result files."""
    kit = tmp_path / "kit"
    image = this_environment_as_an_image(tmp_path / "image.txt")
    build = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "device_kit.sh"),
            "--python",
            sys.executable,
            "--image",
            str(image),
            "--out",
            str(kit),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    manifest = json.loads((kit / "kit.json").read_text())
    names = {e["name"]: e for e in manifest["kit"]}
    assert sorted(names) == sorted([*LACKING, "pydantic-core"])
    assert manifest["kit_mib"] <= 40 and "limit 40.0 MiB" in build.stdout
    assert names["deepspeed"]["origin"] == "built here from sdist" and names["deepspeed"]["pure"]
    assert names["antlr4-python3-runtime"]["version"] == "4.9.3"  # hydra's, built from sdist
    assert not names["pydantic-core"]["pure"]  # a published binary wheel
    assert len(list(kit.glob("*.whl"))) == len(names)  # one version of each
    # The tiny model's tokenizer travels with the wheels (the GGUF that holds it cannot).
    assert (kit / "tokenizer" / "tokenizer.json").is_file() and manifest["tokenizer_mib"] > 3
    out, scratch_root = tmp_path / "out", tmp_path / "tmp"
    scratch_root.mkdir()
    environ = {
        **os.environ,
        "TMPDIR": str(scratch_root),  # the script's scratch goes here, and is gone after
        "PYTHON": sys.executable,
        "KIT": str(kit),
        "GPU_CHECK_ARGS": "--device cpu --model tiny --only zero2 --steps 1",
        "BENCH_ARGS": "--smoke",
    }
    check = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_check.sh"), str(out), "600"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=900,
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "bench_logprob.json",
        "bench_logprob.md",
        "environment.txt",
        "gpu_check.json",
        "gpu_check.md",
        "logs.tar.gz",
        "pip-check.txt",
    ]
    rows = json.loads((out / "gpu_check.json").read_text())["checks"]
    assert [(r["label"], r["verdict"]) for r in rows] == [("zero2@1", "pass")]
    verdict = (out / "gpu_check.md").read_text()
    assert "| zero2@1 | pass |" in verdict
    cuda_tests = "CUDA tests (pytest tests/test_packing.py tests/test_kernels.py -k cuda)"
    assert f"{cuda_tests}: 3 skipped" in verdict  # no GPU here
    bench = json.loads((out / "bench_logprob.json").read_text())
    assert {r["backend"] for r in bench["results"]} == {"naive", "torch"}
    assert all(r["fwdbwd_ms"] > 0 for r in bench["results"])
    environment = (out / "environment.txt").read_text()
    assert "deepspeed==" in environment and "torch==" in environment
    assert not list(scratch_root.glob("tepo-device-check.*"))  # the installed kit and runs removed
