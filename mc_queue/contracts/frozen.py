"""What a task froze at enqueue (its retry policy, its budget, its manifest), stored as its changes
from a frozen base.

Every task carries the three records, and most tasks carry them at their defaults: written out in
full they were 620 bytes of the task hash, and each one over Redis's 64-byte limit for a compact hash
turned the whole hash into a hashtable (1,776 bytes for a queued task with a small payload). Stored
here as the canonical JSON of the fields that differ from a **base** and the base's version
(``{"$v":1,"max_attempts":3}``), each is a few bytes, and reads expand it back to the full canonical
JSON it was before, byte for byte.

**Frozen means frozen.** A base is a literal, never the models' current defaults: a task enqueued
today must read back the same policy after the defaults change. Changing a default therefore means
adding a base (version 2) and writing new records against it; version 1 stays for the tasks stored
with it (``tests/unit/test_frozen.py`` fails until that is done). A record stored before this
encoding (full JSON, no ``"$v"``) is read as it is.

A manifest's ``handler`` and ``payload_digest`` are the task's own fields (``handler``,
``payload_digest``): left out of the stored manifest when they equal them, and filled in from them on
read.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from .codec import canonical_json
from .errors import InvalidArgument

VERSION_KEY = "$v"
CURRENT = 1

BASES: dict[str, dict[int, dict[str, Any]]] = {
    "retry_policy": {1: {
        "actions": {"authorization": "stop", "capacity": "retry", "configuration": "stop", "executor": "retry",
                    "internal": "quarantine", "provider": "retry", "repository": "retry_if_new_hypothesis",
                    "validation": "retry_if_new_hypothesis"},
        "backoff": {"base_s": 1.0, "max_s": 300.0},
        "version": "default-v1",
    }},
    "budget": {1: {
        "max_attempts": 5, "max_cost": None, "max_interruptions": 3, "max_same_fingerprint": 3, "max_tokens": None,
        "max_wall_s": None,
    }},
    "manifest": {1: {
        "base_sha": None, "context": {}, "executor": None, "lease_ms": None, "model": None,
        "policy_version": "default-v1", "timeout_s": None,
    }},
}
TASK_OWN = ("handler", "payload_digest")  # manifest fields the task hash holds itself
# A retry policy or budget at version 1's base is not stored at all (lua/enqueue.lua leaves out exactly
# this text): an absent record reads as this, version 1's base, whatever CURRENT becomes.
OMITTED = '{"$v":1}'


def compact(kind: str, record: dict[str, Any], *, task: dict[str, str] | None = None) -> str:
    """The stored form of ``record`` (a model's JSON dump) of ``kind``: its fields that differ from the
    current base, and the base's version. With ``task`` (a manifest's), fields equal to the task's
    own are left out too."""
    base = BASES[kind][CURRENT]
    diff = {k: v for k, v in record.items() if k not in base or base[k] != v}
    if task is not None:
        for k in TASK_OWN:
            if k in diff and diff[k] == task.get(k):
                del diff[k]
    return canonical_json({VERSION_KEY: CURRENT, **diff}, what=kind)


@functools.lru_cache(maxsize=4096)
def _expand(kind: str, text: str, handler: str | None, payload_digest: str | None) -> str:
    try:
        stored = json.loads(text)
    except ValueError:
        return text  # not JSON: the record's own reader says what is wrong
    if not isinstance(stored, dict) or VERSION_KEY not in stored:
        return text  # stored in full (before this encoding)
    version = stored.pop(VERSION_KEY)
    base = BASES[kind].get(version) if isinstance(version, int) else None
    if base is None:
        raise InvalidArgument(f"a {kind} stored against base {version!r}, which this version of mc_queue does not "
                              f"know (it knows {sorted(BASES[kind])}): read it with the version that wrote it")
    full = {**base, **stored}
    if kind == "manifest":
        for k, v in (("handler", handler), ("payload_digest", payload_digest)):
            if k not in full and v is not None:
                full[k] = v
    return canonical_json(full, what=kind)


def expand(kind: str, text: str, *, handler: str | None = None, payload_digest: str | None = None) -> str:
    """The full canonical JSON of a stored record of ``kind``, as it was before it was compacted (a
    record stored in full is returned as it is). A manifest's ``handler`` and ``payload_digest`` come
    from its task when the stored form leaves them out."""
    if VERSION_KEY not in text:
        return text
    return _expand(kind, text, handler, payload_digest)
