"""The replication watermark: what a client was acknowledged at, kept where a restarted process finds it.

Redis replication numbers every byte of its stream (the replication *offset*) and names each history
with a replication id. A replica promoted by a failover gets a new id and keeps the old one as
``master_replid2`` with ``second_repl_offset`` = its offset at promotion + 1 (PSYNC2): of the old
history, it holds exactly the bytes before that offset. So a write acknowledged at offset ``W`` of
history ``R`` is still there after the failover iff ``R`` is the new primary's ``master_replid2`` and
``W < second_repl_offset`` (or ``R`` is its own id and ``W <= master_repl_offset``).

A client that tracks replication reads ``INFO replication`` in the same pipeline as each
acknowledged write (right after the script) and keeps, per namespace epoch and replication id, the
highest offset it was acknowledged at, and per epoch the highest claim sequence it saw. It keeps
them in a *slot file* under ``<state dir>/lineage/<prefix>/``: one small file per live process, held
with a POSIX lock (``lockf``), rewritten in place (one ``pwrite``) after each acknowledged write. A
process that starts takes a free slot and first merges what the slot holds (a dead process's
watermark is never dropped, only taken over); a forked child takes a slot of its own. A lineage
check reads every slot, compares each watermark with the primary's replication history
(:func:`judge`), and marks the namespace lost when acknowledged writes are missing.

A watermark whose replication id the primary does not know (two failovers since, or a primary that
restarted from its own AOF with a new id) cannot be judged here: it is ignored (the namespace meta,
epoch and claim-sequence checks still apply); a watermark judged safe is rebased onto the current
history, so every check brings the watermarks forward.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .embedded import DirRule, StateFileRefused, check_private_dir, open_state_file, private_dir, read_state_file

log = logging.getLogger("mc_queue.lineage")
STATE_RULE = DirRule("MCQ_STATE_DIR", "the replication watermark's slot files",
                     "MCQ_STATE_DIR=DIR or Client(state_dir=DIR)")
NO_REPLID = "0" * 40
SLOT_BYTES = 2048  # one record, padded; rewritten in place
MAX_SLOTS = 512
MAX_MARKS = 8  # (epoch, replication id) marks kept per record (the newest)
MAX_SEQS = 4  # epochs kept per record (the newest)


@dataclass(frozen=True)
class Replication:
    """The replication fields of ``INFO replication`` that matter here."""

    role: str
    replid: str
    replid2: str
    offset: int
    second_offset: int
    replicas: int

    @classmethod
    def parse(cls, info: Mapping[str, Any] | str) -> Replication:
        """From redis-py's parsed INFO (a dict) or the raw text."""
        if isinstance(info, (str, bytes)):
            text = info.decode() if isinstance(info, bytes) else info
            d: dict[str, Any] = {}
            for line in text.splitlines():
                k, sep, v = line.partition(":")
                if sep and not k.startswith("#"):
                    d[k.strip()] = v.strip()
            info = d
        replid2 = str(info.get("master_replid2", NO_REPLID))
        return cls(role=str(info.get("role", "")), replid=str(info.get("master_replid", "")),
                   replid2=NO_REPLID if replid2.strip("0") == "" else replid2,
                   offset=int(info.get("master_repl_offset", 0) or 0),
                   second_offset=int(info.get("second_repl_offset", -1) or -1),
                   replicas=int(info.get("connected_slaves", 0) or 0))

    @property
    def promoted(self) -> bool:
        """This server took over another history (a failover, or REPLICAOF NO ONE)."""
        return self.replid2 not in ("", NO_REPLID)


def judge(marks: Mapping[str, int], now: Replication) -> tuple[str | None, dict[str, int], list[str]]:
    """Compare acknowledged watermarks (replication id -> highest offset) with the primary's history.

    Returns (why acknowledged writes are missing, or None; the watermarks rebased onto the current
    history; the replication ids that could not be judged)."""
    rebased: dict[str, int] = {}
    unknown: list[str] = []
    worst: tuple[int, str] | None = None
    for rid, off in marks.items():
        if rid == now.replid:
            if off > now.offset:
                why = (f"Redis lost acknowledged writes: the primary's replication history {rid[:12]} ends at "
                       f"offset {now.offset}, but a client was acknowledged at offset {off} of it")
                worst = max(worst or (0, ""), (off - now.offset, why))
                continue
        elif now.promoted and rid == now.replid2:
            if off >= now.second_offset:
                missing = off - now.second_offset + 1
                why = (f"a failover lost acknowledged writes: the new primary took over replication history "
                       f"{rid[:12]} up to offset {now.second_offset - 1}, but a client was acknowledged at "
                       f"offset {off} of it ({missing} bytes of the replication stream are missing)")
                worst = max(worst or (0, ""), (missing, why))
                continue
        else:
            unknown.append(rid)
            continue
        rebased[now.replid] = max(rebased.get(now.replid, 0), off)
    return (worst[1] if worst else None), rebased, unknown


