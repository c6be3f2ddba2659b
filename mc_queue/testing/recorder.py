"""Records every state transition a Client's scripts make, and the ones :mod:`mc_queue.contracts.states`
does not allow."""

from __future__ import annotations

from typing import Any

import redis

from ..contracts.models import split_attempts
from ..contracts.packing import join_chunks, unpack


class TransitionRecorder:
    """Watches every script a Client runs (``client.runner.observers``) and records each change of a
    Task's or an Attempt's state it makes, as (entity, from, to, script); ``violations`` lists the
    changes :mod:`mc_queue.contracts.states` does not allow. Reads through its own connection, around each call.
    """

    def __init__(self, client: Any) -> None:
        self.redis = redis.Redis.from_url(client.url, decode_responses=True, encoding_errors="surrogateescape")
        self.seen: list[tuple[str, str, str, str]] = []
        self.violations: list[tuple[str, str, str, str]] = []
        client.runner.observers.append(self)

    def _read(self, task: str, attempts: str) -> tuple[str, dict[str, str]]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(task)
        pipe.hgetall(attempts)
        fields, att = pipe.execute()
        if fields.get("packed"):  # a packed task: its Attempts are in the document (lua/pack.lua)
            att = unpack(join_chunks(fields), fields).attempts
        else:  # in the task hash, or (written before 2026-12) the hash of their own the script was given
            att = split_attempts(fields, att)[1]
        return fields.get("state") or "", {k.split(".", 1)[0]: v for k, v in att.items() if k.endswith(".state")}

    def before(self, name: str, keys: Any, argv: Any) -> Any:
        task = keys.get("task")
        attempts = keys.get("attempts") or task  # (an item of enqueue_many: a new task keeps them in its hash)
        if not task or not attempts:
            return None
        return name, task, attempts, self._read(task, attempts)

    def after(self, token: Any, reply: Any) -> None:
        if token is None:
            return
        from ..contracts.states import allowed

        name, task, attempts, (t0, a0) = token
        t1, a1 = self._read(task, attempts)
        changes = [("task", t0, t1, name)] if t0 != t1 else []
        changes += [("attempt", a0.get(n, ""), a1.get(n, ""), name) for n in sorted(set(a0) | set(a1))
                    if a0.get(n) != a1.get(n)]
        for entity, src, dst, script in changes:
            self.seen.append((entity, src, dst, script))
            if not allowed("task" if entity == "task" else "attempt", src, dst, script):
                self.violations.append((entity, src, dst, script))

    def close(self) -> None:
        self.redis.close()
