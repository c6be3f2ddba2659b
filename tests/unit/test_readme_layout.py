"""The README's Layout is checked against the tree: every package of mc_queue is listed with its layer
(tests/unit/test_layers.py's LAYERS) and every module of it by name, and nothing is listed that is not there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_layers import LAYERS, PKG

README = Path(__file__).resolve().parents[2] / "README.md"
ENTRY = re.compile(r"^ {1,2}(\d+) ([a-z_]+)/\s")


def layout_entries() -> dict[str, tuple[int, str]]:
    """package -> (layer, its text) from the README's Layout block."""
    text = README.read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    entries: dict[str, tuple[int, str]] = {}
    current = None
    for line in block.splitlines():
        m = ENTRY.match(line)
        if m:
            current = m.group(2)
            entries[current] = (int(m.group(1)), line[m.end():])
        elif current and line.startswith("      "):
            layer, body = entries[current]
            entries[current] = (layer, body + " " + line.strip())
        else:
            current = None
    return entries


def modules_of(package: str) -> set[str]:
    here = PKG / package
    return ({p.name for p in here.glob("*.py") if p.name != "__init__.py"}
            | {p.name + "/" for p in here.iterdir() if (p / "__init__.py").is_file()})


def test_every_package_is_listed_with_its_layer() -> None:
    entries = layout_entries()
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert set(entries) == packages, sorted(set(entries) ^ packages)
    wrong = {p: (layer, LAYERS[p]) for p, (layer, _) in entries.items() if layer != LAYERS[p]}
    assert wrong == {}, f"README layer vs tests/unit/test_layers.py: {wrong}"


def test_every_module_is_named_and_nothing_else() -> None:
    for package, (_, body) in layout_entries().items():
        named = set(re.findall(r"\b([a-z_]+\.py)\b", body)) | set(re.findall(r"\b([a-z_]+/)", body))
        actual = modules_of(package)
        assert actual <= named, f"{package}/: not in the README's Layout: {sorted(actual - named)}"
        assert named <= actual, f"{package}/: in the README's Layout but not in the tree: {sorted(named - actual)}"
