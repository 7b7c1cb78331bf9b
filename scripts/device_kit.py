"""Wheels that let tepo run on a GPU node that reaches no package index and takes a small transfer.

    bash scripts/device_kit.sh                 # resolve, build the kit into .device-kit/, check size
    bash scripts/device_kit.sh --prove docs/results/device_kit   # then prove it (prove())

CPython 3.12 resolves tepo's dependencies with the image's versions pinned
(scripts/devicekit/image_packages.txt); the kit is the wheels of what the image lacks, plus the
embedded model's tokenizer, at most --limit-mib (the repository and kit share a 64 MiB transfer).
scripts/device_check.sh is the node's side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGE_PACKAGES = REPO / "scripts" / "devicekit" / "image_packages.txt"
KIT = REPO / ".device-kit"
MIB = 2**20


def canonical(name: str) -> str:
    """A distribution's name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image(path: Path) -> tuple[dict[str, str | None], str]:
    """The image's packages (canonical name -> version, None where not read) and the date read."""
    packages: dict[str, str | None] = {}
    read = ""
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("# read:"):
            read = text.split(":", 1)[1].strip()
        if not text or text.startswith("#"):
            continue
        name, _, version = text.partition("==")
        packages[canonical(name)] = version.strip() or None
    if not read:
        raise ValueError(f"{path}: no '# read: YYYY-MM-DD' line says when the list was read")
    return packages, read


def plan(report: dict, image: dict[str, str | None]) -> tuple[list[dict], list[dict]]:
    """Split a pip installation report into the kit (not in the image) and the image's side,
    each item {name, version, url}; tepo itself is neither (it travels as the repository)."""
    kit: list[dict] = []
    image_side: list[dict] = []
    for item in report["install"]:
        metadata = item["metadata"]
        name = canonical(metadata["name"])
        if name == "tepo":
            continue
        entry = {
            "name": name,
            "version": metadata["version"],
            "url": item["download_info"]["url"],
        }
        (image_side if name in image else kit).append(entry)
    mismatched = [
        f"{e['name']} {e['version']} (image: {image[e['name']]})"
        for e in image_side
        if image[e["name"]] is not None and image[e["name"]] != e["version"]
    ]
    if mismatched:
        raise ValueError(
            "the resolve moved image packages off their pinned versions: " + ", ".join(mismatched)
        )
    return sorted(kit, key=lambda e: e["name"]), sorted(image_side, key=lambda e: e["name"])


def python312(explicit: str | None) -> str:
    """The interpreter that resolves and builds: the one named (any version: CI builds a kit for
    its own Python to smoke-run the node's script), else a CPython 3.12, the image's."""
    if explicit:
        return explicit
    candidates = [shutil.which("python3.12") or ""]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    raise SystemExit(
        "device_kit: no CPython 3.12 here (tried python3.12 on PATH and ~/.pyenv/versions/3.12*). "
        "The GPU image runs Python 3.12, so its kit is resolved and built with 3.12: install it "
        "(pyenv install 3.12, or your distribution's python3.12) or name one with --python PATH."
    )


def resolve(python: str, image: dict[str, str | None], work: Path) -> dict:
    pins = work / "image-pins.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in sorted(image.items()) if v is not None))
    report = work / "resolve.json"
    subprocess.run(
        [
            python,
            *("-m", "pip", "install", "--dry-run", "--ignore-installed", "-qq"),
            *("--report", str(report), "-c", str(pins), str(REPO)),
        ],
        check=True,
    )
    return json.loads(report.read_text())


