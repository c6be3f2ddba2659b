"""The only place where Redis key strings and ids are built.

Every key of one namespace carries the same hash tag, ``{<prefix>}``, so each Lua script touches
exactly one slot (Redis Cluster puts a whole namespace on one shard; scale out with several
namespaces). Every key a script touches is passed to it in KEYS; no script builds a key itself.

Key schema (``P`` = ``{prefix}``)::

    P:meta                 hash   namespace epoch, state (ok | lost | recovering), fence floor, claim seq,
                                  enqueue's last reading of INFO memory (mem_at, mem_room)
    P:nslog                stream namespace events: creation, state loss detected, recovery, refusals
                                  without a task, orphans; capped at about 100,000 (XADD MAXLEN ~)
    P:refused              stream what workers refused to act on (forged or misrouted transport messages),
                                  capped (XADD MAXLEN ~), so a flood neither grows Redis nor trims P:nslog
    P:epochs               set    epochs retired by ``mcq recover``
    P:idem                 hash   producer idempotency key -> task id
    P:idem_until           zset   producer key of a retired or purged task -> when its entry may go (ms)
    P:queues               set    queue names seen
    P:counts               hash   "<queue>|<task state>" -> number of tasks in that state
    P:leases               zset   attempt id -> lease expiry (ms, Redis clock); the expiry index
    P:suspect              zset   attempt id -> time it turned suspect (ms)
    P:attention            hash   task id -> attention item JSON (what was tried, why stop)
    P:dlq                  zset   task id -> time it was quarantined
    P:outbox               zset   attempt id -> when to (re)dispatch it (ms), as versions before 2026-12 kept the
                                  dispatch schedule: drained by the sweeper (mark_dispatched drops each entry);
                                  the sweeper walks the pending indexes instead
    P:cancels              zset   attempt id -> deadline for the executor to acknowledge a cancel (ms)
    P:stats                hash   counters for metrics: refusals, expiries, reconciliations, decisions, and
                                  the Attempt histograms (wait|<queue>|<handler>|<bucket>, wait_ms|..., at
                                  claim; fin|<queue>|<handler>|<outcome>|<bucket>, fin_ms|..., at the end)
    P:sweeper              hash   the sweeper's last pass: last_pass_ms, pass_ms, passes (written after each pass);
                                  "pack|<queue>": "<score> <entries at that score>" its pack walk of the
                                  queue's done index reached
    P:periodic             hash   periodic schedule name -> its definition JSON (contracts/periodic.py Periodic),
                                  published by the App that declares it (``mcq sweeper --app``, ``mcq worker``)
    P:periodic:<name>      hash   a schedule's state (lua/periodic_decide.lua): cursor (the last tick decided, ms),
                                  pending ("<tick> <task id> <cancel previous>": a tick decided to run, its task
                                  not yet confirmed made), last_task, last_tick, paused (JSON: reason, actor, at),
                                  counts: ran, skipped_overlap, skipped_missed, skipped_paused, triggered
    P:limits               hash   rate limits (lua/limit_admin.lua): "<key>" -> "<limit> <window_ms> <source>" (cost
                                  units admitted per sliding window), "<key>|used" (units in the log), "<key>|paused"
                                  (until, ms: a provider's 429), "<key>|why" (the pause's reason), "<key>|next" (the
                                  next free slot of a deferred claim); the claim checks and takes units;
                                  concurrency: "<key>|slots" ("<slots> <on full> <source>", a key or a family
                                  '<name>:*'), "<key>|wfence" (the key's writer fence, one more per slot taken);
                                  spend ceilings: "<key>|spend" ("<cost thousandths> <tokens> <window_ms> <on over>
                                  <source>", a key or a family), "<key>|snext" (the next recheck of a deferred claim);
                                  fair shares: "<key>|weight" ("<weight> <source>", a key or a family: its
                                  fair lanes' weight, lua/fair_pop.lua)
    P:caps                 hash   queue -> "<max depth> <source>" (lua/queue_cap.lua): the enqueue scripts refuse a
                                  task beyond it (E_FULL), the lowest priorities first (admit.lua queue_room)
    P:slotheld             zset   concurrency slots held, score 0, by text: "<key>\n<claimed at, 15 digits>\n<attempt
                                  id>" (claim.lua adds; complete, fail, expire, cancel_ack return it: slots_free)
    P:slotwait             zset   Attempts parked for a slot, score 0, by text: "<key>\n<place, 15 digits>\n<queue>
                                  \n<task id>" (a returned slot wakes its key's first)
    P:slotwake             zset   waiters whose slot returned (same members) -> when (ms): slot_wake.lua (the
                                  sweeper) makes each due; slot_audit.lua adds those a free slot waits for
    P:spent                zset   spend ceilings (denial of wallet), score 0, by text: a running Attempt's reservation
                                  "<key>\n~\n<attempt id>\n<cost thousandths> <tokens>" (claim.lua), replaced when it
                                  stops by its charges added to a bucket "<key>\n<start ms, 15 digits>\n<bucket ms>\n
                                  <cost> <tokens>" (spend_settle: complete, fail, expire, cancel_ack)
    P:breaker:<key>        hash   a circuit breaker's window (lua/breaker_record.lua): "<bucket ms>|calls", "|fails",
                                  "|slow", "|fp:<fingerprint>" -> counts, ten buckets to a window (PEXPIRE a window)
    P:limit:<key>          zset   a rate limit's admission log: "<attempt id> <cost>" -> when it was claimed (ms);
                                  entries older than the window are dropped by the next claim
    P:paused               hash   paused queue -> {"reason", "actor", "at"} JSON (queue_pause.lua; claim refuses
                                  a paused queue's Attempts, the sweeper does not dispatch them)
    P:w:<worker id>        string a live worker's liveness key ("<host> <pid>"), PX a few heartbeats, refreshed
                                  by a thread of the worker process: gone soon after the process dies
    P:w:<worker id>:seen   string the same value, PX a day, refreshed with it: this worker keeps a liveness key
                                  (so its absence means dead, not a worker that never kept one)
    P:q:<queue>:pending    zset   task id -> time its pending Attempt became claimable (ms); the sweeper walks it
                                  to send what was never dispatched or not claimed in time (its Attempt's
                                  dispatched_at)
    P:q:<queue>:lanes@p<n> hash   fair lanes of the queue's RQ queue of priority n (lua/fair_push.lua, fair_pop.lua):
                                  the Attempts' messages of tasks with a fairness key, a FIFO per key: "<key>|h"
                                  (next to serve), "<key>|t" (last queued), "<key>|<seq>" -> RQ job id, "j:<job
                                  id>" -> "<key>|<seq>"; "<key>|p": an idle key's pass; "vt": the last pass served.
                                  The RQ queue holds one ticket ('mcq-fair') per message in it
    P:q:<queue>:turns@p<n> zset   the keys with messages in those lanes -> their pass (served lowest first; a
                                  pass grows by 1,000,000 / the key's weight per message served)
    P:q:<queue>:deadlines  zset   task with a start_by or finish_by -> the next deadline to check (ms): the
                                  sweeper cancels what missed one (its step only; an entry of a task that
                                  ended or is gone is dropped when seen)
    P:q:<queue>:done       zset   finished task (succeeded, canceled) -> when it finished (ms): retention
                                  by age and count, and ``mcq tasks --state succeeded``
    P:q:<queue>:held       zset   task waiting for a person (failed, blocked, quarantined) -> since when (ms);
                                  left by retry, replay, cancel; kept longer by retention
    P:topack               zset   finished task whose pack the sweeper tries again (it changed between its read and
                                  its pack; versions before 2026-12 listed every finished task here); the
                                  sweeper finds the others by walking each queue's done index (below)
    P:retention            hash   "<queue>" -> the operator's retention policy JSON, "app:<queue>" -> the App's
    P:q:<queue>:samples    stream the operator console's samples of the queue (age, depth, finished and failed
                                  totals), written by ``mcq dashboard``, capped (XADD MAXLEN): its charts
    P:t:<task id>          hash   the Task, its fence counter in field 'fence' (HINCRBY at every claim, expiry
                                  and cancel acknowledgement); once finished and packed (lua/pack.lua), only
                                  the fields the scripts read, the fence, and its whole history as one
                                  compressed document in fields z0, z1, ... of at most 64 bytes (:a, :ev, :fx
                                  are gone)
                                  Its Attempts are fields of the same hash, "<n>.<field>" (a name that
                                  starts with a digit; no task field does)
    P:t:<task id>:a        hash   a task's Attempts as versions before 2026-12 kept them (TaskKeys.attempts_v1):
                                  the scripts are given this key and use it while it exists
    P:t:<task id>:ev       stream its append-only event history
    P:t:<task id>:fx       hash   its side effects: operation key -> intent / receipt record
    P:t:<task id>:fence    string a task's fence counter as versions before 2026-12 kept it: still read, and moved
                                  into the task hash at the task's next fence
    P:t:<task id>:lease    string "<attempt>:<fence>" while a lease is live (PXAT at claim, PEXPIREAT at renew)
    P:tomb:<task id>       string a purged task's tombstone as versions before 2026-12 kept it (JSON, PX the
                                  window): still read
    P:tombs:<queue>:<b>    hash   purged tasks' tombstones, many to a bucket: <b> is the first 7 characters of
                                  their ULIDs (created within ~33 s); a bucket of 96 fields is full, and the
                                  next go to the bucket of 8 characters (~1 s), then of 9 (32 ms; never full).
                                  Field <the ULID's last 19 characters>: "<until_ms> <attempts> <state>
                                  <fence> <ref>"; "<rest>.k": its producer key, "<rest>.q": a purge's request
                                  id; "r:<ref>": who purged, why, the window (JSON; shared by a retention
                                  pass). PEXPIREAT the latest end of an entry in it or a deeper bucket
                                  (lua/includes/common.lua tomb_put)

Ids: a task id is ``<queue>:<ulid>`` (the queue is part of the identity, so a script can be given
the queue's keys from the id alone); an attempt id is ``<task id>/<n>``.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

# Matched with fullmatch: "$" would also match before a trailing newline.
QUEUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_ULID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TASK_ID_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,63}):([0-9A-HJKMNP-TV-Z]{26})")
_NUMBER_RE = re.compile(r"[0-9]{1,7}")  # str.isdigit() also accepts '²' and other digits int() refuses


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not QUEUE_RE.fullmatch(queue):
        raise ValueError(
            f"invalid queue name {queue!r}: use 1-64 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return queue


LIMIT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
# The last of a dependency's declared fallbacks may be this: the step that calls it can be skipped while it is
# down (``App.optional``; no key is named so, a limit key starts with a letter or digit).
SKIP_STEP = "-"


def check_limit_name(name: str) -> str:
    """A rate limit's key ("github", "model:openai"): what tasks name and operators configure."""
    if not isinstance(name, str) or not LIMIT_NAME_RE.fullmatch(name):
        raise ValueError(f"invalid rate limit key {name!r}: use 1-128 letters, digits, '_', '.', ':', '-', "
                         "starting with a letter or digit")
    return name


