"""The archive: where a task goes before retention deletes it from Redis.

A sink takes the records of tasks about to be deleted and must have them durable when ``write``
returns: the sweeper deletes a task only after its record was written (a crash in between writes
the record again at the next pass: a reader takes the last record of a task). The record is what
Redis held, as stored: the task's fields, its Attempts' fields, its events and its effects, so
``mcq archive show`` renders it exactly as ``mcq show`` rendered the live task.

:class:`FileArchive` writes gzip JSON lines, one file per queue and batch, named by the time of
archiving (UTC): ``<dir>/<queue>/<YYYY-MM-DD>T<HHMMSS.mmm>Z-<id>.jsonl.gz``, each written whole to a
temporary file, fsynced and renamed into place before anything is deleted. An archive that fails
raises :class:`ArchiveError`: nothing is deleted, and the sweeper stops retention (loudly) while its
other steps go on.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import secrets
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..contracts.errors import McqError
from ..contracts.keys import check_queue, parse_task_id
from ..contracts.models import EffectRecord, Task
from ..contracts.packing import Packed
from ..store.embedded import replace_state_file

if TYPE_CHECKING:
    from ..client import Client

RECORD_VERSION = 1
log = logging.getLogger("mc_queue.archive")


@dataclass(frozen=True)
class ArchivedTask:
    """One task as archived: what Redis held of it, when and why it left Redis."""

    task_id: str
    queue: str
    state: str
    archived_at_ms: int
    reason: str
    record: Packed

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {"v": RECORD_VERSION, "task_id": self.task_id, "queue": self.queue, "state": self.state,
                "archived_at_ms": self.archived_at_ms, "reason": self.reason, "t": r.fields, "a": r.attempts,
                "e": [[i, f] for i, f in r.events], "x": r.effects}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ArchivedTask:
        if d.get("v") != RECORD_VERSION:
            raise ValueError(f"archive record version {d.get('v')!r} is not one this mc_queue reads")
        return cls(task_id=str(d["task_id"]), queue=str(d["queue"]), state=str(d["state"]),
                   archived_at_ms=int(d["archived_at_ms"]), reason=str(d.get("reason", "")),
                   record=Packed(fields=dict(d["t"]), attempts=dict(d["a"]),
                                 events=[(str(i), dict(f)) for i, f in d["e"]], effects=dict(d["x"])))

    def task(self) -> Task:
        r = self.record
        return Task.from_redis(r.fields, r.attempts, r.events)

    def effects(self) -> dict[str, EffectRecord]:
        return {k: EffectRecord.from_json(v) for k, v in sorted(self.record.effects.items())}


class ArchiveSink(Protocol):
    """Where retention hands tasks before deleting them. ``write`` returns once they are durable, or
    raises (any exception): then nothing is deleted."""

    def write(self, tasks: Sequence[ArchivedTask]) -> None: ...


class ArchiveError(McqError):
    """The archive could not take the records (a full disk, a read-only mount, a bad path ...): nothing
    was deleted. Retention stops until the archive works again; the sweeper's other steps go on."""


def archive_and_retire(client: Client, sink: ArchiveSink | None, rows: Sequence[tuple[str, int]], *,
                       states: Sequence[str], reason: str, tombstone_s: float, now_ms: int,
                       actor: str | None = None, log_each: bool = False) -> dict[str, int]:
    """Retire ended tasks read from an index (``(task id, index score)`` rows), each handed to ``sink``
    first when one is set: what the sweeper's retention and ``mcq tasks purge`` do. A task is deleted
    only if it is still the version the archive read (``retire.lua``'s ``seen``): anything recorded
    after that read (a refused stale write) keeps it in Redis until the next pass archives it again.
    Raises :class:`ArchiveError` (nothing deleted) when the sink fails. Returns the counts of
    :meth:`Maintenance.retire_batch` and ``archived``."""
    seen: dict[str, str] | None = None
    archived = 0
    if sink is not None:
        seen = {}
        records = []
        for tid, _ in rows:
            rec, version = client.reads.task_snapshot(tid)
            if rec is not None:
                seen[tid] = version
                records.append(_archived(tid, rec, reason, now_ms))
        if records:
            try:
                sink.write(records)
            except Exception as exc:  # whatever the sink raised: nothing may be deleted unarchived
                raise ArchiveError(f"the archive {sink!r} could not write {len(records)} records "
                                   f"({type(exc).__name__}: {exc}); nothing was deleted") from exc
        archived = len(records)
        rows = [r for r in rows if r[0] in seen]  # gone since the index read: nothing to delete
    out = client.maintenance.retire_batch(rows, states=states, reason=reason, tombstone_s=tombstone_s, actor=actor,
                              log_each=log_each, seen=seen) if rows else {"retired": 0, "skipped": 0, "refused": 0}
    out["archived"] = archived
    return out


