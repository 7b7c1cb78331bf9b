"""docs/patches.md lists every module that patches a library: a scan of tepo_cli/ for
assignments to an attribute of a third-party module or class (and `setattr` on one) finds none
outside the modules the page names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tepo_cli"
PAGE = ROOT / "docs" / "patches.md"
LIBRARIES = ("torch", "transformers", "vllm", "deepspeed", "peft")


def _library(name: str) -> bool:
    return name.split(".")[0] in LIBRARIES


def _names_a_library(node: ast.AST) -> bool:
    """`importlib.import_module("deepspeed.comm.torch")`, `sys.modules.get("torch...")`, ..."""
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and _library(n.value)
        for n in ast.walk(node)
        if not isinstance(node, ast.Constant)
    ) and any(isinstance(n, ast.Call) for n in ast.walk(node))


def _bound_libraries(tree: ast.AST) -> set[str]:
    """Names a module binds to a library's modules or classes (anywhere in the file)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _library(alias.name):
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and _library(node.module):
            bound.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Assign) and _names_a_library(node.value):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return bound


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        flat: list[ast.AST] = []
        for target in node.targets:
            flat += list(target.elts) if isinstance(target, (ast.Tuple, ast.List)) else [target]
        return flat
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def patches(source: str) -> list[tuple[int, str]]:
    """(line, what) for each assignment to a library's attribute or item, each setattr on one."""
    tree = ast.parse(source)
    bound = _bound_libraries(tree)
    found = []
    for node in ast.walk(tree):
        for target in _targets(node):
            if isinstance(target, (ast.Attribute, ast.Subscript)) and _root(target) in bound:
                found.append((node.lineno, ast.unparse(target)))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and _root(node.args[0]) in bound
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def listed_modules() -> set[str]:
    """The modules docs/patches.md names, as paths under tepo_cli/."""
    paths = re.findall(r"`((?:tepo_cli/)?[\w/]+\.py)`", PAGE.read_text(encoding="utf-8"))
    return {path.removeprefix("tepo_cli/") for path in paths if not path.startswith("tests/")}


def test_every_module_that_patches_a_library_is_on_the_page():
    listed = listed_modules()
    unlisted = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        found = patches(path.read_text(encoding="utf-8"))
        if found and name not in listed:
            unlisted[name] = found
    assert unlisted == {}, f"patches outside the modules docs/patches.md lists: {unlisted}"


def test_the_page_names_the_modules_that_exist():
    missing = sorted(name for name in listed_modules() if not (PACKAGE / name).is_file())
    assert missing == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch\ntorch.set_num_threads = f\n", [(2, "torch.set_num_threads")]),
        (
            "import torch.distributed as dist\ndist.destroy_process_group = f\n",
            [(2, "dist.destroy_process_group")],
        ),
        ("from transformers import Llama\nLlama.forward = f\n", [(2, "Llama.forward")]),
        ("import vllm\nsetattr(vllm.envs, 'X', 1)\n", [(2, "setattr(vllm.envs, 'X', 1)")]),
        (
            "import importlib\nm = importlib.import_module('deepspeed.comm')\nm.build = f\n",
            [(3, "m.build")],
        ),
        (
            "from transformers import REGISTRY\nREGISTRY['packed'] = f\n",
            [(2, "REGISTRY['packed']")],
        ),
        ("import torch\nx = torch.zeros(2)\nself.a = torch.ones(1)\nx.y = 1\n", []),
        ("import numpy\nnumpy.seterr = f\n", []),
    ],
)
def test_the_scan_finds_patches_and_only_patches(source, expected):
    assert patches(source) == expected
