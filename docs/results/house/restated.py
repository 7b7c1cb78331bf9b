"""`python restated.py CHECKOUT`: the places in CHECKOUT/tepo_cli that restate the objective tensors.

A place is a class's annotated fields, a function's parameters, a literal tuple / list / set of
strings or a dict's string keys, or a call's keywords, that names at least two of entropy,
entropy_term and mtp_logp (each with or without the `old_` prefix): where the quartet
{logp, entropy, entropy_term, mtp_logp} is carried by name (code review 2026-11-28, §4 item 1).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

NAMES = {"entropy", "entropy_term", "mtp_logp"}


def named(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ClassDef):
        return [
            s.target.id
            for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        ]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant)]
    if isinstance(node, ast.Call):
        return [k.arg for k in node.keywords if k.arg]
    return []


def main(root: Path) -> None:
    found = []
    for path in sorted((root / "tepo_cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = {n.removeprefix("old_") for n in named(node) if isinstance(n, str)}
            if len(names & NAMES) >= 2:
                found.append(f"{path.relative_to(root)}:{node.lineno} {type(node).__name__}")
    print("\n".join(found))
    print(len(found), "places")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
