"""The scripts' SHA-256 (``sha256_hex`` in lua/includes/common.lua: the digest of a short payload or result
that keeps none, for a replay or a conflict) gives hashlib's digest of the same bytes: on a real
redis-server (its bit library) and on fakeredis (no bit library: the arithmetic fallback), across the
lengths around each 64-byte block boundary, with UTF-8 and every byte value."""

from __future__ import annotations

import hashlib
import random

import fakeredis
import pytest

from mc_queue.store.lua_includes import shaken
from mc_queue.store.scripts import lua_dir
from mc_queue.testing import RedisServer

SCRIPT = "--@include common\nreturn sha256_hex(ARGV[1])"
LENGTHS = [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 128, 200]


def _texts() -> list[bytes]:
    rnd = random.Random(17)
    out = [bytes(rnd.getrandbits(8) for _ in range(n)) for n in LENGTHS]
    return [*out, '{"t":"é€😀"}'.encode(), b'{"ok":true}', bytes(range(256))[:64]]


def _source() -> str:
    includes = {p.stem: p.read_text() for p in (lua_dir() / "includes").glob("*.lua")}
    return shaken(SCRIPT, includes)


def test_on_a_real_redis_server(redis_server: RedisServer) -> None:
    r = redis_server.client()
    script = r.register_script(_source())
    for text in _texts():
        got = script(args=[text])
        assert (got.decode() if isinstance(got, bytes) else got) == hashlib.sha256(text).hexdigest(), len(text)


@pytest.mark.parametrize("text", _texts()[:6] + _texts()[-3:])
def test_on_fakeredis_without_the_bit_library(text: bytes) -> None:
    r = fakeredis.FakeRedis()
    assert r.eval("return type(bit)", 0) == b"nil"  # (the fallback is what runs here)
    assert r.eval(_source(), 0, text).decode() == hashlib.sha256(text).hexdigest()