def build(python: str, kit: list[dict], into: Path) -> list[dict]:
    """One wheel per kit item into `into`; returns the items with their wheel, size and origin."""
    requirements = into / "requirements.txt"
    requirements.write_text("".join(f"{e['name']}=={e['version']}\n" for e in kit))
    wheel = [python, "-m", "pip", "wheel", "--no-deps", "-qq", "-w", str(into)]
    subprocess.run([*wheel, "-r", str(requirements)], check=True)
    wheels = {canonical(w.name.split("-")[0]): w for w in into.glob("*.whl")}
    built = []
    for entry in kit:
        wheel = wheels.get(entry["name"])
        if wheel is None:
            raise SystemExit(f"device_kit: pip wheel produced no wheel for {entry['name']}")
        origin = "built here from sdist" if not entry["url"].endswith(".whl") else "published"
        tag = wheel.stem.split("-")[-1]
        built.append(
            {
                **entry,
                "wheel": wheel.name,
                "bytes": wheel.stat().st_size,
                "origin": origin,
                "pure": tag == "any",
            }
        )
    extra = sorted(set(wheels) - {e["name"] for e in kit})
    if extra:
        raise SystemExit(f"device_kit: unexpected wheels beside the plan: {', '.join(extra)}")
    return built


# Run by the interpreter running this script, which has tepo installed (`make install`): the
# tokenizer `model=tiny` takes, from the embedded model's cached conversion.
SAVE_TOKENIZER = """
import sys
from tepo_cli.config.schema import ModelConfig
from tepo_cli.models.loading import load_tokenizer
tiny = ModelConfig.model_validate({"name": "tiny", "source": "tiny", "tokenizer": "smollm2_135m"})
load_tokenizer(tiny).save_pretrained(sys.argv[1])
"""


def save_tokenizer(into: Path) -> int:
    """The tiny model's tokenizer into `into`; returns its size in bytes."""
    subprocess.run([sys.executable, "-c", SAVE_TOKENIZER, str(into)], check=True)
    return sum(p.stat().st_size for p in into.iterdir())


def table(built: list[dict], tokenizer_bytes: int = 0) -> str:
    lines = ["| wheel | origin | MiB |", "|---|---|---|"]
    for entry in sorted(built, key=lambda e: -e["bytes"]):
        kind = "pure Python" if entry["pure"] else "binary"
        lines.append(
            f"| {entry['wheel']} | {entry['origin']}, {kind} | {entry['bytes'] / MIB:.2f} |"
        )
    if tokenizer_bytes:
        lines.append(f"| tokenizer/ | the tiny model's (SmolLM2's) | {tokenizer_bytes / MIB:.2f} |")
    total = sum(e["bytes"] for e in built) + tokenizer_bytes
    lines.append(
        f"| **{len(built)} wheels{' + tokenizer' * bool(tokenizer_bytes)}** | | **{total / MIB:.2f}** |"
    )
    return "\n".join(lines) + "\n"


def make_kit(args: argparse.Namespace) -> dict:
    image, read = read_image(args.image)
    python = python312(args.python)
    with tempfile.TemporaryDirectory(prefix="tepo-kit-") as scratch:
        work = Path(scratch)
        report = resolve(python, image, work)
        kit, image_side = plan(report, image)
        staged = work / "kit"
        staged.mkdir()
        built = build(python, kit, staged)
        (staged / "requirements.txt").unlink()
        tokenizer_bytes = save_tokenizer(staged / "tokenizer")
        total = sum(e["bytes"] for e in built) + tokenizer_bytes
        manifest = {
            "python": subprocess.check_output([python, "--version"], text=True).strip(),
            "image_packages": str(args.image),
            "image_read": read,
            "kit": built,
            "tokenizer_mib": round(tokenizer_bytes / MIB, 2),
            "kit_mib": round(total / MIB, 2),
            "image_side": image_side,
        }
        (staged / "kit.json").write_text(json.dumps(manifest, indent=1) + "\n")
        (staged / "kit.md").write_text(table(built, tokenizer_bytes))
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.copytree(staged, args.out)
    print(table(built, tokenizer_bytes))
    print(
        f"device_kit: {len(built)} wheels and the tiny model's tokenizer "
        f"({tokenizer_bytes / MIB:.2f} MiB), {total / MIB:.2f} MiB in {args.out} "
        f"(limit {args.limit_mib} MiB); the image ({read}) provides {len(image_side)} more"
    )
    if total > args.limit_mib * MIB:
        largest = ", ".join(
            f"{e['wheel']} ({e['bytes'] / MIB:.1f} MiB)"
            for e in sorted(built, key=lambda e: -e["bytes"])[:3]
        )
        raise SystemExit(
            f"device_kit: the kit is {total / MIB:.2f} MiB, over the {args.limit_mib} MiB limit "
            f"(the repository and the kit travel in one 64 MiB transfer). Largest: {largest}."
        )
    return manifest


