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


def event_id(ms: int, last: str) -> str:
    """The id ``emit`` (``lua/includes/common.lua``) gives an event at ``ms`` after the event ``last``:
    ``<ms>-0``, or the next sequence number of ``last``'s millisecond when that one is not earlier."""
    lms, _, lseq = last.partition("-")
    return f"{lms}-{int(lseq) + 1}" if int(lms) >= ms else f"{ms}-0"


def whole_history(fields: Mapping[str, str], stored: list[Event],
                  attempts: Mapping[str, str] | None = None) -> list[Event]:
    """A live task's whole history: the events its hash implies, then what its list stores.

    ``lua/enqueue.lua`` stores no event: ``task_created`` and Attempt 1's ``attempt_created`` say only
    what the task hash holds (its ``created_at``, ``actor`` and ``idem_key``), so a queued task has no
    history key at all. Their ids are ``<created_at>-0`` and ``<created_at>-1``. While the task has
    stored nothing else, Attempt 1's compact claim and then its compact success are not stored either
    (``imply`` in ``lua/includes/common.lua``): the hash's ``ev`` says which (``c``, ``cs``), their ids
    follow from Attempt 1's ``started_at`` and ``ended_at`` (``attempts``: the Attempt fields as
    ``'<n>.<field>'``, default ``fields`` itself, the task hash that holds them). The first stored event
    is later than all of these. A task written before that, with no ``actor`` field, stored every event
    itself and is returned as stored."""
    actor = fields.get("actor")
    created = fields.get("created_at")
    if actor is None or not created:
        return stored
    first: dict[str, str] = {"type": "task_created", "actor": actor}
    if fields.get("idem_key"):
        first["idem_key"] = fields["idem_key"]
    out: list[Event] = [(f"{created}-0", first),
                        (f"{created}-1", {"type": "attempt_created", "attempt": "1", "actor": actor})]
    implied = fields.get("ev")
    if implied in ("c", "cs"):
        att = fields if attempts is None else attempts
        last = event_id(int(att["1.started_at"]), out[-1][0])
        out.append((last, {"type": "attempt_claimed", "attempt": "1", "~": "1"}))
        if implied == "cs":
            out.append((event_id(int(att["1.ended_at"]), last),
                        {"type": "attempt_succeeded", "attempt": "1", "~": "1"}))
    return [*out, *stored]


def history(fields: Mapping[str, str], entries: Sequence[str],
            attempts: Mapping[str, str] | None = None) -> list[Event]:
    """A live task's whole history from its hash (HGETALL), its list (LRANGE 0 -1) and its Attempts
    hash (HGETALL), each event's fields as a reader gets them (``Task.events``: what the scripts do not
    store twice filled in, :func:`mc_queue.contracts.models.filled_in`): the one way to read it raw,
    for tools and tests that read Redis themselves."""
    by_n = by_number(attempts or {})
    return [(i, filled_in(f, dict(fields), by_n))
            for i, f in whole_history(fields, decode_events(entries), {**fields, **(attempts or {})})]
