"""Data flows one way: no two packages of tepo_cli import each other, directly or round a longer
loop. Every import counts — module-level, inside a function, under TYPE_CHECKING — so no cycle
can hide behind a late import. `tepo_cli/core` (shared records, errors, the run directory)
imports nothing of tepo_cli outside itself."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import tepo_cli

PACKAGE = Path(tepo_cli.__file__).parent


def package_of(module: str) -> str:
    """tepo_cli.train.recipe -> train; a top-level module (tepo_cli.cli) is its own node."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def import_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> where (file:line), from every tepo_cli import."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("tepo_cli", *path.relative_to(PACKAGE).with_suffix("").parts))
        source = package_of(module)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if not target.startswith("tepo_cli."):
                    continue
                imported = package_of(target)
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                if imported != source and where not in graph[source][imported]:
                    graph[source][imported].append(where)
    return graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_direct_and_longer_loops() -> None:
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "d": {"a"}}) == []


def test_the_import_walk_sees_the_packages_and_late_imports() -> None:
    graph = import_graph()
    assert {"train", "rollout", "eval", "data", "rewards", "algos"} <= set(graph)
    assert "core" in graph["train"] and "core" in graph["algos"]
    # train/train_job.py imports the rollout package inside train_job (late, to start fast): an edge
    assert any(w.startswith("tepo_cli/train/train_job.py:") for w in graph["train"]["rollout"])


def test_no_package_imports_another_that_imports_it_back() -> None:
    graph = import_graph()
    edges = {source: set(targets) for source, targets in graph.items()}
    loops = cycles(edges)
    detail = [
        f"{a} -> {b}: {', '.join(graph[a][b])}"
        for loop in loops
        for a in loop
        for b in loop
        if b in graph[a]
    ]
    assert loops == [], "\n".join(detail)


def test_core_imports_nothing_outside_core() -> None:
    assert set(import_graph()["core"]) == set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("tepo_cli", *parts))


def _top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top-level statements and those inside
    top-level try/if blocks, except under `if TYPE_CHECKING:` (never run)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                found += _top_level_imports(node.body) + _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _top_level_imports(block)
    return found


def module_import_graph() -> dict[str, set[str]]:
    """module -> the tepo_cli modules its import runs first (module-level imports only)."""
    modules = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif node.level == 0 and node.module:
                # `from a.b import c`: the module a.b.c when it is one, else a.b
                names = [
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in modules
                    else node.module
                    for alias in node.names
                ]
            else:
                continue
            targets |= {name for name in names if name in modules and name != module}
        graph[module] = targets
    return graph


def test_the_module_walk_sees_module_level_imports_only() -> None:
    graph = module_import_graph()
    assert "tepo_cli.train.update" in graph["tepo_cli.train.recipe"]
    # train_job.py imports the rollout back-ends inside train_job: not a module-level edge
    assert not any(m.startswith("tepo_cli.rollout") for m in graph["tepo_cli.train.train_job"])


def test_no_module_level_import_circle() -> None:
    """Inside a package too: a circle works only while every module in it imports the others
    lazily enough, and breaks on the first reordering."""
    loops = cycles(module_import_graph())
    assert loops == [], "\n".join(" <-> ".join(loop) for loop in loops)


MEASUREMENT = re.compile(
    r"~\s?\d"  # ~40 s, ~100x
    r"|\b\d+(?:\.\d+)?\s?(?:x|×)\s(?:faster|slower|less|more)\b"  # 7x faster
    r"|\btakes\s(?:about\s)?\d"  # takes 15 s
    r"|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\ss\sof\b"  # 1.5-2 s of every start
)


