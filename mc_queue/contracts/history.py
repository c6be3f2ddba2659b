"""A task's history as Redis keeps it: a list of compact entries, one per event (``lua/includes/common.lua``
``emit``), each the JSON array ``[id, "type", type, name, value, ...]``.

A stream per task would preallocate about 4 KB for every task (Redis's stream-node-max-bytes); a list of
a few hundred bytes holds the same history. The ids are what ``XADD *`` would have made (``<ms>-<seq>``,
ordered), so everything that compares or shows them is unchanged. A task whose history was written as a
stream, before histories became lists, is still read as one (:data:`WRONGTYPE`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

Event = tuple[str, dict[str, str]]
WRONGTYPE = "WRONGTYPE"  # what Redis answers LRANGE on a stream: the history of an older task


def decode_events(entries: Sequence[str]) -> list[Event]:
    """The events of a history list (LRANGE 0 -1), oldest first, as ``(id, fields)`` pairs."""
    out: list[Event] = []
    for entry in entries:
        flat = json.loads(entry)
        out.append((str(flat[0]), {str(flat[i]): str(flat[i + 1]) for i in range(1, len(flat) - 1, 2)}))
    return out
