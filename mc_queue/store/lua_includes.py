"""A script's shared helpers, only those it uses: ``--@include name`` lines replaced by the top-level
definitions of ``lua/includes/<name>.lua`` that the script reaches, in their order.

Redis runs a script's whole text at every call, and every ``local function`` and table of an include is
built again each time, used or not: the helpers of ``common.lua`` alone cost about 70,000 redis-server
instructions per call (callgrind, 2026-12-05), more than a tenth of a claim. An include is a sequence of
top-level statements, each starting at column 0 (``local function f``, ``local NAME = ...``, or other
code); a definition is kept when the script's own text, or a kept statement, names it (comments and strings
left out; a field name that happens to match keeps a helper it does not need, never the other way round).
Statements that define nothing are always kept. Kept statements stay in their order, so a helper still
sees only the locals defined before it, as in the full text.
"""

from __future__ import annotations

import re

_STATEMENT_START = re.compile(r"^(?![\s)}]|end\b|else\b|elseif\b|until\b)\S", re.M)
_DEFINES = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?:=|$))")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_NOISE = re.compile(r"--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"",
                    re.S)
INCLUDE_LINE = re.compile(r"^--@include\s+(\w+)\s*$", re.M)


def code(text: str) -> str:
    """The text without its comments and string literals."""
    return _NOISE.sub(" ", text)


def statements(text: str) -> list[tuple[frozenset[str], str, frozenset[str]]]:
    """(names it defines, its text, the identifiers its code uses) of each top-level statement."""
    starts = [m.start() for m in _STATEMENT_START.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    out = []
    for begin, end in zip(starts, [*starts[1:], len(text)], strict=True):
        chunk = text[begin:end]
        m = _DEFINES.match(chunk)
        names = frozenset() if m is None else frozenset(
            [m.group(1)] if m.group(1) else [n.strip() for n in m.group(2).split(",")])
        out.append((names, chunk, frozenset(_IDENT.findall(code(chunk)))))
    return out


def shaken(text: str, includes: dict[str, str]) -> str:
    """``text`` (a script) with its ``--@include`` lines replaced by what it uses of those includes, in the
    order of the lines (the first line gets it all; the others are dropped). KeyError: an unknown include."""
    names = INCLUDE_LINE.findall(text)
    if not names:
        return text
    stmts = [s for name in names for s in statements(includes[name])]
    defined = {n for names_, _, _ in stmts for n in names_}
    wanted = set(_IDENT.findall(code(INCLUDE_LINE.sub("", text)))) & defined
    for names_, _, used in stmts:
        if not names_ and used:  # code that defines nothing runs whatever the script uses
            wanted |= used & defined
    by_name = {n: used for names_, _, used in stmts for n in names_}
    todo = list(wanted)
    while todo:
        for dep in by_name[todo.pop()] & defined:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    kept = "".join(chunk for names_, chunk, used in stmts
                   if (names_ & wanted) or (not names_ and used))
    first = True

    def place(_: re.Match[str]) -> str:
        nonlocal first
        was, first = first, False
        return kept.rstrip("\n") if was else ""

    return INCLUDE_LINE.sub(place, text)
