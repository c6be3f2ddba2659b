"""The scripts' JSON argument guard (``check_arg`` kind 'json' in lua/includes/common.lua) refuses what
Redis's cjson reads but Python's json does not (hex, a sign, leading zeros, a dot without digits, NaN,
inf, an exponent out of range), wherever the number stands, and takes every JSON a client writes. Its
full number check runs only when a cheap look finds something that could be such a number (issue 17:
the look used to fire on any 'i' or 'n', in every key and string): checked here on a real
redis-server, against Python's own reading of each text."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from mc_queue.store.lua_includes import shaken
from mc_queue.store.scripts import lua_dir
from mc_queue.testing import RedisServer

GUARD = "--@include common\nlocal v, why = check_arg(ARGV[1], 'json', 524288, ARGV[2] == 'obj' and 'obj' or false)\n" \
        "return why or 'ok'"

REFUSED = [
    '{"a":0x10}', '{"a": +1}', '{"a":01}', '{"a":-01}', '{"a":1.}', '{"a":1.}  ', '{"a":.5}', '{"a":-.5}',
    '{"a":NaN}', '{"a":nan}', '{"a":-inf}', '{"a":Infinity}', '{"a":inf}', '{"a":1e999}', '{"a":-1E400}',
    '{"a":[1, 0x1]}', '{"a":[-01]}', '{"i":"n","b":1.}', '{"a":{"b":[2,\t+3]}}', '{"a":1.e5}', '{"a":[.1]}',
    '{"a":0X1}', '{"a":00}', '{"a": \n NaN}',
]
ACCEPTED = [
    '{"i":0}', '{"name":"nan","info":"x+y=0x10 .5"}', '{"a":null}', '{"a":1.5e10}', '{"a":-0}', '{"a":[0,1]}',
    '{"a":0.5}', '{"a":-0.25e-5}', '{"a":1E+99}', '{"n":[true,false,null]}', '{"a":"1."}', '{"a":"NaN"}',
    '{"s":"a\\"b:+1"}', '{"a":10}', '{"a":[10,20.75]}', '{}',
]
# A result may be any JSON value, a bare number too.
REFUSED_VALUES = ["1.", "+1", "0x10", "NaN", "01", ".5", "-inf", "1e999", " -01", "[1.]", "-.5", "Infinity"]
ACCEPTED_VALUES = ["1", "0", "-0.5", "null", "true", '"x"', "[1,2]", "10", " 7", '"NaN"', "1e99"]


def _python_reads(text: str) -> bool:
    def bad(value: str) -> Any:
        raise ValueError(value)
    try:
        json.loads(text, parse_constant=bad)
    except ValueError:
        return False
    return all(not (isinstance(x, float) and math.isinf(x)) for x in _numbers(json.loads(text, parse_constant=bad)))


def _numbers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


@pytest.fixture(scope="module")
def guard(redis_server: RedisServer) -> Any:
    includes = {p.stem: p.read_text() for p in (lua_dir() / "includes").glob("*.lua")}
    r = redis_server.client()
    script = r.register_script(shaken(GUARD, includes))
    def check(text: str, obj: bool = True) -> str:
        out = script(args=[text, "obj" if obj else ""])
        return out.decode() if isinstance(out, bytes) else str(out)
    return check


@pytest.mark.parametrize("text", REFUSED)
def test_a_number_python_would_not_read_is_refused(guard: Any, text: str) -> None:
    assert not _python_reads(text), text
    assert guard(text) != "ok", text


@pytest.mark.parametrize("text", ACCEPTED)
def test_json_a_client_writes_is_taken(guard: Any, text: str) -> None:
    assert _python_reads(text), text
    assert guard(text) == "ok", text


@pytest.mark.parametrize("text", REFUSED_VALUES)
def test_a_bare_value_python_would_not_read_is_refused(guard: Any, text: str) -> None:
    assert not _python_reads(text), text
    assert guard(text, obj=False) != "ok", text


@pytest.mark.parametrize("text", ACCEPTED_VALUES)
def test_a_bare_value_a_client_writes_is_taken(guard: Any, text: str) -> None:
    assert _python_reads(text), text
    assert guard(text, obj=False) == "ok", text
