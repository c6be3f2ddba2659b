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
    # The packages of mc_queue, bottom up (the README's Layout says the same in words):
    "contracts": 0,  # keys, records, errors, the state table, the codec, fail points
    "store": 1,  # URLs and connections, the embedded server, the script runner, namespace memory, lineage
    "client": 2,  # typed calls on the scripts, one class per role, the Client facade, connect()
    "policy": 3,  # failure classes and retry decisions, effects, reconciliation, recovery
    "producer": 4,  # App and handlers, enqueue, the RQ transport and dispatch
    "worker": 5,  # the RQ worker, the handler's Context, workspaces
    "ops": 6,  # sweeper, retention archive, metrics, rendering, the console
    "providers": 6,  # the shipped git and HTTP providers
    "testing": 7,  # real-process test helpers (servers, proxy, forge, recorder)
    "__init__": 8,  # the package's public API
    "examples": 9,  # an application built on that API
    "demo": 10,  # the demos and the fleet that run that application
    "cli": 11, "__main__": 11,  # the command line, which can start any of them
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
    allowed = {"testing/forge.py"}  # ForgeServer's request handler class is ForgeServer's own inner room
    found = [f for f in found if f.split(":")[0] not in allowed and "._exit" not in f]
    assert found == [], found


def test_the_tree_shows_the_layers() -> None:
    """``ls mc_queue`` is the architecture: every module lives in a layer's package, none loose."""
    loose = sorted(p.name for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert loose == [], f"modules outside a layer's package: {loose}"
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    layered = set(LAYERS) - {"__init__", "__main__"}
    assert packages == layered, sorted(packages ^ layered)