def test_no_docstring_quotes_a_measurement() -> None:
    """A docstring says why; the figures behind it go to docs/guides/performance.md ("Figures
    behind the code"), where they can be measured again instead of going stale in the code."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in [tree, *ast.walk(tree)]:
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                continue
            for line in (ast.get_docstring(node) or "").splitlines():
                if MEASUREMENT.search(line):
                    found.append(f"{path.relative_to(PACKAGE.parent)}: {line.strip()}")
    assert found == [], "\n".join(found)


def test_the_measurement_pattern_catches_the_usual_forms() -> None:
    for text in ("building it takes ~40 s", "about 7x faster in TF32", "1.5-2 s of every start"):
        assert MEASUREMENT.search(text), text
    for text in ("a 95 % confidence interval", "default 10 s", "32 MiB", "2 (1.96 + 0.84)"):
        assert not MEASUREMENT.search(text), text


CITED_FILE = re.compile(
    r"(?<![\w./-])((?:tepo_cli|docs|scripts|tests|conf|recipes)/[\w/.-]+\.(?:py|md|yaml|sh))\b"
)
SHORT_CITE = re.compile(
    r"(?<![\w./-])((?:"
    + "|".join(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_"))
    + r")/[\w/-]+\.py)\b"
)


def test_the_code_cites_only_files_in_the_repository() -> None:
    """Every `tepo_cli/…`, `docs/…`, `scripts/…` path (and a package-relative `train/update.py`)
    in the code names a file that exists: a moved module or page is caught where it is cited."""
    root = PACKAGE.parent
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        cited = {m.group(1) for m in CITED_FILE.finditer(text)}
        cited |= {f"tepo_cli/{m.group(1)}" for m in SHORT_CITE.finditer(text)}
        missing += [
            f"{path.relative_to(root)} cites {c}" for c in sorted(cited) if not (root / c).exists()
        ]
    assert missing == [], "\n".join(missing)


def shared_file_names(paths: list[Path]) -> dict[str, list[str]]:
    """Name -> the modules and packages that have it, for each name two or more share: a module's
    file name (`__init__.py` and `__main__.py` aside: a package's own files, whose name says
    nothing), or a module named as a package is (`core/rollout.py` beside `rollout/`)."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(paths):
        if path.name in ("__init__.py", "__main__.py"):
            if path.name == "__init__.py" and path.parent != PACKAGE:
                where[path.parent.name].append(path.parent.relative_to(PACKAGE.parent).as_posix())
        else:
            where[path.stem].append(path.relative_to(PACKAGE.parent).as_posix())
    return {name: found for name, found in where.items() if len(found) > 1}


def test_the_name_check_finds_a_shared_file_name() -> None:
    made = [PACKAGE / "a" / "records.py", PACKAGE / "b" / "records.py", PACKAGE / "b" / "x.py"]
    made += [PACKAGE / "a" / "__init__.py", PACKAGE / "b" / "__init__.py", PACKAGE / "__init__.py"]
    made += [PACKAGE / "b" / "a.py", PACKAGE / "b" / "__main__.py", PACKAGE / "__main__.py"]
    assert shared_file_names(made) == {
        "records": ["tepo_cli/a/records.py", "tepo_cli/b/records.py"],
        "a": ["tepo_cli/a", "tepo_cli/b/a.py"],
    }
    assert shared_file_names(made[2:]) == {"a": ["tepo_cli/a", "tepo_cli/b/a.py"]}


def test_no_two_modules_share_a_file_name() -> None:
    """A file name says which module it is: `records.py` in three packages made every mention of
    "records.py" (in docs, reviews, tracebacks) ambiguous."""
    shared = shared_file_names(list(PACKAGE.rglob("*.py")))
    assert shared == {}, "\n".join(f"{name}: {', '.join(found)}" for name, found in shared.items())


LONGEST_FUNCTION = 60  # lines, decorators aside: a function that does one thing reads on a screen


def long_functions(source: str, limit: int = LONGEST_FUNCTION) -> dict[str, int]:
    """The functions (methods and nested ones too) of `source` longer than `limit` lines."""
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    }


def test_the_length_check_counts_a_function_s_lines() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert long_functions(f"def short():\n{body}") == {}  # 60 lines: at the limit
    assert long_functions(f"def long():\n{body}    y = 0\n") == {"long": 61}
    method = "".join(f"    {line}\n" for line in f"def long(self):\n{body}    y = 0".splitlines())
    assert long_functions(f"class A:\n{method}") == {"long": 61}


def test_no_function_is_longer_than_60_lines() -> None:
    found = {
        f"{path.relative_to(PACKAGE.parent).as_posix()}:{name}": lines
        for path in PACKAGE.rglob("*.py")
        for name, lines in long_functions(path.read_text()).items()
    }
    assert found == {}, f"split these (lines): {found}"
