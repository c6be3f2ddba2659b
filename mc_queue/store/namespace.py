"""What a client knows about its namespace: the epoch, the claim sequence it has seen, the fences it
was issued, and the embedded server's witness file.

These are the client side of state-loss detection (the scripts hold the other side). A namespace is
marked ``lost`` (and refuses every transition until ``mcq recover``) on exactly these signals:

1. its meta hash is gone while a script runs (Redis lost its data; a writer's ``init`` also finds it
   gone while the queue set or lease index remain, or while the witness file remembers an epoch);
2. a client presents an epoch this Redis never issued (it lost the namespace and someone re-created it);
3. a client has seen a higher claim sequence than Redis holds (Redis went back to an older copy);
4. a worker presents a fence above the task's fence counter *and* its client holds the claim record
   of that fence (the claim sequence it was issued at): Redis forgot a fence it handed out. A fence
   above the current one without that record is refused as a stale write (``fence_ahead``) and the
   namespace stays ok: a caller's mistake does not stop every producer. A fence at or below the
   namespace's fence floor is refused as stale too (``fence_retired``): it was issued before the floor
   was raised, by an earlier incarnation of a task id that retention deleted, or before a recovery.

Reads never create a namespace (only writers run ``init``).

The witness file is read without following a symbolic link (a planted one is ignored, and logged) and
replaced whole through a new file of this process (never written through a link); a witness in a
folder others may change is refused (:class:`~mc_queue.store.embedded.StateFileRefused`).
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .embedded import DirRule, StateFileRefused, check_private_dir, read_state_file, replace_state_file

log = logging.getLogger("mc_queue.namespace")
WITNESS_RULE = DirRule("the witness's folder", "the namespace witness",
                       "MCQ_HOME=DIR, or a private folder for Client(witness_path=...)")


class NamespaceState:
    """Per-client memory of the namespace (one per :class:`~mc_queue.client.Client`)."""

    MAX_ISSUED = 10_000  # claim records kept (a worker holds a handful; a bound keeps memory flat)

    def __init__(self, prefix: str, witness_path: str | os.PathLike[str] | None) -> None:
        self.prefix = prefix
        self.witness_path = Path(witness_path) if witness_path else None
        self.epoch: str | None = None
        self.seq_seen = 0
        self._issued: OrderedDict[str, tuple[int, int]] = OrderedDict()  # attempt id -> (fence, claim seq)

    def adopt(self, epoch: str) -> None:
        if epoch != self.epoch:
            self.seq_seen = 0
            self._issued.clear()
        self.epoch = epoch

    def forget(self) -> None:
        """After a recovery: the epoch is retired, claims start over."""
        self.epoch = None
        self.seq_seen = 0
        self._issued.clear()

    def note_claim(self, attempt_id: str, fence: int, seq: int) -> None:
        if seq > self.seq_seen:
            self.seq_seen = seq
        self._issued[attempt_id] = (fence, seq)
        self._issued.move_to_end(attempt_id)
        while len(self._issued) > self.MAX_ISSUED:
            self._issued.popitem(last=False)

    def proof(self, attempt_id: str, fence: int) -> int | None:
        """The claim sequence this client was issued ``fence`` at, or None when it holds no such record."""
        rec = self._issued.get(attempt_id)
        return rec[1] if rec is not None and rec[0] == fence and rec[1] > 0 else None

    # ------------------------------------------------------------------ the witness (embedded server only)

    def _witness_data(self) -> dict[str, Any]:
        """What the witness file holds ({} when there is none, it is unreadable, or it is not a regular
        file of this user: a planted symbolic link is ignored, and logged)."""
        assert self.witness_path is not None
        if not os.path.lexists(self.witness_path.parent):
            return {}
        check_private_dir(self.witness_path.parent, WITNESS_RULE)
        try:
            raw = read_state_file(self.witness_path)
        except StateFileRefused as exc:
            log.warning("witness ignored: %s", exc)
            return {}
        except OSError:
            return {}
        try:
            data: Any = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def read_witness(self) -> str | None:
        if not self.witness_path:
            return None
        value = self._witness_data().get(self.prefix)
        return value if isinstance(value, str) else None

    def write_witness(self, epoch: str) -> None:
        if not self.witness_path:
            return
        data = self._witness_data()
        data[self.prefix] = epoch
        replace_state_file(self.witness_path, json.dumps(data).encode())
