"""A script carries only the helpers it uses (mc_queue.store.lua_includes): what it names, and what those
name, in their order; code that defines nothing always; comments never. Every statement of every include
compiles on its own (the split falls between statements), and every script as loaded compiles."""

from __future__ import annotations

import pytest
from lupa import lua51  # Redis's Lua (and fakeredis's: two Lua versions in one process crash it)

from mc_queue.store.lua_includes import shaken, statements
from mc_queue.store.scripts import load_specs, lua_dir

INCLUDE = """-- a helper library
local A = 1
local function a() return A end
local function b() return a() + 1 end  -- uses a
local function c() return 3 end
-- tables that mention a helper keep it
local T = {c = c}
local X, Y = nil, nil
for i = 1, 2 do A = A + i end
local function d()
  X = 'set'
end
"""


def test_only_what_the_script_reaches_is_kept_in_order() -> None:
    out = shaken("-- header\n--@include lib\nreturn b()\n", {"lib": INCLUDE})
    assert out.startswith("-- header\nlocal A = 1\nlocal function a()")
    assert "local function b()" in out and out.index("function a(") < out.index("function b(")
    assert "function c(" not in out and "local T" not in out and "function d(" not in out and "X, Y" not in out
    assert "for i = 1, 2 do A = A + i end" in out  # defines nothing: always run
    assert "-- a helper library" not in out and "--@include" not in out
    assert out.endswith("return b()\n")


def test_a_name_reached_through_a_table_or_a_field_keeps_its_helper() -> None:
    out = shaken("--@include lib\nreturn T.c()\n", {"lib": INCLUDE})
    assert "local T = {c = c}" in out and "local function c()" in out
    out = shaken("--@include lib\nlocal K = {d = 1}\nreturn K.d\n", {"lib": INCLUDE})
    assert "local function d()" in out and "local X, Y = nil, nil" in out  # (over-kept: safe)


def test_several_includes_go_where_the_first_was_and_an_unknown_one_is_an_error() -> None:
    more = "local function e() return b() end\n"
    out = shaken("--@include lib\n--@include more\nreturn e()\n", {"lib": INCLUDE, "more": more})
    assert out.index("function b(") < out.index("function e(") < out.index("return e()")
    with pytest.raises(KeyError):
        shaken("--@include nowhere\nreturn 1\n", {"lib": INCLUDE})


def test_every_include_splits_into_statements_that_compile_and_every_script_compiles() -> None:
    lua = lua51.LuaRuntime()
    error_of = lua.eval("function(s) local f, e = loadstring(s) return e end")
    for path in sorted((lua_dir() / "includes").glob("*.lua")):
        text = path.read_text()
        parts = statements(text)
        assert "".join(chunk for _, chunk, _ in parts) == text
        for names, chunk, _ in parts:
            assert error_of(chunk) is None, (path.name, sorted(names), chunk[:200])
    for name, spec in load_specs().items():
        assert error_of(spec.source) is None, name
