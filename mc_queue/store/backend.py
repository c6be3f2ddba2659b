"""The Client: one typed method per Lua contract, and the reads that explain what happened.

Each method checks its arguments with the same bounds its script enforces again (bad input is
refused before anything is sent), runs the script through the :class:`~mc_queue.store.scripts.ScriptRunner`
(which re-sends only what a script's header declares idempotent), and turns the reply into a record
or the one exception :func:`~mc_queue.contracts.errors.raise_for_reply` maps it to.

Orchestration lives above: :mod:`mc_queue.policy.reconcile` (reconcile an Attempt with its providers),
:mod:`mc_queue.policy.recovery` (after Redis lost state), :mod:`mc_queue.policy.classify` (what follows a failure).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..contracts.codec import (
    MAX_INT,
    MAX_TOKENS,
    canonical_json,
    check_int,
    check_text,
    decimal_text,
    digest,
    encode_payload,
    model_json,
)
from ..contracts.config import Budget, Decision, Retention, RetryPolicy
from ..contracts.errors import (
    Code,
    ConfigurationError,
    InvalidArgument,
    McqError,
    NamespaceLost,
    ReplicationUnconfirmed,
    TaskNotFound,
    raise_for_reply,
)
from ..contracts.failures import fingerprint
from ..contracts.keys import Keys, TaskKeys, attempt_id, check_queue, new_task_id, parse_attempt_id, parse_task_id
from ..contracts.models import (
    Attempt,
    EffectRecord,
    ExpiredLease,
    Failure,
    Heartbeat,
    Lease,
    Manifest,
    NamespaceInfo,
    Task,
)
from ..contracts.packing import Packed, join_chunks, pack, unpack
from ..store.lineage import Replication, SlotStore, Watermark, judge
from ..store.namespace import NamespaceState
from ..store.scripts import ACKNOWLEDGED, ScriptRunner
from ..store.urls import DEFAULT_REPLICA_TIMEOUT_MS, MAX_MIN_REPLICAS, TRACK_MODES, make_redis, parse_url

# The default lease: a heartbeat thread renews it every third (~3.3 s) whatever the handler does,
# so a long tool call is not expired while its process lives; a vanished worker is noticed within
# one lease plus one sweep (about 11 s with the sweeper's 1 s default interval).
DEFAULT_LEASE_MS = 10_000
# With a redis+sentinel:// URL an acknowledged transition is on this many replicas unless the URL or the
# Client says otherwise (?min_replicas=0): a planned SENTINEL FAILOVER leaves the old primary taking writes
# for ~10 s, which vanish with it; WAIT turns them into ReplicationUnconfirmed errors instead.
DEFAULT_SENTINEL_MIN_REPLICAS = 1
DEFAULT_MAX_LEASE_MS = 3_600_000  # a namespace's lease ceiling unless it was created with another
PACK_MAX_BYTES = 4_194_304  # a larger packed document is not swapped in (common.lua PACK_MAX_BYTES)
NSLOG_MAX = 100_000  # the namespace log's cap (common.lua NSLOG_MAX)
PACK_AFTER_MS = 60_000  # a finished task's history is packed this long after it finished (resends land first)
DEFAULT_TOMBSTONE_S = 30 * 86_400  # how long a purged task's id and producer key stay refused
REFUSED_LOG_MAX = 10_000  # about how many entries the refusals log keeps (XADD MAXLEN ~)
_HANDLER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
INDEXES = ("leases", "suspect", "outbox", "cancels")
ENQUEUE_MEMORY_SHARE = 0.9  # lua/includes/common.lua's ENQUEUE_MEMORY_SHARE: enqueue refuses above it
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


def _raw_reply(response: Any, **_options: Any) -> Any:
    return response


def _default_actor() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Client:
    """A connection to one mc_queue namespace.

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
        self.redis: redis.Redis = make_redis(self.target, redis_class=redis_class, **common)
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
        self.embedded: Any = None  # set by connect() when it started or reused the embedded server

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        self.redis.close()
        self.writer.close()
        if self.slots is not None:
            self.slots.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any]) -> list[Any]:
        if name in ACKNOWLEDGED:
            self._precheck(name)  # the link broke or the primary changed since the last write: judge first
        try:
            return self.runner.run(name, keys, argv)
        except ReplicationUnconfirmed:
            # The node this write reached has no replica confirming it: maybe not the primary any more (a
            # planned failover leaves the old one taking writes for seconds). The next call asks anew.
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

    # ----------------------------------------------------------------- the replication watermark

    @property
    def tracking(self) -> bool:
        """True while acknowledged writes record the primary's replication id and offset."""
        return self.runner.track

    def _writer_connected(self, conn: Any) -> None:
        """Every new writer connection: when acknowledged writes went to a primary before, make sure this
        is still that primary's history; else refuse the connection (the runner then checks the lineage
        before it resends). redis-py reconnects silently to a closed socket's server (a sentinel client
        to the new primary), so a failover must be caught here, before the next script is sent."""
        conn.on_connect()
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
        reply = self._run("lineage", self._ns_keys(), {"epoch": self.ns.epoch or "" if epoch is None else epoch,
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
        reply = self._run("init", {"meta": self.keys.meta, "nslog": self.keys.nslog, "queues": self.keys.queues,
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

    def _epoch(self) -> str:
        """The namespace epoch, creating the namespace on first use."""
        if self.ns.epoch is None:
            self.open_namespace()
        assert self.ns.epoch is not None
        return self.ns.epoch

    def _with_epoch(self, call: Callable[[str], list[Any]]) -> list[Any]:
        """Run a call that presents the epoch; after a recovery elsewhere, reload it once and resend."""
        reply = call(self._epoch())
        if reply[0] == Code.E_EPOCH:
            self.ns.forget()
            reply = call(self._epoch())
        return reply

    def _end_keys(self, tk: TaskKeys) -> dict[str, str]:
        """The indexes a task's end moves (lua index_end): its queue's done and held, and topack."""
        return {"done": tk.done, "held": tk.held, "topack": self.keys.topack}

    def _ns_keys(self) -> dict[str, str]:
        return {"meta": self.keys.meta, "epochs": self.keys.epochs, "nslog": self.keys.nslog}

    def _task_keys(self, task_id: str) -> TaskKeys:
        try:
            return self.keys.task(task_id)
        except ValueError as exc:
            raise InvalidArgument(str(exc), task_id=task_id) from None

    def _attempt(self, attempt_id: str) -> tuple[str, int, TaskKeys]:
        try:
            task_id, n = parse_attempt_id(attempt_id)
        except ValueError as exc:
            raise InvalidArgument(str(exc), attempt_id=attempt_id) from None
        return task_id, n, self.keys.task(task_id)

    def _fenced_args(self, attempt_id: str, fence: int, worker: str) -> dict[str, Any]:
        """The arguments every fenced write carries: who, the fence, and the client's evidence."""
        check_int(fence, what="fence", high=MAX_INT)
        check_text(worker, what="worker_id", max_bytes=200)
        proof = self.ns.proof(attempt_id, fence)
        return {"fence": fence, "worker": worker, "epoch": self._epoch(), "min_seq": self.ns.seq_seen,
                "proof": "" if proof is None else proof}

    def _lease_ms(self, lease_ms: Any, *, what: str = "lease_ms") -> int:
        return check_int(lease_ms, what=what, low=1, high=self.max_lease_ms)

    # ----------------------------------------------------------------- contracts

    def enqueue(
        self,
        queue: str,
        handler: str,
        payload: Any,
        idempotency_key: str | None = None,
        *,
        executor: str | None = None,
        model: str | None = None,
        context: Mapping[str, Any] | None = None,
        base_sha: str | None = None,
        retry_policy: RetryPolicy | None = None,
        budget: Budget | None = None,
        policy_version: str | None = None,
        lease_ms: int | None = None,
        timeout_s: float | None = None,
        task_id: str | None = None,
    ) -> Task:
        """Create a Task and its first Attempt. The same idempotency key returns the same task."""
        try:
            check_queue(queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not isinstance(handler, str) or not 0 < len(handler) <= 128 or set(handler) - _HANDLER_CHARS \
                or not handler[0].isalnum():
            raise InvalidArgument(
                f"invalid handler name {handler!r}: use 1-128 letters, digits, '_', '.', ':', '-'"
            )
        if idempotency_key is not None:
            check_text(idempotency_key, what="idempotency key", max_bytes=512, spaces=False)
        lease = self._lease_ms(DEFAULT_LEASE_MS if lease_ms is None else lease_ms)
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not 0 < timeout_s <= 30 * 86_400):
            raise InvalidArgument(f"timeout_s must be a number of seconds in (0, 30 days], got {timeout_s!r}")
        text, payload_digest = encode_payload(payload)
        policy = retry_policy or RetryPolicy()
        try:
            manifest = Manifest(handler=handler, payload_digest=payload_digest,
                                policy_version=policy_version or policy.version,
                                executor=executor, model=model, context=dict(context or {}), base_sha=base_sha,
                                lease_ms=lease, timeout_s=timeout_s)
        except ValueError as exc:
            raise InvalidArgument(f"invalid manifest: {exc}") from None
        tid = task_id or new_task_id(queue)
        tk = self._task_keys(tid)
        if tk.pending != self.keys.pending(queue):
            raise InvalidArgument(f"task id {tid!r} does not belong to queue {queue!r}")
        argv = {"task_id": tid, "queue": queue, "handler": handler, "payload": text,
                "payload_digest": payload_digest, "idem_key": idempotency_key or "",
                "manifest": model_json(manifest), "retry_policy": model_json(policy),
                "budget": model_json(budget or Budget()), "lease_ms": lease, "actor": self.actor}

        def call(epoch: str) -> list[Any]:
            return self._run("enqueue", {
                **self._ns_keys(), "idem": self.keys.idem, "queues": self.keys.queues, "counts": self.keys.counts,
                "task": tk.task, "attempts": tk.attempts, "events": tk.events, "pending": tk.pending,
                "outbox": self.keys.outbox, "tomb": tk.tomb,
            }, {**argv, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="enqueue", task_id=tid)
        return self.get_task(str(reply[1]))

    def claim_attempt(self, task_id: str, worker_id: str, lease_ms: int | None = DEFAULT_LEASE_MS, *,
                      request_id: str | None = None, expect_attempt: int | None = None) -> Lease:
        """Atomically take the task's pending Attempt and a lease with a new fence.

        ``lease_ms=None``: the lease length frozen in the task at enqueue. ``expect_attempt``: refuse
        unless the pending Attempt is this one (a transport message for Attempt N must not run N+1).
        """
        tk = self._task_keys(task_id)
        check_text(worker_id, what="worker_id", max_bytes=200, spaces=False)
        lease = None if lease_ms is None else self._lease_ms(lease_ms)
        if expect_attempt is not None:
            check_int(expect_attempt, what="expect_attempt", low=1, high=1_000_000)
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("claim", {
                **self._ns_keys(), "stats": self.keys.stats, "counts": self.keys.counts, "leases": self.keys.leases,
                "task": tk.task, "attempts": tk.attempts, "events": tk.events, "pending": tk.pending,
                "outbox": self.keys.outbox, "fence": tk.fence, "lease": tk.lease, "paused": self.keys.paused,
            }, {"worker": worker_id, "lease_ms": lease, "epoch": epoch, "min_seq": self.ns.seq_seen,
                "request_id": req, "expect_n": expect_attempt})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="claim", task_id=task_id)
        n, fence, seq = int(reply[1]), int(reply[2]), int(reply[4])
        aid = attempt_id(task_id, n)
        self.ns.note_claim(aid, fence, seq)
        return Lease(attempt_id=aid, fence=fence, expires_at_ms=int(reply[3]), worker_id=worker_id, task_id=task_id,
                     number=n, seq=seq, lease_ms=int(reply[6] or 0), recovered_at_ms=int(reply[7] or 0))

    def renew_lease(self, attempt_id: str, fence: int, *, worker_id: str = "",
                    lease_ms: int | None = None) -> int:
        """Extend the lease; returns the new expiry (ms, Redis clock). Raises StaleFence/LeaseExpired."""
        return self.heartbeat(attempt_id, fence, worker_id=worker_id, lease_ms=lease_ms).expires_at_ms

    def heartbeat(self, attempt_id: str, fence: int, *, worker_id: str = "", lease_ms: int | None = None,
                  cost: float = 0.0, tokens: int = 0, request_id: str | None = None) -> Heartbeat:
        """Renew the lease and charge cost/tokens to the Attempt (once per request id)."""
        task_id, n, tk = self._attempt(attempt_id)
        charge = decimal_text(cost, what="cost")
        check_int(tokens, what="tokens", high=MAX_TOKENS)
        lease = None if lease_ms is None else self._lease_ms(lease_ms)
        charging = cost > 0 or tokens > 0
        reply = self._run("renew", {
            **self._ns_keys(), "leases": self.keys.leases, "task": tk.task, "attempts": tk.attempts,
            "stats": self.keys.stats, "events": tk.events, "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "lease_ms": lease, "cost": charge,
            "tokens": tokens, "request_id": (request_id or uuid.uuid4().hex) if charging else ""})
        raise_for_reply(reply, script="renew", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return Heartbeat(int(reply[1]), reply[2] == "1", float(reply[3]), int(reply[4]))

    def complete_attempt(self, attempt_id: str, fence: int, result: Any = None, *, worker_id: str = "",
                         cost: float = 0.0, tokens: int = 0) -> Attempt:
        """Record success. Same fence + same result again is a no-op; a different result a conflict."""
        task_id, n, reply = self.complete_quietly(attempt_id, fence, result, worker_id=worker_id, cost=cost,
                                                  tokens=tokens)
        return _attempt_from_snapshot(task_id, n, reply[2])

    def complete_quietly(self, attempt_id: str, fence: int, result: Any, *, worker_id: str, cost: float = 0.0,
                         tokens: int = 0) -> tuple[str, int, list[Any]]:
        """complete_attempt without building the Attempt record (the worker's hot path)."""
        task_id, n, tk = self._attempt(attempt_id)
        text = canonical_json(result, what="result")
        reply = self._run("complete", {
            **self._ns_keys(), "counts": self.keys.counts, "leases": self.keys.leases, "task": tk.task,
            "stats": self.keys.stats, "attempts": tk.attempts, "events": tk.events, "fence": tk.fence,
            "lease": tk.lease, **self._end_keys(tk),
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "result": text, "result_digest": digest(text),
            "cost": decimal_text(cost, what="cost"), "tokens": check_int(tokens, what="tokens", high=MAX_TOKENS)})
        raise_for_reply(reply, script="complete", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return task_id, n, reply

    def fail_attempt(self, attempt_id: str, fence: int, failure: Failure | Mapping[str, Any], *,
                     worker_id: str = "", cost: float = 0.0, tokens: int = 0,
                     decision: Decision | None = None) -> Attempt:
        """Record a classified failure, and apply the policy's decision in the same step.

        Without a decision the task waits in ``failed`` for a person (``retry_task``). Classify an
        exception first with :func:`mc_queue.policy.classify.classify` (``classify(exc).failure``).
        """
        task_id, n, tk = self._attempt(attempt_id)
        f = as_failure(failure)
        text = model_json(f)
        reply = self._run("fail", {
            **self._ns_keys(), "counts": self.keys.counts, "leases": self.keys.leases, "task": tk.task,
            "stats": self.keys.stats, "attempts": tk.attempts, "events": tk.events, "pending": tk.pending,
            "attention": self.keys.attention, "dlq": self.keys.dlq, "outbox": self.keys.outbox, "fence": tk.fence,
            "lease": tk.lease, **self._end_keys(tk),
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "failure": text,
            "failure_digest": digest(text), "fclass": f.failure_class.value, "fingerprint": f.fingerprint,
            "cost": decimal_text(cost, what="cost"), "tokens": check_int(tokens, what="tokens", high=MAX_TOKENS),
            **decision_args(decision, default="")})
        raise_for_reply(reply, script="fail", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return _attempt_from_snapshot(task_id, n, reply[2])

    def checkpoint(self, attempt_id: str, fence: int, phase: str, phase_index: int, record: Mapping[str, Any], *,
                   worker_id: str = "") -> bool:
        """Record a phase reached by a running Attempt (fenced, monotonic). False when already recorded."""
        task_id, n, tk = self._attempt(attempt_id)
        check_text(phase, what="phase", max_bytes=128, spaces=False)
        check_int(phase_index, what="phase_index", high=1000)
        text = canonical_json(dict(record), what="checkpoint")
        reply = self._run("checkpoint", {
            **self._ns_keys(), "stats": self.keys.stats, "task": tk.task, "attempts": tk.attempts, "events": tk.events,
            "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "phase": phase, "phase_index": phase_index,
            "record": text, "digest": digest(text)})
        raise_for_reply(reply, script="checkpoint", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return bool(reply[0] == Code.OK)

    def effect_begin(self, attempt_id: str, fence: int, key: str, record: Mapping[str, Any], *,
                     worker_id: str = "") -> tuple[str, EffectRecord | None]:
        """Persist an effect's intent (fenced). Returns ("OK", None) to go ahead, ("DONE", record) to
        replay its receipt, or ("PENDING", record) when an earlier intent must be reconciled first."""
        task_id, n, tk = self._attempt(attempt_id)
        check_text(key, what="effect key", max_bytes=512, spaces=False)
        _check_effect_record(record)
        reply = self._run("effect_begin", {
            **self._ns_keys(), "task": tk.task, "attempts": tk.attempts, "events": tk.events, "effects": tk.effects,
            "stats": self.keys.stats, "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "key": key,
            "record": canonical_json(dict(record), what="effect record")})
        raise_for_reply(reply, script="effect_begin", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        status = str(reply[0])
        return status, (EffectRecord.from_json(reply[1]) if len(reply) > 1 else None)

    def effect_done(self, attempt_id: str, fence: int | None, key: str, outcome: str, receipt: Any = None, *,
                    source: str = "perform", actor: str = "") -> EffectRecord:
        """Record a receipt ('done'), or as reconciler (fence None) 'absent' / 'unknown' with a note."""
        task_id, n, tk = self._attempt(attempt_id)
        who = actor or self.actor
        check_text(key, what="effect key", max_bytes=512, spaces=False)
        if outcome == "done":
            text = canonical_json(receipt, what="receipt")
        else:
            text = _printable(str(receipt or ""), 65_536)  # a provider's words: recorded, made one line
        if fence is None:
            fenced: dict[str, Any] = {"fence": "", "worker": check_text(who, what="actor", max_bytes=200),
                                      "epoch": self._epoch(), "min_seq": self.ns.seq_seen, "proof": ""}
        else:
            fenced = self._fenced_args(attempt_id, fence, who)
        fenced["actor"] = fenced.pop("worker")
        reply = self._run("effect_done", {
            **self._ns_keys(), "task": tk.task, "attempts": tk.attempts, "events": tk.events, "effects": tk.effects,
            "stats": self.keys.stats, "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **fenced, "key": key, "outcome": outcome, "receipt": text, "source": source})
        raise_for_reply(reply, script="effect_done", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return EffectRecord.from_json(reply[1])

    def due_dispatches(self, *, limit: int = 500) -> list[str]:
        """Attempt ids in the outbox whose (re)dispatch time has come (Redis clock)."""
        return self._due("outbox", limit)

    def due_cancels(self, *, limit: int = 500) -> list[str]:
        """Running Attempts whose executor did not acknowledge a cancel in time."""
        return self._due("cancels", limit)

    def due_leases(self, *, limit: int = 500) -> list[str]:
        """Lease index entries whose expiry has come (Redis clock)."""
        return self._due("leases", limit)

    def _due(self, index: str, limit: int) -> list[str]:
        reply = self._run("due", {"index": getattr(self.keys, index)},
                          {"limit": check_int(limit, what="limit", low=1, high=10_000)})
        raise_for_reply(reply, script="due")
        return [str(m) for m in reply[1:]]

    def mark_dispatched(self, member: str, *, recheck_ms: int) -> bool:
        """The Attempt was handed to the transport; look again after ``recheck_ms`` if unclaimed."""
        _, _, tk = self._attempt(member)

        def call(epoch: str) -> list[Any]:
            return self._run("mark_dispatched", {**self._ns_keys(), "outbox": self.keys.outbox, "task": tk.task,
                                                 "attempts": tk.attempts},
                             {"member": member, "recheck_ms": recheck_ms, "actor": self.actor, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="mark_dispatched", attempt_id=member)
        return bool(reply[0] == Code.OK)

    def expire_leases(self, *, limit: int = 500, actor: str | None = None,
                      max_batches: int = 1000) -> list[ExpiredLease]:
        """Every lease past its expiry (Redis clock) -> Attempt suspect, fence bumped. Bounded batches;
        entries whose task is gone, or that cannot be read, are dropped and logged on the way."""
        return self.expire_due(limit=limit, actor=actor, max_batches=max_batches).expired

    def expire_due(self, *, limit: int = 500, actor: str | None = None, max_batches: int = 1000) -> ExpireReport:
        """expire_leases with the whole report: what expired, what was dropped, what failed."""
        total = ExpireReport()
        for _ in range(max_batches):
            members = self.due_leases(limit=limit)
            if not members:
                break
            report = self.expire(members, actor=actor or self.actor, force=False, reason="lease expired")
            total.merge(report)
            if len(members) < limit or report.removed == 0:
                break
        return total

    def void_leases(self, members: list[str], *, actor: str | None = None, reason: str,
                    recovering_epoch: str | None = None) -> list[ExpiredLease]:
        """Void live leases now (fence bumped, Attempt suspect): recovery, or an unacknowledged cancel."""
        return self.expire(members, actor=actor or self.actor, force=True, reason=reason,
                           recovering_epoch=recovering_epoch).expired

    def expire(self, members: list[str], *, actor: str, force: bool, reason: str,
               recovering_epoch: str | None = None, index: str = "leases") -> ExpireReport:
        """expire.lua for each member of the lease (or cancel) index (one pipeline). One bad entry never
        stops the others: an unreadable member is dropped (index_drop), an error is reported in ``errors``."""
        check_text(reason, what="reason", max_bytes=2000)
        epoch = recovering_epoch or self._epoch()
        report = ExpireReport()
        calls: list[tuple[dict[str, str], dict[str, Any]]] = []
        readable: list[str] = []
        for member in members:
            try:
                _, _, tk = self._attempt(member)
            except InvalidArgument as exc:
                try:
                    report.removed += self.drop_index_entry(index, member, reason=str(exc), actor=actor,
                                                            recovering_epoch=recovering_epoch)
                except McqError as err:
                    report.errors.append((member, str(err)))
                continue
            readable.append(member)
            calls.append(({"meta": self.keys.meta, "epochs": self.keys.epochs, "nslog": self.keys.nslog,
                           "leases": self.keys.leases, "stats": self.keys.stats, "suspect": self.keys.suspect,
                           "task": tk.task, "attempts": tk.attempts, "events": tk.events,
                           "cancels": self.keys.cancels, "fence": tk.fence, "lease": tk.lease},
                          {"member": member, "actor": actor, "force": force, "reason": reason, "epoch": epoch}))
        if not calls:
            return report
        replies = self.runner.run_many("expire", calls)
        stale = [i for i, r in enumerate(replies) if isinstance(r, list) and r and r[0] == Code.E_EPOCH]
        if stale and recovering_epoch is None:  # a recovery ran elsewhere: reload the epoch once and resend
            self.ns.forget()
            epoch = self._epoch()
            again = self.runner.run_many("expire", [(calls[i][0], {**calls[i][1], "epoch": epoch}) for i in stale])
            for i, reply in zip(stale, again, strict=True):
                replies[i] = reply
        for member, reply in zip(readable, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise McqError(f"expire of {member} failed: {reply}", attempt_id=member, script="expire")
                raise_for_reply(reply, script="expire", attempt_id=member)
            except McqError as exc:
                if isinstance(exc, NamespaceLost):
                    raise
                report.errors.append((member, str(exc)))
                continue
            if reply[0] == Code.OK:
                report.expired.append(ExpiredLease(member, old_fence=int(reply[2]), new_fence=int(reply[1])))
                report.removed += 1
            elif "dropped" in str(reply[1]):
                report.dropped.append(member)
                report.removed += 1
        return report

    def drop_index_entry(self, index: str, member: str, *, reason: str, actor: str | None = None,
                         recovering_epoch: str | None = None) -> int:
        """Remove an index entry that names no task or the wrong state (logged as orphan_index_entry).
        Returns 1 when it was dropped, 0 when it was not there. Raises TransitionRefused when the entry is right."""
        if index not in INDEXES:
            raise InvalidArgument(f"index must be one of {INDEXES}")
        try:
            tk = self._attempt(member)[2]
        except InvalidArgument:
            tk = self.keys.nowhere()

        def call(epoch: str) -> list[Any]:
            return self._run("index_drop", {**self._ns_keys(), "index": getattr(self.keys, index), "task": tk.task,
                                            "attempts": tk.attempts},
                             {"kind": index, "member": member.encode("utf-8", "surrogateescape"),
                              "actor": actor or self.actor, "reason": _printable(reason, 2000), "epoch": epoch})

        # Recovery presents the epoch it recovers to; anyone else presents the one it knows, reloaded
        # once after a recovery elsewhere (as every other call does).
        reply = call(recovering_epoch) if recovering_epoch else self._with_epoch(call)
        raise_for_reply(reply, script="index_drop", attempt_id=member)
        return 1 if reply[0] == Code.OK else 0

    def begin_reconcile(self, attempt_id: str, *, actor: str | None = None) -> bool:
        """suspect -> reconciling (True), or already reconciling (False: a reconciler died mid-way)."""
        task_id, n, tk = self._attempt(attempt_id)

        def call(epoch: str) -> list[Any]:
            return self._run("reconcile_begin", {**self._ns_keys(), "task": tk.task, "attempts": tk.attempts,
                                                 "events": tk.events, "stats": self.keys.stats},
                             {"n": n, "actor": actor or self.actor, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="reconcile_begin", task_id=task_id, attempt_id=attempt_id)
        return bool(reply[0] == Code.OK)

    def settle_attempt(self, attempt_id: str, actor: str, outcome: str, *, result: Any = None,
                       failure: Failure | None = None, evidence: Any = None,
                       decision: Decision | None = None) -> Attempt:
        """reconciling -> succeeded | failed | canceled, with the evidence and (failed) the decision."""
        task_id, n, tk = self._attempt(attempt_id)
        argv = {"n": n, "actor": actor, "outcome": outcome,
                "result": canonical_json(result, what="result") if outcome == "succeeded" else "",
                "failure": model_json(failure) if failure else "",
                "fclass": failure.failure_class.value if failure else "",
                "fingerprint": failure.fingerprint if failure else "",
                "evidence": canonical_json(evidence, what="evidence"),
                **decision_args(decision, default="wait" if outcome == "failed" else "")}

        def call(epoch: str) -> list[Any]:
            return self._run("reconcile_settle", {
                **self._ns_keys(), "counts": self.keys.counts, "suspect": self.keys.suspect, "task": tk.task,
                "attempts": tk.attempts, "stats": self.keys.stats, "events": tk.events, "pending": tk.pending,
                "outbox": self.keys.outbox, "attention": self.keys.attention, "dlq": self.keys.dlq,
                **self._end_keys(tk),
            }, {**argv, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="reconcile_settle", task_id=task_id, attempt_id=attempt_id)
        return _attempt_from_snapshot(task_id, n, reply[2])

    def retry_task(self, task_id: str, reason: str, hypothesis: str | None = None, *, delay_ms: int = 0,
                   actor: str | None = None, request_id: str | None = None) -> Attempt:
        """Append Attempt N+1 (pending) with its reason and hypothesis, under Mission Control's rules."""
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000)
        check_text(hypothesis or "", what="hypothesis", max_bytes=2000)
        check_int(delay_ms, what="delay_ms", high=365 * 86_400_000)
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("retry", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, "outbox": self.keys.outbox,
                "attention": self.keys.attention, "stats": self.keys.stats, **self._end_keys(tk),
            }, {"reason": reason, "hypothesis": hypothesis or "", "actor": actor or self.actor, "request_id": req,
                "delay_ms": delay_ms, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="retry", task_id=task_id)
        return _attempt_from_snapshot(task_id, int(reply[1]), reply[3])

    def cancel_task(self, task_id: str, reason: str, *, actor: str | None = None,
                    ack_timeout_ms: int = 30_000) -> str:
        """Start the cancellation protocol. Returns 'canceled' (nothing was running) or 'signaled'
        (the executor hears it at its next heartbeat; the sweeper voids its lease after the timeout)."""
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        check_int(ack_timeout_ms, what="ack_timeout_ms", high=86_400_000)

        def call(epoch: str) -> list[Any]:
            return self._run("cancel", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, "outbox": self.keys.outbox, "cancels": self.keys.cancels,
                "stats": self.keys.stats, "attention": self.keys.attention, **self._end_keys(tk),
            }, {"reason": reason, "actor": actor or self.actor, "timeout_ms": ack_timeout_ms, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="cancel", task_id=task_id)
        return str(reply[1])

    def acknowledge_cancel(self, attempt_id: str, fence: int, *, worker_id: str = "",
                           request_id: str | None = None) -> int:
        """The executor stops: it gives up its lease (the fence moves on) and waits for reconciliation."""
        task_id, n, tk = self._attempt(attempt_id)
        reply = self._run("cancel_ack", {
            **self._ns_keys(), "stats": self.keys.stats, "leases": self.keys.leases, "suspect": self.keys.suspect,
            "cancels": self.keys.cancels, "task": tk.task, "attempts": tk.attempts, "events": tk.events,
            "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "request_id": request_id or uuid.uuid4().hex})
        raise_for_reply(reply, script="cancel_ack", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return int(reply[1])

    def dlq(self) -> list[tuple[str, int]]:
        """Quarantined tasks: (task id, quarantined at ms), oldest first."""
        rows = cast(list[tuple[str, float]], self.redis.zrange(self.keys.dlq, 0, -1, withscores=True))
        return [(str(m), int(score)) for m, score in rows]

    def dlq_replay(self, task_id: str, reason: str, hypothesis: str | None = None, *,
                   actor: str | None = None, request_id: str | None = None) -> Attempt:
        """Take a quarantined task out of the DLQ as a new Attempt with its reason (a person's decision)."""
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        check_text(hypothesis or "", what="hypothesis", max_bytes=2000)
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("dlq_replay", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, "outbox": self.keys.outbox, "dlq": self.keys.dlq,
                "attention": self.keys.attention, "stats": self.keys.stats, **self._end_keys(tk),
            }, {"reason": reason, "hypothesis": hypothesis or "", "actor": actor or self.actor, "request_id": req,
                "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="dlq_replay", task_id=task_id)
        return _attempt_from_snapshot(task_id, int(reply[1]), reply[2])

    def dlq_purge(self, task_id: str, *, reason: str, actor: str | None = None,
                  keep_key_s: float = DEFAULT_TOMBSTONE_S, request_id: str | None = None) -> int:
        """Delete a quarantined task and its history for good; returns how many Attempts it had.

        Its id and producer idempotency key stay refused by enqueue for ``keep_key_s`` seconds (a
        tombstone, 30 days by default; 0 frees them at once), so the same work does not run again.
        """
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        if isinstance(keep_key_s, bool) or not isinstance(keep_key_s, (int, float)) or \
                not 0 <= keep_key_s <= 3650 * 86_400:
            raise InvalidArgument(f"keep_key_s must be between 0 and 3650 days in seconds, got {keep_key_s!r}")
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("dlq_purge", {
                **self._ns_keys(), "counts": self.keys.counts, "idem": self.keys.idem, "dlq": self.keys.dlq,
                "attention": self.keys.attention, "task": tk.task, "attempts": tk.attempts, "events": tk.events,
                "effects": tk.effects, "tomb": tk.tomb, "stats": self.keys.stats, "held": tk.held,
                "idem_until": self.keys.idem_until, "fence": tk.fence,
            }, {"actor": actor or self.actor, "reason": reason, "tombstone_ms": int(keep_key_s * 1000),
                "request_id": req, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="dlq_purge", task_id=task_id)
        return int(reply[1])

    # ----------------------------------------------------------------- retention

    def set_retention(self, queue: str, retention: Retention | None, *, source: str = "operator",
                      actor: str | None = None, reason: str = "") -> None:
        """Record a queue's retention policy: the operator's (wins) or the App's (``source="app"``);
        ``None`` removes that source's policy. An operator's change is audited in the namespace log."""
        self._queue_name(queue)
        if source not in ("operator", "app"):
            raise InvalidArgument(f"source must be 'operator' or 'app', got {source!r}")
        if source == "operator":
            check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        field_name = queue if source == "operator" else f"app:{queue}"
        pipe = self.redis.pipeline(transaction=True)
        if retention is None:
            pipe.hdel(self.keys.retention, field_name)
        else:
            pipe.hset(self.keys.retention, field_name, model_json(retention))
        pipe.execute()
        if source == "operator":
            policy = model_json(retention) if retention else "(the App's or the default)"
            self.log_event("retention_set", {"queue": queue, "actor": actor or self.actor, "reason": reason,
                                         "policy": policy})

    def retention(self, queue: str) -> tuple[Retention, str]:
        """A queue's retention policy in force and where it comes from: 'operator', 'app' or 'default'."""
        self._queue_name(queue)
        op, app = cast(list[str | None], self.redis.hmget(self.keys.retention, queue, f"app:{queue}"))
        return self._policy_in_force(queue, op, app)

    def retention_policies(self, queues: Sequence[str]) -> dict[str, tuple[Retention, str]]:
        """:meth:`retention` of each queue, in one read."""
        stored = cast(dict[str, str], self.redis.hgetall(self.keys.retention))
        return {q: self._policy_in_force(q, stored.get(q), stored.get(f"app:{q}")) for q in queues}

    @staticmethod
    def _policy_in_force(queue: str, op: str | None, app: str | None) -> tuple[Retention, str]:
        for text, source in ((op, "operator"), (app, "app")):
            if text:
                try:
                    return Retention.model_validate_json(text), source
                except ValueError:
                    log.warning("queue %s: the %s retention policy in Redis does not read; using the next one", queue,
                                source)
        return Retention(), "default"

    def pack_due(self, *, limit: int = 200, min_age_ms: int = PACK_AFTER_MS) -> int:
        """Pack the history of up to ``limit`` tasks that finished at least ``min_age_ms`` ago (Redis's
        clock) into one compressed document each (``lua/pack.lua``). Returns how many were packed."""
        check_int(limit, what="limit", low=1, high=10_000)
        cutoff = self.redis_time_ms() - check_int(min_age_ms, what="min_age_ms", high=365 * 86_400_000)
        ids = [str(m) for m in self.redis.zrangebyscore(self.keys.topack, "-inf", cutoff, start=0, num=limit)]
        return self.pack_tasks(ids) if ids else 0

    def pack_tasks(self, ids: Sequence[str]) -> int:
        """Pack these finished tasks' histories now (each only if it is finished and unchanged since read).
        Returns how many were packed; the others are left as they are."""
        read = self.redis.pipeline(transaction=False)
        keys: list[TaskKeys] = []
        for tid in ids:
            tk = self._task_keys_or_none(tid)
            if tk is None:
                self.redis.zrem(self.keys.topack, tid)
                continue
            keys.append(tk)
            read.hgetall(tk.task)
            read.hgetall(tk.attempts)
            read.xrange(tk.events)
            read.hgetall(tk.effects)
        raw = read.execute()
        calls = []
        for i, tk in enumerate(keys):
            fields, att, events, fx = raw[4 * i: 4 * i + 4]
            # A task gone or already packed gets a placeholder document: the script answers NOOP before reading it.
            blob = pack(fields, att, events, fx) if fields and not fields.get("packed") else b"mcz1-placeholder"
            if len(blob) > PACK_MAX_BYTES:
                log.warning("task %s: its packed history would be %d bytes (above %d): left unpacked",
                            fields.get("id"), len(blob), PACK_MAX_BYTES)
                self.redis.zrem(self.keys.topack, str(fields.get("id")))
                continue
            calls.append(({**self._ns_keys(), "task": tk.task, "attempts": tk.attempts, "events": tk.events,
                           "effects": tk.effects, "fence": tk.fence, "topack": self.keys.topack},
                          {"blob": blob, "updated_at": int(fields.get("updated_at") or 0) if fields else 0,
                           "last_event": events[-1][0] if events else "0-0", "fields": len(att), "effects": len(fx),
                           "epoch": self.ns.epoch or "", "actor": self.actor}))
        packed = 0
        for reply in self.runner.run_many("pack", calls):
            if isinstance(reply, Exception):
                raise reply
            if reply[0] == Code.OK:
                packed += 1
            elif reply[0] not in ("NOOP", "E_CHANGED"):
                raise_for_reply(reply, script="pack")
        return packed

    def retire_task(self, task_id: str, *, states: Sequence[str], reason: str, actor: str | None = None,
                    tombstone_s: float = Retention().tombstone_s, score: int | None = None,
                    log_each: bool = True) -> str | None:
        """Delete one ended task with every key and index entry (``lua/retire.lua``), if its state is one
        of ``states``; a tombstone keeps its id and producer key refused for ``tombstone_s``. Returns the
        state it was in, or None when there was no such task. Refused (TransitionRefused) in another state."""
        tk = self._task_keys(task_id)
        reply = self.runner.run("retire", self._retire_keys(tk),
                                self._retire_argv(states, reason, actor, tombstone_s, score, log_each, ""))
        if reply[0] == "NOOP":
            return None
        raise_for_reply(reply, script="retire", task_id=task_id)
        return str(reply[1])

    def _retire_keys(self, tk: TaskKeys) -> dict[str, str]:
        return {**self._ns_keys(), "counts": self.keys.counts, "idem": self.keys.idem,
                "idem_until": self.keys.idem_until, "dlq": self.keys.dlq, "attention": self.keys.attention,
                "done": tk.done, "held": tk.held, "topack": self.keys.topack, "task": tk.task,
                "attempts": tk.attempts, "events": tk.events, "effects": tk.effects, "fence": tk.fence,
                "tomb": tk.tomb}

    def _retire_argv(self, states: Sequence[str], reason: str, actor: str | None, tombstone_s: float,
                     score: int | None, log_each: bool, seen: str) -> dict[str, Any]:
        bad = set(states) - set(ENDED_STATES)
        if not states or bad:
            raise InvalidArgument(f"states must be some of {', '.join(ENDED_STATES)}; got {sorted(states)}")
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        if isinstance(tombstone_s, bool) or not isinstance(tombstone_s, (int, float)) or \
                not 0 <= tombstone_s <= 3650 * 86_400:
            raise InvalidArgument(f"tombstone_s must be between 0 and 3650 days in seconds, got {tombstone_s!r}")
        return {"states": "|" + "|".join(sorted(set(states))) + "|", "score": "" if score is None else score,
                "actor": actor or self.actor, "reason": reason, "tombstone_ms": int(tombstone_s * 1000),
                "log": "task" if log_each else "", "epoch": self.ns.epoch or "", "seen": seen}

    def ended_tasks(self, queue: str, kind: str, *, before_ms: int | None = None, keep_newest: int | None = None,
                    limit: int = 500) -> list[tuple[str, int]]:
        """(task id, ended at ms) of a queue's ended tasks, oldest first, from its done index (``kind``
        'done': succeeded, canceled) or held index ('held': failed, blocked, quarantined): those that
        ended before ``before_ms`` (Redis's clock, ms since the epoch), and those beyond the newest
        ``keep_newest``; at most ``limit``. Cost bounded by the limit (no scan)."""
        self._queue_name(queue)
        if kind not in ("done", "held"):
            raise InvalidArgument(f"kind must be 'done' or 'held', got {kind!r}")
        key = self.keys.done(queue) if kind == "done" else self.keys.held(queue)
        check_int(limit, what="limit", low=1, high=100_000)
        found: dict[str, float] = {}
        if before_ms is not None:
            found.update(cast(list[tuple[str, float]],
                              self.redis.zrangebyscore(key, "-inf", f"({before_ms}", start=0, num=limit,
                                                       withscores=True)))
        if keep_newest is not None:
            excess = int(self.redis.zcard(key)) - check_int(keep_newest, what="keep_newest", high=10**9)
            if excess > 0:
                found.update(cast(list[tuple[str, float]],
                                  self.redis.zrange(key, 0, min(excess, limit) - 1, withscores=True)))
        rows = sorted(((str(m), int(sc)) for m, sc in found.items()), key=lambda r: (r[1], r[0]))
        return rows[:limit]

    def retire_batch(self, rows: Sequence[tuple[str, int]], *, states: Sequence[str], reason: str,
                     tombstone_s: float, actor: str | None = None, log_each: bool = False,
                     seen: Mapping[str, str] | None = None) -> dict[str, int]:
        """Retire many tasks read from an index, each only if its entry still has the score read, in one
        pipeline. ``seen``: task id -> its version as archived (:meth:`task_snapshot`); such a task is
        deleted only if it is still that version. Returns counts: retired, skipped (changed or gone
        since read), refused."""
        calls = []
        for tid, score in rows:
            tk = self._task_keys_or_none(tid)
            if tk is None:
                continue
            calls.append((self._retire_keys(tk), self._retire_argv(states, reason, actor, tombstone_s, score,
                                                                   log_each, (seen or {}).get(tid, ""))))
        out = {"retired": 0, "skipped": 0, "refused": 0}
        for reply in self.runner.run_many("retire", calls) if calls else []:
            if isinstance(reply, Exception):
                raise reply
            if reply[0] == Code.OK:
                out["retired"] += 1
            elif reply[0] == "NOOP":
                out["skipped"] += 1
            elif reply[0] == "E_STATE":
                out["refused"] += 1
            else:
                raise_for_reply(reply, script="retire")
        return out

    def forget_empty_queues(self, *, limit: int = 100, actor: str | None = None) -> list[str]:
        """Forget up to ``limit`` queues that hold no task, have no retention policy and are not paused
        (``lua/queue_forget.lua`` re-checks each): they leave the queue set with their zero counters and
        the console's samples. The next enqueue on one brings it back. Returns the queues forgotten."""
        check_int(limit, what="limit", low=1, high=10_000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.smembers(self.keys.queues)
        pipe.hgetall(self.keys.counts)
        pipe.hkeys(self.keys.retention)
        pipe.hkeys(self.keys.paused)
        queues, counts, policies, paused = pipe.execute()
        busy = {f.rpartition("|")[0] for f, v in counts.items() if v not in ("0", 0)}
        kept = set(paused) | {p.removeprefix("app:") for p in policies}
        calls = []
        for queue in sorted(set(queues) - busy - kept)[:limit]:
            try:
                check_queue(queue)
            except ValueError:
                continue
            calls.append(({**self._ns_keys(), "queues": self.keys.queues, "counts": self.keys.counts,
                           "retention": self.keys.retention, "paused": self.keys.paused,
                           "pending": self.keys.pending(queue), "done": self.keys.done(queue),
                           "held": self.keys.held(queue), "samples": self.keys.queue_samples(queue)},
                          {"queue": queue, "actor": actor or self.actor, "epoch": self.ns.epoch or ""}))
        forgotten = []
        for (_, argv), reply in zip(calls, self.runner.run_many("queue_forget", calls) if calls else [], strict=True):
            if isinstance(reply, Exception):
                raise reply
            if reply[0] == Code.OK:
                forgotten.append(str(argv["queue"]))
            elif reply[0] != "NOOP":
                raise_for_reply(reply, script="queue_forget")
        return forgotten

    def task_states(self, task_ids: Sequence[str]) -> dict[str, str | None]:
        """Each task's state now (None: no such task), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hget(self._task_keys(tid).task, "state")
        return dict(zip(task_ids, cast(list[str | None], pipe.execute()), strict=True))

    def trim_idempotency(self, *, limit: int = 1000) -> int:
        """Forget producer keys whose retired task's tombstone window has passed. Returns how many."""
        reply = self.runner.run("idem_trim", {**self._ns_keys(), "idem": self.keys.idem,
                                              "idem_until": self.keys.idem_until},
                                {"limit": check_int(limit, what="limit", low=1, high=10_000),
                                 "epoch": self.ns.epoch or "", "actor": self.actor})
        if reply[0] == Code.E_NONS:
            return 0  # no namespace yet: nothing to forget
        raise_for_reply(reply, script="idem_trim")
        return int(reply[1])

    def redis_time_ms(self) -> int:
        """Redis's clock, ms since the epoch: the namespace's one clock."""
        now_s, now_us = self.redis.time()
        return int(now_s) * 1000 + int(now_us) // 1000

    def _queue_name(self, queue: str) -> str:
        try:
            return check_queue(queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def _task_keys_or_none(self, task_id: str) -> TaskKeys | None:
        try:
            return self.keys.task(task_id)
        except ValueError:
            return None

    def pause_queue(self, queue: str, *, reason: str, actor: str | None = None) -> bool:
        """queue_pause: claims of the queue's Attempts are refused and the sweeper does not dispatch them
        until :meth:`resume_queue`; recorded in the namespace log. False when it was already paused."""
        return self._queue_pause(queue, "pause", reason, actor)

    def resume_queue(self, queue: str, *, reason: str, actor: str | None = None) -> bool:
        """queue_pause: undo :meth:`pause_queue` (recorded). False when the queue was not paused."""
        return self._queue_pause(queue, "resume", reason, actor)

    def _queue_pause(self, queue: str, action: str, reason: str, actor: str | None) -> bool:
        try:
            check_queue(queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        who = check_text(actor or self.actor, what="actor", max_bytes=200, spaces=False)

        def call(epoch: str) -> list[Any]:
            return self._run("queue_pause", {**self._ns_keys(), "paused": self.keys.paused},
                             {"queue": queue, "action": action, "actor": who, "reason": reason, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="queue_pause")
        return bool(reply[0] == Code.OK)

    def list_tasks(self, *, queue: str | None = None, states: Sequence[str] | None = None,
                   handler: str | None = None, created_before_ms: int | None = None,
                   created_after_ms: int | None = None, limit: int = 50) -> tuple[list[dict[str, Any]], bool]:
        """Tasks found through the indexes (never a scan of the keyspace), oldest index entry first:
        pending and backoff (the queues' pending indexes), running (lease and suspect indexes),
        succeeded and canceled (the queues' done indexes, newest first), failed, blocked and
        quarantined (the queues' held indexes). At most ``LIST_SCAN_FACTOR * limit`` index
        entries are looked at; the second value says whether that bound was reached (more may match)."""
        wanted = set(states or LISTABLE_STATES)
        unknown = wanted - set(LISTABLE_STATES)
        if unknown:
            raise InvalidArgument(f"state(s) {sorted(unknown)} are in no index; listable: {', '.join(LISTABLE_STATES)}")
        if queue is not None:
            try:
                check_queue(queue)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
        check_int(limit, what="limit", low=1, high=10_000)
        cap = LIST_SCAN_FACTOR * limit
        candidates: list[str] = []
        truncated = False

        def take(members: list[Any], strip_attempt: bool) -> None:
            nonlocal truncated
            for m in members:
                tid = str(m).rpartition("/")[0] if strip_attempt else str(m)
                if len(candidates) >= cap:
                    truncated = True
                    return
                if tid and tid not in seen:
                    seen.add(tid)
                    candidates.append(tid)

        seen: set[str] = set()
        qs = [queue] if queue else self.queues()
        reads = self.redis.pipeline(transaction=False)  # every index read in one round trip, in this order
        groups: list[tuple[int, bool]] = []  # (replies, strip the attempt number)
        if wanted & {"pending", "backoff"}:
            for q in qs:
                reads.zrange(self.keys.pending(q), 0, cap)
            groups.append((len(qs), False))
        if "running" in wanted:
            reads.zrange(self.keys.leases, 0, cap)
            reads.zrange(self.keys.suspect, 0, cap)
            groups.append((2, True))
        if wanted & {"failed", "blocked", "quarantined"}:
            for q in qs:
                reads.zrange(self.keys.held(q), 0, cap)
            groups.append((len(qs), False))
        if wanted & {"succeeded", "canceled"}:
            for q in qs:
                reads.zrevrange(self.keys.done(q), 0, cap)
            groups.append((len(qs), False))
        replies = iter(reads.execute())
        for n, strip in groups:
            for _ in range(n):
                take(cast(list[Any], next(replies)), strip)
        pipe = self.redis.pipeline(transaction=False)
        keep: list[str] = []
        for tid in candidates:
            try:
                if queue is not None and parse_task_id(tid) != queue:
                    continue
                pipe.hmget(self.keys.task(tid).task, "state", "queue", "handler", "created_at", "updated_at",
                           "attempts")
                keep.append(tid)
            except ValueError:
                continue  # an unreadable index member: the sweeper drops those
        rows: list[dict[str, Any]] = []
        for tid, (state, q, h, created, updated, n) in zip(keep, pipe.execute(), strict=True):
            if state is None or state not in wanted or (handler is not None and h != handler):
                continue
            created_ms = int(created or 0)
            if created_before_ms is not None and created_ms > created_before_ms:
                continue
            if created_after_ms is not None and created_ms < created_after_ms:
                continue
            rows.append({"task_id": tid, "queue": q, "handler": h, "state": state, "created_at_ms": created_ms,
                         "updated_at_ms": int(updated or 0), "attempts": int(n or 0)})
            if len(rows) >= limit:
                break
        return rows, truncated

    def dlq_fingerprints(self) -> dict[str, list[str]]:
        """The DLQ grouped by the fingerprint of each task's last failure: fingerprint -> task ids,
        oldest quarantine first ('' when the last Attempt recorded none)."""
        ids = [t for t, _ in self.dlq()]
        pipe = self.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(self._task_keys(tid).task, "attempts")
        numbers = pipe.execute()
        for tid, n in zip(ids, numbers, strict=True):
            pipe.hget(self._task_keys(tid).attempts, f"{n or 0}.fingerprint")
        out: dict[str, list[str]] = {}
        for tid, fp in zip(ids, pipe.execute(), strict=True):
            out.setdefault(str(fp or ""), []).append(tid)
        return out

    def paused_queues(self) -> dict[str, dict[str, Any]]:
        """Paused queues: queue -> {"reason", "actor", "at"} (ms), read only."""
        raw = cast(dict[str, str], self.redis.hgetall(self.keys.paused))
        out: dict[str, dict[str, Any]] = {}
        for q, value in sorted(raw.items()):
            try:
                out[q] = dict(json.loads(value))
            except (ValueError, TypeError):
                out[q] = {"reason": str(value)[:200]}
        return out

    def tombstone(self, task_id: str) -> dict[str, Any] | None:
        """A purged task's tombstone (who purged it, why, until when its id and key are refused), or None."""
        raw = self.redis.get(self._task_keys(task_id).tomb)
        return cast(dict[str, Any], json.loads(cast(str, raw))) if raw else None

    def begin_recovery(self, *, reason: str, actor: str | None = None) -> tuple[str, int]:
        """recover_begin: a new epoch, the fence floor raised; the namespace holds in 'recovering'."""
        reply = self._run("recover_begin", self._ns_keys(),
                          {"nonce": uuid.uuid4().hex[:8], "actor": actor or self.actor,
                           "reason": check_text(reason, what="reason", max_bytes=2000)})
        raise_for_reply(reply, script="recover_begin")
        return str(reply[1]), int(reply[2])

    def finish_recovery(self, epoch: str, *, voided: int, actor: str | None = None) -> None:
        """recover_finish: refused while a lease from before the recovery is still indexed."""
        reply = self._run("recover_finish", {"meta": self.keys.meta, "nslog": self.keys.nslog,
                                             "leases": self.keys.leases},
                          {"epoch": epoch, "actor": actor or self.actor, "voided": voided})
        raise_for_reply(reply, script="recover_finish")
        self.ns.forget()
        self.ns.write_witness(epoch)

    def log_event(self, event: str, fields: Mapping[str, Any]) -> None:
        """Record an operator's or the sweeper's act that no script makes (a retention policy set, a
        retention pass's deletions) in the namespace log, capped like the scripts' events."""
        entry = {"type": event, **{k: _printable(str(v), 2000) for k, v in fields.items() if v not in (None, "")}}
        self.redis.xadd(self.keys.nslog, entry, maxlen=NSLOG_MAX, approximate=True)  # type: ignore[arg-type]

    def audit(self, event: str, fields: Mapping[str, Any]) -> None:
        """Record what a worker refused to act on (a forged or misrouted transport message) in the
        refusals log, ``P:refused``, capped at about REFUSED_LOG_MAX entries (anyone able to write
        the transport can make these, so they neither grow Redis without bound nor trim the
        namespace log), and count it in the stats (``<event>`` there is never trimmed)."""
        entry = {"type": event, **{k: _printable(str(v), 1000) for k, v in fields.items() if v not in (None, "")}}
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(self.keys.refused, entry, maxlen=REFUSED_LOG_MAX, approximate=True)  # type: ignore[arg-type]
        pipe.hincrby(self.keys.stats, event, 1)
        pipe.execute()

    def refusals(self, count: int = 100) -> list[dict[str, str]]:
        """The newest entries of the refusals log (newest first), each with its stream id as ``id``."""
        entries = cast(list[tuple[str, dict[str, str]]], self.redis.xrevrange(self.keys.refused, count=count))
        return [dict(f, id=i) for i, f in entries]

    # ----------------------------------------------------------------- reads (never create anything)

    def namespace(self) -> NamespaceInfo:
        """The namespace's state, read only: ok | lost | recovering, or missing when Redis has none
        (reported as lost when it left traces or the embedded witness remembers it)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.meta)
        pipe.exists(self.keys.queues, self.keys.leases)
        meta, traces = pipe.execute()
        if meta:
            return NamespaceInfo(self.keys.prefix, meta.get("state") or "lost", meta.get("epoch", ""),
                                 int(meta.get("seq") or 0), int(meta.get("floor") or 0),
                                 meta.get("lost_reason", ""), int(meta.get("max_lease_ms") or DEFAULT_MAX_LEASE_MS))
        witness = self.ns.read_witness()
        if witness or traces:
            why = f"the witness remembers epoch {witness}" if witness else "the namespace still holds tasks"
            return NamespaceInfo(self.keys.prefix, "lost", witness or "", 0, 0,
                                 f"namespace meta is missing but {why}: Redis lost state")
        return NamespaceInfo(self.keys.prefix, "missing", "", 0, 0, "no such namespace yet")

    def get_task(self, task_id: str) -> Task:
        """The task with every Attempt and its whole event history (one round trip)."""
        rec, fence, pttl = self._read_task(task_id)
        if rec is None:
            raise TaskNotFound(f"no task {task_id} in namespace {self.keys.prefix!r}", task_id=task_id)
        return Task.from_redis(rec.fields, rec.attempts, rec.events, fence=fence, lease_pttl_ms=pttl)

    def task_record(self, task_id: str) -> Packed | None:
        """Everything Redis holds of a task as stored (hash fields, Attempt fields, events, effects), read
        from its live keys or its packed document; None when there is no such task. What the archive keeps."""
        return self._read_task(task_id)[0]

    def task_snapshot(self, task_id: str) -> tuple[Packed | None, str]:
        """The task as stored (:meth:`task_record`) and its version as ``retire.lua``'s ``seen`` compares it:
        ``'<updated_at> <last event id> <Attempt fields> <effects>'`` of its live keys ('0-0 0 0' when packed:
        a packed task has no live event stream, Attempts or effects)."""
        rec, _, _, version = self._read_task_versioned(task_id)
        return rec, version

    def _read_task(self, task_id: str) -> tuple[Packed | None, str | None, int]:
        """One round trip: the task as stored (live or packed), its fence and its lease's PTTL."""
        rec, fence, pttl, _ = self._read_task_versioned(task_id)
        return rec, fence, pttl

    def _read_task_versioned(self, task_id: str) -> tuple[Packed | None, str | None, int, str]:
        tk = self._task_keys(task_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(tk.task)
        pipe.hgetall(tk.attempts)
        pipe.xrange(tk.events)
        pipe.hgetall(tk.effects)
        pipe.get(tk.fence)
        pipe.pttl(tk.lease)
        fields, att, events, fx, fence, pttl = pipe.execute()
        if not fields:
            return None, None, int(pttl), ""
        version = f"{fields.get('updated_at') or 0} {events[-1][0] if events else '0-0'} {len(att)} {len(fx)}"
        if fields.get("packed"):  # a packed task keeps its fence counter in its hash (pack.lua)
            return self._unpacked(task_id, fields), fields.get("fence"), int(pttl), version
        return (Packed(fields=fields, attempts=att, events=[(str(i), dict(f)) for i, f in events], effects=fx),
                fence, int(pttl), version)

    @staticmethod
    def _unpacked(task_id: str, fields: Mapping[str, str]) -> Packed:
        """The document of a packed task hash (fields z0, z1, ...; pack.lua), its state the hash's."""
        try:
            return unpack(join_chunks(fields), fields)
        except ValueError as exc:
            raise McqError(f"task {task_id}: its packed history does not read ({exc})") from None

    def is_packed(self, task_id: str) -> bool:
        """Whether the task's history has been packed (a finished task, read back from one document)."""
        return bool(self.redis.hexists(self._task_keys(task_id).task, "packed"))

    def task_ids_of(self, index: str, *, limit: int = 1000) -> list[str]:
        """Members of one of the namespace's time indexes (leases, suspect, outbox, cancels), oldest first."""
        if index not in INDEXES:
            raise InvalidArgument(f"index must be one of {INDEXES}")
        return [str(m) for m in self.redis.zrange(getattr(self.keys, index), 0, limit - 1)]

    def queues(self) -> list[str]:
        """The namespace's queue names (every queue a task was ever enqueued on)."""
        return sorted(cast(set[str], self.redis.smembers(self.keys.queues)))

    def status(self) -> dict[str, dict[str, Any]]:
        """Per queue: task counts by state, and the queue age (oldest claimable pending Attempt)."""
        counts = cast(dict[str, str], self.redis.hgetall(self.keys.counts))
        out: dict[str, dict[str, Any]] = {q: {"counts": {}, "queue_age_ms": 0} for q in self.queues()}
        for name, value in counts.items():
            queue, _, state = name.rpartition("|")
            if int(value):
                out.setdefault(queue, {"counts": {}, "queue_age_ms": 0})["counts"][state] = int(value)
        now = self.redis_time_ms()
        pipe = self.redis.pipeline(transaction=False)
        for q in out:
            pipe.zrangebyscore(self.keys.pending(q), "-inf", now, start=0, num=1, withscores=True)
        for q, oldest in zip(out, pipe.execute(), strict=True):
            out[q]["queue_age_ms"] = max(0, now - int(oldest[0][1])) if oldest else 0
        return out

    def overview(self) -> dict[str, Any]:
        """Namespace-wide figures from the indexes (no scan of tasks): live leases, suspect or
        reconciling Attempts, attention items, quarantined tasks, dispatches due, namespace state."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.leases)
        pipe.zcard(self.keys.suspect)
        pipe.hlen(self.keys.attention)
        pipe.zcard(self.keys.dlq)
        pipe.time()
        leases, suspect, attention, dlq, (now_s, now_us) = pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000
        due = int(self.redis.zcount(self.keys.outbox, "-inf", now))
        info = self.namespace()
        return {"leases_live": int(leases), "suspect": int(suspect), "attention": int(attention),
                "quarantined": int(dlq), "outbox_due": due, "namespace_state": info.state,
                "namespace_reason": info.reason, **self.memory()}

    def memory(self) -> dict[str, int | None]:
        """Redis memory as the enqueue high-water mark sees it: used and ``maxmemory`` bytes (0: no
        limit), and the headroom left before enqueue refuses new work (90% of maxmemory; None without
        a limit). All None when INFO is not allowed for this user."""
        try:
            info = self.redis.info("memory")
        except redis.ResponseError:
            return {"memory_used_bytes": None, "memory_max_bytes": None, "enqueue_headroom_bytes": None}
        used, limit = int(info.get("used_memory") or 0), int(info.get("maxmemory") or 0)
        headroom = int(limit * ENQUEUE_MEMORY_SHARE) - used if limit else None
        return {"memory_used_bytes": used, "memory_max_bytes": limit, "enqueue_headroom_bytes": headroom}

    def attention_items(self) -> list[dict[str, Any]]:
        """Open attention items (stopped or quarantined tasks), oldest task first."""
        raw = cast(dict[str, str], self.redis.hgetall(self.keys.attention))
        return [json.loads(raw[k]) for k in sorted(raw)]

    def namespace_events(self, *, count: int | None = None) -> list[dict[str, str]]:
        entries = cast(list[tuple[str, dict[str, str]]], self.redis.xrange(self.keys.nslog, count=count))
        return [dict(f, id=i) for i, f in entries]

    def effects(self, task_id: str) -> dict[str, EffectRecord]:
        """Every side effect of the task: key -> intent / receipt record."""
        tk = self._task_keys(task_id)
        raw = cast(dict[str, str], self.redis.hgetall(tk.effects))
        if not raw and self.is_packed(task_id):
            raw = self._unpacked(task_id, cast(dict[str, str], self.redis.hgetall(tk.task))).effects
        return {k: EffectRecord.from_json(v) for k, v in sorted(raw.items())}


@dataclass
class ExpireReport:
    """What one expire pass did: leases expired, index entries dropped (orphans), errors per entry, and
    how many entries left the lease index (``removed``: a pass that removes none made no progress)."""

    expired: list[ExpiredLease] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    removed: int = 0

    def merge(self, other: ExpireReport) -> None:
        self.expired += other.expired
        self.dropped += other.dropped
        self.errors += other.errors
        self.removed += other.removed


ENDED_STATES = ("succeeded", "canceled", "failed", "blocked", "quarantined")  # no Attempt of theirs can run
LISTABLE_STATES = ("pending", "backoff", "running", *ENDED_STATES)  # states an index finds
LIST_SCAN_FACTOR = 10  # list_tasks looks at no more than this many index entries per row asked for


def _attempt_from_snapshot(task_id: str, n: int, flat: list[Any]) -> Attempt:
    """Attempt n from a script's HGETALL of the task's attempts hash ("<n>.<field>", value, ...)."""
    prefix = f"{n}."
    cut = len(prefix)
    fields = {str(flat[i])[cut:]: str(flat[i + 1]) for i in range(0, len(flat), 2) if str(flat[i]).startswith(prefix)}
    return Attempt.from_fields(task_id, n, fields)


# The fields of an effect record mc_queue writes itself (lua/includes/common.lua EFFECT_OWN_FIELDS).
EFFECT_OWN_FIELDS = frozenset({"state", "attempt", "fence", "worker", "intent_at", "key", "record_json",
                               "receipt_json", "receipt", "receipt_at", "receipt_attempt", "settled_by", "source",
                               "note"})


def _check_effect_record(record: Any) -> None:
    """An intent record every reader can read: a JSON object with a non-empty ``operation`` and an
    ``identity`` (strings), and none of the fields mc_queue writes itself."""
    if not isinstance(record, Mapping):
        raise InvalidArgument(f"effect record must be a mapping, got {type(record).__name__}")
    op, ident = record.get("operation"), record.get("identity")
    if not isinstance(op, str) or not op:
        raise InvalidArgument(f"effect record needs an operation (a non-empty string), got {op!r}")
    check_text(op, what="effect operation", max_bytes=200)
    if not isinstance(ident, str):
        raise InvalidArgument(f"effect record needs an identity (a string), got {ident!r}")
    check_text(ident, what="effect identity", max_bytes=4096)
    own = sorted(EFFECT_OWN_FIELDS & set(record))
    if own:
        raise InvalidArgument(f"effect record fields {', '.join(own)} are written by mc_queue, not by the caller")


def _printable(text: str, limit: int) -> str:
    """Text cut to ``limit`` bytes of UTF-8 with control characters and lone surrogates replaced:
    for recording what a caller sent when that is itself what was wrong."""
    clean = "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in text)
    data = clean.encode("utf-8", "replace")[:limit]
    return data.decode("utf-8", "ignore")


def decision_args(d: Decision | None, *, default: str) -> dict[str, Any]:
    """A decision as the ARGV fail.lua and reconcile_settle.lua take."""
    return {"decision": d.action if d else default, "why": _printable(d.why, 2000) if d else "",
            "next_reason": _printable(d.next_reason, 2000) if d else "",
            "next_hypothesis": _printable(d.next_hypothesis, 2000) if d else "",
            "delay_ms": min(int(d.delay_s * 1000), 365 * 86_400_000) if d else 0,
            "attention": canonical_json(d.attention, what="attention") if d and d.attention else "",
            "budget": d.budget_exhausted if d else ""}


def as_failure(failure: Failure | Mapping[str, Any]) -> Failure:
    """A Failure with its fingerprint (computed when missing)."""
    if isinstance(failure, Mapping):
        try:
            failure = Failure.model_validate(dict(failure))
        except Exception as exc:
            raise InvalidArgument(f"failure is not a valid Failure record: {exc}") from None
    if not isinstance(failure, Failure):
        raise InvalidArgument(f"failure must be a Failure (classify an exception first with "
                              f"mc_queue.classify(exc).failure), got {type(failure).__name__}")
    if not failure.fingerprint:
        return failure.model_copy(update={
            "fingerprint": fingerprint(failure.failure_class, failure.type, failure.message)})
    if len(failure.fingerprint) != 16 or set(failure.fingerprint) - set("0123456789abcdef"):
        raise InvalidArgument(f"failure fingerprint {failure.fingerprint!r} is not 16 lowercase hex digits; "
                              "leave it empty to have it computed")
    return failure


def parse_queue(task_id: str) -> str:
    """The queue of a task id (InvalidArgument when it is not one)."""
    try:
        return parse_task_id(task_id)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
