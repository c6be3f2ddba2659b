"""Each Lua script's header is its contract; these tests fail when the header and the body drift apart.

Static checks read lua/*.lua (and lua/includes/); the last tests run every client method against
a real redis-server and check that the client passes exactly the names the headers declare, each bound
to the right key of the namespace.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

import mc_queue
from mc_queue import FailureClass, make_failure, reconcile_attempt, recover
from mc_queue.client.producer import NewTask
from mc_queue.contracts.errors import Code, McqError, raise_for_reply
from mc_queue.contracts.periodic import PeriodicSchedule
from mc_queue.producer.dispatch import dispatch
from mc_queue.producer.transport import job_id, move_laned, rq_connection, rq_queue_name, take_from_lane
from mc_queue.store.lua_includes import code as lua_code
from mc_queue.store.lua_includes import statements as include_statements
from mc_queue.store.scripts import ScriptRunner, load_specs, lua_dir, parse_header

LUA = lua_dir()
SPECS = load_specs()
NAMES = sorted(SPECS)
INCLUDES = {p.stem: p.read_text() for p in sorted((LUA / "includes").glob("*.lua"))}
COMMON = "\n".join(INCLUDES[n] for n in ("common", "fenced", "decisions", "admit"))  # every shared helper

# Redis commands the scripts may use, by where their keys are: one key first, or every argument a key.
SINGLE_KEY_COMMANDS = frozenset({
    "GET", "SET", "INCR", "INCRBY", "EXPIRE", "PEXPIRE", "PEXPIREAT", "PTTL", "TYPE",
    "HGET", "HSET", "HSETNX", "HMGET", "HDEL", "HEXISTS", "HGETALL", "HINCRBY", "HINCRBYFLOAT", "HLEN", "HKEYS",
    "HSTRLEN",
    "HSCAN",
    "SADD", "SREM", "SISMEMBER", "SMEMBERS", "SCARD",
    "ZADD", "ZREM", "ZSCORE", "ZCARD", "ZRANGE", "ZRANGEBYSCORE", "ZREVRANGE", "ZREMRANGEBYSCORE",
    "ZRANGEBYLEX", "ZLEXCOUNT",
    "XADD", "XRANGE", "XREVRANGE", "XLEN", "XTRIM", "RPUSH", "LINDEX", "LRANGE", "LLEN",
})
ALL_KEYS_COMMANDS = frozenset({"EXISTS", "DEL", "UNLINK"})
KEYLESS_COMMANDS = frozenset({"TIME", "INFO"})
HEADER_LABELS = ("Returns:", "Events", "Idempotent:")


# --------------------------------------------------------------------------- a little Lua reading


def split_header(text: str) -> tuple[list[str], str]:
    """The leading comment block (the header) and the rest (the body)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and lines[i].startswith("--"):
        i += 1
    return lines[:i], "\n".join(lines[i:])


