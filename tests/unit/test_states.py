"""The state table in mc_queue.contracts.states against the Lua scripts (static) and the README (rendered)."""

from __future__ import annotations

import re
from pathlib import Path

from mc_queue.contracts.states import ATTEMPT_STATES, TASK_STATES, TRANSITIONS, render_markdown
from mc_queue.store.scripts import lua_dir, specs

LUA = lua_dir()
README = Path(__file__).resolve().parents[2] / "README.md"


def _body(name: str) -> str:
    lines = (LUA / f"{name}.lua").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("--"))


def _helper(name: str) -> str:
    src = "\n".join(p.read_text() for p in sorted((LUA / "includes").glob("*.lua")))
    m = re.search(rf"^local function {name}\(.*?^end$", src, re.M | re.S)
    assert m, name
    return m.group(0)


def written_states(src: str) -> dict[str, set[str]]:
    """State literals a piece of Lua writes: {'task': {...}, 'attempt': {...}}; '?' for a computed one."""
    out: dict[str, set[str]] = {"task": set(), "attempt": set()}
    for m in re.finditer(r"redis\.call\('HSET', K\.task,([^)]*)\)", src, re.S):
        for v in re.findall(r"'state',\s*([^,\s)]+)", m.group(1)):
            out["task"].add(v.strip("'") if v.startswith("'") else "?")
    for v in re.findall(r"aset\(K\.(?:attempts|task),\s*\w+,\s*\{'state',\s*([^,\s}]+)", src):
        out["attempt"].add(v.strip("'") if v.startswith("'") else "?")
    return out


def test_every_state_in_the_table_is_a_state_of_the_models() -> None:
    for e in TRANSITIONS:
        states = TASK_STATES if e.entity == "task" else ATTEMPT_STATES
        assert e.src in (*states, ""), e
        assert e.dst in (*states, ""), e
        assert e.script in specs(), f"{e}: no lua/{e.script}.lua"
        assert e.actor, e


def test_every_literal_state_a_script_writes_is_a_listed_edge_of_that_script() -> None:
    decides = {n for n in specs() if re.search(r"\bapply_decision\(", _body(n))}
    assert decides == {"fail", "reconcile_settle"}
    helper = written_states(_helper("apply_decision"))
    admits = written_states(_helper("enqueue_write"))  # a new task (its state computed) and its Attempt 1
    writers = set()
    for name in specs():
        found = written_states(_body(name))
        if name in decides:
            for entity in found:
                found[entity] |= helper[entity]
        if re.search(r"\benqueue_write\(", _body(name)):
            for entity in found:
                found[entity] |= admits[entity] | ({"?"} if entity == "task" else set())
        if re.search(r"redis\.call\('DEL', K\.task", _body(name)) and name != "pack":
            found["task"].add("")  # pack writes the hash anew in the same script, its state unchanged
        for entity, states in found.items():
            if name == "pack":
                states = states - {"?"}  # pack writes back the state it read (a succeeded or canceled task)
            dsts = {e.dst for e in TRANSITIONS if e.entity == entity and e.script == name}
            for state in states - {"?"}:
                assert state in dsts, f"{name}.lua writes {entity} state {state!r}, which the table does not list"
            if states:
                writers.add(name)
            if "?" in states:  # a computed state: the table must list where it can go (checked live)
                assert dsts, f"{name}.lua writes a computed {entity} state but the table lists no edge"
    listed = {e.script for e in TRANSITIONS}
    assert writers == listed, f"scripts that write states {sorted(writers)} vs listed {sorted(listed)}"


def test_the_readme_shows_the_table_rendered_from_the_code() -> None:
    text = README.read_text()
    m = re.search(r"<!-- states:begin -->\n(.*?)<!-- states:end -->", text, re.S)
    assert m, "README.md has no <!-- states:begin --> ... <!-- states:end --> section"
    assert m.group(1) == render_markdown(), (
        "the README's state table is not the one mc_queue.contracts.states renders; paste this:\n" + render_markdown())
