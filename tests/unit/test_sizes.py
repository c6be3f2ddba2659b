"""No hub: no module of mc_queue over 600 lines, no class over 400 lines or 25 public methods.

The suite's summary prints the largest three of each (tests/conftest.py), so the figures stay in view
before they reach a limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mc_queue

PKG = Path(mc_queue.__file__).resolve().parent
MODULE_LINES = 600
CLASS_LINES = 400
CLASS_PUBLIC_METHODS = 25


def modules() -> list[tuple[int, str]]:
    """(lines, module path) of every module, largest first."""
    return sorted(((len(p.read_text().splitlines()), str(p.relative_to(PKG))) for p in PKG.rglob("*.py")),
                  reverse=True)


def classes() -> list[tuple[int, int, str]]:
    """(lines, public methods, module:class) of every class, largest first. Public: a def whose name has
    no leading underscore (properties included), defined in the class body itself."""
    out = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                public = sum(1 for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                             and not f.name.startswith("_"))
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                out.append((lines, public, f"{p.relative_to(PKG)}:{node.name}"))
    return sorted(out, reverse=True)


def summary() -> list[str]:
    """The largest three modules, classes by lines and classes by public methods, one line each."""
    by_methods = sorted(classes(), key=lambda c: (c[1], c[0]), reverse=True)
    return [
        f"largest modules (limit {MODULE_LINES} lines): " + ", ".join(f"{m} {n}" for n, m in modules()[:3]),
        f"largest classes (limit {CLASS_LINES} lines): " + ", ".join(f"{c} {n}" for n, _, c in classes()[:3]),
        f"most public methods (limit {CLASS_PUBLIC_METHODS}): " + ", ".join(f"{c} {k}" for _, k, c in by_methods[:3]),
    ]


def test_no_module_over_600_lines() -> None:
    over = [(n, m) for n, m in modules() if n > MODULE_LINES]
    assert over == [], f"modules over {MODULE_LINES} lines: {over}"


def test_no_class_over_400_lines_or_25_public_methods() -> None:
    over = [(n, k, c) for n, k, c in classes() if n > CLASS_LINES or k > CLASS_PUBLIC_METHODS]
    assert over == [], f"classes over {CLASS_LINES} lines or {CLASS_PUBLIC_METHODS} public methods: {over}"


def test_the_summary_names_three_of_each() -> None:
    lines = summary()
    assert len(lines) == 3 and all(line.count(",") == 2 for line in lines), lines
