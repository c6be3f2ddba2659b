"""The archive: where a task goes before retention deletes it from Redis.

A sink takes the records of tasks about to be deleted and must have them durable when ``write``
returns: the sweeper deletes a task only after its record was written (a crash in between writes
the record again at the next pass: a reader takes the last record of a task). The record is what
Redis held, as stored: the task's fields, its Attempts' fields, its events and its effects, so
``mcq archive show`` renders it exactly as ``mcq show`` rendered the live task.

:class:`FileArchive` writes gzip JSON lines, one file per queue and day (UTC, the day of archiving):
``<dir>/<queue>/<YYYY-MM-DD>.jsonl.gz``. Each write appends one gzip member (a file of several
members reads as one stream) and is fsynced.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .keys import check_queue, parse_task_id
from .models import EffectRecord, Task
from .packing import Packed

if TYPE_CHECKING:
    from .client import Client

RECORD_VERSION = 1


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
    """Where retention hands tasks before deleting them. ``write`` returns once they are durable."""

    def write(self, tasks: Sequence[ArchivedTask]) -> None: ...


def archive_tasks(client: Client, sink: ArchiveSink, task_ids: Sequence[str], *, reason: str, now_ms: int) -> int:
    """Hand these tasks, as Redis holds them, to ``sink`` (durable when it returns): what the sweeper's
    retention and ``mcq tasks purge --archive`` do before deleting. Returns how many records were written."""
    records = []
    for tid in task_ids:
        rec = client.task_record(tid)
        if rec is not None:
            records.append(ArchivedTask(task_id=tid, queue=parse_task_id(tid), state=rec.fields.get("state", ""),
                                        archived_at_ms=now_ms, reason=reason, record=rec))
    sink.write(records)
    return len(records)


class FileArchive:
    """gzip JSON lines under ``directory``, one file per queue and UTC day: ``<queue>/<YYYY-MM-DD>.jsonl.gz``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"FileArchive({str(self.directory)!r})"

    def path_for(self, queue: str, when_ms: int) -> Path:
        day = datetime.fromtimestamp(when_ms / 1000, tz=UTC).strftime("%Y-%m-%d")
        return self.directory / check_queue(queue) / f"{day}.jsonl.gz"

    def write(self, tasks: Sequence[ArchivedTask]) -> None:
        groups: dict[Path, list[ArchivedTask]] = {}
        for t in tasks:
            groups.setdefault(self.path_for(t.queue, t.archived_at_ms), []).append(t)
        for path, items in groups.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = "".join(json.dumps(t.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n"
                            for t in items)
            data = gzip.compress(lines.encode("utf-8", "surrogateescape"))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def records(self, queue: str) -> Iterator[ArchivedTask]:
        """Every record of a queue, newest file first (within a file, in the order written)."""
        folder = self.directory / check_queue(queue)
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*.jsonl.gz"), reverse=True):
            with gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape") as fh:
                for line in fh:
                    if line.strip():
                        yield ArchivedTask.from_json(json.loads(line))

    def find(self, task_id: str) -> ArchivedTask | None:
        """The last record of a task (a crash between archiving and deleting may have written two)."""
        queue = parse_task_id(task_id)
        found: ArchivedTask | None = None
        folder = self.directory / queue
        if not folder.is_dir():
            return None
        for path in sorted(folder.glob("*.jsonl.gz"), reverse=True):
            with gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape") as fh:
                for line in fh:
                    if task_id in line:
                        rec = ArchivedTask.from_json(json.loads(line))
                        if rec.task_id == task_id:
                            found = rec
            if found is not None:
                return found
        return None
