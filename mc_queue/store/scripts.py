"""Loads the Lua scripts of ``lua/`` and runs them: one entry per script, resends decided by its header.

A script's header is its contract: ``-- KEYS[i] name`` and ``-- ARGV[i] name`` lines, its replies and
whether a resend is safe (``-- Idempotent: yes | by request id | no``). Callers pass keys and
arguments by name; a name missing or extra is a programming error raised here, before anything
reaches Redis, so the header and the code cannot drift apart silently.

:class:`ScriptRunner` runs scripts on a redis-py connection whose own retries are off (redis-py
would re-send a command after a timeout without saying so: a claim ran 11 times here). After a
connection error or a timeout it re-sends a script only when the script's header says a resend is
safe; otherwise it raises :class:`~mc_queue.contracts.errors.OutcomeUnknown`.

Acknowledged writes (:data:`ACKNOWLEDGED`: the transitions a caller acts on) can be made durable on
replicas: with ``min_replicas`` N > 0 the script is sent in one pipeline with a counter increment
(so the connection's replication offset covers everything the primary holds, a resend that
answers DUP included) and ``WAIT N timeout``, all on one connection; fewer than N confirmations
raise :class:`~mc_queue.contracts.errors.ReplicationUnconfirmed` (the write is applied on the primary only).
With tracking on, ``INFO replication`` rides in the same pipeline and ``on_ack`` gets the primary's
replication id and offset after the write (the client's watermark, :mod:`mc_queue.store.lineage`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ..contracts.errors import SUCCESS_CODES, OutcomeUnknown, replication_unconfirmed
from .lineage import Replication
from .lua_includes import shaken

_HEADER_RE = re.compile(r"^--\s+(KEYS|ARGV|ITEMKEYS|ITEMARGV)\[(\d+)\]\s+(\w+)")
_IDEMPOTENT_RE = re.compile(r"^--\s+Idempotent:\s*(\S+)", re.M)
RESENDS = 3  # resends of an idempotent script after a connection error or a timeout

# Transitions a caller acts on once they are acknowledged (a producer forgets its work, a worker runs
# an Attempt or calls a provider, an operator is told it is done): with min_replicas > 0 they return
# only after WAIT confirmed them, and they advance the replication watermark.
ACKNOWLEDGED = frozenset({
    "init", "enqueue", "claim", "complete", "fail", "checkpoint", "effect_begin", "effect_done", "cancel",
    "cancel_ack", "retry", "reconcile_settle", "dlq_replay", "dlq_purge", "recover_begin", "recover_finish",
    "queue_pause", "periodic_publish", "periodic_pause", "enqueue_many", "enqueue_after", "limit_admin",
    "limit_stamp", "breaker_record", "queue_cap",
})
# Writes whose loss is re-derived rather than relied on: a renewal lost makes a lease run out sooner
# (expired, reconciled); an expiry, a dispatch mark, an index drop or a reconcile_begin lost is done
# again by the next sweep; lineage records a loss that is found again. And one read-only script.
# A pack, a retirement or a trim lost is done again by the next sweep (the task is still finished, still
# past its retention; an archive record written twice is read as its last); so is a forgotten queue.
# A periodic tick decided or closed and lost is decided again by the next sweep: its producer key
# (periodic:<name>:<tick>) makes the same task once, whichever task id the new decision chose. A release
# lost leaves the parent in the released index its (acknowledged) end wrote: the next sweep releases again.
# A concurrency slot's wake lost (slot_wake, slot_audit) is found again by the next sweep's audit: a key with a
# free slot and Attempts waiting for it. A spend ledger's trim lost leaves buckets no window reads: the next
# sweep drops them. The fair lanes are transport: a message queued in a lane and lost is not waiting, so the
# sweeper sends it again (its Attempt not claimed in time); one taken and the taking lost is taken twice (the
# claim refuses the second); an idle key's pass trimmed and lost is trimmed again; a message aging took out of
# its lane and lost before the lane a level up is not waiting either, and is sent again.
REDERIVED = frozenset({"renew", "expire", "mark_dispatched", "index_drop", "reconcile_begin", "lineage", "due",
                       "pack", "retire", "idem_trim", "queue_forget", "periodic_decide", "periodic_done", "release",
                       "slot_wake", "slot_audit", "spend_trim", "fair_push", "fair_pop", "fair_trim",
                       "fair_take"})


def lua_dir() -> Path:
    """The ``lua/`` folder: inside the installed package, else beside it in a source checkout."""
    here = Path(__file__).resolve().parent.parent  # the mc_queue package
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "claim.lua").is_file():
            return candidate
    raise FileNotFoundError(f"mc_queue's lua/ scripts are missing (looked in {here / 'lua'} and {here.parent / 'lua'})")


@dataclass(frozen=True)
class ScriptSpec:
    name: str
    source: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    idempotent: bool  # the header says a resend is safe
    # A script of many items (enqueue_many): after its own KEYS and ARGV, each item's, in these groups
    item_keys: tuple[str, ...] = ()
    item_argv: tuple[str, ...] = ()


def parse_header(name: str, text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The script's own KEYS and ARGV names, in order (:func:`parse_items` reads a many-item script's)."""
    found = _header_lines(name, text)
    return found["KEYS"], found["ARGV"]