def _archived(task_id: str, rec: Packed, reason: str, now_ms: int) -> ArchivedTask:
    return ArchivedTask(task_id=task_id, queue=parse_task_id(task_id), state=rec.fields.get("state", ""),
                        archived_at_ms=now_ms, reason=reason, record=rec)


class FileArchive:
    """gzip JSON lines under ``directory``: one file per batch, ``<queue>/<YYYY-MM-DD>T<HHMMSS.mmm>Z-<id>.jsonl.gz``.

    A batch is written whole to a hidden temporary file in the queue's folder, fsynced, renamed into
    place and the folder fsynced: a file named ``*.jsonl.gz`` is complete, whatever happened while it
    was written (a crash, a full disk, a file-size limit leave at most a hidden ``.*.tmp`` file,
    which readers ignore). Files of the earlier layout (``<YYYY-MM-DD>.jsonl.gz``, one gzip member
    appended per batch) are still read; a damaged member there is skipped with a warning, never the
    members after it."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"FileArchive({str(self.directory)!r})"

    def folder(self, queue: str) -> Path:
        return self.directory / check_queue(queue)

    def path_for(self, queue: str, when_ms: int) -> Path:
        """A new batch file's name for a batch archived at ``when_ms``."""
        stamp = datetime.fromtimestamp(when_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H%M%S.%f")[:-3]
        return self.folder(queue) / f"{stamp}Z-{secrets.token_hex(4)}.jsonl.gz"

    def write(self, tasks: Sequence[ArchivedTask]) -> None:
        groups: dict[str, list[ArchivedTask]] = {}
        for t in tasks:
            groups.setdefault(t.queue, []).append(t)
        for queue, items in groups.items():
            path = self.path_for(queue, max(t.archived_at_ms for t in items))
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = "".join(json.dumps(t.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n"
                            for t in items)
            data = gzip.compress(lines.encode("utf-8", "surrogateescape"))
            replace_state_file(path, data, mode=0o640, durable_name=True)

    def _files(self, queue: str) -> list[Path]:
        """The queue's archive files, newest first (names sort by time; hidden temporary files excluded)."""
        folder = self.folder(queue)
        if not folder.is_dir():
            return []
        return sorted((p for p in folder.glob("*.jsonl.gz") if not p.name.startswith(".")), reverse=True)

    def records(self, queue: str) -> Iterator[ArchivedTask]:
        """Every record of a queue, newest file first (within a file, in the order written)."""
        for path in self._files(queue):
            for line in _lines(path):
                yield ArchivedTask.from_json(json.loads(line))

    def find(self, task_id: str) -> ArchivedTask | None:
        """The last record of a task (a crash between archiving and deleting may have written two)."""
        for path in self._files(parse_task_id(task_id)):
            found: ArchivedTask | None = None
            for line in _lines(path):
                if task_id in line:
                    rec = ArchivedTask.from_json(json.loads(line))
                    if rec.task_id == task_id:
                        found = rec
            if found is not None:
                return found
        return None


def _lines(path: Path) -> Iterator[str]:
    """The JSON lines of one archive file, member by member: a damaged gzip member (a torn append of the
    earlier layout) is skipped, and the members after it are still read."""
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)
        try:
            text = d.decompress(data[pos:]) + d.flush()
            ok = d.eof
        except zlib.error:
            ok, text = False, b""
        if ok:
            yield from (ln for ln in text.decode("utf-8", "surrogateescape").splitlines() if ln.strip())
            pos = len(data) - len(d.unused_data)
            continue
        nxt = data.find(b"\x1f\x8b\x08", pos + 1)  # resync at the next gzip member
        log.warning("archive file %s: a damaged gzip member at byte %d is skipped", path, pos)
        if nxt < 0:
            return
        pos = nxt
