"""A task's history as Redis keeps it: a list of compact entries, one per event (``lua/includes/common.lua``
``emit``), each the JSON array ``[id, "type", type, name, value, ...]``.

A stream per task would preallocate about 4 KB for every task (Redis's stream-node-max-bytes); a list of
a few hundred bytes holds the same history. The ids are what ``XADD *`` would have made (``<ms>-<seq>``,
ordered), so everything that compares or shows them is unchanged. A task whose history was written as a
stream, before histories became lists, is still read as one (:data:`WRONGTYPE`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from .models import by_number, filled_in

Event = tuple[str, dict[str, str]]
WRONGTYPE = "WRONGTYPE"  # what Redis answers LRANGE on a stream: the history of an older task


def decode_events(entries: Sequence[str]) -> list[Event]:
    """The events of a history list (LRANGE 0 -1), oldest first, as ``(id, fields)`` pairs."""
    out: list[Event] = []
    for entry in entries:
        flat = json.loads(entry)
        out.append((str(flat[0]), {str(flat[i]): str(flat[i + 1]) for i in range(1, len(flat) - 1, 2)}))
    return out


def whole_history(fields: Mapping[str, str], stored: list[Event]) -> list[Event]:
    """A live task's whole history: the two events its enqueue implies, then what its list stores.

    ``lua/enqueue.lua`` stores no event: ``task_created`` and Attempt 1's ``attempt_created`` say only
    what the task hash holds (its ``created_at``, ``actor`` and ``idem_key``), so a queued task has no
    history key at all. Their ids are ``<created_at>-0`` and ``<created_at>-1``; the first stored event
    is later (``emit`` in ``lua/includes/common.lua``). A task written before that, with no ``actor``
    field, stored both events itself and is returned as stored."""
    actor = fields.get("actor")
    created = fields.get("created_at")
    if actor is None or not created:
        return stored
    first: dict[str, str] = {"type": "task_created", "actor": actor}
    if fields.get("idem_key"):
        first["idem_key"] = fields["idem_key"]
    return [(f"{created}-0", first), (f"{created}-1", {"type": "attempt_created", "attempt": "1", "actor": actor}),
            *stored]


def history(fields: Mapping[str, str], entries: Sequence[str],
            attempts: Mapping[str, str] | None = None) -> list[Event]:
    """A live task's whole history from its hash (HGETALL), its list (LRANGE 0 -1) and its Attempts
    hash (HGETALL), each event's fields as a reader gets them (``Task.events``: what the scripts do not
    store twice filled in, :func:`mc_queue.contracts.models.filled_in`): the one way to read it raw,
    for tools and tests that read Redis themselves."""
    by_n = by_number(attempts or {})
    return [(i, filled_in(f, dict(fields), by_n)) for i, f in whole_history(fields, decode_events(entries))]