def parse_items(name: str, text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A many-item script's KEYS and ARGV of each item (``-- ITEMKEYS[i] name``, ``-- ITEMARGV[i] name``),
    which follow its own in groups, one per item; empty for every other script."""
    found = _header_lines(name, text)
    return found["ITEMKEYS"], found["ITEMARGV"]


def _header_lines(name: str, text: str) -> dict[str, tuple[str, ...]]:
    found: dict[str, dict[int, str]] = {"KEYS": {}, "ARGV": {}, "ITEMKEYS": {}, "ITEMARGV": {}}
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        m = _HEADER_RE.match(line)
        if m:
            found[m.group(1)][int(m.group(2))] = m.group(3)
    out = {}
    for kind, idx in found.items():
        if sorted(idx) != list(range(1, len(idx) + 1)):
            raise ValueError(f"{name}.lua: {kind} in the header are not numbered 1..{len(idx)}")
        out[kind] = tuple(idx[i] for i in range(1, len(idx) + 1))
    return out


def parse_idempotent(name: str, text: str) -> bool:
    """``Idempotent: yes ...`` or ``Idempotent: by ...`` -> True; ``Idempotent: no ...`` -> False."""
    m = _IDEMPOTENT_RE.search(text)
    if not m:
        raise ValueError(f"{name}.lua: the header has no 'Idempotent:' line")
    word = m.group(1).lower()
    if word not in ("yes", "by", "no"):
        raise ValueError(f"{name}.lua: 'Idempotent:' must start with yes, by or no, not {word!r}")
    return word != "no"


def load_specs(directory: Path | None = None) -> dict[str, ScriptSpec]:
    directory = directory or lua_dir()
    includes = {p.stem: p.read_text() for p in (directory / "includes").glob("*.lua")}
    specs = {}
    for path in sorted(directory.glob("*.lua")):
        text = path.read_text()
        keys, argv = parse_header(path.stem, text)

        item_keys, item_argv = parse_items(path.stem, text)
        specs[path.stem] = ScriptSpec(path.stem, shaken(text, includes), keys, argv,
                                      parse_idempotent(path.stem, text), item_keys, item_argv)
    return specs


_SPECS: dict[str, ScriptSpec] | None = None


def specs() -> dict[str, ScriptSpec]:
    global _SPECS
    if _SPECS is None:
        _SPECS = load_specs()
    return _SPECS


Items = Sequence[tuple[Mapping[str, str], Mapping[str, Any]]]  # a many-item script's (KEYS, ARGV) per item
# One call of a batch: (script, KEYS, ARGV) or (script, KEYS, ARGV, items)
BatchCall = tuple[str, Mapping[str, str], Mapping[str, Any]] | tuple[str, Mapping[str, str], Mapping[str, Any], Items]


class Observer(Protocol):
    """Sees every script call the runner makes (tests use it to check transitions against the table)."""

    def before(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any]) -> Any: ...

    def after(self, token: Any, reply: Any) -> None: ...


class ScriptRunner:
    """The scripts bound to one redis-py client (EVALSHA, loading the script on NOSCRIPT)."""

    def __init__(self, client: redis.Redis, *, resends: int = RESENDS,
                 sleep: Callable[[float], None] = time.sleep, min_replicas: int = 0,
                 replica_timeout_ms: int = 1000, ack_key: str | None = None) -> None:
        self._client = client
        self._resends = resends
        self._sleep = sleep
        self._scripts: dict[str, tuple[ScriptSpec, Script]] = {
            name: (spec, Script(client, spec.source)) for name, spec in specs().items()
        }
        self.observers: list[Observer] = []
        if min_replicas and not ack_key:
            raise ValueError("min_replicas needs ack_key: a hash the runner may increment before WAIT")
        self.min_replicas = min_replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.ack_key = ack_key
        self.track = False  # read INFO replication with every acknowledged write (the watermark)
        self.on_ack: Callable[[str, list[Any], Replication], None] | None = None
        self.on_link_error: Callable[[], None] | None = None  # a connection error or timeout was seen
        self.before_resend: Callable[[str], None] | None = None  # before a resend after one (a lineage check)

    def spec(self, name: str) -> ScriptSpec:
        return self._scripts[name][0]

    def _args(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any],
              items: Items = ()) -> tuple[list[str], list[Any]]:
        spec = self._scripts[name][0]
        if set(keys) != set(spec.keys) or set(argv) != set(spec.argv):
            raise TypeError(
                f"{name}.lua expects KEYS {spec.keys} and ARGV {spec.argv}; "
                f"got KEYS {tuple(keys)} and ARGV {tuple(argv)}"
            )
        k, a = [keys[x] for x in spec.keys], [_arg(argv[x]) for x in spec.argv]
        if items and not spec.item_keys:
            raise TypeError(f"{name}.lua takes {'items' if spec.item_keys else 'no items'}; got {len(items)}")
        for ik, ia in items:
            if set(ik) != set(spec.item_keys) or set(ia) != set(spec.item_argv):
                raise TypeError(f"{name}.lua expects each item's KEYS {spec.item_keys} and ARGV {spec.item_argv}; "
                                f"got KEYS {tuple(ik)} and ARGV {tuple(ia)}")
            k += [ik[x] for x in spec.item_keys]
            a += [_arg(ia[x]) for x in spec.item_argv]
        return k, a

    def call(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any], client: Any = None,
             items: Items = ()) -> Any:
        """One send, no resend (``client`` may be a pipeline)."""
        k, a = self._args(name, keys, argv, items)
        return self._scripts[name][1](keys=k, args=a, client=client or self._client)

    def _acknowledged(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any],
                      items: Items = ()) -> tuple[Any, int, Any]:
        """One pipeline on one connection: EVALSHA, then (min_replicas) a counter increment, (tracking)
        INFO replication, (min_replicas) WAIT. Returns (script reply, replicas that confirmed, INFO)."""
        spec, script = self._scripts[name]
        k, a = self._args(name, keys, argv, items)
        for _ in range(2):
            pipe: Any = self._client.pipeline(transaction=False)  # execute_command is untyped
            pipe.execute_command("EVALSHA", script.sha, len(k), *k, *a)
            if self.min_replicas:
                # Any write moves this connection's replication offset to the primary's: WAIT then
                # covers everything the primary holds, the original write of a resend that answers DUP too.
                pipe.execute_command("HINCRBY", self.ack_key, "replication_waits", 1)
            if self.track:
                pipe.execute_command("INFO", "replication")
            if self.min_replicas:
                pipe.execute_command("WAIT", self.min_replicas, self.replica_timeout_ms)
            replies = pipe.execute(raise_on_error=False)
            if isinstance(replies[0], NoScriptError):  # the script did not run: loading it and resending is safe
                script.sha = self._client.script_load(spec.source)
                continue
            break
        if isinstance(replies[0], Exception):
            raise replies[0]
        info = replies[-2 if self.min_replicas else -1] if self.track else None
        acked = replies[-1] if self.min_replicas else 0
        return replies[0], (acked if isinstance(acked, int) else -1), info

    def run(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any], items: Items = ()) -> list[Any]:
        """Run a script; after a connection error or timeout, resend it only if its header says that is safe.
        ``items``: a many-item script's (KEYS, ARGV) of each item."""
        # (an observer sees a many-item script once, then once for each item, under the same name)
        watched = [(o, o.before(name, keys, argv)) for o in self.observers]
        watched += [(o, o.before(name, ik, ia)) for ik, ia in items for o in self.observers]
        attempts = (self._resends if self.spec(name).idempotent else 0) + 1
        acknowledged = name in ACKNOWLEDGED and (self.min_replicas > 0 or self.track)
        last: Exception | None = None
        for i in range(attempts):
            try:
                if i and self.before_resend is not None:
                    self.before_resend(name)  # the link broke: maybe another primary now (raises to stop the resend)
                if acknowledged:
                    reply, acked, info = self._acknowledged(name, keys, argv, items)
                else:
                    reply, acked, info = self.call(name, keys, argv, items=items), 0, None
                out = reply if isinstance(reply, list) else [reply]
                for o, t in watched:
                    o.after(t, out)
                if acknowledged and str(out[0]) in SUCCESS_CODES:
                    if self.min_replicas and acked < self.min_replicas:
                        raise replication_unconfirmed(name, acked=max(acked, 0), wanted=self.min_replicas,
                                                      timeout_ms=self.replica_timeout_ms)
                    if info is not None and self.on_ack is not None:
                        self.on_ack(name, out, Replication.parse(info))
                return out
            except redis.AuthenticationError:
                raise  # wrong credentials: resending cannot help
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                last = exc
                if self.on_link_error is not None:
                    self.on_link_error()
                if i + 1 < attempts:
                    self._sleep(min(0.05 * (2**i), 1.0))
        assert last is not None
        if not self.spec(name).idempotent:
            raise OutcomeUnknown(f"{name}: the connection failed after the script was sent ({last}); it is not "
                                 "safe to resend, so it may or may not have run: read the state back",
                                 script=name) from last
        raise last

    def run_batch(self, calls: Sequence[BatchCall]) -> list[Any]:
        """Many calls of idempotent scripts, of any names, in one round trip (a worker's batch: the
        completions of what it ran and the claims of what it runs next). Each reply comes back as the
        script gave it, or as the exception object (one bad entry hides nothing). After a connection
        error or a timeout the whole batch is sent again, which only idempotent scripts allow. When one
        of the calls is an acknowledged write and ``min_replicas`` > 0 the batch ends with one WAIT,
        which covers every write before it on this connection: fewer confirmations raise
        :class:`~mc_queue.contracts.errors.ReplicationUnconfirmed` with the replies in ``.replies``
        (applied on the primary only). A call may carry a fourth element: a many-item script's items.
        """
        if not calls:
            return []
        for c in calls:
            assert self.spec(c[0]).idempotent, f"{c[0]} is not idempotent: run it alone"
        args = [(c[0], *self._args(c[0], c[1], c[2], c[3] if len(c) > 3 else ())) for c in calls]
        tokens = [[o.before(c[0], c[1], c[2]) for o in self.observers] for c in calls]
        acknowledged = any(c[0] in ACKNOWLEDGED for c in calls) and (self.min_replicas > 0 or self.track)
        last: Exception | None = None
        for i in range(self._resends + 1):
            try:
                if i and self.before_resend is not None:
                    self.before_resend(calls[0][0])
                replies, acked, info = self._batch_once(args, acknowledged)
                break
            except redis.AuthenticationError:
                raise
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                last = exc
                if self.on_link_error is not None:
                    self.on_link_error()
                if i < self._resends:
                    self._sleep(min(0.05 * (2**i), 1.0))
        else:
            assert last is not None
            raise last
        outs = [r if isinstance(r, (list, Exception)) else [r] for r in replies]
        for toks, out in zip(tokens, outs, strict=True):
            for o, t in zip(self.observers, toks, strict=True):
                o.after(t, out)
        wrote = [(c[0], out) for c, out in zip(calls, outs, strict=True)
                 if c[0] in ACKNOWLEDGED and isinstance(out, list) and str(out[0]) in SUCCESS_CODES]
        if acknowledged and wrote:
            if self.min_replicas and acked < self.min_replicas:
                unconfirmed = replication_unconfirmed(wrote[0][0], acked=max(acked, 0), wanted=self.min_replicas,
                                                      timeout_ms=self.replica_timeout_ms)
                unconfirmed.replies = outs
                raise unconfirmed
            if info is not None and self.on_ack is not None:
                self.on_ack(wrote[-1][0], wrote[-1][1], Replication.parse(info))
        return outs

    def _batch_once(self, args: Sequence[tuple[Any, ...]], acknowledged: bool) -> tuple[list[Any], int, Any]:
        """One pipeline: every EVALSHA (those answered NOSCRIPT did not run: loaded and sent again), then
        as in :meth:`_acknowledged` the counter, INFO and WAIT. Returns (script replies, confirmations, INFO)."""
        todo = list(range(len(args)))
        replies: list[Any] = [None] * len(args)
        acked: Any = 0
        info: Any = None
        for _ in range(2):
            pipe: Any = self._client.pipeline(transaction=False)  # execute_command is untyped
            for j in todo:
                name, k, a = args[j]
                pipe.execute_command("EVALSHA", self._scripts[name][1].sha, len(k), *k, *a)
            if acknowledged and self.min_replicas:
                pipe.execute_command("HINCRBY", self.ack_key, "replication_waits", 1)
            if acknowledged and self.track:
                pipe.execute_command("INFO", "replication")
            if acknowledged and self.min_replicas:
                pipe.execute_command("WAIT", self.min_replicas, self.replica_timeout_ms)
            out = pipe.execute(raise_on_error=False)
            for j, r in zip(todo, out, strict=False):
                replies[j] = r
            if acknowledged and self.track:
                info = out[-2 if self.min_replicas else -1]
            if acknowledged and self.min_replicas:
                acked = out[-1]
            missing = [j for j in todo if isinstance(replies[j], NoScriptError)]
            if not missing:
                break
            for name in {args[j][0] for j in missing}:
                spec, script = self._scripts[name]
                script.sha = self._client.script_load(spec.source)
            todo = missing
        return replies, (acked if isinstance(acked, int) else -1), info

    def run_many(self, name: str, calls: Sequence[tuple[Mapping[str, str], Mapping[str, Any]]]) -> list[Any]:
        """Many calls of one idempotent script in one pipeline; a reply that is an error comes back as
        the exception object, so one bad entry does not hide the others."""
        assert self.spec(name).idempotent, f"{name} is not idempotent: run it alone"
        tokens = [[o.before(name, k, a) for o in self.observers] for k, a in calls]
        for i in range(self._resends + 1):
            pipe = self._client.pipeline(transaction=False)
            for k, a in calls:
                self.call(name, k, a, client=pipe)
            try:
                replies = pipe.execute(raise_on_error=False)
                break
            except (redis.ConnectionError, redis.TimeoutError):
                if self.on_link_error is not None:
                    self.on_link_error()
                if i == self._resends:
                    raise
                self._sleep(min(0.05 * (2**i), 1.0))
        for toks, reply in zip(tokens, replies, strict=True):
            for o, t in zip(self.observers, toks, strict=True):
                o.after(t, reply)
        return list(replies)


def _arg(value: Any) -> str | int | bytes:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, str, bytes)):
        return value
    return str(value)