@dataclass
class Watermark:
    """Per namespace epoch and replication id (``"<epoch>/<replid>"``) the highest offset acknowledged;
    per epoch the highest claim sequence. Marks belong to an epoch: after ``mcq recover`` (a new
    epoch) the marks of the history that was lost are no longer evidence of anything."""

    marks: dict[str, int] = field(default_factory=dict)
    seqs: dict[str, int] = field(default_factory=dict)

    def note(self, epoch: str, replid: str, offset: int) -> bool:
        return self._note(f"{epoch}/{replid}", offset)

    def _note(self, key: str, offset: int) -> bool:
        if offset <= self.marks.get(key, -1):
            return False
        self.marks.pop(key, None)
        self.marks[key] = offset  # newest last
        while len(self.marks) > MAX_MARKS:
            self.marks.pop(next(iter(self.marks)))
        return True

    def of_epoch(self, epoch: str) -> dict[str, int]:
        """This epoch's marks: replication id -> offset."""
        cut = len(epoch) + 1
        return {k[cut:]: v for k, v in self.marks.items() if k.startswith(epoch + "/")}

    def note_seq(self, epoch: str, seq: int) -> bool:
        if not epoch or seq <= self.seqs.get(epoch, 0):
            return False
        self.seqs.pop(epoch, None)
        self.seqs[epoch] = seq
        while len(self.seqs) > MAX_SEQS:
            self.seqs.pop(next(iter(self.seqs)))
        return True

    def merge(self, other: Watermark) -> None:
        for key, off in other.marks.items():
            self._note(key, off)
        for epoch, seq in other.seqs.items():
            self.note_seq(epoch, seq)

    def encode(self) -> bytes:
        body = json.dumps({"v": 1, "marks": self.marks, "seqs": self.seqs, "pid": os.getpid()},
                          separators=(",", ":"))
        line = f"{body}\t{zlib.crc32(body.encode()):08x}\n".encode()
        if len(line) > SLOT_BYTES:  # cannot happen with the bounds above; never write a cut record
            raise ValueError("watermark record too large")
        return line.ljust(SLOT_BYTES, b" ")

    @classmethod
    def decode(cls, data: bytes) -> Watermark | None:
        """None for an empty, torn or foreign record."""
        text = data.rstrip(b" \x00").decode("utf-8", "replace").strip()
        body, sep, crc = text.rpartition("\t")
        if not sep or f"{zlib.crc32(body.encode()):08x}" != crc:
            return None
        try:
            d = json.loads(body)
            marks = {str(k): int(v) for k, v in d.get("marks", {}).items()}
            seqs = {str(k): int(v) for k, v in d.get("seqs", {}).items()}
        except (ValueError, TypeError, AttributeError):
            return None
        return cls(marks, seqs)


class SlotStore:
    """This process's slot file under ``directory`` (one per namespace), and reading everyone's.

    An existing state dir (or its ``lineage`` folders) that others may change is refused here, before
    anything is written (:class:`~mc_queue.store.embedded.StateFileRefused`, a ConfigurationError)."""

    def __init__(self, directory: str | os.PathLike[str], prefix: str) -> None:
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in prefix)[:60]
        digest = hashlib.sha1(prefix.encode()).hexdigest()[:8]
        self.state = Path(directory)
        self.dir = self.state / "lineage" / f"{name}-{digest}"
        self._fd: int | None = None
        self._pid = 0
        self.slot: int | None = None
        self._warned: set[str] = set()
        self._check(create=False)

    def _folders(self) -> list[tuple[Path, bool]]:
        return [(self.state, True), (self.state / "lineage", False), (self.dir, False)]  # (folder, follow)

    def _check(self, *, create: bool) -> bool:
        """Refuse a folder others may change; create missing ones (0700) with ``create``. False when a
        folder is missing (and not created)."""
        for folder, follow in self._folders():
            if create:
                private_dir(folder, STATE_RULE, follow=follow)
            elif os.path.lexists(folder):
                check_private_dir(folder, STATE_RULE, follow=follow)
            else:
                return False
        return True

    def _skip(self, path: Path, why: StateFileRefused) -> None:
        if str(path) not in self._warned:
            self._warned.add(str(path))
            log.warning("watermark slot skipped: %s", why)

    def _acquire(self, into: Watermark) -> int:
        """Take a free slot (lock it), merge what it holds into ``into``; returns its descriptor."""
        self._check(create=True)
        for i in range(MAX_SLOTS):
            path = self.dir / f"slot-{i:03d}"
            try:
                fd = open_state_file(path, os.O_RDWR, create=True)
            except StateFileRefused as exc:
                self._skip(path, exc)
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            old = Watermark.decode(os.pread(fd, SLOT_BYTES, 0))
            if old is not None:
                into.merge(old)  # a dead process's watermark: taken over, never dropped
            self.slot = i
            return fd
        raise OSError(f"no free watermark slot in {self.dir} ({MAX_SLOTS} processes hold one)")

    def write(self, wm: Watermark) -> None:
        """Rewrite this process's slot with ``wm`` (one pwrite; no fsync: it outlives the process, not
        the machine)."""
        if self._fd is None or self._pid != os.getpid():
            # First write, or a forked child: the parent's slot lock is the parent's, take our own.
            self._fd = self._acquire(wm)
            self._pid = os.getpid()
        os.pwrite(self._fd, wm.encode(), 0)

    def read_all(self) -> Watermark:
        """Every slot's watermark merged (torn, foreign or planted records skipped)."""
        out = Watermark()
        if not self._check(create=False):
            return out
        for path in sorted(self.dir.glob("slot-*")):
            for _ in range(3):  # a record being rewritten right now: read again
                try:
                    data = read_state_file(path, SLOT_BYTES)
                except StateFileRefused as exc:
                    self._skip(path, exc)
                    break
                except OSError:
                    break
                if data is None:
                    break
                wm = Watermark.decode(data)
                if wm is not None or not data.strip():
                    if wm is not None:
                        out.merge(wm)
                    break
        return out

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)  # releases the lock: the slot is free for the next process
        self._fd = None