def strip_comments(src: str) -> str:
    """Lua source without comments (strings kept)."""
    out: list[str] = []
    i, quote = 0, ""
    while i < len(src):
        c = src[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < len(src):
                out.append(src[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
            i += 1
            continue
        if c in "'\"":
            quote = c
        elif src.startswith("--", i):
            if src.startswith("--[[", i):
                end = src.find("]]", i)
                i = len(src) if end < 0 else end + 2
            else:
                end = src.find("\n", i)
                i = len(src) if end < 0 else end
            continue
        out.append(c)
        i += 1
    return "".join(out)


def split_args(src: str, open_idx: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose '(' is at ``open_idx``."""
    assert src[open_idx] == "("
    args: list[str] = []
    cur: list[str] = []
    depth, quote, i = 0, "", open_idx + 1
    while i < len(src):
        c = src[i]
        if quote:
            cur.append(c)
            if c == "\\":
                cur.append(src[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c in "([{":
            depth += 1
            cur.append(c)
        elif c in ")]}":
            if depth == 0:
                last = "".join(cur).strip()
                return [*args, last] if last or args else args
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    raise AssertionError("unbalanced parentheses")


def redis_calls(src: str) -> Iterator[list[str]]:
    for m in re.finditer(r"redis\.p?call\s*\(", src):
        yield split_args(src, m.end() - 1)


def statement_exprs(src: str, start: int) -> list[str]:
    """The comma-separated expressions from ``start`` to the end of the line (continuing inside brackets)."""
    exprs: list[str] = []
    cur: list[str] = []
    depth, quote, i = 0, "", start
    while i < len(src):
        c = src[i]
        if quote:
            cur.append(c)
            if c == "\\":
                cur.append(src[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c == "\n" and depth == 0:
            break
        elif c == "," and depth == 0:
            exprs.append("".join(cur).strip())
            cur = []
        else:
            depth += (c in "([{") - (c in ")]}")
            cur.append(c)
        i += 1
    return [*exprs, "".join(cur).strip()]


def local_bindings(body: str) -> list[tuple[str, str]]:
    """(local name, expression) for every ``local a, b = x, y`` statement."""
    out = []
    for m in re.finditer(r"^\s*local\s+([\w\s,]+?)\s*=(?!=)", body, re.M):
        names = [n.strip() for n in m.group(1).split(",")]
        out.extend(zip(names, statement_exprs(body, m.end()), strict=False))
    return out


def header_indices(header: list[str], kind: str) -> list[int]:
    return [int(m.group(1)) for line in header for m in [re.match(rf"^--\s+{kind}\[(\d+)\]\s+\w+", line)] if m]


def header_section(header: list[str], label: str) -> str:
    """The text of one header section (``Returns:`` ... up to the next labelled line)."""
    out: list[str] = []
    inside = False
    for line in header:
        text = line[2:].strip()
        if text.startswith(label):
            inside = True
            out.append(text[len(label):])
        elif inside and (any(text.startswith(x) for x in HEADER_LABELS) or re.match(r"(KEYS|ARGV)\[", text)):
            break
        elif inside:
            out.append(text)
    return "\n".join(out)


def helper_functions() -> dict[str, tuple[list[str], str]]:
    """common.lua's helpers: name -> (parameters, body)."""
    src = strip_comments(COMMON)
    starts = list(re.finditer(r"^local function (\w+)\(([^)]*)\)", src, re.M))
    out = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(src)
        out[m.group(1)] = ([p.strip() for p in m.group(2).split(",") if p.strip()], src[m.end():end])
    return out


HELPERS = helper_functions()
KEY_PARAM_RE = re.compile(r"^(k_\w+|key)$")


def helpers_called(body: str) -> set[str]:
    """Helpers a body calls, directly or through other helpers."""
    found: set[str] = set()
    todo = [body]
    while todo:
        text = todo.pop()
        for name, (_, hbody) in HELPERS.items():
            if name not in found and re.search(rf"(?<![\w.]){name}\s*\(", text):
                found.add(name)
                todo.append(hbody)
    return found


def script(name: str) -> tuple[list[str], str]:
    """Header lines and comment-free body of lua/<name>.lua."""
    header, body = split_header((LUA / f"{name}.lua").read_text())
    return header, strip_comments(body)


def keys_bound(body: str) -> set[str]:
    return {n for n, e in local_bindings(body) if re.fullmatch(r"KEYS\[\d+\]", e)}


# --------------------------------------------------------------------------- the reader itself


def test_the_lua_reader_understands_nested_calls_strings_and_comments() -> None:
    src = "x = redis.call('ZADD', k_a, f(1, 2), redis.call('HGET', k_b, 'a,b') .. '/' .. n) -- redis.call('KEYS', '*')"
    calls = list(redis_calls(strip_comments(src)))
    assert calls == [["'ZADD'", "k_a", "f(1, 2)", "redis.call('HGET', k_b, 'a,b') .. '/' .. n"],
                     ["'HGET'", "k_b", "'a,b'"]]
    assert local_bindings("local a, b = KEYS[1], tonumber(ARGV[2])") == [("a", "KEYS[1]"), ("b", "tonumber(ARGV[2])")]
    assert header_section(["-- Returns: {'OK'}", "--   {'E_X', why}", "-- Idempotent: yes"], "Returns:") \
        == " {'OK'}\n{'E_X', why}"


def test_every_lua_file_is_loaded_as_a_script() -> None:
    assert NAMES == sorted(p.stem for p in LUA.glob("*.lua"))
    for name in ("enqueue", "claim", "renew", "complete", "fail", "expire", "retry"):
        assert name in SPECS


# --------------------------------------------------------------------------- headers vs bodies

def flat_names(table_literal: str) -> list[str]:
    """Argument names of a flat spec list '{name, kind, p1, p2, ...}': every fourth entry."""
    items = [i for i in split_args("(" + table_literal.strip()[1:], 0) if i]
    assert len(items) % 4 == 0, f"a spec list has {len(items)} entries, not four per argument"
    return [item.strip("'") for item in items[::4]]


def named_lists() -> dict[str, list[str]]:
    """common.lua's argument lists (fenced_args(), decision_args()): name -> argument names in order."""
    src = strip_comments(COMMON)
    out = {}
    for m in re.finditer(r"^local function ([a-z_]+_args)\(\)\s*return \{", src, re.M):
        out[m.group(1)] = flat_names(src[m.end() - 1:])
    return out


NAMED_LISTS = named_lists()


def declared_in_body(name: str) -> tuple[list[str], list[str]]:
    """The key names given to keys(KEYS, {...}) and the argument names given to args(ARGV, ...), in order."""
    _, body = script(name)
    km = re.search(r"local K = \{", body)
    am = re.search(r"args\(\s*ARGV\s*,", body)
    assert km and am, f"{name}.lua does not start with local K = {{...}} and args(ARGV, ...)"
    key_names = []
    for i, entry in enumerate(e for e in split_args("(" + body[km.end():], 0) if e):
        m = re.fullmatch(r"(\w+)\s*=\s*KEYS\[(\d+)\]", entry)
        assert m and int(m.group(2)) == i + 1, f"{name}.lua: K entry {entry!r} is not '<name> = KEYS[{i + 1}]'"
        key_names.append(m.group(1))
    spec = split_args(body, am.start() + len("args"))[1]
    arg_names: list[str] = []

    def walk(expr: str) -> None:
        expr = expr.strip()
        if expr.startswith("with("):
            for part in split_args(expr, 4):
                walk(part)
        elif expr.endswith("()") and expr[:-2] in NAMED_LISTS:
            arg_names.extend(NAMED_LISTS[expr[:-2]])
        else:
            assert expr.startswith("{"), f"{name}.lua: args() takes a literal list, with(...) or a named list"
            arg_names.extend(flat_names(expr))

    walk(spec)
    return key_names, arg_names


def test_the_lua_reader_reads_keys_and_args_declarations() -> None:
    assert NAMED_LISTS["fenced_args"] == ["epoch", "min_seq", "proof"]
    assert NAMED_LISTS["decision_args"][0] == "decision"
    keys, argv = declared_in_body("fail")
    assert keys[:3] == ["meta", "epochs", "nslog"] and argv[-7:] == NAMED_LISTS["decision_args"]
    assert declared_in_body("due") == (["index"], ["limit"])


@pytest.mark.parametrize("name", NAMES)
def test_the_body_declares_exactly_the_header_keys_and_arguments_in_order(name: str) -> None:
    keys, argv = declared_in_body(name)
    assert tuple(keys) == SPECS[name].keys, f"{name}.lua: keys() names {keys}, the header {SPECS[name].keys}"
    assert tuple(argv) == SPECS[name].argv, f"{name}.lua: args() names {argv}, the header {SPECS[name].argv}"


def item_keys_in_body(name: str) -> list[str]:
    """A many-item script's item key names, as its body hands them to each_keys(KEYS, first, {...})."""
    _, body = script(name)
    m = re.search(r"each_keys\(\s*KEYS\s*,", body)
    if not m:
        return []
    args = split_args(body, m.start() + len("each_keys"))
    return [a.strip().strip("'") for a in split_args("(" + args[2].strip()[1:], 0) if a.strip()]


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].item_keys])
def test_a_many_item_script_declares_its_items_in_the_header_order(name: str) -> None:
    assert tuple(item_keys_in_body(name)) == SPECS[name].item_keys
    _, body = script(name)
    m = re.search(r"args\(\s*ARGV\s*,", body)
    assert m
    call = split_args(body, m.start() + len("args"))
    each = call[2].strip()
    names = NAMED_LISTS[each[:-2]] if each.endswith("()") and each[:-2] in NAMED_LISTS else flat_names(each)
    skip = int(call[3]) if len(call) > 3 else 0  # args(ARGV, own, each, skip): each item's, the first skip left out
    assert tuple(names[skip:]) == SPECS[name].item_argv


@pytest.mark.parametrize("name", NAMES)
def test_keys_and_arguments_are_used_only_by_name(name: str) -> None:
    _, body = script(name)
    keys, argv = declared_in_body(name)
    items = bool(SPECS[name].item_keys)  # each_keys(KEYS, ...) hands out the items' keys
    assert len(re.findall(r"\bKEYS\[", body)) == len(keys), f"{name}.lua indexes KEYS outside local K = {{...}}"
    assert len(re.findall(r"\bKEYS\b", body)) == len(keys) + items, f"{name}.lua uses KEYS as a whole"
    assert len(re.findall(r"\bARGV\b", body)) == 1, f"{name}.lua uses ARGV outside args()"
    used_keys = set(re.findall(r"\bK\.(\w+)", body))
    keys = [*keys, *SPECS[name].item_keys]  # (in a many-item script's loops, K is the item's)
    assert used_keys <= set(keys), f"{name}.lua uses undeclared keys {sorted(used_keys - set(keys))}"
    used_args = set(re.findall(r"\bA\.(\w+)", body)) | set(re.findall(r"\bA\.raw\.(\w+)", body))
    used_args.discard("raw")
    if items:
        used_args.discard("items")  # A.items: each item's arguments, checked by args() against the header
    assert used_args <= set(argv), f"{name}.lua uses undeclared arguments {sorted(used_args - set(argv))}"
    # every declared key is used by the body or by a helper it hands K to
    reach = set(used_keys)
    for h in helpers_called(body):
        reach |= set(re.findall(r"\bK\.(\w+)", HELPERS[h][1]))
    assert set(keys) <= reach, f"{name}.lua declares keys it never uses: {sorted(set(keys) - reach)}"


def test_the_shared_helpers_declare_no_keys_or_arguments_of_their_own() -> None:
    src = strip_comments(COMMON)
    assert not re.search(r"\b(KEYS|ARGV)\b", src)
    assert not re.search(r"^--\s+(KEYS|ARGV)\[", COMMON, re.M)


@pytest.mark.parametrize("name", NAMES)
def test_every_helper_key_a_script_relies_on_is_declared_by_it(name: str) -> None:
    """fence_check(K, ...) reads K.fence and K.lease: every script that calls it declares them."""
    _, body = script(name)
    keys, _ = declared_in_body(name)
    keys = [*keys, *SPECS[name].item_keys]  # (in a many-item script's loops, K is the item's)
    for h in helpers_called(body):
        needed = set(re.findall(r"\bK\.(\w+)", HELPERS[h][1]))
        if re.search(rf"(?<![\w.]){h}\s*\(\s*K\s*[,)]", body) or any(
                re.search(rf"(?<![\w.]){h}\s*\(\s*K\s*[,)]", HELPERS[o][1]) for o in helpers_called(body)):
            assert needed <= set(keys), f"{name}.lua hands K to {h}, which needs {sorted(needed - set(keys))}"


@pytest.mark.parametrize("name", NAMES)
def test_header_has_returns_and_idempotent_lines(name: str) -> None:
    header, _ = script(name)
    assert header[0] == f"-- mc_queue: {name}"
    assert sum(line.startswith("-- Returns:") for line in header) == 1, f"{name}.lua: no single 'Returns:' line"
    assert sum(line.startswith("-- Idempotent:") for line in header) == 1, f"{name}.lua: no single 'Idempotent:' line"
    assert header_section(header, "Idempotent:").strip(), f"{name}.lua: 'Idempotent:' says nothing"
    text = (LUA / f"{name}.lua").read_text()
    assert "--@include common" in header or "--@include" not in text
    for inc in re.findall(r"^--@include (\w+)", text, re.M):
        assert inc in INCLUDES, f"{name}.lua includes {inc}, which lua/includes/ lacks"


@pytest.mark.parametrize("name", NAMES)
def test_every_helper_a_script_calls_is_in_an_include_it_pulls_in(name: str) -> None:
    """A helper that is not pasted in is a nil global at run time: a Lua error on the first call."""
    text = (LUA / f"{name}.lua").read_text()
    pulled = re.findall(r"^--@include (\w+)", text, re.M)
    defined = {m for inc in pulled for m in re.findall(r"^local function (\w+)\(|^local ([A-Z_]+) =",
                                                         INCLUDES[inc], re.M) for m in m if m}
    everything = {m for src in INCLUDES.values() for t in re.findall(r"^local function (\w+)\(|^local ([A-Z_]+) =",
                                                                         src, re.M) for m in t if m}
    _, body = script(name)
    used = {w for w in re.findall(r"(?<![\w.])([A-Za-z_]\w*)\b", body) if w in everything}
    for inc in pulled:  # the includes call each other too
        used |= {w for w in re.findall(r"(?<![\w.])([A-Za-z_]\w*)\b", strip_comments(INCLUDES[inc]))
                 if w in everything}
    assert used <= defined, f"{name}.lua uses {sorted(used - defined)} without pulling in their include"


@pytest.mark.parametrize("name", NAMES)
def test_the_parser_reads_the_header_the_way_these_tests_do(name: str) -> None:
    text = (LUA / f"{name}.lua").read_text()
    assert parse_header(name, text) == (SPECS[name].keys, SPECS[name].argv)
    assert not re.search(r"^--@include", SPECS[name].source, re.M), f"{name}: an include was not expanded"
    own = set(re.findall(r"[A-Za-z_]\w*", lua_code(re.sub(r"^--@include \w+", "", text, flags=re.M))))
    for inc in re.findall(r"^--@include (\w+)", text, re.M):  # what the script names of it, at least, is there
        for names, chunk, _ in include_statements(INCLUDES[inc]):
            assert not names & own or chunk.rstrip() in SPECS[name].source, (name, sorted(names))
    word = header_section(script(name)[0], "Idempotent:").split()[0].lower()
    assert SPECS[name].idempotent == (word != "no"), f"{name}: the runner reads 'Idempotent: {word}' wrong"


@pytest.mark.parametrize("name", [*NAMES, "includes/common", "includes/fenced", "includes/decisions"])
def test_no_script_calls_the_keys_command(name: str) -> None:
    src = strip_comments((LUA / f"{name}.lua").read_text())
    for args in redis_calls(src):
        assert args[0].strip("'\"").upper() not in ("KEYS", "SCAN"), f"{name}.lua calls {args[0]}"
    assert not re.search(r"redis\.p?call\(\s*['\"](keys|scan)['\"]", src, re.I)


def _check_key_args(where: str, args: list[str], allowed: set[str]) -> None:
    cmd = args[0].strip()
    assert re.fullmatch(r"'[A-Za-z]+'", cmd), f"{where}: redis.call with a computed command {cmd}"
    cmd = cmd.strip("'").upper()
    if cmd in KEYLESS_COMMANDS:
        return
    if cmd in ALL_KEYS_COMMANDS:
        key_args = args[1:]
    else:
        assert cmd in SINGLE_KEY_COMMANDS, f"{where}: {cmd} is not a known command: add it to this test"
        key_args = args[1:2]
    assert key_args, f"{where}: {cmd} without a key"
    for key in key_args:
        assert ".." not in key and "'" not in key and '"' not in key, (
            f"{where}: {cmd} builds its key from strings: {key}")
        assert key in allowed, f"{where}: {cmd} key {key!r} is not one of the script's declared keys"


@pytest.mark.parametrize("name", NAMES)
def test_every_key_a_script_touches_comes_from_keys(name: str) -> None:
    _, body = script(name)
    keys, _ = declared_in_body(name)
    allowed = {f"K.{k}" for k in [*keys, *SPECS[name].item_keys]}
    for args in redis_calls(body):
        assert not args[0].startswith("unpack"), f"{name}.lua: redis.call(unpack(...)) outside the helpers"
        _check_key_args(f"{name}.lua", args, allowed)
    # Keys handed to a helper go where the helper expects a key, and come from KEYS.
    for helper, (params, _) in HELPERS.items():
        for m in re.finditer(rf"(?<![\w.]){helper}\s*\(", body):
            args = split_args(body, m.end() - 1)
            for param, arg in zip(params, args, strict=False):
                if KEY_PARAM_RE.match(param):
                    assert arg in allowed or arg == "nil", f"{name}.lua passes {arg!r} as {helper}'s key {param!r}"
                elif param == "K":
                    assert arg == "K", f"{name}.lua passes {arg!r} as {helper}'s key table"
                else:
                    assert arg not in allowed, f"{name}.lua passes the key {arg!r} as {helper}'s {param!r}"


def test_the_helpers_touch_only_keys_they_are_given() -> None:
    for helper, (params, body) in HELPERS.items():
        allowed = {p for p in params if KEY_PARAM_RE.match(p)}
        if helper == "emit_task":
            allowed.add("NSLOG")  # the namespace log key ns_check was given by the script (its k_nslog)
        if helper in ("emit_task", "implied_last"):
            allowed.add("HISTORY_TASK")  # the task hash the script declared with history_of (its K.task)
        if "K" in params:
            allowed |= {f"K.{k}" for k in re.findall(r"\bK\.(\w+)", body)}
        for args in redis_calls(body):
            if args[0].startswith("unpack"):
                table = re.match(r"unpack\((\w+)\)", args[0])
                assert table, f"{helper}: redis.call({args[0]})"
                m = re.search(rf"local {table.group(1)}\s*=\s*\{{", body)
                assert m, f"{helper}: cannot find the table {table.group(1)}"
                _check_key_args(f"common.lua {helper}", split_args("(" + body[m.end():], 0), allowed)
            else:
                _check_key_args(f"common.lua {helper}", args, allowed)
        for other, (oparams, _) in HELPERS.items():
            for m in re.finditer(rf"(?<![\w.]){other}\s*\(", body):
                for param, arg in zip(oparams, split_args(body, m.end() - 1), strict=False):
                    if KEY_PARAM_RE.match(param) or param == "K":
                        assert arg in allowed or arg in ("K", "nil"), (
                            f"{helper} passes {arg!r} as {other}'s key {param!r}")


@pytest.mark.parametrize("name", NAMES)
def test_every_script_given_a_task_history_declares_it_with_its_task_hash(name: str) -> None:
    """emit starts a queued task's list after the events its enqueue implies, and emit_task keeps a
    refusal about a queued task in its history: both read the task hash history_of declared."""
    _, body = script(name)
    if re.search(r"\bevents = KEYS\[", body):
        assert re.search(r"^(bind_task\(K\)|history_of\(K\.events, K\.task\))$", body, re.M), (
            f"{name}.lua is given a task history without bind_task")


@pytest.mark.parametrize("name", NAMES)
def test_every_script_given_an_attempts_hash_finds_where_the_task_keeps_its_attempts(name: str) -> None:
    """A task keeps its Attempts in its own hash, one written before 2026-12 in the key given."""
    _, body = script(name)
    if re.search(r"\battempts = KEYS\[", body):
        assert re.search(r"^(bind_task\(K\)|K\.attempts = (K\.task|attempts_of\(K\.task, K\.attempts\)))", body,
                         re.M), (
            f"{name}.lua is given an attempts hash without bind_task")


@pytest.mark.parametrize("name", NAMES)
def test_no_key_name_is_built_inside_a_redis_call(name: str) -> None:
    """The brief's simple check: no key argument concatenated with '{' or ':'."""
    _, body = script(name)
    for src in (body, strip_comments(COMMON)):
        for args in redis_calls(src):
            for arg in args[1:2]:
                concatenated = ".." in arg
                tagged = re.search(r"['\"][^'\"]*[{:][^'\"]*['\"]", arg) is not None
                assert not (concatenated and tagged), f"{name}.lua builds a key: {arg}"


# --------------------------------------------------------------------------- declared replies and events


EVENT_RE = re.compile(r"(?<![\w.])(?:emit\(\s*[\w.]+\s*,|refuse\(\s*[\w.]+\s*,\s*[\w.]+\s*,)\s*'(\w+)'")
CODE_RE = re.compile(r"'(OK|DUP|NOOP|DONE|PENDING|E_[A-Z_]+)'")
ALL_EVENTS = set(EVENT_RE.findall(strip_comments(COMMON))) | {
    e for n in NAMES for e in EVENT_RE.findall(script(n)[1])
}


def _calls(body: str, helper: str) -> list[list[str]]:
    return [split_args(body, m.end() - 1) for m in re.finditer(rf"(?<![\w.]){helper}\s*\(", body)]


RESULT_RE = re.compile(r"(?:\breturn|=)\s*(\w+)\s*\(")


def _result_helpers(body: str) -> set[str]:
    """Helpers whose result a body returns or keeps (a bare call's reply is not the script's)."""
    found: set[str] = set()
    todo = [body]
    while todo:
        for name in RESULT_RE.findall(todo.pop()):
            if name in HELPERS and name not in found:
                found.add(name)
                todo.append(HELPERS[name][1])
    return found


def _reply_codes(name: str) -> set[str]:
    """Codes the script can return: its own literals, and those of the helpers it calls (ns_check's
    E_EPOCH only where a call refuses a retired epoch, fence_check's E_CANCELED only where a call checks
    for a cancel request)."""
    _, body = script(name)
    codes = set(CODE_RE.findall(body))
    for h in _result_helpers(body):
        codes |= set(CODE_RE.findall(HELPERS[h][1])) - {"E_EPOCH", "E_CANCELED"}
    if any(len(a) > 7 and a[7] != "true" for a in _calls(body, "ns_check")):
        codes.add("E_EPOCH")
    fenced_calls = _calls(body, "fence_check") + _calls(body, "fenced")
    if any(len(a) > 5 and a[5] == "true" for a in fenced_calls):
        codes.add("E_CANCELED")
    return codes


def test_reply_code_reader_finds_the_helper_codes() -> None:
    assert set(CODE_RE.findall(HELPERS["fence_check"][1])) >= {"E_NOTASK", "E_STALE", "E_CANCELED"}
    assert _reply_codes("renew") >= {"E_STALE", "E_STATE", "E_EXPIRED", "E_NOTASK", "E_NSLOST", "E_BADARG"}
    assert "E_CANCELED" not in _reply_codes("renew") and "E_CANCELED" in _reply_codes("complete")
    assert set(CODE_RE.findall(HELPERS["ns_check"][1])) == {"E_NSLOST", "E_NONS", "E_EPOCH", "E_BADARG"}
    assert _reply_codes("claim") >= {"OK", "DUP", "E_CLAIM", "E_NSLOST", "E_EPOCH"}


@pytest.mark.parametrize("name", NAMES)
def test_every_reply_code_is_declared_in_returns_and_every_declared_one_exists(name: str) -> None:
    header, _ = script(name)
    declared = set(re.findall(r"'([A-Z_]+)'", header_section(header, "Returns:")))
    actual = _reply_codes(name)
    assert actual <= declared, f"{name}.lua can return {sorted(actual - declared)} but 'Returns:' omits them"
    assert declared <= actual, f"{name}.lua declares {sorted(declared - actual)} but never returns them"
    unknown = {c for c in declared if c not in Code.__members__}
    assert not unknown, f"{name}.lua declares codes {sorted(unknown)} that mc_queue.contracts.errors.Code lacks"


def test_every_code_of_the_enum_is_returned_by_some_script() -> None:
    used = set().union(*(_reply_codes(n) for n in NAMES))
    assert set(Code.__members__) == used, f"codes no script returns: {sorted(set(Code.__members__) - used)}"


@pytest.mark.parametrize("code", [c for c in Code if c.value.startswith("E_") and c is not Code.E_EPOCH])
def test_every_error_code_maps_to_an_mc_queue_error(code: Code) -> None:
    with pytest.raises(McqError) as info:
        raise_for_reply([code.value, "1", "running", ""], script="renew", presented_fence=1)
    assert info.value.code == code.value
    assert type(info.value) is not McqError, f"{code} maps to the bare McqError"


@pytest.mark.parametrize("name", NAMES)
def test_every_event_a_script_emits_is_declared_and_every_declared_one_is_emitted(name: str) -> None:
    header, body = script(name)
    section = header_section(header, "Events")
    declared = {w for w in re.findall(r"\b[a-z_]+\b", section) if w in ALL_EVENTS}
    own = set(EVENT_RE.findall(body))
    reachable = own | {e for h in helpers_called(body) for e in EVENT_RE.findall(HELPERS[h][1])}
    assert own <= declared, f"{name}.lua emits {sorted(own - declared)} but its header does not declare them"
    assert declared <= reachable, f"{name}.lua declares {sorted(declared - reachable)} but never emits them"


# --------------------------------------------------------------------------- the Python side


def _expected_key(q: mc_queue.Client, key_name: str, value: str) -> bool:
    """Is ``value`` the namespace's key for the header name ``key_name``?"""
    fixed = {name: value for name, value in vars(q.keys).items()
             if isinstance(value, str) and value.startswith(q.keys.tag + ":")}
    if key_name in fixed:
        return value == fixed[key_name]
    if key_name == "index":  # due.lua and index_drop.lua take any time index
        return value in (q.keys.leases, q.keys.outbox, q.keys.cancels, q.keys.suspect)
    patterns = {"task": r":t:([^:]+:[0-9A-Z]{26}|-)", "parent": r":t:[^:]+:[0-9A-Z]{26}",
                "attempts": r":t:([^:]+:[0-9A-Z]{26}|-):a",
                "events": r":t:[^:]+:[0-9A-Z]{26}:ev", "pending": r":q:[^:]+:pending",
                "effects": r":t:[^:]+:[0-9A-Z]{26}:fx", "fence": r":t:[^:]+:[0-9A-Z]{26}:fence",
                "lease": r":t:[^:]+:[0-9A-Z]{26}:lease", "tomb": r":tomb:[^:]+:[0-9A-Z]{26}",
                "done": r":q:[^:]+:done", "held": r":q:[^:]+:held", "deadlines": r":q:[^:]+:deadlines",
                "samples": r":q:[^:]+:samples", "tombs0": r":tombs:[^:]+:[0-9A-Z]{7}",
                "tombs1": r":tombs:[^:]+:[0-9A-Z]{8}", "tombs2": r":tombs:[^:]+:[0-9A-Z]{9}",
                "state": r":periodic:[A-Za-z0-9_.-]+", "log": r":limit:[A-Za-z0-9_.:-]+",
                "window": r":breaker:[A-Za-z0-9_.:-]+",
                "lanes": r":q:[^:]+:lanes@p[1-9]", "turns": r":q:[^:]+:turns@p[1-9]",
                # periodic_decide's previous task: its hash, or (no previous task) the state hash, not read
                "prev": r"(:t:[^:]+:[0-9A-Z]{26}|:periodic:[A-Za-z0-9_.-]+)"}
    assert key_name in patterns, f"a header declares the key {key_name!r}: teach this test where it lives"
    return re.fullmatch(re.escape(q.keys.tag) + patterns[key_name], value) is not None


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    calls: list[tuple[str, dict[str, str], dict[str, Any]]] = []
    original = ScriptRunner.call

    def spy(self: ScriptRunner, name: str, keys: Any, argv: Any, client: Any = None, items: Any = ()) -> Any:
        calls.append((name, dict(keys), dict(argv)))
        for ik, ia in items:  # each item of a many-item script, as a call of its own under the item names
            calls.append((f"{name}:item", dict(ik), dict(ia)))
        return original(self, name, keys, argv, client, items)

    monkeypatch.setattr(ScriptRunner, "call", spy)
    return calls


def _full_lifecycle(q: mc_queue.Client) -> None:
    failure = make_failure(FailureClass.PROVIDER, "RateLimited", "429")
    q.backend.open_namespace()
    a = q.producer.enqueue("jobs", "h", {"n": 1}, "key-1")
    q.producer.enqueue_many([NewTask("jobs", "h", {"bulk": i}, f"bulk-{i}") for i in range(2)])
    q.schedule.mark_dispatched(f"{a.id}/1", recheck_ms=60_000)
    q.maintenance.due_dispatches()
    la = q.leases.claim_attempt(a.id, "w", 60_000)
    q.leases.renew_lease(la.attempt_id, la.fence, worker_id="w")
    q.leases.checkpoint(la.attempt_id, la.fence, "claimed", 0, {"phase": "claimed"}, worker_id="w")
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": True}, worker_id="w")
    b = q.producer.enqueue("jobs", "h", {"n": 2})
    lb = q.leases.claim_attempt(b.id, "w", 60_000)
    q.leases.fail_attempt(lb.attempt_id, lb.fence, failure, worker_id="w")
    q.operator.retry_task(b.id, "the provider limit has reset now")
    lb2 = q.leases.claim_attempt(b.id, "w", 100)
    deadline = time.monotonic() + 5
    while not q.maintenance.expire_leases():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    reconcile_attempt(q, lb2.attempt_id)
    e = q.producer.enqueue("jobs", "h", {"n": 4})
    le = q.leases.claim_attempt(e.id, "w", 60_000)
    key = mc_queue.mint_key(e.id, "open-pr", "sha1")
    q.leases.effect_begin(le.attempt_id, le.fence, key, {"operation": "open-pr", "identity": "sha1"}, worker_id="w")
    q.leases.effect_done(le.attempt_id, le.fence, key, "done", {"pr": 1}, actor="w")
    q.operator.cancel_task(e.id, "the operator no longer needs this")
    q.leases.acknowledge_cancel(le.attempt_id, le.fence, worker_id="w")
    reconcile_attempt(q, le.attempt_id)
    f = q.producer.enqueue("jobs", "h", {"n": 5})
    lf = q.leases.claim_attempt(f.id, "w", 60_000)
    poison = mc_queue.Decision("quarantine", "header test quarantines", attention={"task_id": f.id})
    q.leases.fail_attempt(lf.attempt_id, lf.fence, make_failure(FailureClass.INTERNAL, "Bug", "x"), worker_id="w",
                   decision=poison)
    q.operator.dlq_replay(f.id, "the bug was fixed in the handler")
    lf2 = q.leases.claim_attempt(f.id, "w", 60_000)
    q.leases.fail_attempt(lf2.attempt_id, lf2.fence, make_failure(FailureClass.INTERNAL, "Bug", "x"), worker_id="w",
                   decision=poison)
    q.operator.dlq_purge(f.id, reason="header test purges")
    assert q.maintenance.pack_tasks([a.id]) == 1  # a succeeded above: its history is packed, then it is retired
    q.operator.retire_task(a.id, states=["succeeded"], reason="header test retires", tombstone_s=0.001)
    q.maintenance.trim_idempotency()
    q.maintenance.trim_spend()
    e = q.producer.enqueue("emptied", "h", {"n": 4})
    q.operator.cancel_task(e.id, reason="header test empties a queue")
    q.operator.retire_task(e.id, states=["canceled"], reason="header test retires", tombstone_s=0)
    assert q.maintenance.forget_empty_queues() == ["emptied"]
    q.operator.pause_queue("jobs", reason="header test pauses")
    q.limits.set("github", 5, per_s=60, reason="header test limits")
    limited = q.producer.enqueue("jobs2", "h", {"n": "limited"}, limits={"github": 1})
    ll = q.leases.claim_attempt(limited.id, "w", 60_000, limits=("github",))
    q.leases.stamp_limit(ll.attempt_id, ll.fence, "github", worker_id="w")
    q.limits.pause("github", 1, reason="header test pauses a limit")
    q.limits.set_breaker("github", reason="header test sets a breaker")
    q.limits.record("github", False, 5, fingerprint="0123456789abcdef", attempt_id=ll.attempt_id, actor="w")
    q.limits.trip("github", 1, reason="header test trips a breaker")
    q.limits.reset("github", reason="header test resets a breaker")
    q.slots.set("repo:*", 1, reason="header test sets a family's slots")
    held, waits = (q.producer.enqueue("jobs2", "h", {"slot": i}, limits={"repo:a": 1}) for i in range(2))
    lh = q.leases.claim_attempt(held.id, "w", 60_000, limits=("repo:a",))
    with pytest.raises(mc_queue.OverLimit):
        q.leases.claim_attempt(waits.id, "w", 60_000, limits=("repo:a",))
    q.leases.complete_attempt(lh.attempt_id, lh.fence, {"ok": True}, worker_id="w")
    assert q.slots.wake_due(audit=True) == [f"{waits.id}/1"]
    q.slots.delete("repo:*", reason="header test deletes a family's slots")
    q.caps.set("capped", 1, reason="header test caps a queue")
    q.producer.enqueue("capped", "h", {"n": "fits"})
    with pytest.raises(mc_queue.QueueFull):
        q.producer.enqueue("capped", "h", {"n": "over"})
    q.caps.delete("capped", reason="header test lifts a cap")
    q.fairness.set_weight("tenant:*", 3, reason="header test weighs a family")
    fair = q.producer.enqueue("jobs", "h", {"n": "fair"}, fair_key="tenant:a")
    rq = rq_connection(q)
    try:
        assert dispatch(q, rq, fair, fair.attempts[0])
        assert move_laned(q, rq, "jobs", 5, 4, job_id(q.keys.prefix, f"{fair.id}/1"))  # priority aging
        assert take_from_lane(q, f"rq:queue:{rq_queue_name(q.keys.prefix, 'jobs', 4)}") == job_id(q.keys.prefix,
                                                                                                  f"{fair.id}/1")
        assert dispatch(q, rq, fair, fair.attempts[0])
        assert take_from_lane(q, f"rq:queue:{rq_queue_name(q.keys.prefix, 'jobs')}") == job_id(q.keys.prefix,
                                                                                               f"{fair.id}/1")
    finally:
        rq.close()
    q.fairness.trim("jobs")
    q.fairness.delete_weight("tenant:*", reason="header test lifts a family's weight")
    q.operator.resume_queue("jobs", reason="header test resumes")
    q.periodic.publish(PeriodicSchedule(name="every-minute", handler="h", queue="jobs", every_s=60, catch_up="all",
                                        overlap="queue"))
    q.redis.hset(q.keys.periodic_state("every-minute"), "cursor", q.backend.redis_time_ms() - 180_000)
    assert [t.outcome for t in q.periodic.run_due()] == ["ran", "ran", "ran"]  # decide, enqueue and done each
    q.periodic.pause("every-minute", reason="header test pauses a schedule")
    q.periodic.resume("every-minute", reason="header test resumes a schedule")
    parent = q.producer.enqueue("jobs", "h", {"n": 6})
    q.producer.enqueue("jobs", "h", {"n": 7}, after=[parent.id])
    q.operator.cancel_task(parent.id, reason="header test ends a parent")
    assert len(q.dependencies.release_due().canceled) == 1
    q.redis.zadd(q.keys.suspect, {"not an attempt id": 1})
    q.maintenance.drop_index_entry("suspect", "not an attempt id", reason="header test plants an orphan")
    c = q.producer.enqueue("jobs", "h", {"n": 3})
    q.leases.claim_attempt(c.id, "w", 60_000)  # a live lease for recover to void
    q.backend.assert_lineage()  # the claim sequence seen, presented (a lineage check with evidence)
    recover(q, reason="header test")
    q.reads.get_task(b.id)
    q.reads.status()


def test_the_client_passes_exactly_the_header_names_to_every_script(
        q: mc_queue.Client, recorded: list[tuple[str, dict[str, str], dict[str, Any]]]) -> None:
    _full_lifecycle(q)
    called = {name for name, _, _ in recorded if not name.endswith(":item")}
    assert called == set(NAMES), f"scripts never called by the lifecycle: {sorted(set(NAMES) - called)}"
    for name, keys, argv in recorded:
        spec = SPECS[name.removesuffix(":item")]
        want_keys, want_argv = (spec.item_keys, spec.item_argv) if name.endswith(":item") else (spec.keys, spec.argv)
        assert tuple(sorted(keys)) == tuple(sorted(want_keys)), f"{name}: KEYS {sorted(keys)} != {want_keys}"
        assert tuple(sorted(argv)) == tuple(sorted(want_argv)), f"{name}: ARGV {sorted(argv)} != {want_argv}"
        for key_name, value in keys.items():
            assert value.startswith(q.keys.tag + ":"), f"{name}: key {key_name}={value!r} outside the namespace slot"
            assert _expected_key(q, key_name, value), f"{name}: KEYS {key_name!r} is given {value!r}"
        if "task" in keys:
            base = keys["task"]
            for key_name, suffix in (("attempts", ":a"), ("events", ":ev")):
                if key_name in keys:
                    assert keys[key_name] == base + suffix, f"{name}: {key_name} of another task"


class _Untouchable:
    """A client that fails the test if a script call reaches it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the call reached the Redis client ({name}) despite wrong names")


@pytest.mark.parametrize("change", ["missing", "extra", "renamed"])
def test_a_wrong_name_is_refused_before_reaching_redis(q: mc_queue.Client, change: str) -> None:
    scripts = ScriptRunner(q.redis)
    keys = {"index": q.keys.leases}
    argv: dict[str, Any] = {"limit": 10}
    assert scripts.call("due", keys, argv)[1:] == []  # the right names work
    if change == "missing":
        argv = {}
    elif change == "extra":
        keys = {**keys, "meta": q.keys.meta}
    else:
        argv = {"max": 10}
    with pytest.raises(TypeError):
        scripts.call("due", keys, argv, client=_Untouchable())