def limit_names(text: str) -> tuple[str, ...]:
    """The rate limit keys of a task's ``limits`` field ("<key>=<cost>,..."), in its order."""
    return tuple(item.rpartition("=")[0] for item in text.split(",") if item)


def new_ulid() -> str:
    """A 26-character ULID: 48 bits of milliseconds, 80 random bits; sorts by creation time."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_ULID_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_task_id(queue: str) -> str:
    return f"{check_queue(queue)}:{new_ulid()}"


def parse_task_id(task_id: str) -> str:
    """Return the queue of a task id, or raise ValueError saying what a task id looks like."""
    m = _TASK_ID_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if not m:
        raise ValueError(f"invalid task id {task_id!r}: expected '<queue>:<26-character ULID>'")
    return m.group(1)


def attempt_id(task_id: str, number: int) -> str:
    """The id of Attempt ``number`` of a task: ``<task id>/<n>``."""
    return f"{task_id}/{number}"


def parse_attempt_id(value: str) -> tuple[str, int]:
    """Split ``<task id>/<n>`` into (task id, n); raise ValueError on anything else."""
    task_id, sep, num = value.rpartition("/") if isinstance(value, str) else ("", "", "")
    if not sep or not _NUMBER_RE.fullmatch(num) or int(num) < 1:
        raise ValueError(f"invalid attempt id {value!r}: expected '<task id>/<attempt number>'")
    parse_task_id(task_id)
    return task_id, int(num)


TOMB_FULL = 96  # fields (entries and their records) that fill a tombstone bucket (lua/includes/common.lua TOMB_FULL)


@dataclass(frozen=True)
class TaskKeys:
    task: str
    attempts: str  # the hash of its Attempt fields: the task hash itself
    attempts_v1: str  # where a task written before 2026-12 keeps them (the scripts' 'attempts' key)
    events: str
    pending: str
    effects: str
    fence: str
    lease: str
    tomb: str  # a tombstone as versions before 2026-12 kept it (a key each): still read
    done: str
    held: str
    deadlines: str
    tombs: tuple[str, str, str]  # the tombstone buckets its id may be in, by level (below)

    def tomb_keys(self) -> dict[str, str]:
        """The KEYS of a script that reads or writes this task's tombstone (enqueue, retire, dlq_purge)."""
        return {"tomb": self.tomb, "tombs0": self.tombs[0], "tombs1": self.tombs[1], "tombs2": self.tombs[2]}


