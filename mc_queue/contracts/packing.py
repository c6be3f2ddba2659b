"""A finished task's history as one compressed document (what ``lua/pack.lua`` swaps in).

A finished task lives in Redis as a hash of ~16 fields, a hash of Attempt fields and a stream of events:
about 8.5 KB at Redis's default settings (the hashes hold values over 64 bytes, so Redis keeps them
as hash tables, and every stream preallocates a 4 KB node). Once a task has finished (succeeded or
canceled: nothing moves it again) the sweeper packs all of it, task fields, Attempts, events and
effects, into one JSON document compressed with zlib and a preset dictionary of the strings every
task repeats (field names, event types, the default policy): a few hundred bytes, kept in the task
hash itself in chunks of at most 64 bytes (so Redis keeps the hash as one compact listpack).

The format is versioned by its first four bytes (``mcz1``): a document is always read with the
dictionary it was written with, so the dictionary below never changes; a new one gets a new magic.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAGIC = b"mcz1"

# The preset dictionary of format mcz1. zlib finds matches in it as if it preceded the document, and
# prefers the nearest: the most common strings come last. Never edit it (documents written with it
# would no longer read); a new dictionary gets a new magic.
_ZDICT_MCZ1 = (
    b'{"actions":{"authorization":"stop","capacity":"retry","configuration":"stop","executor":"retry",'
    b'"internal":"quarantine","provider":"retry","repository":"retry_if_new_hypothesis",'
    b'"validation":"retry_if_new_hypothesis"},"backoff":{"base_s":1.0,"max_s":300.0},"version":"default-v1"}'
    b'{"max_attempts":5,"max_cost":null,"max_interruptions":3,"max_same_fingerprint":3,"max_tokens":null,'
    b'"max_wall_s":null}'
    b'{"base_sha":null,"context":{},"executor":null,"handler":"","lease_ms":60000,"model":null,'
    b'"payload_digest":"","policy_version":"default-v1","timeout_s":null}'
    b'"failure_class":"","fingerprint":"","message":"","retryable":false,"traceback":"","type":""'
    b'"attention_raised""task_quarantined""lease_expired""reconciling_started""attempt_reconciled"'
    b'"task_canceled""cancel_requested""effect_intent""effect_receipt""checkpoint_recorded"'
    b'"stale_write_refused""attempt_failed""decision""retry_of""hypothesis""evidence"'
    b'"1.ckpt.""1.phase""1.failure""1.fclass""1.fingerprint""1.dispatches""1.dispatched_at"'
    b'"1.settled_by""1.cancel_ack_at""1.charge_req"'
    b'"budget":"retry_policy":"manifest":"payload":"lease_ms":"10000","idem_key":"'
    b'"t":{"queue":"","id":"","handler":"","state":"succeeded","active":"","payload_digest":"",'
    b'"attempts":"1","created_at":"17","updated_at":"17","result":'
    b'"a":{"1.state":"succeeded","1.fence":"1","1.reason":"first dispatch","1.created_at":"17",'
    b'"1.elapsed_ms":"","1.cost":"0","1.worktree":"","1.lease_exp":"17","1.manifest":"1.result":'
    b'"1.seq":"","1.claim_req":"","1.worker":"","1.lease_ms":"","1.tokens":"0","1.due_at":"17",'
    b'"1.result_digest":"","1.hb_at":"17","1.started_at":"17","1.ended_at":"17"},'
    b'"e":[["17","type":"task_created","actor":"","handler":"","payload_digest":"","idem_key":""],'
    b'["17","type":"attempt_created","attempt":"1","actor":"","reason":"first dispatch"],'
    b'["17","type":"attempt_claimed","attempt":"1","worker":"","fence":"1","lease_exp":"17","lease_ms":"'
    b'["17","type":"attempt_succeeded","attempt":"1","worker":"","fence":"1","result_digest":"'
    b'"x":{}}'
)


@dataclass(frozen=True)
class Packed:
    """A packed task read back: its hash fields, Attempt fields, events (id, fields) and effects."""

    fields: dict[str, str]
    attempts: dict[str, str]
    events: list[tuple[str, dict[str, str]]]
    effects: dict[str, str]


# Task fields pack.lua keeps in the packed hash itself: the document leaves them out, unpack takes
# them from the hash (every one is read there by the scripts anyway).
HASH_FIELDS = ("id", "queue", "handler", "state", "payload_digest", "attempts", "active", "created_at", "updated_at",
               "idem_key")


def pack(fields: dict[str, str], attempts: dict[str, str], events: list[tuple[str, dict[str, str]]],
         effects: dict[str, str]) -> bytes:
    """The document of one task: ``mcz1`` + zlib(JSON) with the mcz1 dictionary. The task fields the
    packed hash keeps (HASH_FIELDS) are left out: :func:`unpack` is given them back."""
    rest = {k: v for k, v in fields.items() if k not in HASH_FIELDS}
    doc = {"t": rest, "a": attempts, "e": [[i, f] for i, f in events], "x": effects}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogateescape")
    comp = zlib.compressobj(level=9, zdict=_ZDICT_MCZ1)
    return MAGIC + comp.compress(text) + comp.flush()


def join_chunks(fields: Mapping[str, str]) -> bytes:
    """The document of a packed task hash: its fields z0, z1, ... (``packed`` of them) joined. The
    client reads them decoded with surrogateescape, which gives every byte back as it was."""
    try:
        count = int(fields.get("packed") or 0)
    except ValueError:
        raise ValueError(f"a packed task hash whose chunk count {fields.get('packed')!r} is not a number") from None
    parts = []
    for i in range(count):
        chunk = fields.get(f"z{i}")
        if chunk is None:
            raise ValueError(f"a packed task hash with chunk z{i} of {count} missing")
        parts.append(chunk.encode("utf-8", "surrogateescape"))
    return b"".join(parts)


def unpack(blob: bytes, hash_fields: Mapping[str, str] | None = None) -> Packed:
    """Read a document back, with the task fields its packed hash kept (HASH_FIELDS of ``hash_fields``);
    ValueError names what is wrong with one that is not a packed task."""
    if not isinstance(blob, bytes) or blob[:4] != MAGIC:
        raise ValueError(f"not a packed task document (expected it to start with {MAGIC!r})")
    try:
        d = zlib.decompressobj(zdict=_ZDICT_MCZ1)
        text = d.decompress(blob[4:]) + d.flush()
        doc: dict[str, Any] = json.loads(text.decode("utf-8", "surrogateescape"))
        kept = {k: str(v) for k, v in (hash_fields or {}).items() if k in HASH_FIELDS}
        return Packed(fields={**dict(doc["t"]), **kept}, attempts=dict(doc["a"]),
                      events=[(str(i), dict(f)) for i, f in doc["e"]], effects=dict(doc["x"]))
    except (zlib.error, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"a packed task document that does not read: {exc}") from None


# ------------------------------------------------------------------------------------- long values
#
# A hash stays one compact listpack while every value is at most 64 bytes (Redis's default
# hash-max-listpack-value); a single longer value turns the whole hash into a hash table of ~60 bytes
# per field. The scripts write the values that may be long and that no script reads back to decide
# anything (LONG_FIELDS, of the task or of an Attempt: '<n>.<name>') in chunks: the field itself holds
# the byte 0xFF and the number of chunks, fields '<field>#<i>' hold them (``put`` in
# lua/includes/common.lua). A value above LONG_CHUNK * LONG_MAX_CHUNKS bytes is kept whole.

LONG_FIELDS = frozenset({"payload", "manifest", "retry_policy", "budget", "result", "failure", "reason", "evidence",
                         "hypothesis"})
LONG_CHUNK = 64
LONG_MAX_CHUNKS = 32
LONG_MARK = "\udcff"  # the byte 0xFF as the client reads it (surrogateescape): never in UTF-8 text


def _long_name(field: str) -> bool:
    return field.partition(".")[2] in LONG_FIELDS if field[:1].isdigit() else field in LONG_FIELDS


def tombstone_record(task_id: str, entry: str, record: str, idem_key: str | None,
                     request_id: str | None, now_ms: int) -> dict[str, Any] | None:
    """A tombstone as its bucket entry holds it (``lua/includes/common.lua`` tomb_put) in the form a
    tombstone key held it before (its JSON), or None once it has ended: a retired task's at the end of
    its window, a purged one's a minute after the purge at the earliest."""
    until_s, attempts, state, fence, _ref = entry.split(" ")
    rec = json.loads(record)
    until_ms, window = int(until_s), int(rec["window_ms"])
    purged_at = until_ms - window
    out: dict[str, Any] = {"task": task_id, "idem_key": idem_key or "", "reason": rec["reason"],
                           "actor": rec["actor"], "purged_at": purged_at, "until_ms": until_ms,
                           "attempts": int(attempts)}
    if rec["kind"] == "purged":
        out["request_id"] = request_id or ""
        ends = purged_at + max(window, 60_000)
    else:
        out["state"], out["fence"] = state, int(fence)
        ends = until_ms
    return out if now_ms < ends else None


def join_long(fields: Mapping[str, str]) -> dict[str, str]:
    """A task or Attempts hash as stored (HGETALL) with its chunked values joined and their chunk
    fields left out: what was written. ValueError names a chunk that is missing."""
    marked = [k for k, v in fields.items() if v[:1] == LONG_MARK and _long_name(k)]
    if not marked:
        return dict(fields)
    out = dict(fields)
    for k in marked:
        try:
            count = int(out[k][1:])
        except ValueError:
            raise ValueError(f"field {k!r} is marked as chunked with a count that is not a number") from None
        parts = [out.pop(f"{k}#{i}", None) for i in range(count)]
        if any(p is None for p in parts):
            raise ValueError(f"field {k!r} is missing one of its {count} chunks")
        out[k] = join_parts(str(p) for p in parts)
    return out


def join_parts(parts: Iterable[str]) -> str:
    """A long value's chunks, as the client reads them (each decoded with surrogateescape: a character
    cut by a chunk's end comes back whole once joined), joined into the value that was written."""
    return b"".join(p.encode("utf-8", "surrogateescape") for p in parts).decode("utf-8", "surrogateescape")
