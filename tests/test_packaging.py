"""The Hydra config tree ships inside the wheel: a wheel installed elsewhere finds conf/."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def run(*command: str | Path, cwd: Path) -> str:
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def test_wheel_installed_elsewhere_composes_configs(tmp_path):
    dist = tmp_path / "dist"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        dist,
        ROOT,
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("tepo-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
        ).strip()
    )
    # Dependencies come from this environment's site-packages (a plain path entry, so its editable
    # tepo finder is not activated); tepo itself only from the wheel.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=tmp_path,
    )
    location = run(python, "-c", "import tepo_cli; print(tepo_cli.__file__)", cwd=tmp_path)
    assert location.startswith(str(venv)), location
    job = run(venv / "bin" / "tepo", "train", "algo.eps_high=0.28", "--cfg", "job", cwd=tmp_path)
    assert "eps_high: 0.28" in job and "name: smollm2_135m" in job
    # recipes/ ships as the `recipe` config group (conf/recipe links to it); the command line wins.
    recipe = run(
        venv / "bin" / "tepo",
        "train",
        "recipe=dapo_math",
        "trainer.lr=3e-6",
        "--cfg",
        "job",
        cwd=tmp_path,
    )
    assert "name: dapo" in recipe and "path: Qwen/Qwen2.5-32B" in recipe and "lr: 3.0e-06" in recipe
    launcher = run(
        venv / "bin" / "tepo", "train", "hydra/launcher=slurm", "--cfg", "hydra", cwd=tmp_path
    )
    assert "SlurmLauncher" in launcher and "timeout_min: 720" in launcher
    groups = run(
        python,
        "-c",
        "from tepo_cli.config.overrides import config_groups; print(sorted(config_groups()))",
        cwd=tmp_path,
    )
    assert "'algo'" in groups and "'deepspeed'" in groups and "'recipe'" in groups