class Keys:
    """Key builder for one namespace."""

    def __init__(self, prefix: str = "mcq") -> None:
        if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
            raise ValueError(f"invalid key prefix {prefix!r}: use letters, digits, '_', '.', ':', '-'")
        self.prefix = prefix
        tag = "{" + prefix + "}"
        self.tag = tag
        self.meta = f"{tag}:meta"
        self.nslog = f"{tag}:nslog"
        self.refused = f"{tag}:refused"
        self.epochs = f"{tag}:epochs"
        self.idem = f"{tag}:idem"
        self.queues = f"{tag}:queues"
        self.counts = f"{tag}:counts"
        self.leases = f"{tag}:leases"
        self.suspect = f"{tag}:suspect"
        self.attention = f"{tag}:attention"
        self.dlq = f"{tag}:dlq"
        self.outbox = f"{tag}:outbox"
        self.cancels = f"{tag}:cancels"
        self.stats = f"{tag}:stats"
        self.sweeper = f"{tag}:sweeper"
        self.paused = f"{tag}:paused"
        self.topack = f"{tag}:topack"
        self.idem_until = f"{tag}:idem_until"
        self.retention = f"{tag}:retention"
        self.periodic = f"{tag}:periodic"
        self.released = f"{tag}:released"  # tasks that ended with dependents waiting: parent id -> when (ms)
        self.limits = f"{tag}:limits"  # rate limits: config, units used, pauses (lua/limit_admin.lua, claim.lua)
        self.slotheld = f"{tag}:slotheld"  # concurrency slots held: "<key>\n<claimed at>\n<attempt id>" (score 0)
        self.slotwait = f"{tag}:slotwait"  # Attempts waiting for a slot: "<key>\n<place>\n<queue>\n<task id>"
        self.caps = f"{tag}:caps"  # queue caps (backpressure, lua/queue_cap.lua): queue -> "<max depth> <source>"
        self.slotwake = f"{tag}:slotwake"  # waiters to wake (slot_wake.lua), scored by when their slot returned
        self.spent = f"{tag}:spent"  # spend ceilings: running Attempts' reservations, what ended ones spent

    def pending(self, queue: str) -> str:
        return f"{self.tag}:q:{queue}:pending"

    def queue_samples(self, queue: str) -> str:
        """The operator console's capped series of samples of a queue (``mc_queue.ops.console``)."""
        return f"{self.tag}:q:{queue}:samples"

    def done(self, queue: str) -> str:
        return f"{self.tag}:q:{queue}:done"

    def held(self, queue: str) -> str:
        return f"{self.tag}:q:{queue}:held"

    def fair_lanes(self, queue: str, priority: int) -> str:
        """The fair lanes of one RQ queue (a queue's priority): one FIFO per fairness key."""
        return f"{self.tag}:q:{queue}:lanes@p{priority}"

    def fair_turns(self, queue: str, priority: int) -> str:
        """The fairness keys with messages in those lanes -> their pass (the lowest is served next)."""
        return f"{self.tag}:q:{queue}:turns@p{priority}"

    def deadlines(self, queue: str) -> str:
        """The queue's tasks that carry a deadline: task id -> the next one to check (ms, Redis clock)."""
        return f"{self.tag}:q:{queue}:deadlines"

    def limit_log(self, name: str) -> str:
        """A rate limit's admission log: "<attempt id> <cost>" -> when claimed (ms, Redis clock)."""
        return f"{self.tag}:limit:{check_limit_name(name)}"

    def breaker_window(self, name: str) -> str:
        """A circuit breaker's window of call outcomes, in ten buckets (lua/breaker_record.lua)."""
        return f"{self.tag}:breaker:{check_limit_name(name)}"

    def periodic_state(self, name: str) -> str:
        """A periodic schedule's state: its cursor, the tick being made, its last task, pause, counts."""
        return f"{self.tag}:periodic:{name}"

    def worker(self, worker_id: str) -> str:
        """A worker process's liveness key (set with a TTL by the worker itself)."""
        return f"{self.tag}:w:{worker_id}"

    def task(self, task_id: str) -> TaskKeys:
        queue = parse_task_id(task_id)
        base = f"{self.tag}:t:{task_id}"
        return TaskKeys(task=base, attempts=base, attempts_v1=f"{base}:a", events=f"{base}:ev",
                        pending=self.pending(queue),
                        effects=f"{base}:fx", fence=f"{base}:fence", lease=f"{base}:lease",
                        tomb=f"{self.tag}:tomb:{task_id}", done=self.done(queue),
                        held=self.held(queue), deadlines=self.deadlines(queue), tombs=self.tomb_buckets(task_id))

    def tomb_buckets(self, task_id: str) -> tuple[str, str, str]:
        """The tombstone buckets a task id's tombstone may be in: its queue's bucket of the first 7, 8
        and 9 characters of its ULID (tasks created within the same ~33 s, ~1 s, 32 ms)."""
        queue = parse_task_id(task_id)
        ulid = task_id[-26:]
        return (f"{self.tag}:tombs:{queue}:{ulid[:7]}", f"{self.tag}:tombs:{queue}:{ulid[:8]}",
                f"{self.tag}:tombs:{queue}:{ulid[:9]}")

    def nowhere(self) -> TaskKeys:
        """Per-task keys that name no task (``{prefix}:t:-``): for an index member that is unreadable."""
        base = f"{self.tag}:t:-"
        return TaskKeys(task=base, attempts=base, attempts_v1=f"{base}:a", events=f"{base}:ev",
                        pending=f"{base}:pending",
                        effects=f"{base}:fx", fence=f"{base}:fence", lease=f"{base}:lease", tomb=f"{base}:tomb",
                        done=f"{base}:done", held=f"{base}:held", deadlines=f"{base}:deadlines",
                        tombs=(f"{base}:tombs0", f"{base}:tombs1", f"{base}:tombs2"))
