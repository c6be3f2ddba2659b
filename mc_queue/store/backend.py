"""The backend: the one way mc_queue runs a Lua script, and what a client knows about the Redis it runs on.

:meth:`Backend.run` is the only caller of :class:`~mc_queue.store.scripts.ScriptRunner` (which re-sends
only what a script's header declares idempotent, and waits for replicas when asked). Around it the
backend keeps the connections (a reader, and a writer with redis-py's retries off), the namespace's
epoch (:meth:`Backend.epoch`, :meth:`Backend.with_epoch`), and the replication watermark of every
acknowledged write, judged against the primary's history (:meth:`Backend.check_lineage`).

The typed calls, one per script, are the roles of :mod:`mc_queue.client`, which all run through here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..contracts.codec import MAX_INT, check_int, check_text
from ..contracts.errors import (
    Code,
    ConfigurationError,
    InvalidArgument,
    NamespaceLost,
    ReplicationUnconfirmed,
    raise_for_reply,
)
from ..contracts.keys import Keys
from ..contracts.models import NamespaceInfo
from .lineage import Replication, SlotStore, Watermark, judge
from .namespace import NamespaceState
from .scripts import ACKNOWLEDGED, BatchCall, Items, ScriptRunner
from .urls import DEFAULT_REPLICA_TIMEOUT_MS, MAX_MIN_REPLICAS, TRACK_MODES, make_redis, parse_url

# The default lease: a heartbeat thread renews it every third (~3.3 s) whatever the handler does,
# so a long tool call is not expired while its process lives; a vanished worker is noticed within
# one lease plus one sweep (about 11 s with the sweeper's 1 s default interval).
DEFAULT_LEASE_MS = 10_000
# With a redis+sentinel:// URL an acknowledged transition is on this many replicas unless the URL or the
# Client says otherwise (?min_replicas=0): a planned SENTINEL FAILOVER leaves the old primary taking writes
# for ~10 s, which vanish with it; WAIT turns them into ReplicationUnconfirmed errors instead.
DEFAULT_SENTINEL_MIN_REPLICAS = 1
DEFAULT_MAX_LEASE_MS = 3_600_000  # a namespace's lease ceiling unless it was created with another
log = logging.getLogger("mc_queue.client")
# No lineage pre-check before these: init (open_namespace checks right after it, and reports a loss as
# the namespace's state instead of raising) and recovery's own steps (they run on a lost namespace).
_NO_PRECHECK = frozenset({"init", "recover_begin", "recover_finish"})


def quiet_connection_kwargs() -> dict[str, Any]:
    """Skip redis-py's CLIENT SETINFO handshake (two round trips and a package-metadata lookup per new
    connection, which a forked work horse pays for every Attempt)."""
    import inspect

    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


def fresh_connection(conn: Any) -> None:
    """redis-py's handshake on a new connection, and no health-check PING right after it: redis-py would
    PING before the first command of every new connection (its next check is due at 0), a round trip that a
    forked work horse pays on each of its connections for every Attempt. A connection just made is alive;
    the check runs from then on, once the connection was idle for the interval."""
    if conn.health_check_interval:  # (before the handshake: its first command would PING first)
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    conn.on_connect()


def _raw_reply(response: Any, **_options: Any) -> Any:
    return response


def _default_actor() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Backend:
    """A connection to one mc_queue namespace, and the one runner of its scripts.

    ``redis`` is a redis-py client for reads. ``writer`` runs the transitions with redis-py's own
    retries off; :attr:`runner` re-sends a script only when its header says that is safe. Both are
    built from ``url`` by :func:`mc_queue.store.urls.make_redis` (a ``redis+sentinel://`` URL follows a
    failover without a restart).

    ``min_replicas`` / ``replica_timeout_ms`` (or the URL's parameters of those names): an
    acknowledged transition returns only once ``WAIT`` confirmed it on that many replicas
    (:class:`~mc_queue.contracts.errors.ReplicationUnconfirmed` otherwise). Default: 1 with a
    ``redis+sentinel://`` URL, 0 with any other. ``track_replication`` (auto | on |
    off; auto: on with a sentinel URL, min_replicas > 0, or a primary that has replicas or took over
    another's history) keeps the replication watermark of every acknowledged write, in memory and,
    with ``state_dir`` (default ``$MCQ_STATE_DIR``), in a slot file a restarted process finds;
    :meth:`check_lineage` compares it with the primary's history when the client connects, after a
    connection error and at every sweeper pass, and marks the namespace lost when acknowledged
    writes are gone.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "mcq",
        witness_path: str | os.PathLike[str] | None = None,
        actor: str | None = None,
        socket_timeout: float = 10.0,
        max_lease_ms: int = DEFAULT_MAX_LEASE_MS,
        redis_class: type[redis.Redis] = redis.Redis,
        min_replicas: int | None = None,
        replica_timeout_ms: int | None = None,
        track_replication: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        allow_eviction: bool | None = None,
    ) -> None:
        self.url = url
        self.target = parse_url(url)
        try:
            self.keys = Keys(prefix)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        self.actor = check_text(actor or _default_actor(), what="actor", max_bytes=200, spaces=False)
        self.max_lease_ms = check_int(max_lease_ms, what="max_lease_ms", low=1000, high=7 * 86_400_000)
        if min_replicas is None:  # the URL's; else, with Sentinel, acknowledged means replicated (on 1 replica)
            min_replicas = self.target.min_replicas if self.target.min_replicas is not None else \
                (DEFAULT_SENTINEL_MIN_REPLICAS if self.target.sentinel else 0)
        self.min_replicas = check_int(min_replicas, what="min_replicas", high=MAX_MIN_REPLICAS)
        self.replica_timeout_ms = check_int(
            (self.target.replica_timeout_ms or DEFAULT_REPLICA_TIMEOUT_MS) if replica_timeout_ms is None
            else replica_timeout_ms, what="replica_timeout_ms", low=1, high=60_000)
        if self.min_replicas and self.replica_timeout_ms >= socket_timeout * 1000:
            raise ConfigurationError(f"replica_timeout_ms ({self.replica_timeout_ms}) must be below the socket "
                                     f"timeout ({socket_timeout:g} s): WAIT blocks the connection that long")
        mode = track_replication or self.target.track_replication or "auto"
        if mode not in TRACK_MODES:
            raise ConfigurationError(f"track_replication must be one of {', '.join(TRACK_MODES)}, not {mode!r}")
        self.track_mode = mode
        # An evicting maxmemory-policy drops fences, leases and records: refused at open_namespace
        # unless the operator says otherwise (allow_eviction=True or MCQ_ALLOW_EVICTION=1), loudly.
        self.allow_eviction = (os.environ.get("MCQ_ALLOW_EVICTION", "") == "1") if allow_eviction is None \
            else bool(allow_eviction)
        self.ns = NamespaceState(prefix, witness_path)
        # surrogateescape: bytes that are not UTF-8 (written by someone else) read back losslessly
        # instead of failing the read, and go back to Redis unchanged (an index member to drop).
        common: dict[str, Any] = dict(decode_responses=True, encoding_errors="surrogateescape",
                                      socket_timeout=socket_timeout,
                                      socket_connect_timeout=socket_timeout, health_check_interval=30,
                                      **quiet_connection_kwargs())
        self.redis: redis.Redis = make_redis(self.target, redis_class=redis_class, redis_connect_func=fresh_connection,
                                             **common)
        self.writer: redis.Redis = make_redis(self.target, redis_class=redis_class, retry=Retry(NoBackoff(), 0),
                                              redis_connect_func=self._writer_connected, **common)
        # INFO as the server wrote it: redis-py's parser turns an all-digit replication id into a number
        # (and '000...0' into 0); lineage.Replication.parse reads the text.
        self.writer.set_response_callback("INFO", _raw_reply)
        self.runner = ScriptRunner(self.writer, min_replicas=self.min_replicas,
                                   replica_timeout_ms=self.replica_timeout_ms, ack_key=self.keys.stats)
        self.runner.track = mode == "on" or (mode == "auto" and (self.target.sentinel or self.min_replicas > 0))
        self.runner.on_ack = self._acknowledged
        self.runner.on_link_error = self._link_error
        self.runner.before_resend = self._before_resend
        self.watermark = Watermark()
        state = state_dir or os.environ.get("MCQ_STATE_DIR") or None
        self.slots: SlotStore | None = SlotStore(state, prefix) if state and mode != "off" else None
        self._replid: str | None = None  # the primary's replication id at the last acknowledged write
        self._lineage_due = False  # check the lineage before the next acknowledged write
        self._checking = False
        self.slot_error: str | None = None  # why the slot file could not be written, if it could not

    def close(self) -> None:
        self.redis.close()
        self.writer.close()
        if self.slots is not None:
            self.slots.close()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any], items: Items = ()) -> list[Any]:
        if name in ACKNOWLEDGED:
            self._precheck(name)  # the link broke or the primary changed since the last write: judge first
        try:
            return self.runner.run(name, keys, argv, items)
        except ReplicationUnconfirmed:
            # The node this write reached has no replica confirming it: maybe not the primary any more (a
            # planned failover leaves the old one taking writes for seconds). The next call asks anew.
            self._follow_primary()
            raise

    def pipelined(self, pipe: Any, name: str, keys: Mapping[str, str], argv: Mapping[str, Any]) -> None:
        """Add one call of a script to ``pipe`` (any redis-py pipeline on this server, a MULTI of RQ's
        included; the script is loaded before the pipeline runs): its reply is the pipeline's, and no
        resend is made here (the pipeline's owner decides). For transport bookkeeping, not transitions."""
        assert name not in ACKNOWLEDGED, f"{name} is an acknowledged write: run it with run()"
        self.runner.call(name, keys, argv, client=pipe)

    def run_batch(self, calls: Sequence[BatchCall]) -> list[Any]:
        """Idempotent scripts of any names in one round trip (:meth:`ScriptRunner.run_batch`), judged
        like :meth:`run`: the lineage first when one of them is an acknowledged write."""
        acknowledged = [c[0] for c in calls if c[0] in ACKNOWLEDGED]
        if acknowledged:
            self._precheck(acknowledged[0])
        try:
            return self.runner.run_batch(calls)
        except ReplicationUnconfirmed:
            self._follow_primary()
            raise

    def _follow_primary(self) -> None:
        """With a Sentinel URL: ask the sentinels where the primary is now. redis-py then drops this
        client's idle connections to any other node, so the next command reaches the primary they name:
        a connection left on a demoted primary, or on the old one still taking writes after a planned
        failover, is neither where writes go nor what the lineage is judged by."""
        if not self.target.sentinel:
            return
        for client in (self.writer, self.redis):
            ask = getattr(client.connection_pool, "get_master_address", None)
            if ask is not None:
                with contextlib.suppress(redis.RedisError, OSError):
                    ask()

    def _precheck(self, name: str) -> None:
        """The lineage check due after a broken link, before ``name`` is sent. For init and recovery's
        steps a loss is not raised here: init reports the namespace's state, recovery runs on a lost one."""
        if not self._lineage_due or self._checking:
            return
        if name in _NO_PRECHECK:
            with contextlib.suppress(NamespaceLost):
                self.check_lineage()
        else:
            self.check_lineage()

    @property
    def tracking(self) -> bool:
        """True while acknowledged writes record the primary's replication id and offset."""
        return self.runner.track

    def _writer_connected(self, conn: Any) -> None:
        """Every new writer connection: when acknowledged writes went to a primary before, make sure this
        is still that primary's history; else refuse the connection (the runner then checks the lineage
        before it resends). redis-py reconnects silently to a closed socket's server (a sentinel client
        to the new primary), so a failover must be caught here, before the next script is sent."""
        fresh_connection(conn)
        if self._replid is None or self._checking or not self.runner.track:
            return
        conn.send_command("INFO", "replication")
        repl = Replication.parse(conn.read_response())
        if repl.role == "master" and repl.replid != self._replid:
            self._lineage_due = True
            raise redis.ConnectionError(
                f"the primary changed since the last acknowledged write (replication id {self._replid[:12]} -> "
                f"{repl.replid[:12]}): its history is checked before anything is written there")

    def _link_error(self) -> None:
        if self.runner.track:  # replication matters here: the link may come back to another primary
            self._lineage_due = True

    def _before_resend(self, name: str) -> None:
        """A resend after a broken link may reach another primary (a sentinel client follows a
        failover): judge its history before the write goes there."""
        self._precheck(name)

    def _acknowledged(self, name: str, reply: list[Any], repl: Replication) -> None:
        """After an acknowledged write (tracking on): note the offset the primary held right after it,
        and the claim sequence a claim was issued at; rewrite this process's slot file."""
        if repl.role != "master":
            return
        if self._replid is not None and repl.replid != self._replid:
            self._lineage_due = True  # another primary since the last write (a failover): judge it next
        self._replid = repl.replid
        epoch = self.ns.epoch
        if not epoch:
            return  # init (the epoch is being read) and recovery's steps: nothing acted on yet
        self.watermark.note(epoch, repl.replid, repl.offset)
        if name == "claim":
            self.watermark.note_seq(epoch, int(reply[4]))
        if self.slots is not None:
            try:
                self.slots.write(self.watermark)
            except OSError as exc:  # the watermark lives on in memory; a restart would not find it
                if self.slot_error is None:
                    log.error("cannot write the replication watermark to %s (%s): a restarted process will not "
                              "find it", self.slots.dir, exc)
                self.slot_error = str(exc)

    def check_lineage(self) -> str | None:
        """Compare the acknowledged watermarks (this client's, and every slot file of this namespace
        under the state dir) with the primary's replication history, and the highest claim sequence
        seen with the namespace's. When acknowledged writes are gone, mark the namespace lost (with why,
        and a ``state_loss_detected`` event) and raise :class:`NamespaceLost`; else rebase the watermark
        onto the current history. Returns None when nothing is missing (or nothing can be judged)."""
        self._lineage_due = False
        if self.track_mode == "off" or self._checking:
            return None
        self._checking = True
        try:
            self._follow_primary()  # judge the node the sentinels name, not one this client was left on
            # The marks first, the primary's offset after: every mark read was acknowledged before the
            # offset is, so a mark beyond it is a write the primary lost, never one made since the INFO.
            seen = Watermark()
            seen.merge(self.watermark)
            if self.slots is not None:
                try:
                    seen.merge(self.slots.read_all())
                except OSError as exc:  # the state dir became unsafe (StateFileRefused): judge by memory alone
                    log.error("cannot read the replication watermarks in %s (%s): judging by this process's own",
                              self.slots.dir, exc)
            try:
                repl = Replication.parse(self.writer.info("replication"))
                if repl.role != "master" and self.target.sentinel:  # demoted since: ask where the primary is
                    self.writer.connection_pool.disconnect()
                    repl = Replication.parse(self.writer.info("replication"))
            except redis.ResponseError:  # INFO not allowed for this user: replication cannot be judged
                return None
            if repl.role != "master":
                return None  # writes are refused there anyway (READONLY); a sentinel client asks again
            self._replid = repl.replid  # judged now: new connections to this primary need no other check
            if self.track_mode == "auto" and not self.runner.track and (repl.replicas > 0 or repl.promoted):
                self.runner.track = True
            # The epoch this process's marks belong to: the one it loaded, else the namespace's own (a
            # sweeper that has only read so far still judges every process's marks on this host).
            epoch = self.ns.epoch or str(self.writer.hget(self.keys.meta, "epoch") or "")
            if not epoch:
                return None  # no namespace here (yet): nothing acknowledged to judge
            marks = seen.of_epoch(epoch)
            why, rebased, _unjudged = judge(marks, repl)
            # The claim sequence this client saw belongs to the epoch it loaded: a sequence of another epoch
            # (one a recovery retired since) is no evidence about this one.
            min_seq = max(self.ns.seq_seen if epoch == self.ns.epoch else 0, seen.seqs.get(epoch, 0))
            if why is None and not min_seq and not marks:
                return None  # no evidence to present
            if not self.assert_lineage(lost_reason=why or "", min_seq=min_seq, epoch=epoch):
                return None  # a recovery retired our epoch: what we saw belongs to it
            self.watermark = Watermark({f"{epoch}/{rid}": off for rid, off in rebased.items()},
                                       {e: q for e, q in seen.seqs.items() if e == epoch})
            if epoch == self.ns.epoch and min_seq > self.ns.seq_seen:
                self.ns.seq_seen = min_seq  # the next claim presents it too (its own epoch's only)
            if self.slots is not None and (rebased or self.watermark.seqs):
                try:
                    self.slots.write(self.watermark)
                except OSError as exc:  # the watermark lives on in memory; a restarted process would not find it
                    if self.slot_error is None:
                        log.error("cannot write the replication watermark to %s (%s): a restarted process will "
                                  "not find it", self.slots.dir, exc)
                    self.slot_error = str(exc)
            return None
        finally:
            self._checking = False

    def assert_lineage(self, *, lost_reason: str = "", min_seq: int | None = None, epoch: str | None = None) -> bool:
        """lineage.lua: present the claim sequence seen (default: this client's) and, when a lineage check
        found acknowledged writes missing, why; the namespace is marked lost on either evidence
        (NamespaceLost). False when the epoch presented was retired by a recovery (forgotten here)."""
        check_text(lost_reason, what="lost_reason", max_bytes=2000)
        seq = self.ns.seq_seen if min_seq is None else check_int(min_seq, what="min_seq", high=MAX_INT)
        reply = self.run("lineage", self.ns_keys(), {"epoch": self.ns.epoch or "" if epoch is None else epoch,
                                                       "min_seq": seq, "actor": self.actor,
                                                       "lost_reason": lost_reason})
        if reply[0] == Code.E_EPOCH:
            self.ns.forget()
            return False
        raise_for_reply(reply, script="lineage")
        return True

    def open_namespace(self) -> NamespaceInfo:
        """Create the namespace on first use (writers only), or load it; remembers its epoch. Then
        checks the replication lineage (:meth:`check_lineage`): a namespace found lost is reported so."""
        self.check_memory_policy()
        witness = self.ns.read_witness()
        reply = self.run("init", {"meta": self.keys.meta, "nslog": self.keys.nslog, "queues": self.keys.queues,
                                   "leases": self.keys.leases},
                          {"nonce": uuid.uuid4().hex[:8], "witness": witness or "", "actor": self.actor,
                           "max_lease_ms": self.max_lease_ms})
        raise_for_reply(reply, script="init")
        info = NamespaceInfo(self.keys.prefix, reply[1], reply[2], int(reply[3]), int(reply[4]))
        self.ns.adopt(info.epoch)
        if info.state == "ok" and info.epoch != witness:
            self.ns.write_witness(info.epoch)
        if info.state == "ok":
            try:
                self.check_lineage()
            except NamespaceLost as exc:
                return NamespaceInfo(self.keys.prefix, "lost", info.epoch, info.seq, info.floor, exc.message)
        return info

    def check_memory_policy(self) -> str | None:
        """Redis's ``maxmemory-policy`` (None when INFO is not allowed). Anything but ``noeviction``
        lets Redis delete keys under memory pressure: fences, leases, tasks and idempotency entries
        would vanish without a trace, so it is refused (ConfigurationError) unless ``allow_eviction``."""
        try:
            policy = str(self.redis.info("memory").get("maxmemory_policy") or "")
        except redis.ResponseError:  # INFO not allowed for this ACL user: the operator's responsibility
            return None
        if policy and policy != "noeviction":
            why = (f"Redis's maxmemory-policy is {policy!r}: under memory pressure Redis would delete mc_queue's "
                   "fences, leases and task records without a trace")
            if not self.allow_eviction:
                raise ConfigurationError(f"{why}. Set `maxmemory-policy noeviction` on this Redis (CONFIG SET "
                                         "maxmemory-policy noeviction, and in redis.conf), or, knowing the risk, "
                                         "allow it with MCQ_ALLOW_EVICTION=1 (Client(allow_eviction=True))")
            log.warning("%s; allowed by MCQ_ALLOW_EVICTION / allow_eviction", why)
        return policy or None

    def epoch(self) -> str:
        """The namespace epoch, creating the namespace on first use."""
        if self.ns.epoch is None:
            self.open_namespace()
        assert self.ns.epoch is not None
        return self.ns.epoch

    def with_epoch(self, call: Callable[[str], list[Any]]) -> list[Any]:
        """Run a call that presents the epoch; after a recovery elsewhere, reload it once and resend."""
        reply = call(self.epoch())
        if reply[0] == Code.E_EPOCH:
            self.ns.forget()
            reply = call(self.epoch())
        return reply

    def redis_time_ms(self) -> int:
        """Redis's clock, ms since the epoch: the namespace's one clock."""
        now_s, now_us = self.redis.time()
        return int(now_s) * 1000 + int(now_us) // 1000

    def ns_keys(self) -> dict[str, str]:
        """The namespace keys every fenced script checks: meta, the retired epochs, the namespace log."""
        return {"meta": self.keys.meta, "epochs": self.keys.epochs, "nslog": self.keys.nslog}
