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
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any


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

    def read_witness(self) -> str | None:
        if not self.witness_path or not self.witness_path.exists():
            return None
        try:
            data: Any = json.loads(self.witness_path.read_text())
        except (OSError, ValueError):
            return None
        value = data.get(self.prefix) if isinstance(data, dict) else None
        return value if isinstance(value, str) else None

    def write_witness(self, epoch: str) -> None:
        if not self.witness_path:
            return
        try:
            data = json.loads(self.witness_path.read_text()) if self.witness_path.exists() else {}
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data[self.prefix] = epoch
        tmp = self.witness_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.witness_path)