def prove(args: argparse.Namespace, manifest: dict) -> int:
    """The image's versions plus the kit alone run gpu_check on CPU ranks."""
    python = python312(args.python)
    venv = args.image_venv
    stamp = venv / "image-side.txt"
    wanted = "".join(f"{e['name']}=={e['version']}\n" for e in manifest["image_side"])
    if not stamp.exists() or stamp.read_text() != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        requirements = venv / "requirements.txt"
        requirements.write_text(wanted)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-cache-dir"]
        subprocess.run([*pip, "--no-deps", "-r", str(requirements)], check=True)
        stamp.write_text(wanted)
    # the kit installed and the runs made for this proof only: removed when it ends
    with (
        tempfile.TemporaryDirectory(prefix="tepo-kit-site-") as site_dir,
        tempfile.TemporaryDirectory(prefix="tepo-kit-runs-") as runs_dir,
    ):
        site, runs = Path(site_dir), Path(runs_dir)
        wheels = sorted(str(w) for w in args.out.glob("*.whl"))
        python_image = str(venv / "bin" / "python")
        install = [python_image, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        subprocess.run([*install, "--no-compile", "--target", str(site), *wheels], check=True)
        environ = {**os.environ, "PYTHONPATH": f"{site}:{REPO}", "PYTHONUNBUFFERED": "1"}
        environ.pop("VIRTUAL_ENV", None)
        environ["PATH"] = f"{venv / 'bin'}:{environ.get('PATH', '')}"
        results = args.prove
        results.mkdir(parents=True, exist_ok=True)
        check = subprocess.run(
            [python_image, "-m", "pip", "check"], env=environ, capture_output=True, text=True
        )
        (results / "pip-check.txt").write_text(check.stdout + check.stderr)
        versions = subprocess.check_output(
            [python_image, "-c", VERSIONS], env=environ, text=True, cwd=site
        )
        script = str(REPO / "scripts" / "gpu_check.py")
        gpu_check = [python_image, script, "--device", "cpu", "--model", "tiny"]
        gpu_check += ["--tokenizer", str(args.out / "tokenizer"), "--out", str(runs)]
        gpu_check += ["--markdown", str(results / "gpu_check.md")]
        proved = subprocess.run(gpu_check, env=environ, cwd=REPO)
        shutil.copy(runs / "gpu_check.json", results / "gpu_check.json")
        shutil.copy(args.out / "kit.md", results / "kit.md")
        versions = versions.replace(str(site), "<kit's --target>")
        (results / "environment.txt").write_text(versions.replace(str(venv), "<image venv>"))
        print(
            f"device_kit --prove: pip check exit {check.returncode}; gpu_check exit "
            f"{proved.returncode}; results in {results}"
        )
        return proved.returncode or check.returncode


# What the proving environment imports, and from where (the image's side or the kit).
VERSIONS = """
import importlib, sys
print(sys.version.split()[0])
for name in ("torch", "transformers", "accelerate", "peft", "deepspeed", "hydra", "pydantic"):
    module = importlib.import_module(name)
    print(name, module.__version__, module.__file__)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=KIT, help="the kit's folder (git-ignored)")
    parser.add_argument("--image", type=Path, default=IMAGE_PACKAGES)
    parser.add_argument("--python", help="the interpreter to build for (default: a CPython 3.12)")
    parser.add_argument("--limit-mib", type=float, default=40.0)
    parser.add_argument("--prove", type=Path, help="results folder of the proof (see above)")
    parser.add_argument(
        "--image-venv",
        type=Path,
        default=Path(os.environ.get("TEPO_CACHE", Path.home() / ".cache" / "tepo"))
        / "device-kit-image-venv",
        help="the image-versions environment --prove builds once and reuses",
    )
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.image = args.image.resolve()
    manifest = make_kit(args)
    if args.prove:
        return prove(args, manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
