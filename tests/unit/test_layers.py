"""The house: rooms with one job each, arrows pointing down, no circles, no private reach.

Each module of mc_queue has a layer; a module may import only modules of its own layer or below
(function-level imports included), the import graph has no cycle, and no module reads another
object's private attribute (``other._x``). The README's Layout section says the same in words.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mc_queue

PKG = Path(mc_queue.__file__).resolve().parent

LAYERS: dict[str, int] = {
    # 0. contracts: keys, records, errors, the script runner, the state table, the namespace memory
    "errors": 0, "keys": 0, "codec": 0, "models": 0, "config": 0, "failures": 0, "scripts": 0,
    "states": 0, "namespace": 0, "embedded": 0, "urls": 0, "lineage": 0, "failpoints": 0,
    "packing": 0,
    # 1. the typed contract calls
    "client": 1, "connection": 1, "archive": 1,
    # 2. policy, effects, reconciliation, recovery
    "policy": 2, "effects": 2, "reconcile": 2, "recovery": 2,
    # 3. producer side (App, dispatch) and consumer side (Context, heartbeats, workspaces)
    "transport": 3, "producer": 3, "app": 3, "context": 3, "workspace": 3,
    # 4. the RQ worker
    "worker": 4,
    # 5. operations on top of the contracts: sweeper, metrics, rendering, test helpers, providers
    "sweeper": 5, "metrics": 5, "render": 5, "testing": 5, "providers": 5,
    # 6. the package's public API; 7. an application built on it; 8. the demos that run that
    # application; 9. the command line, which can start any of them
    "__init__": 6, "examples": 7, "demo": 8, "factory_demo": 8, "fleet": 8, "cli": 9, "__main__": 9, "console": 9,
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    return ".".join(rel.parts)


def room(name: str) -> str:
    return name.split(".")[0]


def imports_of(path: Path) -> set[str]:
    """mc_queue modules a file imports (relative or absolute, at any depth)."""
    tree = ast.parse(path.read_text())
    here = module_name(path).split(".")
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                target = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.startswith("mc_queue"):
                target = node.module.removeprefix("mc_queue").lstrip(".")
            else:
                continue
            if not target:  # "from . import x" or "from mc_queue import x": a submodule, else the package
                out.update(a.name if (PKG / a.name).exists() or (PKG / f"{a.name}.py").exists() else "__init__"
                           for a in node.names)
            else:
                out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("mc_queue.") for a in node.names if a.name.startswith("mc_queue."))
    return {t for t in out if t}


FILES = sorted(PKG.rglob("*.py"))
GRAPH = {module_name(p): imports_of(p) for p in FILES}


def test_every_module_has_a_layer() -> None:
    assert {room(m) for m in GRAPH} <= set(LAYERS), sorted({room(m) for m in GRAPH} - set(LAYERS))


def test_arrows_point_down() -> None:
    up = [(m, t) for m, targets in GRAPH.items() for t in targets
          if room(t) != room(m) and LAYERS[room(t)] > LAYERS[room(m)]]
    assert up == [], f"imports that point up: {up}"


def test_no_circle_between_rooms() -> None:
    edges = {room(m): set() for m in GRAPH}
    for m, targets in GRAPH.items():
        edges[room(m)] |= {room(t) for t in targets if room(t) != room(m)}
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if seen.get(node) == 1:
            raise AssertionError(f"a circle: {' -> '.join([*path, node])}")
        if seen.get(node) == 2:
            return
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, [*path, node])
        seen[node] = 2

    for node in sorted(edges):
        visit(node, [])


def test_no_module_reads_another_object_s_private_attributes() -> None:
    found = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                found.append(f"{path.relative_to(PKG)}:{node.lineno} .{node.attr}")
    allowed = {"testing.py"}  # ForgeServer's request handler class is ForgeServer's own inner room
    found = [f for f in found if f.split(":")[0] not in allowed and "._exit" not in f]
    assert found == [], found
